"""The SSE watches of one server process, served from one shared read of the event table.

Each `GET /v1/events/watch` used to poll the database itself every 250 ms: 3,000 watchers were
12,000 queries a second, and every other request waited behind them. Here one `WatchHub` per
process reads the table once per tick (a `FeedCursor`, which also picks up late commits) and hands
the new events to every watcher. A watcher filters them (kind, object, what its token may see:
`EventScope`) and buffers them in a bounded buffer; the stream that serves it drains that buffer
into the connection. The hub never waits for a watcher: one whose buffer is full (its client reads
slower than events arrive) is closed after what it was given, with an SSE comment telling it to
resume with `Last-Event-ID`, and resuming costs it nothing it could have had.

A watcher that starts behind the hub (`Last-Event-ID` or `?since=` older than the hub's position)
first catches up from the database in pages, with its filters in the query, and joins the shared
feed once it has reached the hub's position (a check and a join in one step of the event loop, so
nothing is lost between the two). A resume from an id that was pruned (retention, server/loop/upkeep.py)
gets what remains, and a comment says so.

Watches are capped per token (`per_token`, keyed by the token's digest) and in total (`total`);
one over a cap is answered 429 with `Retry-After`, before any stream starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from finesched.server.loop.feed import FeedCursor
from finesched.server.store.store import EventScope, Store
from finesched.server.store.views import event_view

log = logging.getLogger("finesched.server")

Row = dict[str, Any]


@dataclass(frozen=True)
class WatchLimits:
    """How many watches a token, and the process, may hold; how far a watcher may fall behind."""

    per_token: int = 10
    total: int = 1000
    #: Events a watcher may have waiting to be sent before it is closed (told to resume).
    buffer: int = 10_000
    poll_s: float = 0.25
    page: int = 1000
    retry_after_s: int = 5


class TooManyWatches(Exception):
    """A cap is reached (HTTP 429 with Retry-After)."""


def sse(row: Row) -> str:
    """One event as Server-Sent Events text: `id`, `event` (the kind) and `data` (the event as JSON)."""
    return f"id: {row['id']}\nevent: {row['kind']}\ndata: {json.dumps(event_view(row))}\n\n"


@dataclass(frozen=True)
class Chunk:
    """Events ready to send: their SSE text (rendered once, shared by every watcher that gets it)."""

    data: bytes
    count: int
    last_id: int


@dataclass(eq=False)
class Watcher:
    """One watch: its filters, the chunks not sent yet, and whether it fell behind."""

    kind: str | None
    object: str | None
    scope: EventScope | None  # None: an admin, who sees everything
    limit: int  # events it may have waiting
    #: The feed's position when it joined: every event after it comes from the shared feed.
    joined_at: int = 0
    pending: deque[Chunk] = field(default_factory=deque)
    waiting: int = 0
    overflowed: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def filters(self) -> tuple[str | None, str | None, EventScope | None]:
        """Watchers with equal filters get the same chunks (filtered and rendered once per batch)."""
        return (self.kind, self.object, self.scope)

    def wants(self, row: Row) -> bool:
        return (
            (not self.kind or row["kind"] == self.kind)
            and (not self.object or row["object"] == self.object)
            and (self.scope is None or self.scope.allows(row))
        )

    def offer(self, chunk: Chunk) -> None:
        """Take a chunk (the hub calls this and never waits): past `limit` waiting events the watcher
        is marked overflowed, and its stream ends after what it already has."""
        if self.overflowed:
            return
        if self.waiting + chunk.count > self.limit:
            self.overflowed = True
        else:
            self.pending.append(chunk)
            self.waiting += chunk.count
        self.ready.set()

    async def next(self, timeout: float) -> list[Chunk]:
        """What arrived since the last call (empty after `timeout` seconds of nothing)."""
        if not self.pending and not self.overflowed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), timeout)
        self.ready.clear()
        out = list(self.pending)
        self.pending.clear()
        self.waiting = 0
        return out


def render(rows: list[Row]) -> Chunk | None:
    return Chunk("".join(map(sse, rows)).encode(), len(rows), rows[-1]["id"]) if rows else None


class WatchHub:
    """The process's one reader of the event table for SSE watches (see the module docstring)."""

    def __init__(self, store: Store, limits: WatchLimits | None = None):
        self.store = store
        self.limits = limits or WatchLimits()
        self.watchers: set[Watcher] = set()
        self.by_token: Counter[str] = Counter()
        self.cursor: FeedCursor | None = None
        #: Every event id up to here was handed to the watchers (set in the event loop, after a fan-out).
        self.published: int | None = None
        self.reads = 0  # reads of the event table by the shared feed (for tests and metrics)
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None

    # Caps ------------------------------------------------------------------------------------------
    @property
    def holding(self) -> int:
        return sum(self.by_token.values())

    def admit(self, token: str) -> None:
        """Count a new watch of `token` (a digest), or refuse it (TooManyWatches) over a cap."""
        if self.holding >= self.limits.total:
            raise TooManyWatches(
                f"the server holds {self.limits.total} event watches, its limit (serve --max-watches); retry later"
            )
        if self.by_token[token] >= self.limits.per_token:
            raise TooManyWatches(
                f"this token holds {self.limits.per_token} event watches, the limit per token "
                "(serve --watch-per-token); close one first"
            )
        self.by_token[token] += 1

    def release(self, token: str) -> None:
        self.by_token[token] -= 1
        if self.by_token[token] <= 0:
            del self.by_token[token]

    # The shared feed ---------------------------------------------------------------------------------
    @property
    def position(self) -> int | None:
        """Every event id up to here was read by the shared feed (None: it is not running): what
        pruning must keep after (server/loop/upkeep.py)."""
        return self.published if self._task is not None else None

    async def start(self) -> None:
        """Start the shared feed (once, at the newest event)."""
        if self._task is not None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._task is not None:
                return
            position = await run_in_threadpool(self.store.last_event_id)
            self.cursor = FeedCursor(position)
            self.published = position
            self._task = asyncio.get_running_loop().create_task(self._run(), name="finesched-watch-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        assert self.cursor is not None
        cursor = self.cursor
        while True:
            try:
                rows = await run_in_threadpool(cursor.read, self.store, self.limits.page)
                self.reads += 1
            except Exception as exc:  # the store is away: watchers wait, the feed tries again
                log.warning("event watch feed: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if rows:
                self.fan_out(rows)
            self.published = cursor.position  # in the same step as the fan-out (see `join`)
            if len(rows) < self.limits.page:
                await asyncio.sleep(self.limits.poll_s)

    def fan_out(self, rows: list[Row]) -> None:
        """Hand `rows` to every watcher: filtered and rendered once per set of equal filters."""
        groups: dict[Any, list[Watcher]] = {}
        for watcher in self.watchers:
            groups.setdefault(watcher.filters, []).append(watcher)
        for watchers in groups.values():
            chunk = render([r for r in rows if watchers[0].wants(r)])
            if chunk is not None:
                for watcher in watchers:
                    watcher.offer(chunk)

    # Watchers ------------------------------------------------------------------------------------------
    async def pruned_after(self, after: int) -> str | None:
        """A note for a watcher resuming after `after` when events after it were pruned (None if not)."""
        oldest = await run_in_threadpool(self.store.first_event_id)
        if oldest > after + 1:
            return f"events {after + 1} to {oldest - 1} were pruned (retention); resuming at {oldest}"
        return None

    async def join(self, watcher: Watcher, after: int | None, send: Callable[[Chunk], Awaitable[None]]) -> None:
        """Bring `watcher` onto the shared feed: at its newest event (`after` None), or after `after`,
        catching up from the database first, a page at a time (each handed to `send`, awaited), with
        the watcher's filters in the query. It joins once it has read up to the feed's position; the
        check and the join happen in one step of the event loop, so no event falls between them."""
        await self.start()
        assert self.published is not None
        position = self.published if after is None else after
        while True:
            target = self.published
            while position < target:
                page = await run_in_threadpool(
                    self.store.event_page, position, self.limits.page, watcher.kind, watcher.object, watcher.scope,
                    target,
                )  # fmt: skip
                chunk = render(page.rows)
                if chunk is not None:
                    await send(chunk)
                position = page.rows[-1]["id"] if page.remaining else target
            if self.published == position:
                watcher.joined_at = position
                self.watchers.add(watcher)
                return
            if position > self.published:  # resumes after an id the feed has not reached: wait for it
                await asyncio.sleep(self.limits.poll_s)

    def leave(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)
