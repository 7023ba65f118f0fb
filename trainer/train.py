"""One optimisation step over harvested groups.

    metrics = train_step(policy, groups, TrainConfig(advantage="vpo"))

A step stacks the groups' reward matrices into (B, G, m, d) (groups of another shape form their
own batch), computes one advantage per rollout, and runs the policy loss over every completion
token in micro-batches whose gradients add up to one optimiser step (the log-probs come from
trainer/logprobs.py).

The PPO ratio's old log-probs are the sampler's own, where the backend reported them: a group
sampled by an older policy version (one step old inside a campaign that trains while the next
batch generates; many for workers and `vpo train --follow`) then has a ratio away from 1 and the
clip acts on it. Where a rollout has none, they are recomputed by the current weights (ratio 1)
and the step's `sampler_fraction` says how many had them. So are they for a rollout the current
weights sampled whose sampler log-probs are further from the trainer's than rounding goes
(`TrainConfig.mismatch_gap`): its sampler drew from another distribution than the trainer
computes (a server's top_k or repetition penalty); the step counts them (`mismatched`) and the
first such step says so in a warning.

This module knows nothing of the harness or the database: groups come in as token lists and
score arrays. On several processes (`torchrun` or `accelerate launch` starting
`python -m harness.cli.train`) the policy is wrapped by FSDP2 or DDP (trainer/distributed.py),
which reduces the gradients.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trainer.activations import LOGIT_SHARE
from trainer.advantages import compute_advantages
from trainer.estimators import unknown
from trainer.logprobs import (
    PACKABLE,
    Row,
    attention_kind,
    cut,
    plan_passes,
)
from trainer.loss import LossConfig
from trainer.passes import Passes
from trainer.policy import Policy

OLD_LOGPROBS = ("auto", "sampler", "recompute")
# At or below this temperature sampling was greedy: the sampler's log-probs are not of logits / T.
GREEDY = 1e-3
# A rollout the current weights sampled whose token mean |trainer - sampler| log-prob (nats) is
# above this was drawn from another distribution than the trainer computes. Measured on SmolLM2
# (benchmarks/results/fresh_gap.md), per rollout of up to 96 tokens: rounding 0.0000 in fp32 and
# at most 0.033 with the trainer in bf16; a repetition penalty of 1.05 (Qwen2.5's default) at
# least 0.117; raw instead of processed log-probs 0.07 to 0.23. Half the PPO clip's range
# (log 1.2 = 0.18): a smaller systematic error the clip absorbs anyway.
MISMATCH_GAP = 0.1
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollout:
    """One completion of a group: what the model read and what it wrote."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    logprobs: Sequence[float] | None = None  # the sampler's, where the backend gave them
    version: int | None = None  # the policy step that sampled it, where known (0: the base)


@dataclass(frozen=True)
class Group:
    """G rollouts of one prompt and the reward vectors of their candidates."""

    rollouts: Sequence[Rollout]
    scores: np.ndarray  # (G, m, d), >= 0 (1 = the best known value; above 1 beats it)
    mask: np.ndarray  # (G, m) True for candidates that exist, parsed and were evaluated
    # (P, d): what the group is measured against (its parent's vector, or the front of what the
    # campaign held before it): the set score becomes the gain over it (vpo, entropic). None:
    # absolute scores, as in the VPO paper.
    reference: np.ndarray | None = None
    cost: np.ndarray | None = None  # (G,): taken off each rollout's set score (wasted slots)

    def __post_init__(self) -> None:
        scores = np.asarray(self.scores, dtype=np.float64)
        mask = np.asarray(self.mask, dtype=bool)
        if scores.ndim != 3 or mask.shape != scores.shape[:2]:
            raise ValueError(
                f"a group needs scores (G, m, d) and mask (G, m), "
                f"got {scores.shape} and {mask.shape}"
            )
        if len(self.rollouts) != scores.shape[0]:
            raise ValueError(f"{len(self.rollouts)} rollouts but {scores.shape[0]} score rows")
        if not np.all((scores >= 0) & np.isfinite(scores)):
            raise ValueError("scores must be finite and >= 0")
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "mask", mask)
        if self.reference is not None:
            reference = np.asarray(self.reference, dtype=np.float64).reshape(-1, scores.shape[2])
            if not np.all(np.isfinite(reference)):
                raise ValueError("a group's reference vectors must be finite")
            object.__setattr__(self, "reference", reference)
        if self.cost is not None:
            cost = np.asarray(self.cost, dtype=np.float64)
            if cost.shape != (scores.shape[0],) or not np.all(np.isfinite(cost)):
                raise ValueError(f"a group's cost must be {scores.shape[0]} finite numbers")
            object.__setattr__(self, "cost", cost)


@dataclass(frozen=True)
class TrainConfig:
    advantage: str = "vpo"
    num_weights: int = 100  # K Dirichlet draws per group (VPO)
    alpha: float = 1.0  # Dirichlet concentration (VPO)
    k: int | None = None  # max@k's k; default max(2, G // 2)
    # entropic: KL(q || uniform) of each group's weights q = softmax(beta R) (TTT-Discover's ln 2)
    kl_budget: float = math.log(2)
    # vpo, entropic against a reference: the gain over it unclipped (`set_scores`' `signed`)
    signed_gain: bool = False
    loss: LossConfig = field(default_factory=LossConfig)
    micro_batch: int = 8  # rollouts per forward/backward
    logit_chunk: int = 2048  # completion tokens per chunk of the vocabulary projection
    temperature: float = 1.0  # the sampling temperature: log-probs are of logits / T
    top_p: float = 1.0  # the sampling nucleus: the ratio compares top-p renormalised log-probs
    top_k: int = 0  # the sampling top-k (0: none), cut before the nucleus, as vLLM does
    # The ratio's old log-probs: "auto" the sampler's where a rollout has them, else recomputed;
    # "sampler" the sampler's, every rollout must have them; "recompute" the current weights'.
    old_logprobs: str = "auto"
    max_tokens: int = 4096  # longest prompt + completion trained on; longer is cut at the end
    # Leave out of the forward/backward every rollout whose advantage is exactly 0 (a flat
    # group's, as DAPO's dynamic sampling drops them; Yu et al. 2025, arXiv 2503.14476): its
    # policy-gradient term is 0, so the step's gradient is the same but for those rollouts' KL
    # term, and the token count still includes them. On a CPU most early groups are flat.
    skip_zero_advantage: bool = True
    # The fresh-gap guard: a rollout the current weights sampled whose sampler log-probs are
    # further than this from the trainer's (token mean, nats) has them recomputed instead.
    mismatch_gap: float = MISMATCH_GAP
    # Each group's prompt runs forward and backward once for all its completions (packed in
    # one row under a block attention mask; Prefix Grouper, arXiv 2506.05433), not once per
    # rollout: the same loss and gradients, G times less prompt work. Off: a row per rollout.
    shared_prompt: bool = True

    def __post_init__(self) -> None:
        if why := unknown(self.advantage):
            raise ValueError(why)
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"old_logprobs must be one of {', '.join(OLD_LOGPROBS)}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0: off), got {self.top_k!r}")
        if self.micro_batch < 1 or self.logit_chunk < 1 or self.num_weights < 1:
            raise ValueError("micro_batch, logit_chunk and num_weights must be >= 1")
        if not 0 < self.kl_budget <= 100:
            raise ValueError(f"kl_budget must be in (0, 100], got {self.kl_budget}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not self.mismatch_gap > 0:
            raise ValueError(f"mismatch_gap must be > 0 (inf: off), got {self.mismatch_gap}")


@dataclass(frozen=True)
class StepMetrics:
    step: int
    groups: int
    rollouts: int
    tokens: int  # completion tokens of the step's rollouts
    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float  # completion tokens whose ratio left [1 - clip, 1 + clip]
    mean_ratio: float  # token mean of pi_theta / pi_old over the step
    sampler_fraction: float  # rollouts whose old log-probs are the sampler's (else recomputed)
    staleness: float | None  # mean policy versions between sampling and this step, where known
    # Token mean |log mu_theta - sampler| over rollouts the current weights sampled: how far the
    # trainer's and the backend's log-probs of the same distribution are apart (rounding, kernels),
    # or that the backend sampled another distribution (`mismatched`).
    fresh_gap: float | None
    grad_norm: float
    trained: int  # rollouts run through the model (the others had advantage 0 and were skipped)
    set_score: float  # mean over rollouts of the scalar the advantage came from
    zero_std_fraction: float  # groups whose advantages are all zero
    diversity: float  # mean pairwise L1 distance between a group's candidate vectors
    seconds: float
    tokens_per_second: float
    advantage: str
    # Rollouts longer than `max_tokens` whose completion the step cut at its end (some to
    # nothing): a campaign's prompts are sized so that none is, so a count here says so.
    cut_rollouts: int = 0
    # Why the step changed no weight and is no policy version (a non-finite gradient norm, no
    # completion token left within `max_tokens`); None for a step taken. The policy's step
    # counter stays where it was: the next step takes this number again.
    skipped: str | None = None
    # Rollouts the current weights sampled whose sampler log-probs were set aside for the
    # recomputed ones: their fresh gap was above `TrainConfig.mismatch_gap` (the sampler drew
    # from another distribution). Not counted in `sampler_fraction`.
    mismatched: int = 0
    # Rollouts trained in a row of their own, their prompt not shared: no other rollout of the
    # step's pass had the same prompt, `shared_prompt` is off, or the model's attention
    # implementation takes no block mask (PACKABLE).
    unshared: int = 0
    # Passes (micro-batches) that recomputed their activations in the backward pass instead of
    # keeping them: every pass with gradient_checkpointing "on" (or "auto" from 1B parameters),
    # and under "auto" below that each pass whose activations would not have fit.
    checkpointed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        trimmed = f" | cut {self.cut_rollouts}/{self.rollouts}" if self.cut_rollouts else ""
        if self.skipped is not None:
            return f"step {self.step} skipped: {self.skipped}{trimmed}"
        stale = "" if self.staleness is None else f" | stale {self.staleness:.1f}"
        if not self.trained:
            return (
                f"step {self.step} | set score {self.set_score:.3f} | zero-std "
                f"{self.zero_std_fraction:.0%} | nothing to learn: every advantage is 0, "
                f"0/{self.rollouts} rollouts trained, weights unchanged{trimmed}"
            )
        return (
            f"step {self.step} | loss {self.loss:+.4f} | kl {self.kl:.2e} | grad norm "
            f"{self.grad_norm:.3g} | set score {self.set_score:.3f} | zero-std "
            f"{self.zero_std_fraction:.0%} | diversity {self.diversity:.3f} | ratio "
            f"{self.mean_ratio:.3f} clip {self.clip_fraction:.1%} "
            f"({self.sampler_fraction:.0%} sampler){stale} | trained {self.trained}/"
            f"{self.rollouts}{trimmed} | {self.tokens_per_second:.0f} tok/s"
        )


def train_step(
    policy: Policy,
    groups: Sequence[Group],
    config: TrainConfig = TrainConfig(),
    *,
    generator: torch.Generator | None = None,
) -> StepMetrics:
    """One optimiser step of `policy` on `groups`; returns what it measured.

    On several processes (`policy.parallel`) each passes its own share of the groups: the
    token count is summed over them and the wrapper (DDP or FSDP) reduces the gradients, so
    every process takes the step one process with all the groups would (the metrics are this
    process's). Every process runs as many micro-batches as the busiest one, a process with
    fewer running an empty one of weight 0, since each backward pass is a collective.

    A step that can change nothing comes back with `skipped` saying why, and leaves the
    policy's step counter where it was: one whose gradient norm is not finite (no optimiser
    step is taken), one with no completion token left once each rollout is cut to
    `max_tokens` (nothing runs; the rollouts cut are counted in every step's `cut_rollouts`).
    """
    parallel = policy.parallel
    if not groups and not parallel.active:
        raise ValueError("a training step needs at least one group")
    started = time.perf_counter()
    number = policy.step + 1
    advantages = compute_advantages(groups, config, generator)
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    rows, shortened = _rows(rollouts, config)
    local_tokens = sum(len(completion) for _, completion, _ in rows)
    total_tokens = int(parallel.sum(local_tokens))
    # Every process sees the same total, so all of them skip the step or none does.
    skipped = None
    if total_tokens == 0:
        skipped = _nothing_left(shortened, len(rollouts), config.max_tokens)

    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    order, plan, unshared = _plan(policy, rows, advantages.per_rollout, config)
    passes = int(parallel.max(len(plan)))
    ran = Passes(policy, config, rows, rollouts, advantages.per_rollout, total_tokens)
    for index in range(passes):
        ran.run(plan[index] if index < len(plan) else [], last=index == passes - 1)
    if ran.mismatched:
        _warn_mismatch(ran.mismatched, ran.gap / max(ran.gap_tokens, 1), config)
    if policy.auto_checkpointing:
        _say_checkpointing(policy, ran.checkpointed, len(plan))
    grad_norm, not_finite = _optimiser_step(policy, passes)
    skipped = skipped or not_finite
    if skipped is None:
        policy.step = number
    seconds = time.perf_counter() - started
    # The per-token metrics are over the tokens that ran (a fresh step's ratio is 1, not 0).
    tokens_ran = max(sum(len(rows[i][1]) for i in order), 1)
    sums = ran.sums
    return StepMetrics(
        step=number,
        groups=len(groups),
        rollouts=len(rollouts),
        tokens=local_tokens,
        loss=sums["loss"],
        policy_loss=sums["policy"] / tokens_ran,
        kl=sums["kl"] / tokens_ran,
        clip_fraction=sums["clipped"] / tokens_ran,
        mean_ratio=sums["ratio"] / tokens_ran if order else 1.0,
        sampler_fraction=(sum(1 for row in rows if row[2] is not None) - ran.mismatched)
        / max(len(rows), 1),
        staleness=_staleness(rollouts, number - 1),
        fresh_gap=ran.gap / ran.gap_tokens if ran.gap_tokens else None,
        grad_norm=grad_norm,
        trained=len(order),
        set_score=float(np.mean(advantages.rewards)) if advantages.rewards else 0.0,
        zero_std_fraction=advantages.zero_std_groups / max(len(groups), 1),
        diversity=float(np.mean(advantages.diversity)) if advantages.diversity else 0.0,
        seconds=seconds,
        tokens_per_second=(tokens_ran if order else 0) / seconds,
        advantage=config.advantage,
        cut_rollouts=shortened,
        skipped=skipped,
        mismatched=ran.mismatched,
        unshared=unshared,
        checkpointed=ran.checkpointed,
    )


def _plan(
    policy: Policy, rows: Sequence[Row], advantages: Sequence[float], config: TrainConfig
) -> tuple[list[int], list[list[list[int]]], int]:
    """The rollouts that run (in order), their micro-batches (each a list of packs: rollouts
    sharing one prompt pass) and how many run without sharing theirs."""
    # Longest first and similar lengths together: less padding in each micro-batch. A rollout
    # with no completion token left has nothing to predict: it takes no pass.
    order = sorted(range(len(rows)), key=lambda i: -(len(rows[i][0]) + len(rows[i][1])))
    order = [i for i in order if rows[i][1]]
    if config.skip_zero_advantage:
        order = [i for i in order if advantages[i] != 0]
    shared = config.shared_prompt and attention_kind(policy.model) in PACKABLE
    plan = plan_passes(rows, order, config.micro_batch, shared=shared)
    unshared = sum(len(pack) for packs in plan for pack in packs if len(pack) == 1)
    return order, plan, unshared


def _rows(rollouts: Sequence[Rollout], config: TrainConfig) -> tuple[list[Row], int]:
    """Each rollout as (prompt, completion cut to `max_tokens`, its sampler log-probs or None
    where they are not to be compared), and how many were cut."""
    rows = [cut(r.prompt_ids, r.completion_ids, r.logprobs, config.max_tokens) for r in rollouts]
    shortened = sum(
        len(row[1]) < len(r.completion_ids) for r, row in zip(rollouts, rows, strict=True)
    )
    if config.old_logprobs == "recompute" or config.temperature <= GREEDY:
        # Greedy samples' log-probs are not of logits / T: nothing to compare them with.
        rows = [(prompt, completion, None) for prompt, completion, _ in rows]
    elif config.old_logprobs == "sampler":
        missing = sum(1 for _, _, logprobs in rows if logprobs is None)
        if missing:
            raise ValueError(
                f"old_logprobs='sampler' but {missing} rollouts have no log-probs for every "
                "completion token (or were sampled greedily)"
            )
    return rows, shortened


def _optimiser_step(policy: Policy, passes: int) -> tuple[float, str | None]:
    """Clip and step (when some process ran a pass: a step of nothing would still decay the
    weights); the gradient norm, and why no step was taken where its norm is not finite."""
    grad_norm, skipped = 0.0, None
    if passes:
        clip = policy.config.grad_clip if policy.config.grad_clip > 0 else math.inf
        grad_norm = _total(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), clip))
        if math.isfinite(grad_norm):
            policy.optimizer.step()
        else:
            # The norm is the same on every process (the wrapper reduced the gradients).
            skipped = f"non-finite gradient norm ({grad_norm}), the optimiser step was not taken"
    policy.optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped


_mismatch_said = False
_checkpointing_said = False
_logit_chunk_said = False


def _say_checkpointing(policy: Policy, passes: int, of: int) -> None:
    """Say once per process that "auto" turned activation checkpointing on, or shortened the
    logit chunk, and why."""
    global _checkpointing_said, _logit_chunk_said
    if not _logit_chunk_said and policy.shortened_logit_chunk is not None:
        _logit_chunk_said = True
        chunk, configured = policy.shortened_logit_chunk
        log.info(
            f"logits computed {chunk} positions a chunk, not logit_chunk {configured}: a chunk "
            f"of them would take more than {LOGIT_SHARE:.0%} of the memory free "
            "(gradient_checkpointing auto; each chunk is recomputed in the backward pass; said "
            "once)"
        )
    if _checkpointing_said or not passes or policy.recomputed_memory is None:
        return
    _checkpointing_said = True
    estimate, free = policy.recomputed_memory
    log.info(
        f"activation checkpointing on for {passes} of {of} passes: a pass would keep about "
        f"{estimate / 2**30:.3g} GiB of activations with {free / 2**30:.3g} GiB free, so its "
        "decoder layers recompute them in the backward pass instead (gradient_checkpointing "
        "auto; `checkpointed` in each step's metrics counts such passes; said once)"
    )


def _warn_mismatch(rollouts: int, fresh_gap: float, config: TrainConfig) -> None:
    """Say once per process that the sampler drew from another distribution, why, and the fix."""
    global _mismatch_said
    if _mismatch_said:
        return
    _mismatch_said = True
    log.warning(
        f"the sampler's log-probs of {rollouts} rollouts the current weights sampled are "
        f"{fresh_gap:.3f} nats a token from the trainer's (token mean; rounding stays under "
        f"{config.mismatch_gap}): they come from another distribution than temperature "
        f"{config.temperature:g}, top-k {config.top_k or 'off'} and top-p {config.top_p:g}, "
        "so those rollouts' ratios use recomputed log-probs (`mismatched` in each step's "
        "metrics counts them; said once). "
        "Likely cause: the server's sampling settings (top_k, min_p or a repetition penalty "
        "from the model's generation_config.json or extra_body). Fix: start vllm serve with "
        "--logprobs-mode processed_logprobs --generation-config vllm (docs/scale.md)"
    )


def _nothing_left(shortened: int, rollouts: int, max_tokens: int) -> str:
    """Why a step has no completion token to train on."""
    if shortened:
        return (
            f"no completion token left to train on: {shortened} of {rollouts} rollouts were cut "
            f"at the training length of {max_tokens} tokens, which their prompts fill"
        )
    return f"no completion token to train on: the {rollouts} completions are empty"


def _total(norm: Tensor) -> float:
    """A norm as a number (under FSDP it is a DTensor over the processes' shards)."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


def _staleness(rollouts: Sequence[Rollout], trained: int) -> float | None:
    """Mean policy versions between each rollout's sampling and the weights step `trained + 1`
    started from, over the rollouts whose version is known."""
    known = [trained - r.version for r in rollouts if r.version is not None]
    return float(np.mean(known)) if known else None
