"""deviceAllocateHint on one node: which devices a hinted type may take, and whether the node can serve it.

One definition (`hint_candidates`, `scope_groups`, `hint_problem`) serves both the filter (per node,
cached by the accounts) and the exact allocator, so a node the filter passes is one the allocator
can serve and the other way round. Requests without a hint never come here.

* selector: a device whose labels do not match is never taken;
* exclusivePolicy DeviceLevel: only devices nobody uses (free == total in every dimension); the
  allocator then grants each whole, so no later workload can share it;
* exclusivePolicy PCIeLevel: only devices on PCIe switches where no device of the type is in use
  (a device without a known switch counts as its own switch);
* allocateStrategy ApplyForAll: the pod needs every healthy matching device of the node, each
  fitting one instance (at least one);
* requiredTopologyScope PCIe / NUMANode: all the type's devices for the pod share one switch / one
  NUMA node (a device with an unknown one is a scope of its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from finesched.model.node import Node
from finesched.plugins.deviceshare.request import TypeHint, TypeRequest, device_label
from finesched.state.device_types import NodeDevices

BoolArray = npt.NDArray[np.bool_]
Int64Array = npt.NDArray[np.int64]
Labels = tuple[Mapping[str, str], ...]

SCOPE_WORDS = {"PCIe": "PCIe switch", "NUMANode": "NUMA node"}


def device_labels(node: Node, kind: str) -> Labels:
    """The labels of `node`'s devices of `kind`, in slot order (minor ascending, as the accounts pack them)."""
    return tuple(d.labels for d in sorted((d for d in node.devices if d.type == kind), key=lambda d: d.minor))


def selector_mask(hint: TypeHint, labels: Labels, n: int) -> BoolArray:
    """[n] True where the hint's selector matches (everywhere without a selector)."""
    if hint.selector is None:
        return np.ones(n, dtype=bool)
    return np.fromiter((hint.selector.matches(labels[j]) for j in range(n)), dtype=bool, count=n)


def hint_candidates(
    nd: NodeDevices, request: TypeRequest, labels: Labels, fits: BoolArray
) -> tuple[BoolArray, BoolArray]:
    """(matching [d], allowed [d]): healthy devices the selector matches, and those of them that fit one
    instance and respect the exclusive policy."""
    hint = request.hint
    assert hint is not None
    matching = nd.healthy & selector_mask(hint, labels, len(nd))
    allowed = matching & fits
    if hint.exclusive is not None:
        used = (nd.free != nd.total).any(axis=0)
        if hint.exclusive == "DeviceLevel":
            allowed &= ~used
        else:  # PCIeLevel
            busy = np.unique(nd.pcie[used & (nd.pcie >= 0)])
            allowed &= ~used & ~np.isin(nd.pcie, busy)
    return matching, allowed


def scope_groups(nd: NodeDevices, scope: str | None) -> Int64Array:
    """[d] group id per device under `scope`: all zeros without one; unknown ids become singletons."""
    if scope is None:
        return np.zeros(len(nd), dtype=np.int64)
    ids = nd.pcie if scope == "PCIe" else nd.numa
    return np.where(ids >= 0, ids, -2 - np.arange(len(nd), dtype=np.int64))


def needed(request: TypeRequest, matching: BoolArray) -> int:
    """How many devices the pod takes: every matching one under ApplyForAll, else the request's count."""
    assert request.hint is not None
    return int(matching.sum()) if request.hint.apply_all else request.count


def hint_problem(nd: NodeDevices | None, request: TypeRequest, labels: Labels, fits: BoolArray | None) -> str | None:
    """Why the node cannot give `request` its devices under the hint (None: it can)."""
    hint, kind = request.hint, request.type
    assert hint is not None
    if nd is None or len(nd) == 0 or fits is None:
        return f"node has no {kind}"
    matching, allowed = hint_candidates(nd, request, labels, fits)
    need = needed(request, matching)
    what = f"deviceAllocateHint {kind}"
    if not matching.any():
        return f"{what}: no healthy {device_label(kind)} matches the selector"
    if hint.apply_all and (allowed != matching).any():
        return f"{what}: ApplyForAll needs all {need} matching {device_label(kind, need != 1)} free"
    free_word = {"DeviceLevel": " unused", "PCIeLevel": " unshared-switch"}.get(hint.exclusive or "", "")
    if int(allowed.sum()) < need:
        return f"{what}: {int(allowed.sum())} matching{free_word} free {device_label(kind, True)}, needs {need}"
    if hint.scope is not None:
        groups = scope_groups(nd, hint.scope)
        _, counts = np.unique(groups[allowed], return_counts=True)
        if hint.apply_all:
            ok = len(np.unique(groups[matching])) == 1
        else:
            ok = bool(counts.size) and int(counts.max()) >= need
        if not ok:
            return f"{what}: no {SCOPE_WORDS[hint.scope]} has {need} matching free {device_label(kind, need != 1)}"
    return None


def scoped_sets(groups: Int64Array, candidates: Sequence[int]) -> list[list[int]]:
    """`candidates` split by scope group, in group order."""
    out: dict[int, list[int]] = {}
    for slot in candidates:
        out.setdefault(int(groups[slot]), []).append(slot)
    return [out[g] for g in sorted(out)]
