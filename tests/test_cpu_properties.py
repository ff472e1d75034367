"""Safety properties of CPU orchestration (hypothesis): what must hold for every input.

* take_cpus / kubelet_take_by_topology / kubelet_static_allocate return exactly `request` CPUs,
  all within `available` (minus held or reserved CPUs), or refuse with the peer's error;
* through the scheduler, with random reserve/release sequences: no CPU is held exclusively
  beyond max_ref_count, the pools partition the CPUs, per-NUMA amounts stay within capacity
  (ClusterState.check_invariants, which runs CPUAccounts.violations);
* the vectorized filters never reject a node the exact reserve step could use (CPUs, memory and
  GPUs under every NUMA policy).
"""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched.cpuset import CPUSet
from finesched.model.binding import Binding
from finesched.model.node import CPUTopology
from finesched.model.workload import Workload
from finesched.plugins.cpu.prefilter import exclusive_checks, numa_checks
from finesched.plugins.cpu.request import compile_cpu_request
from finesched.plugins.cpu_orchestration import (
    AllocatedCPU,
    CPUOrchestration,
    InsufficientCPUs,
    SMTAlignmentError,
    kubelet_static_allocate,
    kubelet_take_by_topology,
    take_cpus,
)
from finesched.plugins.deviceshare.plugin import DeviceShare
from finesched.plugins.numa import NUMAAlign
from finesched.plugins.numa_devices import device_fits
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.request import compile_request
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

REGISTRY = default_registry().with_plugins(
    {
        "CPUOrchestration": CPUOrchestration.from_args,
        "NUMAAlign": NUMAAlign.from_args,
        "DeviceShare": DeviceShare.from_args,
    }
)


@st.composite
def topologies(draw) -> CPUTopology:
    shape = {
        "sockets": draw(st.integers(1, 2)),
        "numaPerSocket": draw(st.integers(1, 2)),
        "coresPerNuma": draw(st.integers(1, 4)),
        "threadsPerCore": draw(st.integers(1, 2)),
    }
    return CPUTopology.model_validate(shape)


@st.composite
def allocation_inputs(draw):
    topo = draw(topologies())
    ids = [c.id for c in topo.cpus]
    available = draw(st.sets(st.sampled_from(ids)))
    held = draw(st.sets(st.sampled_from(ids)))
    max_ref = draw(st.integers(1, 2))
    allocated = [
        AllocatedCPU(cpu, draw(st.sampled_from(["None", "PCPULevel", "NUMANodeLevel"])), draw(st.integers(1, 2)))
        for cpu in sorted(held)
    ]
    request = draw(st.integers(0, len(ids) + 1))
    return topo, CPUSet(available), request, allocated, max_ref


@given(
    allocation_inputs(),
    st.sampled_from(["FullPCPUs", "SpreadByPCPUs"]),
    st.sampled_from(["None", "PCPULevel", "NUMANodeLevel"]),
    st.sampled_from(["MostAllocated", "LeastAllocated"]),
    st.booleans(),
)
def test_take_cpus_returns_exactly_request_cpus_within_available(inputs, bind, exclusive, strategy, use_preferred):
    topo, available, request, allocated, max_ref = inputs
    usable = CPUSet(c for c in available if all(a.ref_count < max_ref for a in allocated if a.cpu == c))
    preferred = CPUSet(sorted(available)[::2]) if use_preferred else None
    try:
        got = take_cpus(
            topo, available, request, bind_policy=bind, exclusive_policy=exclusive, numa_strategy=strategy,
            allocated=allocated, max_ref_count=max_ref, preferred=preferred,
        )  # fmt: skip
    except InsufficientCPUs:
        assert request > len(usable)
        return
    assert len(got) == request and got.is_subset(usable)


@given(allocation_inputs(), st.booleans(), st.integers(1, 2), st.booleans())
def test_kubelet_take_by_topology_returns_exactly_request_cpus(inputs, distribute, group, spread):
    topo, available, request, _, _ = inputs
    try:
        got = kubelet_take_by_topology(
            topo, available, request, distribute_across_numa=distribute, cpu_group_size=group,
            distribute_across_cores=spread,
        )  # fmt: skip
    except InsufficientCPUs:
        assert request > len(available)
        return
    assert len(got) == request and got.is_subset(available)


@given(allocation_inputs(), st.booleans(), st.booleans(), st.data())
def test_kubelet_static_allocate_never_hands_out_reserved_cpus(inputs, full, distribute, data):
    topo, available, request, _, _ = inputs
    reserved = CPUSet(data.draw(st.sets(st.sampled_from(sorted(available)))) if available else ())
    hint = data.draw(st.none() | st.sets(st.sampled_from(topo.numa_ids), min_size=1))
    try:
        got = kubelet_static_allocate(
            topo, available, request, reserved=reserved, full_pcpus_only=full, numa_hint=hint,
            distribute_across_numa=distribute,
        )  # fmt: skip
    except SMTAlignmentError:
        assert full
        return
    except InsufficientCPUs:
        assert request > len(available - reserved)
        return
    assert len(got) == request and got.is_subset(available - reserved)


# Through the scheduler --------------------------------------------------------------------------------------------

NODE_LABELS = [
    {},
    {"node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"},
    {"node.koordinator.sh/cpu-bind-policy": "SpreadByPCPUs"},
    {"node.koordinator.sh/numa-topology-policy": "SingleNUMANode"},
    {"node.koordinator.sh/numa-topology-policy": "Restricted"},
    {"node.koordinator.sh/numa-allocate-strategy": "MostAllocated"},
    {"node.koordinator.sh/numa-allocate-strategy": "DistributeEvenly"},
]
KUBELETS = [{}, {"cpuManagerPolicy": "static", "options": {"full-pcpus-only": "true"}, "reservedCPUs": "0"}]


@st.composite
def clusters(draw):
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        builder = make_node(f"n{k}").topology(2, 1, draw(st.integers(1, 4)), draw(st.integers(1, 2)))
        builder.memory("64Gi").numa(2, memory="32Gi")
        if draw(st.booleans()):
            builder.gpus(4, numa=[0, 0, 1, 1])
        for key, value in draw(st.sampled_from(NODE_LABELS)).items():
            builder.label(key, value)
        nodes.append(builder.set(kubelet=draw(st.sampled_from(KUBELETS))).obj())
    return nodes


@st.composite
def workloads(draw, name: str):
    qos = draw(st.sampled_from(["LSE", "LSR", "LS", "BE", "Guaranteed"]))
    cpus = draw(st.integers(1, 6))
    memory = f"{draw(st.integers(1, 40))}Gi"
    w = make_workload(name)
    gpus = draw(st.integers(0, 3))
    if gpus:
        w = w.request("nvidia.com/gpu", gpus)
    if qos == "BE":
        return w.obj()
    spec = {
        "preferredCPUBindPolicy": draw(st.sampled_from(["Default", "FullPCPUs", "SpreadByPCPUs", "ConstrainedBurst"])),
        "preferredCPUExclusivePolicy": draw(st.sampled_from(["None", "PCPULevel", "NUMANodeLevel"])),
    }
    if draw(st.booleans()):
        spec["requiredCPUBindPolicy"] = draw(st.sampled_from(["FullPCPUs", "SpreadByPCPUs"]))
    w = w.set(resourceSpec=spec, numaTopologyPolicy=draw(st.sampled_from([None, "SingleNUMANode", "BestEffort"])))
    if qos == "LS":
        return w.req(cpu=str(cpus), memory=memory).lim(cpu=str(cpus + 1)).obj()
    w = w.req(cpu=str(cpus), memory=memory).lim(cpu=str(cpus), memory=memory)
    return w.obj() if qos == "Guaranteed" else w.qos(qos).obj()


def new_scheduler(nodes, max_ref: int = 1) -> Scheduler:
    plugins = [
        {"name": "ResourcesFit"},
        {"name": "NUMAAlign"},
        {"name": "CPUOrchestration", "args": {"maxRefCount": max_ref}},
        {"name": "DeviceShare"},
    ]
    return Scheduler(
        ClusterState.from_nodes(nodes), profile=Profile.model_validate({"plugins": plugins}), registry=REGISTRY
    )


@given(clusters(), st.data())
def test_random_reserve_and_release_keep_the_invariants(nodes, data):
    s = new_scheduler(nodes, max_ref=data.draw(st.integers(1, 2)))
    placed: list[Binding] = []
    for step in range(data.draw(st.integers(1, 12))):
        if placed and data.draw(st.booleans()):
            s.release(placed.pop(data.draw(st.integers(0, len(placed) - 1))))
        else:
            with contextlib.suppress(FitError):
                placed.append(s.schedule_one(data.draw(workloads(f"w{step}"))))
        s.state.check_invariants()
        for b in placed:
            assert len(b.cpuset) in (0, b.requests.get("cpu", 0) // 1000)


def loaded(nodes, data) -> tuple[Scheduler, Workload]:
    s = new_scheduler(nodes)
    for step in range(data.draw(st.integers(0, 4))):  # some random load first
        with contextlib.suppress(FitError):
            s.schedule_one(data.draw(workloads(f"pre{step}")))
    return s, data.draw(workloads("probe"))


@given(clusters(), st.data())
def test_vectorized_filters_never_reject_a_node_reserve_could_use(nodes, data):
    s, workload = loaded(nodes, data)
    framework, state = s.framework, s.state
    request = compile_request(workload, state, framework.owns)
    cycle = CycleState()
    skipped = framework.run_pre_filter(cycle, request, NodeBatch(state))
    ours = [p for p in framework.points.filter if p.NAME in ("NUMAAlign", "CPUOrchestration") and p.NAME not in skipped]
    for plugin in ours:
        mask = plugin.filter(cycle, request, NodeBatch(state)).mask
        for node in range(state.n):
            if mask[node]:
                continue
            trial = cycle.clone()
            status = framework.run_reserve(trial, request, node)
            assert not status.ok, f"{plugin.NAME} rejected node {node} but reserve succeeded"


@given(clusters(), st.data())
def test_numpy_and_small_batch_paths_agree(nodes, data):
    s, workload = loaded(nodes, data)
    state = s.state
    acc = state.extras["cpus"]
    req = compile_cpu_request(workload)
    numa = next(p for p in s.framework.plugins if p.NAME == "NUMAAlign")
    cycle = CycleState()
    s.framework.run_pre_filter(cycle, compile_request(workload, state, s.framework.owns), NodeBatch(state))
    subset = data.draw(st.lists(st.integers(0, state.n - 1), unique=True).map(sorted))
    for batch in (NodeBatch(state), NodeBatch(state, index=np.array(subset, dtype=np.intp))):
        devices = device_fits(cycle, numa.state, batch)
        for check in (
            lambda small, b=batch: exclusive_checks(acc, req, b, small=small),
            lambda small, b=batch, d=devices: numa_checks(acc, req, b, d, small=small),
        ):
            fast, vectorized = check(10**9), check(0)
            assert nonempty(fast) == nonempty(vectorized)


def nonempty(checks) -> dict[str, tuple[bool, ...]]:
    return {reason: tuple(mask.tolist()) for reason, (mask, _) in checks.items() if mask.any()}
