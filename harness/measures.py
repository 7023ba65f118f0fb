"""How a campaign's candidates measure up, the way the VPO paper compares policies.

Per iteration (one rollout group: G rollouts of m candidate slots each):

    parse rate       the share of its rollouts whose m candidates all parsed
    pool diversity   the mean L1 distance between the reward vectors of every pair of distinct
                     candidate slots that hold a program (all G x m of them), as
                     `trainer.train.pool_diversity` measures the trainer's groups

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

Pure functions on arrays; `harness.store` reads the vectors and stores the per-iteration ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Iterations in `vpo status`'s recent mean and in the plots' rolling mean.
RECENT = 20
# The largest k `vpo db bestk` reports by default, as the VPO paper's tables go.
MAX_K = 30


def pool_diversity(vectors: np.ndarray) -> float | None:
    """The mean L1 distance between the rows of `vectors` (N, d) over the pairs of distinct
    rows; None with fewer than two rows.

    Per objective, with the values sorted x_(1) <= ... <= x_(N), the sum over pairs i < j of
    x_(j) - x_(i) is sum_j (2j - N - 1) x_(j): O(N log N) rather than the N^2 distances."""
    vectors = np.asarray(vectors, dtype=np.float64)
    n = len(vectors)
    if n < 2:
        return None
    ordered = np.sort(vectors.reshape(n, -1), axis=0)
    coefficients = 2.0 * np.arange(1, n + 1) - n - 1  # (N,)
    total = float(coefficients @ ordered.sum(axis=1))
    return max(0.0, total / (n * (n - 1) / 2))  # a sum of rounding can dip below 0


def parse_rate(parse_statuses: Sequence[str]) -> float | None:
    """The share of rollouts whose candidates all parsed (`parse_status` "ok"; the others are
    "partial" and "none"); None without rollouts (a skipped iteration)."""
    if not parse_statuses:
        return None
    return sum(status == "ok" for status in parse_statuses) / len(parse_statuses)


def best_at_k(values: np.ndarray, k_max: int) -> np.ndarray:
    """E[max of k values drawn uniformly without replacement from `values`] for k = 1..k_max:
    shape (k_max,) for values (n,), (k_max, c) for values (n, c), each column on its own.

    The i-th smallest of n values (1-based) is the maximum of C(i-1, k-1) of the C(n, k)
    subsets, so E = w_k . x_sorted with w_k[i] = C(i-1, k-1) / C(n, k). The weights go from k to
    k + 1 by one ratio, w_{k+1}[i] = w_k[i] * (i-k) (k+1) / (k (n-k)), starting at w_1 = 1/n:
    no binomial is ever formed, every factor is at most (k+1)/k, and n = 10^6 costs k_max
    passes over n numbers."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if not 1 <= k_max <= n:
        raise ValueError(f"k must be between 1 and the {n} values, got {k_max}")
    ordered = np.sort(values, axis=0)
    i = np.arange(1, n + 1, dtype=np.float64)
    weights = np.full(n, 1.0 / n)
    rows = []
    for k in range(1, k_max + 1):
        rows.append(weights @ ordered)
        if k < k_max:
            weights = weights * (np.maximum(i - k, 0.0) * (k + 1) / (k * (n - k)))
    # Rounding must not put an expectation outside the values it averages.
    return np.clip(np.array(rows), ordered[0], ordered[-1])


def pass_at_k(n: int, passing: int, k_max: int) -> np.ndarray:
    """1 - C(n - c, k) / C(n, k) for k = 1..k_max (c = `passing`): the chance that k slots
    drawn without replacement hold one that passes. The ratio is the running product of
    (n - c - j) / (n - j) over j < k, which never overflows."""
    if not 0 <= passing <= n or not 1 <= k_max <= n:
        raise ValueError(f"need 0 <= passing <= n and 1 <= k <= n, got n={n} c={passing} k={k_max}")
    j = np.arange(k_max, dtype=np.float64)
    none_pass = np.cumprod(np.maximum(n - passing - j, 0.0) / (n - j))
    return np.clip(1.0 - none_pass, 0.0, 1.0)


def passes(vectors: np.ndarray) -> np.ndarray:
    """Which rows of `vectors` (n, d) reach the best known value (1) in every objective."""
    vectors = np.asarray(vectors, dtype=np.float64)
    return np.all(vectors >= 1.0, axis=1) & (vectors.shape[1] > 0)


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
