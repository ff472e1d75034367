"""Issue 4 benchmark: GPU-share scheduling throughput and latency on a large synthetic cluster.

    .venv/bin/python bench/devices.py --nodes 10000 --decisions 5000
    .venv/bin/python bench/devices.py --nodes 100000 --decisions 2000
    .venv/bin/python bench/devices.py --nodes 10000 --breakdown      # time per plugin and point
    .venv/bin/python bench/devices.py --nodes 10000 --no-memo        # no per-shape memo (sched/memo.py)

Cluster: 8 GPUs per node, half the nodes 80 GiB cards, half 40 GiB (a tenth mixed 4 x 40 + 4 x 80 on
one node); 2 NUMA nodes, 4 PCIe switches with 2 GPUs each, NVLink pairs, 2 RDMA NICs. Stream: GPU
shares by ratio (25/50%) and by bytes (10/20 GiB), 1/2/4/8 whole GPUs, and some GPU + RDMA on one
PCIe switch. Every node is filtered and scored; the exact device choice runs on the candidates only.
Prints decisions/s and p50/p99/p99.9 latency (targets: 10k nodes >= 5,000/s with p99 <= 2 ms;
100k nodes >= 800/s).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import sys
import time
from collections import Counter

import numpy as np

from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DeviceShare
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from synthetic import instrument

PROFILE = {
    "name": "bench-devices",
    "plugins": [
        {"name": "NodeSelector"},
        {"name": "ResourcesFit"},
        {"name": "DeviceShare"},
        {"name": "LeastRequested"},
        {"name": "MostBalanced"},
    ],
}


def node_template(memories: list[str]) -> Node:
    """One node shape: 8 GPUs of the given memories, 2 NUMA nodes, 4 PCIe switches, NVLink pairs, 2 NICs."""
    devices = [
        {
            "type": "gpu",
            "minor": m,
            "numa": m // 4,
            "pcie": f"pci{m // 2}",
            "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": memory},
        }
        for m, memory in enumerate(memories)
    ]
    devices += [{"type": "rdma", "minor": r, "numa": r, "pcie": f"pci{2 * r}"} for r in range(2)]
    links = [{"type": "gpu", "a": a, "b": a + 1, "bandwidth": "600G"} for a in range(0, 8, 2)]
    return Node.model_validate(
        {
            "name": "template",
            "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110"},
            "numaZones": [{"id": 0}, {"id": 1}],
            "devices": devices,
            "links": links,
        }
    )


def synthetic_nodes(n: int, seed: int = 0) -> list[Node]:
    """n nodes: 45% 8 x 80Gi, 45% 8 x 40Gi, 10% mixed 4 x 40Gi + 4 x 80Gi (copies of three validated shapes)."""
    rng = random.Random(seed)
    shapes = [node_template(["80Gi"] * 8), node_template(["40Gi"] * 8), node_template(["40Gi"] * 4 + ["80Gi"] * 4)]
    weights = [0.45, 0.45, 0.10]
    return [rng.choices(shapes, weights)[0].model_copy(update={"name": f"node-{i:06d}"}) for i in range(n)]


#: (weight, requests, joint) of the GPU-share stream.
STREAM = [
    (20, {"koordinator.sh/gpu": 25}, False),
    (15, {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50}, False),
    (10, {"koordinator.sh/gpu-core": 20, "koordinator.sh/gpu-memory": "10Gi"}, False),
    (10, {"koordinator.sh/gpu-core": 30, "koordinator.sh/gpu-memory": "20Gi"}, False),
    (20, {"nvidia.com/gpu": 1}, False),
    (10, {"nvidia.com/gpu": 2}, False),
    (5, {"nvidia.com/gpu": 4}, False),
    (3, {"nvidia.com/gpu": 8}, False),
    (7, {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 100}, True),
]


def synthetic_stream(count: int, seed: int = 1) -> list[Workload]:
    rng = random.Random(seed)
    weights = [w for w, _, _ in STREAM]
    out = []
    for i in range(count):
        _, requests, joint = rng.choices(STREAM, weights)[0]
        data = {"name": f"w{i:07d}", "requests": {"cpu": rng.choice(["1", "2", "4"]), "memory": "8Gi", **requests}}
        if joint:
            data["deviceJointAllocate"] = {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}
        out.append(Workload.model_validate(data))
    return out


def build(n: int, memoize: bool = True) -> tuple[Scheduler, float]:
    nodes = synthetic_nodes(n)
    start = time.perf_counter()
    state = ClusterState.from_nodes(nodes)
    registry = default_registry().with_plugins({"DeviceShare": DeviceShare.from_args})
    profile = Profile.model_validate(PROFILE)
    scheduler = Scheduler(state, profile=profile, registry=registry, memoize=memoize)
    return scheduler, time.perf_counter() - start


def run(n: int, decisions: int, warmup: int, breakdown: bool, memoize: bool = True) -> None:
    scheduler, built = build(n, memoize)
    memo = "per-shape memo on" if memoize else "memo off: every node re-evaluated each decision"
    print(f"nodes {n}: state + scheduler built in {built:.1f}s ({memo})")
    timed(scheduler, synthetic_stream(warmup + decisions), warmup, breakdown, f"nodes {n}")
    if n <= 20000:
        scheduler.state.check_invariants()


def timed(scheduler: Scheduler, stream: list[Workload], warmup: int, breakdown: bool, label: str) -> None:
    """Schedule `stream` (the first `warmup` untimed) and print decisions/s and latency percentiles."""
    decisions = len(stream) - warmup
    # The cluster is long-lived: move it out of the cyclic GC's reach, or every full collection
    # walks every node's objects (tens of ms at 100k nodes, landing in the latency tail).
    gc.collect()
    gc.freeze()
    for workload in stream[:warmup]:
        with contextlib.suppress(FitError):
            scheduler.schedule_one(workload)
    spent = instrument(scheduler) if breakdown else {}
    latencies, cpu_times, outcomes = [], [], Counter()
    start, cpu_start = time.perf_counter(), time.process_time()
    for workload in stream[warmup:]:
        t, c = time.perf_counter(), time.process_time()
        try:
            scheduler.schedule_one(workload)
            outcomes["bound"] += 1
        except FitError:
            outcomes["unschedulable"] += 1
        latencies.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    ms = np.array(latencies) * 1000
    p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
    c50, c99, c999 = np.percentile(np.array(cpu_times) * 1000, [50, 99, 99.9])
    print(
        f"{label}: {decisions / elapsed:,.0f} decisions/s over {decisions} decisions "
        f"({dict(outcomes)}); latency p50 {p50:.3f} ms, p99 {p99:.3f} ms, p99.9 {p999:.3f} ms"
    )
    # On a shared machine the wall clock includes time the OS gave to other processes; CPU time does not.
    print(
        f"{label}: {decisions / cpu:,.0f} decisions per CPU-second; CPU time per decision "
        f"p50 {c50:.3f} ms, p99 {c99:.3f} ms, p99.9 {c999:.3f} ms"
    )
    if breakdown:
        per = sorted(spent.items(), key=lambda kv: -kv[1])
        total_ms = elapsed * 1000 / decisions
        print(f"  per decision {total_ms:.3f} ms, of which in plugins:")
        for name, seconds in per:
            print(f"    {name:32s} {seconds * 1000 / decisions:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10000])
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--breakdown", action="store_true", help="time each plugin's extension points")
    parser.add_argument("--no-memo", action="store_true", help="re-filter and re-score every node every time")
    args = parser.parse_args(argv)
    for n in args.nodes:
        run(n, args.decisions, args.warmup, args.breakdown, memoize=not args.no_memo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
