"""TenantIsolation: a node that cannot keep tenants apart runs one tenant's workloads at a time."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched.plugins.tenant_isolation import (
    ISOLATION_REASON,
    NONE,
    ONE_TENANT,
    SHARED,
    TENANT_ISOLATION_LABEL,
    TenantHolders,
    isolation_label,
)
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState


def node(name: str, label: str | None = None, cpu: str = "8"):
    builder = make_node(name).cpu(cpu).memory("8Gi")
    return (builder.label(TENANT_ISOLATION_LABEL, label) if label else builder).obj()


def work(name: str, tenant: str, cpu: str = "1"):
    return make_workload(name, tenant).tenant(tenant).req(cpu=cpu).obj()


def holders(state: ClusterState) -> TenantHolders:
    extra = state.extras[TenantHolders.name]
    assert isinstance(extra, TenantHolders)
    return extra


@pytest.mark.parametrize(
    ("label", "second_tenant_goes_there"),
    [(ONE_TENANT, False), (SHARED, True), ("true", True), (None, True)],
    ids=["one-tenant", "sharing-allowed", "isolating", "unlabelled"],
)
def test_a_second_tenant_waits_for_the_first_to_leave_a_non_isolating_node(
    label: str | None, second_tenant_goes_there: bool
) -> None:
    sched = Scheduler(ClusterState.from_nodes([node("n", label)]))
    assert sched.schedule_one(work("a1", "a")).node == "n"
    assert sched.schedule_one(work("a2", "a")).node == "n"  # the holder's own work still goes there
    if second_tenant_goes_there:
        assert sched.schedule_one(work("b1", "b")).node == "n"
        return
    with pytest.raises(FitError) as exc:
        sched.schedule_one(work("b1", "b"))
    assert exc.value.reasons[ISOLATION_REASON] == 1
    sched.state.forget("a/a1")
    with pytest.raises(FitError):  # a2 still holds it
        sched.schedule_one(work("b1", "b"))
    sched.state.forget("a/a2")
    assert sched.schedule_one(work("b1", "b")).node == "n"  # released: the next tenant takes it
    with pytest.raises(FitError):
        sched.schedule_one(work("a3", "a"))


def test_the_other_tenant_goes_to_an_isolating_node_instead() -> None:
    state = ClusterState.from_nodes([node("solo", ONE_TENANT, cpu="16"), node("iso", "true", cpu="4")])
    sched = Scheduler(state)
    assert sched.schedule_one(work("a1", "a")).node == "solo"  # the roomier node (least requested)
    assert sched.schedule_one(work("b1", "b")).node == "iso"
    assert sched.schedule_one(work("a2", "a")).node == "solo"


def test_the_memo_keeps_tenants_apart() -> None:
    """Same request shape, different tenants: a verdict memoized for one tenant (sched/memo.py)
    must not be reused for another on a node that has not changed since."""
    others = [node(f"other{i}", cpu="4") for i in range(7)]  # few changed nodes: the memo is patched, not redone
    sched = Scheduler(ClusterState.from_nodes([node("solo", ONE_TENANT, cpu="16"), *others]))
    assert sched.schedule_one(work("a1", "a", cpu="500m")).node == "solo"
    assert sched.schedule_one(work("b1", "b", cpu="500m")).node.startswith("other")  # solo is a's
    assert sched.schedule_one(work("a2", "a", cpu="500m")).node == "solo"  # not b's verdict on solo
    assert sched.schedule_one(work("b2", "b", cpu="500m")).node.startswith("other")


def test_relabelling_a_node_that_two_tenants_hold_blocks_everyone_until_one_is_left() -> None:
    state = ClusterState.from_nodes([node("n")])
    sched = Scheduler(state)
    sched.schedule_one(work("a1", "a"))
    sched.schedule_one(work("b1", "b"))
    state.update_node(node("n", ONE_TENANT))  # the agent restarted without root
    for tenant in ("a", "b", "c"):
        with pytest.raises(FitError):
            sched.schedule_one(work(f"{tenant}9", tenant))
    state.forget("b/b1")
    assert sched.schedule_one(work("a9", "a")).node == "n"
    state.check_invariants()


def test_the_label_says_what_the_agent_reports() -> None:
    assert isolation_label(True, False) == isolation_label(True, True) == "true"
    assert isolation_label(False, False) == ONE_TENANT and isolation_label(False, True) == SHARED


OPS = st.lists(
    st.tuples(st.sampled_from(["bind", "free", "relabel", "remove", "snapshot"]), st.integers(0, 3), st.integers(0, 2)),
    max_size=40,
)


@given(OPS)
def test_holders_always_match_the_bindings(ops: list[tuple[str, int, int]]) -> None:
    """Whatever happens (binds, releases, relabels, node removals, snapshot/restore), each labelled
    node's holder is exactly the set of tenants of its bindings."""
    names = [f"n{i}" for i in range(4)]
    state = ClusterState.from_nodes([node(n, ONE_TENANT if i % 2 == 0 else None) for i, n in enumerate(names)])
    sched = Scheduler(state)
    count, snap = 0, None
    for op, i, t in ops:
        tenant = "abc"[t]
        if op == "bind":
            count += 1
            with contextlib.suppress(FitError):
                sched.schedule_one(work(f"w{count}", tenant, cpu="100m"))
        elif op == "free" and state.bindings:
            state.forget(sorted(state.bindings)[i % len(state.bindings)])
        elif op == "relabel" and names[i] in state.index:
            label = ONE_TENANT if TENANT_ISOLATION_LABEL not in state.node(names[i]).labels else None
            state.update_node(node(names[i], label))
        elif op == "remove" and names[i] in state.index and state.n > 1:
            state.remove_node(names[i], force=True)
        elif op == "snapshot":
            if snap is None:
                snap = state.snapshot()
            else:
                state.restore(snap)
                snap = None
        extra = holders(state)
        assert extra.violations() == []
        for j, name in enumerate(state.names):
            tenants = {b.tenant for b in state.bindings_on(name)}
            labelled = state.nodes[j].labels.get(TENANT_ISOLATION_LABEL) == ONE_TENANT
            if not labelled or not tenants:
                assert extra.sole[j] == NONE
            elif len(tenants) == 1:
                assert extra.holder(j) == next(iter(tenants))
            else:
                assert extra.sole[j] < 0 and extra.holder(j) is None
