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
from typing import Any

import numpy as np

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
smallest x - r to the largest x + r, and the same in y) has width + height <= 2. Everything is
computed in float64. Rounding counts: circles that touch exactly in theory can overlap by 1e-17
in floating point, so leave a tiny margin (1e-12 is plenty). A construction that breaks any rule
scores 0 for that call. The score for each call is the sum of radii divided by the best known
sum (2.63598308 for n = 26, 2.9379445 for n = 32, 2.3658321 for the rectangle).
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
    lower = centers - radii[:, None]
    upper = centers + radii[:, None]
    if (lower < 0.0).any() or (upper > 1.0).any():
        i = int(np.flatnonzero((lower < 0.0).any(axis=1) | (upper > 1.0).any(axis=1))[0])
        raise Infeasible(f"circle {i} is not inside the unit square")
    _check_disjoint(centers, radii)
    return math.fsum(radii.tolist())


def check_rectangle_packing(value: Any, n: int) -> float:
    """The sum of radii of n disjoint circles whose bounding box has width + height <= 2 (a
    rectangle of perimeter 4); Infeasible otherwise."""
    centers, radii = _unpack(value, n)
    lower = (centers - radii[:, None]).min(axis=0)
    upper = (centers + radii[:, None]).max(axis=0)
    width, height = (upper - lower).tolist()
    if width + height > 2.0:
        raise Infeasible(
            f"the circles' bounding box is {width:.9g} x {height:.9g}: perimeter "
            f"{2 * (width + height):.12g} > 4"
        )
    _check_disjoint(centers, radii)
    return math.fsum(radii.tolist())


def _check_disjoint(centers: np.ndarray, radii: np.ndarray) -> None:
    i, j = np.triu_indices(len(radii), k=1)
    gaps = np.hypot(*(centers[i] - centers[j]).T) - (radii[i] + radii[j])
    if (gaps < 0.0).any():
        k = int(np.argmin(gaps))
        raise Infeasible(f"circles {i[k]} and {j[k]} overlap by {-gaps[k]:.3g}")


def _unpack(value: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    # The AlphaEvolve convention also returns a claimed sum; it is ignored, never trusted.
    if not isinstance(value, list) or len(value) not in (2, 3):
        raise Infeasible(f"expected (centers, radii), got {_describe(value)}")
    centers = _real_array(value[0], "centers")
    radii = _real_array(value[1], "radii")
    if centers.shape != (n, 2):
        raise Infeasible(f"centers has shape {centers.shape}, expected ({n}, 2)")
    if radii.shape != (n,):
        raise Infeasible(f"radii has shape {radii.shape}, expected ({n},)")
    if not (np.isfinite(centers).all() and np.isfinite(radii).all()):
        raise Infeasible("centers and radii must be finite (found NaN or infinity)")
    if (radii < 0).any():
        raise Infeasible(f"radius {int(np.flatnonzero(radii < 0)[0])} is negative")
    return centers, radii


def _real_array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.array(value)
        except ValueError as exc:  # ragged nested lists
            raise Infeasible(f"{what} is not a rectangular array: {exc}") from None
    if array.dtype.kind not in "iuf":
        raise Infeasible(f"{what} must hold real numbers, got dtype {array.dtype}")
    return array.astype(np.float64)


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
