"""benchmarks/reward_geometry.py's measures on hand-made rollouts: a trade-off changes the best
candidate with the weighting, collinear or repeated candidates do not, and its rank correlation
is Spearman's (scipy's, ties included)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_benchmark
from scipy.stats import spearmanr

geometry = load_benchmark("reward_geometry")

W = geometry.weightings(2, 100)


def test_a_trade_off_changes_the_best_candidate() -> None:
    assert geometry.best_switches(np.array([[0.9, 0.1], [0.1, 0.9]]), W)


def test_a_dominating_candidate_is_best_under_every_weighting() -> None:
    assert not geometry.best_switches(np.array([[0.9, 0.8], [0.5, 0.5], [0.1, 0.7]]), W)


def test_repeated_vectors_count_once() -> None:
    assert not geometry.best_switches(np.array([[0.3, 0.3], [0.3, 0.3]]), W)


@pytest.mark.parametrize("ties", [False, True])
def test_rank_correlation_is_spearmans(ties: bool) -> None:
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(40, 3))
    if ties:
        vectors = np.round(vectors)
    got = geometry.rank_correlations(vectors, ["a", "b", "c"])
    for (i, a), (j, b) in [((0, "a"), (1, "b")), ((0, "a"), (2, "c")), ((1, "b"), (2, "c"))]:
        expected = spearmanr(vectors[:, i], vectors[:, j]).statistic
        assert got[a, b] == pytest.approx(expected)


def test_a_constant_part_has_no_correlation() -> None:
    vectors = np.column_stack([np.arange(5.0), np.zeros(5)])
    assert np.isnan(geometry.rank_correlations(vectors, ["fit", "flat"])["fit", "flat"])


def test_rollouts_are_counted_by_what_they_hold() -> None:
    rollouts = [
        np.array([[0.9, 0.1], [0.1, 0.9]]),  # trade-off: switches
        np.array([[0.9, 0.8], [0.1, 0.2]]),  # dominated: does not
        np.array([[0.4, 0.4], [0.4, 0.4]]),  # one vector twice: not counted as distinct
        np.array([[0.5, 0.5]]),  # one scored candidate: not eligible
        np.zeros((0, 2)),  # nothing parsed
    ]
    row = geometry.of_rollouts("hand", ["x", "y"], rollouts, 100)
    assert (row.scored, row.eligible, row.distinct, row.switched) == (7, 3, 2, 1)
    assert row.switch_share == 0.5
