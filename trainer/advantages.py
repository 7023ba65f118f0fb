"""Group advantages for VPO and its baselines: pure torch, batched over groups, no Python loops.

Every estimator takes the same two tensors and returns the same two:

    scores  (B, G, m, d)  reward vectors (>= 0, 1 = the best known) of the m candidates of G
                          rollouts of B prompts
    mask    (B, G, m)     True for real candidates; missing, unparsed or failed ones are False
    ->  advantages (B, G), rewards (B, G)   one advantage per rollout, and the scalar it came from

The advantage of a rollout is given to every one of its completion tokens by the loss.

- `vpo_advantages`: the set score E_w[max_s w . r(s)] with w ~ Dirichlet(alpha), estimated with
  K draws shared by a group's G rollouts, then z-normalised within the group with the
  population std; exact zeros where that std < eps (Bahlous-Boldi et al., arXiv 2605.22817, the
  authors' `vpo_advantage`).
  With a reference (a parent, a front) the set score is the R2 gain over it, and a cost per
  rollout (its wasted slots) can be taken off (`set_scores`).
- `entropic_advantages`: TTT-Discover's entropic objective on the same set score: w - 1 with
  w = exp(beta R) / mean exp(beta R), beta per group from a KL budget (arXiv 2601.16175).
- `grpo_advantages`: scalar = mean of the vector of the single candidate (m = 1), z-normalised
  within the group (Shao et al., arXiv 2402.03300; Bessel-corrected std as veRL's GRPO).
- `multi_rlvr_advantages`: the GRPO scalar summed over a rollout's candidates, a candidate whose
  vector repeats an earlier one of the same rollout counting 0 (Puri et al., arXiv 2603.24844,
  as the VPO authors ran it).
- `max_at_k_advantages`: the unbiased estimator of E[max of k of the G rewards] for each
  rollout (Bagirov et al., arXiv 2510.23393), then z-normalised within the group (m = 1).
- `gdpo_advantages`: each objective z-normalised within the group, summed, then whitened over
  the whole batch (arXiv 2601.05242) (m = 1).
- `maxrl_advantages`: the scalar's deviation from its group mean over that mean,
  (r - mean) / (mean + eps) (Tajwar & Zeng, arXiv 2602.02710) (m = 1).
- `rw_grpo_advantages`: GRPO on w . r with one w ~ Dirichlet(1) per group, a random trade-off
  per prompt instead of a fixed one (the VPO authors' random-weighting baseline) (m = 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trainer.estimators import MEASURED, SPECS, one_of
from trainer.measures import pool_diversity

EPS = 1e-6

Estimator = Callable[..., tuple[Tensor, Tensor]]


def vpo_advantages(
    scores: Tensor, mask: Tensor, *, eps: float = EPS, **set_options: Any
) -> tuple[Tensor, Tensor]:
    """VPO: (advantages, set scores), both (B, G): each rollout's set score (`set_scores`, which
    takes the options: `num_weights`, `alpha`, `weights`, `generator`, `reference`,
    `reference_mask`, `cost`), z-normalised within its group with the population std."""
    values = set_scores(scores, mask, **set_options)
    return standardise(values, eps=eps, unbiased=False), values


def set_scores(
    scores: Tensor,
    mask: Tensor,
    *,
    num_weights: int = 100,
    alpha: float = 1.0,
    weights: Tensor | None = None,
    generator: torch.Generator | None = None,
    reference: Tensor | None = None,
    reference_mask: Tensor | None = None,
    cost: Tensor | None = None,
    signed: bool = False,
) -> Tensor:
    """(B, G): each rollout's set score E_w[max_c w . r_c], the R2 indicator of its candidates
    under w ~ Dirichlet(alpha); a rollout without a real candidate scores 0. `weights` (B, K, d)
    fixes the draws (one set per group, shared by its G rollouts); otherwise K = `num_weights`
    are drawn with `generator`.

    With a `reference` (B, P, d) (the vectors a group is measured against: its parent, or the
    front of what the campaign held; `reference_mask` (B, P) True for real rows), the score is
    the R2 gain over it, E_w[max(0, max_c w . r_c - max_p w . ref_p)]: what the candidates add
    beyond what is known under each w, 0 for a set that only restates it. A group without a
    real reference row is measured against 0, which is the absolute score (scores are >= 0).
    `signed`: the gain is not clipped at 0, E_w[max_c w . r_c - max_p w . ref_p], so a set that
    falls short of the reference ranks by how far (a rollout without a real candidate counts as
    one scoring 0): a denser signal where few rollouts beat what is known.
    `cost` (B, G) is then subtracted (a rollout's wasted candidate slots)."""
    batch, group, _, dims = _check(scores, mask)
    if weights is None:
        weights = dirichlet((batch, num_weights, dims), alpha, generator, scores)
    elif weights.dim() != 3 or weights.shape[0] != batch or weights.shape[2] != dims:
        raise ValueError(f"weights must be (B={batch}, K, d={dims}), got {tuple(weights.shape)}")
    weights = weights.to(scores.dtype)
    rows = scores.shape[1] * scores.shape[2]
    points = scores.reshape(batch, rows, dims)
    if reference is not None:
        if reference_mask is None:
            reference_mask = torch.ones(reference.shape[:2], dtype=torch.bool)
        if (
            reference.dim() != 3
            or reference.shape[0] != batch
            or reference.shape[2] != dims
            or reference_mask.shape != reference.shape[:2]
        ):
            raise ValueError(
                f"reference must be (B={batch}, P, d={dims}) with a (B, P) mask, got "
                f"{tuple(reference.shape)} and {tuple(reference_mask.shape)}"
            )
        # One product for candidates and reference rows alike: a candidate equal to a front
        # point gets the very same value under each w, so its gain is exactly 0.
        points = torch.cat([points, reference.to(scores.dtype)], dim=1)
    products = torch.einsum("bnd,bkd->bnk", points, weights)
    # (B, G, m, K): each candidate's value under each weight vector of its group.
    values = products[:, :rows].reshape(*scores.shape[:3], -1)
    values = values.masked_fill(~mask.unsqueeze(-1), -math.inf)
    best = values.amax(dim=2)  # (B, G, K): the set's best candidate under each w
    best = torch.where(mask.any(dim=2, keepdim=True), best, torch.zeros_like(best))
    if reference is not None and reference.shape[1]:
        known = products[:, rows:].masked_fill(~reference_mask.unsqueeze(-1), -math.inf)
        known = known.amax(dim=1)
        known = torch.where(torch.isfinite(known), known, torch.zeros_like(known))  # (B, K)
        best = best - known.unsqueeze(1)
        best = best if signed else best.clamp_min(0)
    result = best.mean(dim=-1)
    if cost is not None:
        if cost.shape != (batch, group):
            raise ValueError(f"cost must be (B={batch}, G={group}), got {tuple(cost.shape)}")
        result = result - cost.to(result.dtype)
    return result


def entropic_advantages(
    scores: Tensor,
    mask: Tensor,
    *,
    budget: float = math.log(2),
    **set_options: Any,
) -> tuple[Tensor, Tensor]:
    """The entropic objective log E[exp(beta R)] of TTT-Discover (Yuksekgonul et al., arXiv
    2601.16175) on the set score R (`set_scores`, with the same options as VPO): each rollout's
    advantage is w - 1, w = exp(beta R) / mean_group exp(beta R), with beta >= 0 chosen per
    group so that KL(q || uniform) = `budget` for q = softmax(beta R) (`entropic_beta`). As beta
    grows the objective tends to the group's max, so a rollout is paid for being the best of
    its group far more than for being above its mean."""
    if not budget > 0:
        raise ValueError(f"the entropic KL budget must be > 0, got {budget}")
    values = set_scores(scores, mask, **set_options)
    beta = entropic_beta(values, budget)
    shifted = (values - values.amax(dim=1, keepdim=True)) * beta.unsqueeze(1)
    weights = torch.softmax(shifted, dim=1) * values.shape[1]
    advantages = torch.where(beta.unsqueeze(1) > 0, weights - 1, torch.zeros_like(weights))
    return advantages, values


def entropic_beta(rewards: Tensor, budget: float, *, steps: int = 100) -> Tensor:
    """(B,): per row of `rewards` (B, G), the beta >= 0 with KL(softmax(beta r) || uniform) =
    `budget`, by bisection (the KL grows with beta, from 0 to log(G / ties at the max)). A row
    whose rewards are all equal gets 0; one that cannot reach the budget (ties at its max) gets
    the largest beta tried, 1e12 / spread (its weight then sits on its best rollouts)."""
    group = rewards.shape[1]
    rewards = rewards.to(torch.float64)
    spread = rewards.amax(dim=1) - rewards.amin(dim=1)
    flat = spread <= EPS
    centred = rewards - rewards.amax(dim=1, keepdim=True)

    def kl(beta: Tensor) -> Tensor:
        q = torch.softmax(centred * beta.unsqueeze(1), dim=1)
        return math.log(group) + (q * torch.log(q.clamp_min(1e-300))).sum(dim=1)

    # A bracket first: double from 1 / spread until the KL passes the budget (near-ties at the
    # top need beta far beyond 1 / spread), at most up to 1e12 / spread.
    scale = torch.where(flat, torch.ones_like(spread), 1.0 / spread.clamp_min(EPS))
    high = scale.clone()
    for _ in range(40):
        short = kl(high) <= budget
        if not short.any():
            break
        high = torch.where(short, high * 2, high)
    low = torch.zeros_like(high)
    for _ in range(steps):
        middle = (low + high) / 2
        above = kl(middle) > budget
        high = torch.where(above, middle, high)
        low = torch.where(above, low, middle)
    return torch.where(flat, torch.zeros_like(low), (low + high) / 2)


def grpo_advantages(
    scores: Tensor, mask: Tensor, *, eps: float = EPS, unbiased: bool = True
) -> tuple[Tensor, Tensor]:
    """GRPO on the mean of the vector of the one candidate per rollout."""
    scalar = _single(scores, mask, "grpo")
    return standardise(scalar, eps=eps, unbiased=unbiased), scalar


def multi_rlvr_advantages(
    scores: Tensor, mask: Tensor, *, eps: float = EPS, unbiased: bool = True
) -> tuple[Tensor, Tensor]:
    """Multi-RLVR: the GRPO scalar summed over the rollout's distinct candidates."""
    _check(scores, mask)
    m = scores.shape[2]
    # A candidate whose whole vector equals an earlier real candidate's in the same rollout
    # counts 0, so writing one answer m times is not rewarded m times.
    same = (scores.unsqueeze(3) == scores.unsqueeze(2)).all(dim=-1)  # (B, G, m, m)
    same = same & mask.unsqueeze(2)  # column j is a real candidate
    earlier = torch.ones(m, m, dtype=torch.bool, device=scores.device).tril(diagonal=-1)
    repeated = (same & earlier).any(dim=-1)  # (B, G, m)
    counted = mask & ~repeated
    scalar = (scores.mean(dim=-1) * counted).sum(dim=-1)
    return standardise(scalar, eps=eps, unbiased=unbiased), scalar


def max_at_k_advantages(
    scores: Tensor, mask: Tensor, *, k: int | None = None, eps: float = EPS
) -> tuple[Tensor, Tensor]:
    """max@k: each rollout's share of E[max of k rewards drawn from the group without
    replacement], the unbiased estimator of arXiv 2510.23393; k defaults to max(2, G // 2)."""
    scalar = _single(scores, mask, "max_at_k")
    group = scalar.shape[1]
    k = max(2, group // 2) if k is None else k
    if not 1 <= k <= group:
        raise ValueError(f"max_at_k needs 1 <= k <= G={group}, got k={k}")
    ordered, order = scalar.sort(dim=1)  # ascending; rank i (1-based) is position i - 1
    coefficients = _max_at_k_coefficients(group, k, scalar)
    shares = ordered @ coefficients.T  # (B, G): sum over j of coefficients[i, j] * ordered[j]
    estimate = torch.empty_like(shares).scatter_(1, order, shares)
    return standardise(estimate, eps=eps, unbiased=False), estimate


def gdpo_advantages(
    scores: Tensor, mask: Tensor, *, eps: float = EPS, unbiased: bool = True
) -> tuple[Tensor, Tensor]:
    """GDPO: every objective z-normalised within its group, summed, whitened over the batch."""
    _single(scores, mask, "gdpo")
    vectors = (scores * mask.unsqueeze(-1)).squeeze(2)  # (B, G, d)
    per_objective = standardise(vectors.transpose(1, 2), eps=eps, unbiased=unbiased)
    summed = per_objective.sum(dim=1)  # (B, G)
    flat = summed.reshape(-1)
    spread = flat.std(unbiased=unbiased) if flat.numel() > 1 else flat.new_zeros(())
    whitened = (summed - flat.mean()) / (spread + eps) if spread >= eps else summed * 0
    return whitened, vectors.mean(dim=-1)


def maxrl_advantages(scores: Tensor, mask: Tensor, *, eps: float = EPS) -> tuple[Tensor, Tensor]:
    """MaxRL: (r - mean) / (mean + eps) of the mean-of-vector scalar within each group; a
    group whose rewards are all equal (all zero included) gets exact zeros."""
    scalar = _single(scores, mask, "maxrl")
    mean = scalar.mean(dim=1, keepdim=True)
    deviation = scalar - mean
    equal = (scalar == scalar[:, :1]).all(dim=1, keepdim=True)
    advantages = torch.where(equal, torch.zeros_like(deviation), deviation / (mean + eps))
    return advantages, scalar


def rw_grpo_advantages(
    scores: Tensor,
    mask: Tensor,
    *,
    weights: Tensor | None = None,
    generator: torch.Generator | None = None,
    eps: float = EPS,
) -> tuple[Tensor, Tensor]:
    """Random-weighting GRPO: the single candidate's vector weighted by one w ~ Dirichlet(1)
    per group (`weights` (B, d) fixes them), then GRPO's z-normalisation."""
    _single(scores, mask, "rw_grpo")
    batch, _, _, dims = scores.shape
    if weights is None:
        weights = dirichlet((batch, 1, dims), 1.0, generator, scores)[:, 0]
    elif weights.shape != (batch, dims):
        raise ValueError(f"weights must be (B={batch}, d={dims}), got {tuple(weights.shape)}")
    vectors = scores[:, :, 0] * mask[:, :, :1]  # (B, G, d); a missing candidate scores 0
    scalar = torch.einsum("bgd,bd->bg", vectors, weights.to(scores.dtype))
    return standardise(scalar, eps=eps, unbiased=True), scalar


ESTIMATORS: dict[str, Estimator] = {
    "vpo": vpo_advantages,
    "entropic": entropic_advantages,
    "grpo": grpo_advantages,
    "multi_rlvr": multi_rlvr_advantages,
    "max_at_k": max_at_k_advantages,
    "gdpo": gdpo_advantages,
    "maxrl": maxrl_advantages,
    "rw_grpo": rw_grpo_advantages,
}


def standardise(values: Tensor, *, eps: float = EPS, unbiased: bool = False) -> Tensor:
    """(x - mean) / (std + eps) over the last dimension; exact zeros where std < eps."""
    if values.shape[-1] < 2:
        return torch.zeros_like(values)
    mean = values.mean(dim=-1, keepdim=True)
    std = values.std(dim=-1, keepdim=True, unbiased=unbiased)
    normalised = (values - mean) / (std + eps)
    return torch.where(std < eps, torch.zeros_like(normalised), normalised)


def dirichlet(
    shape: tuple[int, int, int],
    alpha: float,
    generator: torch.Generator | None,
    like: Tensor,
) -> Tensor:
    """Draws from the symmetric Dirichlet(alpha) of the last dimension, from `generator`."""
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
    if alpha == 1.0:
        # Dirichlet(1) is normalised Exp(1): -log(1 - U), U ~ Uniform[0, 1). Drawn in the
        # scores' precision: float32 halves the cost, and K = 100 draws dwarf its rounding.
        uniform = torch.rand(shape, generator=generator, dtype=dtype, device=like.device)
        gamma = -torch.log1p(-uniform)
    else:
        # torch's gamma sampler takes no generator: seed a private stream from it instead.
        seed = int(torch.randint(2**62, (), generator=generator, device="cpu"))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            concentration = torch.full(shape, alpha, dtype=torch.float64)
            gamma = torch._standard_gamma(concentration).to(device=like.device, dtype=dtype)
    gamma = gamma.clamp_min(torch.finfo(dtype).tiny)
    return gamma / gamma.sum(dim=-1, keepdim=True)


def _max_at_k_coefficients(group: int, k: int, like: Tensor) -> Tensor:
    """(G, G) matrix c with c[i, j] the weight of the j-th smallest reward in the share of the
    i-th smallest (0-based): C(i, k-1) on the diagonal (subsets where i is the max), C(j-1, k-2)
    above it (subsets holding i whose max is j), all over C(G, k)."""
    total = math.comb(group, k)
    rows = []
    for i in range(group):
        row = [0.0] * group
        row[i] = math.comb(i, k - 1) / total
        for j in range(i + 1, group):
            row[j] = (math.comb(j - 1, k - 2) if k >= 2 else 0) / total
        rows.append(row)
    return torch.tensor(rows, dtype=like.dtype, device=like.device)


def _check(scores: Tensor, mask: Tensor) -> tuple[int, int, int, int]:
    if scores.dim() != 4:
        raise ValueError(f"scores must be (B, G, m, d), got shape {tuple(scores.shape)}")
    if mask.shape != scores.shape[:3] or mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor of shape {tuple(scores.shape[:3])}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    batch, group, m, dims = scores.shape
    return batch, group, m, dims


def _single(scores: Tensor, mask: Tensor, name: str) -> Tensor:
    """The mean-of-vector scalar of the single candidate per rollout, (B, G)."""
    _check(scores, mask)
    if scores.shape[2] != 1:
        raise ValueError(
            f"{name} scores one candidate per rollout (m = 1), got m = {scores.shape[2]}"
        )
    return (scores.mean(dim=-1) * mask).squeeze(2)


# From a step's groups to one advantage per rollout.


@dataclass(frozen=True)
class Advantages:
    per_rollout: list[float]  # in the order of the groups' rollouts
    rewards: list[float]
    zero_std_groups: int
    diversity: list[float]  # one per group with at least two candidates


def compute_advantages(
    groups: Sequence[Any], config: Any, generator: torch.Generator | None = None
) -> Advantages:
    """One advantage per rollout of `groups` (trainer.train's Group) under `config` (its
    TrainConfig; neither is imported, since trainer.train imports this module), groups of the
    same (G, m, d) batched together."""
    estimator, spec = ESTIMATORS[config.advantage], SPECS[config.advantage]
    options: dict[str, Any] = {keyword: getattr(config, field) for field, keyword in spec.options}
    if spec.random:
        options["generator"] = generator
    if not spec.measured and any(g.reference is not None or g.cost is not None for g in groups):
        raise ValueError(
            f"a reward against a reference or a slot cost needs --advantage "
            f"{one_of(MEASURED)}, not {config.advantage}"
        )
    buckets: dict[tuple[int, ...], list[int]] = {}
    for index, group in enumerate(groups):
        buckets.setdefault(group.scores.shape, []).append(index)
    advantages: list[list[float]] = [[] for _ in groups]
    rewards: list[list[float]] = [[] for _ in groups]
    diversity: list[float] = []
    zero = 0
    for shape, members in buckets.items():
        if spec.single_candidate and shape[1] != 1:
            raise ValueError(
                f"--advantage {config.advantage} scores one candidate per rollout; these "
                f"groups have m = {shape[1]} (use vpo or multi_rlvr, or 1 candidate)"
            )
        scores = torch.from_numpy(np.stack([groups[i].scores for i in members]))
        mask = torch.from_numpy(np.stack([groups[i].mask for i in members]))
        measured = _measured_against([groups[i] for i in members], shape)
        values, scalars = estimator(scores, mask, **options, **measured)
        zero += int((values == 0).all(dim=1).sum())
        for group_scores, group_mask in zip(scores.numpy(), mask.numpy(), strict=True):
            # Per group, over its real candidates (all G x m); fewer than two are left out.
            spread = pool_diversity(group_scores[group_mask])
            if spread is not None:
                diversity.append(spread)
        for row, i in enumerate(members):
            advantages[i] = values[row].tolist()
            rewards[i] = scalars[row].tolist()
    return Advantages(
        per_rollout=[a for group in advantages for a in group],
        rewards=[r for group in rewards for r in group],
        zero_std_groups=zero,
        diversity=diversity,
    )


def _measured_against(groups: Sequence[Any], shape: tuple[int, ...]) -> dict[str, Tensor]:
    """The reference (B, P, d) with its mask, padded to the longest, and the cost (B, G) of
    groups of one shape; only what some group has."""
    found: dict[str, Tensor] = {}
    if any(g.reference is not None for g in groups):
        rows = max(1, *(0 if g.reference is None else len(g.reference) for g in groups))
        reference = torch.zeros((len(groups), rows, shape[2]), dtype=torch.float64)
        present = torch.zeros((len(groups), rows), dtype=torch.bool)
        for i, group in enumerate(groups):
            if group.reference is not None and len(group.reference):
                reference[i, : len(group.reference)] = torch.from_numpy(group.reference)
                present[i, : len(group.reference)] = True
        found = {"reference": reference, "reference_mask": present}
    if any(g.cost is not None for g in groups):
        found["cost"] = torch.from_numpy(
            np.stack([np.zeros(shape[0]) if g.cost is None else g.cost for g in groups])
        )
    return found
