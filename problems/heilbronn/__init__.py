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
from itertools import combinations
from typing import Any

import numpy as np

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

Higher is better. Containment is checked exactly in float64 (y >= 0, sqrt(3) x - y >= 0 and
sqrt(3) (1 - x) - y >= 0), so keep points a hair (1e-12) inside the edges. Three points on a
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
    """The returned points as an (n, dimension) float64 array, checked."""
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, list | tuple):
        try:
            array = np.array(value)
        except ValueError as exc:
            raise Infeasible(f"the points are not a rectangular array: {exc}") from None
    else:
        raise Infeasible(f"expected an array of points, got {type(value).__name__}")
    if array.dtype.kind not in "iuf":
        raise Infeasible(f"coordinates must be real numbers, got dtype {array.dtype}")
    if array.shape != (n, dimension):
        raise Infeasible(f"points have shape {array.shape}, expected ({n}, {dimension})")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise Infeasible("coordinates must be finite (found NaN or infinity)")
    return array


def smallest_triangle(p: np.ndarray) -> float:
    """The smallest area of a triangle with corners among the points; each cross product is six
    float64 products summed with fsum, so no cancellation between them."""
    smallest = math.inf
    for i, j, k in combinations(range(len(p)), 3):
        (ax, ay), (bx, by), (cx, cy) = p[i], p[j], p[k]
        twice = math.fsum((bx * cy, -bx * ay, -ax * cy, -by * cx, by * ax, ay * cx))
        smallest = min(smallest, abs(twice) / 2)
    return smallest


def hull_area(p: np.ndarray) -> float:
    """The area of the points' convex hull (monotone chain, then the shoelace with fsum)."""
    ordered = sorted(map(tuple, p.tolist()))

    def cross(o: tuple, a: tuple, b: tuple) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def chain(items: list) -> list:
        out: list = []
        for q in items:
            while len(out) >= 2 and cross(out[-2], out[-1], q) <= 0:
                out.pop()
            out.append(q)
        return out

    hull = chain(ordered)[:-1] + chain(ordered[::-1])[:-1]
    if len(hull) < 3:
        return 0.0
    terms = []
    for (x1, y1), (x2, y2) in zip(hull, hull[1:] + hull[:1], strict=True):
        terms += [x1 * y2, -x2 * y1]
    return abs(math.fsum(terms)) / 2


def in_triangle(value: Any, n: int) -> float:
    p = points(value, n)
    x, y = p[:, 0], p[:, 1]
    outside = (y < 0) | (SQRT3 * x - y < 0) | (SQRT3 * (1 - x) - y < 0)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise Infeasible(f"point {i} ({x[i]:.12g}, {y[i]:.12g}) is outside the triangle")
    return smallest_triangle(p) / (SQRT3 / 4)


def in_convex_position(value: Any, n: int) -> float:
    p = points(value, n)
    if (p == p[0]).all():
        raise Infeasible("all points are in the same place")
    # Area ratios do not change under moves and scaling: centre the points and bring them near
    # unit size by an exact power of two, so no product below can overflow or underflow.
    p = p - p.mean(axis=0)
    p = np.ldexp(p, -math.frexp(float(np.abs(p).max()))[1])
    area = hull_area(p)
    if area == 0.0:
        raise Infeasible("the points lie on one line: their convex hull has no area")
    return smallest_triangle(p) / area


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
