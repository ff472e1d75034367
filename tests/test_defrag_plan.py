"""The defragmentation planner, hand-worked cases (sched/defrag_plan.py).

GPU nodes have 3 cards (100 gpu-core, 80Gi each) and 16 CPUs; shares are bound on the card a
row names (`share`); scalar workloads are placed by the default profile (lowest index first
among equal scores: `placed` asserts the placement a case relies on). Every planner call is
checked to change nothing on the state.
"""

from __future__ import annotations

import numpy as np
import pytest

from builders import make_node, make_workload
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.workload import Workload
from finesched.sched.defrag import Defragmenter, DefragPlan
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Defragmentation, resolve_profile
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

DEFRAGMENTING = resolve_profile("default").model_copy(update={"defragmentation": Defragmentation()})
MOVABLE = {"migration": {"allowed": True}}
WHOLE_GPU = {"nvidia.com/gpu": "1"}


def gpu_cluster(*names: str, profile: object = "default") -> Scheduler:
    nodes = [make_node(n).cpu("16").memory("64Gi").gpus(3).obj() for n in names]
    return Scheduler(ClusterState.from_nodes(nodes), profile)  # type: ignore[arg-type]


def cpu_cluster(*names: str, cpu: str = "4", profile: object = "default", topology: bool = False) -> Scheduler:
    built = [make_node(n).cpu(cpu).memory("8Gi") for n in names]
    if topology:  # 1 socket, 2 cores of 2 threads: exclusive cpusets (LSE, LSR) can be given
        built = [b.topology(sockets=1, numa_per_socket=1, cores_per_numa=2, threads=2) for b in built]
    nodes = [b.obj() for b in built]
    return Scheduler(ClusterState.from_nodes(nodes), profile)  # type: ignore[arg-type]


def card_grant(minor: int, core: int) -> DeviceGrant:
    """`core` % of card `minor`: its core, its memory ratio and that share of its 80Gi."""
    memory = 80 * 2**30 * core // 100
    return DeviceGrant(minor=minor, resources={"gpu-core": core, "gpu-memory-ratio": core, "gpu-memory": memory})


def share(s: Scheduler, name: str, node: str, minor: int, core: int, priority: int = 0, **fields: object) -> None:
    """Bind `name` holding `core` % of card `minor` of `node` (and 1 CPU), committed, movable."""
    w = make_workload(name).req(cpu="1", gpu=str(core)).priority(priority).set(**{**MOVABLE, **fields}).obj()
    grant = card_grant(minor, core)
    binding = Binding(
        workload=w.key, node=node, priority=priority, tenant=w.tenant, qos=w.qos or "LS",
        requests={"cpu": "1", "pods": 1}, devices={"gpu": [grant]},
    )  # fmt: skip
    s.state.assume(binding)
    s.state.commit(w.key)
    s.remember_movable(w)


def placed(s: Scheduler, name: str, cpu: int, node: str, priority: int = 0, **fields: object) -> Workload:
    w = make_workload(name).req(cpu=str(cpu)).priority(priority).set(**fields).obj()
    assert s.schedule_one(w).node == node  # the placement the case relies on
    return w


def state_of(s: Scheduler) -> tuple[object, ...]:
    st = s.state
    return (st.capacity_version, st.nodes_version, dict(st.bindings), {k for k in st.bindings if st.is_committed(k)},
            st.free.copy(), dict(s.movable), device_free(st))  # fmt: skip


def device_free(state: ClusterState) -> dict[str, np.ndarray]:
    accounts = state.extras.get("devices")
    return {kind: acc.free.copy() for kind, acc in getattr(accounts, "types", {}).items()}


def same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    devices_a, devices_b = a[6], b[6]
    assert isinstance(devices_a, dict) and isinstance(devices_b, dict)
    return (
        a[:4] == b[:4]
        and np.array_equal(a[4], b[4])  # type: ignore[arg-type]
        and a[5] == b[5]
        and devices_a.keys() == devices_b.keys()
        and all(np.array_equal(devices_a[k], devices_b[k]) for k in devices_a)
    )


def plan_for(
    s: Scheduler, w: Workload, now: float = 0.0, defragmenter: Defragmenter | None = None, **config: object
) -> tuple[DefragPlan | None, str]:
    defragmenter = defragmenter or Defragmenter(Defragmentation(**config))  # type: ignore[arg-type]
    before = state_of(s)
    plan, why = s.find_defragmentation(w, defragmenter, now=now)
    assert same(before, state_of(s)), "find_defragmentation changed the state"
    return plan, why


def apply_checked(s: Scheduler, plan: DefragPlan) -> None:
    s.apply_defragmentation(plan)
    s.state.check_invariants()
    assert s.state.bindings[plan.workload] == plan.binding
    for move in plan.moves:
        assert s.state.bindings[move.workload] == move.target


def test_three_cards_at_30_percent_two_shares_moved_free_one_card() -> None:
    # n1: every card 30 % used by two 15 % shares; GPU 2's shares have the lowest priority.
    s = gpu_cluster("n1")
    for minor, priority in ((0, 5), (1, 5), (2, 1)):
        share(s, f"g{minor}a", "n1", minor, 15, priority)
        share(s, f"g{minor}b", "n1", minor, 15, priority)
    big = make_workload("big").req(cpu="1", **WHOLE_GPU).obj()
    with pytest.raises(FitError):
        s.schedule_one(big)
    plan, why = plan_for(s, big)
    assert plan is not None, why
    assert sorted(plan.mover_keys) == ["default/g2a", "default/g2b"]
    assert plan.binding.node == "n1" and plan.binding.device_minors("gpu") == [2]
    for move in plan.moves:
        assert move.target.node == "n1" and move.target.device_minors("gpu") in ([0], [1])
        assert move.reason.startswith("moved from n1 (GPU 2) to n1 (GPU ")
        assert move.reason.endswith("to make room for default/big")
    assert "lacked 1 gpu card(s)" in plan.reason
    apply_checked(s, plan)


def test_cpu_and_memory_freed_on_a_node_whose_gpu_has_room() -> None:
    # n1's GPU 0 is idle but its CPUs are taken by a movable CPU-only workload; n2 has CPUs free
    # but all its cards are full (not movable): the move frees CPUs, not GPU shares.
    s = gpu_cluster("n1", "n2")
    for minor in range(3):
        w = make_workload(f"full{minor}").req(cpu="1", gpu="100").obj()
        grant = card_grant(minor, 100)
        b = Binding(workload=w.key, node="n2", requests={"cpu": "1", "pods": 1}, devices={"gpu": [grant]})
        s.state.assume(b)
        s.state.commit(w.key)
    cpu_hog = make_workload("hog").req(cpu="13").set(**MOVABLE).obj()
    s.state.assume(Binding(workload=cpu_hog.key, node="n1", requests={"cpu": "13", "pods": 1}))
    s.state.commit(cpu_hog.key)
    s.remember_movable(cpu_hog)
    big = make_workload("big").req(cpu="4", **WHOLE_GPU).obj()
    plan, why = plan_for(s, big)
    assert plan is not None, why
    assert plan.mover_keys == ["default/hog"] and plan.moves[0].target.node == "n2"
    assert plan.binding.node == "n1"
    assert "cpu 4000 (3000 free)" in plan.reason
    apply_checked(s, plan)


def test_a_move_that_would_break_a_disruption_budget_is_refused() -> None:
    budget = {"disruptionBudget": {"minAvailable": 2, "selector": {"app": "x"}}, "labels": {"app": "x"}, **MOVABLE}
    s = cpu_cluster("n1", "n2")
    placed(s, "a", 2, "n1", **budget)
    placed(s, "b", 2, "n2", **budget)
    w = make_workload("w").req(cpu="4").obj()
    plan, why = plan_for(s, w)
    assert plan is None and "disruption budget keeps 2 of 2 bound" in why
    # One of the group may go: the same cluster with minAvailable 1 moves one.
    loose = {**budget, "disruptionBudget": {"minAvailable": 1, "selector": {"app": "x"}}}
    s = cpu_cluster("n1", "n2")
    placed(s, "a", 2, "n1", **loose)
    placed(s, "b", 2, "n2", **loose)
    plan, why = plan_for(s, w)
    assert plan is not None and len(plan.moves) == 1, why
    apply_checked(s, plan)


def test_a_gang_member_is_never_moved() -> None:
    s = cpu_cluster("n1", "n2")
    placed(s, "a", 2, "n1", gang={"name": "g", "minMember": 1}, **MOVABLE)
    placed(s, "b", 2, "n2", gang={"name": "g", "minMember": 1}, **MOVABLE)
    plan, why = plan_for(s, make_workload("w").req(cpu="4").obj())
    assert plan is None and "gang member" in why
    # a waiting gang member is not placed by moving others either
    placed(s, "c", 1, "n1", **MOVABLE)
    member = make_workload("m").req(cpu="3").set(gang={"name": "h", "minMember": 1}).obj()
    assert plan_for(s, member) == (None, "a gang member is placed with its gang, never by moving others")


@pytest.mark.parametrize("qos", ["LSE", "LSR"])
def test_lse_and_lsr_are_never_moved(qos: str) -> None:
    s = cpu_cluster("n1", "n2", topology=True)
    placed(s, "a", 2, "n1", qos=qos, limits={"cpu": "2"}, **MOVABLE)
    placed(s, "b", 2, "n2", qos=qos, limits={"cpu": "2"}, **MOVABLE)
    plan, why = plan_for(s, make_workload("w").req(cpu="4").obj())
    assert plan is None and f"its qos is {qos}" in why


def test_a_defragmentation_that_cannot_free_enough_makes_no_move() -> None:
    # 5 CPUs idle in total, but no node can reach 4 free: n1's movable workload frees only 1.
    s = cpu_cluster("n1", "n2", "n3")
    placed(s, "x", 2, "n1")
    placed(s, "y", 2, "n2")
    placed(s, "z", 2, "n3")
    placed(s, "a", 1, "n1", **MOVABLE)
    w = make_workload("w").req(cpu="4").obj()
    plan, why = plan_for(s, w)
    assert plan is None and why
    # Too little idle capacity in the whole cluster: answered before looking at any node.
    plan, why = plan_for(s, make_workload("v").req(cpu="6").obj())
    assert (plan, why) == (None, "the cluster's free cpu is 5000, the workload needs 6000")


def test_gpu_shortfall_is_answered_with_the_free_amount() -> None:
    s = gpu_cluster("n1")
    for minor in range(3):
        share(s, f"s{minor}", "n1", minor, 50)
    plan, why = plan_for(s, make_workload("big").req(cpu="1", **{"nvidia.com/gpu": "2"}).obj())
    assert (plan, why) == (None, "the cluster's free gpu-core is 150, the workload needs 200")


def test_cool_down_and_budgets_per_minute_and_per_tenant() -> None:
    def cluster() -> Scheduler:
        s = cpu_cluster("n1", "n2")
        placed(s, "a", 2, "n1", tenant="t1", **MOVABLE)
        placed(s, "b", 2, "n2", tenant="t1", **MOVABLE)
        return s

    w = make_workload("w").req(cpu="4").obj()
    defragmenter = Defragmenter(Defragmentation(cooldown_seconds=600))
    plan, _ = plan_for(cluster(), w, 0.0, defragmenter)
    assert plan is not None
    defragmenter.record(plan, 0.0)
    moved = plan.mover_keys[0]
    # within the cool-down the moved workload stays, the other one may go
    again, why = plan_for(cluster(), w, 100.0, defragmenter)
    assert again is not None and again.mover_keys != [moved], why
    # per-minute budget of the cluster: 1 move, spent at t=0, free again a minute later
    per_minute = Defragmenter(Defragmentation(max_moves_per_minute=1, cooldown_seconds=0))
    per_minute.record(plan, 0.0)
    assert plan_for(cluster(), w, 30.0, per_minute) == (
        None,
        "the cluster's budget of moves is spent (maxMovesPerMinute 1)",
    )
    assert plan_for(cluster(), w, 61.0, per_minute)[0] is not None
    # per tenant: t1 has 1 move a minute, spent
    per_tenant = Defragmenter(Defragmentation(max_moves_per_tenant_per_minute=1, cooldown_seconds=0))
    per_tenant.record(plan, 0.0)
    plan2, why = plan_for(cluster(), w, 30.0, per_tenant)
    assert plan2 is None and "tenant t1's budget of moves per minute is spent" in why


def test_run_with_a_defragmenting_profile_places_the_waiting_workload() -> None:
    s = cpu_cluster("n1", "n2", profile=DEFRAGMENTING)
    s.clock = lambda: 1000.0
    placed(s, "a", 2, "n1", priority=3, **MOVABLE)
    placed(s, "b", 2, "n2", priority=1, **MOVABLE)
    w = make_workload("w").req(cpu="4").obj()
    s.submit([w])
    results = s.run()
    assert [r.node for r in results if isinstance(r, Binding)] == ["n2"]
    plans = s.take_defragmentations()
    assert [p.workload for p in plans] == ["default/w"]
    assert plans[0].mover_keys == ["default/b"]  # the lower priority moves
    assert s.state.bindings["default/b"].node == "n1"
    assert s.take_defragmentations() == []
    s.state.check_invariants()
    # b now cools down: it is not moved again for another waiting workload
    assert s.defragmenter is not None and s.defragmenter.refusal("default/b", 1000.0) is not None


def test_apply_then_undo_restores_the_state_exactly() -> None:
    s = gpu_cluster("n1")
    for minor in range(3):
        share(s, f"g{minor}a", "n1", minor, 15)
        share(s, f"g{minor}b", "n1", minor, 15)
    before = state_of(s)
    plan, why = plan_for(s, make_workload("big").req(cpu="1", **WHOLE_GPU).obj())
    assert plan is not None, why
    apply_checked(s, plan)
    s.undo_defragmentation(plan)
    after = state_of(s)
    assert same((0, 0, *before[2:]), (0, 0, *after[2:]))  # versions moved on, all else as before
    s.state.check_invariants()


def test_nothing_to_do_when_it_fits() -> None:
    s = cpu_cluster("n1")
    plan, why = plan_for(s, make_workload("w").req(cpu="1").obj())
    assert (plan, why) == (None, "it fits without moving anything")
