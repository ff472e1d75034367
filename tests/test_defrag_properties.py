"""Safety of the defragmentation planner over random clusters and waiting workloads (hypothesis).

Random nodes (1-4 GPUs of 40Gi or 80Gi, 4-16 CPUs, 16-64Gi), random workloads placed by the
default profile (GPU shares, whole GPUs or CPU only, some memory-heavy; some movable, some gang
members, LSE or with budgets), then one waiting workload. Plans include chains (a mover that fits
only after another moves; a hypothesis event; the second test packs full nodes to get them). For
every plan found: the planner changed nothing;
no workload moves twice, the waiting workload never moves;
every mover was movable and neither a gang member, LSE/LSR nor holding a cpuset; its moves made
one by one on a copy never over-allocate (state invariants after each step); and the waiting
workload ends bound exactly as planned, every mover on its target.
"""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched.model.workload import Workload
from finesched.sched.defrag import Defragmenter
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Defragmentation
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from test_defrag_plan import same, state_of

nodes_st = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from(["40Gi", "80Gi"]), st.integers(4, 16), st.integers(16, 64)),
    min_size=1,
    max_size=5,
)
workload_st = st.tuples(
    st.sampled_from(["share", "whole", "cpu"]),
    st.sampled_from([10, 25, 30, 50, 70]),
    st.integers(1, 6),
    st.integers(0, 3),
    st.sampled_from(["movable", "movable", "fixed", "gang", "budget"]),
    st.sampled_from([1, 1, 6]),  # Gi of memory per CPU: memory-heavy workloads make chains likely
)


def workload(name: str, kind: str, core: int, cpu: int, priority: int, flavour: str, gib: int = 1) -> Workload:
    req: dict[str, str] = {"cpu": str(cpu), "memory": f"{cpu * gib}Gi"}
    if kind == "share":
        req["gpu"] = str(core)
    elif kind == "whole":
        req["nvidia.com/gpu"] = "1"
    fields: dict[str, object] = {}
    if flavour != "fixed":
        fields["migration"] = {"allowed": True}
    if flavour == "gang":
        fields["gang"] = {"name": f"g-{name}", "minMember": 1}
    if flavour == "budget":
        fields["labels"] = {"app": "b"}
        fields["disruptionBudget"] = {"minAvailable": 1, "selector": {"app": "b"}}
    return make_workload(name).req(**req).priority(priority).set(**fields).obj()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=nodes_st, bound=st.lists(workload_st, max_size=14), waiting=workload_st, moves=st.integers(1, 4))
def test_plans_are_safe_and_make_the_waiting_workload_fit(
    nodes: list[tuple[int, str, int, int]],
    bound: list[tuple[str, int, int, int, str, int]],
    waiting: tuple[str, int, int, int, str, int],
    moves: int,
) -> None:
    check_plan(nodes, bound, waiting, moves)


#: Full GPU nodes: 2-3 of them with 2-4 cards and many workloads, so movers often fit nowhere
#: else and need chains.
full_nodes_st = st.lists(
    st.tuples(st.integers(2, 4), st.sampled_from(["40Gi", "80Gi"]), st.integers(8, 16), st.integers(32, 64)),
    min_size=2,
    max_size=3,
)
movable_st = st.tuples(
    st.sampled_from(["share", "share", "whole", "cpu"]),
    st.sampled_from([10, 25, 30, 50, 70]),
    st.integers(1, 4),
    st.integers(0, 3),
    st.sampled_from(["movable", "movable", "movable", "fixed"]),
    st.sampled_from([1, 4, 8]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=full_nodes_st,
    bound=st.lists(movable_st, min_size=6, max_size=18),
    waiting=movable_st,
    moves=st.integers(2, 4),
)
def test_plans_with_chains_on_full_clusters_are_safe(
    nodes: list[tuple[int, str, int, int]],
    bound: list[tuple[str, int, int, int, str, int]],
    waiting: tuple[str, int, int, int, str, int],
    moves: int,
) -> None:
    check_plan(nodes, bound, waiting, moves)


def check_plan(
    nodes: list[tuple[int, str, int, int]],
    bound: list[tuple[str, int, int, int, str, int]],
    waiting: tuple[str, int, int, int, str, int],
    moves: int,
) -> None:
    """Place `bound`, then plan for `waiting`: the plan (if any) is safe step by step (module docstring)."""
    built = []
    for i, (gpus, memory, cpu, mem) in enumerate(nodes):
        node = make_node(f"n{i}").cpu(str(cpu)).memory(f"{mem}Gi")
        built.append((node.gpus(gpus, memory=memory) if gpus else node).obj())
    s = Scheduler(ClusterState.from_nodes(built))
    for k, spec in enumerate(bound):
        with contextlib.suppress(FitError):  # a random workload that fits nowhere is left out
            s.schedule_one(workload(f"w{k}", *spec))
    kind, core, cpu, priority, _, gib = waiting
    w = workload("waiting", kind, core, cpu, priority, "fixed", gib)
    try:
        s.schedule_one(w)
        return  # it fits: nothing to plan
    except FitError as exc:
        if exc.unresolvable:
            return
    before = state_of(s)
    plan, why = s.find_defragmentation(w, Defragmenter(Defragmentation(max_moves_per_plan=moves)), now=0.0)
    assert same(before, state_of(s)), "find_defragmentation changed the state"
    event("a plan" if plan is not None else "no plan")
    if plan is None:
        assert why
        return
    assert 1 <= len(plan.moves) <= moves
    chained = [m for m in plan.moves if "room for another workload" in m.reason]
    event("a chain" if chained else "no chain")
    assert len({m.workload for m in plan.moves}) == len(plan.moves), "a workload moved twice in one plan"
    assert w.key not in plan.mover_keys
    assert plan.workload == w.key and plan.binding.workload == w.key
    copy = s.state.copy()
    for move in plan.moves:
        mover = s.movable[move.workload]
        assert mover.movable and mover.gang is None
        assert move.source.qos not in ("LSE", "LSR") and not move.source.cpuset
        assert copy.bindings[move.workload] == move.source
        assert move.target != move.source
        copy.forget(move.workload)
        copy.assume(move.target)  # raises if it does not fit
        copy.check_invariants()
    copy.assume(plan.binding)
    copy.check_invariants()
    # The Scheduler's own apply gives the same end state.
    s.apply_defragmentation(plan)
    s.state.check_invariants()
    assert s.state.bindings[w.key] == plan.binding
    assert all(s.state.bindings[m.workload] == m.target for m in plan.moves)
    assert s.state.bindings == copy.bindings
