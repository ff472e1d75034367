"""What a bulk-deleted flood leaves in the server: the loop's tables back to their size, no event
of a deleted object remembered by the correlator, the database connections' caches let go.

Counts and table sizes, not RSS (BENCHMARKS.md has the process's memory before, during and after).
"""

from __future__ import annotations

import sqlite3
import sys
import threading

import pytest
from manifests import node, workload
from server_harness import Api, wait_until
from sqlalchemy import text

from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.queue import SchedulingQueue
from finesched.server.loop import memory
from finesched.server.loop.upkeep import WaitingReasons
from finesched.server.store.correlator import correlator_for
from finesched.server.store.db import BUSY_TIMEOUT_S
from finesched.server.store.store import Store

FLOOD = 3000  # three lists of 1,000 (the most one request takes)


def events_of(api: Api, obj: str, reason: str) -> list[dict]:
    items = api.admin.get("/v1/events", params={"kind": "Workload", "object": obj}).json()["items"]
    return [e for e in items if e["reason"] == reason]


def test_a_deleted_flood_leaves_the_loop_and_the_correlator_as_they_were(api: Api) -> None:
    assert api.admin.post("/v1/nodes", json=node("n1", cpu="4")).status_code == 201
    loop = api.app.state.ctx.loop
    correlator = correlator_for(api.store.engines.writer)
    for start in range(0, FLOOD, 1000):
        batch = [workload(f"a-{i}", cpu="1000") for i in range(start, start + 1000)]  # fits nowhere
        assert api.admin.post("/v1/workloads", json=batch).status_code == 201
    with loop.lock:
        assert len(loop.queued) == FLOOD
        grown = sys.getsizeof(loop.queued)
    assert any(obj.startswith("team-a/") for _, obj in correlator.objects())

    answer = api.admin.delete("/v1/workloads", params={"namespace": "team-a"})
    assert answer.status_code == 200 and answer.json()["deleted"] == FLOOD
    with loop.lock:
        assert not loop.queued and len(loop.scheduler.queue) == 0
        # The tables that held the flood are rebuilt at the size of what is left (nothing).
        assert sys.getsizeof(loop.queued) == sys.getsizeof({}) < grown
        assert sys.getsizeof(loop.scheduler.queue._keys) == sys.getsizeof({})
    assert not any(obj.startswith("team-a/") for _, obj in correlator.objects())
    # The events the loop wrote itself (the Deleted ones) are met by its feed, and the set is new.
    wait_until(lambda: not loop._own_events, what="the feed to pass the flood's events")
    assert sys.getsizeof(loop._own_events) == sys.getsizeof(set())

    # A new workload of a deleted one's name starts its own history: not counted on the old rows.
    assert api.admin.post("/v1/workloads", json=workload(f"a-{FLOOD - 1}", cpu="1000")).status_code == 201
    assert [e["count"] for e in events_of(api, f"team-a/a-{FLOOD - 1}", "Submitted")] == [1, 1]
    assert api.admin.delete(f"/v1/workloads/team-a/a-{FLOOD - 1}").status_code == 200
    assert [e["count"] for e in events_of(api, f"team-a/a-{FLOOD - 1}", "Deleted")] == [1, 1]


def test_events_owned_after_the_feed_passed_them_are_not_kept(api: Api) -> None:
    """A submission or bulk delete marks its events as the loop's own after the commit; the feed may
    have read them first. Those ids are not kept (the feed never meets them again: they would stay
    in the set for good), while ids the feed has not reached yet are."""
    loop = api.app.state.ctx.loop
    assert api.admin.post("/v1/workloads", json=workload("early", cpu="1000")).status_code == 201
    last = api.store.last_event_id()
    wait_until(lambda: loop._feed.position >= last, what="the feed to pass the submission")
    wait_until(lambda: not loop._own_events, what="the submission's own events to be met")
    loop.own([last])  # read by the feed already
    assert last not in loop._own_events
    ahead = loop._feed.position + 10**9  # far beyond anything the feed read
    loop.own([ahead])
    assert ahead in loop._own_events
    with loop._own_lock:
        loop._own_events.discard(ahead)


def test_release_idle_closes_idle_connections_and_the_store_goes_on(store: Store) -> None:
    engines = store.engines
    pools = (engines.writer.pool, engines.reader.pool)
    store.put_tenant("team-a", 1.0, {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant",
                                     "metadata": {"name": "team-a"}}, create_only=True)  # fmt: skip
    assert [t["name"] for t in store.list_tenants()] == ["team-a"]
    assert engines.writer.pool.checkedin() + engines.reader.pool.checkedin() >= 1
    held = store.read()  # in use across the release: left alone
    assert held.execute(text("SELECT 1")).scalar() == 1
    # An idle connection's driver connection, seen from outside (taken after `held`: on PostgreSQL
    # the writer and the readers share one pool, and this one must not be the one held).
    with engines.writer.connect() as conn:
        idle = conn.connection.dbapi_connection
    engines.release_idle()
    assert (engines.writer.pool, engines.reader.pool) == pools  # the same pools: no waiter stranded
    assert held.execute(text("SELECT 2")).scalar() == 2
    held.close()
    if engines.is_sqlite:  # closed: a closed sqlite3 connection refuses any statement
        with pytest.raises(sqlite3.ProgrammingError):
            idle.execute("SELECT 1")  # type: ignore[union-attr]
    else:
        assert idle.closed  # type: ignore[union-attr]
    store.put_tenant("team-b", 1.0, {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant",
                                     "metadata": {"name": "team-b"}}, create_only=True)  # fmt: skip
    assert [t["name"] for t in store.list_tenants()] == ["team-a", "team-b"]


def test_a_writer_waiting_across_release_idle_gets_the_connection(store: Store) -> None:
    """The scheduling loop may be waiting for the writer when a bulk delete releases the idle
    connections: it must get the writer when its holder is done, not wait out the pool timeout."""
    engines = store.engines
    done = threading.Event()

    def write() -> None:
        with store.write() as conn:
            conn.execute(text("SELECT 1"))
        done.set()

    with engines.writer.connect():  # held: the thread below queues for it (SQLite has one writer)
        waiter = threading.Thread(target=write, daemon=True)
        waiter.start()
        waiter.join(0.2)  # give it time to queue (it may not have yet: the test holds either way)
    engines.release_idle()
    assert done.wait(BUSY_TIMEOUT_S / 3), "the waiting writer was stranded by release_idle"


def test_why_deleted_workloads_waited_is_not_kept_once_the_queue_is_empty() -> None:
    queue, reasons = SchedulingQueue(), WaitingReasons()
    keys = [f"team-a/w{i}" for i in range(5)]
    for key in keys:
        namespace, name = key.split("/")
        queue.push(Workload.model_validate({"name": name, "namespace": namespace, "requests": {"cpu": 1}}))
        unit = queue.pop()
        assert unit is not None
        queue.park(unit, FitError(key, 1, {"insufficient cpu": 1}))
    written = reasons.changes(queue, set(keys))
    assert set(written) == set(keys) and set(reasons.written) == set(keys)
    queue.forget(keys)
    assert reasons.changes(queue, set()) == {} and reasons.written == {}


@pytest.mark.skipif(memory.free_held() is None, reason="not glibc (>= 2.33): there is no C heap to ask")
def test_the_trimmer_trims_after_much_was_freed_and_not_otherwise() -> None:
    trimmer = memory.Trimmer(every_s=0.0, threshold=32 * memory.MiB)
    trimmer.check()  # from what the process holds now
    assert not trimmer.check()  # nothing freed since
    # 80 MiB freed in the middle of the heap: each block has a small neighbour that stays (as a
    # flood's objects have other tenants' among them), so the heap's top cannot simply shrink. The
    # blocks first reuse what the heap already holds free (a long test run leaves tens of MiB), so
    # as many more are taken: 80 MiB of them are then freed beyond what was held before.
    blocks = ((memory.free_held() or 0) + 80 * memory.MiB) // 4096
    pairs = [(bytearray(4096), bytearray(600)) for _ in range(blocks)]
    kept = [small for _, small in pairs]
    del pairs
    assert trimmer.check() and trimmer.trims >= 1
    del kept
    trims = trimmer.trims
    assert not trimmer.check() and trimmer.trims == trims


def test_the_trimmer_waits_its_period() -> None:
    freed = [0]
    trimmer = memory.Trimmer(every_s=3600.0, threshold=1, held=lambda: freed[0], give_back=lambda: None)
    freed[0] = 10**9
    assert not trimmer.check() and trimmer.trims == 0  # a period has not passed since it was made
