"""Group commit: concurrent requests that each need a write are written together, one transaction
for all those that arrived while the previous one ran.

The requests wait on the event loop (no worker thread each): the first to arrive while no group is
being written starts a writer task, which hands every request waiting to `commit` in one worker
thread, then the ones that arrived meanwhile, until none is left. A request is answered only after
`commit` returned for its group, so a caller told "done" has its row committed; the group is
written whether or not its callers are still there (a request given up is not half written).

`commit` must settle every request of the group (`Pending.answer` or `Pending.error`); an exception
it raises is the error of each request of that group (nothing of it was committed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from fastapi.concurrency import run_in_threadpool

T = TypeVar("T")


class Pending(Generic[T]):
    """One request waiting in a group: what it asks (`item`) and, once its group is done, its answer or error."""

    __slots__ = ("answer", "done", "error", "item")

    def __init__(self, item: T, done: asyncio.Future[None]) -> None:
        self.item = item
        self.answer: Any = None
        self.error: BaseException | None = None
        self.done = done


class GroupCommit(Generic[T]):
    """Runs `commit` over groups of concurrent requests (see the module docstring). One per event loop."""

    def __init__(self) -> None:
        self._waiting: list[Pending[T]] = []
        self._writer: asyncio.Task[None] | None = None

    async def run(self, item: T, commit: Callable[[list[Pending[T]]], None]) -> Any:
        """`item`'s answer once its group is committed (or its error, raised here)."""
        me = Pending(item, asyncio.get_running_loop().create_future())
        self._waiting.append(me)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write(commit))
        await asyncio.shield(me.done)
        if me.error is not None:
            raise me.error
        return me.answer

    async def _write(self, commit: Callable[[list[Pending[T]]], None]) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                try:
                    await run_in_threadpool(commit, group)
                except BaseException as exc:  # nothing of the group was committed: each of its requests fails
                    for pending in group:
                        if pending.error is None:
                            pending.error = exc
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    for pending in group:
                        if not pending.done.done():
                            pending.done.set_result(None)
        finally:
            self._writer = None
