"""The control plane's one lock order, and the check that every path keeps it.

Two locks matter, taken in this order and never the other way round:

1. **the loop's lock** (`SchedulerLoop.lock`, a `LoopLock`): guards the scheduler's in-memory state
   (ClusterState, queue, the loop's bookkeeping); held by the loop while it decides and commits, and by
   API handlers that read or change that state (offers, jobs, usage, allocation views);
2. **the store's writer**: a write transaction (`Store.write()`). On SQLite it is the single writer
   connection and the database's write lock (BEGIN IMMEDIATE); on PostgreSQL the row locks the
   transaction takes (the lease row, offers, workloads).

A thread may open a write transaction while it holds the loop's lock (an offer is decided in memory,
written, then committed in memory, all under the loop's lock), but must never wait for the loop's lock
inside a write transaction: with one thread doing the first and another the second, each would wait
for the other until the pool's timeout (30 s), every write of every client freezing meanwhile.

Bookkeeping that must be updated from inside a transaction (the ids of events this process wrote,
so the change feed skips them) uses leaf locks that are held for a few instructions and never while
taking another lock.

`LoopLock` enforces the order: acquiring it (other than re-entering it) inside a write transaction of
this thread raises `LockOrderError` at once, so a path that breaks the order fails its first test
instead of freezing under load.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_local = threading.local()


class LockOrderError(RuntimeError):
    """The loop's lock was requested inside a write transaction (a programming error)."""


def in_write_transaction() -> bool:
    """True while this thread is inside `Store.write()`."""
    return bool(getattr(_local, "writing", 0))


@contextmanager
def writing() -> Iterator[None]:
    """Mark this thread as inside a write transaction (used by `Store.write`)."""
    _local.writing = getattr(_local, "writing", 0) + 1
    try:
        yield
    finally:
        _local.writing -= 1


class LoopLock:
    """A re-entrant lock that refuses to be taken inside a write transaction (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self._owner != me and in_write_transaction():
            raise LockOrderError(
                "the scheduling loop's lock was requested inside a write transaction; "
                "take the loop's lock first, then open the transaction (server/store/locking.py)"
            )
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = me
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()

    def __enter__(self) -> LoopLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
