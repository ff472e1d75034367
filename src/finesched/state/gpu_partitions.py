"""GPU partition tables per node (model/gpu_partitions.py), compiled into the GPU slot space of the
device accounts (GPUs that are not in MIG mode, minor order, packed from 0).

The `NodeExtra` named "gpu-partitions" keeps, per node, the id of its compiled table (-1: none; equal
tables on equally numbered GPUs share one) and whether its policy is Honor. A `CountPlan` holds one
GPU count's partitions as slot bitmasks with their allocationScore and ring bandwidth (-1 unknown), so
"which partitions are free" is one AND per partition over many nodes at once.

Invariant (`violations`): on a node whose policy is Honor, every binding finesched placed that holds
whole GPUs holds a set the table allows (bindings found at a rebuild, e.g. from before the table,
are tolerated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.device_allocated import AnnotationError, binding_devices
from finesched.model.gpu_partitions import TableKey, table_key
from finesched.model.node import Node
from finesched.model.resources import GPU, GPU_CORE, GPU_MEMORY_RATIO
from finesched.state.cluster import ClusterState

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class CountPlan:
    """One GPU count's partitions: slot masks, allocationScores, bandwidths, minors (table order)."""

    count: int
    masks: Int64Array
    scores: Int64Array
    bandwidth: Int64Array
    minors: tuple[tuple[int, ...], ...]

    def allowed(self, restricted: bool, bandwidth: int | None) -> npt.NDArray[np.bool_]:
        """[P] partitions a request may take: all (BestEffort) or the top score only (Restricted),
        with at least `bandwidth` ring bandwidth when it asks for one."""
        ok = np.ones(len(self.masks), dtype=bool)
        if restricted and len(self.scores):
            ok &= self.scores == self.scores.max()
        if bandwidth is not None:
            ok &= self.bandwidth >= bandwidth
        return ok


@dataclass(frozen=True, eq=False)
class CompiledTable:
    plans: Mapping[int, CountPlan]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.plans, reverse=True))


def compile_table(key: TableKey, slot_of_minor: Mapping[int, int]) -> CompiledTable:
    plans = {}
    for count, parts in key:
        masks = [sum(1 << slot_of_minor[m] for m in minors) for minors, _, _ in parts]
        plans[count] = CountPlan(
            count,
            np.asarray(masks, dtype=np.int64),
            np.asarray([score for _, score, _ in parts], dtype=np.int64),
            np.asarray([bw for _, _, bw in parts], dtype=np.int64),
            tuple(minors for minors, _, _ in parts),
        )
    return CompiledTable(plans)


def whole_gpu_minors(binding: Binding) -> frozenset[int] | None:
    """The minors of a binding's whole (non-MIG) GPUs, or None when it holds a shared one or none."""
    try:
        grants = [g for g in binding_devices(binding).get(GPU, ()) if g.mig is None]
    except AnnotationError:
        return None
    if not grants or any(
        g.resources.get(GPU_CORE, 0) < 100 or g.resources.get(GPU_MEMORY_RATIO, 100) < 100 for g in grants
    ):
        return None
    return frozenset(g.minor for g in grants)


class PartitionTables:
    """The `NodeExtra` named "gpu-partitions" (module docstring)."""

    name = "gpu-partitions"
    #: A binding without devices holds no whole GPU: skipped for plain scalar bindings (state/cluster.py).
    quiet_for_plain_scalar = True

    def __init__(self) -> None:
        self.capacity = 0
        self.table_id = np.full(0, -1, dtype=np.int64)
        self.honor = np.zeros(0, dtype=bool)
        self.tables: list[CompiledTable] = []
        self.rebuilding = False
        self._ids: dict[tuple[TableKey, tuple[tuple[int, int], ...]], int] = {}
        self._names: list[str | None] = []
        self._allowed: list[frozenset[frozenset[int]] | None] = []  # per node, the sets Honor allows
        self._held: list[dict[str, frozenset[int]]] = []
        self._tolerated: list[set[str]] = []
        self._active: set[int] = set()
        #: (count, restricted, bandwidth) -> `plan_matrix`; cleared whenever `tables` changes.
        self._matrices: dict[tuple[int, bool, int | None], tuple[Int64Array, npt.NDArray[np.bool_]]] = {}

    @property
    def active(self) -> bool:
        """Some node has a table or the Honor policy (O(1): asked on every whole-GPU decision)."""
        return bool(self._active)

    def _note(self, i: int) -> None:
        if self.table_id[i] >= 0 or self.honor[i]:
            self._active.add(i)
        else:
            self._active.discard(i)

    def resize(self, capacity: int) -> None:
        old = self.capacity
        self.capacity = capacity
        table_id, honor = np.full(capacity, -1, dtype=np.int64), np.zeros(capacity, dtype=bool)
        keep = min(old, capacity)
        table_id[:keep], honor[:keep] = self.table_id[:keep], self.honor[:keep]
        self.table_id, self.honor = table_id, honor
        self._active = {i for i in self._active if i < capacity}
        self._names = (self._names + [None] * capacity)[:capacity]
        self._allowed = (self._allowed + [None] * capacity)[:capacity]
        for lst, make in ((self._held, dict), (self._tolerated, set)):
            del lst[capacity:]
            lst.extend(make() for _ in range(capacity - len(lst)))

    def set_node(self, index: int, node: Node) -> None:
        i = index
        self._names[i] = node.name
        self._held[i], self._tolerated[i] = {}, set()
        self.honor[i] = node.partition_policy == "Honor"
        if not node.gpu_partitions:
            self.table_id[i], self._allowed[i] = -1, None
            self._note(i)
            return
        gpus = sorted(d.minor for d in node.devices if d.type == GPU and d.mig is None)
        slots = {minor: slot for slot, minor in enumerate(gpus)}
        key = table_key(node.gpu_partitions)
        ident = (key, tuple(sorted(slots.items())))
        tid = self._ids.get(ident)
        if tid is None:
            tid = self._ids[ident] = len(self.tables)
            self.tables.append(compile_table(key, slots))
            self._matrices = {}
        self.table_id[i] = tid
        self._allowed[i] = frozenset(frozenset(p.minors) for parts in node.gpu_partitions.values() for p in parts)
        self._note(i)

    def move(self, src: int, dst: int) -> None:
        self.table_id[dst], self.honor[dst] = self.table_id[src], self.honor[src]
        self._names[dst], self._allowed[dst] = self._names[src], self._allowed[src]
        self._held[dst], self._tolerated[dst] = self._held[src], self._tolerated[src]
        self._note(dst)

    def clear(self, index: int) -> None:
        self.table_id[index], self.honor[index] = -1, False
        self._names[index], self._allowed[index] = None, None
        self._held[index], self._tolerated[index] = {}, set()
        self._active.discard(index)

    def assume(self, index: int, binding: Binding) -> None:
        """Records whole-GPU sets on Honor nodes (policy is the plugin's; the state only watches it)."""
        if not self.honor[index] or self._allowed[index] is None:  # nothing to watch (update_node replays)
            return
        minors = whole_gpu_minors(binding)
        if minors is None:
            return
        self._held[index][binding.workload] = minors
        if self.rebuilding:
            self._tolerated[index].add(binding.workload)

    def forget(self, index: int, binding: Binding) -> None:
        self._held[index].pop(binding.workload, None)
        self._tolerated[index].discard(binding.workload)

    def snapshot(self) -> object:
        return (
            self.table_id.copy(), self.honor.copy(), list(self.tables), dict(self._ids), list(self._names),
            list(self._allowed), [dict(h) for h in self._held], [set(t) for t in self._tolerated], set(self._active),
        )  # fmt: skip

    def restore(self, snapshot: object) -> None:
        table_id, honor, tables, ids, names, allowed, held, tolerated, active = snapshot  # type: ignore[misc]
        capacity = self.capacity
        self.table_id, self.honor, self.tables, self._ids = table_id.copy(), honor.copy(), list(tables), dict(ids)
        self._names, self._allowed = list(names), list(allowed)
        self._held, self._tolerated = [dict(h) for h in held], [set(t) for t in tolerated]
        self._active = set(active)
        self._matrices = {}
        self.resize(capacity)

    def plan_matrix(
        self, count: int, restricted: bool, bandwidth: int | None
    ) -> tuple[Int64Array, npt.NDArray[np.bool_]]:
        """Every table's allowed `count`-GPU partitions as one padded array, so a filter tests all
        nodes at once whatever their table: ([T, P] slot masks, [T, P] allowed), row t for
        ``tables[t]`` (no allowed column where a table has no such partition)."""
        key = (count, restricted, bandwidth)
        hit = self._matrices.get(key)
        if hit is None:
            plans = [t.plans.get(count) for t in self.tables]
            width = max([1, *(len(p.masks) for p in plans if p is not None)])
            masks = np.zeros((max(len(plans), 1), width), dtype=np.int64)
            allowed = np.zeros(masks.shape, dtype=bool)
            for t, plan in enumerate(plans):
                if plan is not None:
                    masks[t, : len(plan.masks)] = plan.masks
                    allowed[t, : len(plan.masks)] = plan.allowed(restricted, bandwidth)
            masks.flags.writeable = allowed.flags.writeable = False
            hit = self._matrices[key] = (masks, allowed)
        return hit

    def table_of(self, index: int) -> CompiledTable | None:
        tid = int(self.table_id[index])
        return None if tid < 0 else self.tables[tid]

    def violations(self) -> list[str]:
        out = []
        for i, name in enumerate(self._names):
            allowed = self._allowed[i]
            if name is None or allowed is None or not self.honor[i]:
                continue
            for key, minors in self._held[i].items():
                if minors not in allowed and key not in self._tolerated[i]:
                    out.append(f"{name}: {key} holds GPUs {sorted(minors)}, not a partition of its Honor table")
        return out


def attach_partition_tables(state: ClusterState) -> PartitionTables:
    existing = state.extras.get(PartitionTables.name)
    if isinstance(existing, PartitionTables):
        return existing
    return state.attach(PartitionTables())
