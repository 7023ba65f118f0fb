"""Schema migrations with Alembic: a database written by an earlier release, brought up to date.

The revisions are in `versions/`, one file each, run by `env.py` on the connection handed over
here. Where a database stands is Alembic's own `alembic_version` table; a database without it
was written before migrations existed (schema version 1 in `meta`): revision 0001 adopts it,
adding what releases of that schema added since (a table, four columns, a check constraint).

- A new database is made from the models and stamped with the head revision, in the same
  transaction as its tables.
- A writable open of a database behind the head migrates it in one transaction, under the
  lock writers take (SQLite's BEGIN IMMEDIATE, a PostgreSQL advisory lock), after a backup copy
  of a SQLite file beside it (`campaign.db.backup-FROM`); a second process waiting for the lock
  then finds it migrated.
- A read-only open never writes: a database behind the head is refused with the revision it
  is at and the one it needs, except one from before migrations, which readers have always
  read as it is (they select none of what 0001 adds).
- A revision this release does not know (a newer release migrated the database) is refused.

A new revision: `alembic -c harness/store/migrations/alembic.ini revision -m "what"` writes the file
(or copy one by hand; `script.py.mako` is the template). Write its DDL with `op` against the
tables as they stand at that revision, never by importing today's models.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

HERE = Path(__file__).resolve().parent
BEFORE_MIGRATIONS = "before migrations"  # how a database without `alembic_version` is named
# Tables revision 0001 creates where missing: a database from before migrations may lack them.
ADOPTION_CREATES = ("iteration_claim",)


def _config(connection: Connection | None = None, scripts: Path | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(scripts or HERE))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head(scripts: Path | None = None) -> str:
    """The newest revision this release knows."""
    found = _directory(scripts or HERE).get_current_head()
    assert found is not None, "harness/store/migrations/versions holds no revision"
    return found


def known(revision: str, scripts: Path | None = None) -> bool:
    try:
        return _directory(scripts or HERE).get_revision(revision) is not None
    except Exception:  # alembic's ResolutionError and kin: not one of ours
        return False


@cache
def _directory(scripts: Path) -> ScriptDirectory:
    """The revisions, read once per process (every `Store.open` asks)."""
    return ScriptDirectory.from_config(_config(scripts=scripts))


def current(connection: Connection) -> str | None:
    """The database's revision; None for a database from before migrations (or a new one)."""
    return MigrationContext.configure(connection).get_current_revision()


def stamp(connection: Connection, scripts: Path | None = None) -> None:
    """Mark a database just made from the models as being at the head revision."""
    command.stamp(_config(connection, scripts), "head")


def upgrade(connection: Connection, scripts: Path | None = None) -> None:
    """Run every revision between the database's and the head, inside the caller's
    transaction on `connection`."""
    command.upgrade(_config(connection, scripts), "head")


def named(revision: str | None) -> str:
    return BEFORE_MIGRATIONS if revision is None else f"revision {revision}"


def backup_sqlite(path: Path, revision: str | None) -> Path:
    """A consistent copy of the SQLite database at `path` (its WAL included), beside it, named
    after the revision it was at; an existing copy of that name is kept and a dated one made."""
    label = "pre-migrations" if revision is None else revision
    target = path.with_name(f"{path.name}.backup-{label}")
    if target.exists():
        stamp_text = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        target = path.with_name(f"{path.name}.backup-{label}-{stamp_text}")
    source = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            copy.close()
    finally:
        source.close()
    return target
