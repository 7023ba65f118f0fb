"""Heilbronn and minimum-distance-ratio verifiers: closed forms, brute force, invariances, and
the inputs a candidate could use to fool a careless check."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist

from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from problems.api import Infeasible
from problems.heilbronn import (
    Heilbronn,
    hull_area,
    in_convex_position,
    in_triangle,
    smallest_triangle,
)
from problems.min_distance_ratio import MinDistanceRatio, ratio_squared

H = math.sqrt(3) / 2
SQUARE = [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]


def test_heilbronn_closed_forms() -> None:
    # The triangle's corners and its centroid: three triangles of a third of the area each.
    centroid = [[0.0, 0.0], [1.0, 0.0], [0.5, H], [0.5, H / 3]]
    assert in_triangle(centroid, 4) == pytest.approx(1 / 3, rel=1e-12)
    # A square's corners: every triangle is half the square, which is the hull.
    assert in_convex_position(SQUARE, 4) == pytest.approx(0.5, rel=1e-12)
    assert hull_area(np.array(SQUARE + [[0.5, 0.5], [0.2, 0.9]])) == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(3, 9))
def test_heilbronn_matches_brute_force(seed: int, n: int) -> None:
    p = np.random.default_rng(seed).uniform(-1, 1, size=(n, 2))

    def area(i: int, j: int, k: int) -> float:
        (ux, uy), (vx, vy) = p[j] - p[i], p[k] - p[i]
        return abs(ux * vy - uy * vx) / 2

    areas = [area(*triple) for triple in combinations(range(n), 3)]
    assert smallest_triangle(p) == pytest.approx(min(areas), rel=1e-9, abs=1e-15)
    from scipy.spatial import ConvexHull

    assert hull_area(p) == pytest.approx(ConvexHull(p).volume, rel=1e-9)


@pytest.mark.parametrize("change", ["tiny", "huge", "moved", "rotated"])
def test_heilbronn_convex_value_is_invariant(change: str) -> None:
    p = np.random.default_rng(1).uniform(0, 1, size=(13, 2))
    before = in_convex_position(p, 13)
    angle = 0.7
    turn = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    changed = {"tiny": p * 1e-200, "huge": p * 1e200, "moved": p + 1e3, "rotated": p @ turn}
    assert in_convex_position(changed[change], 13) == pytest.approx(before, rel=1e-9)


HEILBRONN_BAD = {
    "outside by a hair": (in_triangle, [[0.5, -1e-15]] + [[0.5, 0.1]] * 10, 11, "outside"),
    "beyond the slanted edge": (in_triangle, [[0.9, 0.2]] + [[0.5, 0.1]] * 10, 11, "outside"),
    "nan": (in_convex_position, [[math.nan, 0.0]] * 13, 13, "finite"),
    "infinity": (in_convex_position, [[math.inf, 0.0]] + SQUARE * 3, 13, "finite"),
    "wrong shape": (in_convex_position, SQUARE, 13, "shape"),
    "3-D points": (in_convex_position, [[0.0, 0.0, 0.0]] * 13, 13, "shape"),
    "complex": (in_convex_position, np.zeros((13, 2), dtype=complex), 13, "real numbers"),
    "strings": (in_triangle, [["a", "b"]] * 11, 11, "real numbers"),
    "one spot": (in_convex_position, [[0.3, 0.3]] * 13, 13, "same place"),
    "one line": (in_convex_position, [[t, 2 * t] for t in range(13)], 13, "one line"),
}


@pytest.mark.parametrize("case", sorted(HEILBRONN_BAD))
def test_heilbronn_bad_answers_are_rejected(case: str) -> None:
    verify, value, n, words = HEILBRONN_BAD[case]
    with pytest.raises(Infeasible, match=words):
        verify(value, n)


def test_corners_are_inside_and_repeated_points_score_zero() -> None:
    corners = [[0.0, 0.0], [1.0, 0.0], [0.5, H]]
    assert in_triangle(corners * 3 + corners[:2], 11) == 0.0  # valid, worthless


def test_distance_ratio_closed_forms_and_brute_force() -> None:
    grid = [[i, j] for i in range(4) for j in range(4)]
    assert ratio_squared(grid, 16, 2) == pytest.approx(18.0, rel=1e-12)
    triangle = [[0.0, 0.0], [1.0, 0.0], [0.5, H]]
    assert ratio_squared(triangle, 3, 2) == pytest.approx(1.0, rel=1e-12)
    p = np.random.default_rng(5).normal(size=(14, 3))
    d = pdist(p)
    assert ratio_squared(p, 14, 3) == pytest.approx((d.max() / d.min()) ** 2, rel=1e-9)
    for factor in (1e-200, 1e200):
        assert ratio_squared(p * factor, 14, 3) == pytest.approx((d.max() / d.min()) ** 2)


def test_distance_ratio_rejects_duplicates_and_bad_data() -> None:
    grid = [[i, j] for i in range(4) for j in range(4)]
    with pytest.raises(Infeasible, match="points 0 and 1 are in the same place"):
        ratio_squared([grid[0], *grid[:15]], 16, 2)
    with pytest.raises(Infeasible, match="same place"):
        ratio_squared([[1.0, 1.0]] * 16, 16, 2)
    with pytest.raises(Infeasible, match="shape"):
        ratio_squared(grid, 14, 3)
    with pytest.raises(Infeasible, match="finite"):
        ratio_squared([[math.nan, 0.0]] * 16, 16, 2)


@pytest.mark.parametrize("problem", [Heilbronn(), MinDistanceRatio()], ids=lambda p: p.name)
def test_seeds_evaluate_ok(problem: object) -> None:
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(problem, problem.seed_program, sandbox)
    assert evaluation.status == "ok", evaluation.reason
    assert all(0 < s < 1 for s in evaluation.scores.values())
