"""The shared-prompt step: each group's prompt runs forward and backward once, packed with all
its completions under a block attention mask, and the loss and every gradient are those of a
row per rollout, up to float32 rounding: on a Llama and on a Qwen2 (grouped-query attention,
tied embeddings), SDPA and eager attention, LoRA and full fine-tuning, with padding, groups
split over micro-batches, the sampler's log-probs and the KL term."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.llm.base import Sampling
from harness.llm.transformers_backend import TransformersGenerator
from trainer.logprobs import pack_batch, plan_passes, token_batch, token_logprobs
from trainer.loss import LossConfig
from trainer.models import load_tokenizer, resolve_model, tiny_llama_config
from trainer.policy import Policy, PolicyConfig
from trainer.prompt_attention import PREFIX_SHARED, layout
from trainer.train import Group, Rollout, TrainConfig, train_step

PROMPTS = [
    [{"role": "user", "content": "Write a function that packs circles in a unit square."}],
    [{"role": "user", "content": "Say something short."}],
]


def save_model(folder: Path, architecture: str, attention: str) -> str:
    """A random model of `architecture` with SmolLM2's tokenizer, saved with `attention`."""
    from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer(resolve_model("smollm2"))
    torch.manual_seed(3)
    if architecture == "llama":
        model = LlamaForCausalLM(tiny_llama_config(len(tokenizer)))
    else:  # grouped-query attention (4 heads, 2 groups), tied input and output embeddings
        config = Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            tie_word_embeddings=True, max_position_embeddings=4096,
        )  # fmt: skip
        model = Qwen2ForCausalLM(config)
    model.config._attn_implementation = attention
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def architecture(request: pytest.FixtureRequest) -> str:
    return request.param


def load(folder: str, lora: bool, checkpointing: str = "off") -> Policy:
    """A policy in float32; with `checkpointing` "on" each layer is recomputed in the backward
    pass, where the prompt-sharing attention must get its layout again."""
    config = PolicyConfig(
        lr=1e-2,
        lora=lora,
        lora_rank=4,
        reference=True,
        gradient_checkpointing=checkpointing,
        precision="float32",  # compare float32 with float32
    )
    torch.manual_seed(5)  # the same adapter's initial weights each time
    return Policy.load(folder, config)


def rows_of_two_groups() -> list[tuple[list[int], list[int], None]]:
    """Two prompts of different lengths, completions of different lengths (padding)."""
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 900, (n,), generator=generator).tolist() for n in (23, 9)]
    lengths = [[7, 1, 12, 4], [3, 9, 5]]
    return [
        (prompt, torch.randint(5, 900, (n,), generator=generator).tolist(), None)
        for prompt, group in zip(prompts, lengths, strict=True)
        for n in group
    ]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logprobs_and_gradients_equal_a_row_per_rollout(
    architecture: str, attention: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    folder = save_model(tmp_path / architecture, architecture, attention)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attention)
    assert model.config._attn_implementation == attention
    rows = rows_of_two_groups()
    packs = [
        (rows[0][0], [r[1] for r in rows[:4]], [None] * 4),
        (rows[4][0], [r[1] for r in rows[4:]], [None] * 3),
    ]
    weights = torch.randn(len(rows), 12, generator=torch.Generator().manual_seed(1))
    results = []
    for batch in (token_batch(rows), pack_batch(packs)):
        model.zero_grad()
        values, mass = token_logprobs(model, batch, 0.7, 0.9)
        mask = batch["completion_mask"]
        ((values * weights[:, : values.shape[1]] * mask).sum()).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((values * mask, mass * mask, grads))
    (per_row, per_row_mass, per_row_grads), (packed, packed_mass, packed_grads) = results
    # SDPA models take the prompt-sharing attention; eager ones keep the dense block mask.
    expected = PREFIX_SHARED if attention == "sdpa" else "eager"
    assert model.config._attn_implementation == expected
    assert packed.shape == per_row.shape and per_row.abs().sum() > 0
    torch.testing.assert_close(packed, per_row, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(packed_mass, per_row_mass, atol=2e-5, rtol=1e-5)
    assert per_row_grads.norm() > 0
    torch.testing.assert_close(packed_grads, per_row_grads, atol=1e-6, rtol=1e-4)


def sampled_groups(policy: Policy, sizes: tuple[int, ...]) -> list[Group]:
    """Groups the policy sampled itself (its log-probs at temperature 0.7, top-p 0.9), with
    random reward vectors: one group per prompt, of the given sizes."""
    generator = TransformersGenerator("tiny", hf_model=policy.model, tokenizer=policy.tokenizer)
    rng = np.random.default_rng(4)
    groups = []
    for messages, size in zip(PROMPTS, sizes, strict=True):
        sampling = Sampling(temperature=0.7, top_p=0.9, max_tokens=10, seed=size)
        completions = generator.generate([messages], size, sampling)[0]
        rollouts = [Rollout(c.prompt_token_ids, c.token_ids, c.logprobs, 0) for c in completions]
        scores = rng.uniform(0.0, 1.0, size=(size, 3, 2))
        groups.append(Group(rollouts, scores, np.ones((size, 3), dtype=bool)))
    return groups


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def step_gradients(policy: Policy, groups: list[Group], config: TrainConfig) -> tuple:
    """The step's metrics and the gradients the optimiser was about to apply."""
    seen: list[torch.Tensor] = []

    def keep(*_: object) -> None:
        seen.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))

    hook = policy.optimizer.register_step_pre_hook(keep)
    try:
        metrics = train_step(policy, groups, config, generator=seeded(7))
    finally:
        hook.remove()
    return metrics, seen[0]


@pytest.mark.parametrize(
    ("lora", "checkpointing"),
    [(False, "off"), (True, "off"), (True, "on")],
    ids=["full", "lora", "lora-checkpointed"],
)
def test_a_shared_prompt_step_is_the_per_row_step(
    architecture: str, lora: bool, checkpointing: str, tmp_path: Path
) -> None:
    folder = save_model(tmp_path / architecture, architecture, "sdpa")
    config = TrainConfig(
        temperature=0.7, top_p=0.9, micro_batch=3, loss=LossConfig(beta=0.05), num_weights=8
    )
    results = []
    for packed in (False, True):
        policy = load(folder, lora, checkpointing)
        groups = sampled_groups(policy, (5, 4))  # 5 > micro_batch: a group split over passes
        # A step first, so the compared one has a reference to differ from (KL > 0) and its
        # groups, sampled before it, ratios away from 1.
        first = sampled_groups(policy, (3, 2))
        train_step(policy, first, replace(config, shared_prompt=False), generator=seeded(6))
        results.append(step_gradients(policy, groups, replace(config, shared_prompt=packed)))
    (per_row, per_row_grads), (shared, shared_grads) = results
    assert per_row.unshared == per_row.trained == 9 and shared.unshared == 0
    assert shared.trained == 9 and shared.kl > 0 and shared.sampler_fraction == 1.0
    assert abs(shared.mean_ratio - 1) > 1e-4
    # The KL (k3) of two near distributions is about half their log-probs' squared distance:
    # a rounding of 1e-6 in log-probs 1e-2 apart moves it by 2e-4 of itself.
    for name in ("loss", "policy_loss", "kl", "mean_ratio", "clip_fraction"):
        assert getattr(shared, name) == pytest.approx(getattr(per_row, name), rel=1e-3, abs=1e-7)
    assert per_row_grads.norm() > 0
    torch.testing.assert_close(shared_grads, per_row_grads, atol=1e-6, rtol=1e-4)
    assert policy.checkpointing == (checkpointing == "on")


def test_passes_pack_each_prompts_rollouts_and_split_big_groups() -> None:
    a, b, c = [1, 2, 3, 4], [5, 6], [7]
    rows = [(a, [9] * 2, None)] * 5 + [(b, [9] * 3, None)] * 2 + [(c, [9], None)]
    order = list(range(len(rows)))
    plan = plan_passes(rows, order, 3, shared=True)
    # a's five rollouts in packs of 2 and 3, b's two in one, c alone; at most 3 rollouts a pass
    assert sorted(sorted(p) for packs in plan for p in packs) == [
        [0, 1], [2, 3, 4], [5, 6], [7]
    ]  # fmt: skip
    # four of one prompt in passes of 3: two packs of 2, not 3 and a lone one
    assert [len(p) for packs in plan_passes(rows[:4], order[:4], 3, shared=True)
            for p in packs] == [2, 2]  # fmt: skip
    assert all(sum(len(p) for p in packs) <= 3 for packs in plan)
    assert sorted(i for packs in plan for p in packs for i in p) == order
    assert plan_passes(rows, order, 3, shared=False) == [
        [[0], [1], [2]], [[3], [4], [5]], [[6], [7]]
    ]  # fmt: skip


def test_layout_reads_the_prompt_and_each_completion_of_a_packed_row() -> None:
    segments = torch.tensor(
        [
            [0, 0, 0, 1, 1, 2, 3, 3, 3, -1],  # three completions, then padding
            [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],  # one completion filling the row
            [0, 0, 0, 0, -1, -1, -1, -1, -1, -1],  # a prompt alone
        ]
    )
    assert layout(segments) == [
        (3, [(3, 5), (5, 6), (6, 9)]),
        (6, [(6, 10)]),
        (4, []),
    ]


def test_the_prompt_sharing_attention_is_sdpa_without_a_layout(tmp_path: Path) -> None:
    """Generation and rows of their own go through SDPA unchanged once a model is switched."""
    from transformers import AutoModelForCausalLM

    folder = save_model(tmp_path / "qwen2", "qwen2", "sdpa")
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    rows = rows_of_two_groups()
    batch = token_batch(rows)
    with torch.no_grad():
        before = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        token_logprobs(model, pack_batch([(rows[0][0], [rows[0][1]], [None])]), 1.0, 1.0)
        assert model.config._attn_implementation == PREFIX_SHARED
        after = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(after, before, atol=0, rtol=0)
