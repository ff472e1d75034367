"""Database engines: SQLite (the embedded default, WAL mode) or PostgreSQL (by URL), schema migrated on open.

SQLite allows one writer at a time; a transaction that starts as a reader and later writes can
fail with "database is locked" instead of waiting. Every write transaction therefore starts with
``BEGIN IMMEDIATE`` (it takes the write lock up front and waits up to the busy timeout), while
reads use a second engine whose transactions start deferred, so readers never wait for writers
(WAL). Writers take their turn at the single writer connection in arrival order (`WriterGate`).
On PostgreSQL both share one pool; reads run in autocommit mode: under READ COMMITTED each
statement sees its own snapshot inside a transaction too, so a read-only BEGIN ... ROLLBACK would
only add two round trips to every read.
"""

from __future__ import annotations

import select
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from finesched.errors import ValidationError
from finesched.private import DIR_MODE, private_file
from finesched.server.store.migrate import upgrade

BUSY_TIMEOUT_S = 30.0
#: A pooled PostgreSQL connection idle this long is pinged at its next checkout (`_postgres_engine`).
PING_IDLE_S = 1.0
SUPPORTED = ("sqlite", "postgresql")


class WriterGate:
    """The turn at SQLite's single writer connection, given in arrival order.

    The connection pool alone is not fair: a returned connection wakes the longest waiter, but a
    thread that asks before the woken one runs takes it first, and the woken one waits again at
    the back. A thread that writes back to back (a bulk delete's chunks, one tenant's flood of
    requests) thus kept the scheduling loop from the writer for seconds, every write of the
    flood overtaking it (BENCHMARKS.md: over a thousand on a loaded machine). Here the turn is
    handed straight to the first waiter when the holder leaves, so a writer waits only for the
    writers that came before it. Re-entrant (a nested write of the same thread passes). A waiter
    that does not get its turn within `timeout_s` gets the pool's own TimeoutError.
    """

    def __init__(self, timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._mutex = threading.Lock()
        self._waiters: deque[tuple[int, threading.Lock]] = deque()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._mutex:
            if self._owner == me:
                self._depth += 1
                return
            if self._owner is None:  # free, so nobody waits either: the turn passes on at release
                self._owner, self._depth = me, 1
                return
            turn = threading.Lock()
            turn.acquire()
            entry = (me, turn)
            self._waiters.append(entry)
        if turn.acquire(timeout=self.timeout_s):
            return  # `release` made this thread the owner before letting it go
        with self._mutex:
            if self._owner == me:  # handed over just as the wait ran out
                return
            self._waiters.remove(entry)
        raise PoolTimeoutError(f"the database's writer was not free within {self.timeout_s:g} s")

    def release(self) -> None:
        with self._mutex:
            assert self._owner == threading.get_ident(), "the writer's turn is released by its holder"
            self._depth -= 1
            if self._depth:
                return
            if self._waiters:
                self._owner, turn = self._waiters.popleft()
                self._depth = 1
                turn.release()
            else:
                self._owner = None

    @property
    def waiting(self) -> int:
        """How many threads wait for their turn now."""
        with self._mutex:
            return len(self._waiters)

    @contextmanager
    def turn(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()


@dataclass(frozen=True)
class Engines:
    writer: Engine
    reader: Engine
    url: URL
    #: SQLite's: the order of turns at its one writer connection. PostgreSQL's pool has a
    #: connection for each of many writers (row locks order them), so it has none.
    gate: WriterGate | None = field(default=None, compare=False)

    def write_turn(self) -> AbstractContextManager[None]:
        """Held around a write transaction (`Store.write`): this thread's turn at the writer."""
        return self.gate.turn() if self.gate is not None else nullcontext()

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    def dispose(self) -> None:
        self.writer.dispose()
        if self.reader.pool is not self.writer.pool:
            self.reader.dispose()

    def release_idle(self) -> None:
        """Close the idle pooled connections (new ones are opened on demand; one in use keeps its
        caches) and empty the compiled-statement caches. For after a bulk delete: a connection keeps
        its SQLite page cache and prepared statements (128 per connection in Python's sqlite3) and
        the engine its compiled statements, made while the flood came in and spread over the memory
        it took, which they would keep from the system (BENCHMARKS.md).

        Each idle connection is checked out in turn and invalidated (closed; its pool slot opens a
        new one on its next checkout): the pools stay the same objects. Replacing them (`dispose`)
        stranded a thread already waiting in the old pool's queue, such as the scheduling loop
        waiting for the single SQLite writer: the connection it was woken for could be closed by
        the dispose before it took it, and it then waited out the whole pool timeout."""
        pools = {id(engine.pool): engine for engine in (self.writer, self.reader)}
        for engine in pools.values():
            with self.write_turn() if engine is self.writer else nullcontext():  # the writer in its turn
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
        engines = Engines(writer, _sqlite_engine(parsed, immediate=False, pool_size=5), parsed, WriterGate())
    else:
        engine = _postgres_engine(parsed)
        engines = Engines(engine, engine.execution_options(isolation_level="AUTOCOMMIT"), parsed)
    if migrate:
        upgrade(engines.writer)
    return engines


def _postgres_engine(url: URL) -> Engine:
    """The PostgreSQL engine: a pool whose connections are checked at checkout without a round trip.

    SQLAlchemy's `pool_pre_ping` sends a query on every checkout: about a third of a submission
    group's wall time was those pings (issue 30). A server that ends a
    connection (pg_terminate_backend, a restart, idle_session_timeout) first tells its client
    (an ErrorResponse, then the socket's end), so a pooled connection that went away has something
    to read on its idle socket; only such a connection, or one idle for PING_IDLE_S (the server
    may have gone silently), is pinged, and one that fails the ping is replaced before it is
    handed out (the pool's DisconnectionError protocol). A disconnect found by a statement
    instead still invalidates the pool's older connections (SQLAlchemy's own handling)."""
    engine = create_engine(url, pool_size=10, max_overflow=20)

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is not None and time.monotonic() - idle_since < PING_IDLE_S and _quiet(dbapi_connection):
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the pool closes it and hands out a new one
            raise DisconnectionError(f"a pooled connection was closed by the server: {exc}") from exc

    return engine


def _quiet(dbapi_connection: Any) -> bool:
    """Whether an idle psycopg connection is usable as far as its client can tell without asking the
    server: not closed or broken, and nothing sent to it while idle (a server ending the connection
    sends an error, then closes the socket: both make it readable)."""
    if dbapi_connection.closed or dbapi_connection.broken:
        return False
    try:
        fd = dbapi_connection.fileno()
    except Exception:  # closed meanwhile
        return False
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    return not select.select([fd], [], [fd], 0)[0]


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
    (`WriterGate`) instead of sleeping in SQLite's busy handler (which backs off in steps of up to 100 ms)."""
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
