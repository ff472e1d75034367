"""The queue: priority, weighted DRF between tenants (S4.5), FIFO, quotas, gangs, retry on change."""

from __future__ import annotations

import pytest

from builders import make_node, make_workload
from finesched import ClusterState, Scheduler
from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.tenant import Tenant
from finesched.sched.diagnosis import FitError, QuotaWait
from finesched.sched.queue import SchedulingQueue

GI = 2**30


def placed_by_tenant(results: list) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        if isinstance(r, Binding):
            counts[r.tenant] = counts.get(r.tenant, 0) + 1
    return counts


def test_drf_paper_example() -> None:
    """Ghodsi et al. 2011: 9 CPU, 18 GiB; A asks <1 CPU, 4 GiB>, B asks <3 CPU, 1 GiB> -> A runs 3, B runs 2.

    Dominant shares: A's task is 2/9 memory, B's task 1/3 CPU. Progressive filling:
    A 2/9, B 1/3, A 4/9, B 2/3, A 6/9 = 2/3 -> CPU 3 + 6 = 9 used: nothing else fits.
    """
    state = ClusterState.from_nodes([make_node("n").cpu("9").memory("18Gi").obj()])
    sched = Scheduler(state, tenants=[Tenant(name="a"), Tenant(name="b")])
    work = [make_workload(f"a{i}").tenant("a").req(cpu="1", memory="4Gi").obj() for i in range(10)]
    work += [make_workload(f"b{i}").tenant("b").req(cpu="3", memory="1Gi").obj() for i in range(10)]
    sched.submit(work)
    results = sched.run()
    assert placed_by_tenant(results) == {"a": 3, "b": 2}
    order = [r.workload for r in results if isinstance(r, Binding)]
    assert order == ["default/a0", "default/b0", "default/a1", "default/b1", "default/a2"]
    assert sched.queue.dominant_share("a") == pytest.approx(12 / 18)
    assert sched.queue.dominant_share("b") == pytest.approx(6 / 9)
    assert sum(isinstance(r, FitError) for r in results) == 15


def test_weights_scale_dominant_shares() -> None:
    """A with weight 2 may hold twice B's dominant share before B goes first."""
    state = ClusterState.from_nodes([make_node("n").cpu("12").memory("12Gi").obj()])
    sched = Scheduler(state, tenants=[Tenant(name="a", weight=2), Tenant(name="b", weight=1)])
    sched.submit([make_workload(f"a{i}").tenant("a").req(cpu="1").obj() for i in range(12)])
    sched.submit([make_workload(f"b{i}").tenant("b").req(cpu="1").obj() for i in range(12)])
    assert placed_by_tenant(sched.run()) == {"a": 8, "b": 4}


def test_priority_goes_first_then_fifo_within_tenant() -> None:
    state = ClusterState.from_nodes([make_node("n").cpu("3").obj()])
    sched = Scheduler(state)
    sched.submit(
        [
            make_workload("low-1").req(cpu="1").obj(),
            make_workload("high").req(cpu="1").priority(10).obj(),
            make_workload("low-2").req(cpu="1").obj(),
            make_workload("low-3").req(cpu="1").obj(),
        ]
    )
    results = sched.run()
    assert [r.workload for r in results] == ["default/high", "default/low-1", "default/low-2", "default/low-3"]
    assert isinstance(results[-1], FitError)


def test_over_quota_waits_and_does_not_fail() -> None:
    state = ClusterState.from_nodes([make_node("n").cpu("16").obj()])
    tenants = [Tenant(name="capped", quota={"cpu": "2"}), Tenant(name="free")]
    sched = Scheduler(state, tenants=tenants)
    sched.submit([make_workload(f"c{i}").tenant("capped").req(cpu="1").obj() for i in range(3)])
    sched.submit([make_workload("f").tenant("free").req(cpu="4").obj()])
    results = sched.run()
    assert placed_by_tenant(results) == {"capped": 2, "free": 1}
    waiting = [r for r in results if isinstance(r, QuotaWait)]
    assert [w.workload for w in waiting] == ["default/c2"]
    assert "tenant capped would exceed its quota: cpu (holds 2, asks 1, quota 2)" in waiting[0].message
    # a release brings the tenant under quota: the waiting workload runs on the next run()
    sched.release("default/c0")
    assert [r.workload for r in sched.run() if isinstance(r, Binding)] == ["default/c2"]


def test_unschedulable_retries_after_a_release() -> None:
    state = ClusterState.from_nodes([make_node("n").cpu("4").obj()])
    sched = Scheduler(state)
    sched.submit([make_workload("big").req(cpu="4").obj(), make_workload("next").req(cpu="2").obj()])
    first = sched.run()
    assert isinstance(first[0], Binding) and isinstance(first[1], FitError)
    sched.release("default/big")
    again = sched.run()
    assert [r.workload for r in again if isinstance(r, Binding)] == ["default/next"]


def test_gang_members_wait_for_min_member_then_go_together() -> None:
    state = ClusterState.from_nodes([make_node("n").cpu("8").obj()])
    sched = Scheduler(state)
    sched.submit([make_workload("p0").req(cpu="2").gang("ps", 2).obj()])
    results = sched.run()
    assert len(results) == 1 and "gang ps has 1/2 members" in results[0].message
    sched.submit([make_workload("p1").req(cpu="2").gang("ps", 2).obj()])
    assert sorted(r.workload for r in sched.run() if isinstance(r, Binding)) == ["default/p0", "default/p1"]


def test_duplicate_submission_is_refused() -> None:
    sched = Scheduler(ClusterState.from_nodes([make_node("n").cpu("8").obj()]))
    w = make_workload("w").obj()
    sched.submit([w])
    with pytest.raises(ValidationError, match="already queued"):
        sched.submit([w])


def test_pop_cost_does_not_depend_on_queue_length() -> None:
    """Pop looks at priority levels and tenants only: a long FIFO is not scanned."""
    queue = SchedulingQueue()
    for i in range(20000):
        queue.push(make_workload(f"w{i}").obj())
    calls = 0
    original = queue.dominant_share

    def counting(tenant: str) -> float:
        nonlocal calls
        calls += 1
        return original(tenant)

    queue.dominant_share = counting  # type: ignore[method-assign]
    for _ in range(100):
        assert queue.pop() is not None
    assert calls <= 100  # one tenant: one share computation per pop at most


def test_tenant_usage_follows_forced_node_removal_and_restore() -> None:
    """Quota and DRF read what tenants hold from the state, so nothing drifts when bindings vanish."""
    state = ClusterState.from_nodes([make_node("n1").cpu("4").memory("8Gi").obj()])
    sched = Scheduler(state, tenants=[Tenant(name="a", quota={"cpu": "2"})])
    x = sched.schedule_one(make_workload("x").req(cpu="2").tenant("a").obj())
    assert sched.queue.usage("a")["cpu"] == 2000
    snap = state.snapshot()
    state.remove_node("n1", force=True)
    assert sched.queue.usage("a").get("cpu", 0) == 0
    state.add_node(make_node("n2").cpu("4").memory("8Gi").obj())
    sched.submit([make_workload("y").req(cpu="2").tenant("a").obj()])
    (placed,) = sched.run()
    assert isinstance(placed, Binding) and placed.node == "n2"  # not held back by a stale quota charge
    state.restore(snap)  # back to x alone on n1
    assert set(state.bindings) == {x.workload} and sched.queue.usage("a")["cpu"] == 2000


def test_tenant_usage_counts_a_binding_once_when_its_node_is_updated() -> None:
    state = ClusterState.from_nodes([make_node("n1").cpu("4").memory("8Gi").obj()])
    sched = Scheduler(state, tenants=[Tenant(name="a")])
    sched.schedule_one(make_workload("x").req(cpu="2").tenant("a").obj())
    state.update_node(make_node("n1").cpu("8").memory("8Gi").obj())  # replays x into every extra
    assert sched.queue.usage("a")["cpu"] == 2000


def test_tenant_usage_counts_devices_granted_by_the_annotation_alone() -> None:
    from finesched.model.device_allocated import DEVICE_ALLOCATED

    node = make_node("n1").cpu("8").memory("16Gi").gpus(2, memory="80Gi").obj()
    state = ClusterState.from_nodes([node])
    sched = Scheduler(state, tenants=[Tenant(name="a")])
    resources = '{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}'
    grant = '{"gpu":[{"minor":0,"resources":' + resources + "}]}"
    state.assume(Binding(workload="A/koord", node="n1", tenant="a", annotations={DEVICE_ALLOCATED: grant}))
    assert sched.queue.usage("a") == {"gpu-core": 100, "gpu-memory-ratio": 100}
