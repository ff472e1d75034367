"""The change feed's cursor (late ids are not lost), a rebuild that outlasts the lease, and changes of
other writers read in batches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from manifests import node, workload
from server_harness import inprocess_server, store_tenants, wait_until
from sqlalchemy import event

from finesched.server.api.auth import create_token
from finesched.server.app import create_app
from finesched.server.loop.feed import FeedCursor
from finesched.server.loop.loop import LoopConfig, SchedulerLoop
from finesched.server.store.store import Store


class FakeEvents:
    """Events as a sequence hands them out: ids become visible in any order (late commits)."""

    def __init__(self) -> None:
        self.visible: dict[int, dict[str, Any]] = {}

    def commit(self, *ids: int) -> None:
        for i in ids:
            self.visible[i] = {"id": i}

    def events(self, after: int, *, also: Any = (), limit: int = 1000) -> list[dict[str, Any]]:
        wanted = sorted(i for i in self.visible if i > after or i in set(also))
        return [self.visible[i] for i in wanted[:limit]]


def test_cursor_delivers_ids_that_commit_late_once() -> None:
    now = [0.0]
    store, cursor = FakeEvents(), FeedCursor(0, window_s=10, clock=lambda: now[0])
    store.commit(1, 2, 4)  # 3 took its id but has not committed yet
    assert [r["id"] for r in cursor.read(store)] == [1, 2, 4]  # type: ignore[arg-type]
    assert cursor.missing == {3: 0.0} and cursor.position == 4
    store.commit(3, 5)
    assert [r["id"] for r in cursor.read(store)] == [3, 5]  # type: ignore[arg-type]
    assert cursor.missing == {} and cursor.read(store) == []  # type: ignore[arg-type]
    store.commit(7)  # 6 rolled back: looked for during the window only
    cursor.read(store)  # type: ignore[arg-type]
    now[0] = 11.0
    cursor.read(store)  # type: ignore[arg-type]
    assert cursor.missing == {}


def test_a_rebuild_longer_than_the_lease_keeps_leading(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real_rebuild = SchedulerLoop.rebuild

    def slow_rebuild(self: SchedulerLoop) -> None:
        real_rebuild(self)
        time.sleep(1.5)  # longer than the 1 s lease

    monkeypatch.setattr(SchedulerLoop, "rebuild", slow_rebuild)
    with inprocess_server(f"sqlite:///{tmp_path / 'db'}", LoopConfig(idle_wait_s=0.05, lease_ttl_s=1.0)) as api:
        api.admin.post("/v1/nodes", json=node("n1"))
        api.admin.post("/v1/workloads", json=workload("w"))
        api.wait_phase("team-a/w", ("Bound",))
        time.sleep(1.5)
        wait_until(lambda: api.admin.get("/readyz").json()["leader"], what="leadership")
        assert api.admin.get("/metrics").text.count("finesched_leader 1.0") == 1


def test_an_unexpected_error_in_the_loop_rebuilds_and_goes_on(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real_follow = SchedulerLoop._follow_feed
    failures = [1]

    def flaky_follow(self: SchedulerLoop) -> None:
        if failures:
            failures.pop()
            raise RuntimeError("a bug")
        real_follow(self)

    with inprocess_server(f"sqlite:///{tmp_path / 'db'}", LoopConfig(idle_wait_s=0.05)) as api:
        monkeypatch.setattr(SchedulerLoop, "_follow_feed", flaky_follow)
        api.admin.post("/v1/nodes", json=node("n1"))
        api.admin.post("/v1/workloads", json=workload("w"))
        api.wait_phase("team-a/w", ("Bound",))
        assert not failures  # the error happened, and scheduling went on


@contextmanager
def statements_of(store: Store) -> Iterator[list[str]]:
    """The SQL statements `store` sends while the block runs (both engines)."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    writer, reader = store.engines.writer, store.engines.reader
    engines = [writer] if reader.pool is writer.pool else [writer, reader]  # one pool: events seen by both
    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", record)


def test_changes_made_through_another_replica_reach_the_leader_in_batches(db_url: str) -> None:
    leader_store, follower_store = Store.open(db_url), Store.open(db_url)
    store_tenants(leader_store)  # before the rebuild: the feed then carries only the nodes and workloads
    leader = SchedulerLoop(leader_store, LoopConfig(lease_ttl_s=60.0))
    assert leader.lease.try_acquire()
    leader.rebuild()  # the leader, driven by hand: no loop thread
    follower_app = create_app(follower_store, LoopConfig(lease_ttl_s=60.0))
    token = create_token(follower_store, "admin")
    try:
        with TestClient(follower_app, headers={"Authorization": f"Bearer {token}"}) as follower:
            assert not follower.get("/readyz").json()["leader"]
            for n in range(100):  # nodes registered through the (follower's) API
                assert follower.put(f"/v1/nodes/n{n}", json=node(f"n{n}")).status_code == 200
            for b in range(3):  # 300 workloads submitted through the follower
                batch = [workload(f"w{b}-{i}", cpu="100m", memory="1Mi") for i in range(100)]
                assert follower.post("/v1/workloads", json=batch).status_code == 201
            with statements_of(leader_store) as sent:
                leader._follow_feed()
            # One read of the events, one of the nodes, two of the workloads (rows, bindings), plus
            # each read transaction's BEGIN on SQLite: a handful, not one (or two) per changed object.
            reads = [s for s in sent if s.lstrip().upper().startswith("SELECT")]
            assert len(reads) == 4, reads
            assert len(sent) <= 8, sent
            assert leader.scheduler is not None and leader.scheduler.state.n == 100
            assert len(leader.queued) == 300
            leader._schedule_batch()  # and they are bound from there
            assert len(leader_store.bindings()) == leader.config.batch_size
    finally:
        leader.lease.release()
        leader_store.close()
        follower_store.close()
