"""A tenant's line under its quota: a unit its quota does not admit waits aside without holding the
tenant's other work (Kueue's BestEffortFIFO); a release or a raised cap lets it back in order; a
demand no release can ever admit waits with that reason; where a not-yet-tried workload stands
("queued: N ahead of it in tenant T") is read from the queue without walking it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched import ClusterState, Scheduler
from finesched.model.binding import Binding
from finesched.model.tenant import Tenant
from finesched.sched.queue import SchedulingQueue

BIG = make_node("n").cpu("1000").memory("4000Gi").obj()  # room for anything asked below: only quotas hold work


def capped(max_cpu: str = "4", **spec: object) -> Tenant:
    return Tenant(name="tb", max={"cpu": max_cpu}, **spec)  # type: ignore[arg-type]


def work(name: str, cpu: str, tenant: str = "tb", priority: int = 0) -> object:
    return make_workload(name, tenant).tenant(tenant).req(cpu=cpu).priority(priority).obj()


def bound(results: list) -> list[str]:
    return [r.workload for r in results if isinstance(r, Binding)]


def test_a_unit_over_the_max_does_not_hold_the_tenants_later_work() -> None:
    sched = Scheduler(ClusterState.from_nodes([BIG]), tenants=[capped()])
    sched.submit([work("hold", "3"), work("mid", "2"), work("small", "1"), work("later", "1")])
    assert bound(sched.run()) == ["tb/hold", "tb/small"]  # mid waits aside; small is not behind it
    reasons = {w.key: sched.queue.reason(w.key) for unit, _ in sched.queue.waiting() for w in unit.workloads}
    assert reasons == {
        "tb/mid": "waiting: tenant tb would exceed its max: cpu (holds 4, asks 2, max 4)",
        "tb/later": "waiting: tenant tb would exceed its max: cpu (holds 4, asks 1, max 4)",
    }
    sched.release("tb/hold")  # 3 cpu given back: mid (older) first, then later, in order
    assert bound(sched.run()) == ["tb/mid", "tb/later"]


def test_a_demand_over_a_cap_by_itself_waits_with_that_reason_and_blocks_nothing() -> None:
    parent = Tenant(name="org", max={"cpu": "6"})
    sched = Scheduler(ClusterState.from_nodes([BIG]), tenants=[parent, capped("8", parent="org")])
    sched.submit([work("huge", "7"), work("a", "2"), work("b", "2")])
    assert bound(sched.run()) == ["tb/a", "tb/b"]
    assert sched.queue.reason("tb/huge") == (
        "waiting: exceeded quota: tenant org (an ancestor of tb), requested: cpu=7, max: cpu=6: "
        "no release admits it; it waits until the cap is raised"
    )
    sched.queue.set_tenant(Tenant(name="org", max={"cpu": "12"}))  # an admin raises the cap
    assert bound(sched.run()) == []  # 4 held + 7 > tb's own max of 8: now it only waits for room
    assert sched.queue.reason("tb/huge") == "waiting: tenant tb would exceed its max: cpu (holds 4, asks 7, max 8)"
    sched.release("tb/a")
    sched.release("tb/b")
    assert bound(sched.run()) == ["tb/huge"]


def test_a_shape_set_aside_follows_its_first_unit_back() -> None:
    """A release that makes room for several units of one shape lets all of them in (each taken unit
    lets the next of its shape follow), not one per release."""
    sched = Scheduler(ClusterState.from_nodes([BIG]), tenants=[capped()])
    sched.submit([work("hold", "4"), *(work(f"s{i}", "1") for i in range(6))])
    assert bound(sched.run()) == ["tb/hold"]
    sched.release("tb/hold")
    assert bound(sched.run()) == ["tb/s0", "tb/s1", "tb/s2", "tb/s3"]
    assert {w.key for unit, why in sched.queue.waiting() if why == "quota" for w in unit.workloads} == {
        "tb/s4",
        "tb/s5",
    }


def test_queued_reason_counts_the_units_ahead_in_the_tenant() -> None:
    queue = SchedulingQueue()
    for i in range(4):
        queue.push(work(f"w{i}", "1", tenant="ta"))
    queue.push(work("other", "1", tenant="tc"))
    queue.push(work("urgent", "1", tenant="ta", priority=5))
    assert [queue.reason(f"ta/w{i}") for i in range(4)] == [
        f"queued: {i + 1} ahead of it in tenant ta" for i in range(4)
    ]
    assert queue.reason("ta/urgent") == "queued: 0 ahead of it in tenant ta"
    assert queue.reason("tc/other") == "queued: 0 ahead of it in tenant tc"
    assert queue.reason("ta/nothing") is None
    assert queue.forget(["ta/w1"]) == 1  # a deletion from the middle of the line
    assert [queue.reason(f"ta/w{i}") for i in (0, 2, 3)] == [f"queued: {i} ahead of it in tenant ta" for i in (1, 2, 3)]
    unit = queue.pop()
    assert unit is not None and unit.workloads[0].key == "ta/urgent"
    assert queue.reason("ta/urgent") == "being scheduled"
    assert [queue.reason(f"ta/w{i}") for i in (0, 2, 3)] == [f"queued: {i} ahead of it in tenant ta" for i in (0, 1, 2)]


def test_every_waiting_workload_has_a_reason() -> None:
    state = ClusterState.from_nodes([make_node("n").cpu("4").obj()])
    sched = Scheduler(state, tenants=[capped("2")])
    gang = [make_workload(f"g{i}", "tb").tenant("tb").req(cpu="1").gang("g", 3).obj() for i in range(2)]
    sched.submit([work("a", "2"), work("b", "1"), work("nowhere", "64", tenant="tc"), *gang])
    sched.run(limit=1, report_waiting=False)
    keys = ["tb/a", "tb/b", "tc/nowhere", "tb/g0", "tb/g1"]
    first = {key: sched.queue.reason(key) for key in keys}
    assert first["tb/b"] == "queued: 0 ahead of it in tenant tb"
    assert first["tb/g0"] == first["tb/g1"] == "waiting: gang g has 2/3 members"
    sched.run(report_waiting=False)
    after = {key: sched.queue.reason(key) for key in keys if sched.queue.holds(key)}
    assert after["tb/b"].startswith("waiting: tenant tb would exceed its max")
    assert after["tc/nowhere"] == "0/1 nodes available: 1 insufficient cpu"
    assert all(after.values())


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 7)),
        st.tuples(st.just("delete"), st.integers(0, 40)),
        st.tuples(st.just("cap"), st.integers(1, 8)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_no_workload_its_quota_admits_is_left_pending(ops: list[tuple[str, int]]) -> None:
    """Random submits, deletes (queued or bound) and max changes under tenant tb's max, on a cluster
    with room for everything: once the queue settles, every workload still waiting is one its quota
    does not admit now, and it says why."""
    state = ClusterState.from_nodes([BIG])
    sched = Scheduler(state, tenants=[capped()])
    names: list[str] = []
    for i, (op, arg) in enumerate(ops):
        if op == "submit":
            sched.submit([work(f"w{i}", str(arg))])
            names.append(f"tb/w{i}")
        elif op == "delete" and names:
            key = names.pop(arg % len(names))
            if key in state.bindings:
                sched.release(key)
            else:
                sched.queue.forget([key])
        elif op == "cap":
            sched.queue.set_tenant(capped(str(arg)))
        sched.run(report_waiting=False)
        for unit, why in sched.queue.waiting():
            assert why == "quota", unit
            assert sched.queue.quota_problem("tb", unit.demand) != "tenant tb is within its quota"
            assert sched.queue.unit_reason(unit).startswith("waiting: ")
