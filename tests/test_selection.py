"""Selection: scalarised parent picks, drafts, islands, migration and the Pareto front."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from harness.evolution.population import Population
from harness.evolution.selection import (
    SelectionConfig,
    island_for,
    migrants,
    pareto_ids,
    pick_drafts,
    pick_parent,
    select,
    should_migrate,
)
from harness.records import ProgramRecord
from trainer.measures import pareto_front

OBJECTIVES = ("a", "b")


def population(
    rows: list[tuple[float, ...]],
    islands: list[int] | None = None,
    valid: list[bool] | None = None,
    objectives: tuple[str, ...] = OBJECTIVES,
) -> Population:
    """Program i + 1 has score vector rows[i]."""
    pop = Population(objectives, capacity=1)
    for i, scores in enumerate(rows):
        pop.append(
            i + 1,
            islands[i] if islands else 0,
            scores,
            valid=valid[i] if valid else True,
            code_hash=f"code-{i + 1}",
        )
    return pop


def brute_force_front(scores: np.ndarray) -> list[int]:
    front = []
    for i, p in enumerate(scores):
        if not any((q >= p).all() and (q > p).any() for q in scores):
            front.append(i)
    return front


# -- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("islands", 0),
        ("islands", 1.5),
        ("migration_interval", -1),
        ("migrants_per_island", -1),
        ("top_k", 0),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("drafts", -1),
        ("drafts", 5),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"SelectionConfig.{field}"):
        SelectionConfig(**{field: value})  # type: ignore[arg-type]


def test_config_defaults() -> None:
    config = SelectionConfig()
    assert (config.islands, config.drafts) == (4, 3)
    assert SelectionConfig(temperature=0, migration_interval=0).temperature == 0


# -- population --------------------------------------------------------------------------------


def test_population_grows_and_keeps_its_columns() -> None:
    pop = population(
        [(i / 100, 1 - i / 100) for i in range(100)], islands=[i % 3 for i in range(100)]
    )
    assert len(pop) == 100
    assert pop.ids.tolist() == list(range(1, 101))
    assert pop.islands.tolist() == [i % 3 for i in range(100)]
    assert pop.scores.shape == (100, 2)
    assert pop.scores[42].tolist() == [0.42, 1 - 0.42]
    assert pop.row(43) == 42 and 43 in pop and 0 not in pop
    rows, block = pop.valid_on(1)
    assert rows.tolist() == list(range(1, 100, 3))
    assert block.shape == (2, 33)
    np.testing.assert_array_equal(block.T, pop.scores[rows])
    assert pop.has_code("code-5") and pop.has_code("code-5", island=1)
    assert not pop.has_code("code-5", island=0) and not pop.has_code("nope")


def test_population_rejects_bad_programs() -> None:
    pop = population([(0.1, 0.2)])
    with pytest.raises(ValueError, match="already"):
        pop.append(1, 0, (0.3, 0.3), valid=True, code_hash="x")
    with pytest.raises(ValueError, match="expected 2 scores"):
        pop.append(2, 0, (0.3,), valid=True, code_hash="x")
    with pytest.raises(ValueError, match="island"):
        pop.append(2, -1, (0.3, 0.3), valid=True, code_hash="x")
    with pytest.raises(KeyError, match="program 9"):
        pop.row(9)
    with pytest.raises(ValueError, match="objective"):
        Population(())


def test_non_finite_scores_count_as_zero() -> None:
    pop = population([(float("nan"), 0.5), (float("inf"), 0.2)])
    assert pop.scores.tolist() == [[0.0, 0.5], [0.0, 0.2]]


def test_extend_matches_append() -> None:
    rng = np.random.default_rng(1)
    scores = rng.random((500, 2))
    islands = rng.integers(0, 4, 500)
    valid = rng.random(500) < 0.8
    one = Population(OBJECTIVES, capacity=1)
    for i in range(500):
        one.append(i + 7, int(islands[i]), scores[i], valid=bool(valid[i]), code_hash=str(i))
    bulk = Population(OBJECTIVES, capacity=1)
    bulk.extend(
        np.arange(500) + 7, islands, scores, valid=valid, code_hashes=[str(i) for i in range(500)]
    )
    for name in ("ids", "islands", "scores", "valid"):
        np.testing.assert_array_equal(getattr(one, name), getattr(bulk, name))
    for island in range(4):
        for a, b in zip(one.valid_on(island), bulk.valid_on(island), strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="new and distinct"):
        bulk.extend([7], [0], [[0.0, 0.0]], valid=[True], code_hashes=["x"])


def test_from_records() -> None:
    def record(i: int, status: str, scores: dict[str, float]) -> ProgramRecord:
        return ProgramRecord(
            i,
            1,
            "code",
            f"h{i}",
            None,
            i % 2,
            0,
            "llm",
            status,
            None,
            0.0,
            None,
            None,
            {},
            datetime(2026, 1, 1),
            scores,
            {},
        )

    pop = Population.from_records(
        OBJECTIVES, [record(3, "ok", {"a": 0.5, "b": 0.25}), record(4, "error", {"a": 0.1})]
    )
    assert pop.ids.tolist() == [3, 4]
    assert pop.scores.tolist() == [[0.5, 0.25], [0.1, 0.0]]
    assert pop.valid.tolist() == [True, False]
    assert pop.islands.tolist() == [1, 0]


# -- parents -----------------------------------------------------------------------------------


def test_scalarised_parents_spread_over_the_pareto_front() -> None:
    # Two corners, a compromise on the line between them, a dominated program.
    pop = population([(1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (0.2, 0.2)])
    rng = np.random.default_rng(0)
    picks = Counter(pick_parent(pop, 0, rng) for _ in range(4000))
    assert picks[1] > 1200 and picks[2] > 1200  # both corners, often
    assert picks[4] < 40  # the dominated program, rarely
    assert abs(picks[1] - picks[2]) < 400  # symmetric objectives, symmetric picks


def test_the_corners_win_even_where_the_mean_prefers_the_compromise() -> None:
    # The mean score ranks the compromise first, so one combined score would always pick it;
    # under w ~ Dirichlet(1) it is best only for w_a in (0.45, 0.55), about a tenth of draws.
    pop = population([(1.0, 0.0), (0.0, 1.0), (0.55, 0.55)])
    assert pop.scores.mean(axis=1).argmax() == 2
    rng = np.random.default_rng(0)
    picks = Counter(pick_parent(pop, 0, rng, temperature=0) for _ in range(2000))
    assert picks[1] > 700 and picks[2] > 700
    assert 100 < picks[3] < 300


def test_picks_are_deterministic_under_a_seeded_rng() -> None:
    rng = np.random.default_rng(7)
    pop = population(
        [tuple(r) for r in rng.random((300, 3))],
        islands=[i % 4 for i in range(300)],
        objectives=("a", "b", "c"),
    )
    config = SelectionConfig()

    def run(seed: int) -> list[tuple[int, int, tuple[int, ...]]]:
        rng = np.random.default_rng(seed)
        return [
            (s.island, s.parent_id, s.draft_ids)
            for s in (select(pop, i, rng, config) for i in range(50))
        ]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_islands_are_isolated() -> None:
    rng = np.random.default_rng(2)
    islands = [i % 4 for i in range(400)]
    pop = population([tuple(r) for r in rng.random((400, 2))], islands=islands)
    for island in range(4):
        for _ in range(50):
            parent = pick_parent(pop, island, rng)
            assert islands[parent - 1] == island
            for draft in pick_drafts(pop, parent, rng, 3):
                assert islands[draft - 1] == island


def test_invalid_programs_are_parents_only_when_nothing_valid_exists() -> None:
    rng = np.random.default_rng(0)
    # Island 0: an invalid program with high scores beside a valid poor one.
    pop = population(
        [(0.9, 0.9), (0.1, 0.1), (0.3, 0.3)], islands=[0, 0, 1], valid=[False, True, False]
    )
    assert {pick_parent(pop, 0, rng) for _ in range(100)} == {2}
    # Island 1 has no valid program: the valid ones of other islands stand in.
    assert {pick_parent(pop, 1, rng) for _ in range(100)} == {2}
    # An empty island likewise.
    assert {pick_parent(pop, 3, rng) for _ in range(100)} == {2}
    # Nothing valid anywhere: the island's own programs, failures included.
    broken = population([(0.0, 0.0), (0.0, 0.0)], islands=[0, 1], valid=[False, False])
    assert {pick_parent(broken, 1, rng) for _ in range(20)} == {2}
    assert {pick_parent(broken, 2, rng) for _ in range(50)} == {1, 2}
    with pytest.raises(ValueError, match="empty"):
        pick_parent(Population(OBJECTIVES), 0, rng)


def test_temperature_zero_takes_the_best_under_w() -> None:
    pop = population([(0.9, 0.9), (0.8, 0.8), (0.1, 0.95)])
    rng = np.random.default_rng(0)
    picks = Counter(pick_parent(pop, 0, rng, temperature=0) for _ in range(500))
    assert picks[2] == 0  # dominated by program 1, never the best under any w
    assert picks[1] > 400


def test_a_record_above_the_best_known_wins_over_a_tie_with_it() -> None:
    """Scores are not clipped at 1: a program 20% over the best known value on one objective
    beats programs that only match it, as parent and as the top draft."""
    pop = population([(1.0, 1.0), (1.2, 1.0), (1.0, 1.0), (0.5, 0.5)])
    rng = np.random.default_rng(0)
    assert {pick_parent(pop, 0, rng, temperature=0) for _ in range(200)} == {2}
    picks = Counter(pick_parent(pop, 0, rng) for _ in range(500))
    assert picks[2] > picks[1] + picks[3]
    assert pick_drafts(pop, 4, rng, 1) == [2]
    assert pareto_ids(pop) == [2]


# -- drafts ------------------------------------------------------------------------------------


def test_drafts_are_the_top_then_programs_that_beat_the_parent_somewhere() -> None:
    # Parent 1 sits mid-front; 2..4 beat it on one objective, 5..9 are dominated by it.
    rows = [(0.5, 0.5), (0.9, 0.1), (0.1, 0.9), (0.7, 0.45)] + [
        (0.1 * i, 0.1 * i) for i in range(5)
    ]
    pop = population(rows)
    rng = np.random.default_rng(0)
    seen: Counter[int] = Counter()
    for _ in range(300):
        drafts = pick_drafts(pop, 1, rng, 3)
        assert len(drafts) == 3 and len(set(drafts)) == 3 and 1 not in drafts
        assert drafts[0] == 4  # the best mean score other than the parent
        for draft in drafts[1:]:
            assert (np.array(rows[draft - 1]) > np.array(rows[0])).any()
        seen.update(drafts[1:])
    assert seen[2] > 50 and seen[3] > 50  # both kinds of complementary strength show up


def test_a_leading_parent_gets_the_next_best_as_drafts() -> None:
    pop = population([(0.9, 0.9), (0.5, 0.5), (0.6, 0.4), (0.1, 0.1)])
    drafts = pick_drafts(pop, 1, np.random.default_rng(0), 3)
    assert drafts == [2, 3, 4]


def test_small_islands_give_fewer_drafts() -> None:
    rng = np.random.default_rng(0)
    pop = population(
        [(0.5, 0.5), (0.6, 0.1), (0.9, 0.9)], islands=[0, 0, 1], valid=[True, True, True]
    )
    assert pick_drafts(pop, 1, rng, 3) == [2]
    assert pick_drafts(pop, 3, rng, 3) == []
    assert pick_drafts(pop, 1, rng, 0) == []
    # An invalid parent (the fallback case) still gets its island's valid programs.
    pop = population([(0.5, 0.5), (0.6, 0.1)], valid=[False, True])
    assert pick_drafts(pop, 1, rng, 3) == [2]


@settings(max_examples=60, deadline=None)
@given(
    scores=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 40), st.integers(1, 3)),
        elements=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
    ),
    data=st.data(),
)
def test_draft_invariants(scores: np.ndarray, data: st.DataObject) -> None:
    n = len(scores)
    islands = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    valid = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    k = data.draw(st.integers(0, 4))
    pop = population(
        [tuple(r) for r in scores], islands, valid, objectives=tuple("abc"[: scores.shape[1]])
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    parent = pick_parent(pop, data.draw(st.integers(0, 3)), rng)
    drafts = pick_drafts(pop, parent, rng, k)
    home = islands[parent - 1]
    pool = [i + 1 for i in range(n) if islands[i] == home and valid[i] and i + 1 != parent]
    assert len(drafts) == min(k, len(pool))
    assert len(set(drafts)) == len(drafts)
    assert set(drafts) <= set(pool)


# -- migration and islands ---------------------------------------------------------------------


def test_island_turns_and_migration_schedule() -> None:
    assert [island_for(i, 4) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [should_migrate(i, 3) for i in range(7)] == [
        False,
        False,
        False,
        True,
        False,
        False,
        True,
    ]
    assert not any(should_migrate(i, 0) for i in range(10))


def test_migrants_move_around_the_ring_and_skip_code_already_there() -> None:
    rows = [(0.9, 0.1), (0.1, 0.9), (0.5, 0.5), (0.2, 0.2), (0.3, 0.3), (0.4, 0.1)]
    pop = population(rows, islands=[0, 0, 1, 1, 2, 2])
    rng = np.random.default_rng(0)
    moves = migrants(pop, 3, 1, rng)
    assert sorted(destination for _, destination in moves) == [0, 1, 2]
    for program, destination in moves:
        assert destination == (pop.islands[pop.row(program)] + 1) % 3
    # Copy programs 1 and 2 (island 0's only ones) onto island 1: island 0 has nothing left to send.
    pop.append(7, 1, rows[0], valid=True, code_hash="code-1")
    pop.append(8, 1, rows[1], valid=True, code_hash="code-2")
    for _ in range(20):
        moves = migrants(pop, 3, 2, rng)
        assert not [p for p, d in moves if d == 1]
        sent = [p for p, _ in moves]
        assert len(sent) == len(set(sent))
    assert migrants(pop, 1, 2, rng) == [] and migrants(pop, 3, 0, rng) == []


def test_migrants_look_past_the_best_when_those_are_already_there() -> None:
    rng = np.random.default_rng(0)
    strong = [tuple(0.9 + 0.1 * r) for r in rng.random((40, 2))]
    weak = [tuple(0.1 * r) for r in rng.random((10, 2))]
    pop = population(strong + weak)
    for i in range(40):  # every strong program already has a copy on island 1
        pop.append(100 + i, 1, strong[i], valid=True, code_hash=f"code-{i + 1}")
    moves = [m for m in migrants(pop, 2, 3, rng) if m[1] == 1]
    assert len(moves) == 3
    assert all(41 <= program <= 50 for program, _ in moves)


def test_migrants_skip_invalid_programs() -> None:
    pop = population([(0.9, 0.9), (0.1, 0.1)], islands=[0, 0], valid=[False, True])
    assert migrants(pop, 2, 2, np.random.default_rng(0)) == [(2, 1)]


# -- Pareto front ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(0, 60), st.integers(1, 4)),
        elements=st.one_of(st.sampled_from([0.0, 0.5, 1.0, 1.5]), st.floats(0, 2)),
    )
)
def test_pareto_front_matches_brute_force(scores: np.ndarray) -> None:
    assert pareto_front(scores).tolist() == brute_force_front(scores)


def test_pareto_front_examples() -> None:
    scores = np.array([[1, 0], [0, 1], [0.5, 0.5], [0.2, 0.2], [0.5, 0.5], [1, 0]])
    assert pareto_front(scores).tolist() == [0, 1, 2, 4, 5]  # copies stay on the front
    assert pareto_front(np.zeros((0, 2))).tolist() == []
    assert pareto_front(np.array([[0.3], [0.7], [0.7]])).tolist() == [1, 2]
    pop = population(
        [(1.0, 0.0), (0.0, 1.0), (0.5, 0.0), (1.0, 1.0)],
        islands=[0, 0, 0, 1],
        valid=[True, True, True, False],
    )
    assert pareto_ids(pop) == [1, 2]
    assert pareto_ids(pop, island=1) == []


# -- scale -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_picks_over_100k_programs(capsys: pytest.CaptureFixture[str]) -> None:
    """Correct at scale; the time is printed for the report, never asserted."""
    rng = np.random.default_rng(0)
    n = 100_000
    pop = Population(("a", "b", "c"), capacity=1)
    started = time.perf_counter()
    pop.extend(
        np.arange(1, n + 1),
        np.arange(n) % 4,
        rng.random((n, 3)) ** 3,
        valid=rng.random(n) < 0.9,
        code_hashes=[f"{i:x}" for i in range(n)],
    )
    load = time.perf_counter() - started
    config = SelectionConfig()
    times = []
    for iteration in range(300):
        started = time.perf_counter()
        selection = select(pop, iteration, rng, config)
        times.append(time.perf_counter() - started)
        assert pop.valid[pop.row(selection.parent_id)]
        assert len(selection.draft_ids) == 3
        pop.append(
            n + 1 + iteration,
            selection.island,
            rng.random(3),
            valid=True,
            code_hash=f"new{iteration}",
        )
    started = time.perf_counter()
    front = pareto_front(pop.scores)
    front_s = time.perf_counter() - started
    ms = np.array(times) * 1e3
    with capsys.disabled():
        print(
            f"\n100k programs: load {load * 1e3:.0f} ms; select p50 {np.median(ms):.2f} ms, "
            f"p99 {np.percentile(ms, 99):.2f} ms; pareto_front (d=3, {len(front)} on it) "
            f"{front_s * 1e3:.0f} ms"
        )
