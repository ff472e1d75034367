"""Discovery: this machine as a finesched Node (CPUs, NUMA, memory, GPUs, RDMA).

Sources, each optional (its absence is recorded in `Discovery.sources`, never fatal):

* ``/sys/devices/system/cpu/online`` and ``cpuN/topology/{physical_package_id,core_id}``: the
  online logical CPUs and their socket and core. ``core_id`` is only unique within a package, so
  cores are renumbered machine-wide in order of their lowest CPU id (what lscpu prints).
* ``/sys/devices/system/node/nodeN/{cpulist,meminfo}``: NUMA node of each CPU and memory per node.
  Without it every CPU is on NUMA node 0 and memory comes from ``/proc/meminfo``.
* NVML (gpus.py) and ``/sys/class/infiniband`` (rdma.py).

Everything is read under `root` so tests run on a fake tree.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finesched.agent.gpus import GPUInventory, discover_gpus, load_nvml
from finesched.agent.rdma import RDMAInventory, discover_rdma
from finesched.agent.sysfs import numbered, read_cpulist, read_int, read_text
from finesched.cpuset import CPUSet
from finesched.model.node import Node

OK = "ok"


@dataclass
class Discovery:
    """The node as discovered, the online CPUs, and one line per source saying how it went."""

    node: Node
    online: CPUSet
    sources: dict[str, str] = field(default_factory=dict)
    #: RDMA minor -> HCA name, for the workload environment.
    rdma_names: dict[int, str] = field(default_factory=dict)

    def healthy(self, kind: str, minor: int) -> bool | None:
        """True/False for a device of this node, None if it has no such device."""
        for device in self.node.devices:
            if device.type == kind and device.minor == minor:
                return device.health
        return None


def discover(
    name: str | None = None,
    root: Path = Path("/"),
    nvml: Any = None,
    labels: dict[str, str] | None = None,
    load: Callable[[], tuple[Any, str]] = load_nvml,
    mig_mode: str = "static",
) -> Discovery:
    """Read the machine under `root`. `nvml` is an initialised pynvml-like module; None loads the
    real one through `load` (tests pass a fake module, or a `load` that reports it absent).
    `mig_mode` is how GPUs in MIG mode are offered (agent/mig.py)."""
    sources: dict[str, str] = {}
    online, cpus = _cpus(root, sources)
    zones = _numa(root, cpus, sources)
    data: dict[str, Any] = {"name": name or socket.gethostname(), "labels": dict(labels or {})}
    if cpus:
        data["cpuTopology"] = {"cpus": cpus}
    if zones:
        data["numaZones"] = zones
        if any("memory" not in z for z in zones):
            data["allocatable"] = _memory_total(root, sources)
    else:
        data["allocatable"] = _memory_total(root, sources)
    numa_ids = {c["numa"] for c in cpus}
    devices: list[dict[str, Any]] = []
    if nvml is None:
        nvml, why = load()
    gpus = discover_gpus(nvml, root, mig_mode) if nvml is not None else GPUInventory(available=False, problems=[why])
    sources["gpu"] = _summary(gpus.available, len(gpus.devices), gpus.problems)
    if gpus.simulated:
        sources["gpu"] = f"SIMULATED (--fake-gpus), no real GPU: {sources['gpu']}"
    rdma = discover_rdma(root)
    sources["rdma"] = _summary(rdma.available, len(rdma.devices), rdma.problems)
    for device in [*gpus.devices, *rdma.devices]:
        if device.get("numa") is not None and device["numa"] not in numa_ids:
            device.pop("numa")  # a locality the CPU topology does not know cannot be used
        devices.append(device)
    data["devices"] = devices
    data["links"] = gpus.links
    node = Node.model_validate(data)
    return Discovery(node=node, online=online, sources=sources, rdma_names=_names(rdma))


def _summary(available: bool, count: int, problems: list[str]) -> str:
    head = f"{OK}: {count} device(s)" if available else "absent"
    return "; ".join([head, *problems])


def _names(rdma: RDMAInventory) -> dict[int, str]:
    return dict(rdma.names)


def _cpus(root: Path, sources: dict[str, str]) -> tuple[CPUSet, list[dict[str, int]]]:
    """Online CPUs and, for each, its socket and machine-unique core (NUMA filled in later)."""
    base = root / "sys/devices/system/cpu"
    present = [n for n, _ in numbered(base, "cpu")]
    online = read_cpulist(base / "online")
    if online is None:
        online = CPUSet(present)
        sources["cpu.online"] = f"absent: {base / 'online'} unreadable; assuming every cpuN directory is online"
    if not online:
        sources["cpu"] = f"absent: no CPUs under {base}"
        return online, []
    cores: dict[tuple[int, int], int] = {}
    cpus: list[dict[str, int]] = []
    missing: list[int] = []
    for cpu in online.sorted():
        topo = base / f"cpu{cpu}" / "topology"
        package = read_int(topo / "physical_package_id")
        core_id = read_int(topo / "core_id")
        if package is None or core_id is None:
            missing.append(cpu)
        package = max(package or 0, 0)  # -1 means "unknown" on some platforms
        key = (package, cpu if core_id is None else core_id)
        core = cores.setdefault(key, len(cores))
        cpus.append({"id": cpu, "core": core, "socket": package, "numa": 0})
    sources["cpu"] = f"{OK}: {len(cpus)} online CPU(s), {len(cores)} core(s)"
    if missing:
        sources["cpu"] += f"; no topology for CPUs {CPUSet(missing)} (each counted as its own core)"
    return online, cpus


def _numa(root: Path, cpus: list[dict[str, int]], sources: dict[str, str]) -> list[dict[str, Any]]:
    """Set each CPU's NUMA node; the zones (with memory) of nodes that have online CPUs."""
    base = root / "sys/devices/system/node"
    nodes = numbered(base, "node")
    if not nodes:
        sources["numa"] = f"absent: no {base}/nodeN; all CPUs on NUMA node 0"
        return []
    where: dict[int, int] = {}
    for numa, path in nodes:
        for cpu in read_cpulist(path / "cpulist") or ():
            where[cpu] = numa
    for cpu in cpus:
        cpu["numa"] = where.get(cpu["id"], cpu["numa"])
    # a core's threads must share one NUMA node: take its lowest CPU's node for all of them
    first: dict[int, int] = {}
    for cpu in cpus:
        cpu["numa"] = first.setdefault(cpu["core"], cpu["numa"])
    with_cpus = {c["numa"] for c in cpus}
    zones: list[dict[str, Any]] = []
    for numa, path in nodes:
        if numa not in with_cpus:
            continue  # memory-only nodes (CXL, HBM) hold no schedulable CPUs
        zone: dict[str, Any] = {"id": numa}
        memory = _node_memory(path)
        if memory is not None:
            zone["memory"] = memory
        zones.append(zone)
    skipped = sorted({n for n, _ in nodes} - with_cpus)
    sources["numa"] = f"{OK}: {len(zones)} NUMA node(s) with CPUs"
    if skipped:
        sources["numa"] += f"; nodes {skipped} have no online CPUs and are left out"
    return zones


def _node_memory(path: Path) -> int | None:
    """``Node 0 MemTotal:  4679884 kB`` from nodeN/meminfo, in bytes."""
    for line in (read_text(path / "meminfo") or "").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "MemTotal:" and fields[3].isdigit():
            return int(fields[3]) * 1024
    return None


def _memory_total(root: Path, sources: dict[str, str]) -> dict[str, int]:
    for line in (read_text(root / "proc/meminfo") or "").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "MemTotal:" and fields[1].isdigit():
            return {"memory": int(fields[1]) * 1024}
    sources["memory"] = "absent: no per-NUMA meminfo and no /proc/meminfo MemTotal"
    return {}
