"""BucketIndex (seed S4.1): bucket edges, filing by remaining amount, and staying current."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from builders import make_node
from finesched.model.binding import Binding
from finesched.model.resources import ResourceVector
from finesched.state.buckets import BucketIndex, BucketSpec
from finesched.state.cluster import ClusterState, StateError

GI = 2**30


def bind(workload: str, node: str, **requests: int) -> Binding:
    return Binding(workload=f"default/{workload}", node=node, requests=ResourceVector(requests))


def indexed(*cpus: str, specs: dict[str, BucketSpec] | None = None) -> tuple[ClusterState, BucketIndex]:
    """Nodes n0, n1, ... with the given cpu and 16Gi memory, and an attached index."""
    state = ClusterState.from_nodes([make_node(f"n{i}").cpu(c).memory("16Gi").obj() for i, c in enumerate(cpus)])
    index = state.attach(BucketIndex(state, specs))
    return state, index


def layout(index: BucketIndex, resource: str) -> list[list[tuple[int, int]]]:
    return [index.members(resource, k) for k in range(index.bucket_count(resource))]


# Bucket assignment -------------------------------------------------------------------------------------
EQUAL = BucketSpec.equal(0, 2000, 4)  # [0,2000) [2000,4000) [4000,6000) [6000,∞)
LOWER = BucketSpec.equal(1000, 1000, 3)  # edges 1000, 2000, 3000; below 1000 -> bucket 0
EDGES = BucketSpec.explicit([0, 4 * GI, 16 * GI])  # [0,4Gi) [4Gi,16Gi) [16Gi,∞)
HIGH_EDGES = BucketSpec.explicit([2, 5])  # [2,5) [5,∞); below 2 -> bucket 0


@pytest.mark.parametrize(
    ("spec", "amount", "want"),
    [
        pytest.param(EQUAL, 0, 0, id="equal-zero"),
        pytest.param(EQUAL, 1999, 0, id="equal-just-below-edge"),
        pytest.param(EQUAL, 2000, 1, id="equal-on-edge-goes-up"),
        pytest.param(EQUAL, 4500, 2, id="equal-inside"),  # 4500 in [4000, 6000)
        pytest.param(EQUAL, 6000, 3, id="equal-last-edge"),
        pytest.param(EQUAL, 9000, 3, id="equal-above-last-edge-open-ended"),
        pytest.param(LOWER, 0, 0, id="below-lower-is-bucket-0"),
        pytest.param(LOWER, 999, 0, id="just-below-lower"),
        pytest.param(LOWER, 1000, 0, id="on-lower"),
        pytest.param(LOWER, 2500, 1, id="lower-inside"),  # 2500 in [2000, 3000)
        pytest.param(LOWER, 10**12, 2, id="lower-huge"),
        pytest.param(EDGES, 3 * GI, 0, id="edges-first"),
        pytest.param(EDGES, 4 * GI, 1, id="edges-on-edge"),
        pytest.param(EDGES, 16 * GI - 1, 1, id="edges-below-last"),
        pytest.param(EDGES, 2**40, 2, id="edges-above-last"),  # 1Ti in [16Gi, ∞)
        pytest.param(HIGH_EDGES, 1, 0, id="edges-below-first"),
        pytest.param(HIGH_EDGES, 5, 1, id="edges-last"),
    ],
)
def test_bucket_of(spec: BucketSpec, amount: int, want: int) -> None:
    assert spec.bucket_of(amount) == want


@pytest.mark.parametrize(
    ("spec", "edges", "ranges"),
    [
        pytest.param(EQUAL, (0, 2000, 4000, 6000), [(0, 2000), (2000, 4000), (4000, 6000), (6000, None)], id="equal"),
        pytest.param(LOWER, (1000, 2000, 3000), [(1000, 2000), (2000, 3000), (3000, None)], id="lower"),
        # default over 8000m: width ⌈8000/16⌉ = 500 -> 0, 500, ..., 7500
        pytest.param(BucketSpec.default_for(8000), tuple(range(0, 8000, 500)), None, id="default-8-cpu"),
        # ⌈17/16⌉ = 2 -> 0, 2, ..., 30; a node with 17 left is in [16, 18), bucket 8
        pytest.param(BucketSpec.default_for(17), tuple(range(0, 32, 2)), None, id="default-rounds-width-up"),
        pytest.param(BucketSpec.default_for(0), tuple(range(16)), None, id="default-empty-width-1"),
    ],
)
def test_edges_and_ranges(spec: BucketSpec, edges: tuple[int, ...], ranges: list | None) -> None:
    assert spec.edges == edges
    if ranges is not None:
        assert [spec.range_of(k) for k in range(spec.count)] == ranges


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: BucketSpec.explicit([]), id="no-edges"),
        pytest.param(lambda: BucketSpec.explicit([0, 4, 4]), id="not-strictly-ascending"),
        pytest.param(lambda: BucketSpec.equal(0, 0, 4), id="zero-width"),
        pytest.param(lambda: BucketSpec.equal(0, 1, 0), id="zero-count"),
    ],
)
def test_bad_specs_raise(build) -> None:
    with pytest.raises(ValueError):
        build()


# Filing and refresh -----------------------------------------------------------------------------------
def test_nodes_filed_by_remaining_amount_per_resource() -> None:
    # cpu 5, 4.5, 7, 1 cpu with buckets of 2 cpu: n3 -> 0, n0 and n1 -> 2 (ascending), n2 -> 3
    _state, index = indexed("5", "4.5", "7", "1", specs={"cpu": EQUAL})
    assert layout(index, "cpu") == [[(1000, 3)], [], [(4500, 1), (5000, 0)], [(7000, 2)]]
    # memory has the default spec: 16 buckets over [0, 16Gi], width 1Gi; 16Gi is in the last
    assert index.spec("memory") == BucketSpec.equal(0, GI, 16)
    assert index.members("memory", 15) == [(16 * GI, i) for i in range(4)]
    assert index.violations() == []


def test_iteration_orders_and_ties() -> None:
    _state, index = indexed("5", "4.5", "5", "4", "5.5", specs={"cpu": EQUAL})
    # bucket 2 = [4000, 6000): (4000,3) (4500,1) (5000,0) (5000,2) (5500,4)
    assert list(index.iter_bucket_ascending("cpu", 2)) == [3, 1, 0, 2, 4]
    assert list(index.iter_bucket_ascending("cpu", 2, 4600)) == [0, 2, 4]
    assert list(index.iter_bucket_ascending("cpu", 2, 5000)) == [0, 2, 4]  # >= is inclusive
    assert list(index.iter_bucket_ascending("cpu", 0)) == []
    assert index.bucket_of("cpu", 4500) == 2 and index.bucket_count("cpu") == 4


def test_refresh_after_assume_and_forget_moves_every_resource() -> None:
    state, index = indexed("8", "8", specs={"cpu": EQUAL})
    state.assume(bind("w", "n0", cpu=3500, memory=10 * GI))
    # n0: cpu 8000 - 3500 = 4500 -> bucket 2; memory 16Gi - 10Gi = 6Gi -> bucket 6 (width 1Gi)
    assert layout(index, "cpu") == [[], [], [(4500, 0)], [(8000, 1)]]
    assert index.members("memory", 6) == [(6 * GI, 0)]
    assert index.violations() == []
    state.forget("default/w")
    assert layout(index, "cpu") == [[], [], [], [(8000, 0), (8000, 1)]]
    assert index.members("memory", 6) == []
    assert index.violations() == []


def test_refused_assume_changes_nothing() -> None:
    state, index = indexed("2", specs={"cpu": EQUAL})
    with pytest.raises(StateError):
        state.assume(bind("w", "n0", cpu=3000))
    assert layout(index, "cpu") == [[], [(2000, 0)], [], []]


def test_add_remove_update_node() -> None:
    state, index = indexed("1", "3", "5", specs={"cpu": EQUAL})
    state.add_node(make_node("n3").cpu("7").memory("16Gi").obj())
    assert layout(index, "cpu") == [[(1000, 0)], [(3000, 1)], [(5000, 2)], [(7000, 3)]]
    # removing n0 moves the last node (n3) into slot 0
    state.remove_node("n0")
    assert state.names == ["n3", "n1", "n2"]
    assert layout(index, "cpu") == [[], [(3000, 1)], [(5000, 2)], [(7000, 0)]]
    state.remove_node("n2")  # the last slot: nothing moves
    assert layout(index, "cpu") == [[], [(3000, 1)], [], [(7000, 0)]]
    # update n1 from 3 to 4.5 cpu with 1 cpu bound: free 3500 -> bucket 1
    state.assume(bind("w", "n1", cpu=1000))
    state.update_node(make_node("n1").cpu("4.5").memory("16Gi").obj())
    assert layout(index, "cpu") == [[], [(3500, 1)], [], [(7000, 0)]]
    assert index.violations() == []


def test_remove_node_with_bindings_forced() -> None:
    state, index = indexed("4", "6", specs={"cpu": EQUAL})
    state.assume(bind("w", "n0", cpu=1000))
    state.remove_node("n0", force=True)
    assert layout(index, "cpu") == [[], [], [], [(6000, 0)]]
    assert index.violations() == []


def test_failed_update_restores_the_index() -> None:
    state, index = indexed("4", "6", specs={"cpu": EQUAL})
    state.assume(bind("w", "n0", cpu=3000))
    before = layout(index, "cpu")
    with pytest.raises(StateError):
        state.update_node(make_node("n0").cpu("2").memory("16Gi").obj())  # 3 cpu bound, 2 offered
    assert layout(index, "cpu") == before
    assert index.violations() == []
    state.check_invariants()


def test_new_resource_row_is_indexed_lazily_with_default_spec() -> None:
    state, index = indexed("4", specs={"cpu": EQUAL})
    state.add_node(make_node("n1").cpu("4").memory("16Gi").resource("example.com/fpga", 4).obj())
    # default spec over max 4: width ⌈4/16⌉ = 1; n0 has 0 fpga -> bucket 0, n1 has 4 -> bucket 4
    assert index.spec("example.com/fpga") == BucketSpec.equal(0, 1, 16)
    assert index.members("example.com/fpga", 0) == [(0, 0)]
    assert index.members("example.com/fpga", 4) == [(4, 1)]
    assert index.violations() == []


def test_default_spec_grows_with_the_largest_node() -> None:
    state = ClusterState()
    index = state.attach(BucketIndex(state))  # empty: every default spec starts with width 1
    state.add_node(make_node("n0").cpu("8").memory("16Gi").obj())
    assert index.spec("cpu") == BucketSpec.default_for(8000)  # width 500
    assert index.members("cpu", 15) == [(8000, 0)]
    state.add_node(make_node("n1").cpu("16").memory("16Gi").obj())
    # re-cut over 16000: width 1000; n0 (8000) -> bucket 8, n1 (16000) -> bucket 15
    assert index.spec("cpu") == BucketSpec.default_for(16000)
    assert index.members("cpu", 8) == [(8000, 0)] and index.members("cpu", 15) == [(16000, 1)]
    state.add_node(make_node("n2").cpu("2").memory("16Gi").obj())  # smaller: no re-cut
    assert index.spec("cpu") == BucketSpec.default_for(16000)
    assert index.violations() == []


def test_attach_after_bindings_and_snapshot_restore() -> None:
    state = ClusterState.from_nodes([make_node("n0").cpu("8").memory("16Gi").obj()], [bind("w", "n0", cpu=5000)])
    index = state.attach(BucketIndex(state, {"cpu": EQUAL}))
    assert layout(index, "cpu") == [[], [(3000, 0)], [], []]
    snap = state.snapshot()
    state.forget("default/w")
    state.add_node(make_node("n1").cpu("1").memory("16Gi").obj())
    state.restore(snap)
    assert layout(index, "cpu") == [[], [(3000, 0)], [], []]
    assert index.violations() == []
    state.add_node(make_node("n1").cpu("1").memory("16Gi").obj())  # still observing after restore
    assert layout(index, "cpu") == [[(1000, 1)], [(3000, 0)], [], []]


def test_copy_is_independent() -> None:
    state, index = indexed("8", specs={"cpu": EQUAL})
    other = state.copy()
    other.assume(bind("w", "n0", cpu=8000))
    assert layout(index, "cpu") == [[], [], [], [(8000, 0)]]
    copied = other.extras["buckets"]
    assert isinstance(copied, BucketIndex) and copied is not index
    assert copied.members("cpu", 0) == [(0, 0)]
    assert copied.violations() == []


def test_violations_report_misfiled_nodes() -> None:
    state, index = indexed("8", specs={"cpu": EQUAL})
    buckets = index._rings[state.res_index["cpu"]].buckets  # corrupt the index on purpose
    buckets[3].remove((8000, 0))
    buckets[0].add((8000, 0))  # 8000 belongs in [6000, ∞) = bucket 3
    assert index.violations() == ["cpu bucket 0: (8000, 0) belongs in bucket 3"]
    buckets[0].add((7000, 0))  # a second, stale entry for n0
    assert set(index.violations()) == {
        "cpu bucket 0: (8000, 0) belongs in bucket 3",
        "cpu bucket 0: (7000, 0) belongs in bucket 3",
        "cpu bucket 0: (7000, 0) but free is 8000, filed 8000",
        "cpu: node n0 filed 2 times",
    }


def test_unknown_resource_is_a_key_error() -> None:
    _state, index = indexed("8")
    with pytest.raises(KeyError):
        index.bucket_of("example.com/none", 1)


# Property: the index matches a brute-force filing after any sequence of changes ---------------------------
def brute_force(state: ClusterState, index: BucketIndex, resource: str) -> list[list[tuple[int, int]]]:
    spec, r = index.spec(resource), state.res_index[resource]
    out: list[list[tuple[int, int]]] = [[] for _ in range(spec.count)]
    for i in range(state.n):
        value = int(state.free[r, i])
        out[spec.bucket_of(value)].append((value, i))
    return [sorted(b) for b in out]


class BucketMachine(RuleBasedStateMachine):
    """Random add / assume / forget / update / remove / snapshot-restore; the index must follow."""

    @initialize(explicit=st.booleans(), start=st.integers(0, 3))
    def setup(self, explicit: bool, start: int) -> None:
        self.state = ClusterState()
        self.made = 0
        self.bound = 0
        for _ in range(start):
            self.add_node(cpu=8, mem=16, fpga=False)
        specs = {"cpu": BucketSpec.equal(1000, 2000, 4)} if explicit else {}
        self.index = self.state.attach(BucketIndex(self.state, specs))

    @rule(cpu=st.integers(0, 16), mem=st.integers(0, 64), fpga=st.booleans())
    def add_node(self, cpu: int, mem: int, fpga: bool) -> None:
        node = make_node(f"n{self.made}").cpu(cpu).memory(f"{mem}Gi")
        if fpga:
            node = node.resource("example.com/fpga", 4)
        self.made += 1
        self.state.add_node(node.obj())

    @precondition(lambda self: self.state.n > 0)
    @rule(data=st.data(), cpu=st.integers(0, 12_000), mem=st.integers(0, 40))
    def assume(self, data: st.DataObject, cpu: int, mem: int) -> None:
        node = data.draw(st.sampled_from(self.state.names))
        self.bound += 1
        with contextlib.suppress(StateError):  # a binding that does not fit changes nothing
            self.state.assume(bind(f"w{self.bound}", node, cpu=cpu, memory=mem * GI))

    @precondition(lambda self: self.state.bindings)
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        self.state.forget(data.draw(st.sampled_from(sorted(self.state.bindings))))

    @precondition(lambda self: self.state.n > 0)
    @rule(data=st.data(), cpu=st.integers(0, 20), fpga=st.booleans())
    def update_node(self, data: st.DataObject, cpu: int, fpga: bool) -> None:
        name = data.draw(st.sampled_from(self.state.names))
        node = make_node(name).cpu(cpu).memory("16Gi")
        if fpga:
            node = node.resource("example.com/fpga", 2)
        with contextlib.suppress(StateError):  # its bindings no longer fit: nothing may change
            self.state.update_node(node.obj())

    @precondition(lambda self: self.state.n > 0)
    @rule(data=st.data(), cpu=st.integers(0, 20))
    def update_node_releasing(self, data: st.DataObject, cpu: int) -> None:
        """The node's report wins: what no longer fits is released, what stays fits, nothing else moves."""
        name = data.draw(st.sampled_from(self.state.names))
        before = set(self.state.bindings)
        released = self.state.update_node_releasing(make_node(name).cpu(cpu).memory("16Gi").obj())
        gone = {binding.workload for binding, _ in released}
        assert all(binding.node == name for binding, _ in released)
        assert set(self.state.bindings) == before - gone
        self.state.check_invariants()

    @precondition(lambda self: self.state.n > 0)
    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        self.state.remove_node(data.draw(st.sampled_from(self.state.names)), force=True)

    @rule(cpu=st.integers(0, 16))
    def snapshot_then_restore(self, cpu: int) -> None:
        before = {r: brute_force(self.state, self.index, r) for r in self.state.resources}
        snap = self.state.snapshot()
        self.add_node(cpu=cpu, mem=8, fpga=True)
        self.state.restore(snap)
        assert {r: layout(self.index, r) for r in self.state.resources} == before

    @invariant()
    def index_matches_state(self) -> None:
        if not hasattr(self, "index"):
            return
        assert self.index.violations() == []
        self.state.check_invariants()
        for resource in self.state.resources:
            assert layout(self.index, resource) == brute_force(self.state, self.index, resource)
        assert self.state.extras["buckets"] is self.index
        assert not np.any(self.state.free < 0)


TestBucketMachine = BucketMachine.TestCase
