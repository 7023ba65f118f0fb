"""Migrations (Alembic, harness/store/migrations): a database written by the release before them, a
later revision applied to today's database, and a database from a newer release.

`tests/data/before-alembic.db` was written by the release just before migrations
(`vpo run equation_discovery:oscillator1 --iterations 2 -G 2 --max-tokens 96 --train-every 2
--lora --backend transformers`, 2026-12-02): 2 programs, 2 groups of 2 rollouts, a policy
version. Tests taking `db_url` run on SQLite and on a real PostgreSQL server.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from harness.cli import main
from harness.config.errors import SchemaError
from harness.store import Store, migrations

FIXTURE = Path(__file__).parent / "data" / "before-alembic.db"

TODAY = migrations.head()  # the revision a database made today is at
LATER = f'''"""A column a later release added.

Revision ID: later
Revises: {TODAY}
"""

import sqlalchemy as sa
from alembic import op

revision = "later"
down_revision = "{TODAY}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("campaign", sa.Column("note_added_later", sa.Text(), nullable=True))
'''


def released(tmp_path: Path) -> Path:
    copy = tmp_path / "campaign.db"
    shutil.copy(FIXTURE, copy)
    return copy


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def revision_of(url: str) -> str | None:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            return migrations.current(connection)
    finally:
        engine.dispose()


def test_a_database_of_the_release_before_migrations_is_migrated_on_a_writable_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = released(tmp_path)
    before = rows(path, "SELECT id, code_hash, status FROM program ORDER BY id")
    assert not rows(path, "SELECT name FROM sqlite_master WHERE name = 'alembic_version'")
    with Store.open(path) as store:
        campaign = store.campaigns()[0]
        assert [p.id for p in store.programs(campaign.id)] == [1, 2]
        assert len(store.policies(campaign.id)) == 1
        assert store.summary(campaign.id).groups == 2
    assert rows(path, "SELECT version_num FROM alembic_version") == [(migrations.head(),)]
    # The copy beside it is the database as it was, readable as such.
    copy = tmp_path / "campaign.db.backup-pre-migrations"
    assert rows(copy, "SELECT id, code_hash, status FROM program ORDER BY id") == before
    assert not rows(copy, "SELECT name FROM sqlite_master WHERE name = 'alembic_version'")
    # Its tables and indexes are those of a database made new today.
    fresh = tmp_path / "fresh.db"
    Store.open(fresh).close()
    layout = "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY 1, 2"
    assert rows(path, layout) == rows(fresh, layout)
    # Opened again, nothing more happens: no second copy.
    Store.open(path).close()
    assert sorted(p.name for p in tmp_path.glob("campaign.db.backup*")) == [copy.name]


def test_a_read_only_open_reads_it_as_it_is_and_writes_nothing(tmp_path: Path) -> None:
    path = released(tmp_path)
    content = path.read_bytes()
    with Store.open(path, read_only=True) as store:
        assert store.summary(1).programs == 2
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["campaign.db"]


def test_a_later_revision_migrates_todays_database(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store.open(db_url).close()  # today's database, at the head revision
    assert revision_of(db_url) == TODAY
    scripts = tmp_path / "migrations"
    shutil.copytree(migrations.HERE, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9999_later.py").write_text(LATER)
    monkeypatch.setattr(migrations, "HERE", scripts)
    # A reader says which revision it needs, and leaves the database as it is.
    needs = f"is at revision {TODAY}; this vpo-evolve reads revision later"
    with pytest.raises(SchemaError, match=needs):
        Store.open(db_url, read_only=True)
    assert revision_of(db_url) == TODAY
    with Store.open(db_url) as store:
        with store.engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("campaign")}
    assert "note_added_later" in columns
    assert revision_of(db_url) == "later"
    if db_url.startswith("sqlite"):
        copies = list(tmp_path.glob(f"vpo.db.backup-{TODAY}"))
        assert len(copies) == 1
        assert rows(copies[0], "SELECT version_num FROM alembic_version") == [(TODAY,)]
    Store.open(db_url, read_only=True).close()


def test_a_database_a_newer_release_migrated_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "campaign.db"
    Store.open(path).close()
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    for read_only in (True, False):
        with pytest.raises(SchemaError, match="migrated to revision 0099 by a newer vpo-evolve"):
            Store.open(path, read_only=read_only)
    with pytest.raises(SystemExit) as exited:
        main(["status", "--db", str(path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "revision 0099" in err and "upgrade vpo-evolve" in err


def test_vpo_db_upgrade_migrates_explicitly_and_says_what_it_did(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """For a database its readers cannot migrate: `vpo db upgrade` does, on SQLite after a
    backup copy, and says from which revision to which; run again, it has nothing to do."""
    Store.open(db_url).close()
    scripts = tmp_path / "migrations"
    shutil.copytree(migrations.HERE, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9999_later.py").write_text(LATER)
    monkeypatch.setattr(migrations, "HERE", scripts)
    with pytest.raises(SchemaError, match="this vpo-evolve reads revision later"):
        Store.open(db_url, read_only=True)
    assert main(["db", "upgrade", "--db", db_url]) == 0
    said = capsys.readouterr().out
    assert f"migrated from revision {TODAY} to revision later" in said, said
    assert revision_of(db_url) == "later"
    Store.open(db_url, read_only=True).close()  # readers read it now
    if db_url.startswith("sqlite"):
        assert len(list(tmp_path.glob(f"vpo.db.backup-{TODAY}"))) == 1
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert "is at revision later already: nothing to migrate" in capsys.readouterr().out


def test_vpo_db_upgrade_of_a_missing_database_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["db", "upgrade", "--db", str(tmp_path / "none.db")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none.db" in err, err
