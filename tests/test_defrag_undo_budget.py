"""The defragmenter's own bookkeeping: a plan taken back (its write failed or conflicted) costs
neither budget nor cool-down, and plans tried per run are bounded per tenant."""

from __future__ import annotations

from builders import make_node, make_workload
from finesched.model.binding import Binding
from finesched.model.workload import Workload
from finesched.sched.defrag import TRIES_PER_TENANT_PER_RUN, DefragPlan
from finesched.sched.profile import Defragmentation, resolve_profile
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

ONE_MOVE_A_MINUTE = resolve_profile("default").model_copy(
    update={"defragmentation": Defragmentation(max_moves_per_minute=1, cooldown_seconds=600)}
)


def test_undo_gives_the_budget_and_the_cool_down_back() -> None:
    nodes = [make_node(n).cpu("4").memory("8Gi").obj() for n in ("n1", "n2")]
    s = Scheduler(ClusterState.from_nodes(nodes), ONE_MOVE_A_MINUTE)
    s.clock = lambda: 10.0
    for name in ("a", "b"):
        s.submit([make_workload(name).req(cpu="2").set(migration={"allowed": True}).obj()])
    assert all(isinstance(r, Binding) for r in s.run())
    assert s.state.bindings["default/a"].node != s.state.bindings["default/b"].node
    waiting = make_workload("w").req(cpu="4").obj()
    s.submit([waiting])
    s.run()
    [plan] = s.take_defragmentations()
    defragmenter = s.defragmenter
    assert defragmenter is not None
    assert defragmenter.moves_left(10.0) == 0
    assert defragmenter.refusal(plan.mover_keys[0], 10.0) is not None
    s.undo_defragmentation(plan)
    assert defragmenter.moves_left(10.0) == 1
    assert defragmenter.refusal(plan.mover_keys[0], 10.0) is None
    assert "default/w" not in s.state.bindings
    s.state.check_invariants()


def test_plans_tried_per_run_are_bounded_and_shared_between_tenants() -> None:
    """A queue of workloads no move can help costs at most TRIES_PER_TENANT_PER_RUN planner calls
    for their tenant in one `run`, and a later tenant's workload still gets its plan."""
    nodes = [make_node(n).cpu("4").memory("8Gi").obj() for n in ("n1", "n2")]
    nodes.append(make_node("n3").cpu("4").memory("8Gi").label("zone", "z3").obj())
    s = Scheduler(ClusterState.from_nodes(nodes), ONE_MOVE_A_MINUTE)
    s.clock = lambda: 10.0
    s.submit([make_workload("x").req(cpu="4").set(node_selector={"zone": "z3"}).obj()])  # fills n3, not movable
    for name in ("a", "b"):
        s.submit([make_workload(name).req(cpu="2").set(migration={"allowed": True}).obj()])
    s.run()
    calls: list[str] = []
    plan_for = s.find_defragmentation

    def counted(workload: Workload, *args: object, **kwargs: object) -> tuple[DefragPlan | None, str]:
        calls.append(workload.tenant)
        return plan_for(workload, *args, **kwargs)  # type: ignore[arg-type]

    s.find_defragmentation = counted  # type: ignore[method-assign]
    # 40 of flood's workloads may go to n3 only, where nothing may move: no plan for any.
    flood = make_workload("f").req(cpu="1").set(namespace="flood", priority=5, node_selector={"zone": "z3"})
    s.submit([flood.set(name=f"f{i}").obj() for i in range(40)])
    s.submit([make_workload("w").req(cpu="4").set(namespace="calm").obj()])
    results = s.run()
    assert calls.count("flood") == TRIES_PER_TENANT_PER_RUN
    assert calls.count("calm") == 1
    assert any(isinstance(r, Binding) and r.workload == "calm/w" for r in results)


def test_a_workload_placed_again_without_migration_is_not_movable() -> None:
    """A movable workload deleted and submitted again under the same name without `migration` (the
    driver forgot its binding through the state) is never moved."""
    nodes = [make_node(n).cpu("4").memory("8Gi").obj() for n in ("n1", "n2")]
    s = Scheduler(ClusterState.from_nodes(nodes), ONE_MOVE_A_MINUTE)
    s.submit([make_workload("a").req(cpu="2").set(migration={"allowed": True}).obj()])
    s.run()
    assert "default/a" in s.movable
    s.state.forget("default/a")
    s.submit([make_workload("a").req(cpu="2").obj()])
    s.run()
    assert "default/a" not in s.movable
    s.remember_movable(make_workload("a").req(cpu="2").set(migration={"allowed": True}).obj())
    s.remember_movable(make_workload("a").req(cpu="2").obj())
    assert "default/a" not in s.movable
