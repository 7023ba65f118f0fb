"""The schema of a database: whether it is ours, of this schema version and at a revision this
release knows (`check`); the tables created in an empty one (`create`); one that is behind
migrated to the head revision (`migrate`, `harness.store.migrations`). Creating and migrating
hold the writers' lock, so processes opening one database at once do it once."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from harness.config.errors import SchemaError
from harness.store import migrations
from harness.store.models import SCHEMA_VERSION, Base, Meta, create_tables

log = logging.getLogger(__name__)

# Any fixed number: serialises concurrent `Store.open` calls that would create the tables or
# migrate them.
_POSTGRES_CREATE_LOCK = 0x7670_6F65


def create(engine: Engine, where: str) -> None:
    with engine.execution_options(vpo_write=True).begin() as connection:
        if engine.dialect.name != "sqlite":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRES_CREATE_LOCK}
            )
        # Another process may have created the tables while we waited for the lock.
        if check(connection, where)[0]:
            create_tables(connection)
            connection.execute(
                Meta.__table__.insert().values(key="schema_version", value=str(SCHEMA_VERSION))
            )
            migrations.stamp(connection)


def migrate(engine: Engine, where: str) -> None:
    """The database brought to the head revision in one transaction, under the writers' lock;
    a SQLite file is copied first (inside the lock, so two processes opening it at once make
    one copy; WAL lets the copy read while the lock is held)."""
    with engine.execution_options(vpo_write=True).begin() as connection:
        if engine.dialect.name != "sqlite":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRES_CREATE_LOCK}
            )
        # Another process may have migrated it while we waited for the lock.
        revision = migrations.current(connection)
        if revision == migrations.head():
            return
        copy = None
        if engine.dialect.name == "sqlite" and where != ":memory:":
            copy = migrations.backup_sqlite(Path(where), revision)
        migrations.upgrade(connection)
    kept = f"; the database as it was is in {copy}" if copy else ""
    log.warning(
        "migrated %s from %s to %s%s",
        where,
        migrations.named(revision),
        migrations.named(migrations.head()),
        kept,
    )


def check(connection: Connection, where: str) -> tuple[bool, str | None]:
    """(True, None) when the database has no tables, else (False, its revision); raises
    SchemaError unless it is ours, of this schema version, at a revision this release knows."""
    tables = set(inspect(connection).get_table_names())
    if not tables:
        return True, None
    foreign = f"{where} is not a vpo-evolve database"
    if "meta" not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise SchemaError(f"{foreign} (it holds other tables: {shown}); use a new file or database")
    meta = Meta.__table__
    try:
        value = connection.scalar(select(meta.c.value).where(meta.c.key == "schema_version"))
    except DBAPIError as exc:
        raise SchemaError(f"{foreign} (its meta table has another layout)") from exc
    try:
        version = int(value)
    except (TypeError, ValueError):
        raise SchemaError(f"{foreign} (its meta table holds no schema_version)") from None
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{where} was written by schema version {version}; "
            f"this vpo-evolve reads version {SCHEMA_VERSION}; upgrade vpo-evolve"
        )
    if version < SCHEMA_VERSION:
        raise SchemaError(
            f"{where} was written by schema version {version}; this vpo-evolve reads version "
            f"{SCHEMA_VERSION} and cannot migrate it; use the vpo-evolve release that wrote it"
        )
    revision = migrations.current(connection)
    if revision is not None and not migrations.known(revision):
        raise SchemaError(
            f"{where} was migrated to revision {revision} by a newer vpo-evolve; this one "
            f"knows revisions up to {migrations.head()}; upgrade vpo-evolve"
        )
    adopted = set(migrations.ADOPTION_CREATES) if revision is None else set()
    missing = set(Base.metadata.tables) - tables - adopted
    if missing:
        raise SchemaError(f"{where} lacks tables {', '.join(sorted(missing))}; it is damaged")
    return False, revision
