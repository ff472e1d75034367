"""Member counts agree with placing copies one by one (hypothesis).

On random single nodes (GPUs with random existing shares, a CPU topology with some CPUs taken,
NUMA policies, MIG layouts) and random requests, `Framework.run_count` equals the number of copies
`Scheduler.schedule_one` places one after another on that one-node cluster until FitError, for the
requests the plugins count exactly; for the others (documented upper bounds: shares spread over
several GPUs, several MIG profiles, exclusive policies) it is never below that number. Partition
tables (Honor / Prefer, with and without a gpu-partition-spec) are counted exactly.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_node
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.mig import mig_resource
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from member_counts import CPU_PROFILE, copy_of, counts, placed_one_by_one
from test_member_count import table_node
from test_mig_properties import PROFILES, mig_nodes

MEMORY = [None, "16Gi", "40Gi", "80Gi"]
#: (requests, exact): exact where the count must equal what is placed one by one.
GPU_REQUESTS = [
    ({"koordinator.sh/gpu": 25}, True),
    ({"koordinator.sh/gpu": 50}, True),
    ({"koordinator.sh/gpu": 100}, True),
    ({"koordinator.sh/gpu": 200}, True),
    ({"nvidia.com/gpu": 1}, True),
    ({"nvidia.com/gpu": 2}, True),
    ({"gpu-core": 30, "gpu-memory-ratio": 60}, True),
    ({"gpu-core": 10, "gpu-memory": "10Gi"}, True),
    ({"gpu-core": 20, "gpu-memory": "30Gi"}, True),
    ({"gpu-memory-ratio": 40}, True),
    ({"gpu.shared": 2, "gpu": 100}, False),
    ({"gpu.shared": 3, "gpu": 150}, False),
]


@st.composite
def gpu_nodes(draw: Any) -> tuple[Node, list[dict[str, Any]]]:
    """A node of 0-5 GPUs (mixed memory, some unhealthy) and 0-6 shares already placed there."""
    builder = make_node("n").cpu(str(draw(st.integers(4, 32)))).memory("256Gi")
    for _ in range(draw(st.integers(0, 5))):
        builder.gpus(1, memory=draw(st.sampled_from(MEMORY)), healthy=draw(st.sampled_from([True, True, True, False])))
    held = draw(st.lists(st.sampled_from([r for r, _ in GPU_REQUESTS]), max_size=6))
    return builder.obj(), [{"name": "held", "requests": {"cpu": "1", **r}} for r in held]


def make_scheduler(node: Node, held: list[dict[str, Any]], profile: Any = "default") -> Scheduler:
    scheduler = Scheduler(ClusterState.from_nodes([node]), profile)
    for k, data in enumerate(held):
        with contextlib.suppress(FitError):  # a held share that does not fit is simply not there
            scheduler.schedule_one(copy_of(data, k))
    return scheduler


def agrees(make: Any, data: dict[str, Any], exact: bool) -> None:
    got = int(counts(make(), Workload.model_validate(data))[0])
    placed = placed_one_by_one(make, data)
    if exact:
        assert got == placed, (data, got, placed)
    else:
        assert got >= placed, (data, got, placed)


@settings(max_examples=60, deadline=None)
@given(
    node=gpu_nodes(),
    pick=st.sampled_from(GPU_REQUESTS),
    cpu=st.sampled_from(["500m", "1", "3"]),
    strategy=st.sampled_from([None, "LeastAllocated", "MostAllocated"]),
)
def test_gpu_counts_match_placing_one_by_one(node, pick, cpu, strategy) -> None:
    base, held = node
    requests, exact = pick
    data: dict[str, Any] = {"name": "m", "requests": {"cpu": cpu, **requests}}
    if strategy:
        data["deviceAllocateStrategy"] = strategy
    agrees(lambda: make_scheduler(base, held), data, exact)


@settings(max_examples=40, deadline=None)
@given(
    node=mig_nodes("n"), wants=st.lists(st.sampled_from(PROFILES), min_size=1, max_size=2, unique=True), data=st.data()
)
def test_mig_counts_match_placing_one_by_one(node, wants, data) -> None:
    requests = {mig_resource(p): data.draw(st.integers(1, 2)) for p in wants}
    agrees(lambda: make_scheduler(node, []), {"name": "m", "requests": {"cpu": "1", **requests}}, len(wants) == 1)


NODE_LABELS = [
    {},
    {"node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"},
    {"node.koordinator.sh/numa-topology-policy": "SingleNUMANode"},
]


@st.composite
def cpu_nodes(draw: Any) -> tuple[Node, list[dict[str, Any]], int]:
    """2 NUMA nodes of 1-4 cores x 1-2 threads, maybe 4 GPUs on them, and a few LSE/LSR/LS already placed."""
    threads = draw(st.integers(1, 2))
    builder = make_node("n").topology(2, 1, draw(st.integers(1, 4)), threads).memory("64Gi").numa(2, memory="32Gi")
    if draw(st.booleans()):
        builder.gpus(4, numa=[0, 0, 1, 1])
    for key, value in draw(st.sampled_from(NODE_LABELS)).items():
        builder.label(key, value)
    held = [
        {**cpu_workload(draw(st.sampled_from(["LSE", "LSR", "LS"])), draw(st.integers(1, 3)), threads, "2Gi", {}),
         "name": "held"}
        for _ in range(draw(st.integers(0, 3)))
    ]  # fmt: skip
    return builder.obj(), held, threads


def cpu_workload(qos: str, cpus: int, threads: int, memory: str, extra: dict[str, Any]) -> dict[str, Any]:
    if "requiredCPUBindPolicy" in extra.get("resourceSpec", {}):
        cpus = cpus * threads  # whole cores
    data = {
        "name": "m",
        "requests": {"cpu": str(cpus), "memory": memory, **extra.pop("requests", {})},
        "limits": {"cpu": str(cpus), "memory": memory},
        **extra,
    }
    return {**data, "qos": qos} if qos != "LS" else data


@settings(max_examples=60, deadline=None)
@given(
    node=cpu_nodes(),
    qos=st.sampled_from(["LSE", "LSR", "LS"]),
    cpus=st.integers(1, 4),
    memory=st.sampled_from(["1Gi", "12Gi"]),
    numa=st.sampled_from([None, "SingleNUMANode"]),
    bind=st.sampled_from([None, "FullPCPUs", "SpreadByPCPUs"]),
    exclusive=st.sampled_from([None, None, "PCPULevel", "NUMANodeLevel"]),
    gpus=st.integers(0, 2),
)
def test_cpu_counts_match_placing_one_by_one(node, qos, cpus, memory, numa, bind, exclusive, gpus) -> None:
    """Exact but for an exclusive policy or a required SpreadByPCPUs (upper bounds, documented)."""
    base, held, threads = node
    extra: dict[str, Any] = {}
    if numa:
        extra["numaTopologyPolicy"] = numa
    spec = {}
    if bind and qos != "LS":
        spec["requiredCPUBindPolicy"] = bind
    if exclusive:
        spec["preferredCPUExclusivePolicy"] = exclusive
    if spec:
        extra["resourceSpec"] = spec
    if gpus:
        extra["requests"] = {"nvidia.com/gpu": gpus}
    data = cpu_workload(qos, cpus, threads, memory, extra)
    exact = exclusive is None and bind != "SpreadByPCPUs"
    agrees(lambda: make_scheduler(base, held, CPU_PROFILE), data, exact)


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(["Honor", "Prefer"]),
    busy=st.sets(st.integers(0, 7), max_size=5),
    gpus=st.sampled_from([1, 2, 4]),
    spec=st.sampled_from([None, "Restricted", "BestEffort"]),
)
def test_partition_counts_match_placing_one_by_one(policy, busy, gpus, spec) -> None:
    node = table_node(policy)

    def make() -> Scheduler:
        scheduler = Scheduler(ClusterState.from_nodes([node]))
        for m in sorted(busy):
            grants = {"gpu-core": 10, "gpu-memory-ratio": 10, "gpu-memory": 8 * 2**30}
            binding = Binding(
                workload=f"other/b{m}", node="hgx", devices={"gpu": [DeviceGrant(minor=m, resources=grants)]}
            )
            scheduler.state.assume(binding)
        return scheduler

    data: dict[str, Any] = {"name": "m", "requests": {"cpu": "1", "nvidia.com/gpu": gpus}}
    if spec is not None:
        data["gpuPartitionSpec"] = {"allocatePolicy": spec}
    agrees(make, data, True)
