"""Online bin packing with a priority function (FunSearch's formulation).

Items arrive one at a time; the candidate's `priority(item, bins)` scores the bins that still
have room for the item (`bins` holds their remaining capacities, empty bins included), and the
item goes to the highest-scoring one. One objective per instance family:

- or3: the 20 OR-Library `binpack3` instances (Falkenauer's u500: 500 items, capacity 150);
- weibull5k: 5 instances of 5,000 items with Weibull-distributed sizes, capacity 100.

Both item lists are FunSearch's (google-deepmind/funsearch, bin_packing.ipynb at commit
2a2c864, CC-BY 4.0; shipped in data/, copied twice independently; first fit and best fit on
them reproduce the paper's excess to the hundredth of a percent). The value is the family's
mean L1 lower bound (ceil(sum of items / capacity)) over its mean number of bins used: 1 would
be a packing at the lower bound. Excess bins over the
bound, as FunSearch's paper reports them (Romera-Paredes et al., Nature 625, 2024, Table 1):
first fit 5.74% (OR3) and 4.23% (Weibull 5k), best fit 5.37% and 3.98%, FunSearch 3.11% and
0.68%; the value is 1 / (1 + excess).

The heuristic sees one item at a time and nothing else of the instance. The instances go to a
referee (`REFEREE`): trusted code in a process of its own, beside the candidate's, that sends
each instance's next item to the candidate's process and waits for the bin chosen for it before
it sends the one after (the family's instances advance together, item k of each in one
message, so a stateful heuristic sees them in turns). The candidate's process, a fresh
interpreter that never held an instance, keeps its own copy of the bins (`DRIVER`, appended to
the program) and answers with bin indices; the referee refuses an index that is not a bin with
room for its item and keeps the packings itself, and only what it returns is scored. The parent
rebuilds each packing from that assignment, refuses any bin over capacity, and counts bins
itself. Whatever the candidate's process does (inspect its frames or its memory, write to its
descriptors, answer what it likes), its score is that of real, feasible packings it chose
online, item by item.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from problems.api import Anchor, Call, Infeasible, Objective, Problem

DATA = Path(__file__).parent / "data" / "funsearch_datasets.json"
FAMILIES = {"or3": "OR3", "weibull5k": "Weibull 5k"}
SOURCE_FUNSEARCH = "FunSearch, Romera-Paredes et al., Nature 625 (2024), Table 1"
EXCESS = {  # percent of bins above the L1 bound: first fit, best fit, FunSearch
    "or3": (5.74, 5.37, 3.11),
    "weibull5k": (4.23, 3.98, 0.68),
}

DESCRIPTION = """\
Design a heuristic for online bin packing. Items arrive one at a time and must be placed at
once, never moved; the goal is to use as few bins as possible. Write a Python function

    def priority(item: float, bins: np.ndarray) -> np.ndarray

that, given the size of the arriving item and the remaining capacities of the bins it fits in
(an array; fresh empty bins are always among them), returns one score per bin. The item goes to
the bin with the highest score (the first one on ties). A fixed driver, which you do not write,
runs the packing on two families of instances, each in its own process with a time limit of
{limit:g} seconds in all: "or3", 20 instances of 500 items with bin capacity 150, and
"weibull5k", 5 instances of 5,000 items with capacity 100 (sizes drawn from a Weibull
distribution). numpy is available; keep priority fast, it is called once per item.

For each family the value is (mean over its instances of the lower bound ceil(sum of sizes /
capacity)) divided by (mean number of bins you used): higher is better, 1 is the bound itself.
Best fit (priority = -(bins - item)) reaches 0.949 on or3 and 0.962 on weibull5k; the best known
heuristics 0.970 and 0.993. Scores must be finite real numbers, one per bin.
"""

SEED_PROGRAM = '''\
import numpy as np


def priority(item, bins):
    """First fit: the earliest bin with room (earlier bins score higher)."""
    return -np.arange(len(bins), dtype=float)
'''

# In the candidate's process, after its program: the bins of the instances being packed, and
# the choice for each instance's next item, as FunSearch's skeleton makes it.
DRIVER = """\
def _vpo_open(sizes):
    import numpy as _np

    global _vpo_np, _vpo_bins
    _vpo_np = _np
    _vpo_bins = [_np.full(count, float(capacity)) for capacity, count in sizes]


def _vpo_place(step):
    return [
        None if item is None else _vpo_choose(item, remaining)
        for item, remaining in zip(step, _vpo_bins)
    ]


def _vpo_choose(item, remaining):
    fits = (remaining >= item).nonzero()[0]
    scores = _vpo_np.asarray(priority(float(item), remaining[fits]), dtype=float)
    if scores.shape != fits.shape or not _vpo_np.isfinite(scores).all():
        raise ValueError(
            f"priority returned {scores.shape} scores for {fits.size} bins "
            "or a score that is not finite"
        )
    best = fits[scores.argmax()]
    remaining[best] -= item
    return int(best)
"""

# In a process of its own: holds the instances and keeps their packings. Step k sends the k-th
# item of every instance (None for one that has ended) and takes the bin chosen for each: one
# message per step, not per item, while no instance shows an item before the one before it is
# placed.
REFEREE = """\
def _vpo_bin_packing(instances):
    remaining = [[capacity] * len(items) for capacity, items in instances]
    chosen = [[] for _ in instances]
    call_candidate("_vpo_open", [[capacity, len(items)] for capacity, items in instances])
    for k in range(max(len(items) for _, items in instances)):
        step = [items[k] if k < len(items) else None for _, items in instances]
        bins = call_candidate("_vpo_place", step)
        if type(bins) is not list or len(bins) != len(step):
            raise ValueError(f"the candidate placed {len(step)} items as {str(bins)[:40]}")
        for item, best, room, placed in zip(step, bins, remaining, chosen):
            if item is None:
                continue
            if type(best) is not int or not 0 <= best < len(room) or room[best] < item:
                raise ValueError(f"the candidate chose {best!r}, not a bin with room for {item}")
            room[best] -= item
            placed.append(best)
    return chosen
"""


@cache
def datasets() -> dict[str, list[tuple[int, list[int]]]]:
    """Family key -> [(capacity, items), ...] in the notebook's instance order."""
    raw = json.loads(DATA.read_text())
    return {
        key: [(int(i["capacity"]), [int(x) for x in i["items"]]) for i in raw[name].values()]
        for key, name in FAMILIES.items()
    }


def lower_bound(capacity: int, items: list[int]) -> int:
    return math.ceil(sum(items) / capacity)


def bins_used(assignment: Any, capacity: int, items: list[int], where: str) -> int:
    """Bins a returned assignment (bin index per item) uses; Infeasible unless it is a packing
    of every item with no bin over capacity."""
    count = len(items)
    bins = _bin_indices(assignment, count, where)
    if (bins < 0).any():
        raise Infeasible(f"{where}: a bin index is negative")
    # n items never need more than n bins, and an index the driver could not have produced
    # would make bincount below allocate one counter per bin up to it (10^12 of them).
    if (bins >= count).any():
        b = int(bins[np.flatnonzero(bins >= count)[0]])
        raise Infeasible(f"{where}: bin index {b} is beyond the {count} bins {count} items need")
    loads = np.bincount(bins, weights=np.asarray(items, dtype=np.int64), minlength=count)
    if (loads > capacity).any():
        b = int(np.argmax(loads))
        raise Infeasible(f"{where}: bin {b} holds {int(loads[b])} > capacity {capacity}")
    return int(np.count_nonzero(loads))


def _bin_indices(assignment: Any, count: int, where: str) -> np.ndarray:
    """The assignment as int64, read strictly: exactly `count` integers (bool, float or an
    integer beyond int64 refused), checked by length before anything walks its items."""
    expected = f"{where}: expected {count} integer bin indices"
    if isinstance(assignment, np.ndarray):
        if assignment.dtype.kind not in "iu" or assignment.shape != (count,):
            raise Infeasible(f"{expected}, got {assignment.dtype} {assignment.shape}")
        if count and assignment.max() > np.iinfo(np.int64).max:  # uint64: would wrap negative
            raise Infeasible(f"{where}: a bin index is beyond int64")
        return assignment.astype(np.int64)
    if not isinstance(assignment, list | tuple):
        raise Infeasible(f"{where}: expected a bin index per item, got {type(assignment).__name__}")
    if len(assignment) != count:
        raise Infeasible(f"{expected}, got {len(assignment)} values")
    for b in assignment:
        if type(b) is not int:  # exactly int: True is no bin index, nor is 1.0
            raise Infeasible(f"{expected}, got a {type(b).__name__}")
        if not -(2**63) <= b < 2**63:
            raise Infeasible(f"{where}: a bin index is beyond int64")
    return np.array(assignment, dtype=np.int64)


def family_value(key: str, assignments: Any) -> float:
    instances = datasets()[key]
    if not isinstance(assignments, list) or len(assignments) != len(instances):
        raise Infeasible(f"expected {len(instances)} assignments, one per instance")
    used = [
        bins_used(a, capacity, items, f"instance {i}")
        for i, (a, (capacity, items)) in enumerate(zip(assignments, instances, strict=True))
    ]
    bounds = [lower_bound(capacity, items) for capacity, items in instances]
    return (sum(bounds) / len(bounds)) / (sum(used) / len(used))


def _objective(key: str) -> Objective:
    first, best, funsearch = EXCESS[key]
    label = "OR3 (20 x 500 items)" if key == "or3" else "Weibull 5k (5 x 5,000 items)"
    return Objective(
        key,
        "max",
        round(1 / (1 + funsearch / 100), 6),
        SOURCE_FUNSEARCH + f" ({funsearch}% excess bins)",
        f"L1 bound / bins used, {label}",
        (
            Anchor(round(1 / (1 + first / 100), 6), f"first fit, {first}% excess (FunSearch)"),
            Anchor(round(1 / (1 + best / 100), 6), f"best fit, {best}% excess (FunSearch)"),
            Anchor(round(1 / (1 + funsearch / 100), 6), SOURCE_FUNSEARCH),
        ),
    )


class BinPacking(Problem):
    name = "bin_packing"
    description = DESCRIPTION.format(limit=30.0)
    seed_program = SEED_PROGRAM
    entry = "priority"
    driver = DRIVER
    referee = REFEREE
    referee_entry = "_vpo_bin_packing"
    time_limit = 30.0
    objectives = (_objective("or3"), _objective("weibull5k"))

    def calls(self) -> tuple[Call, ...]:
        return tuple(Call(key, (datasets()[key],), (key,)) for key in FAMILIES)

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        return {call.key: family_value(call.key, value)}


def make_problem() -> Problem:
    return BinPacking()
