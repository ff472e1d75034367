"""SQLite's writer is given in arrival order (server/store/db.py `WriterGate`): a thread that writes
back to back cannot keep a waiting writer (the scheduling loop's upkeep) from its turn, however
often it comes back; a writer that waits too long gets the pool's TimeoutError and leaves the line."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_harness import wait_until
from sqlalchemy import text
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from finesched.server.store.db import WriterGate
from finesched.server.store.store import Store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(f"sqlite:///{tmp_path / 'fs.db'}")
    with store.write() as conn:
        conn.execute(text("CREATE TABLE turns (who TEXT)"))
    yield store
    store.close()


def queue_writer(store: Store, who: str, threads: list[threading.Thread]) -> None:
    """Start a thread that writes `who` into the turns table, once it is in the writers' line."""
    gate = store.engines.gate
    assert gate is not None
    before = gate.waiting

    def write() -> None:
        with store.write() as conn:
            conn.execute(text("INSERT INTO turns VALUES (:who)"), {"who": who})

    thread = threading.Thread(target=write, name=who)
    thread.start()
    threads.append(thread)
    wait_until(lambda: gate.waiting > before, what=f"{who} to wait for the writer")


def turns(store: Store) -> list[str]:
    with store.read() as conn:
        return [row.who for row in conn.execute(text("SELECT who FROM turns ORDER BY rowid"))]


@settings(max_examples=10, deadline=None)
@given(waiters=st.integers(1, 5), comebacks=st.integers(1, 20))
def test_a_writer_that_comes_back_at_once_waits_behind_those_already_waiting(
    tmp_path_factory: pytest.TempPathFactory, waiters: int, comebacks: int
) -> None:
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('gate') / 'fs.db'}")
    try:
        with store.write() as conn:
            conn.execute(text("CREATE TABLE turns (who TEXT)"))
        threads: list[threading.Thread] = []
        with store.write() as conn:  # the back-to-back writer's first chunk, while the others line up
            conn.execute(text("INSERT INTO turns VALUES ('flood')"))
            for i in range(waiters):
                queue_writer(store, f"w{i}", threads)
        for _ in range(comebacks):  # the next chunks, asked for the moment the last one committed
            with store.write() as conn:
                conn.execute(text("INSERT INTO turns VALUES ('flood')"))
        for thread in threads:
            thread.join()
        # Every waiter had its turn before the flood's second chunk, in the order they came.
        assert turns(store) == ["flood", *(f"w{i}" for i in range(waiters)), *["flood"] * comebacks]
    finally:
        store.close()


def test_writers_get_their_turns_in_arrival_order(sqlite_store: Store) -> None:
    threads: list[threading.Thread] = []
    with sqlite_store.write():
        for who in ("loop", "api-1", "api-2", "api-3"):
            queue_writer(sqlite_store, who, threads)
    for thread in threads:
        thread.join()
    assert turns(sqlite_store) == ["loop", "api-1", "api-2", "api-3"]


def test_a_nested_write_of_the_holder_passes_the_gate() -> None:
    gate = WriterGate()
    with gate.turn(), gate.turn():
        assert gate.waiting == 0
    with gate.turn():  # released fully: free again
        pass


def test_a_writer_that_waits_too_long_gets_the_pools_error_and_leaves_the_line() -> None:
    gate = WriterGate(timeout_s=0.05)
    failures: list[BaseException] = []
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with gate.turn():
            held.set()
            done.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(30)
    try:
        with gate.turn():
            pass
    except PoolTimeoutError as exc:
        failures.append(exc)
    assert gate.waiting == 0  # the one that gave up is no longer in the line
    done.set()
    thread.join()
    assert len(failures) == 1 and "not free within 0.05 s" in str(failures[0])
    with gate.turn():  # the holder's release found no waiter and freed the gate
        pass


def test_the_turn_is_released_only_by_its_holder() -> None:
    gate = WriterGate()
    with pytest.raises(AssertionError, match="released by its holder"):
        gate.release()
