"""The PPO ratio against the sampler's own log-probs: 1 on a group the current weights sampled,
away from 1 (and clipped) on a group an older policy version sampled; recomputed for rollouts the
current weights sampled from another distribution than the trainer computes (the fresh-gap
guard)."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cut_logprob_gaps, require_vllm

from harness.llm.base import Completion, Sampling
from harness.llm.transformers_backend import TransformersGenerator, sampling_logprobs
from trainer import logprobs, train
from trainer.logprobs import (
    _kept_mass,
    cut_log_mass,
    nucleus_log_mass,
    token_batch,
    token_logprobs,
)
from trainer.loss import LossConfig
from trainer.policy import Policy, PolicyConfig
from trainer.train import Group, Rollout, TrainConfig, train_step

MESSAGES = [
    [{"role": "user", "content": "Write a function that packs circles."}],
    [{"role": "user", "content": "Say something short."}],
]
SAMPLING = Sampling(temperature=0.7, top_p=0.9, max_tokens=12, seed=5)
STEP = TrainConfig(temperature=0.7, top_p=0.9, loss=LossConfig(beta=0.0), micro_batch=4)


@pytest.mark.parametrize("vocab", [50, 3000])  # 3000: the nucleus can reach past 1024 tokens
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_nucleus_mass_is_what_the_sampler_renormalises_by(vocab: int, top_p: float) -> None:
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    logits[0] *= 0.01  # nearly flat: the nucleus holds most of the vocabulary
    logp = (logits / 0.7).log_softmax(-1)
    sampled = sampling_logprobs(logits, 0.7, top_p)  # the transformers sampler's distribution
    kept = torch.isfinite(sampled)
    shifted = logp - nucleus_log_mass(logp, top_p).unsqueeze(-1)
    assert torch.allclose(shifted[kept], sampled[kept], atol=1e-5)


@pytest.mark.parametrize("vocab", [50, 3000])
@pytest.mark.parametrize(("top_k", "top_p"), [(1, 1.0), (5, 1.0), (40, 1.0), (5, 0.5), (40, 0.9)])
def test_top_k_mass_is_what_the_sampler_renormalises_by(
    vocab: int, top_k: int, top_p: float
) -> None:
    """With top_k the sampler draws from the top_k tokens, then from the nucleus of those; the
    trainer's log-prob less the log of the mass it keeps is the sampler's, token by token."""
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab + top_k)) * 3
    logits[0] *= 0.01  # nearly flat: the top_k hold little of the mass
    logp = (logits / 0.7).log_softmax(-1)
    sampled = sampling_logprobs(logits, 0.7, top_p, top_k)
    kept = torch.isfinite(sampled)
    assert bool((kept.sum(-1) <= top_k).all()) and bool(kept.any(-1).all())
    shifted = logp - cut_log_mass(logp, top_p, top_k).unsqueeze(-1)
    assert torch.allclose(shifted[kept], sampled[kept], atol=1e-5)


def test_a_top_k_of_the_whole_vocabulary_or_more_cuts_nothing() -> None:
    logp = torch.randn(3, 40).log_softmax(-1)
    for top_k in (40, 41, 1000):
        assert torch.equal(cut_log_mass(logp, 1.0, top_k), torch.zeros(3))
        assert torch.equal(cut_log_mass(logp, 0.9, top_k), nucleus_log_mass(logp, 0.9))


@pytest.mark.parametrize(("top_k", "top_p"), [(3, 1.0), (3, 0.6), (4, 1.0), (8, 0.9)])
def test_top_k_cuts_as_vllm_cuts_ties_included(top_k: int, top_p: float) -> None:
    """vLLM's own top-k and top-p op (its sampler's, in the installed version): the same tokens
    kept, the same log-probs, where several tokens tie with the k-th and where none does."""
    require_vllm()
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    gen = torch.Generator().manual_seed(top_k)
    logits = (torch.randn(5, 300, generator=gen) * 2).round(decimals=1)  # many ties
    logits[0] = logits[0].clamp(max=6.0)
    logits[0, :6] = torch.tensor([9.0, 8.0, 7.0, 7.0, 7.0, 7.0])  # k = 3 or 4: a tie at the k-th
    logits[1] = torch.linspace(0.0, 1.0, 300)  # none
    scaled = logits / 0.7
    for allow_cpu_sync in (False, True):  # with top_p 1: vLLM's sort-free top-k path, or not
        processed = apply_top_k_top_p_pytorch(
            scaled.clone(),
            torch.full((5,), top_k),
            None if top_p >= 1.0 else torch.full((5,), top_p),
            allow_cpu_sync=allow_cpu_sync,
        ).log_softmax(-1)
        ours = sampling_logprobs(logits, 0.7, top_p, top_k)
        assert torch.equal(torch.isfinite(processed), torch.isfinite(ours))
        kept = torch.isfinite(ours)
        assert torch.allclose(ours[kept], processed[kept], atol=1e-5)
        logp = scaled.log_softmax(-1)
        shifted = logp - cut_log_mass(logp, top_p, top_k).unsqueeze(-1)
        assert torch.allclose(shifted[kept], processed[kept], atol=1e-5)
    if top_k in (3, 4) and top_p >= 1.0:
        assert int(kept[0].sum()) == 6  # every token tied with the k-th is kept


@pytest.mark.parametrize("top_k", [-1, 2.5, True])
def test_a_step_refuses_a_top_k_that_is_not_a_whole_number_from_0(top_k: Any) -> None:
    with pytest.raises(ValueError, match="top_k must be a whole number >= 0"):
        TrainConfig(top_k=top_k)


def test_wide_nuclei_sorted_in_groups_give_each_row_its_own_mass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Positions whose nucleus reaches past the top-token search are sorted a few at a time
    (bounded memory); each row still gets the mass of its own nucleus, whatever the grouping."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 3000, generator=gen) * torch.linspace(0.01, 0.3, 9).unsqueeze(-1)
    logp = logits.log_softmax(-1)  # near flat, each row a different spread: every row is wide
    top_p = 0.9
    own = torch.stack([_kept_mass(row.sort(descending=True).values, top_p) for row in logp]).log()
    monkeypatch.setattr(logprobs, "NUCLEUS_SORT_ROWS", 2)
    assert torch.allclose(nucleus_log_mass(logp, top_p), own)
    assert len(set(own.tolist())) == 9  # the rows differ: a mix-up of rows would show


def group_of(completions: list[Completion], version: int | None, rng: np.random.Generator) -> Group:
    rollouts = [
        Rollout(c.prompt_token_ids or (), c.token_ids, c.logprobs, version) for c in completions
    ]
    scores = rng.uniform(0.0, 1.0, size=(len(rollouts), 2, 2))
    return Group(rollouts, scores, np.ones((len(rollouts), 2), dtype=bool))


def sample(
    policy: Policy, n: int, seed: int, sampling: Sampling = SAMPLING
) -> list[list[Completion]]:
    generator = TransformersGenerator("tiny", hf_model=policy.model, tokenizer=policy.tokenizer)
    return generator.generate(MESSAGES, n, replace(sampling, seed=seed))


@pytest.fixture
def policy(tiny_model: str) -> Policy:
    # fp32 (no autocast), as the sampler that shares its weights computes: bf16 rounding would be
    # larger than what the fresh-group checks look for.
    return Policy.load(tiny_model, PolicyConfig(lr=3e-2, reference=False, precision="float32"))


def test_a_fresh_group_has_ratio_one_and_nothing_clipped(policy: Policy) -> None:
    rng = np.random.default_rng(0)
    groups = [group_of(c, 0, rng) for c in sample(policy, 4, seed=1)]
    metrics = train_step(policy, groups, STEP, generator=torch.Generator().manual_seed(0))
    assert metrics.sampler_fraction == 1.0 and metrics.staleness == 0.0
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-4
    assert metrics.mismatched == 0
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-4)
    assert metrics.clip_fraction == 0.0


def test_the_trainer_reads_the_distribution_the_sampler_reported(policy: Policy) -> None:
    """Without the nucleus correction the trainer's log-probs sit below the sampler's by the
    mass top-p cut off; with it they agree."""
    completions = [c for group in sample(policy, 3, seed=2) for c in group]
    rows = [
        (list(c.prompt_token_ids or ()), list(c.token_ids), list(c.logprobs or ()))
        for c in completions
    ]
    batch = token_batch(rows)
    with torch.no_grad():
        values, mass = token_logprobs(policy.model, batch, 0.7, 0.9)
    assert mass is not None
    real = batch["completion_mask"]
    reported = batch["sampler_logprobs"]
    assert ((values - mass - reported).abs() * real).max() < 1e-4
    assert ((reported - values) * real).sum() > 0.01  # uncut, they would differ


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (20, 0.9)])
def test_a_group_sampled_with_top_k_is_read_as_the_sampler_reported_it(
    policy: Policy, top_k: int, top_p: float
) -> None:
    """top_k alone, and top_k then top-p: the trainer's log-probs less the log of the mass the
    cuts keep are the sampler's, and a step on a group the same weights sampled has ratio 1."""
    sampling = replace(SAMPLING, top_k=top_k, top_p=top_p)
    groups = sample(policy, 3, seed=2, sampling=sampling)
    completions = [c for group in groups for c in group]
    gap, uncut, _ = cut_logprob_gaps(policy.model, completions, 0.7, top_p, top_k)
    assert gap < 1e-4
    assert uncut > 0.01  # uncut, they would differ
    step = replace(STEP, top_k=top_k, top_p=top_p)
    rng = np.random.default_rng(5)
    metrics = train_step(
        policy, [group_of(c, 0, rng) for c in groups], step, generator=torch.Generator()
    )
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-4
    assert metrics.mismatched == 0 and metrics.sampler_fraction == 1.0
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-4)
    assert metrics.clip_fraction == 0.0


def test_a_group_two_versions_old_has_its_ratio_clipped(policy: Policy) -> None:
    rng = np.random.default_rng(1)
    old = [group_of(c, 0, rng) for c in sample(policy, 4, seed=3)]
    for step in (1, 2):  # two steps on groups each version sampled itself
        fresh = [group_of(c, step - 1, rng) for c in sample(policy, 4, seed=10 + step)]
        train_step(policy, fresh, STEP, generator=torch.Generator().manual_seed(step))
    assert policy.step == 2
    before = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    stale = train_step(policy, old, STEP, generator=torch.Generator().manual_seed(3))
    assert stale.staleness == 2.0 and stale.sampler_fraction == 1.0 and stale.fresh_gap is None
    assert stale.mismatched == 0  # only rollouts of the current weights are compared
    assert abs(stale.mean_ratio - 1.0) > 1e-3
    assert stale.clip_fraction > 0.0

    # The same group with the old log-probs recomputed: ratio 1, the clip never acts (what every
    # step did before the sampler's log-probs were used).
    policy.model.load_state_dict(before)
    policy.step = 2
    recomputed = train_step(
        policy,
        old,
        replace(STEP, old_logprobs="recompute"),
        generator=torch.Generator().manual_seed(3),
    )
    assert recomputed.sampler_fraction == 0.0
    assert recomputed.mean_ratio == pytest.approx(1.0, abs=1e-6)
    assert recomputed.clip_fraction == 0.0


def test_rollouts_without_sampler_logprobs_are_recomputed(policy: Policy) -> None:
    rng = np.random.default_rng(2)
    completions = sample(policy, 4, seed=4)
    with_logprobs = group_of(completions[0], 0, rng)
    without = group_of([replace(c, logprobs=None) for c in completions[1]], None, rng)
    metrics = train_step(policy, [with_logprobs, without], STEP)
    assert metrics.sampler_fraction == 0.5
    assert metrics.staleness == 0.0  # only the rollouts whose version is known count
    with pytest.raises(ValueError, match="log-probs"):
        train_step(policy, [without], replace(STEP, old_logprobs="sampler"))
    # Greedy samples' log-probs are not of logits / T: recomputed even under "auto".
    greedy = train_step(policy, [with_logprobs], TrainConfig(temperature=1e-3))
    assert greedy.sampler_fraction == 0.0


def test_a_log_prob_list_that_does_not_fit_the_completion_is_not_used(policy: Policy) -> None:
    rng = np.random.default_rng(3)
    group = group_of(sample(policy, 4, seed=6)[0], 0, rng)
    broken: list[Any] = []
    for index, rollout in enumerate(group.rollouts):
        logprobs = list(rollout.logprobs or ())
        logprobs = logprobs[:-1] if index == 0 else [*logprobs[:-1], math.nan]
        broken.append(Rollout(rollout.prompt_ids, rollout.completion_ids, logprobs, 0))
    metrics = train_step(policy, [Group(broken, group.scores, group.mask)], STEP)
    assert metrics.sampler_fraction == 0.0


def hf_sample(policy: Policy, seed: int, **knobs: float) -> list[Completion]:
    """4 completions of each prompt from Hugging Face's own sampler (`generate`) at SAMPLING's
    temperature and top-p plus `knobs`, each token's log-prob read from the scores it drew from
    (after every logits processor: penalties, temperature, top-k, top-p)."""
    completions = []
    tokenizer = policy.tokenizer
    for messages in MESSAGES:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompt = list(getattr(prompt, "input_ids", prompt))
        torch.manual_seed(seed)
        with torch.no_grad():
            out = policy.model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                do_sample=True,
                temperature=SAMPLING.temperature,
                top_p=SAMPLING.top_p,
                max_new_tokens=SAMPLING.max_tokens,
                num_return_sequences=4,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.pad_token_id,
                **knobs,
            )
        steps = torch.stack(out.scores, dim=1).log_softmax(dim=-1)  # (4, T, V)
        for row, sequence in enumerate(out.sequences[:, len(prompt) :].tolist()):
            if tokenizer.eos_token_id in sequence:
                sequence = sequence[: sequence.index(tokenizer.eos_token_id) + 1]
            logprobs = [float(steps[row, t, token]) for t, token in enumerate(sequence)]
            completions.append(
                Completion("", tuple(sequence), tuple(logprobs), "stop", tuple(prompt))
            )
    return completions


@pytest.mark.parametrize(
    ("knobs", "set_aside"),
    [
        ({"top_k": 0, "repetition_penalty": 1.0}, False),  # what the trainer models
        ({"top_k": 20, "repetition_penalty": 1.05}, True),  # Qwen2.5 Instruct's defaults
    ],
)
def test_a_sampler_of_another_distribution_is_set_aside_and_said_once(
    policy: Policy,
    knobs: dict[str, float],
    set_aside: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rollouts the current weights sampled with top_k 20 and a repetition penalty (what a
    server applies from the model's generation_config.json) are far beyond rounding from the
    trainer's log-probs: their old log-probs are recomputed (ratio 1), the step counts them, and
    the trainer warns once with the likely cause. Honest ones keep the sampler's."""
    monkeypatch.setattr(train, "_mismatch_said", False)
    caplog.set_level(logging.WARNING, logger="trainer.train")
    rng = np.random.default_rng(4)
    steps = []
    for seed in (7, 8):  # two steps, each on rollouts the weights it starts from sampled
        group = group_of(hf_sample(policy, seed, **knobs), policy.step, rng)
        steps.append(train_step(policy, [group], STEP, generator=torch.Generator().manual_seed(0)))
    trainer_said = [record for record in caplog.records if record.name == "trainer.train"]
    for metrics in steps:
        assert metrics.fresh_gap is not None
        assert metrics.mismatched == (metrics.rollouts if set_aside else 0)
        assert metrics.sampler_fraction == (0.0 if set_aside else 1.0)
    if set_aside:
        assert steps[0].fresh_gap > 1.0
        assert steps[0].mean_ratio == pytest.approx(1.0, abs=1e-6)
        (said,) = trainer_said  # two steps, one warning
        assert "server's sampling settings" in said.getMessage()
        assert "--generation-config vllm" in said.getMessage()
    else:
        assert steps[0].fresh_gap < 1e-3
        assert trainer_said == []
