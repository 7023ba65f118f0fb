"""Online bin packing on FunSearch's instances: the shipped data, the classic heuristics at the
excess FunSearch's paper reports, and assignments that are not packings."""

from __future__ import annotations

import numpy as np
import pytest

from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from problems.api import Infeasible
from problems.bin_packing import (
    DRIVER,
    REFEREE,
    BinPacking,
    bins_used,
    datasets,
    family_value,
    lower_bound,
)

BEST_FIT = "import numpy as np\ndef priority(item, bins):\n    return -(bins - item)\n"


def test_shipped_instances_are_funsearchs() -> None:
    data = datasets()
    assert [len(data["or3"]), len(data["weibull5k"])] == [20, 5]
    assert all(c == 150 and len(items) == 500 for c, items in data["or3"])
    assert all(c == 100 and len(items) == 5000 for c, items in data["weibull5k"])
    means = {
        key: np.mean([lower_bound(c, items) for c, items in instances])
        for key, instances in data.items()
    }
    # The L1 bounds FunSearch's comparison uses (201.2 and 1987.8 bins on average).
    assert means["or3"] == pytest.approx(201.2, abs=0.05)
    assert means["weibull5k"] == pytest.approx(1987.8, abs=0.05)


def _run_locally(code: str, key: str) -> float:
    """The packing the sandbox makes, in this process: the referee calls the program directly."""
    program: dict = {}
    exec(code + "\n" + DRIVER, program)  # trusted test code, not a candidate
    referee: dict = {"call_candidate": lambda name, *args: program[name](*args)}
    exec(REFEREE, referee)
    return family_value(key, referee["_vpo_bin_packing"](datasets()[key]))


@pytest.mark.parametrize(
    "code,key,excess",
    [
        (BinPacking().seed_program, "or3", 5.74),
        (BEST_FIT, "or3", 5.37),
        (BEST_FIT, "weibull5k", 3.98),
    ],
    ids=["first fit or3", "best fit or3", "best fit weibull5k"],
)
def test_classic_heuristics_reach_the_published_excess(code: str, key: str, excess: float) -> None:
    value = _run_locally(code, key)
    assert (1 / value - 1) * 100 == pytest.approx(excess, abs=0.01)


def test_assignments_that_are_not_packings_are_refused() -> None:
    capacity, items = 10, [6, 5, 4]
    assert bins_used([0, 1, 0], capacity, items, "x") == 2
    for bad, words in [
        ([0, 0, 1], "bin 0 holds 11 > capacity 10"),
        ([0, 1], "expected 3 integer bin indices"),
        ([0.0, 1.0, 0.0], "expected 3 integer bin indices"),
        ([0, -1, 0], "negative"),
        ("012", "expected a bin index per item"),
    ]:
        with pytest.raises(Infeasible, match=words):
            bins_used(bad, capacity, items, "x")
    with pytest.raises(Infeasible, match="expected 20 assignments"):
        family_value("or3", [[0] * 500])


def test_seed_is_first_fit_in_the_sandbox() -> None:
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(BinPacking(), BinPacking().seed_program, sandbox)
    assert evaluation.status == "ok", evaluation.reason
    assert (1 / evaluation.raw["or3"] - 1) * 100 == pytest.approx(5.74, abs=0.01)
    assert (1 / evaluation.raw["weibull5k"] - 1) * 100 == pytest.approx(4.23, abs=0.01)


def test_a_priority_with_the_wrong_shape_is_an_error_with_its_reason() -> None:
    code = "def priority(item, bins):\n    return [1.0]\n"
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(BinPacking(), code, sandbox)
    assert evaluation.status == "error"
    assert "scores for" in (evaluation.reason or "")


def test_a_candidate_cannot_replace_the_driver() -> None:
    code = (
        "def priority(item, bins):\n"
        "    return bins\n"
        "def _vpo_bin_packing(instances):\n"
        "    return [[0] * len(items) for _, items in instances]\n"
    )
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(BinPacking(), code, sandbox)
    # The real driver ran: the fullest-room bin is always a fresh one, so every item opens a
    # bin of its own (the fake driver's single bin would have been refused as overfull).
    assert evaluation.status == "ok", evaluation.reason
    bounds = [lower_bound(c, items) for c, items in datasets()["or3"]]
    assert evaluation.raw["or3"] == pytest.approx(np.mean(bounds) / 500)


# What a heuristic could do with the whole instance: first fit decreasing, offline, followed item
# by item (every bin starts empty, so bin b of the plan can be the driver's bin b). It looks for
# the instance in every frame above it and, at module level, for the call's arguments.
OFFLINE = """
import json
import os
import sys

import numpy as np


def _offline(capacity, items):
    room, where = np.full(len(items), float(capacity)), [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: -items[i]):
        b = int(np.flatnonzero(room >= items[i])[0])
        room[b] -= items[i]
        where[i] = b
    return where


def _in_sight(*names):
    frame = sys._getframe(1)
    while frame is not None:
        found = [frame.f_locals.get(name) for name in names]
        if all(value is not None for value in found):
            return found
        frame = frame.f_back
    return None


_PLANS = {}
"""

FRAMES = (
    OFFLINE
    + """

def priority(item, bins):
    sight = _in_sight("capacity", "items")
    if sight is None:
        if not _PLANS:
            print("instance in sight: False", flush=True)
            _PLANS[None] = None
        return -np.arange(len(bins), dtype=float)  # first fit
    capacity, items = sight
    if id(items) not in _PLANS:
        print("instance in sight: True", flush=True)
        _PLANS[id(items)] = [_offline(capacity, items), 0, np.full(len(items), float(capacity))]
    plan = _PLANS[id(items)]
    where, k, room = plan
    fits = np.flatnonzero(room >= item)
    room[where[k]] -= item
    plan[1] = k + 1
    return (fits == where[k]).astype(float)
"""
)

FORGED = (
    OFFLINE
    + """

sight = _in_sight("args")
instances = sight[0][0] if sight and isinstance(sight[0], list) and sight[0] else None
print("instance in sight:", instances is not None, flush=True)
if instances is not None:
    packing = [_offline(capacity, items) for capacity, items in instances]
    os.write(3, json.dumps({"value": packing}).encode())
    os._exit(0)


def priority(item, bins):
    return -np.arange(len(bins), dtype=float)  # first fit
"""
)


@pytest.mark.parametrize("code", [FRAMES, FORGED], ids=["reads its frames", "forges the result"])
def test_the_heuristic_sees_one_item_at_a_time(code: str) -> None:
    """Issue 56, item 5: with the instance in its caller's frames, or in the call's arguments at
    module level, a program packed offline and scored a record (first fit decreasing, written on
    the result pipe or followed item by item). The instance now stays with the referee: the
    program finds nothing, packs online, and scores exactly what first fit scores."""
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(BinPacking(), code, sandbox)
        seed = evaluate(BinPacking(), BinPacking().seed_program, sandbox)
    assert evaluation.status == "ok", evaluation.reason
    said = {line for call in evaluation.artifacts.values() for line in call["stdout"].splitlines()}
    assert said == {"instance in sight: False"}
    assert evaluation.raw == seed.raw
    assert (1 / evaluation.raw["or3"] - 1) * 100 == pytest.approx(5.74, abs=0.01)
