"""Database engines: SQLite (the embedded default, WAL mode) or PostgreSQL (by URL), schema migrated on open.

SQLite allows one writer at a time; a transaction that starts as a reader and later writes can
fail with "database is locked" instead of waiting. Every write transaction therefore starts with
``BEGIN IMMEDIATE`` (it takes the write lock up front and waits up to the busy timeout), while
reads use a second engine whose transactions start deferred, so readers never wait for writers
(WAL). On PostgreSQL both share one pool; reads run in autocommit mode: under READ COMMITTED each
statement sees its own snapshot inside a transaction too, so a read-only BEGIN ... ROLLBACK would
only add two round trips to every read.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError

from finesched.errors import ValidationError
from finesched.private import DIR_MODE, private_file
from finesched.server.store.migrate import upgrade

BUSY_TIMEOUT_S = 30.0
SUPPORTED = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Engines:
    writer: Engine
    reader: Engine
    url: URL

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    def dispose(self) -> None:
        self.writer.dispose()
        if self.reader.pool is not self.writer.pool:
            self.reader.dispose()

    def release_idle(self) -> None:
        """Close the idle pooled connections (new ones are opened on demand; one in use is closed
        when it is returned) and empty the compiled-statement caches. For after a bulk delete:
        a connection keeps its SQLite page cache and prepared statements (128 per connection in
        Python's sqlite3) and the engine its compiled statements, made while the flood came in and
        spread over the memory it took, which they would keep from the system (BENCHMARKS.md).

        Each idle connection is checked out in turn and invalidated (closed; its pool slot opens a
        new one on its next checkout): the pools stay the same objects. Replacing them (`dispose`)
        stranded a thread already waiting in the old pool's queue, such as the scheduling loop
        waiting for the single SQLite writer: the connection it was woken for could be closed by
        the dispose before it took it, and it then waited out the whole pool timeout."""
        pools = {id(engine.pool): engine for engine in (self.writer, self.reader)}
        for engine in pools.values():
            for _ in range(engine.pool.checkedin()):  # type: ignore[attr-defined]
                with engine.connect() as conn:  # FIFO: each idle connection in turn
                    conn.invalidate()
        self.writer.clear_compiled_cache()
        self.reader.clear_compiled_cache()


def parse_db_url(url: str) -> URL:
    """The SQLAlchemy URL of `url`, or a ValidationError naming what is wrong with it."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValidationError(f"not a database URL ({exc})", path="--db", value=url) from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise ValidationError(
            "unsupported database; use sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB", path="--db", value=url
        )
    if backend == "postgresql" and parsed.get_driver_name() not in ("psycopg",):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ValidationError("an SQLite store needs a file path (sqlite:///PATH)", path="--db", value=url)
    return parsed


def open_engines(url: str, *, migrate: bool = True) -> Engines:
    """Engines for `url`, with the schema brought to the newest migration when `migrate`."""
    parsed = parse_db_url(url)
    if parsed.get_backend_name() == "sqlite":
        assert parsed.database is not None
        _private_sqlite_files(Path(parsed.database).expanduser())
        writer = _sqlite_engine(parsed, immediate=True, pool_size=1)
        engines = Engines(writer, _sqlite_engine(parsed, immediate=False, pool_size=5), parsed)
    else:
        engine = create_engine(parsed, pool_size=10, max_overflow=20, pool_pre_ping=True)
        engines = Engines(engine, engine.execution_options(isolation_level="AUTOCOMMIT"), parsed)
    if migrate:
        upgrade(engines.writer)
    return engines


def _private_sqlite_files(path: Path) -> None:
    """The database (workload specs, token digests) and its WAL files readable by their owner only:
    the file is made 0600 before SQLite opens it (SQLite gives its -wal and -shm files the mode of
    the database), and files an older version left wider are tightened. The directory is made 0700
    when it is created here (an existing one is the user's choice: the data directory of `up` and
    `serve --data` is tightened by them)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            private_file(companion)


def _sqlite_engine(url: URL, *, immediate: bool, pool_size: int) -> Engine:
    """One SQLite engine. The writer gets a single connection: writers queue for it in order
    instead of sleeping in SQLite's busy handler (which backs off in steps of up to 100 ms)."""
    engine = create_engine(
        url,
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=BUSY_TIMEOUT_S,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # transactions are begun explicitly below
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed process loses nothing committed
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine
