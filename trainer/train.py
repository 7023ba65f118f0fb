"""One optimisation step over harvested groups.

    metrics = train_step(policy, groups, TrainConfig(advantage="vpo"))

A step stacks the groups' reward matrices into (B, G, m, d) (groups of another shape form their
own batch), computes one advantage per rollout, and runs the policy loss over every completion
token in micro-batches whose gradients add up to one optimiser step. The log-probs of the
completion tokens are computed from the last hidden states chunk by chunk, each chunk
recomputed in the backward pass (the 49k-vocabulary logits of SmolLM2 would otherwise dominate
memory: 8 x 256 tokens of them are 400 MB in fp32, and autograd would keep them all for the
backward pass).

This module knows nothing of the harness or the database: groups come in as token lists and
score arrays. It runs the same under `accelerate launch` on several devices (started through
`python -m harness.cli.train`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from trainer.advantages import ESTIMATORS, SINGLE_CANDIDATE
from trainer.loss import LossConfig, policy_loss
from trainer.policy import Policy

ADVANTAGES = tuple(ESTIMATORS)


@dataclass(frozen=True)
class Rollout:
    """One completion of a group: what the model read and what it wrote."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    logprobs: Sequence[float] | None = None  # the sampler's, where the backend gave them


@dataclass(frozen=True)
class Group:
    """G rollouts of one prompt and the reward vectors of their candidates."""

    rollouts: Sequence[Rollout]
    scores: np.ndarray  # (G, m, d) in [0, 1]
    mask: np.ndarray  # (G, m) True for candidates that exist, parsed and were evaluated

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
        if not np.all((scores >= 0) & (scores <= 1)):
            raise ValueError("scores must lie in [0, 1]")
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "mask", mask)


@dataclass(frozen=True)
class TrainConfig:
    advantage: str = "vpo"
    num_weights: int = 100  # K Dirichlet draws per group (VPO)
    alpha: float = 1.0  # Dirichlet concentration (VPO)
    k: int | None = None  # max@k's k; default max(2, G // 2)
    loss: LossConfig = field(default_factory=LossConfig)
    micro_batch: int = 8  # rollouts per forward/backward
    logit_chunk: int = 2048  # completion tokens per chunk of the vocabulary projection
    temperature: float = 1.0  # the sampling temperature: log-probs are of logits / T
    old_logprobs: str = "recompute"  # or "sampler": the backend's, where every rollout has them
    max_tokens: int = 4096  # longest prompt + completion trained on; longer is cut at the end

    def __post_init__(self) -> None:
        if self.advantage not in ESTIMATORS:
            raise ValueError(f"advantage {self.advantage!r} is not one of {', '.join(ESTIMATORS)}")
        if self.old_logprobs not in ("recompute", "sampler"):
            raise ValueError("old_logprobs must be 'recompute' or 'sampler'")
        if self.micro_batch < 1 or self.logit_chunk < 1 or self.num_weights < 1:
            raise ValueError("micro_batch, logit_chunk and num_weights must be >= 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class StepMetrics:
    step: int
    groups: int
    rollouts: int
    tokens: int  # completion tokens trained on
    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float
    grad_norm: float
    set_score: float  # mean over rollouts of the scalar the advantage came from
    zero_std_fraction: float  # groups whose advantages are all zero
    diversity: float  # mean pairwise L1 distance between a group's candidate vectors
    seconds: float
    tokens_per_second: float
    advantage: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return (
            f"step {self.step} | loss {self.loss:+.4f} | kl {self.kl:.2e} | set score "
            f"{self.set_score:.3f} | zero-std {self.zero_std_fraction:.0%} | diversity "
            f"{self.diversity:.3f} | {self.tokens_per_second:.0f} tok/s"
        )


@dataclass(frozen=True)
class Advantages:
    per_rollout: list[float]  # in the order of the groups' rollouts
    rewards: list[float]
    zero_std_groups: int
    diversity: list[float]  # one per group with at least two candidates


def compute_advantages(
    groups: Sequence[Group], config: TrainConfig, generator: torch.Generator | None = None
) -> Advantages:
    """One advantage per rollout, groups of the same (G, m, d) batched together."""
    estimator = ESTIMATORS[config.advantage]
    options: dict[str, Any] = {}
    if config.advantage == "vpo":
        options = {"num_weights": config.num_weights, "alpha": config.alpha}
        options["generator"] = generator
    elif config.advantage == "rw_grpo":
        options = {"generator": generator}
    elif config.advantage == "max_at_k":
        options = {"k": config.k}
    buckets: dict[tuple[int, ...], list[int]] = {}
    for index, group in enumerate(groups):
        buckets.setdefault(group.scores.shape, []).append(index)
    advantages: list[list[float]] = [[] for _ in groups]
    rewards: list[list[float]] = [[] for _ in groups]
    diversity: list[float] = []
    zero = 0
    for shape, members in buckets.items():
        if config.advantage in SINGLE_CANDIDATE and shape[1] != 1:
            raise ValueError(
                f"--advantage {config.advantage} scores one candidate per rollout; these "
                f"groups have m = {shape[1]} (use vpo or multi_rlvr, or 1 candidate)"
            )
        scores = torch.from_numpy(np.stack([groups[i].scores for i in members]))
        mask = torch.from_numpy(np.stack([groups[i].mask for i in members]))
        values, scalars = estimator(scores, mask, **options)
        zero += int((values == 0).all(dim=1).sum())
        diversity += pool_diversity(scores, mask)
        for row, i in enumerate(members):
            advantages[i] = values[row].tolist()
            rewards[i] = scalars[row].tolist()
    return Advantages(
        per_rollout=[a for group in advantages for a in group],
        rewards=[r for group in rewards for r in group],
        zero_std_groups=zero,
        diversity=diversity,
    )


def pool_diversity(scores: Tensor, mask: Tensor) -> list[float]:
    """Per group: the mean L1 distance between the reward vectors of its real candidates
    (all G x m of them, pairs of distinct candidates); groups with fewer than two are left out."""
    batch, group, m, dims = scores.shape
    vectors = scores.reshape(batch, group * m, dims).to(torch.float64)
    real = mask.reshape(batch, group * m)
    distances = torch.cdist(vectors, vectors, p=1)  # (B, N, N)
    pairs = real.unsqueeze(2) & real.unsqueeze(1)
    pairs &= ~torch.eye(group * m, dtype=torch.bool).unsqueeze(0)
    count = pairs.sum(dim=(1, 2))
    total = (distances * pairs).sum(dim=(1, 2))
    return [float(t / c) for t, c in zip(total, count, strict=True) if c > 0]


def train_step(
    policy: Policy,
    groups: Sequence[Group],
    config: TrainConfig = TrainConfig(),
    *,
    generator: torch.Generator | None = None,
    accelerator: Any = None,
) -> StepMetrics:
    """One optimiser step of `policy` on `groups`; returns what it measured.

    Under `accelerate launch` pass the `Accelerator` and give each process its own share of
    the groups: the token count and the gradients are summed over the processes before the
    step, so every process takes the same step as one process with all the groups would
    (data parallel; the metrics are this process's). The model is not wrapped in DDP: the
    loss runs the decoder and the vocabulary projection separately, which DDP cannot follow.
    """
    if not groups and getattr(accelerator, "num_processes", 1) == 1:
        raise ValueError("a training step needs at least one group")
    started = time.perf_counter()
    advantages = compute_advantages(groups, config, generator)
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    if config.old_logprobs == "sampler":
        missing = sum(1 for r in rollouts if r.logprobs is None)
        if missing:
            raise ValueError(f"old_logprobs='sampler' but {missing} rollouts have no log-probs")
    rows = [_cut(r, config.max_tokens) for r in rollouts]
    local_tokens = sum(len(completion) for _, completion, _ in rows)
    processes = getattr(accelerator, "num_processes", 1)
    total_tokens = local_tokens
    if processes > 1:
        total_tokens = int(
            accelerator.reduce(torch.tensor(local_tokens, device=policy.device), "sum")
        )
    if total_tokens == 0:
        raise ValueError("the rollouts have no completion tokens to train on")

    model = policy.model
    model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    # Longest first and similar lengths together: less padding in each micro-batch.
    order = sorted(range(len(rows)), key=lambda i: -(len(rows[i][0]) + len(rows[i][1])))
    sums = {"loss": 0.0, "policy": 0.0, "kl": 0.0, "clipped": 0.0}
    for start in range(0, len(order), config.micro_batch):
        chosen = order[start : start + config.micro_batch]
        batch = _batch([rows[i] for i in chosen], policy, config)
        with policy.autocast():
            logprobs = completion_logprobs(model, batch, config)
        ref = None
        if policy.has_reference and config.loss.beta > 0:
            with torch.no_grad(), policy.reference_model() as reference, policy.autocast():
                ref = completion_logprobs(reference, batch, config)
        old = batch["sampler_logprobs"] if config.old_logprobs == "sampler" else logprobs
        values = torch.tensor(
            [advantages.per_rollout[i] for i in chosen],
            dtype=logprobs.dtype,
            device=logprobs.device,
        )
        loss, parts = policy_loss(
            logprobs,
            old.detach(),
            values,
            batch["completion_mask"],
            ref_logprobs=ref,
            config=config.loss,
            total_tokens=total_tokens,
        )
        loss.backward()
        sums["loss"] += float(loss.detach())
        sums["policy"] += parts.policy
        sums["kl"] += parts.kl
        sums["clipped"] += parts.clipped
    parameters = policy.trainable_parameters()
    if processes > 1:
        for parameter in parameters:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            parameter.grad = accelerator.reduce(parameter.grad, "sum")
    if policy.config.grad_clip > 0:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, policy.config.grad_clip))
    else:
        grad_norm = float(
            torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in parameters if p.grad is not None])
            )
        )
    if math.isfinite(grad_norm):
        policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)
    policy.step += 1
    seconds = time.perf_counter() - started
    return StepMetrics(
        step=policy.step,
        groups=len(groups),
        rollouts=len(rollouts),
        tokens=local_tokens,
        loss=sums["loss"],
        policy_loss=sums["policy"] / max(local_tokens, 1),
        kl=sums["kl"] / max(local_tokens, 1),
        clip_fraction=sums["clipped"] / max(local_tokens, 1),
        grad_norm=grad_norm,
        set_score=float(np.mean(advantages.rewards)) if advantages.rewards else 0.0,
        zero_std_fraction=advantages.zero_std_groups / len(groups),
        diversity=float(np.mean(advantages.diversity)) if advantages.diversity else 0.0,
        seconds=seconds,
        tokens_per_second=local_tokens / seconds,
        advantage=config.advantage,
    )


def completion_logprobs(model: Any, batch: dict[str, Tensor], config: TrainConfig) -> Tensor:
    """(N, C) log-probs of the completion tokens under `model` at the sampling temperature."""
    backbone, head = _backbone_and_head(model)
    hidden = backbone(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state
    # The state at position p predicts token p + 1: gather the ones that predict completions.
    index = batch["predict_positions"].unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    states = hidden.gather(1, index)  # (N, C, H)
    targets = batch["completion_ids"]
    flat_states = states.reshape(-1, states.shape[-1])
    flat_targets = targets.reshape(-1)
    pieces = []
    chunked = flat_states.shape[0] > config.logit_chunk
    for start in range(0, flat_states.shape[0], config.logit_chunk):
        chunk = slice(start, start + config.logit_chunk)
        # Recomputing a chunk in the backward pass frees its logits meanwhile; with one chunk
        # there is nothing to free and the recomputation would be wasted.
        if chunked and torch.is_grad_enabled():
            piece = checkpoint(
                _chunk_logprobs,
                head,
                flat_states[chunk],
                flat_targets[chunk],
                config.temperature,
                use_reentrant=False,
            )
        else:
            piece = _chunk_logprobs(
                head, flat_states[chunk], flat_targets[chunk], config.temperature
            )
        pieces.append(piece)
    return torch.cat(pieces).reshape(targets.shape).float()


def _chunk_logprobs(head: Any, states: Tensor, targets: Tensor, temperature: float) -> Tensor:
    logits = head(states).float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.log_softmax(dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder (hidden states, no logits) and the vocabulary projection of a causal LM,
    through a peft wrapper if there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    backbone = base.get_decoder() if hasattr(base, "get_decoder") else None
    if backbone is None or head is None:
        raise ValueError(f"{type(base).__name__} exposes no decoder and output embeddings")
    if getattr(base.config, "final_logit_softcapping", None):
        raise ValueError(f"{type(base).__name__} soft-caps its logits, which is not supported")
    return backbone, head


def _cut(rollout: Rollout, max_tokens: int) -> tuple[list[int], list[int], list[float] | None]:
    prompt = list(rollout.prompt_ids)
    completion = list(rollout.completion_ids)
    logprobs = None if rollout.logprobs is None else list(rollout.logprobs)
    room = max(max_tokens - len(prompt), 0)
    if len(completion) > room:
        completion = completion[:room]
        logprobs = None if logprobs is None else logprobs[:room]
    if not prompt:
        raise ValueError("a rollout needs its prompt tokens to be trained on")
    return prompt, completion, logprobs


def _batch(
    rows: Sequence[tuple[list[int], list[int], list[float] | None]],
    policy: Policy,
    config: TrainConfig,
) -> dict[str, Tensor]:
    """Right-padded prompt + completion rows, and where each completion token is predicted."""
    pad = policy.tokenizer.pad_token_id or 0
    width = max(len(p) + len(c) for p, c, _ in rows)
    longest = max(max(len(c) for _, c, _ in rows), 1)
    n = len(rows)
    input_ids = torch.full((n, width), pad, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    completion_ids = torch.zeros((n, longest), dtype=torch.long)
    completion_mask = torch.zeros((n, longest), dtype=torch.bool)
    positions = torch.zeros((n, longest), dtype=torch.long)
    sampler = torch.zeros((n, longest), dtype=torch.float32)
    for row, (prompt, completion, logprobs) in enumerate(rows):
        length = len(prompt) + len(completion)
        input_ids[row, :length] = torch.tensor(prompt + completion)
        attention[row, :length] = 1
        if completion:
            completion_ids[row, : len(completion)] = torch.tensor(completion)
            completion_mask[row, : len(completion)] = True
            positions[row, : len(completion)] = torch.arange(
                len(prompt) - 1, len(prompt) - 1 + len(completion)
            )
        if logprobs is not None:
            sampler[row, : len(logprobs)] = torch.tensor(logprobs)
    device = policy.device
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attention.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "predict_positions": positions.to(device),
        "sampler_logprobs": sampler.to(device),
    }
