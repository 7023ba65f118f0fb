"""Campaign-level measures: the estimators against brute-force enumeration (hypothesis), the
per-iteration pool diversity and parse rate as a real stored iteration writes them (SQLite and
PostgreSQL), and `vpo db bestk` / `vpo status` over filled campaigns."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from harness.cli import main
from harness.observation.windows import rolling_mean
from harness.records import CandidateRecord, NewGroup, NewProgram, RolloutRecord, code_hash
from harness.store import Store
from harness.store.models import RolloutGroup
from trainer.measures import best_at_k, parse_rate, pass_at_k, passes, pool_diversity

# -- brute force: every k-subset, every pair -----------------------------------------------------


def enumerated_best(values: Sequence[float], k: int) -> float:
    subsets = list(itertools.combinations(values, k))
    return sum(max(subset) for subset in subsets) / len(subsets)


def enumerated_pass(passing: Sequence[bool], k: int) -> float:
    subsets = list(itertools.combinations(passing, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


def pairwise_l1(vectors: Sequence[Sequence[float]]) -> float | None:
    pairs = [
        sum(abs(x - y) for x, y in zip(a, b, strict=True))
        for i, a in enumerate(vectors)
        for j, b in enumerate(vectors)
        if i != j
    ]
    return sum(pairs) / len(pairs) if pairs else None


values = st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=9)
# (d, up to nine vectors of d scores)
vector_lists = st.integers(1, 3).flatmap(
    lambda d: st.tuples(
        st.just(d), st.lists(st.lists(st.floats(0, 5), min_size=d, max_size=d), max_size=9)
    )
)


# -- the estimators ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(values)
def test_best_at_k_is_the_mean_over_every_k_subset_of_the_maximum(xs: list[float]) -> None:
    got = best_at_k(np.array(xs), len(xs))
    for k in range(1, len(xs) + 1):
        assert got[k - 1] == pytest.approx(enumerated_best(xs, k), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(values)
def test_best_at_k_runs_from_the_mean_up_to_the_maximum(xs: list[float]) -> None:
    got = best_at_k(np.array(xs), len(xs))
    assert got[0] == pytest.approx(np.mean(xs), rel=1e-12, abs=1e-12)
    assert got[-1] == pytest.approx(max(xs), rel=1e-12, abs=1e-12)
    assert np.all(np.diff(got) >= -1e-12)  # monotone in k
    assert np.all((got >= min(xs)) & (got <= max(xs)))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.lists(st.booleans(), min_size=n, max_size=n)))
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_pass(flags: list[bool]) -> None:
    n, c = len(flags), sum(flags)
    got = pass_at_k(n, c, n)
    for k in range(1, n + 1):
        assert got[k - 1] == pytest.approx(enumerated_pass(flags, k), abs=1e-12)
        assert got[k - 1] == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert np.all((got >= 0) & (got <= 1)) and np.all(np.diff(got) >= 0)


def test_columns_are_estimated_each_on_its_own() -> None:
    vectors = np.array([[0.0, 3.0], [1.0, 2.0], [2.0, 1.0], [3.0, 0.0]])
    got = best_at_k(vectors, 4)
    for k in range(1, 5):
        assert got[k - 1, 0] == pytest.approx(enumerated_best(vectors[:, 0].tolist(), k))
        assert got[k - 1, 1] == pytest.approx(got[k - 1, 0])


def test_a_million_slots_keep_the_closed_forms() -> None:
    """For the values 1/n, 2/n, ..., 1: E[max of k] = k (n + 1) / ((k + 1) n); with one
    passing slot among n, pass@k = k / n. Binomials of 10^6 would overflow a float."""
    n = 10**6
    got = best_at_k(np.arange(1, n + 1) / n, 30)
    ks = np.arange(1, 31)
    assert got == pytest.approx(ks * (n + 1) / ((ks + 1) * n), rel=1e-9)
    assert pass_at_k(n, 1, 30) == pytest.approx(ks / n, rel=1e-9)
    assert pass_at_k(n, 0, 30).max() == 0.0 and pass_at_k(n, n, 30).min() == 1.0
    assert pass_at_k(n, n - 5, 30)[5:].min() == 1.0  # any 6 slots hold a pass


def test_bad_k_is_refused() -> None:
    for call in (lambda: best_at_k(np.zeros(3), 0), lambda: best_at_k(np.zeros(3), 4)):
        with pytest.raises(ValueError, match="k must be between 1 and the 3 values"):
            call()
    with pytest.raises(ValueError, match="need 0 <= passing <= n"):
        pass_at_k(3, 4, 1)


@settings(max_examples=200, deadline=None)
@given(vector_lists)
def test_pool_diversity_is_the_mean_pairwise_l1_distance(
    drawn: tuple[int, list[list[float]]],
) -> None:
    d, vectors = drawn
    expected = pairwise_l1(vectors)
    got = pool_diversity(np.array(vectors).reshape(len(vectors), d))
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_the_trainers_step_measures_each_groups_diversity_by_the_one_rule() -> None:
    """A training step's diversity is `pool_diversity` of each group's real candidates, and a
    group with fewer than two is left out (None), as the campaign and the answer problems do."""
    from trainer.advantages import compute_advantages
    from trainer.train import Group, Rollout, TrainConfig

    rng = np.random.default_rng(0)
    groups = []
    for real in (0.7, 0.7, 0.0):  # the last group has no real candidate
        scores = rng.random((4, 3, 2))  # (G, m, d)
        mask = rng.random((4, 3)) < real
        mask[0, 0] = real > 0
        rollouts = [Rollout((1,), (2,), None, None) for _ in range(4)]
        groups.append(Group(rollouts=rollouts, scores=scores, mask=mask))
    measured = compute_advantages(groups, TrainConfig(advantage="vpo")).diversity
    expected = [pool_diversity(g.scores[g.mask]) for g in groups[:2]]
    assert measured == pytest.approx(expected, rel=1e-12) and None not in expected
    assert pool_diversity(groups[2].scores[groups[2].mask]) is None
    assert pool_diversity(np.array([[1.0, 0.0], [0.0, 1.0]])) == 2.0
    assert pool_diversity(np.zeros((1, 2))) is None


def test_parse_rate_passes_and_rolling_mean() -> None:
    assert parse_rate(["ok", "partial", "ok", "none"]) == 0.5
    assert parse_rate([]) is None
    assert passes(np.array([[1.0, 1.2], [1.0, 0.99], [2.0, 1.0]])).tolist() == [True, False, True]
    assert passes(np.zeros((2, 0))).tolist() == [False, False]  # no objective: nothing passes
    assert rolling_mean([1.0, None, 3.0, 5.0, None, None, None], 3) == [
        1.0, 1.0, 2.0, 4.0, 4.0, 5.0, None,
    ]  # fmt: skip


# -- a real stored iteration ---------------------------------------------------------------------


def rollout(status: str, *candidates: CandidateRecord) -> RolloutRecord:
    return RolloutRecord("text", [1, 2], None, "stop", status, None, candidates)


def program(code: str, scores: dict[str, float], status: str = "ok") -> NewProgram:
    return NewProgram(code, status, scores, {})


def group(
    iteration: int, parent: int, *rollouts: RolloutRecord, skipped: str | None = None
) -> NewGroup:
    return NewGroup(iteration, 0, parent, (), [], None, rollouts, skipped=skipped)


X, Z = "x = 1\n", "z = 3\n"
EARLIER = "p = 0\n"
# The slots of iteration 1 that hold a program: X new, P an earlier program repeated, Y an
# invalid program scored on `a` only (b counts 0), X repeated within the group, Z a record.
SLOT_VECTORS = [[1.0, 0.0], [0.2, 0.4], [0.0, 0.0], [1.0, 0.0], [1.2, 0.6]]


def record_known_iterations(url: str) -> Store:
    """Iteration 0 stores P; iteration 1 has three rollouts (ok, partial, ok) of two slots:
    X new | P repeated,  Y invalid | unparsed,  X repeated | Z new. Iteration 2 is skipped,
    iteration 3 has one program only."""
    store = Store.open(url)
    campaign = store.create_campaign("m", "toy", {}, 0)
    seed = store.add_program(campaign, program("s = 0\n", {"a": 0.5, "b": 0.5}))
    store.record_iteration(
        campaign,
        group(
            0,
            seed,
            rollout("ok", CandidateRecord(1, "new", program(EARLIER, {"a": 0.2, "b": 0.4}))),
        ),
    )
    store.record_iteration(
        campaign,
        group(
            1,
            seed,
            rollout(
                "ok",
                CandidateRecord(1, "new", program(X, {"a": 1.0, "b": 0.0})),
                CandidateRecord(2, "duplicate", code_hash=code_hash(EARLIER), lazy=True),
            ),
            rollout(
                "partial",
                CandidateRecord(1, "new", program("y = (\n", {"a": 0.0}, "invalid")),
                CandidateRecord(2, "unparsed", reason="no candidate 2"),
            ),
            rollout(
                "ok",
                CandidateRecord(1, "duplicate", code_hash=code_hash(X)),
                CandidateRecord(2, "new", program(Z, {"a": 1.2, "b": 0.6})),
            ),
        ),
    )
    store.record_iteration(campaign, group(2, seed, skipped="the prompt did not fit"))
    store.record_iteration(
        campaign,
        group(
            3,
            seed,
            rollout("none", CandidateRecord(1, "unparsed", reason="no candidates")),
            rollout("ok", CandidateRecord(1, "duplicate", code_hash=code_hash(Z))),
        ),
    )
    return store


def stored_columns(store: Store) -> dict[int, tuple[float | None, float | None]]:
    group_table = RolloutGroup.__table__
    with store.engine.connect() as connection:
        rows = connection.execute(
            select(group_table.c.iteration, group_table.c.parse_rate, group_table.c.pool_diversity)
        ).all()
    return {iteration: (rate, diversity) for iteration, rate, diversity in rows}


def test_a_recorded_iteration_stores_its_parse_rate_and_pool_diversity(db_url: str) -> None:
    with record_known_iterations(db_url) as store:
        stored = stored_columns(store)
        assert stored[0] == (1.0, None)  # one program: no pair
        assert stored[1][0] == pytest.approx(2 / 3)
        assert stored[1][1] == pytest.approx(pairwise_l1(SLOT_VECTORS), rel=1e-12)
        assert stored[2] == (None, None)  # skipped
        assert stored[3] == (0.5, None)
        measured = store.iteration_measures(1)
        assert [(m.iteration, m.parse_rate) for m in measured] == [
            (0, 1.0), (1, stored[1][0]), (2, None), (3, 0.5),
        ]  # fmt: skip
        assert [m.pool_diversity for m in measured] == [None, stored[1][1], None, None]
        assert [m.iteration for m in store.iteration_measures(1, last=2)] == [2, 3]


def test_groups_without_stored_measures_are_measured_on_read(db_url: str) -> None:
    """A group recorded before the columns existed has NULL there: the read computes what the
    write would have stored, and writes nothing."""
    with record_known_iterations(db_url) as store:
        before = store.iteration_measures(1)
        with store.engine.begin() as connection:
            connection.execute(
                update(RolloutGroup.__table__).values(parse_rate=None, pool_diversity=None)
            )
        after = store.iteration_measures(1)
        assert [m.parse_rate for m in after] == [m.parse_rate for m in before]
        assert after[1].pool_diversity == pytest.approx(before[1].pool_diversity, rel=1e-12)
        assert [m.pool_diversity for m in after if m.iteration != 1] == [None, None, None]
        assert set(stored_columns(store).values()) == {(None, None)}


# -- vpo db bestk and vpo status -----------------------------------------------------------------


def bestk(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> dict:
    assert main(["db", "bestk", "--db", db, "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def check_against_enumeration(
    report: dict, slots: list[list[float]], objectives: list[str]
) -> None:
    n = len(slots)
    assert report["slots"] == n and report["objectives"] == objectives
    passing = [all(v >= 1.0 for v in vector) for vector in slots]
    assert report["passing"] == sum(passing)
    for row in report["rows"]:
        k = row["k"]
        for j, name in enumerate(objectives):
            column = [vector[j] for vector in slots]
            assert row["best"][name] == pytest.approx(enumerated_best(column, k), rel=1e-9)
        means = [sum(vector) / len(vector) for vector in slots]
        assert row["best_mean"] == pytest.approx(enumerated_best(means, k), rel=1e-9)
        assert row["pass"] == pytest.approx(enumerated_pass(passing, k), abs=1e-12)


def test_bestk_over_the_small_campaign(database: str, capsys: pytest.CaptureFixture) -> None:
    """`fill_small_campaign`: six slots, A, B, the failed C (zeros), an unparsed one, D and an
    unparsed one; nothing reaches the best known value."""
    slots = [[0.9, 0.1], [0.1, 0.9], [0.0, 0.0], [0.0, 0.0], [0.95, 0.2], [0.0, 0.0]]
    report = bestk(capsys, database)
    assert [row["k"] for row in report["rows"]] == [1, 2, 3, 4, 5, 6]  # 30 capped at n
    assert report["with_program"] == 4
    check_against_enumeration(report, slots, ["a", "b"])
    assert [row["k"] for row in bestk(capsys, database, "--k", "2")["rows"]] == [1, 2]
    assert main(["db", "bestk", "--db", database]) == 0
    table = capsys.readouterr().out
    assert "best@k and pass@k over 6 candidate slots" in table and "0.950000" in table


def test_bestk_counts_slots_that_reach_the_best_known_value(
    db_url: str, capsys: pytest.CaptureFixture
) -> None:
    record_known_iterations(db_url).close()
    # Iteration 0: P; 1: X, P, Y (a only), unparsed, X, Z; 3: unparsed, Z. Only Z passes.
    z = [1.2, 0.6]
    slots = [[0.2, 0.4], *SLOT_VECTORS[:3], [0.0, 0.0], *SLOT_VECTORS[3:], [0.0, 0.0], z]
    report = bestk(capsys, db_url, "--name", "m")
    assert report["passing"] == 0  # b of Z is 0.6
    check_against_enumeration(report, slots, ["a", "b"])
    with Store.open(db_url) as store:
        campaign = store.get_campaign("m").id
        store.record_iteration(
            campaign,
            group(
                4,
                1,
                rollout(
                    "ok",
                    CandidateRecord(1, "new", program("w = 4\n", {"a": 1.0, "b": 1.0})),
                    CandidateRecord(2, "new", program("v = 5\n", {"a": 2.0, "b": 0.99})),
                ),
            ),
        )
    report = bestk(capsys, db_url, "--name", "m")
    assert report["passing"] == 1
    check_against_enumeration(report, [*slots, [1.0, 1.0], [2.0, 0.99]], ["a", "b"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--k", "0"], "expected a positive whole number, got '0'"),
        (["--k", "5000"], "--k is at most 1000"),
        (["--name", "nope"], "no campaign named 'nope'"),
        (["--name", "empty"], "no candidates yet"),
    ],
)
def test_bestk_bad_requests_are_one_line(
    sqlite_database: str, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    with Store.open(sqlite_database) as store:
        campaign = store.create_campaign("empty", "toy", {}, 0)
        store.add_program(campaign, program("e = 0\n", {"a": 1.0}))
    with pytest.raises(SystemExit) as exit:
        main(["db", "bestk", "--db", sqlite_database, *argv])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_status_shows_the_latest_and_recent_measures(
    db_url: str, capsys: pytest.CaptureFixture
) -> None:
    record_known_iterations(db_url).close()
    assert main(["status", "--db", db_url, "--json"]) == 0
    measures = json.loads(capsys.readouterr().out)["measures"]
    diversity = pairwise_l1(SLOT_VECTORS)
    assert measures["window"] == 20
    assert measures["pool_diversity"]["iteration"] == 1
    assert measures["pool_diversity"]["latest"] == pytest.approx(diversity)
    assert measures["pool_diversity"]["mean"] == pytest.approx(diversity)
    assert measures["parse_rate"] == {
        "latest": 0.5, "iteration": 3, "mean": pytest.approx((1 + 2 / 3 + 0.5) / 3),
    }  # fmt: skip
    assert main(["status", "--db", db_url]) == 0
    table = capsys.readouterr().out
    assert "parse rate (iteration 3)" in table and "50.0%" in table
    assert "pool diversity (mean of last 20)" in table
