"""SSE watches served from one shared feed: many real watchers each get every event they may see, in
order, while the database is read once per tick whatever their number; caps answer 429; a watcher
that falls behind is told where to resume; a resume catches up from the database, pruned or not."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
import pytest
from manifests import workload
from server_harness import Api, inprocess_server, wait_until
from sqlalchemy import event

from finesched.server.api.watch_hub import WatchLimits
from finesched.server.loop.loop import LoopConfig
from finesched.server.loop.upkeep import EventPruner
from finesched.server.store.store import now

pytestmark = pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)


@contextmanager
def server(db_url: str, **limits: Any) -> Iterator[Api]:
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05), watch=WatchLimits(**limits)) as api:
        yield api


class Stream:
    """What one watcher received: event ids and bodies, and comment lines."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.comments: list[str] = []
        self.status = 0
        self.ended = False


async def watch(client: httpx.AsyncClient, token: str, out: Stream, stop: asyncio.Event, **params: Any) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    if "last_event_id" in params:
        headers["Last-Event-ID"] = str(params.pop("last_event_id"))
    async with client.stream("GET", "/v1/events/watch", params=params, headers=headers) as response:
        out.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            out.comments.append(response.text)
            out.ended = True
            return

        async def read() -> None:
            async for line in response.aiter_lines():
                if line.startswith(": "):
                    out.comments.append(line[2:])
                elif line.startswith("data: "):
                    out.events.append(json.loads(line[6:]))

        reading = asyncio.ensure_future(read())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (reading, stopping):
            task.cancel()
    out.ended = True


@contextmanager
def watching(api: Api, specs: list[tuple[str, dict[str, Any]]]) -> Iterator[tuple[list[Stream], threading.Event]]:
    """Run one watcher per (token, params) in an asyncio loop in a thread, until the block ends."""
    streams = [Stream() for _ in specs]
    done = threading.Event()
    stop_flag: list[asyncio.Event] = []

    async def main() -> None:
        stop = asyncio.Event()
        stop_flag.append(stop)
        limits = httpx.Limits(max_connections=len(specs) + 10)
        async with httpx.AsyncClient(base_url=api.base, timeout=httpx.Timeout(60), limits=limits) as client:
            await asyncio.gather(*(watch(client, t, s, stop, **p) for (t, p), s in zip(specs, streams, strict=True)))

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), done.set()), daemon=True)
    thread.start()
    try:
        yield streams, done
    finally:
        wait_until(lambda: bool(stop_flag), what="the watch loop")
        loop.call_soon_threadsafe(stop_flag[0].set)
        thread.join(timeout=30)
        loop.close()


def test_many_watchers_one_read_per_tick(db_url: str) -> None:
    with server(db_url, per_token=200, total=300) as api:
        admin, tenant = api.token("admin"), api.token("tenant", tenant="team-a")
        hub = api.app.state.watch_hub
        specs = [(admin, {})] * 100 + [(tenant, {})] * 100
        with watching(api, specs) as (streams, _):
            wait_until(lambda: len(hub.watchers) == 200, timeout=60, what="200 watchers on the shared feed")
            start = hub.published
            reads: list[str] = []

            def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
                ours = threading.current_thread() is threading.main_thread()  # this test's own reads
                if "FROM events" in statement and threading.current_thread().name != "finesched-scheduler" and not ours:
                    reads.append(statement)

            engine = api.store.engines.reader
            event.listen(engine, "before_cursor_execute", count)
            hub_reads = hub.reads
            for i in range(10):
                batch = [workload(f"w{i}-{j}", ns, cpu="1000") for j in range(3) for ns in ("team-a", "team-b")]
                assert api.admin.post("/v1/workloads", json=batch).status_code == 201
            last = api.store.last_event_id()
            wait_until(lambda: all(s.events and s.events[-1]["id"] >= last for s in streams[:100]), timeout=60,
                       what="every admin watcher to get the last event")  # fmt: skip
            event.remove(engine, "before_cursor_execute", count)
            window_reads = hub.reads - hub_reads
            tenant_last = api.admin.get("/v1/events", params={"since": start, "limit": 5000}).json()["items"]
            mine_last = max(e["id"] for e in tenant_last if e["object"].startswith("team-a/"))
            wait_until(lambda: all(s.events and s.events[-1]["id"] >= mine_last for s in streams[100:]), timeout=60,
                       what="every tenant watcher to get its last event")  # fmt: skip
        expected = api.admin.get("/v1/events", params={"since": start, "limit": 5000}).json()["items"]
        expected_ids = [e["id"] for e in expected if e["id"] <= last]
        tenant_client = api.client(tenant)
        mine = tenant_client.get("/v1/events", params={"since": start, "limit": 5000}).json()["items"]
        mine_ids = [e["id"] for e in mine if e["id"] <= mine_last]
        assert len(mine_ids) >= 30 and all(e["object"].startswith("team-a/") for e in mine)
        for stream in streams[:100]:
            assert [e["id"] for e in stream.events if e["id"] <= last] == expected_ids
        for stream in streams[100:]:
            got = [e for e in stream.events if e["id"] <= mine_last]
            assert [e["id"] for e in got] == mine_ids
            assert all(e["kind"] != "Workload" or e["object"].startswith("team-a/") for e in stream.events)
        assert len(reads) == window_reads  # only the shared feed read the table: not one read per watcher


def test_caps_per_token_and_in_total(db_url: str) -> None:
    with server(db_url, per_token=2, total=3) as api:
        first, second = api.token("admin"), api.token("tenant", tenant="team-a")
        with watching(api, [(first, {}), (first, {})]) as (_streams, _):
            wait_until(lambda: len(api.app.state.watch_hub.watchers) == 2, what="two watches")
            third = httpx.get(f"{api.base}/v1/events/watch", headers={"Authorization": f"Bearer {first}"}, timeout=10)
            assert third.status_code == 429 and third.headers["Retry-After"] == "5"
            assert "limit per token" in third.json()["detail"] and "--watch-per-token" in third.json()["detail"]
            with watching(api, [(second, {})]) as (_others, _):
                wait_until(lambda: len(api.app.state.watch_hub.watchers) == 3, what="three watches")
                fourth = httpx.get(
                    f"{api.base}/v1/events/watch", headers={"Authorization": f"Bearer {second}"}, timeout=10
                )
                assert fourth.status_code == 429 and "--max-watches" in fourth.json()["detail"]
        wait_until(lambda: api.app.state.watch_hub.holding == 0, what="every watch given back")


def test_a_watcher_that_falls_behind_is_told_where_to_resume(db_url: str) -> None:
    with server(db_url, buffer=5) as api:
        token = api.token("admin")
        hub = api.app.state.watch_hub
        with watching(api, [(token, {"kind": "Workload"})]) as (streams, _):
            wait_until(lambda: len(hub.watchers) == 1, what="the watcher")
            before = api.store.last_event_id()
            batch = [workload(f"w{i}", cpu="1000") for i in range(20)]  # 20 events at once: over its buffer
            assert api.admin.post("/v1/workloads", json=batch).status_code == 201
            wait_until(lambda: streams[0].ended, timeout=30, what="the watch to be closed")
        (stream,) = streams
        note = stream.comments[-1]
        assert "fell more than 5 events behind" in note and "resume with Last-Event-ID: " in note
        resume_at = int(note.rsplit(" ", 1)[1])
        assert resume_at >= before and all(e["id"] <= resume_at for e in stream.events)
        with watching(api, [(token, {"kind": "Workload", "last_event_id": resume_at})]) as (again, _):
            wait_until(lambda: len(again[0].events) >= 20 - len(stream.events), timeout=30, what="the catch-up")
        got = [e["object"] for e in stream.events + again[0].events if e["reason"] == "Submitted"]
        assert got == [f"team-a/w{i}" for i in range(20)]


def test_resume_catches_up_from_the_database_then_follows(db_url: str) -> None:
    with server(db_url, page=7) as api:  # pages of 7: the catch-up reads several
        for i in range(12):
            assert api.admin.post("/v1/workloads", json=workload(f"old{i}", cpu="1000")).status_code == 201
        listed = api.admin.get("/v1/events", params={"limit": 5000}).json()["items"]
        cut = listed[4]["id"]
        with api.store.write() as conn:  # as retention would: the oldest events are gone
            from finesched.server.store import schema as t

            conn.execute(t.events.delete().where(t.events.c.id <= cut))
        tenant = api.token("tenant", tenant="team-a")
        with watching(api, [(tenant, {"since": 0, "kind": "Workload"})]) as (streams, _):
            wait_until(lambda: any(e["object"] == "team-a/old11" for e in streams[0].events), timeout=30,
                       what="the catch-up")  # fmt: skip
            api.admin.post("/v1/workloads", json=workload("new", cpu="1000"))
            wait_until(lambda: any(e["object"] == "team-a/new" for e in streams[0].events), timeout=30,
                       what="the live event")  # fmt: skip
        (stream,) = streams
        assert any("were pruned (retention)" in c for c in stream.comments)
        ids = [e["id"] for e in stream.events]
        assert ids == sorted(set(ids)) and ids[0] > cut
        expected = [e["id"] for e in listed if e["id"] > cut and e["kind"] == "Workload"]
        assert ids[: len(expected)] == expected


def test_pruning_keeps_what_the_feeds_have_not_read(db_url: str) -> None:
    config = LoopConfig(idle_wait_s=0.05, event_ttl_s=0.0, prune_every_s=3600)
    with inprocess_server(db_url, config) as api:
        loop = api.app.state.ctx.loop
        for i in range(5):
            api.admin.post("/v1/workloads", json=workload(f"w{i}", cpu="1000"))
        wait_until(lambda: loop._feed.position >= api.store.last_event_id(), what="the feed to read them")
        hub_position = [api.store.first_event_id() + 3]
        pruner = EventPruner(api.store, 0.0, every_s=0.0, readers=[lambda: hub_position[0]])  # a reader behind
        ids = [e["id"] for e in api.admin.get("/v1/events", params={"limit": 1000}).json()["items"]]
        removed = pruner.check(loop._feed.position)
        assert removed == len([i for i in ids if i <= hub_position[0]]) >= 3
        assert api.store.first_event_id() == min(i for i in ids if i > hub_position[0])
        hub_position[0] = 10**9
        with api.store.write() as conn:  # a recent event stays whatever the readers
            from finesched.server.store import schema as t

            conn.execute(t.events.insert(), {"time": now() + timedelta(hours=1), "kind": "Node", "object": "x",
                                             "reason": "Test", "message": "", "count": 1})  # fmt: skip
        wait_until(lambda: loop._feed.position >= api.store.last_event_id(), what="the feed to read it")
        pruner.check(loop._feed.position)
        remaining = api.admin.get("/v1/events", params={"limit": 100}).json()["items"]
        assert [e["reason"] for e in remaining] == ["Test"]
        api.admin.post("/v1/workloads", json=workload("after", cpu="1000"))  # the feed goes on
        assert api.wait_phase("team-a/after", ("Pending",))["status"]["phase"] == "Pending"
        wait_until(lambda: "team-a/after" in loop.queued, what="the loop to queue it")
