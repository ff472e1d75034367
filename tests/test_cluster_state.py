"""ClusterState: node lifecycle, assume/forget, snapshots, and the invariants that must always hold."""

from __future__ import annotations

import numpy as np
import pytest

from builders import make_node, make_workload
from finesched import ClusterState, Scheduler
from finesched.errors import InvariantViolation
from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.resources import ResourceVector
from finesched.state.cluster import StateError
from finesched.state.invariants import check

GI = 2**30


def binding(workload: str, node: str, **requests: int) -> Binding:
    """A binding of canonical amounts (millicores, bytes): a ResourceVector is taken as is."""
    return Binding(workload=workload, node=node, requests=ResourceVector(requests))


@pytest.fixture
def state() -> ClusterState:
    return ClusterState.from_nodes(
        [make_node("a").cpu("8").memory("16Gi").obj(), make_node("b").cpu("4").memory("8Gi").label("zone", "x").obj()]
    )


def free(state: ClusterState, node: str, resource: str) -> int:
    return int(state.free[state.res_index[resource], state.index[node]])


def test_from_nodes_lays_out_rows_and_defaults(state: ClusterState) -> None:
    assert state.n == 2 and state.names == ["a", "b"]
    assert free(state, "a", "cpu") == 8000 and free(state, "b", "memory") == 8 * GI
    assert free(state, "a", "pods") == 110  # kubelet default maxPods
    assert state.totals()["cpu"] == 12000
    # 1/allocatable is 0 where allocatable is 0, never inf
    assert np.isfinite(state.inv_allocatable).all()


def test_assume_and_forget_move_amounts_exactly(state: ClusterState) -> None:
    state.assume(binding("ns/w", "a", cpu=3000, memory=GI, pods=1))
    assert free(state, "a", "cpu") == 5000 and int(state.used_of("cpu")[0]) == 3000
    state.check_invariants()
    state.forget("ns/w")
    assert free(state, "a", "cpu") == 8000 and state.bindings == {}
    state.check_invariants()


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        pytest.param({"cpu": 9000}, r"cpu \(asks 9000, 8000 free\)", id="over-free"),
        pytest.param({"nvidia.com/gpu": 1}, r"nvidia.com/gpu \(asks 1, 0 free\)", id="unknown-resource"),
    ],
)
def test_assume_refuses_what_does_not_fit_and_changes_nothing(
    state: ClusterState, requests: dict[str, int], message: str
) -> None:
    before = state.free.copy()
    with pytest.raises(StateError, match=message):
        state.assume(Binding(workload="ns/w", node="a", requests=ResourceVector(requests)))
    assert (state.free == before).all() and state.bindings == {}


def test_double_assume_and_unknown_node_are_refused(state: ClusterState) -> None:
    state.assume(binding("ns/w", "a", cpu=1000))
    with pytest.raises(StateError, match="already bound to a"):
        state.assume(binding("ns/w", "b", cpu=1000))
    with pytest.raises(StateError, match="no node named 'zz'"):
        state.assume(binding("ns/v", "zz", cpu=1000))
    with pytest.raises(StateError, match="no binding for workload ns/nope"):
        state.forget("ns/nope")


def test_commit_marks_durable(state: ClusterState) -> None:
    state.assume(binding("ns/w", "a", cpu=1000))
    assert not state.is_committed("ns/w")
    state.commit("ns/w")
    assert state.is_committed("ns/w")
    with pytest.raises(StateError):
        state.commit("ns/other")


def test_remove_node_refused_while_bound_unless_forced(state: ClusterState) -> None:
    state.assume(binding("ns/w", "a", cpu=1000))
    with pytest.raises(StateError, match="holds 1 binding"):
        state.remove_node("a")
    released = state.remove_node("a", force=True)
    assert [b.workload for b in released] == ["ns/w"]
    # b moved into slot 0; its labels and amounts moved with it
    assert state.names == ["b"] and state.index == {"b": 0} and free(state, "b", "cpu") == 4000
    assert state.labels.match({"zone": "x"}, 1).tolist() == [True]
    state.check_invariants()


def test_update_node_keeps_bindings_or_changes_nothing(state: ClusterState) -> None:
    state.assume(binding("ns/w", "a", cpu=6000))
    state.update_node(make_node("a").cpu("16").memory("16Gi").label("zone", "y").obj())
    assert free(state, "a", "cpu") == 10000
    assert state.labels.match({"zone": "y"}, 2).tolist() == [True, False]
    before = state.free.copy()
    with pytest.raises(StateError, match="bindings no longer fit"):
        state.update_node(make_node("a").cpu("4").memory("16Gi").obj())
    assert (state.free == before).all() and state.node("a").allocatable["cpu"] == 16000
    state.check_invariants()


def test_growth_is_amortized_and_new_resources_add_rows() -> None:
    state = ClusterState(capacity=1)
    for i in range(300):
        state.add_node(make_node(f"n{i}").cpu("1").obj())
    assert state.n == 300 and state._capacity >= 300 and state._capacity < 1200
    state.add_node(make_node("fancy").cpu("1").resource("example.com/foo", "3").obj())
    assert "example.com/foo" in state.res_index
    assert free(state, "fancy", "example.com/foo") == 3 and free(state, "n0", "example.com/foo") == 0
    with pytest.raises(StateError, match="already exists"):
        state.add_node(make_node("n0").cpu("1").obj())
    state.check_invariants()


def test_snapshot_restore_is_exact(state: ClusterState) -> None:
    state.assume(binding("ns/w", "a", cpu=1000))
    snap = state.snapshot()
    state.assume(binding("ns/v", "b", cpu=1000))
    state.remove_node("a", force=True)
    state.add_node(make_node("c").cpu("2").obj())
    state.restore(snap)
    assert state.names == ["a", "b"] and list(state.bindings) == ["ns/w"]
    assert free(state, "a", "cpu") == 7000 and free(state, "b", "cpu") == 4000
    state.check_invariants()


def test_invariant_checker_reports_every_violation(state: ClusterState) -> None:
    state.assume(binding("ns/w", "a", cpu=1000))
    state._free[0, 0] = -5  # corrupt: negative free, and free + held != allocatable
    state.bindings["ns/ghost"] = binding("ns/ghost", "nowhere", cpu=1)
    rules = sorted({v.rule for v in check(state)})
    assert rules == ["binding-node-exists", "free-plus-held-is-allocatable", "no-negative-free"]
    with pytest.raises(InvariantViolation, match="no-negative-free"):
        state.check_invariants()


def test_zero_allocatable_resource_needs_no_division(state: ClusterState) -> None:
    state.add_node(make_node("empty").cpu("0").memory("0").obj())
    assert state.inv_allocatable[state.res_index["cpu"], state.index["empty"]] == 0.0
    w = make_workload("w").req(cpu="1").obj()
    assert w.requests["cpu"] == 1000


def test_fast_construct_equals_model_construct() -> None:
    from finesched.cpuset import CPUSet
    from finesched.model.base import fast_construct

    values = {
        "workload": "ns/w",
        "node": "a",
        "tenant": "ns",
        "priority": 3,
        "qos": "LS",
        "requests": ResourceVector({"cpu": 1000}),
        "cpuset": CPUSet(),
        "cpu_exclusive_policy": "None",
        "numa": (),
        "devices": {},
        "annotations": {},
        "score": 42,
    }
    assert set(values) == set(Binding.model_fields)  # every field given, as fast_construct requires
    fast = fast_construct(Binding, dict(values))
    slow = Binding.model_construct(**values)
    assert fast == slow and fast.model_dump() == slow.model_dump()
    assert Binding.model_validate(fast.model_dump(mode="json")) == fast


def test_fast_copy_equals_model_copy() -> None:
    from finesched.cpuset import CPUSet
    from finesched.model.base import fast_copy

    for binding in (
        Binding(workload="ns/w", node="a", requests=ResourceVector({"cpu": 1000})),  # only some fields set
        Binding.model_construct(workload="ns/w", node="a"),
    ):
        update = {"cpuset": CPUSet([0, 1]), "annotations": {"k": "v"}}
        fast, slow = fast_copy(binding, update), binding.model_copy(update=update)
        assert fast == slow and fast.model_dump() == slow.model_dump()
        assert fast.model_fields_set == slow.model_fields_set
        assert (fast.__pydantic_extra__, fast.__pydantic_private__) == (slow.__pydantic_extra__, None)
        assert binding.cpuset == CPUSet()  # the original is untouched


def gpu_node(cards: int) -> Node:
    return make_node("g").topology(1, 1, 8, 2).memory("64Gi").gpus(cards, memory="80Gi").obj()


def two_cards_two_gpu_workloads() -> tuple[ClusterState, Scheduler]:
    """Node g with two 80Gi cards, each held whole by an LSR workload (a, b) of two CPUs."""
    state = ClusterState.from_nodes([gpu_node(2)])
    sched = Scheduler(state)
    for name in ("a", "b"):
        w = make_workload(name).req(cpu="2", memory="1Gi").lim(cpu="2", memory="1Gi").qos("LSR")
        sched.schedule_one(w.request("nvidia.com/gpu", 1).obj())
    return state, sched


def test_a_failed_update_leaves_every_account_of_the_node_as_it_was() -> None:
    """Scalars, CPU ownership, device grants and tenant usage: the old node is re-applied exactly."""
    state, sched = two_cards_two_gpu_workloads()
    cpus, devices = state.extras["cpus"], state.extras["devices"]
    before = (state.free.copy(), cpus.view(0), devices.export_encoded(0), sched.queue.usage("default"))
    with pytest.raises(StateError, match="bindings no longer fit"):
        state.update_node(gpu_node(1))  # one card cannot hold two whole-GPU bindings
    after = (state.free.copy(), cpus.view(0), devices.export_encoded(0), sched.queue.usage("default"))
    assert (before[0] == after[0]).all() and before[1:] == after[1:]
    assert len(state.node("g").devices) == 2
    state.check_invariants()


def test_a_node_that_lost_a_card_is_applied_and_only_the_binding_on_that_card_is_released() -> None:
    """The node's report is the machine's truth: the manifest with one card fewer is applied, the
    binding on the card that is gone is forgotten and returned with why, the other stays committed."""
    state, _ = two_cards_two_gpu_workloads()
    on_second = next(b for b in state.bindings.values() if b.devices["gpu"][0].minor == 1)
    kept = next(key for key in state.bindings if key != on_second.workload)
    assert state.update_node_releasing(gpu_node(2)) == []  # nothing changed: nothing released
    [(released, why)] = state.update_node_releasing(gpu_node(1))
    assert released == on_second and "no gpu with minor 1" in why
    assert list(state.bindings) == [kept] and state.is_committed(kept)
    assert len(state.node("g").devices) == 1
    state.check_invariants()
    smaller = make_node("g").topology(1, 1, 1, 1).memory("64Gi").gpus(1, memory="80Gi").obj()
    [(released, why)] = state.update_node_releasing(smaller)  # one CPU left: the LSR's two do not fit
    assert released.workload == kept and not state.bindings and why
    assert state.free[state.res_index["cpu"], 0] == 1000
    state.check_invariants()


def test_a_refused_node_leaves_no_new_resource_rows() -> None:
    from finesched.model.node import ForeignAllocation
    from finesched.state.devices import attach_device_accounts

    state = ClusterState.from_nodes([make_node("a").cpu("4").memory("8Gi").obj()])
    attach_device_accounts(state)  # the extra that refuses the node below
    rows = list(state.resources)
    over = ForeignAllocation(type="gpu", minor=0, resources={"gpu-core": 500})
    good = make_node("b").cpu("4").memory("8Gi").resource("example.com/foo", "1").gpus(1).obj()
    with pytest.raises(StateError, match="500 foreign gpu-core"):
        state.add_node(good.model_copy(update={"foreign_allocations": (over,)}))  # skips validation
    assert state.resources == rows and set(state.res_index) == set(rows) and state.free.shape[0] == len(rows)
    state.add_node(good)
    assert "example.com/foo" in state.res_index
    state.check_invariants()
