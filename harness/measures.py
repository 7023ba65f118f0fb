"""How a campaign's candidates measure up, the way the VPO paper compares policies.

Per iteration (one rollout group: G rollouts of m candidate slots each):

    parse rate       the share of its rollouts whose m candidates all parsed
    pool diversity   the mean L1 distance between the reward vectors of every pair of distinct
                     candidate slots that hold a program (all G x m of them), as the
                     trainer measures its groups (`trainer.measures.pool_diversity`)

Over a set of programs, maximising, with the reference point 0 in every objective:

    hypervolume      the volume of the union of the boxes [0, r] over their score vectors r:
                     the region the set dominates (what `vpo run --report-to` logs per
                     iteration, and benchmarks/discovery.py compares arms by)

Over a campaign, on the n = sum of G x m candidate slots of all its rollouts (an unparsed slot
is a zero vector and never passes):

    best@k   E[max of k slots drawn uniformly without replacement], per objective and for the
             mean of the vector: sum_i C(i-1, k-1) / C(n, k) * x_(i), x sorted ascending
    pass@k   1 - C(n-c, k) / C(n, k), c the slots whose every objective is >= 1 (the best known
             value): Chen et al.'s unbiased estimator (arXiv 2107.03374)

best@k, pass@k and pool diversity are computed by `trainer.measures` (the one copy the trainer
and the answer problems share); the rest are pure functions on arrays here. `harness.store` reads
the vectors and stores the per-iteration ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Iterations in `vpo status`'s recent mean and in the plots' rolling mean.
RECENT = 20
# The largest k `vpo db bestk` reports by default, as the VPO paper's tables go.
MAX_K = 30


def parse_rate(parse_statuses: Sequence[str]) -> float | None:
    """The share of rollouts whose candidates all parsed (`parse_status` "ok"; the others are
    "partial" and "none"); None without rollouts (a skipped iteration)."""
    if not parse_statuses:
        return None
    return sum(status == "ok" for status in parse_statuses) / len(parse_statuses)


def rolling_mean(values: Sequence[float | None], window: int = RECENT) -> list[float | None]:
    """At each position, the mean of the values among it and the `window` - 1 before it that
    are not None; None where all of them are."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    present = np.array([v is not None for v in values], dtype=np.float64)
    filled = np.array([0.0 if v is None else v for v in values], dtype=np.float64)
    sums, counts = np.cumsum(np.r_[0.0, filled]), np.cumsum(np.r_[0.0, present])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(end - window, 0)
    total, count = sums[end] - sums[start], counts[end] - counts[start]
    return [float(t / c) if c else None for t, c in zip(total, count, strict=True)]


def front_points(points: np.ndarray) -> np.ndarray:
    """The distinct rows of `points` (n, d) no other row dominates (>= everywhere, > somewhere),
    maximising."""
    from harness.selection import pareto_front

    points = np.unique(np.asarray(points, dtype=np.float64).reshape(len(points), -1), axis=0)
    return points[pareto_front(points)] if len(points) else points


def hypervolume(points: np.ndarray) -> float:
    """The volume of the union of the boxes [0, p] over the rows p of `points` (n, d): the
    region the set dominates above the reference point 0, maximising; coordinates below 0
    count as 0.

    Slicing along the last objective: with the points sorted so that z_1 >= z_2 >= ... >= z_n
    and z_{n+1} = 0, the slab z_{i+1} < z <= z_i is crossed by exactly the boxes of points
    1..i, so HV_d = sum_i (z_i - z_{i+1}) * HV_{d-1}(points 1..i without their last
    coordinate), and HV_1 is the largest value. Exact; O(n^d) on the front, which holds tens
    of points where the objectives trade off."""
    points = np.clip(np.asarray(points, dtype=np.float64), 0.0, None)
    points = points[np.all(points > 0, axis=1)]  # a box with a zero side has no volume
    if len(points) == 0:
        return 0.0
    points = front_points(points)
    if points.shape[1] == 1:
        return float(points.max())
    points = points[np.argsort(-points[:, -1], kind="stable")]
    levels = np.append(points[:, -1], 0.0)
    return float(
        sum(
            (levels[i] - levels[i + 1]) * hypervolume(points[: i + 1, :-1])
            for i in range(len(points))
            if levels[i] > levels[i + 1]
        )
    )
