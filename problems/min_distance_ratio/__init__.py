"""Minimum distance ratio: n points whose largest pairwise distance is as small as possible
relative to their smallest one.

AlphaEvolve, Novikov et al., arXiv 2506.13131, Appendix B.8, in Friedman's convention (the ratio
squared, lower is better): 16 points in the plane 12.890 (Friedman's table) -> 12.889266112
(AlphaEvolve); 14 points in space 4.168 -> 4.165849767.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from problems import exact
from problems.api import Anchor, Call, Infeasible, Objective, Problem
from problems.heilbronn import points

SOURCE_AE = "AlphaEvolve, Novikov et al., arXiv 2506.13131, Appendix B.8"
SOURCE_FRIEDMAN = "E. Friedman's table, as AlphaEvolve quotes it (arXiv 2506.13131)"

DESCRIPTION = """\
Place n distinct points so that the ratio of the largest to the smallest distance between two
of them is as small as possible. Write a Python function

    def construct(n: int, d: int) -> np.ndarray

that returns the points as an array of shape (n, d). It is called twice, each call in its own
process with a time limit of {limit:g} seconds: construct(16, 2) (16 points in the plane) and
construct(14, 3) (14 points in space); numpy and scipy are available.

Value: (largest distance / smallest distance) squared, from the squared distances between every
pair of points, computed exactly from your float64 coordinates; lower is better. Best known
12.889266112 (16 in the plane) and 4.165849767 (14 in space). Two points in the same place make
the value infinite and the answer invalid. The value does not change when the points are moved,
rotated or scaled (up to the rounding of your coordinates). The score is the best known value
divided by yours, capped at 1.
"""

SEED_PROGRAM = '''\
import itertools

import numpy as np


def construct(n, d):
    """The first n points of a small integer grid."""
    side = int(np.ceil(n ** (1 / d)))
    grid = list(itertools.product(range(side), repeat=d))
    return np.array(grid[:n], dtype=float)
'''


def ratio_squared(value: Any, n: int, d: int) -> float:
    p = points(value, n, d)
    if (p == p[0]).all():
        raise Infeasible("all points are in the same place")
    # Exact integers: rounded squared distances could shrink the largest or grow the smallest,
    # and moving or scaling the points in float64 would change them; none of that happens here.
    values, _ = exact.integers(p.T.ravel().tolist())
    coords = [values[k * n : (k + 1) * n] for k in range(d)]
    pairs = [
        (sum((axis[i] - axis[j]) ** 2 for axis in coords), i, j)
        for i in range(n)
        for j in range(i + 1, n)
    ]
    squared, i, j = min(pairs)  # the nearest pair, the first in order on ties
    farthest = max(pairs)[0]
    if squared == 0:
        raise Infeasible(f"points {i} and {j} are in the same place")
    ratio = Fraction(farthest, squared)
    if ratio > sys.float_info.max:
        raise Infeasible(f"the ratio exceeds float64's range (points {i} and {j} nearly coincide)")
    # Rounded up: a lower value is better, so the reported one is never better than the truth.
    return exact.float_up(ratio)


class MinDistanceRatio(Problem):
    name = "min_distance_ratio"
    description = DESCRIPTION.format(limit=10.0)
    seed_program = SEED_PROGRAM
    entry = "construct"
    time_limit = 10.0
    objectives = (
        Objective(
            "n16_d2",
            "min",
            12.889266112,
            SOURCE_AE,
            "(max / min distance) squared of 16 points in the plane",
            (Anchor(12.890, SOURCE_FRIEDMAN), Anchor(12.889266112, SOURCE_AE)),
        ),
        Objective(
            "n14_d3",
            "min",
            4.165849767,
            SOURCE_AE,
            "(max / min distance) squared of 14 points in space",
            (Anchor(4.168, SOURCE_FRIEDMAN), Anchor(4.165849767, SOURCE_AE)),
        ),
    )

    def calls(self) -> tuple[Call, ...]:
        return (
            Call("n16_d2", (16, 2), ("n16_d2",)),
            Call("n14_d3", (14, 3), ("n14_d3",)),
        )

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        n, d = call.args
        return {call.key: ratio_squared(value, n, d)}


def make_problem() -> Problem:
    return MinDistanceRatio()
