"""Opening a database: the URL, the engine and its pragmas, and an error that says what is
wrong in one line; the schema it must hold is `harness.store.schema`'s.

`Database` is what every part of the store builds on: the open engines, where they point, and
one transaction per read or write on a Core connection.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.pool import StaticPool

from harness.config.errors import SchemaError, UserError
from harness.store import migrations, schema
from harness.store.models import dumps_json

# Seconds a SQLite writer waits for another writer before giving up, and a PostgreSQL client
# waits for the server to answer: long enough for a busy campaign, short enough not to look hung.
SQLITE_BUSY_TIMEOUT_S = 30
POSTGRES_CONNECT_TIMEOUT_S = 5


class Database:
    """An open solution database on SQLite or PostgreSQL; get one with `open`."""

    def __init__(self, engine: Engine, where: str) -> None:
        self._engine = engine
        # Writers on SQLite take the write lock up front (BEGIN IMMEDIATE, see `_sqlite_engine`).
        self._write_engine = engine.execution_options(vpo_write=True)
        self.where = where

    @classmethod
    def open(
        cls, target: str | os.PathLike[str], *, create: bool = True, read_only: bool = False
    ) -> Self:
        """Open a file path, `sqlite:///path` or `postgresql://...`; create the tables if new.

        `read_only` (implies not `create`) makes the engine itself refuse writes: SQLite
        files are opened with `mode=ro` and `query_only` (and work on a read-only mount, see
        `_connect_read_only`), PostgreSQL sessions default to read-only transactions. A
        reader never blocks a SQLite campaign's writer (WAL).

        Raises UserError when the database cannot be reached and SchemaError when it is not a
        vpo-evolve database or was written by a newer schema.
        """
        create = create and not read_only
        url = _database_url(target, create=create)
        where = _describe(url)
        engine = _make_engine(url, read_only=read_only)
        try:
            _prepare(engine, where, create=create, read_only=read_only)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, where)

    @classmethod
    def upgrade(cls, target: str | os.PathLike[str]) -> tuple[str, str | None, str]:
        """Migrate an existing database to this release's revision now (what a writable open
        does on its own), for one that read-only users open: (where, the revision it was at,
        the one it is at). Never creates one."""
        url = _database_url(target, create=False)
        where = _describe(url)
        engine = _make_engine(url, read_only=False)
        try:
            with engine.connect() as connection:
                is_new, before = schema.check(connection, where)
            if is_new:
                raise SchemaError(f"{where} is empty, not a vpo-evolve database")
            _prepare(engine, where, create=False)
            with engine.connect() as connection:
                after = migrations.current(connection)
        except DBAPIError as exc:
            sqlite = url.get_backend_name() == "sqlite"
            raise _open_error(exc.orig, where, sqlite, connecting=True) from exc
        finally:
            engine.dispose()
        return where, before, migrations.named(after)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r})"

    def _reading(self) -> AbstractContextManager[Connection]:
        """A connection whose statements share one transaction, rolled back on leaving."""
        return self._engine.connect()

    def _writing(self) -> AbstractContextManager[Connection]:
        """One write transaction, committed on leaving unless an exception leaves it."""
        return self._write_engine.begin()


def _database_url(target: str | os.PathLike[str], *, create: bool) -> URL:
    if isinstance(target, str) and "://" in target:
        try:
            url = make_url(target)
        except ArgumentError as exc:
            raise UserError(f"cannot parse database URL {target!r}: {exc}") from exc
        if url.get_backend_name() in ("postgresql", "postgres"):
            # Bare postgresql:// would pick psycopg2; we depend on psycopg 3.
            if url.drivername in ("postgresql", "postgres"):
                url = url.set(drivername="postgresql+psycopg")
            return url
        if url.get_backend_name() != "sqlite":
            raise UserError(
                f"unsupported database URL {url.drivername}://...; "
                "use a file path, sqlite:///path or postgresql://user@host/dbname"
            )
        path = url.database
    else:
        path = os.fspath(target)
        url = URL.create("sqlite", database=path)
    if path and path != ":memory:" and not path.startswith("file:"):
        # Absolute, so a later chdir cannot point new pool connections at another file.
        file = Path(path).expanduser().absolute()
        if file.is_dir():  # SQLite would answer "disk I/O error" on its first read
            raise UserError(f"{file} is a folder, not a database file; give the .db file's path")
        if not file.exists():
            if not create:
                raise UserError(f"no database at {file}; check the path or start a campaign there")
            _make_folder(file.parent)
        url = url.set(database=str(file))
    return url


def _make_folder(folder: Path) -> None:
    """The folder a new database file goes in, made where missing; a file in its way is a
    one-line error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(
            f"cannot create a database in {folder}: a file is in the way of that folder"
        ) from None


def _describe(url: URL) -> str:
    if url.get_backend_name() == "sqlite":
        return url.database or ":memory:"
    return url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)


def _make_engine(url: URL, *, read_only: bool = False) -> Engine:
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, read_only=read_only)
    if read_only:
        # Added to any server options the URL carries (a search_path, say).
        given = url.query.get("options", "")
        given = " ".join(given) if isinstance(given, tuple) else given
        url = url.update_query_dict(
            {"options": f"{given} -c default_transaction_read_only=on".strip()}
        )
    try:
        return create_engine(
            url,
            json_serializer=dumps_json,
            # A long campaign outlives server restarts and idle-connection reaping.
            pool_pre_ping=True,
            connect_args={
                "connect_timeout": POSTGRES_CONNECT_TIMEOUT_S,
                "application_name": "vpo-evolve",
            },
        )
    except ImportError as exc:
        raise UserError(
            f"PostgreSQL needs the psycopg driver ({exc}); pip install 'vpo-evolve[postgres]'"
        ) from exc


def _sqlite_engine(url: URL, *, read_only: bool = False) -> Engine:
    if url.database in (None, "", ":memory:"):
        # Each connection to :memory: is a separate empty database: share one across threads.
        engine = create_engine(
            url,
            json_serializer=dumps_json,
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
        )
    elif read_only and not url.database.startswith("file:"):
        # Through a SQLite URI with mode=ro, so nothing is created or written: a read-only
        # file or mount works. Decided per connection (see `_connect_read_only`), since a
        # live writer elsewhere can come and go while a dashboard runs.
        path = url.database
        engine = create_engine(
            url, json_serializer=dumps_json, creator=lambda: _connect_read_only(path)
        )
    else:
        engine = create_engine(url, json_serializer=dumps_json)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take BEGIN/COMMIT away from the sqlite3 module, which skips BEGIN before DDL (so table
        # creation would not be one transaction); `_on_begin` issues it instead.
        dbapi_connection.isolation_level = None
        for pragma in (
            "foreign_keys = ON",
            f"busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}",
            # In WAL mode NORMAL cannot corrupt the file; a power cut loses the last commits only.
            "synchronous = NORMAL",
            *(["query_only = ON"] if read_only else []),
        ):
            dbapi_connection.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A deferred transaction that reads and then writes fails at once with SQLITE_BUSY when
        # another writer got in between (busy_timeout cannot help); writers take the lock first.
        immediate = connection.get_execution_options().get("vpo_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A connection that reads `path` and writes nothing, not even a -wal or -shm file.

    `mode=ro` reads a live campaign's WAL through the -shm file, which SQLite creates when it
    is missing and the folder is writable. On a read-only folder or mount without the -shm
    file (the last writer closed cleanly and removed it), SQLite cannot open a WAL database
    that way; the database is then read as `immutable`, which takes no locks and needs no
    -shm: right for a mount nothing writes to. Reading so would skip the commits in a -wal
    file with content, so that case is refused instead.
    """
    uri = f"{Path(path).as_uri()}?mode=ro"
    connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return connection
    except sqlite3.Error as error:
        if getattr(error, "sqlite_errorname", "") != "SQLITE_CANTOPEN":
            return connection  # `_prepare`'s first query meets the error and words it
    connection.close()
    wal = Path(f"{path}-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        raise UserError(
            f"cannot read {path} here: its {wal.name} holds commits that SQLite reads only "
            f"through a {Path(path).name}-shm file, which this read-only folder cannot hold; "
            "copy the database with its -wal file to a writable folder and read it there"
        )
    return sqlite3.connect(f"{uri}&immutable=1", uri=True, check_same_thread=False)


def _prepare(engine: Engine, where: str, *, create: bool, read_only: bool = False) -> None:
    """Check the schema version and revision; create the tables when the database is empty,
    and migrate it to the head revision when it is behind (writers only; see
    `harness.store.migrations`)."""
    sqlite = engine.dialect.name == "sqlite"
    try:
        with engine.connect() as connection:
            is_new, revision = schema.check(connection, where)
        if is_new:
            if not create:
                raise SchemaError(f"{where} is empty, not a vpo-evolve database; create it first")
            schema.create(engine, where)
        elif revision != migrations.head():
            if not read_only:
                schema.migrate(engine, where)
            elif revision is not None:
                # A database from before migrations is read as it is (`harness.store.migrations`).
                raise SchemaError(
                    f"{where} is at {migrations.named(revision)}; this vpo-evolve reads "
                    f"{migrations.named(migrations.head())}: open it once with a command that "
                    "writes (vpo run, vpo worker, vpo train --db) to migrate it"
                )
        # A reader leaves the journal mode alone: switching it writes the file. Every
        # database a campaign wrote is in WAL already, so readers never block its writer.
        if sqlite and not read_only:
            _enable_wal(engine, where)
    except DBAPIError as exc:
        raise _open_error(
            exc.orig, where, sqlite, connecting=isinstance(exc, OperationalError)
        ) from exc
    except sqlite3.Error as exc:
        raise _open_error(exc, where, sqlite, connecting=False) from exc


def _enable_wal(engine: Engine, where: str) -> None:
    # journal_mode persists in the file but cannot change inside a transaction, so it is set on
    # a raw connection, and only once the file is known to be ours: never convert someone
    # else's database before refusing it.
    # Switching takes a lock SQLite does not wait for (busy_timeout does not apply), so a
    # process opening a new file beside another one that is creating it retries.
    raw = engine.raw_connection()
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    try:
        while True:
            try:
                mode = raw.driver_connection.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != "wal":
                    mode = raw.driver_connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        raw.close()
    if mode not in ("wal", "memory"):
        raise UserError(f"cannot switch {where} to WAL mode; it stays in {mode} mode")


def _open_error(
    error: BaseException | None, where: str, sqlite: bool, *, connecting: bool
) -> UserError:
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else type(error).__name__
    if sqlite and getattr(error, "sqlite_errorname", "") == "SQLITE_NOTADB":
        return SchemaError(f"{where} is not a SQLite database; point at a vpo-evolve database")
    if sqlite:
        return UserError(f"cannot open {where}: {message}")
    if connecting:
        return UserError(
            f"cannot use PostgreSQL at {where}: {message}; "
            "check that the server is running and the URL is right"
        )
    if getattr(error, "sqlstate", None) == "42501":  # insufficient_privilege
        # Since PostgreSQL 15 only the database owner may create tables in `public` by default.
        return UserError(
            f"cannot use PostgreSQL at {where}: {message}; "
            "let this role create tables there (GRANT CREATE ON SCHEMA) or use a database it owns"
        )
    return UserError(f"cannot use PostgreSQL at {where}: {message}")
