"""NUMAAlign's device side: which devices of each requested type count on which NUMA nodes.

The device hint provider (Koordinator's deviceshare/topology_hint.go) and the SingleNUMANode
filter count, per NUMA node, the devices that could hold one instance of the DeviceShare request.
With a deviceAllocateHint they count only what the hint admits (plugins/deviceshare/hints.py, the
same functions the allocator uses), so NUMAAlign never aligns on devices DeviceShare may not take:

* devices the selector does not match, or the exclusive policy rules out, count nowhere;
* ApplyForAll needs every matching device, so the count asked is that number;
* a required topology scope (PCIe switch, NUMA node) keeps the type's devices in one scope group:
  a set of NUMA nodes holds the request when one group has enough devices on those NUMA nodes.

Devices without a NUMA node count nowhere. Example: GPUs 0-1 on NUMA 0 labelled ``model=a``,
GPUs 2-3 on NUMA 1 labelled ``model=b``, a hint selecting ``model=b`` for one GPU: the provider
hints {1} only, where without the hint it would prefer {0} (lower id) and DeviceShare would then
find no matching GPU there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.plugins.cpu.prefilter import DeviceFits
from finesched.plugins.deviceshare.hints import device_labels, hint_candidates, needed, scope_groups
from finesched.plugins.deviceshare.plugin import DEVICE_REQUEST
from finesched.plugins.deviceshare.request import DeviceRequest, TypeRequest, compile_rule, fit_mask
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import NodeBatch
from finesched.state.cluster import ClusterState
from finesched.state.device_types import NodeDevices
from finesched.state.devices import DeviceAccounts

BoolArray = npt.NDArray[np.bool_]
#: Whether a set of NUMA ids can hold the type's request.
Holds = Callable[[frozenset[int]], bool]


def device_request(cycle: CycleState, state: ClusterState | None) -> tuple[DeviceRequest, DeviceAccounts] | None:
    """(DeviceShare's normalized request, the device accounts) when this cycle asks for devices."""
    if state is None:
        return None
    devices = state.extras.get("devices")
    dreq = cycle.get(DEVICE_REQUEST)
    if not isinstance(devices, DeviceAccounts) or dreq is None or not dreq.types:
        return None
    return dreq, devices


@dataclass(frozen=True, slots=True)
class TypeCounts:
    """One type's devices on one node as the provider counts them (module docstring)."""

    need: int  # devices the request takes
    numa: npt.NDArray[np.int64]  # [d] NUMA id per device (-1: none)
    groups: npt.NDArray[np.int64]  # [d] scope group per device (all 0 without a scope)
    available: BoolArray  # [d] may be taken now (fits one instance; with a hint: admitted by it)
    capacity: BoolArray  # [d] counts towards the node's capacity: healthy (with a hint: and matching)

    def holds(self, usable: BoolArray) -> Holds:
        """Whether a NUMA set has `need` `usable` devices in one scope group."""
        numa, groups, need = self.numa, self.groups, self.need

        def check(mask: frozenset[int]) -> bool:
            inside = usable & np.isin(numa, list(mask))
            if not inside.any():
                return need <= 0
            return int(np.bincount(groups[inside] - groups.min()).max()) >= need

        return check


def type_counts(tr: TypeRequest, nd: NodeDevices, labels: Sequence[Any]) -> TypeCounts:
    """The provider's view of `nd` for `tr` (no hint: fitting now / healthy, the count asked)."""
    rule = compile_rule(tr, nd.dims)
    fits = fit_mask(rule, nd.free, nd.total, nd.healthy)
    if tr.hint is None:
        return TypeCounts(tr.count, nd.numa, np.zeros(len(nd), dtype=np.int64), fits, nd.healthy.copy())
    matching, allowed = hint_candidates(nd, tr, labels, fits)
    return TypeCounts(needed(tr, matching), nd.numa, scope_groups(nd, tr.hint.scope), allowed, matching)


def idle_counts(tr: TypeRequest, nd: NodeDevices, labels: Sequence[Any]) -> TypeCounts:
    """`type_counts` were every device of the node healthy and unused (for "could it ever fit")."""
    return type_counts(tr, replace(nd, free=nd.total, healthy=np.ones(len(nd), dtype=bool)), labels)


def device_fits(cycle: CycleState, state: ClusterState | None, nodes: NodeBatch) -> DeviceFits:
    """Per requested type (count, [n, D] devices that count, [n, D] their NUMA id) over the batch,
    the SingleNUMANode filter's input. A hinted type counts the devices its hint admits (kept
    per node by the device accounts' cache, refreshed where devices changed); its count is
    per node under ApplyForAll."""
    found = device_request(cycle, state)
    if found is None or state is None:
        return []
    dreq, devices = found
    out: list[tuple[Any, np.ndarray, np.ndarray]] = []
    for kind, tr in dreq.types.items():
        acc = devices.types.get(kind)
        if acc is None:
            out.append((tr.count, np.zeros((nodes.n, 0), dtype=bool), np.zeros((nodes.n, 0), dtype=np.int64)))
            continue
        rule = compile_rule(tr, acc.dims)
        if tr.hint is None:
            _, where = devices.fit_counts(kind, rule, partial(fit_mask, rule), state.n)
            out.append((tr.count, nodes.take(where), nodes.take(acc.numa)))
            continue

        def compute(rows: Any, kind: str = kind, tr: TypeRequest = tr) -> tuple[np.ndarray, ...]:
            ids = range(rows.start or 0, rows.stop) if isinstance(rows, slice) else rows.tolist()
            width = devices.types[kind].numa.shape[1]
            allowed, need = np.zeros((len(ids), width), dtype=bool), np.zeros(len(ids), dtype=np.int64)
            for row, i in enumerate(ids):
                nd = devices.node_devices(i, kind, copy=False)
                if nd is not None:
                    counts = type_counts(tr, nd, device_labels(state.nodes[i], kind))
                    allowed[row, : len(nd)], need[row] = counts.available, counts.need
            return allowed, need

        if nodes.index is None:
            where, count = devices.cached(("numa-hint", kind, tr, rule), compute, state.n)
        else:
            where, count = compute(nodes.index)
        out.append((count, where, nodes.take(acc.numa)))
    return out
