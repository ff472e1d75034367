"""Hypothesis: the vectorized cycle equals a slow reference, and the state invariants always hold."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from builders import make_node, make_workload
from finesched import ClusterState, FitError, Scheduler
from finesched.model.node import Node
from finesched.model.workload import Workload

EPS = 1e-9


def reference_choice(state: ClusterState, w: Workload) -> tuple[str | None, dict[str, int]]:
    """Pure-Python filter + LeastRequested + MostBalanced, lowest index on ties (the default profile)."""
    asks = {k: v for k, v in w.requests.items() if v > 0}
    asks["pods"] = 1
    classes = [k for k in asks if k != "pods"] or []
    best, best_score, scores = None, -1, {}
    for i, node in enumerate(state.nodes):
        if any(node.labels.get(k) != v for k, v in w.node_selector.items()):
            continue
        row = {r: (int(state.free[state.res_index[r], i]) if r in state.res_index else 0) for r in asks}
        if any(row[r] < a for r, a in asks.items()):
            continue
        shares = []
        for r in classes:
            alloc = node.allocatable.get(r, 0)
            inv = 1.0 / alloc if alloc > 0 else 0.0
            used = float(int(state.used[state.res_index[r], i]))
            shares.append((used + float(asks[r])) * inv)
        mean = 0.0
        if len(shares) == 1:
            mean = shares[0]
        elif shares:
            mean = sum(shares[1:], shares[0]) * (1.0 / len(shares))
        if len(shares) < 2:
            var = 0.0
        elif len(shares) == 2:
            var = ((shares[0] - shares[1]) * 0.5) ** 2
        else:
            var = sum((s - mean) ** 2 for s in shares) * (1.0 / len(shares))
        least = max(0, int((100 + EPS) - 100 * mean))
        balanced = max(0, int((100 + EPS) - 400 * var))
        scores[node.name] = least + balanced
        if scores[node.name] > best_score:
            best, best_score = node.name, scores[node.name]
    return best, scores


node_specs = st.lists(
    st.tuples(st.integers(0, 16), st.integers(0, 64), st.sampled_from(["a", "b"])), min_size=1, max_size=12
)
work_specs = st.lists(
    st.tuples(
        st.sampled_from(["0", "250m", "1", "2", "3500m", "8"]),
        st.sampled_from(["0", "1Gi", "3Gi", "10Gi"]),
        st.sampled_from([None, "a", "b"]),
    ),
    min_size=1,
    max_size=25,
)


def build_nodes(specs: list[tuple[int, int, str]]) -> list[Node]:
    return [make_node(f"n{i}").cpu(str(c)).memory(f"{m}Gi").label("zone", z).obj() for i, (c, m, z) in enumerate(specs)]


def build_workload(i: int, spec: tuple[str, str, str | None]) -> Workload:
    cpu, memory, zone = spec
    builder = make_workload(f"w{i}").req(cpu=cpu, memory=memory)
    return builder.selector(zone=zone).obj() if zone else builder.obj()


@given(node_specs, work_specs)
@settings(max_examples=80)
def test_vectorized_cycle_matches_reference(nodes: list[Any], works: list[Any]) -> None:
    state = ClusterState.from_nodes(build_nodes(nodes))
    sched = Scheduler(state)
    for i, spec in enumerate(works):
        w = build_workload(i, spec)
        want, want_scores = reference_choice(state, w)
        try:
            scores = sched.evaluate(w)  # every feasible node's total, computed afresh
        except FitError:
            scores = {}
        assert scores == want_scores, (i, spec)  # the same feasible set and the same score on each node
        try:
            binding = sched.schedule_one(w)  # through the per-shape memo
            got, score = binding.node, binding.score
        except FitError:
            got, score = None, None
        assert got == want, (i, spec)
        assert score == (want_scores[want] if want is not None else None)
        state.check_invariants()


class SchedulingMachine(RuleBasedStateMachine):
    """Random add-node / schedule / release / remove-node steps; invariants after every step."""

    bound = Bundle("bound")

    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState()
        self.sched = Scheduler(self.state)
        self.count = 0

    @rule(cpu=st.integers(1, 16), memory=st.integers(1, 64), zone=st.sampled_from(["a", "b"]))
    def add_node(self, cpu: int, memory: int, zone: str) -> None:
        self.count += 1
        self.state.add_node(make_node(f"n{self.count}").cpu(str(cpu)).memory(f"{memory}Gi").label("zone", zone).obj())

    @rule(target=bound, spec=work_specs.map(lambda ws: ws[0]))
    def schedule(self, spec: tuple[str, str, str | None]) -> str:
        self.count += 1
        try:
            return self.sched.schedule_one(build_workload(self.count, spec)).workload
        except FitError:
            return ""

    @rule(key=consumes(bound))
    def release(self, key: str) -> None:
        if key in self.state.bindings:
            self.sched.release(key)

    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        if self.state.n:
            name = data.draw(st.sampled_from(self.state.names))
            self.state.remove_node(name, force=True)

    @rule()
    def snapshot_roundtrip(self) -> None:
        snap = self.state.snapshot()
        before = (self.state.free.copy(), dict(self.state.bindings))
        self.state.restore(snap)
        assert (self.state.free == before[0]).all() and self.state.bindings == before[1]

    @invariant()
    def invariants_hold(self) -> None:
        self.state.check_invariants()
        # Tenant usage (DRF, quotas) always equals the sum over the bindings, whatever removed them.
        want: dict[str, dict[str, int]] = {}
        for binding in self.state.bindings.values():
            held = want.setdefault(binding.tenant, {})
            for name, amount in binding.requests.items():
                held[name] = held.get(name, 0) + amount
        for tenant in {b.tenant for b in self.state.bindings.values()} | set(want):
            got = {k: v for k, v in self.sched.usage.of(tenant).items() if v}
            assert got == {k: v for k, v in want.get(tenant, {}).items() if v}, tenant


TestSchedulingMachine = SchedulingMachine.TestCase
TestSchedulingMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
