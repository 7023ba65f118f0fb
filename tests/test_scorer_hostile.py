"""Every scorer against hostile data: numbers where float64 rounding would decide feasibility
(2^50, 5e-324, values a rounding away from a boundary), the wrong types, the wrong shapes and
sizes. A scorer either scores what the returned numbers truly achieve, never more, or raises
Infeasible with a one-line reason: never another exception, never a long wait.

Each attack below was accepted (or crashed the scorer, or took seconds) before the scorers
checked feasibility in exact integer arithmetic and sized their input before reading it.
"Before reading it" is measured in memory, not time: the refusal allocates almost nothing where
reading the input first would have copied it into an array.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from itertools import combinations
from typing import Any

import numpy as np
import pytest

from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from problems.api import Call, Infeasible, Problem
from problems.autocorrelation import Autocorrelation, first_autocorrelation, minimum_overlap
from problems.bin_packing import BinPacking, bins_used, datasets
from problems.cap_set import CapSet, greedy_cap
from problems.circle_packing import CirclePacking, check_packing, check_rectangle_packing
from problems.heilbronn import Heilbronn, in_convex_position, in_triangle
from problems.min_distance_ratio import MinDistanceRatio, ratio_squared

# Where long double is float64 itself (macOS on arm64), it cannot hold what float64 cannot.
WIDE_LONG_DOUBLE = np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant
needs_wide_long_double = pytest.mark.skipif(
    not WIDE_LONG_DOUBLE, reason="long double is float64 on this platform"
)


def _refused(verify: Callable[..., Any], *args: Any, match: str = "") -> str:
    with pytest.raises(Infeasible, match=match) as info:
        verify(*args)
    reason = str(info.value)
    assert reason and "\n" not in reason
    return reason


# Circle packing ------------------------------------------------------------------------------


def far_grid(offset_x: float, offset_y: float) -> list[Any]:
    """The red team's rect21 packing: 21 circles of radius 0.1249 on a grid 0.25 apart, moved
    to where floats are 0.25 apart, so x - r and x + r round back to x. Its real bounding box
    is 1.2498 x 1.2498 (perimeter 5); measured in float64 it was 1 x 1, and it scored 2.6229,
    above the record 2.3658."""
    cells = [(i * 0.25, j * 0.25) for i in range(5) for j in range(5)][:21]
    centers = np.array(cells) + [offset_x, offset_y]
    return [centers, np.full(21, 0.1249)]


@pytest.mark.parametrize(
    "offset",
    [(2.0**50 + 1, 2.0**50 + 1), (-(2.0**50) - 2, 2.0**50 + 1), (2.0**50 + 1, -(2.0**50) - 2)],
    ids=["++", "-+", "+-"],
)
def test_rect21_far_from_the_origin_is_measured_exactly(offset: tuple[float, float]) -> None:
    packing = far_grid(*offset)
    centers, radii = packing
    # The premise: measured in float64 the box ignores the radii and fits (1 x 1).
    fooled = (centers + radii[:, None]).max(axis=0) - (centers - radii[:, None]).min(axis=0)
    assert fooled.tolist() == [1.0, 1.0]
    reason = _refused(check_rectangle_packing, packing, 21, match="perimeter")
    assert "1.2498 x 1.2498" in reason
    rect = CirclePacking().calls()[2]
    with pytest.raises(Infeasible):
        CirclePacking().score(rect, packing)


def test_rect21_with_huge_int64_centres_is_refused() -> None:
    # The same attack in integers: int64 centres near 2^60 become float64 with 256 between
    # neighbours; refused because float64 cannot hold them (and the box would be exact anyway).
    centers = (np.array([(i, j) for i in range(5) for j in range(5)][:21]) + 2**60).astype(np.int64)
    _refused(check_rectangle_packing, [centers, np.full(21, 100.0)], 21, match="2\\^53")


def test_rect21_scores_no_better_anywhere_it_is_moved() -> None:
    # An honest tight pair (radii 1/4 and 3/8, box 1.25 x 0.75) moved by exactly representable
    # amounts, out to 2^40: always the same exact answer. At 1e300 no such move exists.
    a, b = 0.25, 0.375
    for dx, dy in [(0.0, 0.0), (2.0**40, -(2.0**40)), (1e300, -1e300)]:
        tight = [[[a + dx, b + dy], [2 * a + b + dx, b + dy]], [a, b]]
        if dx < 1e300:
            assert check_rectangle_packing(tight, 2) == a + b
        else:  # at 1e300 the centres round onto one point: the circles then overlap
            _refused(check_rectangle_packing, tight, 2, match="overlap")


def test_a_pair_moved_by_rounding_offsets_is_refused() -> None:
    # Two circles of radius 1/3 side by side (box exactly 4r x 2r, w + h = 2), moved by
    # (5, -7): r + 5 and r - 7 round, and the box really is 2.2e-16 too large. The float64
    # measurement at y = -7 lost 5.5e-16 of the height and accepted it.
    r = 1 / 3
    moved = [[[r + 5, r - 7], [3 * r + 5, r - 7]], [r, r]]
    _refused(check_rectangle_packing, moved, 2, match="perimeter")


def test_square_containment_has_no_rounding() -> None:
    # x + r = 1 + 2^-53 exactly, which rounds to 1.0 in float64.
    _refused(check_packing, [[[0.5 + 2**-53, 0.5]], [0.5]], 1, match="inside the unit square")
    _refused(check_packing, [[[0.5, 0.5 + 2**-53]], [0.5]], 1, match="inside the unit square")
    assert check_packing([[[0.5, 0.5]], [0.5]], 1) == 0.5  # touching all four sides is inside


def test_overlap_by_a_rounding_error_is_refused() -> None:
    # The distance between the centres is 6.8e-18 short of r0 + r1; hypot rounded it away.
    centers = [[0.3, 0.3], [0.42701895283579505, 0.38499791591803834]]
    _refused(check_packing, [centers, [0.1, 0.052834747652200635]], 2, match="overlap by 6.")


@pytest.mark.parametrize("seed", range(8))
def test_circle_sum_is_never_rounded_up(seed: int) -> None:
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.05, 0.95, size=(26, 2))
    room = np.minimum(centers, 1 - centers).min(axis=1)
    dist = np.hypot(*(centers[:, None, :] - centers[None, :, :]).transpose(2, 0, 1))
    np.fill_diagonal(dist, np.inf)
    radii = np.minimum(room, dist.min(axis=1) / 2) * (1 - 1e-9)
    total = check_packing([centers, radii], 26)
    exact = sum(map(Fraction, radii.tolist()))
    assert Fraction(total) <= exact and exact - Fraction(total) < 1e-15


CIRCLE_DATA = {
    "bool among numbers": ([[True, 0.5]] * 26, "real numbers, found a bool"),
    "None among numbers": ([[None, 0.5]] * 26, "found a NoneType"),
    "integer beyond 2^53": ([[2**53 + 1, 0]] * 26, "2\\^53"),
    "integer beyond float64": ([[2**1100, 0.5]] * 26, "2\\^53"),
    "long double that float64 rounds": (
        np.full((26, 2), np.longdouble(1) / 3),
        "float64 cannot represent",
    ),
    "long double beyond float64": (np.full((26, 2), np.longdouble("1e400")), "cannot represent"),
    "mixed nesting": ([[0.5, 0.5]] * 25 + [0.5], "rectangular"),
}


@pytest.mark.parametrize("case", sorted(CIRCLE_DATA))
def test_circle_centres_of_the_wrong_kind_are_refused(case: str) -> None:
    if case.startswith("long double") and not WIDE_LONG_DOUBLE:
        pytest.skip("long double is float64 on this platform")
    centers, words = CIRCLE_DATA[case]
    _refused(check_packing, [centers, [0.01] * 26], 26, match=words)


def test_ten_million_circles_are_refused_before_they_are_read() -> None:
    many_centres = [[[0.0, 0.0]] * 10**7, [0.0] * 26]
    many_radii = [[[0.5, 0.5]] * 26, [0.0] * 10**7]
    with _allocating_little():  # an array of them first was 160 MB and took 4 s
        _refused(check_packing, many_centres, 26, match="more than 52")
        _refused(check_packing, many_radii, 26, match="more than 26")


def test_the_far_rect21_attack_through_the_sandbox_scores_nothing() -> None:
    code = (
        "import numpy as np\n"
        "\n"
        "def construct_packing(n, container='square'):\n"
        "    if container == 'rectangle':\n"
        "        cells = [(i * 0.25, j * 0.25) for i in range(5) for j in range(5)][:n]\n"
        "        return np.array(cells) + 2.0**50 + 1, np.full(n, 0.1249)\n"
        "    k = int(np.ceil(np.sqrt(n)))\n"
        "    r = 0.5 / k\n"
        "    cells = [(i, j) for i in range(k) for j in range(k)][:n]\n"
        "    centers = np.array([[(2 * i + 1) * r, (2 * j + 1) * r] for i, j in cells])\n"
        "    return centers, np.full(n, r * (1 - 1e-12))\n"
    )
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(CirclePacking(), code, sandbox)
    assert evaluation.status == "invalid", evaluation.reason
    assert "rect21" in (evaluation.reason or "") and "perimeter" in (evaluation.reason or "")
    assert evaluation.scores["rect21"] == 0.0 and evaluation.raw["rect21"] is None
    assert evaluation.scores["n26"] > 0.7  # the honest calls keep their credit


# Heilbronn -----------------------------------------------------------------------------------

INSIDE = [[0.5, 0.1]] * 10


def test_a_point_a_rounding_beyond_the_slanted_edge_is_outside() -> None:
    # y = fl(sqrt(3) x) lies above the true edge y = sqrt(3) x: y^2 > 3 x^2 exactly.
    x, y = 0.14909517500343308, 0.25824041826931937
    assert Fraction(y) ** 2 > 3 * Fraction(x) ** 2
    _refused(in_triangle, [[x, y], *INSIDE], 11, match="outside")
    _refused(in_triangle, [[1 - x, y], *INSIDE], 11, match="outside")  # and the right edge


def test_the_corners_and_subnormal_points_are_inside() -> None:
    h = math.sqrt(3) / 2  # rounds below the true apex: inside
    corners = [[0.0, 0.0], [1.0, 0.0], [0.5, h], [5e-324, 0.0], [1.0 - 2**-53, 0.0]]
    assert in_triangle(corners + [[0.5, 0.1]] * 6, 11) == 0.0  # valid, but collinear points


def test_three_collinear_points_score_zero_whatever_rounding_does() -> None:
    # Exactly collinear (a, a + d, a + 3d, all exact); fsum of rounded products said 8.2e-18.
    a = np.array([41421356.0, 17320508.0]) / 2**26
    d = np.array([22360679.0, 31415926.0]) / 2**26
    rest = np.random.default_rng(0).uniform(-1, 1, size=(10, 2))
    p = np.vstack([[a, a + d, a + 3 * d], rest])
    assert in_convex_position(p, 13) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_heilbronn_values_are_never_rounded_up(seed: int) -> None:
    rng = np.random.default_rng(seed)
    u, v = rng.uniform(0.01, 0.99, size=(2, 11))
    flip = u + v > 1
    u[flip], v[flip] = 1 - u[flip], 1 - v[flip]
    p = np.stack([u + v / 2, v * np.sqrt(3) / 2], axis=1)
    twice = min(
        abs((Fraction(b[0]) - Fraction(a[0])) * (Fraction(c[1]) - Fraction(a[1])) -
            (Fraction(b[1]) - Fraction(a[1])) * (Fraction(c[0]) - Fraction(a[0])))
        for a, b, c in combinations(p.tolist(), 3)
    )  # fmt: skip
    value = Fraction(in_triangle(p, 11))
    # The true value is twice / (sqrt(3) / 2): value <= it exactly when 3 value^2 <= 4 twice^2.
    assert 3 * value**2 <= 4 * twice**2
    assert float(value) == pytest.approx(2 * float(twice) / math.sqrt(3), rel=1e-15)


def test_convex_value_is_the_same_near_2_to_the_50() -> None:
    p = np.random.default_rng(3).integers(0, 2**20, size=(13, 2)).astype(float)
    assert in_convex_position(p + 2.0**50, 13) == in_convex_position(p, 13)


# Minimum distance ratio ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_distance_ratio_is_never_rounded_down(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(16, 2)) * 10.0 ** rng.integers(-5, 5) + rng.normal(size=2) * 1e3
    exact = [
        sum((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(p[i], p[j], strict=True))
        for i, j in combinations(range(16), 2)
    ]
    value = ratio_squared(p, 16, 2)
    assert max(exact) / min(exact) <= Fraction(value)
    assert value == pytest.approx(float(max(exact) / min(exact)), rel=1e-15)


def test_distance_ratio_hostile_data() -> None:
    grid = [[i, j] for i in range(4) for j in range(4)]
    _refused(ratio_squared, [[x + 2**53 + 1, y] for x, y in grid], 16, 2, match="2\\^53")
    _refused(ratio_squared, [[float(x), True] for x, _ in grid], 16, 2, match="bool")
    _refused(ratio_squared, [[0.0, 0.0]] * 10**7, 16, 2, match="more than 32")
    # Distinct points 5e-324 apart next to one 1.0 away: a real ratio, above float64's range.
    near = [[0.0, 0.0], [5e-324, 0.0], *[[1.0, float(k)] for k in range(14)]]
    _refused(ratio_squared, near, 16, 2, match="range")
    assert ratio_squared([[x * 2.0**-1060, y * 2.0**-1060] for x, y in grid], 16, 2) == 18.0


# Autocorrelation -------------------------------------------------------------------------------


def test_erdos_height_a_rounding_above_1_is_refused() -> None:
    # Rescaled to sum N/2, height 0 is 1 + 1e-17: the rescaling in float64 rounded it to 1.
    h = [1.9557337180587304, 0.6697304014402209, 0.3081364575891442]
    assert Fraction(h[0]) * 3 > 2 * sum(map(Fraction, h))
    _refused(minimum_overlap, h, match="> 1")


@pytest.mark.parametrize(
    "value,words",
    [
        ([True, 0.5, 1.0], "bool"),
        ([2**53 + 1, 1], "2\\^53"),
        ([2**1100, 1.0], "2\\^53"),
        (np.array([1, 2**62], dtype=np.int64), "2\\^53"),
        pytest.param(
            np.array([1.0, 2.0], dtype=np.longdouble) / 3,
            "cannot represent",
            marks=needs_wide_long_double,
        ),
        (np.array(1.0), "flat list"),
        ([np.array([1.0, 2.0])], "flat list"),
    ],
    ids=["bool", "int 2^53+1", "int 2^1100", "int64 2^62", "long double", "0-d", "array inside"],
)
def test_heights_of_the_wrong_kind_are_refused(value: Any, words: str) -> None:
    _refused(first_autocorrelation, value, match=words)


def test_ten_million_heights_are_refused_before_they_are_read() -> None:
    heights = [1.0] * 10**7
    with _allocating_little():  # the array was 80 MB
        _refused(first_autocorrelation, heights, match="1 to")


# Cap set ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,words",
    [
        ([True] + [0.0] * 26, "bool"),
        ([2**60 + k for k in range(27)], "2\\^53"),  # float64 would make them all ties
        pytest.param(
            np.full(27, np.longdouble(1)) + np.arange(27) * np.longdouble(2.0**-60),
            "represent",
            marks=needs_wide_long_double,
        ),
        ([[0.0] * 27] * 10**6, "expected 27 priorities"),
    ],
    ids=["bool", "huge ints", "long double", "a million rows"],
)
def test_priorities_of_the_wrong_kind_are_refused(value: Any, words: str) -> None:
    with _allocating_little():
        _refused(greedy_cap, value, 3, match=words)


def test_ten_million_priorities_are_refused_before_they_are_read() -> None:
    priorities = [0.0] * 10**7
    with _allocating_little():  # the array was 80 MB
        _refused(greedy_cap, priorities, 9, match="expected 19683 priorities")


# Bin packing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment,words",
    [
        ([0, 1, 10**12], "beyond the 3 bins"),  # bincount tried to allocate 7 TiB
        ([0, 1, 2**63 - 1], "beyond the 3 bins"),
        ([0, 1, 2**64], "beyond int64"),
        (np.array([0, 0, 2**63], dtype=np.uint64), "beyond int64"),  # bincount: ValueError
        ([True, False, 0], "got a bool"),  # was read as bins 1, 0, 0
        ([0, 1, 2.0], "got a float"),
        ([[0, 1, 2]], "expected 3 integer bin indices"),
        ([0] * 10**6, "got 1000000 values"),
    ],
    ids=["1e12", "int64 max", "2^64", "uint64", "bools", "a float", "nested", "a million"],
)
def test_bin_indices_that_are_not_a_packing_are_refused(assignment: Any, words: str) -> None:
    with _allocating_little():  # bincount of 10^12 asked for 7 TiB
        _refused(bins_used, assignment, 10, [6, 5, 4], "x", match=words)


def test_the_last_possible_bin_index_still_counts() -> None:
    assert bins_used([2, 2, 1], 10, [6, 4, 9], "x") == 2


# Every scorer, every call, the same hostile values ----------------------------------------------


def _deep(levels: int) -> Any:
    value: Any = 0.5
    for _ in range(levels):
        value = [value]
    return value


HOSTILE: dict[str, Any] = {
    "None": None,
    "string": "x" * 1000,
    "dict": {"centers": [[0.5, 0.5]]},
    "empty list": [],
    "nested empty": [[]],
    "int": 5,
    "nan": math.nan,
    "inf list": [math.inf] * 30,
    "huge python ints": [2**1100] * 30,
    "huge int beside a float": [[2**1100, 0.5]] * 30,
    "integer beyond int64": [2**64, 0, 1],
    "bools": [True, False] * 15,
    "complex": [1 + 2j] * 30,
    "None inside": [None, 1.0],
    "0-d array": np.array(1.5),
    "empty (0, 2) array": np.zeros((0, 2)),
    "bool array": np.ones(30, dtype=bool),
    "complex array": np.zeros(30, dtype=complex),
    "uint64 max": np.full(30, 2**64 - 1, dtype=np.uint64),
    "int64 min": np.full(30, -(2**63), dtype=np.int64),
    "float16": np.ones(30, dtype=np.float16),
    "long double": np.full(30, np.longdouble(1) / 3),
    "subnormal": [5e-324] * 30,
    "negative zero": [-0.0] * 30,
    "float max": [1.7976931348623157e308] * 30,
    "deep nesting": _deep(90),
    "a million numbers": [0.0] * 10**6,
    "a thousand rows of a thousand": [[0.0] * 1000] * 1000,
}


def _shapes(value: Any, call: Call, problem: Problem) -> list[Any]:
    """The hostile value itself and wrapped where a problem expects a pair or per-instance list."""
    out = [value, [value, value], [value, value, 0.0]]
    if isinstance(problem, BinPacking):
        out.append([value] * len(datasets()[call.key]))
    return out


PROBLEMS = [
    CirclePacking(),
    Heilbronn(),
    MinDistanceRatio(),
    Autocorrelation(),
    CapSet(),
    BinPacking(),
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_values_score_or_are_refused_in_one_line(problem: Problem, case: str) -> None:
    for call in problem.calls():
        for value in _shapes(HOSTILE[case], call, problem):
            try:
                values = problem.score(call, value)
            except Infeasible as exc:
                assert str(exc) and "\n" not in str(exc)
            else:
                for name in call.objectives:
                    assert isinstance(values[name], float) and math.isfinite(values[name])


def test_humaneval_and_maze_refuse_what_is_not_their_data() -> None:
    from problems.humaneval import HumanEvalTask
    from problems.maze import MazeProblem

    task = HumanEvalTask(0)
    call = task.calls()[0]
    # the answers of a case's calls, each ["returned", value] or ["raised", name]; a verdict is
    # no answer
    forged = [["returned", ["object", []]]], [["returned", True]] * 2, [["raised", 3]]
    for value in (1, 1.0, "True", None, True, [True], np.True_, *forged):
        _refused(task.score, call, value, match="answer")
    maze = MazeProblem()
    instance = maze.instance("train", 0)
    _refused(maze.score_answer, instance, "UP " * 10**6 + "SIDEWAYS", match="SIDEWAYS")
    _refused(maze.score_answer, instance, "\x00" * 10**6, match="route holds only")


@contextmanager
def _allocating_little(limit_mb: float = 4.0) -> Iterator[None]:
    """The block's Python and numpy allocations peak below `limit_mb` (numpy reports its buffers
    to tracemalloc): a scorer that sizes its input before reading it never copies it whole."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit_mb * 2**20, f"allocated {peak / 2**20:.1f} MB"
