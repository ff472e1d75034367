"""Fakes for agent tests: a sysfs tree written under a temporary directory, and GPU inventories for
the package's simulated NVML (finesched.agent.fake_nvml, also behind `finesched up --fake-gpus`)."""

from __future__ import annotations

from pathlib import Path

from finesched.agent.fake_nvml import FakeGPU, FakeNVML

__all__ = ["FakeGPU", "add_hca", "add_pci", "cpulist", "eight_gpus", "fake_nvml", "make_sysfs", "write"]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")


def cpulist(ids: list[int]) -> str:
    return ",".join(str(i) for i in sorted(ids))


def make_sysfs(
    root: Path,
    sockets: int = 1,
    numa_per_socket: int = 1,
    cores_per_numa: int = 4,
    threads: int = 1,
    mem_kb_per_numa: int = 1024 * 1024,
    core_id_stride: int = 1,
    offline: tuple[int, ...] = (),
) -> dict[int, tuple[int, int, int]]:
    """A Linux-numbered CPU tree: thread t of global core c is CPU t*C + c (x86 servers do this).

    core_id restarts at 0 on each socket and steps by `core_id_stride` (real ids have gaps), so
    only (socket, core_id) is unique. Returns CPU id -> (socket, global core, NUMA node).
    """
    cores = sockets * numa_per_socket * cores_per_numa
    cpu_base = root / "sys/devices/system/cpu"
    out: dict[int, tuple[int, int, int]] = {}
    numa_cpus: dict[int, list[int]] = {}
    for t in range(threads):
        for c in range(cores):
            cpu = t * cores + c
            numa = c // cores_per_numa
            socket = numa // numa_per_socket
            local = c - socket * numa_per_socket * cores_per_numa
            write(cpu_base / f"cpu{cpu}/topology/physical_package_id", str(socket))
            write(cpu_base / f"cpu{cpu}/topology/core_id", str(local * core_id_stride))
            out[cpu] = (socket, c, numa)
            numa_cpus.setdefault(numa, []).append(cpu)
    online = [c for c in out if c not in offline]
    write(cpu_base / "online", cpulist(online))
    node_base = root / "sys/devices/system/node"
    for numa, ids in numa_cpus.items():
        write(node_base / f"node{numa}/cpulist", cpulist(ids))
        meminfo = f"Node {numa} MemTotal:       {mem_kb_per_numa} kB\nNode {numa} MemFree:        1000 kB"
        write(node_base / f"node{numa}/meminfo", meminfo)
    return out


def add_pci(root: Path, bus_id: str, numa: int, host: str = "pci0000:00") -> Path:
    """A PCI device under root complex `host`, with sys/bus/pci/devices/<bus_id> linking to it."""
    device = root / "sys/devices" / host / bus_id
    write(device / "numa_node", str(numa))
    link = root / "sys/bus/pci/devices" / bus_id
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(device)
    return device


def add_hca(root: Path, name: str, bus_id: str, numa: int, states: list[str], host: str = "pci0000:00") -> None:
    device = add_pci(root, bus_id, numa, host)
    hca = root / "sys/class/infiniband" / name
    hca.mkdir(parents=True, exist_ok=True)
    (hca / "device").symlink_to(device)
    write(hca / "node_guid", f"0c42:a103:00{len(name):02x}:{numa:04x}")
    for port, state in enumerate(states, start=1):
        write(hca / f"ports/{port}/state", state)


def fake_nvml(gpus: list[FakeGPU], count_fails: bool = False) -> FakeNVML:
    """The package's NVML stand-in over `gpus` (what discovery sees on such a machine)."""
    return FakeNVML(gpus, count_fails=count_fails)


def eight_gpus(root: Path | None = None, memory: int = 80 * 2**30) -> list[FakeGPU]:
    """8 GPUs, 4 per NUMA node (2 NUMA nodes), NVLink pairs (0,1) (2,3) (4,5) (6,7) with 2 links each.

    With `root`, their PCI devices are also written to the fake sysfs (numa_node there; NVML's own
    NUMA query is left unsupported, as on older drivers)."""
    gpus = []
    for i in range(8):
        bus = f"0000:{0x10 + i:02x}:00.0"
        if root is not None:
            add_pci(root, bus, numa=i // 4, host=f"pci0000:{0x10 + (i // 2) * 0x10:02x}")
        gpus.append(FakeGPU(uuid=f"GPU-{i:08d}-aaaa", minor=i, memory=memory, bus_id=f"0000{bus.upper()}"))
    for i in range(0, 8, 2):
        gpus[i].nvlinks = [gpus[i + 1].bus_id] * 2
        gpus[i + 1].nvlinks = [gpus[i].bus_id] * 2
    return gpus
