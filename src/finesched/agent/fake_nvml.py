"""Simulated GPUs behind the NVML calls discovery makes (the seam between the agent and the driver).

`FakeNVML` answers the pynvml functions gpus.py uses from a list of `FakeGPU`: count, handles,
UUID, minor, memory, PCI bus id, NUMA node, NVLink state and peers. The tests use it to describe
any machine; `finesched up --fake-gpus N[:MEMORY]` uses it (`FakeNVML.simulated`) so GPU sharing
can be tried on a machine without a GPU. A simulated inventory says so: `simulated` is True,
discovery reports the GPU source as simulated and labels every device ``finesched.io/simulated``.

Each NVML call is one method named as in pynvml, so a new capability (MIG instances, say) is a
few more methods and FakeGPU fields, nothing else changes.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

from finesched.quantity import format_quantity

#: The label every simulated device carries (and `describe node` shows).
SIMULATED_LABEL = "finesched.io/simulated"


class NVMLError(Exception):
    """What pynvml raises (NVMLError_NotSupported, _GpuIsLost, _DriverNotLoaded, ...)."""


@dataclass
class FakeGPU:
    uuid: str
    minor: int
    memory: int  # bytes
    bus_id: str  # NVML form: 00000000:3B:00.0
    numa: int = -1  # -1: NVML's NUMA query is not supported (older drivers)
    nvlinks: list[str] = field(default_factory=list)  # remote bus ids, one per active link
    broken: bool = False  # uuid and memory queries raise (a GPU that fell off the bus)


class FakeNVML:
    """A pynvml stand-in over `gpus` (module docstring). `count_fails` makes the device count
    raise, as when the driver is not loaded."""

    NVML_NVLINK_MAX_LINKS = 12
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGPU], *, count_fails: bool = False, simulated: bool = False):
        self.gpus = gpus
        self.count_fails = count_fails
        self.simulated = simulated

    @classmethod
    def simulated_gpus(cls, count: int, memory: int) -> FakeNVML:
        """`count` identical GPUs of `memory` bytes on NUMA node 0, without NVLink, marked simulated."""
        gpus = [
            FakeGPU(f"GPU-SIMULATED-{i:04d}", i, memory, f"00000000:{0xF0 + i:02X}:00.0", numa=0) for i in range(count)
        ]
        return cls(gpus, simulated=True)

    def describe(self) -> str:
        sizes = sorted({g.memory for g in self.gpus})
        memory = ", ".join(format_quantity(m, "bytes") for m in sizes)
        return f"{len(self.gpus)} simulated GPU(s) of {memory} ({', '.join(g.uuid for g in self.gpus)})"

    # pynvml's calls, under their pynvml names -----------------------------------------------
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        if self.count_fails:
            raise NVMLError("Driver Not Loaded")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGPU:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGPU) -> str:
        if handle.broken:
            raise NVMLError("GPU is lost")
        return handle.uuid

    def nvmlDeviceGetMinorNumber(self, handle: FakeGPU) -> int:
        return handle.minor

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGPU) -> types.SimpleNamespace:
        if handle.broken:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(total=handle.memory, free=handle.memory, used=0)

    def nvmlDeviceGetPciInfo(self, handle: FakeGPU) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=handle.bus_id.encode())

    def nvmlDeviceGetNumaNodeId(self, handle: FakeGPU) -> int:
        if handle.numa < 0:
            raise NVMLError("Not Supported")
        return handle.numa

    def nvmlDeviceGetNvLinkState(self, handle: FakeGPU, link: int) -> int:
        if link >= len(handle.nvlinks):
            raise NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeGPU, link: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=handle.nvlinks[link].encode())
