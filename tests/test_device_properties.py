"""Safety properties of device scheduling (hypothesis), as Nomad's rapid "safety properties":

* no device is ever above 100% of any dimension, and held == foreign + grants (state invariants);
* unreserve ∘ reserve is the identity on the accounts;
* rebuilding the state from nodes and bindings gives identical accounts;
* the vectorized filter passes a node exactly when the exact allocator finds an offer there
  (for joint requests with several first-type devices the filter may over-approve, never reject).
"""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DeviceShare, InsufficientDevices, allocate_devices
from finesched.plugins.deviceshare.plugin import DEVICE_REQUEST
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.request import compile_request
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

PCIE = ["p0", "p1", "p2"]
MEMORY = [None, "16Gi", "40Gi", "80Gi"]


@st.composite
def nodes(draw, name: str) -> Node:
    """A node of 0-6 GPUs (mixed memory, some unhealthy, some partly used outside finesched),
    0-2 RDMA NICs, NUMA and PCIe placement and a few NVLinks."""
    gpus = draw(st.integers(0, 6))
    devices, foreign = [], []
    for m in range(gpus):
        memory = draw(st.sampled_from(MEMORY))
        resources = {"gpu-core": 100, "gpu-memory-ratio": 100, **({"gpu-memory": memory} if memory else {})}
        devices.append(
            {
                "type": "gpu",
                "minor": m,
                "health": draw(st.sampled_from([True, True, True, False])),
                "numa": draw(st.integers(0, 1)),
                "pcie": draw(st.sampled_from(PCIE)),
                "resources": resources,
            }
        )
        used = draw(st.sampled_from([0, 0, 0, 10, 50, 100]))
        if used:
            foreign.append({"type": "gpu", "minor": m, "resources": {"gpu-core": used, "gpu-memory-ratio": used}})
    for m in range(draw(st.integers(0, 2))):
        devices.append(
            {"type": "rdma", "minor": m, "numa": draw(st.integers(0, 1)), "pcie": draw(st.sampled_from(PCIE))}
        )
    links = []
    if gpus >= 2:
        for a, b in draw(st.lists(st.tuples(st.integers(0, gpus - 1), st.integers(0, gpus - 1)), max_size=3)):
            if a != b:
                links.append({"type": "gpu", "a": a, "b": b, "bandwidth": draw(st.sampled_from(["300G", "600G"]))})
    return Node.model_validate(
        {
            "name": name,
            "allocatable": {"cpu": "64", "memory": "256Gi"},
            "numaZones": [{"id": 0}, {"id": 1}],
            "devices": devices,
            "foreignAllocations": foreign,
            "links": links,
        }
    )


REQUESTS = st.sampled_from(
    [
        {"koordinator.sh/gpu": 25},
        {"koordinator.sh/gpu": 50},
        {"koordinator.sh/gpu": 100},
        {"koordinator.sh/gpu": 200},
        {"nvidia.com/gpu": 1},
        {"nvidia.com/gpu": 2},
        {"nvidia.com/gpu": 4},
        {"gpu-core": 30, "gpu-memory-ratio": 60},
        {"gpu-core": 10, "gpu-memory": "10Gi"},
        {"gpu-core": 20, "gpu-memory": "30Gi"},
        {"gpu-memory-ratio": 40},
        {"gpu.shared": 2, "gpu": 100},
        {"rdma": 100},
        {"rdma": 50},
        {"gpu": 50, "rdma": 100},
    ]
)
JOINT = st.sampled_from([None, ("SamePCIe", 1), ("SameNUMA", 1)])


def workload(name: str, requests: dict, joint=None, strategy=None) -> Workload:
    data = {"name": name, "requests": {"cpu": "1", **requests}}
    if joint and "rdma" in requests and any(k != "rdma" for k in requests):
        data["deviceJointAllocate"] = {"deviceTypes": ["gpu", "rdma"], "requiredScope": joint[0]}
    if strategy:
        data["deviceAllocateStrategy"] = strategy
    return Workload.model_validate(data)


PROFILE = Profile.model_validate(
    {"name": "p", "plugins": [{"name": "ResourcesFit"}, {"name": "DeviceShare"}, {"name": "LeastRequested"}]}
)
REGISTRY = default_registry().with_plugins({"DeviceShare": DeviceShare.from_args})


def dump(state: ClusterState) -> dict:
    accounts = state.extras["devices"]
    out = {}
    for kind, acc in accounts.types.items():
        index = {name: i for i, name in enumerate(state.names)}
        rows = [index[name] for name in sorted(index)]  # compare by node name, not slot
        out[kind] = [acc.free[:, rows].tolist(), acc.foreign[:, rows].tolist(), acc.hfree[:, rows].tolist()]
    return out


class DeviceMachine(RuleBasedStateMachine):
    @initialize(data=st.data(), count=st.integers(1, 4))
    def build(self, data, count):
        self.nodes = [data.draw(nodes(f"n{i}")) for i in range(count)]
        self.scheduler = Scheduler(ClusterState.from_nodes(self.nodes), profile=PROFILE, registry=REGISTRY)
        self.serial = 0

    @rule(requests=REQUESTS, joint=JOINT, strategy=st.sampled_from([None, "LeastAllocated", "MostAllocated"]))
    def schedule(self, requests, joint, strategy):
        self.serial += 1
        with contextlib.suppress(FitError):
            self.scheduler.schedule_one(workload(f"w{self.serial}", requests, joint, strategy))

    @precondition(lambda self: self.scheduler.state.bindings)
    @rule(data=st.data())
    def release(self, data):
        key = data.draw(st.sampled_from(sorted(self.scheduler.state.bindings)))
        self.scheduler.release(key)

    @precondition(lambda self: self.scheduler.state.bindings)
    @rule(data=st.data())
    def forget_then_assume_is_identity(self, data):
        state = self.scheduler.state
        key = data.draw(st.sampled_from(sorted(state.bindings)))
        before = dump(state)
        binding = state.forget(key)
        state.assume(binding)
        state.commit(key)
        assert dump(state) == before

    @rule(requests=REQUESTS, data=st.data())
    def reserve_then_unreserve_is_identity(self, requests, data):
        """An offer from the exact allocator, assumed then forgotten, leaves the accounts unchanged."""
        state = self.scheduler.state
        share = next(p for p in self.scheduler.framework.plugins if isinstance(p, DeviceShare))
        i = data.draw(st.integers(0, state.n - 1))
        dreq = share.normalize(workload("probe", requests))
        devices = {k: share.accounts.node_devices(i, k) for k in dreq.types}
        try:
            offer = allocate_devices(devices, dreq)
        except InsufficientDevices:
            return
        before = dump(state)
        binding = self.scheduler._binding(compile_request(workload("probe", requests), state, share.owns), i, 0)
        state.assume(binding.model_copy(update={"devices": offer.binding_devices()}))
        state.check_invariants()
        state.forget(binding.workload)
        assert dump(state) == before

    @rule()
    def rebuild_equals_live(self):
        state = self.scheduler.state
        rebuilt = ClusterState.from_nodes(self.nodes, state.bindings.values())
        Scheduler(rebuilt, profile=PROFILE, registry=REGISTRY)
        assert dump(rebuilt) == dump(state)

    @invariant()
    def no_device_above_100_percent(self):
        if hasattr(self, "scheduler"):
            self.scheduler.state.check_invariants()


TestDeviceMachine = DeviceMachine.TestCase
TestDeviceMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), count=st.integers(1, 5), requests=REQUESTS, joint=JOINT)
def test_vectorized_filter_agrees_with_exact_allocator(data, count, requests, joint):
    cluster = [data.draw(nodes(f"n{i}")) for i in range(count)]
    state = ClusterState.from_nodes(cluster)
    share = DeviceShare()
    share.attach(state)
    # some prior use through bindings, so free differs from total - foreign
    for j in range(data.draw(st.integers(0, 4))):
        w = workload(f"pre{j}", data.draw(REQUESTS))
        i = data.draw(st.integers(0, state.n - 1))
        dreq = share.normalize(w)
        try:
            offer = allocate_devices({k: share.accounts.node_devices(i, k) for k in dreq.types}, dreq)
        except InsufficientDevices:
            continue
        request = compile_request(w, state, share.owns)
        state.assume(
            Binding(workload=w.key, node=state.names[i], requests=request.scalar, devices=offer.binding_devices())
        )
    w = workload("probe", requests, joint)
    request = compile_request(w, state, share.owns)
    cycle = CycleState()
    nodes_ = NodeBatch(state)
    if not share.pre_filter(cycle, request, nodes_).ok or DEVICE_REQUEST not in cycle:
        return
    mask = share.filter(cycle, request, nodes_).mask
    dreq = cycle.read(DEVICE_REQUEST)
    exact = []
    for i in range(state.n):
        try:
            allocate_devices({k: share.accounts.node_devices(i, k) for k in dreq.types}, dreq)
            exact.append(True)
        except InsufficientDevices:
            exact.append(False)
    exact = np.array(exact)
    assert not (exact & ~mask).any(), "the filter rejected a node the allocator can use"
    if dreq.joint is None or dreq.types["gpu"].count == 1:
        assert mask.tolist() == exact.tolist()
    # a subset batch (the scheduler's per-shape memo re-evaluates changed nodes only) agrees
    index = np.array(sorted(data.draw(st.sets(st.integers(0, state.n - 1), min_size=1))), dtype=np.intp)
    subset = share.filter(cycle, request, NodeBatch(state, index=index))
    assert subset.mask.tolist() == mask[index].tolist()
    explained = subset.explain()
    rejected = ~subset.mask
    covered = np.zeros(len(index), dtype=bool)
    for why, (where, _code) in explained.items():
        assert len(where) == len(index), why
        covered |= where
    assert not (rejected & ~covered).any(), "every rejected node has a reason"
