"""The change feed's cursor (late ids are not lost) and a rebuild that outlasts the lease."""

from __future__ import annotations

import time
from typing import Any

from manifests import node, workload
from server_harness import inprocess_server, wait_until

from finesched.server.feed import FeedCursor
from finesched.server.loop import LoopConfig, SchedulerLoop


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
