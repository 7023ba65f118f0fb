"""Cap sets: a priority function over F_3^n drives a fixed greedy (FunSearch's formulation).

A cap set is a subset of F_3^n with no three distinct points on a line (x + y + z = 0 mod 3).
The candidate writes `priority(el, n)`; the harness maps it over all 3^n vectors in the sandbox
and, in the trusted parent, adds vectors in order of decreasing priority whenever they complete
no line with two already chosen. One objective per dimension n = 3..9: the size reached over
the largest cap known.

Largest known caps (OEIS A090245 for n <= 6, optimal; Thackeray, arXiv 2206.09804, reviews the
solved dimensions): 9, 20, 45, 112; n = 7: 236 (Edel's table); n = 8: 512, found by FunSearch
(Romera-Paredes et al., Nature 625, 2024), where 496 was known before; n = 9: 1082, which
FunSearch matched. A constant priority gives 2^n. FunSearch's programs specialise: its n = 8
priority reaches 512 at n = 8 but 16 to 128 at n = 4..7, so the seven objectives pull apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np

from problems import exact
from problems.api import Anchor, Call, Infeasible, Objective, Problem

DIMENSIONS = range(3, 10)
BEST = {3: 9, 4: 20, 5: 45, 6: 112, 7: 236, 8: 512, 9: 1082}
SOURCE_OEIS = "OEIS A090245 (optimal for n <= 6; see Thackeray, arXiv 2206.09804)"
SOURCE_EDEL = "Y. Edel's table of large caps in AG(n, 3), as FunSearch lists it"
SOURCE_FUNSEARCH = "FunSearch, Romera-Paredes et al., Nature 625 (2024)"

DESCRIPTION = """\
Find large cap sets: sets of vectors in F_3^n (each coordinate 0, 1 or 2) with no three distinct
vectors x, y, z on a line, that is with x + y + z = 0 (mod 3) in every coordinate.

Write a Python function

    def priority(el: tuple[int, ...], n: int) -> float

that says how much a vector `el` (a tuple of n values in {{0, 1, 2}}) should be in the cap set.
A fixed greedy algorithm, which you do not write, calls it for every vector of F_3^n, sorts the
vectors by decreasing priority (ties keep lexicographic order) and adds each vector that does
not complete a line with two vectors already added. The value is the size of the set it builds.
It runs for n = 3, 4, ..., 9, each n in its own process with a time limit of {limit:g} seconds
for all 3^n calls (19,683 at n = 9, so keep priority cheap); numpy is available. Priorities
must be finite real numbers.

The score for each n is the size reached divided by the largest cap known: 9, 20, 45, 112, 236,
512 and 1082 for n = 3..9. A constant priority reaches 2^n.
"""

SEED_PROGRAM = '''\
def priority(el, n):
    """Every vector alike: the greedy takes them in lexicographic order."""
    return 0.0
'''

DRIVER = """\
def _vpo_cap_set_priorities(n):
    import itertools as _itertools

    return [float(priority(el, n)) for el in _itertools.product(range(3), repeat=n)]
"""


@cache
def _vectors(n: int) -> np.ndarray:
    """Every vector of F_3^n in lexicographic order, as rows of small integers."""
    grid = np.indices((3,) * n).reshape(n, -1).T
    return grid.astype(np.int64)


def greedy_cap(priorities: Any, n: int) -> list[int]:
    """Indices (lexicographic, base 3) of the cap the fixed greedy builds from `priorities`."""
    if not isinstance(priorities, np.ndarray | list | tuple):
        raise Infeasible(f"expected a list of priorities, got {type(priorities).__name__}")
    count = 3**n
    # Sized before anything walks it; every priority exactly the number returned.
    values = exact.real_array(
        priorities, "priorities", count, f"expected {count} priorities, got more"
    )
    if values.shape != (count,):
        raise Infeasible(f"expected {count} priorities, got shape {values.shape}")
    if not np.isfinite(values).all():
        i = int(np.flatnonzero(~np.isfinite(values))[0])
        raise Infeasible(f"priority of vector {i} is not finite ({values[i]})")
    vectors = _vectors(n)
    powers = 3 ** np.arange(n - 1, -1, -1, dtype=np.int64)
    blocked = np.zeros(3**n, dtype=bool)
    chosen: list[int] = []
    for index in np.argsort(-values, kind="stable").tolist():
        if blocked[index]:
            continue
        if chosen:
            # The third point of the line through the new vector and each chosen one.
            third = (-(vectors[chosen] + vectors[index])) % 3
            blocked[third @ powers] = True
        blocked[index] = True
        chosen.append(index)
    return chosen


def is_cap(indices: list[int], n: int) -> bool:
    """No three distinct chosen vectors sum to 0 mod 3 (a check independent of the greedy)."""
    vectors = _vectors(n)[indices]
    powers = 3 ** np.arange(n - 1, -1, -1, dtype=np.int64)
    members = set(indices)
    for a in range(len(indices)):
        thirds = ((-(vectors[a] + vectors[a + 1 :])) % 3) @ powers
        if members.intersection(thirds.tolist()):
            return False
    return True


class CapSet(Problem):
    name = "cap_set"
    description = DESCRIPTION.format(limit=20.0)
    seed_program = SEED_PROGRAM
    entry = "priority"
    driver = DRIVER
    driver_entry = "_vpo_cap_set_priorities"
    time_limit = 20.0
    objectives = tuple(
        Objective(
            f"n{n}",
            "max",
            float(BEST[n]),
            SOURCE_OEIS if n <= 6 else SOURCE_EDEL if n == 7 else SOURCE_FUNSEARCH,
            f"size of the cap in F_3^{n} the greedy builds",
            (Anchor(496.0, "the best known before FunSearch, as its paper quotes"),)
            if n == 8
            else (),
        )
        for n in DIMENSIONS
    )

    def calls(self) -> tuple[Call, ...]:
        return tuple(Call(f"n{n}", (n,), (f"n{n}",)) for n in DIMENSIONS)

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        (n,) = call.args
        return {call.key: float(len(greedy_cap(value, n)))}


def make_problem() -> Problem:
    return CapSet()
