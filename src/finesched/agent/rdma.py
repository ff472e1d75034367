"""RDMA device discovery from /sys/class/infiniband: one device per HCA, healthy iff a port is ACTIVE.

Minors are the HCAs' positions in name order (mlx5_0 -> 0, ...), the order `ibv_devices` lists.
The NUMA node and PCI root come from the HCA's PCI device (the ``device`` symlink).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finesched.agent.sysfs import pci_root_of, read_int, read_text


@dataclass
class RDMAInventory:
    devices: list[dict[str, Any]] = field(default_factory=list)
    #: minor -> HCA name (mlx5_0) and port states, for the workload's environment and the report.
    names: dict[int, str] = field(default_factory=dict)
    ports: dict[int, dict[str, str]] = field(default_factory=dict)
    available: bool = True
    problems: list[str] = field(default_factory=list)


def discover_rdma(root: Path = Path("/")) -> RDMAInventory:
    inv = RDMAInventory()
    base = root / "sys/class/infiniband"
    try:
        hcas = sorted(p for p in base.iterdir())
    except OSError:
        inv.available = False
        inv.problems.append(f"{base} is absent (no RDMA devices)")
        return inv
    for minor, hca in enumerate(hcas):
        ports = _port_states(hca)
        device: dict[str, Any] = {"type": "rdma", "minor": minor, "health": "ACTIVE" in ports.values()}
        guid = read_text(hca / "node_guid")
        device["uuid"] = guid or hca.name
        numa = read_int(hca / "device/numa_node")
        if numa is not None and numa >= 0:
            device["numa"] = numa
        pcie = pci_root_of(root, hca / "device")
        if pcie:
            device["pcie"] = pcie
        inv.devices.append(device)
        inv.names[minor] = hca.name
        inv.ports[minor] = ports
    return inv


def _port_states(hca: Path) -> dict[str, str]:
    """Port number -> state name (``"4: ACTIVE"`` -> ``ACTIVE``)."""
    out: dict[str, str] = {}
    try:
        ports = sorted((hca / "ports").iterdir())
    except OSError:
        return out
    for port in ports:
        text = read_text(port / "state") or ""
        out[port.name] = text.partition(":")[2].strip() or text
    return out
