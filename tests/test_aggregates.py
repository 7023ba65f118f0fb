"""The Store's aggregate reads against brute force over the same rows, on both engines.

Scores come from a handful of values so ties are everywhere: the orders promise "best first,
oldest first among equals"."""

from __future__ import annotations

import random

import pytest

from harness.records import NewProgram
from harness.store import Store

OBJECTIVES = ("a", "b", "c")
VALUES = (0.0, 0.25, 0.5, 0.75, 1.0)


@pytest.fixture
def campaign(db_url: str) -> tuple[Store, list[tuple]]:
    """300 programs (about 15% failed) in one campaign, a second campaign beside it."""
    rng = random.Random(0)
    store = Store.open(db_url)
    first = store.create_campaign("one", "toy", {}, 0)
    other = store.create_campaign("two", "toy", {}, 0)
    rows = []
    for k in range(300):
        campaign_id = other if k % 10 == 9 else first
        status = "ok" if rng.random() > 0.15 else "error"
        scores = {name: rng.choice(VALUES) for name in OBJECTIVES}
        pid = store.add_program(
            campaign_id, NewProgram(f"x = {k}\n", status, scores, dict.fromkeys(scores))
        )
        if campaign_id == first:
            rows.append((pid, status == "ok", scores))
    yield store, rows
    store.close()


def _brute_top(rows: list[tuple], weights: dict[str, float], n: int) -> list[int]:
    total = sum(weights.values())
    keyed = [
        (-sum(w / total * s[name] for name, w in weights.items()), pid) for pid, ok, s in rows if ok
    ]
    return [pid for _, pid in sorted(keyed)[:n]]


@pytest.mark.parametrize("n", [1, 7, 40])
def test_top_by_weights_matches_brute_force(campaign: tuple, n: int) -> None:
    store, rows = campaign
    for weights in ({"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 2, "c": 0}, {"a": 0, "b": 0, "c": 3}):
        expected = _brute_top(rows, weights, n)
        assert [pid for pid, _, _ in store.top_by_weights(1, weights, n)] == expected
        # Read in two ranges and merged, as the dashboard does, it is the same.
        middle = rows[len(rows) // 2][0]
        halves = store.top_by_weights(1, weights, n, upto=middle) + store.top_by_weights(
            1, weights, n, after_id=middle
        )
        assert [pid for _, pid in sorted((-key, pid) for pid, key, _ in halves)][:n] == expected


def test_best_by_objective_and_records(campaign: tuple) -> None:
    store, rows = campaign
    valid = [(pid, s) for pid, ok, s in rows if ok]
    for name in OBJECTIVES:
        best = store.best_by_objective(1, name, 25)
        assert [pid for pid, _, _ in best] == [
            pid for _, pid in sorted((-s[name], pid) for pid, s in valid)[:25]
        ]
        records, top = [], -1.0
        for n, (pid, s) in enumerate(valid, start=1):
            if s[name] > top:
                records.append((pid, n, s[name]))
                top = s[name]
        assert [(pid, n, v) for pid, n, v, _ in store.record_points(1, name)] == records
        # The same curve read in two ranges, the second numbered from its own start.
        middle = valid[len(valid) // 2][0]
        later = store.record_points(1, name, after_id=middle)
        first_later = [pid for pid, s in valid if pid > middle][0]
        assert later[0][0] == first_later and later[0][1] == 1


def test_pair_front_matches_brute_force(campaign: tuple) -> None:
    store, rows = campaign
    points = [(pid, s["a"], s["b"]) for pid, ok, s in rows if ok]
    front = []
    for pid, x, y in points:
        dominated = any(
            (x2 >= x and y2 >= y and (x2, y2) != (x, y)) or ((x2, y2) == (x, y) and p2 < pid)
            for p2, x2, y2 in points
        )
        if not dominated:
            front.append((pid, x, y))
    front.sort(key=lambda p: (-p[1], -p[2]))
    assert store.pair_front(1, "a", "b") == front


def test_counts_sample_and_progress(campaign: tuple) -> None:
    store, rows = campaign
    counts = store.status_counts(1)
    assert counts["ok"] == sum(ok for _, ok, _ in rows)
    assert sum(counts.values()) == len(rows)
    sample = store.score_sample(1, list(OBJECTIVES), 4)
    expected = [(pid, [s[o] for o in OBJECTIVES]) for pid, ok, s in rows if ok and pid % 4 == 0]
    assert sample == expected
    points = store.progress_points(1, 50)
    assert [n for n, _ in points] == [*range(50, len(rows) + 1, 50), len(rows)][: len(points)]
    assert points[-1][0] == len(rows)
    assert store.last_program_id(1) == rows[-1][0]
    assert store.objectives(1) == list(OBJECTIVES) and store.objectives(2) == list(OBJECTIVES)
    assert store.objectives(3) == []
