"""The solution database on real SQLite files and a real PostgreSQL server.

Tests that take `db_url` run once per engine (see conftest.py); the rest are about one engine
or about pure helpers.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, delete, func, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session

from harness.config.errors import SchemaError, UserError
from harness.records import Lineage, NewProgram, code_hash
from harness.store import Store
from harness.store.models import (
    SCHEMA_VERSION,
    Base,
    Campaign,
    Event,
    GroupDraft,
    Meta,
    PolicyVersion,
    Program,
    RolloutGroup,
    Score,
    Trajectory,
)

SEED_CODE = "def construct():\n    return [0.5, 0.5, 0.1]\n"


def plain_engine(url: str) -> Engine:
    """An engine without the Store's setup, to play a foreign or older program."""
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def row_count(store: Store, model: type[Base]) -> int:
    with Session(store.engine) as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def assert_one_line(error: Exception) -> None:
    message = str(error)
    assert message and "\n" not in message, message


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store.open(db_url) as opened:
        yield opened


@pytest.fixture
def campaign_id(store: Store) -> int:
    return store.create_campaign("circles", "circle_packing", {"islands": 2}, seed=7)


def populate(store: Store) -> dict[str, Any]:
    """One row in every table, linked the way a campaign links them; returns the ids."""
    campaign_id = store.create_campaign(
        "full", "circle_packing", {"model": "smollm2", "m": 4, "alpha": 1.0}, seed=3
    )
    seed_id = store.add_program(
        campaign_id,
        NewProgram(
            SEED_CODE,
            "ok",
            {"sum_radii": 0.25, "margin": 1.0},
            {"sum_radii": 0.65, "margin": None},
            eval_seconds=0.5,
            metrics={"stdout_tail": "done\n", "circles": [[0.5, 0.5, 0.1]]},
        ),
    )
    with Session(store.engine) as session, session.begin():
        version = PolicyVersion(
            campaign_id=campaign_id, step=1, path="runs/full/policy-1", metrics={"loss": 0.25}
        )
        session.add(version)
        session.flush()
        group = RolloutGroup(
            campaign_id=campaign_id,
            iteration=0,
            parent_program_id=seed_id,
            policy_version_id=version.id,
            prompt=[{"role": "user", "content": "Improve the packing."}],
        )
        session.add(group)
        session.flush()
        session.add(GroupDraft(group_id=group.id, position=0, program_id=seed_id))
        trajectory = Trajectory(
            group_id=group.id,
            completion="<candidate_1>...</candidate_1>",
            token_ids=[1, 2, 3],
            logprobs=[-0.5, -1.25, -0.125],
            policy_version_id=version.id,
            parse_status="ok",
            parse_error=None,
        )
        session.add(trajectory)
        session.flush()
        ids = {
            "campaign": campaign_id,
            "seed": seed_id,
            "version": version.id,
            "group": group.id,
            "trajectory": trajectory.id,
        }
    ids["child"] = store.add_program(
        campaign_id,
        NewProgram(
            SEED_CODE.replace("0.1", "0.2"),
            "invalid",
            {"sum_radii": 0.0, "margin": 0.0},
            {},
            error="circle 0 leaves the square",
        ),
        Lineage(
            origin="llm",
            parent_id=seed_id,
            island=1,
            generation=1,
            trajectory_id=ids["trajectory"],
            candidate_index=0,
        ),
    )
    return ids


def test_every_table_round_trips(store: Store) -> None:
    ids = populate(store)

    campaign = store.get_campaign("full")
    assert campaign is not None
    assert (campaign.id, campaign.problem, campaign.seed, campaign.status) == (
        ids["campaign"],
        "circle_packing",
        3,
        "running",
    )
    assert campaign.config == {"model": "smollm2", "m": 4, "alpha": 1.0}
    assert campaign.created_at.tzinfo is not None
    assert abs((datetime.now(UTC) - campaign.created_at).total_seconds()) < 60

    seed = store.program(ids["seed"])
    assert seed is not None
    assert seed.code == SEED_CODE and seed.code_hash == code_hash(SEED_CODE)
    assert (seed.status, seed.origin, seed.parent_id, seed.eval_seconds) == (
        "ok",
        "seed",
        None,
        0.5,
    )
    assert seed.scores == {"sum_radii": 0.25, "margin": 1.0}
    assert list(seed.scores) == ["margin", "sum_radii"]  # by objective name on every engine
    assert seed.raw == {"sum_radii": 0.65, "margin": None}
    assert seed.vector(["margin", "sum_radii"]) == (1.0, 0.25)
    assert seed.metrics == {"stdout_tail": "done\n", "circles": [[0.5, 0.5, 0.1]]}
    assert seed.created_at.tzinfo is not None

    child = store.program(ids["child"])
    assert child is not None
    assert (child.parent_id, child.island, child.generation, child.origin) == (
        ids["seed"],
        1,
        1,
        "llm",
    )
    assert (child.status, child.error) == ("invalid", "circle 0 leaves the square")
    assert (child.trajectory_id, child.candidate_index) == (ids["trajectory"], 0)
    assert child.raw == {"sum_radii": None, "margin": None}
    assert child.metrics == {}

    with Session(store.engine) as session:
        version = session.get(PolicyVersion, ids["version"])
        assert version is not None
        assert (version.step, version.path, version.metrics) == (
            1,
            "runs/full/policy-1",
            {"loss": 0.25},
        )
        group = session.get(RolloutGroup, ids["group"])
        assert group is not None
        assert (group.parent_program_id, group.policy_version_id, group.train_step) == (
            ids["seed"],
            ids["version"],
            None,
        )
        drafts = session.scalars(
            select(GroupDraft.program_id).where(GroupDraft.group_id == group.id)
        )
        assert list(drafts) == [ids["seed"]]
        trajectory = session.get(Trajectory, ids["trajectory"])
        assert trajectory is not None
        assert trajectory.token_ids == [1, 2, 3]
        assert trajectory.logprobs == [-0.5, -1.25, -0.125]
        assert (trajectory.group_id, trajectory.policy_version_id) == (group.id, ids["version"])
        assert trajectory.completion == "<candidate_1>...</candidate_1>"
        assert trajectory.created_at.tzinfo is not None
        version_row = session.get(Meta, "schema_version")
        assert version_row is not None and version_row.value == str(SCHEMA_VERSION)

    kinds = [entry.kind for entry in store.events(ids["campaign"])]
    assert kinds == ["campaign_created", "program_added", "program_added"]
    added = store.events(ids["campaign"], kind="program_added")[1].payload
    assert added == {"program_id": ids["child"], "status": "invalid", "origin": "llm", "island": 1}


def test_deleting_a_campaign_removes_everything_it_owns(store: Store) -> None:
    ids = populate(store)
    other = store.create_campaign("other", "circle_packing", {}, seed=0)
    store.add_program(other, NewProgram(SEED_CODE, "ok", {"a": 1.0}, {}))
    with Session(store.engine) as session, session.begin():
        session.execute(delete(Campaign).where(Campaign.id == ids["campaign"]))
    for model in (RolloutGroup, GroupDraft, Trajectory, PolicyVersion):
        assert row_count(store, model) == 0, model
    assert row_count(store, Program) == row_count(store, Score) == 1
    assert [entry.kind for entry in store.events(other)] == ["campaign_created", "program_added"]


def test_reopening_keeps_the_data(db_url: str) -> None:
    with Store.open(db_url) as first:
        campaign_id = first.create_campaign("again", "circle_packing", {}, seed=1)
        first.add_program(campaign_id, NewProgram(SEED_CODE, "ok", {"a": 0.5}, {"a": 2.0}))
    with Store.open(db_url, create=False) as second:
        assert [p.scores for p in second.programs(campaign_id)] == [{"a": 0.5}]


def install_refusing_trigger(store: Store) -> None:
    """Make every INSERT into `event` fail inside the database, after program and scores."""
    with store.engine.begin() as connection:
        if store.engine.dialect.name == "sqlite":
            connection.exec_driver_sql(
                "CREATE TRIGGER refuse_events BEFORE INSERT ON event "
                "BEGIN SELECT RAISE(ABORT, 'refused by test'); END"
            )
        else:
            connection.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql "
                "AS $$ BEGIN RAISE EXCEPTION 'refused by test'; END $$"
            )
            connection.exec_driver_sql(
                "CREATE TRIGGER refuse_events BEFORE INSERT ON event "
                "FOR EACH ROW EXECUTE FUNCTION refuse()"
            )


def test_add_program_is_one_transaction(store: Store, campaign_id: int) -> None:
    install_refusing_trigger(store)
    with pytest.raises(DBAPIError, match="refused by test"):
        store.add_program(
            campaign_id, NewProgram(SEED_CODE, "ok", {"a": 0.5, "b": 0.25}, {"a": 1.0})
        )
    # The program and both scores were inserted before the event failed; none may remain.
    assert row_count(store, Program) == row_count(store, Score) == 0
    assert store.counts(campaign_id).total_programs == 0
    assert store.counts(campaign_id).events == {"campaign_created": 1}


def test_a_broken_reference_writes_nothing(store: Store, campaign_id: int) -> None:
    with pytest.raises(DBAPIError):
        store.add_program(
            campaign_id, NewProgram(SEED_CODE, "ok", {"a": 0.5}, {}), Lineage(trajectory_id=999)
        )
    assert row_count(store, Program) == row_count(store, Score) == 0
    assert store.counts(campaign_id).events == {"campaign_created": 1}


@pytest.mark.parametrize(
    ("scores", "raw"),
    [
        ({"a": float("inf")}, {}),
        ({"a": 1e301}, {}),
        ({"a": -0.1}, {}),
        ({"a": float("nan")}, {}),
        ({"a": 0.5}, {"a": float("inf")}),
        ({"a": 0.5}, {"b": 1.0}),
    ],
)
def test_bad_scores_are_refused_before_writing(
    store: Store, campaign_id: int, scores: dict[str, float], raw: dict[str, float]
) -> None:
    with pytest.raises(ValueError):
        store.add_program(campaign_id, NewProgram(SEED_CODE, "ok", scores, raw))
    assert row_count(store, Program) == 0


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -0.5, 1e301])
def test_the_score_table_checks_the_range_itself(
    store: Store, campaign_id: int, value: float
) -> None:
    """A finite number >= 0, on both engines: PostgreSQL keeps NaN (sorting it above every
    number) and SQLite makes it NULL, so the check's upper bound is what refuses it there."""
    program_id = store.add_program(campaign_id, NewProgram(SEED_CODE, "ok", {}, {}))
    with pytest.raises(DBAPIError), Session(store.engine) as session, session.begin():
        session.add(Score(program_id=program_id, objective="a", value=value, raw=None))


def test_a_record_above_the_best_known_is_stored_and_ranked_first(
    store: Store, campaign_id: int
) -> None:
    """Scores are not clipped at 1 (the best known value): a record keeps its margin."""
    known = store.add_program(campaign_id, NewProgram(SEED_CODE, "ok", {"a": 1.0}, {"a": 2.0}))
    record = store.add_program(campaign_id, NewProgram("x = 2\n", "ok", {"a": 1.2}, {"a": 2.4}))
    assert store.program(record).scores == {"a": 1.2}
    ranked = store.best_by_objective(campaign_id, "a", 2)
    assert [(pid, value) for pid, value, _ in ranked] == [(record, 1.2), (known, 1.0)]
    assert store.summary(campaign_id).best["a"] == {"score": 1.2, "raw": 2.4, "program_id": record}


def test_nul_characters_behave_alike_on_every_engine(store: Store, campaign_id: int) -> None:
    with pytest.raises(ValueError, match="NUL"):
        store.add_program(campaign_id, NewProgram("x = 1\x00", "ok", {}, {}))
    program_id = store.add_program(
        campaign_id,
        NewProgram(
            SEED_CODE,
            "error",
            {},
            {},
            error="stderr: \x00garbage",
            metrics={"stdout_tail": "a\x00b"},
        ),
    )
    record = store.program(program_id)
    assert record is not None
    assert record.error == "stderr: \\x00garbage"
    assert record.metrics == {"stdout_tail": "a\x00b"}


def test_unknown_status_is_refused(store: Store, campaign_id: int) -> None:
    with pytest.raises(ValueError, match="program status"):
        store.add_program(campaign_id, NewProgram(SEED_CODE, "great", {}, {}))
    with pytest.raises(ValueError, match="campaign status"):
        store.set_campaign_status(campaign_id, "paused")


def test_campaign_names_are_unique(store: Store, campaign_id: int) -> None:
    with pytest.raises(UserError, match="already exists") as raised:
        store.create_campaign("circles", "circle_packing", {}, seed=0)
    assert_one_line(raised.value)
    assert [c.name for c in store.campaigns()] == ["circles"]


def test_campaign_status_changes_are_logged(store: Store, campaign_id: int) -> None:
    store.set_campaign_status(campaign_id, "finished")
    record = store.get_campaign("circles")
    assert record is not None and record.status == "finished"
    assert store.events(campaign_id, kind="campaign_status")[0].payload == {"status": "finished"}
    assert store.get_campaign("nobody") is None


def test_counts_are_aggregated_per_campaign(store: Store, campaign_id: int) -> None:
    other = store.create_campaign("other", "circle_packing", {}, seed=0)
    for status, times in (("ok", 3), ("invalid", 2), ("timeout", 1)):
        for i in range(times):
            code = f"{SEED_CODE}# {status} {i}\n"
            store.add_program(campaign_id, NewProgram(code, status, {"a": 0.0}, {}))
    store.add_program(other, NewProgram(SEED_CODE, "error", {"a": 0.0}, {}))
    store.record_event(campaign_id, "group_evaluated", {"group_id": 1})
    store.record_event(campaign_id, "group_evaluated", {"group_id": 2})

    counts = store.counts(campaign_id)
    assert counts.programs == {"ok": 3, "invalid": 2, "error": 0, "timeout": 1}
    assert counts.total_programs == 6
    assert counts.events == {"campaign_created": 1, "program_added": 6, "group_evaluated": 2}
    assert store.counts(other).programs == {"ok": 0, "invalid": 0, "error": 1, "timeout": 0}
    assert [p.status for p in store.programs(campaign_id, status="invalid")] == ["invalid"] * 2
    assert store.counts(12345).total_programs == 0


def test_programs_filter_by_island_and_keep_insertion_order(store: Store, campaign_id: int) -> None:
    ids = [
        store.add_program(
            campaign_id, NewProgram(f"x = {i}\n", "ok", {}, {}), Lineage(island=i % 2)
        )
        for i in range(5)
    ]
    assert [p.id for p in store.programs(campaign_id)] == ids
    assert [p.id for p in store.programs(campaign_id, island=1)] == ids[1::2]


def test_find_by_hash_sees_copies_and_layout_variants(store: Store, campaign_id: int) -> None:
    original = store.add_program(campaign_id, NewProgram(SEED_CODE, "ok", {"a": 0.5}, {}))
    migrated = store.add_program(
        campaign_id,
        NewProgram(SEED_CODE, "ok", {"a": 0.5}, {}),
        Lineage(origin="migration", island=1),
    )
    store.add_program(campaign_id, NewProgram("print('other')\n", "ok", {"a": 0.1}, {}))
    noisy = SEED_CODE.replace("\n", "   \r\n\n")
    found = store.find_by_hash(campaign_id, code_hash(noisy))
    assert [p.id for p in found] == [original, migrated]
    assert store.find_by_hash(campaign_id, code_hash("nothing")) == []


def test_json_columns_keep_structure(store: Store, campaign_id: int) -> None:
    metrics = {
        "stdout_tail": "line 1\nline 2 ünïcødé ✓\n",
        "raw": {"sum_radii": 2.635, "per_circle": [0.1, 0.2, 1e-300, -0.0]},
        "flags": [True, False, None],
        "big": 2**62,
        "empty": {},
    }
    program_id = store.add_program(
        campaign_id, NewProgram(SEED_CODE, "ok", {}, {}, metrics=metrics)
    )
    record = store.program(program_id)
    assert record is not None and record.metrics == metrics


def test_missing_logprobs_are_sql_null(store: Store) -> None:
    ids = populate(store)
    with Session(store.engine) as session, session.begin():
        session.add(
            Trajectory(
                group_id=ids["group"],
                completion="c",
                token_ids=[],
                logprobs=None,
                parse_status="no_candidates",
                parse_error="no <candidate_1> tag",
            )
        )
    with Session(store.engine) as session:
        nulls = session.scalar(
            select(func.count()).select_from(Trajectory).where(Trajectory.logprobs.is_(None))
        )
        assert nulls == 1


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    # Text from the outside world is decoded UTF-8, which never holds lone surrogates.
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_event_payloads_round_trip(store: Store, campaign_id: int, payload: dict[str, Any]) -> None:
    event_id = store.record_event(campaign_id, "probe", payload)
    with Session(store.engine) as session:
        entry = session.get(Event, event_id)
        assert entry is not None and entry.payload == payload


def test_nan_in_json_is_refused_on_every_engine(store: Store, campaign_id: int) -> None:
    # SQLAlchemy wraps the serializer's ValueError on SQLite; psycopg raises it bare.
    with pytest.raises((ValueError, StatementError), match="not JSON compliant"):
        store.record_event(campaign_id, "probe", {"loss": float("nan")})
    assert store.counts(campaign_id).events == {"campaign_created": 1}


def test_a_newer_schema_is_refused_in_one_line(db_url: str) -> None:
    with Store.open(db_url) as store, Session(store.engine) as session, session.begin():
        session.execute(
            update(Meta).where(Meta.key == "schema_version").values(value=str(SCHEMA_VERSION + 1))
        )
    with pytest.raises(SchemaError) as raised:
        Store.open(db_url)
    assert_one_line(raised.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in str(raised.value)
    assert "upgrade vpo-evolve" in str(raised.value)


def test_a_foreign_database_is_refused(db_url: str) -> None:
    engine = plain_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)"))
    engine.dispose()
    with pytest.raises(SchemaError, match="not a vpo-evolve database.*customers") as raised:
        Store.open(db_url)
    assert_one_line(raised.value)


@pytest.mark.parametrize(
    ("ddl", "reason"),
    [
        ("CREATE TABLE meta (key TEXT, value TEXT)", "no schema_version"),
        ("CREATE TABLE meta (id INTEGER)", "another layout"),
    ],
)
def test_a_foreign_meta_table_is_refused(db_url: str, ddl: str, reason: str) -> None:
    engine = plain_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text(ddl))
    engine.dispose()
    with pytest.raises(SchemaError, match=reason) as raised:
        Store.open(db_url)
    assert_one_line(raised.value)


def test_a_damaged_database_is_refused(db_url: str) -> None:
    Store.open(db_url).close()
    engine = plain_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE group_draft"))
    engine.dispose()
    with pytest.raises(SchemaError, match="lacks tables group_draft"):
        Store.open(db_url)


def test_an_empty_database_is_not_created_unasked(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        plain_engine(db_url).connect().close()  # an empty file exists now
    with pytest.raises(SchemaError, match="empty"):
        Store.open(db_url, create=False)


def test_a_reader_sees_committed_rows_while_a_writer_is_busy(db_url: str) -> None:
    with Store.open(db_url) as writer, Store.open(db_url) as reader:
        campaign_id = writer.create_campaign("busy", "circle_packing", {}, seed=0)
        writer.add_program(campaign_id, NewProgram(SEED_CODE, "ok", {"a": 0.5}, {}))

        # The writer holds its write lock with a row not yet committed.
        with Session(writer.engine) as session, session.begin():
            session.add(
                Program(
                    campaign_id=campaign_id,
                    code="pending",
                    code_hash=code_hash("pending"),
                    origin="llm",
                    status="ok",
                )
            )
            session.flush()
            started = time.monotonic()
            assert reader.counts(campaign_id).total_programs == 1
            assert time.monotonic() - started < 2

        # A reader in the middle of a transaction must not stop a writer from committing.
        with reader.engine.connect() as snapshot:
            assert snapshot.scalar(select(func.count()).select_from(Program)) == 2
            started = time.monotonic()
            writer.add_program(campaign_id, NewProgram("x = 1\n", "ok", {}, {}))
            assert time.monotonic() - started < 2
        assert reader.counts(campaign_id).total_programs == 3


def test_concurrent_writers_all_land(db_url: str) -> None:
    """Two processes' worth of writers (separate stores) on one campaign, none lost."""
    with Store.open(db_url) as first:
        campaign_id = first.create_campaign("shared", "circle_packing", {}, seed=0)
    failures: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            with Store.open(db_url) as store:
                for i in range(15):
                    code = f"x = {worker * 100 + i}\n"
                    store.add_program(campaign_id, NewProgram(code, "ok", {"a": 0.5}, {}))
        except BaseException as exc:  # reported below; a thread cannot fail the test itself
            failures.append(exc)

    workers = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert failures == []
    with Store.open(db_url) as store:
        counts = store.counts(campaign_id)
        assert counts.programs["ok"] == counts.events["program_added"] == 45


# SQLite only


def test_an_in_memory_database_is_shared_by_threads() -> None:
    with Store.open("sqlite://") as store:
        campaign_id = store.create_campaign("memory", "circle_packing", {}, seed=0)
        worker = threading.Thread(
            target=store.add_program,
            args=(campaign_id, NewProgram(SEED_CODE, "ok", {"a": 1.0}, {})),
        )
        worker.start()
        worker.join()
        assert store.counts(campaign_id).total_programs == 1


def test_sqlite_runs_in_wal_mode_with_its_pragmas(tmp_path: Path) -> None:
    with Store.open(tmp_path / "wal.db") as store, store.engine.connect() as connection:
        pragma = connection.exec_driver_sql
        assert pragma("PRAGMA journal_mode").scalar() == "wal"
        assert pragma("PRAGMA foreign_keys").scalar() == 1
        assert pragma("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert pragma("PRAGMA busy_timeout").scalar() >= 1000


def test_opening_waits_while_another_process_holds_the_file(tmp_path: Path) -> None:
    """Switching a file to WAL takes a lock SQLite does not wait for; a worker opening the
    database while another one reads or creates it must wait, not fail with "locked"."""
    import sqlite3

    path = tmp_path / "w.db"
    Store.open(path).close()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA journal_mode = DELETE")  # as before the first open switched it
    holder.execute("BEGIN IMMEDIATE")  # a writer's lock, as while creating the tables
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        with Store.open(path) as store, store.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert store.campaigns() == []
    finally:
        release.join()
        holder.close()


def test_a_foreign_sqlite_file_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    engine = plain_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY)"))
    with pytest.raises(SchemaError):
        Store.open(path)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
    engine.dispose()


@pytest.mark.parametrize(
    "content", [b"hello, world\n" * 200, b"SQLite format 3\x00" + b"\xff" * 90]
)
def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(SchemaError, match="not a SQLite database") as raised:
        Store.open(path)
    assert_one_line(raised.value)
    assert path.read_bytes() == content


def test_plain_paths_and_sqlite_urls_open_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "runs" / "c.db"
    with Store.open(str(path)) as by_path:
        by_path.create_campaign("c", "circle_packing", {}, seed=0)
    with Store.open(f"sqlite:///{path}", create=False) as by_url:
        assert [c.name for c in by_url.campaigns()] == ["c"]


def test_a_missing_file_is_not_created_unasked(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no database at") as raised:
        Store.open(tmp_path / "missing.db", create=False)
    assert_one_line(raised.value)
    assert not (tmp_path / "missing.db").exists()


# PostgreSQL without a server, and URLs


def test_an_unreachable_postgres_is_one_line_and_quick() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(UserError, match="cannot use PostgreSQL") as raised:
        Store.open(f"postgresql://vpo:secret@127.0.0.1:{port}/campaigns")
    assert time.monotonic() - started < 10
    assert_one_line(raised.value)
    assert "secret" not in str(raised.value)


@pytest.mark.postgres
def test_a_role_without_create_rights_is_told_what_to_grant(postgres_url: str) -> None:
    if os.environ.get("VPO_TEST_POSTGRES_URL"):
        pytest.skip("needs the self-started server, where a new role can log in without password")
    role = f"vpo_reader_{os.getpid()}"
    admin = plain_engine(postgres_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        # It may look into the test's schema (the search_path) but not create tables there.
        schema = connection.exec_driver_sql("SELECT current_schema()").scalar()
        connection.exec_driver_sql(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    try:
        with pytest.raises(UserError, match="GRANT CREATE ON SCHEMA") as raised:
            Store.open(make_url(postgres_url).set(username=role).render_as_string())
        assert_one_line(raised.value)
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")
        admin.dispose()


@pytest.mark.postgres
def test_sqlite_keeps_its_cyclic_foreign_key_after_postgres(
    postgres_url: str, tmp_path: Path
) -> None:
    # SQLAlchemy's ALTER TABLE step on PostgreSQL once switched this key off for later SQLite
    # databases in the same process; see harness.store.models.schema_copy.
    Store.open(postgres_url).close()
    with Store.open(tmp_path / "after.db") as store, store.engine.connect() as connection:
        keys = connection.exec_driver_sql("PRAGMA foreign_key_list(program)").all()
        assert "trajectory" in {key[2] for key in keys}


def test_other_url_schemes_are_refused() -> None:
    with pytest.raises(UserError, match="unsupported database URL"):
        Store.open("mysql://localhost/campaigns")


# code_hash


def test_code_hash_ignores_layout_noise_only() -> None:
    assert code_hash("a = 1\nb = 2\n") == code_hash("a = 1  \r\n\n\nb = 2")
    assert code_hash("a = 1\n") != code_hash("a = 2\n")
    assert code_hash("a = 1\n") != code_hash("a = 1  # why\n")
    assert code_hash("if x:\n    y\n") != code_hash("if x:\ny\n")  # indentation is meaning


@given(
    lines=st.lists(st.text(st.characters(exclude_categories=["Cs", "Zl", "Zp", "Cc"]))),
    padding=st.lists(st.sampled_from(["", " ", "\t", "  \t"]), min_size=1),
)
def test_code_hash_is_stable_under_trailing_space_and_blank_lines(
    lines: list[str], padding: list[str]
) -> None:
    noisy = []
    for i, line in enumerate(lines):
        noisy.append(line + padding[i % len(padding)])
        if i % 2:
            noisy.append(padding[i % len(padding)])
    assert code_hash("\n".join(lines)) == code_hash("\n".join(noisy))
