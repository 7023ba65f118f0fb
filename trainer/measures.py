"""The measures of a pool of candidates that the trainer, the campaign and the answer problems
share, written once (pure numpy; the trainer's layer, so that all of them can import it):

    pool diversity   the mean L1 distance between the reward vectors of every pair of distinct
                     candidates (the VPO paper's measure of a pool); None with fewer than two
    best@k           E[max of k values drawn uniformly without replacement], k = 1..k_max
    pass@k           1 - C(n-c, k) / C(n, k): Chen et al.'s unbiased estimator (arXiv 2107.03374)
    passes           which reward vectors reach the best known value (1) in every objective

`harness.measures` says how a campaign applies them.
"""

from __future__ import annotations

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
