"""Member counts (`Framework.run_count`, the `Count` extension point): hand-worked cases per plugin.

Each case gives one node and a request; the count is checked against the worked number in the
case and against placing copies one by one (tests/member_counts.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from builders import make_node
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import NO_LIMIT, NodeBatch
from finesched.sched.profile import Profile
from finesched.sched.request import compile_request
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from member_counts import CPU_PROFILE, copy_of, counts, placed_one_by_one

GPU4 = make_node("g4").cpu("16").memory("64Gi").gpus(4, memory="80Gi").obj()


def scheduler(node: Node, profile: Any = "default") -> Scheduler:
    return Scheduler(ClusterState.from_nodes([node]), profile)


def check(node: Node, requests: dict[str, Any], want: int, profile: Any = "default", **extra: Any) -> None:
    data = {"name": "m", "requests": requests, **extra}
    got = counts(scheduler(node, profile), Workload.model_validate(data))
    assert got.tolist() == [want]
    assert placed_one_by_one(lambda: scheduler(node, profile), data) == want


@pytest.mark.parametrize(
    ("requests", "want"),
    [
        pytest.param({"cpu": "1"}, 16, id="cpu-16-of-16"),
        pytest.param({"cpu": "3", "memory": "10Gi"}, 5, id="cpu-binds-before-memory"),
        pytest.param({"cpu": "1", "memory": "20Gi"}, 3, id="memory-binds"),
        pytest.param({"cpu": "100m"}, 110, id="pods-cap-110"),
        pytest.param({"cpu": "1", "example.com/fish": 1}, 0, id="unknown-resource"),
    ],
)
def test_scalar_resources(requests: dict[str, Any], want: int) -> None:
    check(make_node("n").cpu("16").memory("64Gi").pods(110).obj(), requests, want)


@pytest.mark.parametrize(
    ("requests", "want"),
    [
        # 4 cards x floor(100 / 30) = 12 on the cards; cpu allows 16
        pytest.param({"cpu": "1", "koordinator.sh/gpu": 30}, 12, id="share-30-percent"),
        # gpu-core 10 -> 10 per card; 30Gi of 80Gi -> 2 per card: memory binds, 8
        pytest.param({"cpu": "1", "gpu-core": 10, "gpu-memory": "30Gi"}, 8, id="share-bytes"),
        pytest.param({"cpu": "1", "gpu-core": 30, "gpu-memory-ratio": 60}, 4, id="ratio-binds"),
        pytest.param({"cpu": "1", "nvidia.com/gpu": 1}, 4, id="whole-1"),
        pytest.param({"cpu": "1", "nvidia.com/gpu": 3}, 1, id="whole-3-of-4"),
        pytest.param({"cpu": "1", "nvidia.com/gpu": 8}, 0, id="whole-more-than-node"),
        # 3 cards of 40% each: 2 per card; t=2: 4*2 = 8 >= 6, t=3: 8 < 9
        pytest.param({"cpu": "100m", "gpu.shared": 3, "gpu": 120}, 2, id="multi-card-shares"),
        # 200% = two whole cards per copy
        pytest.param({"cpu": "1", "koordinator.sh/gpu": 200}, 2, id="two-cards-per-copy"),
    ],
)
def test_gpu_shares(requests: dict[str, Any], want: int) -> None:
    check(GPU4, requests, want)


def test_gpu_shares_on_partly_used_cards() -> None:
    """Cards 0 and 1 half used, card 2 unhealthy: 60% fits on card 3 only, 40% on cards 0, 1 (1 each)
    and card 3 (2): the count is per card, not from the node's summed free share."""
    node = make_node("n").cpu("16").memory("64Gi").gpus(2, memory="80Gi").gpus(1, healthy=False).gpus(1).obj()
    busy = {"cpu": "1", "koordinator.sh/gpu": 50}
    for requests, want in (({"cpu": "1", "koordinator.sh/gpu": 60}, 1), ({"cpu": "1", "koordinator.sh/gpu": 40}, 4)):

        def make() -> Scheduler:
            s = scheduler(node)
            for k in range(2):
                s.schedule_one(copy_of({"name": "busy", "requests": busy}, k))
            return s

        data = {"name": "m", "requests": requests}
        assert counts(make(), Workload.model_validate(data)).tolist() == [want]
        assert placed_one_by_one(make, data) == want


def test_scalar_share_of_a_node_hides_gpu_fragmentation() -> None:
    """Four cards at 70% used: 120% free in total, yet not one 50% share fits."""
    s = scheduler(GPU4)
    for k in range(4):
        s.schedule_one(copy_of({"name": "busy", "requests": {"cpu": "1", "koordinator.sh/gpu": 70}}, k))
    assert counts(s, Workload.model_validate({"name": "m", "requests": {"koordinator.sh/gpu": 50}})).tolist() == [0]
    assert counts(s, Workload.model_validate({"name": "m", "requests": {"koordinator.sh/gpu": 30}})).tolist() == [4]


def test_infeasible_nodes_count_zero_and_subset_batches() -> None:
    nodes = [
        make_node("a").cpu("8").memory("16Gi").obj(),
        make_node("b").cpu("2").memory("16Gi").label("zone", "x").obj(),
        make_node("c").cpu("1").memory("16Gi").obj(),
    ]
    s = Scheduler(ClusterState.from_nodes(nodes))
    w = Workload.model_validate({"name": "m", "requests": {"cpu": "2"}})
    assert counts(s, w).tolist() == [4, 1, 0]
    request = compile_request(w, s.state, s.framework.owns)
    cycle = CycleState()
    batch = NodeBatch(s.state, index=np.array([1, 2]))
    skipped = s.framework.run_pre_filter(cycle, request, batch)
    feasible, _ = s.framework.run_filter(cycle, request, batch, skipped)
    assert s.framework.run_count(cycle, request, batch, feasible, skipped).tolist() == [1, 0]


def test_no_counting_plugin_puts_no_limit() -> None:
    profile = Profile.model_validate({"name": "p", "plugins": [{"name": "NodeSelector"}]})
    s = scheduler(make_node("n").cpu("1").obj(), profile)
    assert counts(s, Workload.model_validate({"name": "m", "requests": {"cpu": "8"}})).tolist() == [NO_LIMIT]


# CPU: exclusive cpusets (CPUOrchestration) and NUMA policies (NUMAAlign) ---------------------------
BIND_LABEL = "node.koordinator.sh/cpu-bind-policy"
NUMA_LABEL = "node.koordinator.sh/numa-topology-policy"


def cpu_node(labels: dict[str, str] | None = None, gpus: bool = False) -> Node:
    """2 NUMA nodes x 4 cores x 2 threads (16 CPUs, 8 per NUMA node), 32Gi per NUMA node."""
    builder = make_node("c").topology(2, 1, 4, 2).memory("64Gi").numa(2, memory="32Gi")
    if gpus:
        builder.gpus(4, numa=[0, 0, 1, 1])
    for key, value in (labels or {}).items():
        builder.label(key, value)
    return builder.obj()


def lse(cpus: int, memory: str = "1Gi", **extra: Any) -> dict[str, Any]:
    requests = {"cpu": str(cpus), "memory": memory, **extra.pop("requests", {})}
    return {"name": "m", "qos": "LSE", "requests": requests, "limits": {"cpu": str(cpus), "memory": memory}, **extra}


@pytest.mark.parametrize(
    ("labels", "data", "want"),
    [
        pytest.param({}, lse(3), 5, id="lse-3-of-16"),
        # required FullPCPUs: 3 is not a multiple of 2 threads per core -> the filter refuses
        pytest.param({BIND_LABEL: "FullPCPUsOnly"}, lse(3), 0, id="full-pcpus-smt"),
        pytest.param({BIND_LABEL: "FullPCPUsOnly"}, lse(4), 4, id="full-pcpus-4"),
        # one NUMA node per copy: 8 // 3 = 2 on each, 4 (not 16 // 3 = 5)
        pytest.param({NUMA_LABEL: "SingleNUMANode"}, lse(3), 4, id="single-numa-cpus"),
        pytest.param({}, lse(3, numaTopologyPolicy="SingleNUMANode"), 4, id="single-numa-workload-policy"),
        # memory per NUMA node: 32Gi // 20Gi = 1 per NUMA node
        pytest.param({NUMA_LABEL: "SingleNUMANode"}, lse(1, "20Gi"), 2, id="single-numa-memory"),
        pytest.param({}, lse(1, "20Gi"), 3, id="memory-over-numa-without-policy"),
    ],
)
def test_exclusive_cpusets_and_numa(labels: dict[str, str], data: dict[str, Any], want: int) -> None:
    node = cpu_node(labels)
    got = counts(scheduler(node, CPU_PROFILE), Workload.model_validate(data))
    assert got.tolist() == [want]
    assert placed_one_by_one(lambda: scheduler(node, CPU_PROFILE), data) == want


@pytest.mark.parametrize(
    ("cpus", "gpus", "want"),
    [
        pytest.param(2, 1, 4, id="gpu-per-numa-2x2"),  # per NUMA node min(8 // 2, 2 GPUs) = 2
        pytest.param(2, 2, 2, id="two-gpus-one-numa"),  # min(4, 1 pair) = 1 per NUMA node
        pytest.param(6, 1, 2, id="cpus-bind"),  # min(8 // 6, 2) = 1 per NUMA node
    ],
)
def test_single_numa_node_with_gpus(cpus: int, gpus: int, want: int) -> None:
    node = cpu_node({NUMA_LABEL: "SingleNUMANode"}, gpus=True)
    data = lse(cpus, requests={"nvidia.com/gpu": gpus})
    assert counts(scheduler(node, CPU_PROFILE), Workload.model_validate(data)).tolist() == [want]
    assert placed_one_by_one(lambda: scheduler(node, CPU_PROFILE), data) == want


def test_exclusive_count_after_a_half_core_is_taken() -> None:
    """An LSR of 1 CPU leaves its core's sibling: 14 whole-core CPUs remain (7 copies of 2 and 3 of
    4 under a required FullPCPUs), while 15 available CPUs give 5 copies of 3 without it."""
    full = {"resourceSpec": {"requiredCPUBindPolicy": "FullPCPUs"}}

    def make() -> Scheduler:
        s = scheduler(cpu_node(), CPU_PROFILE)
        s.schedule_one(Workload.model_validate({**lse(1), "name": "one", "qos": "LSR"}))
        return s

    for data, want in ((lse(2, **full), 7), (lse(4, **full), 3), (lse(3), 5)):
        assert counts(make(), Workload.model_validate(data)).tolist() == [want]
        assert placed_one_by_one(make, data) == want


# MIG and partition tables ----------------------------------------------------------------------------
def mig_node(*cards: tuple[str, str, list[dict[str, Any]]]) -> Node:
    devices = [
        {"type": "gpu", "minor": m, "mig": {"product": product, "mode": mode, "instances": instances}}
        for m, (product, mode, instances) in enumerate(cards)
    ]
    return Node.model_validate({"name": "mig", "allocatable": {"cpu": "64", "memory": "64Gi"}, "devices": devices})


@pytest.mark.parametrize(
    ("cards", "requests", "want"),
    [
        pytest.param([("A100-40GB", "dynamic", [])], {"nvidia.com/mig-1g.5gb": 1}, 7, id="seven-1g"),
        pytest.param([("A100-40GB", "dynamic", [])], {"nvidia.com/mig-1g.5gb": 2}, 3, id="pairs-of-1g"),
        pytest.param([("A100-40GB", "dynamic", [])], {"nvidia.com/mig-3g.20gb": 1}, 2, id="two-3g"),
        pytest.param(
            [("A100-40GB", "dynamic", []), ("A100-40GB", "static", [{"profile": "3g.20gb", "start": 4}])],
            {"nvidia.com/mig-3g.20gb": 1},
            3,
            id="dynamic-and-static",
        ),
        pytest.param(
            [("A100-40GB", "dynamic", [{"profile": "1g.5gb", "start": 6}])],
            {"nvidia.com/mig-4g.20gb": 1},
            1,
            id="4g-beside-1g",
        ),
    ],
)
def test_mig(cards: list[tuple[str, str, list[dict[str, Any]]]], requests: dict[str, int], want: int) -> None:
    node = mig_node(*cards)
    data = {"name": "m", "requests": {"cpu": "1", **requests}}
    assert counts(scheduler(node), Workload.model_validate(data)).tolist() == [want]
    assert placed_one_by_one(lambda: scheduler(node), data) == want


PAIRS = [[0, 1], [2, 3], [4, 5], [6, 7]]
TABLE: dict[str, list[dict[str, Any]]] = {
    "4": [{"minors": [0, 1, 2, 3], "allocationScore": 1}, {"minors": [4, 5, 6, 7], "allocationScore": 1}],
    "2": [
        *({"minors": p, "allocationScore": 1} for p in PAIRS),
        {"minors": [1, 2], "allocationScore": 0},
        {"minors": [5, 6], "allocationScore": 0},
    ],
    "1": [{"minors": [m], "allocationScore": 1} for m in range(8)],
}


def table_node(policy: str | None) -> Node:
    data: dict[str, Any] = {
        "name": "hgx",
        "allocatable": {"cpu": "64", "memory": "512Gi"},
        "devices": [{"type": "gpu", "minor": m, "resources": {"gpu-memory": "80Gi"}} for m in range(8)],
        "gpuPartitions": TABLE,
    }
    if policy is not None:
        data["policies"] = {"gpuPartitionPolicy": policy}
    return Node.model_validate(data)


@pytest.mark.parametrize(
    ("policy", "busy", "gpus", "want"),
    [
        pytest.param("Honor", [], 2, 4, id="honor-four-pairs"),
        # GPUs 0 and 5 busy: pairs [2,3] and [6,7] stay; [1,2] / [5,6] overlap them or a busy GPU
        pytest.param("Honor", [0, 5], 2, 2, id="honor-busy-breaks-pairs"),
        # GPUs 0 and 3 busy: pair [1,2] (score 0) is the only one on that side; [4,5], [6,7]
        pytest.param("Honor", [0, 3], 2, 3, id="honor-cross-pair"),
        pytest.param("Honor", [1], 4, 1, id="honor-fours"),
        pytest.param("Honor", [], 3, 0, id="honor-no-3-gpu-partition"),
        # Prefer: the ordinary choice when no partition is free, so 6 free GPUs give 3 pairs
        pytest.param("Prefer", [0, 5], 2, 3, id="prefer-falls-back"),
    ],
)
def test_partition_tables(policy: str, busy: list[int], gpus: int, want: int) -> None:
    node = table_node(policy)

    def make() -> Scheduler:
        s = scheduler(node)
        for m in busy:
            grants = {"gpu-core": 10, "gpu-memory-ratio": 10, "gpu-memory": 8 * 2**30}
            s.state.assume(
                Binding(workload=f"other/b{m}", node="hgx", devices={"gpu": [DeviceGrant(minor=m, resources=grants)]})
            )
        return s

    data = {"name": "m", "requests": {"cpu": "1", "nvidia.com/gpu": gpus}}
    assert counts(make(), Workload.model_validate(data)).tolist() == [want]
    assert placed_one_by_one(make, data) == want
