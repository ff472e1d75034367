"""server/what_if.py without a server: the dry run's fork leaves the live state untouched, decides what
the live scheduler then decides, reuses its snapshot only while nothing changed, and goes one at a time."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from builders import make_node
from finesched.model.binding import Binding
from finesched.model.workload import Workload
from finesched.sched.scheduler import Scheduler
from finesched.server.what_if import Busy, NotLeader, WhatIf
from finesched.state.cluster import ClusterState


def loop_of(scheduler: Scheduler | None) -> SimpleNamespace:
    return SimpleNamespace(lock=threading.RLock(), scheduler=scheduler, queued={})


def live_cluster() -> Scheduler:
    """3 nodes of 8 CPUs and 2 GPUs; a/held takes 6 CPUs and a GPU. Commits are the driver's (as in
    the server: bindings are assumed, then committed once written)."""
    nodes = [make_node(f"n{i}").cpu("8").memory("32Gi").gpus(2, memory="16Gi").obj() for i in range(3)]
    scheduler = Scheduler(ClusterState.from_nodes(nodes), "default", auto_commit=False)
    scheduler.schedule_one(Workload(name="held", namespace="a", requests={"cpu": "6", "nvidia.com/gpu": 1}))
    scheduler.state.commit("a/held")
    return scheduler


def asks(name: str, **requests: object) -> Workload:
    return Workload(name=name, namespace="a", requests=requests)


def test_the_dry_run_decides_what_the_live_scheduler_then_does() -> None:
    live = live_cluster()
    before = (live.state.version, dict(live.state.bindings))
    planned = [
        asks("p1", cpu="4", **{"gpu-core": 50, "gpu-memory-ratio": 50}),
        asks("p2", cpu="8"),
        asks("p3", cpu="9"),
    ]
    answer = WhatIf(loop_of(live)).plan(planned)  # type: ignore[arg-type]
    assert (live.state.version, dict(live.state.bindings)) == before  # the live state is untouched
    live.state.check_invariants()
    by_name = {r["workload"]: r for r in answer.doc["results"]}
    assert by_name["a/p3"]["node"] is None and by_name["a/p3"]["reasons"] == {"insufficient cpu": 3}
    live.submit(planned)
    for result in live.run():
        record = by_name[result.workload]
        if isinstance(result, Binding):
            devices = {k: [g.minor for g in gs] for k, gs in result.devices.items()}
            planned_devices = {k: [g["minor"] for g in gs] for k, gs in record.get("devices", {}).items()}
            assert (result.node, devices) == (record["node"], planned_devices)
        else:
            assert record["node"] is None
    assert answer.nodes == 3 and answer.pending == 0


def test_the_snapshot_is_reused_only_while_nothing_changed() -> None:
    live = live_cluster()
    what_if = WhatIf(loop_of(live))  # type: ignore[arg-type]
    first = what_if._snapshot(live.state)
    assert what_if._snapshot(live.state) is first
    live.schedule_one(asks("more", cpu="1"))
    second = what_if._snapshot(live.state)
    assert second is not first and "a/more" in second.bindings
    live.state.commit("a/more")  # committed or not decides who may be a preemption victim
    assert what_if._snapshot(live.state) is not second


def test_one_dry_run_at_a_time_and_only_on_the_leader() -> None:
    with pytest.raises(NotLeader):
        WhatIf(loop_of(None)).plan([asks("x", cpu="1")])  # type: ignore[arg-type]
    what_if = WhatIf(loop_of(live_cluster()), busy_timeout_s=0.05)  # type: ignore[arg-type]
    with what_if._lock, pytest.raises(Busy):
        what_if.plan([asks("x", cpu="1")])
    assert what_if.plan([asks("x", cpu="1")]).doc["summary"]["placed"] == 1  # free again
