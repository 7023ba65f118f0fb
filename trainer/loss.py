"""The policy loss: PPO clip with dual clip, token-mean over the batch, k3 KL to a reference.

    loss = token-mean( pg ) + beta * token-mean( k3 )

with, per completion token t of a rollout with advantage A and ratio rho = pi / pi_old,

    pg = max(-A rho, -A clip(rho, 1 - eps, 1 + eps))   and, for A < 0, at most -A * dual_clip
    k3 = exp(ref - logp) - (ref - logp) - 1             (Schulman's low-variance KL estimator)

as in veRL's GRPO/PPO actor, which the VPO authors trained with (clip 0.2, dual clip 3.0,
beta 1e-3, arXiv 2605.22817). "Token-mean over the batch" divides by the number of completion
tokens of the whole batch, not of each micro-batch: pass `total_tokens` when one batch is split
into micro-batches whose gradients are accumulated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

CLIP = 0.2
DUAL_CLIP = 3.0
KL_BETA = 1e-3
KL_CLAMP = 10.0  # log-ratio bound inside k3, so one wild token cannot overflow exp


@dataclass(frozen=True)
class LossConfig:
    clip: float = CLIP
    dual_clip: float = DUAL_CLIP
    beta: float = KL_BETA

    def __post_init__(self) -> None:
        if not 0 < self.clip < 1:
            raise ValueError(f"clip must be in (0, 1), got {self.clip}")
        if self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if self.beta < 0:
            raise ValueError("beta must be >= 0")


@dataclass(frozen=True)
class LossParts:
    """Sums over the valid tokens (divide by the batch's token count for means)."""

    policy: float
    kl: float
    clipped: float  # tokens whose ratio left [1 - clip, 1 + clip]
    ratio: float  # the sum of the ratios
    tokens: int


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    config: LossConfig = LossConfig(),
    total_tokens: int | None = None,
) -> tuple[Tensor, LossParts]:
    """The loss of one (micro-)batch and its parts.

    logprobs, old_logprobs, ref_logprobs, mask: (N, T) over completion tokens (mask
    True or 1 where a token is real); advantages: (N,) per rollout or (N, T) per token.
    """
    mask = mask.to(logprobs.dtype)
    tokens = int(mask.sum().item())
    denominator = float(total_tokens if total_tokens is not None else max(tokens, 1))
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype)

    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - config.clip, 1 + config.clip)
    pg = torch.maximum(unclipped, clipped)
    pg = torch.where(advantages < 0, torch.minimum(pg, -advantages * config.dual_clip), pg)
    loss = (pg * mask).sum() / denominator

    kl_sum = logprobs.new_zeros(())
    if ref_logprobs is not None:
        delta = (ref_logprobs.detach() - logprobs).clamp(-KL_CLAMP, KL_CLAMP)
        k3 = torch.exp(delta) - delta - 1
        kl_sum = (k3 * mask).sum()
        if config.beta:
            loss = loss + config.beta * kl_sum / denominator
    outside = ((ratio < 1 - config.clip) | (ratio > 1 + config.clip)).to(mask.dtype)
    parts = LossParts(
        policy=float((pg.detach() * mask).sum()),
        kl=float(kl_sum.detach()),
        clipped=float((outside * mask).sum()),
        ratio=float((ratio.detach() * mask).sum()),
        tokens=tokens,
    )
    return loss, parts
