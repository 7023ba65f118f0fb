"""Heilbronn problems: place points so that the smallest triangle they form is as large as possible.

AlphaEvolve, Novikov et al., arXiv 2506.13131, Appendix B.9-B.10:
- triangle11: 11 points in a triangle; the smallest triangle's area over the container's.
  0.036 before AlphaEvolve -> 0.036530 (AlphaEvolve; the issue quotes 0.0365).
- convex13, convex14: 13 or 14 points anywhere; the smallest triangle's area over the area of
  the points' convex hull. 13: 0.0306 -> 0.030937; 14: 0.0277 -> 0.027836 (AlphaEvolve).

The container of triangle11 is the equilateral triangle with corners (0, 0), (1, 0) and
(1/2, sqrt(3)/2); the ratio does not depend on which triangle (an affine map keeps area ratios).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from itertools import combinations
from typing import Any

import numpy as np

from problems import exact
from problems.api import Anchor, Call, Infeasible, Objective, Problem

SOURCE_AE = "AlphaEvolve, Novikov et al., arXiv 2506.13131, Appendix B.9-B.10"
SOURCE_PRIOR = "the best known before AlphaEvolve, as its paper quotes (arXiv 2506.13131)"
SQRT3 = math.sqrt(3.0)
CORNERS = ((0.0, 0.0), (1.0, 0.0), (0.5, SQRT3 / 2))

DESCRIPTION = """\
Place points in the plane so that the smallest triangle formed by any three of them has the
largest possible area. Write a Python function

    def construct(region: str, n: int) -> np.ndarray

that returns the points as an array of shape (n, 2). It is called three times, each call in its
own process with a time limit of {limit:g} seconds; numpy and scipy are available:

- construct("triangle", 11): 11 points inside the equilateral triangle with corners (0, 0),
  (1, 0) and (0.5, sqrt(3)/2), boundary included. Value: the smallest area of a triangle formed
  by three of the points, divided by the container's area (sqrt(3)/4). Best known 0.036530.
- construct("convex", 13) and construct("convex", 14): n points anywhere. Value: the smallest
  area of a triangle formed by three of the points, divided by the area of their convex hull.
  Best known 0.030937 (13 points) and 0.027836 (14 points).

Higher is better. Containment is checked exactly, without rounding, on the float64 numbers you
return (y >= 0, sqrt(3) x - y >= 0 and sqrt(3) (1 - x) - y >= 0 with the true sqrt(3)), and
areas are computed exactly too; keep points a hair (1e-12) inside the edges. Three points on a
line, or two in the same place, make a triangle of area 0: valid, but the value is then 0. The
score is your value divided by the best known, capped at 1.
"""

SEED_PROGRAM = '''\
import itertools

import numpy as np
from scipy.spatial import ConvexHull


def sample(region, n, rng):
    """n random points: in the triangle by folding the unit square, else in the unit disk."""
    if region == "triangle":
        u, v = rng.uniform(0.001, 0.999, size=(2, n))
        flip = u + v > 1
        u[flip], v[flip] = 1 - u[flip], 1 - v[flip]
        return np.stack([u + v / 2, v * np.sqrt(3) / 2], axis=1)
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = np.sqrt(rng.uniform(0, 1, n))
    return np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)


def value(region, p, triples):
    a, b, c = p[triples[:, 0]], p[triples[:, 1]], p[triples[:, 2]]
    cross = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0])
    smallest = np.abs(cross).min() / 2
    area = np.sqrt(3) / 4 if region == "triangle" else ConvexHull(p).volume
    return smallest / area


def construct(region, n):
    """The best of a few hundred random placements."""
    rng = np.random.default_rng(n)
    triples = np.array(list(itertools.combinations(range(n), 3)))
    tries = [sample(region, n, rng) for _ in range(200)]
    return max(tries, key=lambda p: value(region, p, triples))
'''


def points(value: Any, n: int, dimension: int = 2) -> np.ndarray:
    """The returned points as an (n, dimension) float64 array, checked (each coordinate exactly
    the number returned)."""
    if not isinstance(value, np.ndarray | list | tuple):
        raise Infeasible(f"expected an array of points, got {type(value).__name__}")
    too_large = (
        f"points have more than {n * dimension} coordinates: expected shape ({n}, {dimension})"
    )
    array = exact.real_array(value, "coordinates", n * dimension, too_large)
    if array.shape != (n, dimension):
        raise Infeasible(f"points have shape {array.shape}, expected ({n}, {dimension})")
    if not np.isfinite(array).all():
        raise Infeasible("coordinates must be finite (found NaN or infinity)")
    return array


def _twice_smallest(xs: list[int], ys: list[int]) -> int:
    """Twice the smallest area of a triangle with corners among the points, exactly (integers:
    a rounded cross product could lift three points on a line off it)."""
    smallest: int | None = None
    for i, j, k in combinations(range(len(xs)), 3):
        ux, uy = xs[j] - xs[i], ys[j] - ys[i]
        vx, vy = xs[k] - xs[i], ys[k] - ys[i]
        twice = abs(ux * vy - uy * vx)
        if smallest is None or twice < smallest:
            smallest = twice
    return 0 if smallest is None else smallest


def _twice_hull(xs: list[int], ys: list[int]) -> int:
    """Twice the area of the points' convex hull, exactly (monotone chain, then the shoelace)."""
    ordered = sorted(set(zip(xs, ys, strict=True)))

    def cross(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def chain(items: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for q in items:
            while len(out) >= 2 and cross(out[-2], out[-1], q) <= 0:
                out.pop()
            out.append(q)
        return out

    hull = chain(ordered)[:-1] + chain(ordered[::-1])[:-1]
    if len(hull) < 3:
        return 0
    return abs(
        sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(hull, hull[1:] + hull[:1], strict=True))
    )


def _integer_points(p: np.ndarray) -> tuple[list[int], list[int], int]:
    """x and y as exact integers in one unit, and the integer that stands for 1."""
    values, shift = exact.integers([*p[:, 0].tolist(), *p[:, 1].tolist()])
    return values[: len(p)], values[len(p) :], 1 << shift


def smallest_triangle(p: np.ndarray) -> float:
    """The smallest area of a triangle with corners among the points (exact, then rounded)."""
    xs, ys, one = _integer_points(np.asarray(p, dtype=np.float64))
    return float(Fraction(_twice_smallest(xs, ys), 2 * one * one))


def hull_area(p: np.ndarray) -> float:
    """The area of the points' convex hull (exact, then rounded)."""
    xs, ys, one = _integer_points(np.asarray(p, dtype=np.float64))
    return float(Fraction(_twice_hull(xs, ys), 2 * one * one))


def in_triangle(value: Any, n: int) -> float:
    p = points(value, n)
    xs, ys, one = _integer_points(p)
    # The true triangle, sqrt(3) irrational: with y >= 0, sqrt(3) x >= y holds exactly when
    # x >= 0 and 3 x^2 >= y^2, and the same for the right edge with 1 - x. Integers: no rounding.
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if y < 0 or x < 0 or 3 * x * x < y * y or one - x < 0 or 3 * (one - x) ** 2 < y * y:
            raise Infeasible(f"point {i} ({p[i, 0]:.12g}, {p[i, 1]:.12g}) is outside the triangle")
    # Smallest area over the container's sqrt(3)/4: sqrt(4 T^2 / 3) with T twice the smallest
    # area in true units, rounded down so the value never exceeds what the points achieve.
    twice = Fraction(_twice_smallest(xs, ys), one * one)
    return exact.sqrt_down(4 * twice * twice / 3)


def in_convex_position(value: Any, n: int) -> float:
    p = points(value, n)
    if (p == p[0]).all():
        raise Infeasible("all points are in the same place")
    # Exact integers: a ratio of areas needs no moving or scaling, and nothing can overflow,
    # underflow or round on the way (only the final ratio is rounded, down).
    xs, ys, _ = _integer_points(p)
    hull = _twice_hull(xs, ys)
    if hull == 0:
        raise Infeasible("the points lie on one line: their convex hull has no area")
    return exact.float_down(Fraction(_twice_smallest(xs, ys), hull))


class Heilbronn(Problem):
    name = "heilbronn"
    description = DESCRIPTION.format(limit=10.0)
    seed_program = SEED_PROGRAM
    entry = "construct"
    time_limit = 10.0
    objectives = (
        Objective(
            "triangle11",
            "max",
            0.036530,
            SOURCE_AE,
            "smallest triangle of 11 points in a triangle, over its area",
            (Anchor(0.036, SOURCE_PRIOR), Anchor(0.036530, SOURCE_AE)),
        ),
        Objective(
            "convex13",
            "max",
            0.030937,
            SOURCE_AE,
            "smallest triangle of 13 points, over their convex hull's area",
            (Anchor(0.0306, SOURCE_PRIOR), Anchor(0.030937, SOURCE_AE)),
        ),
        Objective(
            "convex14",
            "max",
            0.027836,
            SOURCE_AE,
            "smallest triangle of 14 points, over their convex hull's area",
            (Anchor(0.0277, SOURCE_PRIOR), Anchor(0.027836, SOURCE_AE)),
        ),
    )

    def calls(self) -> tuple[Call, ...]:
        return (
            Call("triangle11", ("triangle", 11), ("triangle11",)),
            Call("convex13", ("convex", 13), ("convex13",)),
            Call("convex14", ("convex", 14), ("convex14",)),
        )

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        region, n = call.args
        verify = in_triangle if region == "triangle" else in_convex_position
        return {call.key: verify(value, n)}


def make_problem() -> Problem:
    return Heilbronn()
