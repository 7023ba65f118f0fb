"""The circle-packing scorer: published constructions verify, anything off by a hair does not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from problems.api import Call, Infeasible
from problems.circle_packing import CirclePacking, check_packing, check_rectangle_packing

DATA = Path(__file__).parents[1] / "problems" / "circle_packing" / "data"
PUBLISHED = json.loads((DATA / "alphaevolve_circle_packings.json").read_text())


def published(key: str) -> tuple[np.ndarray, np.ndarray]:
    rows = np.array(PUBLISHED[key]["circles"])
    return rows[:, :2], rows[:, 2]


@pytest.mark.parametrize("key,n", [("unit_square_n26", 26), ("unit_square_n32", 32)])
def test_published_constructions_verify_at_their_published_sums(key: str, n: int) -> None:
    centers, radii = published(key)
    total = check_packing([centers, radii], n)
    assert total == pytest.approx(PUBLISHED[key]["sum_radii"], abs=1e-12)


@pytest.mark.parametrize("key,n", [("unit_square_n26", 26), ("unit_square_n32", 32)])
def test_raising_any_radius_by_1e_6_is_rejected(key: str, n: int) -> None:
    centers, radii = published(key)
    for i in range(n):
        bumped = radii.copy()
        bumped[i] += 1e-6
        with pytest.raises(Infeasible):
            check_packing([centers, bumped], n)


def test_objectives_map_published_sums_to_their_share_of_the_best_known() -> None:
    problem = CirclePacking()
    n26 = problem.objective("n26").normalise(PUBLISHED["unit_square_n26"]["sum_radii"])
    n32 = problem.objective("n32").normalise(PUBLISHED["unit_square_n32"]["sum_radii"])
    assert 0.9999 < n26 < 1.0  # AlphaEvolve's 26 is just below ThetaEvolve's record
    assert n32 == pytest.approx(1.0, abs=1e-7)
    # A new record keeps its margin over the best known sum.
    assert problem.objective("n26").normalise(3.0) == pytest.approx(3.0 / 2.63598308)


def test_claimed_sum_is_ignored() -> None:
    centers, radii = published("unit_square_n26")
    assert check_packing([centers, radii, 99.0], 26) == pytest.approx(radii.sum())


def grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    k = int(np.ceil(np.sqrt(n)))
    r = 0.5 / k
    cells = [(i, j) for i in range(k) for j in range(k)][:n]
    centers = np.array([[(2 * i + 1) * r, (2 * j + 1) * r] for i, j in cells])
    return centers, np.full(n, r * (1 - 1e-12))


def test_touching_grid_fails_by_rounding_alone() -> None:
    # Documented in the statement: exact contact in theory, 1e-17 overlap in float64.
    centers, radii = grid(26)
    with pytest.raises(Infeasible, match="overlap"):
        check_packing([centers, radii / (1 - 1e-12)], 26)


BAD = {
    "not a pair": ("hello", re.escape("expected (centers, radii)")),
    "one element": ([[0.5, 0.5]], re.escape("expected (centers, radii)")),
    "strings": (["abc", "def"], "real numbers"),
    "nan radius": (lambda c, r: [c, np.where(np.arange(len(r)) == 3, np.nan, r)], "finite"),
    "inf center": (lambda c, r: [np.where(c > 0.9, np.inf, c), r], "finite"),
    "complex": (lambda c, r: [c.astype(complex), r], "real numbers"),
    "bool": (lambda c, r: [c > 0.5, r], "real numbers"),
    "negative radius": (lambda c, r: [c, np.where(np.arange(len(r)) == 0, -0.01, r)], "negative"),
    "wrong centers shape": (lambda c, r: [c.T, r], "shape"),
    "too few radii": (lambda c, r: [c, r[:-1]], "shape"),
    "huge array": (lambda c, r: [np.zeros((10**6, 2)), np.zeros(10**6)], "shape"),
    "ragged": (lambda c, r: [[[0.1, 0.1], [0.2]], r.tolist()], "rectangular"),
    "outside": (lambda c, r: [c + 0.01, r], "inside"),
    "overlap": (
        lambda c, r: [np.where(np.arange(len(c))[:, None] == 1, c[0] + [0, r[0]], c), r],
        "circles 0 and 1 overlap",
    ),
    "all in one spot": (lambda c, r: [np.full_like(c, 0.5), r], "overlap"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_data_is_rejected_with_a_reason(case: str) -> None:
    make, words = BAD[case]
    centers, radii = grid(26)
    value = make(centers, radii) if callable(make) else make
    with pytest.raises(Infeasible, match=words):
        check_packing(value, 26)


def test_integer_and_list_data_is_accepted() -> None:
    centers, radii = grid(26)
    assert check_packing([centers.tolist(), radii.tolist()], 26) == pytest.approx(
        26 / 12 * (1 - 1e-12)
    )
    zeros = [[[0, 0]] * 26, [0] * 26]  # degenerate but legal: points of radius 0
    assert check_packing(zeros, 26) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.integers(0, 2**32 - 1), st.floats(1e-9, 1e-2))
def test_largest_radii_pass_and_any_growth_fails(n: int, seed: int, growth: float) -> None:
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.05, 0.95, size=(n, 2))
    room = np.minimum(centers, 1 - centers).min(axis=1)
    dist = np.hypot(*(centers[:, None, :] - centers[None, :, :]).transpose(2, 0, 1))
    np.fill_diagonal(dist, np.inf)
    radii = np.minimum(room, dist.min(axis=1) / 2) * (1 - 1e-9)
    assert check_packing([centers, radii], n) == pytest.approx(radii.sum())
    # The circle with the least room to grow touches (almost) something: growing it must fail.
    slack = np.minimum(room - radii, (dist - radii[:, None] - radii[None, :]).min(axis=1))
    i = int(np.argmin(slack))
    grown = radii.copy()
    grown[i] += slack[i] + growth
    with pytest.raises(Infeasible):
        check_packing([centers, grown], n)


def test_problem_scores_per_call() -> None:
    problem = CirclePacking()
    centers, radii = grid(32)
    assert problem.score(Call("n32", (32,), ("n32",)), [centers, radii]) == {
        "n32": pytest.approx(32 / 12 * (1 - 1e-12))
    }


def test_published_rectangle_packing_verifies_at_its_published_sum() -> None:
    centers, radii = published("rectangle_perimeter4_n21")
    total = check_rectangle_packing([centers, radii], 21)
    assert total == pytest.approx(PUBLISHED["rectangle_perimeter4_n21"]["sum_radii"], abs=1e-12)
    assert CirclePacking().objective("rect21").normalise(total) == pytest.approx(1.0, abs=1e-7)
    for i in range(21):  # any radius 1e-6 larger breaks a contact or the perimeter
        bumped = radii.copy()
        bumped[i] += 1e-6
        with pytest.raises(Infeasible, match="overlap|perimeter"):
            check_rectangle_packing([centers, bumped], 21)


def test_rectangle_perimeter_is_checked_exactly() -> None:
    # Two circles side by side: box 4r x 2r, so width + height = 6r; r = 1/3 is exactly 2.
    r = 1 / 3
    touching = [[[r, r], [3 * r, r]], [r, r]]
    assert check_rectangle_packing(touching, 2) == pytest.approx(2 / 3)
    wider = [[[r, r], [3 * r + 1e-9, r]], [r, r]]
    with pytest.raises(Infeasible, match="perimeter"):
        check_rectangle_packing(wider, 2)
    # Where the box sits does not matter, only its size. The move must itself be exact: r + 5
    # and r - 7 round in float64, which makes that box 2.2e-16 too large (tests/
    # test_scorer_hostile.py), so this uses radii 1/4 and 3/8, tight (w + h = 1.25 + 0.75)
    # and dyadic, which any of these moves keeps exact.
    a, b = 0.25, 0.375
    for dx, dy in [(0, 0), (5, -7), (-1e6, 2**40)]:
        tight = [[[a + dx, b + dy], [2 * a + b + dx, b + dy]], [a, b]]
        assert check_rectangle_packing(tight, 2) == a + b


def test_the_rectangle_is_its_own_call() -> None:
    problem = CirclePacking()
    assert [c.key for c in problem.calls()] == ["n26", "n32", "rect21"]
    rect = problem.calls()[2]
    assert rect.args == (21, "rectangle") and rect.objectives == ("rect21",)
    centers, radii = published("rectangle_perimeter4_n21")
    assert problem.score(rect, [centers, radii]) == {
        "rect21": pytest.approx(2.3658321334, abs=1e-9)
    }
