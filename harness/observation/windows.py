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

Every measure is computed by `trainer.measures` (one copy for the trainer, the campaign and the
answer problems); here are the windows the views read them through. `harness.store` reads the
vectors and stores the per-iteration ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Iterations in `vpo status`'s recent mean and in the plots' rolling mean.
RECENT = 20
# The largest k `vpo db bestk` reports by default, as the VPO paper's tables go.
MAX_K = 30


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
