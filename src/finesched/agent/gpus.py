"""GPU discovery through NVML (the `pynvml` module of nvidia-ml-py).

For each GPU: uuid, minor (/dev/nvidiaN), total memory, PCI bus id -> NUMA node and PCI root, and
NVLink peers; a GPU in MIG mode also gets its ``mig`` table and instances (mig.py). A device whose
required queries fail is kept with ``health: false`` (the scheduler stops placing there) and the
error is listed; optional queries (NUMA id, NVLink) that a driver does not support are simply
skipped. The module is passed in, so tests use a fake one (agent/fake_nvml.py); a fake that says it
is `simulated` (``finesched up --fake-gpus``) gets its devices labelled ``finesched.io/simulated:
"true"`` and the inventory marked simulated.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from finesched.agent.fake_nvml import SIMULATED_LABEL
from finesched.agent.mig import discover_mig
from finesched.agent.sysfs import normalize_bus_id, pci_numa, pci_root


@dataclass
class GPUInventory:
    """What NVML said: devices as Node-manifest dicts, NVLink pairs, and problems (absent, errors)."""

    devices: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    available: bool = True
    simulated: bool = False


def load_nvml() -> tuple[ModuleType | None, str]:
    """The pynvml module, initialised, or None and why not (no package, no driver library)."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError as exc:
        return None, f"pynvml is not installed ({exc})"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML unavailable: {exc}"
    return nvml, ""


def discover_gpus(nvml: Any, root: Path = Path("/"), mig_mode: str = "static") -> GPUInventory:
    """Every GPU NVML reports, in minor order. `nvml` is an initialised pynvml-like module; a MIG
    GPU is reported in `mig_mode` (static: finesched assigns existing instances; dynamic: it may
    ask the agent to create them)."""
    inv = GPUInventory(simulated=bool(getattr(nvml, "simulated", False)))
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        inv.problems.append(f"nvmlDeviceGetCount failed: {exc}")
        inv.available = False
        return inv
    by_bus: dict[str, int] = {}
    handles: dict[int, Any] = {}
    for index in range(count):
        device = _one_gpu(nvml, index, root, inv.problems)
        if device is None:
            continue
        mig = discover_mig(
            nvml, device["_handle"], mig_mode, _optional(getattr(nvml, "nvmlDeviceGetName", None), device["_handle"])
        )
        if mig is not None:
            device["mig"] = mig
        bus = device.pop("_bus", None)
        handles[device["minor"]] = device.pop("_handle")
        if bus:
            by_bus[bus] = device["minor"]
        if inv.simulated:
            device["labels"] = {SIMULATED_LABEL: "true"}
        inv.devices.append(device)
    inv.devices.sort(key=lambda d: d["minor"])
    inv.links = _nvlinks(nvml, handles, by_bus)
    return inv


def _one_gpu(nvml: Any, index: int, root: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        problems.append(f"GPU index {index}: no handle ({exc})")
        return None
    healthy = True
    minor = _optional(nvml.nvmlDeviceGetMinorNumber, handle)
    if minor is None:
        minor = index  # NVML index; usually equals the /dev/nvidiaN minor
    device: dict[str, Any] = {"type": "gpu", "minor": int(minor), "_handle": handle}
    try:
        uuid = nvml.nvmlDeviceGetUUID(handle)
        device["uuid"] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception as exc:
        problems.append(f"GPU {minor}: unhealthy ({exc})")
        healthy = False
        memory = 0
    resources: dict[str, Any] = {"gpu-core": 100, "gpu-memory-ratio": 100}
    if memory > 0:
        resources["gpu-memory"] = memory
    device["resources"] = resources
    device["health"] = healthy
    pci = _optional(nvml.nvmlDeviceGetPciInfo, handle)
    if pci is not None:
        bus = normalize_bus_id(pci.busId)
        device["_bus"] = bus
        numa = pci_numa(root, bus)
        if numa is None:
            value = _optional(getattr(nvml, "nvmlDeviceGetNumaNodeId", None), handle)
            numa = value if isinstance(value, int) and value >= 0 else None
        if numa is not None:
            device["numa"] = numa
        pcie = pci_root(root, bus)
        if pcie:
            device["pcie"] = pcie
    return device


def _optional(fn: Any, *args: Any) -> Any:
    """A query drivers may not support: its value, or None on any NVML error."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None


def _nvlinks(nvml: Any, handles: dict[int, Any], by_bus: dict[str, int]) -> list[dict[str, Any]]:
    """One link per GPU pair with at least one active NVLink; absent links raise and are skipped."""
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0))
    pairs: dict[tuple[int, int], int] = {}
    for minor, handle in handles.items():
        for link in range(max_links):
            if _optional(nvml.nvmlDeviceGetNvLinkState, handle, link) != 1:
                continue
            remote = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            peer = by_bus.get(normalize_bus_id(remote.busId)) if remote is not None else None
            if peer is None or peer == minor:
                continue  # an NVSwitch or a device NVML did not list
            key = (min(minor, peer), max(minor, peer))
            pairs[key] = pairs.get(key, 0) + 1
    # each link is seen from both ends: the count is links per pair, times two
    return [{"type": "gpu", "a": a, "b": b, "kind": "NVLink"} for (a, b) in sorted(pairs)]
