"""Every measure of candidates and their reward vectors, written once, for the trainer, the
campaign (selection, the store's per-iteration measures, trackers, views) and the answer
problems alike (pure numpy, in the trainer's layer, the lowest, so that all of them import it):

    pool diversity   the mean L1 distance between the reward vectors of every pair of distinct
                     candidates (the VPO paper's measure of a pool); None with fewer than two
    best@k           E[max of k values drawn uniformly without replacement], k = 1..k_max
    pass@k           1 - C(n-c, k) / C(n, k): Chen et al.'s unbiased estimator (arXiv 2107.03374)
    passes           which reward vectors reach the best known value (1) in every objective
    parse rate       the share of rollouts whose m candidates all parsed
    Pareto front     the rows no other row dominates (>= everywhere, > somewhere), maximising
    hypervolume      the volume the rows dominate above the reference point 0 (exact, slicing)

`harness.observation.windows` and `harness.store.series` say how a campaign applies them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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


def parse_rate(parse_statuses: Sequence[str]) -> float | None:
    """The share of rollouts whose candidates all parsed (`parse_status` "ok"; the others are
    "partial" and "none"); None without rollouts (a skipped iteration)."""
    if not parse_statuses:
        return None
    return sum(status == "ok" for status in parse_statuses) / len(parse_statuses)


def pareto_front(scores: np.ndarray) -> np.ndarray:
    """Sorted indices of the non-dominated rows of `scores` (N, d), higher is better.

    q dominates p when q >= p in every objective and q > p in one; equal rows do not dominate
    each other, so copies of a front point are all on the front. d = 2 is a sort and a sweep,
    O(N log N); other d filter the points one by one, O(N * front size * d).
    """
    scores = np.asarray(scores, dtype=np.float64)
    n = len(scores)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    d = scores.shape[1]
    if d == 0:
        return np.arange(n)
    if d == 1:
        return np.flatnonzero(scores[:, 0] == scores[:, 0].max())
    if d == 2:
        return _pareto_2d(scores)
    return _pareto_nd(scores)


def _pareto_2d(scores: np.ndarray) -> np.ndarray:
    x, y = scores[:, 0], scores[:, 1]
    order = np.lexsort((-y, -x))  # x descending, then y descending
    xs, ys = x[order], y[order]
    running = np.maximum.accumulate(ys)
    # Everything before position i has x >= xs[i]; one of them with a larger y dominates.
    before = np.concatenate(([-np.inf], running[:-1]))
    # Among points with strictly larger x, an equal y is enough to dominate.
    group_start = np.searchsorted(-xs, -xs, side="left")
    larger_x = np.where(group_start > 0, running[np.maximum(group_start - 1, 0)], -np.inf)
    dominated = (before > ys) | (larger_x >= ys)
    return np.sort(order[~dominated])


def _pareto_nd(scores: np.ndarray) -> np.ndarray:
    # A dominator has a strictly larger sum, so after sorting by sum descending each surviving
    # point only needs to knock out the points after it.
    order = np.argsort(-scores.sum(axis=1), kind="stable")
    points = scores[order]
    alive = order
    i = 0
    while i < len(points):
        # Earlier points are checked too: rounding can give a dominator an equal float sum.
        keep = (points > points[i]).any(axis=1) | (points == points[i]).all(axis=1)
        i = int(keep[:i].sum()) + 1
        points, alive = points[keep], alive[keep]
    return np.sort(alive)


def front_points(points: np.ndarray) -> np.ndarray:
    """The distinct rows of `points` (n, d) no other row dominates (>= everywhere, > somewhere),
    maximising."""
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
