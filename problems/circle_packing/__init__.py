"""Circle packing: n disjoint circles in a container, maximise the sum of their radii.

Anchors (sum of radii, higher is better):
- n=26 in the unit square: Friedman's table 2.634; AlphaEvolve 2.6358628 (Novikov et al.,
  arXiv 2506.13131, Appendix B.12); ThetaEvolve 2.63598308 at zero tolerance (Wang et al.,
  arXiv 2511.23473).
- n=32 in the unit square: Friedman's table 2.936; AlphaEvolve 2.9379445 (arXiv 2506.13131,
  Appendix B.13).
- n=21 in a rectangle of perimeter 4 (its sides chosen by the candidate): 2.364 before
  AlphaEvolve, AlphaEvolve 2.3658321 (arXiv 2506.13131, Appendix B.13; the construction
  verifies here with a bounding box of half-perimeter 1.99999997).
The check has zero tolerance: published "records" that exist only at 1e-9 or 1e-6 tolerance
(see OpenEvolve issue #183, ShinkaEvolve issue #73) do not pass here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from problems import exact
from problems.api import Anchor, Call, Infeasible, Objective, Problem

SOURCE_AE = "AlphaEvolve, Novikov et al., arXiv 2506.13131, Appendix B.12-B.13"
SOURCE_THETA = "ThetaEvolve, Wang et al., arXiv 2511.23473 (zero tolerance)"
SOURCE_FRIEDMAN = "E. Friedman, Packing Center, circles in squares table"
SOURCE_AE_PRIOR = "the best known before AlphaEvolve, as its paper quotes (arXiv 2506.13131, B.13)"

DESCRIPTION = """\
Pack n circles into the unit square [0, 1] x [0, 1] so that the sum of their radii is as large
as possible. The circles must not overlap and must lie entirely inside the square.

Write a Python function

    def construct_packing(n: int, container: str = "square") -> tuple[np.ndarray, np.ndarray]

that returns `centers`, an array of shape (n, 2), and `radii`, an array of shape (n,). It is
called three times, each call in its own process with a time limit of {limit:g} seconds:
construct_packing(26) and construct_packing(32) pack the unit square [0, 1] x [0, 1];
construct_packing(21, "rectangle") packs 21 circles into a rectangle of perimeter 4 whose sides
you choose (a 1 x 1 square is one such rectangle, a 0.9 x 1.1 one another). numpy and scipy are
available (import what you use). The function may search or optimise, but only what it returns
counts.

The check is exact, with no tolerance: every radius is finite and >= 0; for every pair of
circles the distance between centres is >= r_i + r_j; in the square, for every circle
r <= x <= 1 - r and r <= y <= 1 - r; for the rectangle, the circles' bounding box (from the
smallest x - r to the largest x + r, and the same in y) has width + height <= 2. These are
checked in exact arithmetic on the float64 numbers you return, without any rounding, wherever
the circles are. Rounding still counts: circles that touch exactly in theory can overlap by
1e-17 once their coordinates are rounded to float64, so leave a tiny margin (1e-12 is plenty).
A construction that breaks any rule scores 0 for that call. The score for each call is the sum
of radii divided by the best known sum (2.63598308 for n = 26, 2.9379445 for n = 32, 2.3658321
for the rectangle).
"""

SEED_PROGRAM = '''\
import numpy as np


def construct_packing(n, container="square"):
    """Equal circles on the smallest square grid that holds n of them; the rectangle case uses
    the unit square too (perimeter 4)."""
    k = int(np.ceil(np.sqrt(n)))
    r = 0.5 / k
    cells = [(i, j) for i in range(k) for j in range(k)][:n]
    centers = np.array([[(2 * i + 1) * r, (2 * j + 1) * r] for i, j in cells])
    # Touching circles can overlap by one rounding error; the check is exact, so keep a margin.
    radii = np.full(n, r * (1 - 1e-12))
    return centers, radii
'''


def check_packing(value: Any, n: int) -> float:
    """The sum of radii of a valid packing of n circles in the unit square; Infeasible otherwise."""
    centers, radii = _unpack(value, n)
    xs, ys, rs, one = _exact(centers, radii)
    for i, (x, y, r) in enumerate(zip(xs, ys, rs, strict=True)):
        if x - r < 0 or y - r < 0 or x + r > one or y + r > one:
            raise Infeasible(f"circle {i} is not inside the unit square")
    _check_disjoint(xs, ys, rs, one)
    return _sum_down(rs, one)


def check_rectangle_packing(value: Any, n: int) -> float:
    """The sum of radii of n disjoint circles whose bounding box has width + height <= 2 (a
    rectangle of perimeter 4); Infeasible otherwise."""
    centers, radii = _unpack(value, n)
    xs, ys, rs, one = _exact(centers, radii)
    # Exact integers: near 2**50, where floats are 0.25 apart, x - r computed in float64 would
    # round back to x and the box would ignore every radius.
    width = max(x + r for x, r in zip(xs, rs, strict=True)) - min(
        x - r for x, r in zip(xs, rs, strict=True)
    )
    height = max(y + r for y, r in zip(ys, rs, strict=True)) - min(
        y - r for y, r in zip(ys, rs, strict=True)
    )
    if width + height > 2 * one:
        w, h = float(Fraction(width, one)), float(Fraction(height, one))
        raise Infeasible(
            f"the circles' bounding box is {w:.9g} x {h:.9g}: perimeter "
            f"{float(Fraction(2 * (width + height), one)):.12g} > 4"
        )
    _check_disjoint(xs, ys, rs, one)
    return _sum_down(rs, one)


def _exact(centers: np.ndarray, radii: np.ndarray) -> tuple[list[int], list[int], list[int], int]:
    """Centres and radii as exact integers in one unit, and the integer that stands for 1."""
    values, shift = exact.integers(
        [*centers[:, 0].tolist(), *centers[:, 1].tolist(), *radii.tolist()]
    )
    n = len(radii)
    return values[:n], values[n : 2 * n], values[2 * n :], 1 << shift


def _check_disjoint(xs: list[int], ys: list[int], rs: list[int], one: int) -> None:
    """Every pair at distance >= r_i + r_j, compared exactly (both sides squared: they are >= 0)."""
    n = len(rs)
    for i in range(n):
        xi, yi, ri = xs[i], ys[i], rs[i]
        for j in range(i + 1, n):
            dx, dy, reach = xs[j] - xi, ys[j] - yi, ri + rs[j]
            squared = dx * dx + dy * dy
            if squared < reach * reach:
                # How deep, for the message: (reach^2 - d^2) / (reach + d), the subtraction exact.
                depth = Fraction(reach * reach - squared, one * one) / (
                    Fraction(reach, one) + Fraction(math.isqrt(squared), one)
                )
                raise Infeasible(f"circles {i} and {j} overlap by {float(depth):.3g}")


def _sum_down(rs: list[int], one: int) -> float:
    # Rounded down: the reported sum is never above the true sum of the returned radii.
    return exact.float_down(Fraction(sum(rs), one))


def _unpack(value: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    # The AlphaEvolve convention also returns a claimed sum; it is ignored, never trusted.
    if not isinstance(value, list) or len(value) not in (2, 3):
        raise Infeasible(f"expected (centers, radii), got {_describe(value)}")
    centers = exact.real_array(
        value[0],
        "centers",
        2 * n,
        f"centers has more than {2 * n} numbers: expected shape ({n}, 2)",
    )
    radii = exact.real_array(
        value[1], "radii", n, f"radii has more than {n} numbers: expected shape ({n},)"
    )
    if centers.shape != (n, 2):
        raise Infeasible(f"centers has shape {centers.shape}, expected ({n}, 2)")
    if radii.shape != (n,):
        raise Infeasible(f"radii has shape {radii.shape}, expected ({n},)")
    if not (np.isfinite(centers).all() and np.isfinite(radii).all()):
        raise Infeasible("centers and radii must be finite (found NaN or infinity)")
    if (radii < 0).any():
        raise Infeasible(f"radius {int(np.flatnonzero(radii < 0)[0])} is negative")
    return centers, radii


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"a sequence of length {len(value)}"
    return type(value).__name__


class CirclePacking(Problem):
    name = "circle_packing"
    description = DESCRIPTION.format(limit=10.0)
    seed_program = SEED_PROGRAM
    entry = "construct_packing"
    time_limit = 10.0
    objectives = (
        Objective(
            "n26",
            "max",
            2.63598308,
            SOURCE_THETA,
            "sum of radii of 26 circles in the unit square",
            (
                Anchor(2.634, SOURCE_FRIEDMAN),
                Anchor(2.6358628, SOURCE_AE),
                Anchor(2.63598308, SOURCE_THETA),
            ),
        ),
        Objective(
            "n32",
            "max",
            2.9379445,
            SOURCE_AE,
            "sum of radii of 32 circles in the unit square",
            (Anchor(2.936, SOURCE_FRIEDMAN), Anchor(2.9379445, SOURCE_AE)),
        ),
        Objective(
            "rect21",
            "max",
            2.3658321,
            SOURCE_AE,
            "sum of radii of 21 circles in a rectangle of perimeter 4",
            (Anchor(2.364, SOURCE_AE_PRIOR), Anchor(2.3658321, SOURCE_AE)),
        ),
    )

    def calls(self) -> tuple[Call, ...]:
        return (
            Call("n26", (26,), ("n26",)),
            Call("n32", (32,), ("n32",)),
            Call("rect21", (21, "rectangle"), ("rect21",)),
        )

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        if call.key == "rect21":
            return {call.key: check_rectangle_packing(value, call.args[0])}
        (n,) = call.args
        return {call.key: check_packing(value, n)}


def make_problem() -> Problem:
    return CirclePacking()
