"""Issue 5 benchmarks: exclusive cpusets with NUMA alignment, and a mixed QoS stream, on 10,000 nodes.

    python bench/cpus.py                      # both streams, 2-NUMA and 4-NUMA nodes, 10,000 nodes
    python bench/cpus.py --nodes 2000 --decisions 2000 --numa 2 --stream exclusive

Nodes: 2 sockets x 32 cores x SMT 2 = 128 logical CPUs, 1Ti memory in 2 NUMA zones (or 4, with
2 NUMA nodes per socket), label ``node.koordinator.sh/numa-topology-policy: SingleNUMANode``;
in the mixed cluster 30 % of nodes also have 8 GPUs (4 per NUMA node, shapes from
bench/synthetic.py). One CPUTopology object is shared by all nodes of a shape.

Streams (seeded):
* ``exclusive``: LSE/LSR workloads of 2-16 whole CPUs (FullPCPUs, the default) and 4-32Gi;
  every one must get its CPUs and memory from one NUMA node.
* ``mixed``: 30 % LSE, 15 % LSR, 30 % LS (20 % of them ConstrainedBurst), 10 % BE and 15 %
  GPU-share (gpu-core/gpu-memory-ratio 25-100 of one GPU, NUMA-aligned with its CPUs and memory).

Profile: ResourcesFit, NUMAAlign, CPUOrchestration, DeviceShare (mixed only) and MostAllocated
(bin-packing). Each run prints decisions/s and per-decision latency percentiles.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from functools import cache
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finesched.model.node import CPUTopology, Node
from finesched.model.workload import Workload
from finesched.plugins.cpu_orchestration import CPUOrchestration
from finesched.plugins.numa import NUMAAlign
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from synthetic import gpu_devices, instrument

GiB = 2**30
POLICY_LABEL = "node.koordinator.sh/numa-topology-policy"


@cache
def topology(numa_per_socket: int) -> CPUTopology:
    return CPUTopology.model_validate(
        {"sockets": 2, "numaPerSocket": numa_per_socket, "coresPerNuma": 32 // numa_per_socket, "threadsPerCore": 2}
    )


def nodes(count: int, numa: int, gpu_share: float, seed: int) -> list[Node]:
    rng = np.random.default_rng(seed)
    topo = topology(numa // 2)
    zones = tuple({"id": k, "memory": 1024 * GiB // numa} for k in range(numa))
    gpus = rng.random(count) < gpu_share
    out = []
    for i in range(count):
        fields: dict[str, Any] = {
            "name": f"node-{i:06d}",
            "labels": {POLICY_LABEL: "SingleNUMANode"},
            "allocatable": {"cpu": "128", "memory": 1024 * GiB, "pods": 110},
            "cpu_topology": topo,
            "numa_zones": zones,
        }
        if gpus[i]:
            devices = gpu_devices((80,) * 8)
            if numa == 4:  # 2 GPUs per NUMA node
                devices = tuple(d.model_copy(update={"numa": d.minor // 2}) if d.type == "gpu" else d for d in devices)
            fields["devices"] = devices
        out.append(Node(**fields))
    return out


def exclusive_stream(count: int, seed: int) -> list[Workload]:
    rng = np.random.default_rng(seed)
    cpus = rng.choice([2, 4, 8, 16], size=count, p=[0.4, 0.3, 0.2, 0.1])
    qos = rng.choice(["LSE", "LSR"], size=count, p=[0.6, 0.4])
    out = []
    for i in range(count):
        amounts = {"cpu": str(cpus[i]), "memory": int(cpus[i]) * 2 * GiB}
        out.append(Workload(name=f"x-{i:07d}", qos=str(qos[i]), requests=amounts, limits=amounts))
    return out


def mixed_stream(count: int, seed: int, gpus: bool) -> list[Workload]:
    rng = np.random.default_rng(seed)
    kinds = rng.choice(["LSE", "LSR", "LS", "BE", "GPU"], size=count, p=[0.30, 0.15, 0.30, 0.10, 0.15])
    cpus = rng.choice([1, 2, 4, 8], size=count, p=[0.3, 0.3, 0.25, 0.15])
    burst = rng.random(count) < 0.2
    share = rng.choice([25, 50, 100], size=count)
    out = []
    for i in range(count):
        kind = str(kinds[i]) if gpus or kinds[i] != "GPU" else "LSR"
        c = int(cpus[i])
        amounts = {"cpu": str(c), "memory": c * 2 * GiB}
        spec: dict[str, Any] = {"name": f"m-{i:07d}", "namespace": f"team-{i % 4}"}
        if kind in ("LSE", "LSR"):
            spec |= {"qos": kind, "requests": amounts, "limits": amounts}
        elif kind == "LS":
            spec |= {"requests": amounts, "limits": {"cpu": str(2 * c)}}
            if burst[i]:
                spec["resource_spec"] = {"preferredCPUBindPolicy": "ConstrainedBurst"}
        elif kind == "BE":
            spec |= {"qos": "BE"}
        else:
            gpu = {"gpu-core": int(share[i]), "gpu-memory-ratio": int(share[i])}
            spec |= {"qos": "LSR", "requests": {**amounts, **gpu}, "limits": amounts}
        out.append(Workload(**spec))
    return out


def scheduler(node_list: list[Node], devices: bool, baseline: bool = False) -> Scheduler:
    factories: dict[str, Any] = {"CPUOrchestration": CPUOrchestration.from_args, "NUMAAlign": NUMAAlign.from_args}
    names = ["ResourcesFit"] if baseline else ["ResourcesFit", "NUMAAlign", "CPUOrchestration"]
    if devices:
        from finesched.plugins.deviceshare.plugin import DeviceShare

        factories["DeviceShare"] = DeviceShare.from_args
        names.append("DeviceShare")
    plugins = [{"name": n} for n in names] + [{"name": "MostAllocated"}]
    profile = Profile.model_validate({"name": "cpus-bench", "plugins": plugins})
    registry = default_registry().with_plugins(factories)
    return Scheduler(ClusterState.from_nodes(node_list), profile=profile, registry=registry)


def run(stream: str, count: int, decisions: int, numa: int, seed: int, breakdown: bool = False) -> dict[str, Any]:
    """One stream on a fresh cluster; `baseline` is the exclusive stream with ResourcesFit only."""
    mixed = stream == "mixed"
    t0 = time.perf_counter()
    node_list = nodes(count, numa, 0.3 if mixed else 0.0, seed)
    sched = scheduler(node_list, devices=mixed, baseline=stream == "baseline")
    build = time.perf_counter() - t0
    # The cluster is long-lived: move it out of the cyclic GC's reach, or every full collection
    # walks 10,000 nodes' objects (a pause of tens of ms, every few hundred decisions).
    gc.collect()
    gc.freeze()
    spent = instrument(sched) if breakdown else {}
    if mixed:
        workloads = mixed_stream(decisions, seed + 1, True)
    else:
        workloads = exclusive_stream(decisions, seed + 1)
    warm = min(200, decisions // 10)
    for w in workloads[:warm]:
        sched.schedule_one(w.model_copy(update={"name": "warm-" + w.name}))
    latencies = np.empty(len(workloads), dtype=np.int64)
    failed = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for k, w in enumerate(workloads):
        t = time.perf_counter_ns()
        try:
            sched.schedule_one(w)
        except FitError:
            failed += 1
        latencies[k] = time.perf_counter_ns() - t
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    gc.unfreeze()
    return {
        "decisions_per_s": len(workloads) / elapsed,
        "cpu_decisions_per_s": len(workloads) / cpu,  # CPU time: robust to other load on the machine
        "p50_us": float(np.percentile(latencies, 50) / 1e3),
        "p99_us": float(np.percentile(latencies, 99) / 1e3),
        "failed": failed,
        "build_s": build,
        "breakdown_us": {k: v / len(workloads) * 1e6 for k, v in sorted(spent.items(), key=lambda kv: -kv[1])},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=5_000)
    parser.add_argument("--numa", default="2,4", help="NUMA nodes per node: 2, 4 or both (2,4)")
    parser.add_argument(
        "--stream", default="exclusive,mixed", help="exclusive, mixed, baseline (exclusive stream, ResourcesFit only)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--breakdown", action="store_true", help="time spent per plugin and point (us/decision)")
    args = parser.parse_args(argv)
    targets = {"exclusive": 3000, "mixed": 2000, "baseline": 0}
    print(
        f"{'stream':<10} {'numa':>4} {'nodes':>7} {'decisions/s':>12} {'CPU-time/s':>11} {'p50 us':>8} {'p99 us':>8} "
        f"{'failed':>7}  target"
    )
    for stream in args.stream.split(","):
        for numa in (int(n) for n in args.numa.split(",")):
            r = run(stream, args.nodes, args.decisions, numa, args.seed, args.breakdown)
            ok = "ok" if r["decisions_per_s"] >= targets[stream] else "MISSED"
            print(
                f"{stream:<10} {numa:>4} {args.nodes:>7} {r['decisions_per_s']:>12.0f} "
                f"{r['cpu_decisions_per_s']:>11.0f} "
                f"{r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {r['failed']:>7}  >= {targets[stream]} {ok}",
                flush=True,
            )
            for point, us in r["breakdown_us"].items():
                print(f"    {point:<32} {us:8.1f} us/decision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
