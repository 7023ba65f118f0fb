"""A database an earlier release made, opened by this one: on real SQLite files and a real
PostgreSQL server (tests taking `db_url` run once per engine, see conftest.py).

Earlier releases clipped scores into [0, 1] and their score table checks `value <= 1`; a record
now scores above 1. A writable open replaces that check; a read-only open reads as before.
Their groups had no parse rate or pool diversity columns: a writable open adds them, and the
groups recorded before are measured when read.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import CheckConstraint, Engine, MetaData, create_engine, insert, inspect, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from harness.cli import main
from harness.observation.views import bestk
from harness.records import CandidateRecord, NewGroup, NewProgram, RolloutRecord
from harness.store import Store
from harness.store.models import SCHEMA_VERSION, Base, RolloutGroup, Score, Trajectory, utc_now

OLD_CHECK = "ck_score_value_unit"
NEW_CHECK = "ck_score_value_finite"
MEASURE_COLUMNS = {"parse_rate", "pool_diversity"}


def plain_engine(url: str) -> Engine:
    """An engine without the Store's setup, to play the earlier release."""
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def old_release_database(url: str) -> None:
    """The tables an earlier release created (the same models, but the score check that
    refused values above 1, declared as it was, and no measure columns on the groups), in WAL
    mode on SQLite as its open left them, holding a campaign with two programs: one at the best
    known value (1.0), one at 0.5."""
    metadata = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.tables.values():
        table.to_metadata(metadata)
    score = metadata.tables["score"]
    for check in [c for c in score.constraints if isinstance(c, CheckConstraint)]:
        score.constraints.remove(check)
    score.append_constraint(CheckConstraint("value >= 0 AND value <= 1", name="value_unit"))
    engine = plain_engine(url)
    try:
        if engine.dialect.name == "sqlite":
            with engine.connect() as connection:
                connection.exec_driver_sql("PRAGMA journal_mode = WAL")
        with engine.begin() as connection:
            metadata.create_all(connection)
            for column in sorted(MEASURE_COLUMNS):
                connection.execute(text(f"ALTER TABLE rollout_group DROP COLUMN {column}"))
            tables = metadata.tables
            connection.execute(
                insert(tables["meta"]).values(key="schema_version", value=str(SCHEMA_VERSION))
            )
            connection.execute(
                insert(tables["campaign"]).values(
                    name="old", problem="toy", config={}, seed=0, status="running"
                )
            )
            # No ids given, so PostgreSQL's sequences count them: they are 1 and 2 here.
            for program_id, value in ((1, 1.0), (2, 0.5)):
                connection.execute(
                    insert(tables["program"]).values(
                        campaign_id=1,
                        code=f"x = {program_id}\n",
                        code_hash=f"{program_id:064d}",
                        origin="seed" if program_id == 1 else "llm",
                        status="ok",
                        metrics={},
                        created_at=utc_now(),
                    )
                )
                connection.execute(
                    insert(tables["score"]).values(
                        program_id=program_id, objective="a", value=value, raw=value * 10
                    )
                )
    finally:
        engine.dispose()


def score_checks(url: str) -> set[str]:
    engine = plain_engine(url)
    try:
        with engine.connect() as connection:
            return {c["name"] for c in inspect(connection).get_check_constraints("score")}
    finally:
        engine.dispose()


def sqlite_schema(url: str) -> list[tuple[Any, ...]]:
    """The score table's and its indexes' DDL as SQLite keeps it, each statement's lines
    sorted (SQLAlchemy writes a table's constraints in no fixed order)."""
    engine = plain_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'score' "
                    "ORDER BY type, name"
                )
            )
            return [
                (kind, name, sorted(line.strip(" ,") for line in (sql or "").splitlines()))
                for kind, name, sql in rows
            ]
    finally:
        engine.dispose()


def test_the_old_release_database_refuses_a_record(db_url: str) -> None:
    """The stand-in is faithful: the constraint has the name SQLAlchemy gave it then."""
    old_release_database(db_url)
    assert score_checks(db_url) == {OLD_CHECK}
    engine = plain_engine(db_url)
    try:
        with pytest.raises(DBAPIError), engine.begin() as connection:
            connection.execute(text("UPDATE score SET value = 1.2 WHERE program_id = 1"))
    finally:
        engine.dispose()


def test_a_writable_open_upgrades_it_to_take_a_record(db_url: str, tmp_path: Path) -> None:
    old_release_database(db_url)
    with Store.open(db_url) as store:
        record = store.add_program(1, NewProgram("x = 3\n", "ok", {"a": 1.2}, {"a": 12.0}))
        assert store.program(record).scores == {"a": 1.2}
        # The rows of the old release kept, and the record ranked first.
        assert [(pid, value) for pid, value, _ in store.best_by_objective(1, "a", 3)] == [
            (record, 1.2),
            (1, 1.0),
            (2, 0.5),
        ]
        assert store.program(2).raw == {"a": 5.0}
        # The new check still refuses what is not a finite number >= 0.
        for bad in (float("inf"), float("nan"), -0.5):
            with pytest.raises(DBAPIError), Session(store.engine) as session, session.begin():
                session.add(Score(program_id=2, objective=f"b{bad}", value=bad, raw=None))
    assert score_checks(db_url) == {NEW_CHECK}
    engine = plain_engine(db_url)
    try:
        with engine.connect() as connection:
            indexes = {index["name"] for index in inspect(connection).get_indexes("score")}
    finally:
        engine.dispose()
    assert "ix_score_ranked" in indexes
    if db_url.startswith("sqlite"):
        # The rebuilt table is the table a new database gets.
        fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
        Store.open(fresh).close()
        assert sqlite_schema(db_url) == sqlite_schema(fresh)
    # Opening again finds nothing to replace.
    Store.open(db_url).close()
    assert score_checks(db_url) == {NEW_CHECK}


def test_a_read_only_open_reads_it_as_it_is(db_url: str) -> None:
    old_release_database(db_url)
    with Store.open(db_url, read_only=True) as store:
        best = store.summary(1).best
        assert best == {"a": {"score": 1.0, "raw": 10.0, "program_id": 1}}
        assert [p.id for p in store.programs(1)] == [1, 2]
    assert score_checks(db_url) == {OLD_CHECK}


def test_two_processes_upgrading_at_once_both_open_it(db_url: str) -> None:
    old_release_database(db_url)
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def open_it() -> None:
        try:
            start.wait()
            Store.open(db_url).close()
        except BaseException as exc:  # reported below; a thread cannot fail the test itself
            failures.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert score_checks(db_url) == {NEW_CHECK}
    with Store.open(db_url, read_only=True) as store:
        assert [p.id for p in store.programs(1)] == [1, 2]


@pytest.mark.postgres
def test_sqlite_tables_keep_their_check_after_a_postgres_upgrade(
    postgres_url: str, tmp_path: Path
) -> None:
    """SQLAlchemy marks a constraint it added with ALTER TABLE as not-inline for the rest of the
    process: SQLite tables made afterwards (new, or rebuilt) must still carry the check."""
    old_release_database(postgres_url)
    Store.open(postgres_url).close()
    assert score_checks(postgres_url) == {NEW_CHECK}
    fresh, old = f"sqlite:///{tmp_path / 'fresh.db'}", f"sqlite:///{tmp_path / 'old.db'}"
    Store.open(fresh).close()
    old_release_database(old)
    Store.open(old).close()
    assert score_checks(fresh) == score_checks(old) == {NEW_CHECK}


def old_group(url: str) -> None:
    """Iteration 0 as the earlier release recorded it: two rollouts, "ok" with programs 1 and
    2 in its slots, "partial" with program 2 and an unparsed slot."""
    engine = plain_engine(url)
    try:
        with engine.begin() as connection:
            # Only the columns the old table has are named (the others have no default).
            group_id = connection.execute(
                insert(RolloutGroup.__table__)
                .values(campaign_id=1, iteration=0, parent_program_id=1)
                .returning(RolloutGroup.__table__.c.id)
            ).scalar_one()
            for position, (status, programs) in enumerate([("ok", [1, 2]), ("partial", [2, None])]):
                connection.execute(
                    insert(Trajectory.__table__).values(
                        group_id=group_id,
                        position=position,
                        completion="",
                        token_ids=[],
                        parse_status=status,
                        candidates=[
                            {"index": i, "outcome": "new" if p else "unparsed", "program_id": p}
                            for i, p in enumerate(programs, start=1)
                        ],
                    )
                )
    finally:
        engine.dispose()


def group_columns(url: str) -> set[str]:
    engine = plain_engine(url)
    try:
        with engine.connect() as connection:
            return {c["name"] for c in inspect(connection).get_columns("rollout_group")}
    finally:
        engine.dispose()


def test_groups_of_an_earlier_release_are_measured_when_read(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slots with a program score 1.0, 0.5 and 0.5 on `a`: pool diversity (0.5 + 0.5 + 0) / 3;
    one rollout of two parsed entirely."""
    old_release_database(db_url)
    old_group(db_url)
    assert not MEASURE_COLUMNS & group_columns(db_url)
    with Store.open(db_url, read_only=True) as store:
        (measured,) = store.iteration_measures(1)
        assert measured.parse_rate == 0.5 and measured.pool_diversity == pytest.approx(1 / 3)
        assert bestk(store, 1)["slots"] == 4
    assert main(["status", "--db", db_url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["measures"]
    assert shown["parse_rate"] == {"latest": 0.5, "iteration": 0, "mean": 0.5}
    assert not MEASURE_COLUMNS & group_columns(db_url)  # a reader changed nothing

    with Store.open(db_url) as store:
        assert MEASURE_COLUMNS <= group_columns(db_url)
        assert store.iteration_measures(1)[0].pool_diversity == pytest.approx(1 / 3)
        new = CandidateRecord(1, "new", NewProgram("x = 9\n", "ok", {"a": 0.75}, {}))
        repeated = CandidateRecord(2, "duplicate", code_hash=f"{1:064d}")
        store.record_iteration(
            1,
            NewGroup(
                1,
                0,
                1,
                (),
                [],
                None,
                [RolloutRecord("", [], None, "stop", "ok", None, [new, repeated])],
            ),
        )
        assert [(m.parse_rate, m.pool_diversity) for m in store.iteration_measures(1)] == [
            (0.5, pytest.approx(1 / 3)),
            (1.0, pytest.approx(0.25)),
        ]
        with store.engine.connect() as connection:
            stored = connection.execute(
                text("SELECT iteration, parse_rate FROM rollout_group ORDER BY iteration")
            ).all()
    assert [tuple(row) for row in stored] == [(0, None), (1, 1.0)]  # the old one is not backfilled
