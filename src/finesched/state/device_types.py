"""Per-type device arrays (one `DeviceTypeAccounts` per device type) and one node's view of them.

`DeviceAccounts` (state/devices.py) owns one of these per device type found in the manifests;
`NodeDevices` is the copy of one node's devices the exact allocator and NUMA hint providers read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.device_allocated import DEVICE_ALLOCATED as DEVICE_ALLOCATED  # re-exported
from finesched.model.node import device_totals as device_totals  # re-exported: node validation shares it
from finesched.model.resources import GPU_MEMORY, GPU_MEMORY_RATIO
from finesched.model.resources import device_dimension as device_dimension  # re-exported

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
NO_SCOPE = -1


def fill_gpu_amounts(amounts: Mapping[str, int], memory_total: int) -> dict[str, int]:
    """Koordinator's fill after allocation: the missing one of gpu-memory / gpu-memory-ratio.

    bytes = ratio · total / 100 (floored); ratio = ⌊bytes · 100 / total⌋. A card without a memory
    figure (total 0) keeps only the ratio. E.g. ratio 50 on an 80Gi card -> 40Gi; 20Gi -> ratio 25.
    """
    out = dict(amounts)
    if memory_total <= 0:
        out.pop(GPU_MEMORY, None)
    elif GPU_MEMORY_RATIO in out and GPU_MEMORY not in out:
        out[GPU_MEMORY] = out[GPU_MEMORY_RATIO] * memory_total // 100
    elif GPU_MEMORY in out and GPU_MEMORY_RATIO not in out:
        out[GPU_MEMORY_RATIO] = out[GPU_MEMORY] * 100 // memory_total
    return out


def resized(a: np.ndarray, shape: tuple[int, ...], fill: Any) -> np.ndarray:
    out = np.full(shape, fill, dtype=a.dtype)
    common = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, shape, strict=True))
    out[common] = a[common]
    return out


@dataclass(frozen=True, slots=True, eq=False)
class NodeDevices:
    """One node's devices of one type (copies, slot order = minor order): what the exact allocator
    and NUMA hint providers read. ``total``/``free`` are ``[len(dims), d]``; ``links`` ``[d, d]``."""

    type: str
    dims: tuple[str, ...]
    minors: Int64Array
    healthy: BoolArray
    numa: Int64Array
    pcie: Int64Array
    total: Int64Array
    free: Int64Array
    links: Int64Array | None = None

    def __len__(self) -> int:
        return len(self.minors)

    def dim(self, name: str) -> int | None:
        return self.dims.index(name) if name in self.dims else None

    def free_of(self, name: str) -> Int64Array:
        """[d] free amount of dimension `name` per device (zeros when the type lacks it)."""
        k = self.dim(name)
        return np.zeros(len(self), dtype=np.int64) if k is None else self.free[k]


class DeviceTypeAccounts:
    """The arrays of one device type over node slots (see the module docstring)."""

    def __init__(self, name: str, capacity: int):
        self.name = name
        self.dims: list[str] = []
        self.dim_index: dict[str, int] = {}
        self.dmax = 0
        self.capacity = capacity
        self.total = np.zeros((0, capacity, 0), dtype=np.int64)
        self.free = np.zeros_like(self.total)
        self.foreign = np.zeros_like(self.total)
        self.valid = np.zeros((capacity, 0), dtype=bool)
        self.healthy = np.zeros_like(self.valid)
        self.minor = np.full((capacity, 0), -1, dtype=np.int64)
        self.numa = np.full((capacity, 0), NO_SCOPE, dtype=np.int64)
        self.pcie = np.full((capacity, 0), NO_SCOPE, dtype=np.int64)
        self.count = np.zeros(capacity, dtype=np.int64)
        self.links: list[Int64Array | None] = [None] * capacity
        #: Per node, its devices' layout as bytes (`shape_key`), built on first use.
        self.shape_keys: list[bytes | None] = [None] * capacity
        self.htotal = np.zeros((0, capacity), dtype=np.int64)
        self.hfree = np.zeros_like(self.htotal)
        self.inv_htotal = np.zeros((0, capacity), dtype=np.float64)
        self.used_share = np.zeros((0, capacity), dtype=np.float64)

    # Shape changes ------------------------------------------------------------------------------
    def reshape(self, ndim: int, capacity: int, dmax: int) -> None:
        k, c, d = ndim, capacity, dmax
        self.total = resized(self.total, (k, c, d), 0)
        self.free = resized(self.free, (k, c, d), 0)
        self.foreign = resized(self.foreign, (k, c, d), 0)
        self.valid = resized(self.valid, (c, d), False)
        self.healthy = resized(self.healthy, (c, d), False)
        self.minor = resized(self.minor, (c, d), -1)
        self.numa = resized(self.numa, (c, d), NO_SCOPE)
        self.pcie = resized(self.pcie, (c, d), NO_SCOPE)
        self.count = resized(self.count, (c,), 0)
        self.links = (self.links + [None] * c)[:c]
        self.shape_keys = [None] * c  # dimension counts may have changed: rebuilt on use
        self.htotal = resized(self.htotal, (k, c), 0)
        self.hfree = resized(self.hfree, (k, c), 0)
        self.inv_htotal = resized(self.inv_htotal, (k, c), 0.0)
        self.used_share = resized(self.used_share, (k, c), 0.0)
        self.capacity, self.dmax = c, d

    def add_dims(self, names: Sequence[str]) -> bool:
        new = [n for n in dict.fromkeys(names) if n not in self.dim_index]
        for name in new:
            self.dim_index[name] = len(self.dims)
            self.dims.append(name)
        if new:
            self.reshape(len(self.dims), self.capacity, self.dmax)
        return bool(new)

    # Per-node rows --------------------------------------------------------------------------------
    def clear(self, i: int) -> None:
        for a in (self.total, self.free, self.foreign):
            a[:, i] = 0
        self.valid[i] = self.healthy[i] = False
        self.minor[i] = self.numa[i] = self.pcie[i] = NO_SCOPE
        self.count[i] = 0
        self.links[i] = None
        self.shape_keys[i] = None
        self.htotal[:, i] = self.hfree[:, i] = 0
        self.inv_htotal[:, i] = self.used_share[:, i] = 0.0

    def move(self, src: int, dst: int) -> None:
        for a in (self.total, self.free, self.foreign, self.htotal, self.hfree, self.inv_htotal, self.used_share):
            a[:, dst] = a[:, src]
        for a in (self.valid, self.healthy, self.minor, self.numa, self.pcie, self.count):
            a[dst] = a[src]
        self.links[dst] = self.links[src]
        self.shape_keys[dst] = self.shape_keys[src]

    def refresh_sums(self, i: int) -> None:
        h = self.healthy[i]
        self.htotal[:, i] = (self.total[:, i] * h).sum(axis=1)
        self.hfree[:, i] = (self.free[:, i] * h).sum(axis=1)
        t = self.htotal[:, i]
        self.inv_htotal[:, i] = np.where(t > 0, 1.0 / np.maximum(t, 1), 0.0)
        self.used_share[:, i] = (t - self.hfree[:, i]) * self.inv_htotal[:, i]

    def take(self, i: int, k: int, slot: int, amount: int) -> None:
        """free -= amount on one device (amount < 0 gives back), keeping the node sums in step."""
        self.free[k, i, slot] -= amount
        if self.healthy[i, slot]:
            hfree = int(self.hfree[k, i]) - amount
            self.hfree[k, i] = hfree
            self.used_share[k, i] = (int(self.htotal[k, i]) - hfree) * float(self.inv_htotal[k, i])

    def shape_key(self, i: int) -> bytes:
        """Node i's devices of this type apart from their free amounts (totals, health, minors,
        NUMA, PCIe, links) as bytes, cached until the node's devices are rewritten (`clear`)."""
        key = self.shape_keys[i]
        if key is None:
            d, links = int(self.count[i]), self.links[i]
            parts = (self.total[:, i, :d], self.healthy[i, :d], self.minor[i, :d], self.numa[i, :d], self.pcie[i, :d])
            key = b"".join(
                [len(self.dims).to_bytes(2, "little"), d.to_bytes(2, "little")] + [p.tobytes() for p in parts]
            )
            if links is not None:
                key += links.tobytes()
            self.shape_keys[i] = key
        return key

    def slot_of(self, i: int, minor: int) -> int | None:
        d = int(self.count[i])
        if minor < d and self.minor[i, minor] == minor:  # the usual case: minors 0..d-1
            return minor
        hits = np.flatnonzero(self.minor[i, :d] == minor)
        return int(hits[0]) if hits.size else None

    def node_devices(self, i: int, copy: bool = True) -> NodeDevices:
        d = int(self.count[i])
        links = self.links[i]
        if not copy:  # views for a caller that reads them at once (the allocator in reserve)
            return NodeDevices(
                self.name, tuple(self.dims), self.minor[i, :d], self.healthy[i, :d], self.numa[i, :d],
                self.pcie[i, :d], self.total[:, i, :d], self.free[:, i, :d], links,
            )  # fmt: skip
        return NodeDevices(
            type=self.name,
            dims=tuple(self.dims),
            minors=self.minor[i, :d].copy(),
            healthy=self.healthy[i, :d].copy(),
            numa=self.numa[i, :d].copy(),
            pcie=self.pcie[i, :d].copy(),
            total=self.total[:, i, :d].copy(),
            free=self.free[:, i, :d].copy(),
            links=None if links is None else links.copy(),
        )
