"""Seeded synthetic clusters and workload streams for the benchmarks.

Node shapes (DESIGN.md "Performance model"), chosen per node with a seeded generator:

| shape      | share | logical CPUs (sockets x cores/NUMA x SMT) | memory         | devices               |
|------------|-------|-------------------------------------------|----------------|-----------------------|
| cpu-small  | 25 %  | 32  (1 x 16 x 2), 1 NUMA                  | 128Gi or 256Gi | -                     |
| cpu-medium | 25 %  | 64  (2 x 16 x 2), 2 NUMA                  | 256Gi or 512Gi | -                     |
| cpu-large  | 20 %  | 128 (2 x 32 x 2), 2 NUMA                  | 1Ti or 2Ti     | -                     |
| gpu        | 30 %  | 128 (2 x 32 x 2), 2 NUMA                  | 1Ti            | 8 GPUs, 2 RDMA NICs   |

GPU nodes carry 8 x 40Gi, 8 x 80Gi or 4 x 40Gi + 4 x 80Gi cards, 4 per NUMA node, 2 per PCIe switch.
Every node has a `zone` label (a..d) and GPU nodes a `gpu-model` label. Topology objects are
shared between nodes of one shape, so 100,000 nodes stay light. `devices=False` leaves the
device list out (the scalar benchmark does not need it).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from finesched.model.node import CPUTopology, Device, Node
from finesched.model.workload import Workload
from finesched.sched.scheduler import Scheduler

GiB = 2**30
ZONES = ("a", "b", "c", "d")
SHAPES = ("cpu-small", "cpu-medium", "cpu-large", "gpu")
SHAPE_WEIGHTS = (0.25, 0.25, 0.20, 0.30)


@cache
def topology(sockets: int, cores_per_numa: int, threads: int = 2) -> CPUTopology:
    """One shared topology object per shape (1 NUMA node per socket)."""
    return CPUTopology.model_validate(
        {"sockets": sockets, "numaPerSocket": 1, "coresPerNuma": cores_per_numa, "threadsPerCore": threads}
    )


@cache
def gpu_devices(memory_gib: tuple[int, ...]) -> tuple[Device, ...]:
    """8 GPUs (4 per NUMA node, 2 per PCIe switch) and 2 RDMA NICs, shared between nodes."""
    devices = []
    for minor, mem in enumerate(memory_gib):
        numa = minor * 2 // len(memory_gib)
        devices.append(
            Device(
                type="gpu",
                minor=minor,
                numa=numa,
                pcie=f"pci{minor // 2}",
                resources={"gpu-core": 100, "gpu-memory": mem * GiB, "gpu-memory-ratio": 100},
            )
        )
    devices += [Device(type="rdma", minor=k, numa=k, pcie=f"pci{k * 2}", resources={"rdma": 100}) for k in range(2)]
    return tuple(devices)


def synthetic_nodes(count: int, seed: int = 0, *, devices: bool = True, gpu_share: float | None = None) -> list[Node]:
    """`count` nodes of the documented shapes; `gpu_share` overrides the GPU-node fraction."""
    rng = np.random.default_rng(seed)
    weights = np.array(SHAPE_WEIGHTS)
    if gpu_share is not None:
        weights = np.array([*(weights[:3] / weights[:3].sum() * (1 - gpu_share)), gpu_share])
    shapes = rng.choice(len(SHAPES), size=count, p=weights)
    big = rng.integers(0, 2, size=count)
    gpu_kind = rng.integers(0, 3, size=count)
    zones = rng.integers(0, len(ZONES), size=count)
    nodes = []
    for i in range(count):
        shape = SHAPES[shapes[i]]
        fields: dict[str, Any] = {"name": f"node-{i:06d}", "labels": {"zone": ZONES[zones[i]], "shape": shape}}
        if shape == "cpu-small":
            topo, memory = topology(1, 16), (128, 256)[big[i]]
        elif shape == "cpu-medium":
            topo, memory = topology(2, 16), (256, 512)[big[i]]
        elif shape == "cpu-large":
            topo, memory = topology(2, 32), (1024, 2048)[big[i]]
        else:
            topo, memory = topology(2, 32), 1024
            cards = ((40,) * 8, (80,) * 8, (40,) * 4 + (80,) * 4)[gpu_kind[i]]
            fields["labels"]["gpu-model"] = ("A100-40G", "A100-80G", "A100-mixed")[gpu_kind[i]]
            if devices:
                fields["devices"] = gpu_devices(cards)
        fields["allocatable"] = {"cpu": len(topo.cpus), "memory": f"{memory}Gi", "pods": 110}
        fields["cpu_topology"] = topo
        nodes.append(Node(**fields))
    return nodes


def scalar_workloads(count: int, seed: int = 1, *, selector_share: float = 0.1) -> list[Workload]:
    """CPU/memory workloads: 250m..16 CPUs, 256Mi..64Gi; `selector_share` of them pin a zone."""
    rng = np.random.default_rng(seed)
    cpus = rng.choice([250, 500, 1000, 2000, 4000, 8000, 16000], size=count, p=[0.2, 0.2, 0.2, 0.15, 0.12, 0.08, 0.05])
    mem_per_cpu = rng.choice([1, 2, 4], size=count)  # GiB per CPU
    pinned = rng.random(count) < selector_share
    zones = rng.integers(0, len(ZONES), size=count)
    out = []
    for i in range(count):
        memory = max(256 * 2**20, int(cpus[i]) * int(mem_per_cpu[i]) * GiB // 1000)
        spec: dict[str, Any] = {
            "name": f"w-{i:07d}",
            "namespace": f"team-{i % 4}",
            "requests": {"cpu": int(cpus[i]) / 1000, "memory": memory},
        }
        if pinned[i]:
            spec["node_selector"] = {"zone": ZONES[zones[i]]}
        out.append(Workload(**spec))
    return out


def instrument(scheduler: Scheduler) -> dict[str, float]:
    """Wrap every plugin's extension points to add up their time (the benchmarks' ``--breakdown``)."""
    spent: dict[str, float] = defaultdict(float)
    for plugin in scheduler.framework.plugins:
        for point in ("pre_filter", "filter", "pre_score", "score", "reserve", "unreserve", "pre_bind"):
            method = getattr(plugin, point, None)
            if method is None:
                continue

            def timed(*args: object, _m: Callable[..., Any] = method, _k: str = f"{plugin.NAME}.{point}") -> Any:
                t = time.perf_counter()
                try:
                    return _m(*args)
                finally:
                    spent[_k] += time.perf_counter() - t

            setattr(plugin, point, timed)
    return spent
