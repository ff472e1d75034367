"""What preemption needs to know about bound workloads, kept by the cluster state on every assume/forget.

A `ClusterState` extra (like TenantUsage): per node, the workloads bound there with their
priority, start order, gang and labels; per priority, per resource, the amounts held on every
node (numpy columns), so the preemption plugin can tell in one vectorized pass on which nodes
evicting lower-priority workloads could free enough (plugins/preemption.py).

Gang, labels and disruption budget come from the binding's ``finesched.io/preemption``
annotation (written by the plugin's pre_bind), so a driver that rebuilds the state from stored
bindings keeps them. "Start" is the order in which bindings were assumed (`seq`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.device_allocated import DEVICE_ALLOCATED, binding_devices
from finesched.model.node import Node, device_totals
from finesched.model.resources import device_dimension
from finesched.sched.tenant_usage import binding_amounts

ANNOTATION_PREEMPTION = "finesched.io/preemption"
Int64Array = npt.NDArray[np.int64]
#: (device type, minor, ((dimension, amount), ...)) — one device grant, dimension names short.
Grant = tuple[str, int, tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True)
class Budget:
    """A disruption budget: at least `min_available` of the group stay bound."""

    owner: str  # the workload that declared it
    namespace: str
    min_available: int
    selector: tuple[tuple[str, str], ...]  # () = the owner's gang (or the owner alone)
    gang: str | None

    def covers(self, bound: Bound) -> bool:
        if self.selector:
            return bound.namespace == self.namespace and all(bound.labels.get(k) == v for k, v in self.selector)
        return bound.key == self.owner or (self.gang is not None and bound.gang == self.gang)


@dataclass(slots=True)
class Bound:
    """One bound workload as preemption sees it."""

    binding: Binding
    node: int
    seq: int
    amounts: Mapping[str, int]
    grants: tuple[Grant, ...] = ()
    gang: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    budget: Budget | None = None

    @property
    def key(self) -> str:
        return self.binding.workload

    @property
    def namespace(self) -> str:
        return self.binding.workload.split("/", 1)[0]

    @property
    def priority(self) -> int:
        return self.binding.priority


def annotation_for(gang: str | None, labels: Mapping[str, str], budget: Mapping[str, object] | None) -> str | None:
    """The annotation text a binding carries (None when there is nothing to record)."""
    doc: dict[str, object] = {}
    if gang:
        doc["gang"] = gang
    if labels:
        doc["labels"] = dict(labels)
    if budget is not None:
        doc["budget"] = dict(budget)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")) if doc else None


class PreemptionIndex:
    """Bound workloads per node and held amounts per (priority, resource, node); see the module docstring."""

    name = "PreemptionIndex"

    def __init__(self) -> None:
        self._capacity = 0
        #: priority -> resource -> [capacity] amount held on each node by workloads of that priority
        self.held: dict[int, dict[str, Int64Array]] = {}
        #: resource -> [capacity] device totals of each node (healthy devices; device dimensions only)
        self.device_capacity: dict[str, Int64Array] = {}
        #: priority -> (device type, dimension) -> [capacity, slots] amount held on each device
        #: (slot = the device's rank by minor on its node, the device accounts' order)
        self.device_held: dict[int, dict[tuple[str, str], Int64Array]] = {}
        self._slots: list[dict[tuple[str, int], int]] = []
        self._dmax = 8
        self.on_node: list[dict[str, Bound]] = []
        self.bound: dict[str, Bound] = {}
        self.gangs: dict[str, set[str]] = {}
        self.budgets: dict[str, Budget] = {}
        self._seq = 0
        #: Set while the scheduler evicts and re-admits victims to test a node: the index keeps its
        #: view (the state is restored exactly afterwards, and start order must not change).
        self.paused = False

    # NodeExtra ----------------------------------------------------------------------------------------
    def resize(self, capacity: int) -> None:
        grow = capacity - self._capacity
        if grow <= 0:
            return
        pad = np.zeros(grow, dtype=np.int64)
        for columns in (*self.held.values(), self.device_capacity):
            for name, array in columns.items():
                columns[name] = np.concatenate([array, pad])
        for per_device in self.device_held.values():
            for key, array in per_device.items():
                per_device[key] = np.concatenate([array, np.zeros((grow, array.shape[1]), dtype=np.int64)])
        self.on_node += [{} for _ in range(grow)]
        self._slots += [{} for _ in range(grow)]
        self._capacity = capacity

    def set_node(self, index: int, node: Node) -> None:
        for array in self.device_capacity.values():
            array[index] = 0
        slots: dict[tuple[str, int], int] = {}
        for kind in {d.type for d in node.devices}:
            minors = sorted(d.minor for d in node.devices if d.type == kind)
            slots.update({(kind, m): s for s, m in enumerate(minors)})
        self._slots[index] = slots
        for device in node.devices:
            if not device.health:
                continue
            for name, amount in device_totals(device).items():
                self._column(self.device_capacity, name)[index] += amount

    def move(self, src: int, dst: int) -> None:
        for columns in (*self.held.values(), self.device_capacity, *self.device_held.values()):
            for array in columns.values():
                array[dst] = array[src]
        self.on_node[dst] = self.on_node[src]
        self._slots[dst] = self._slots[src]
        for bound in self.on_node[dst].values():
            bound.node = dst

    def clear(self, index: int) -> None:
        for columns in (*self.held.values(), self.device_capacity, *self.device_held.values()):
            for array in columns.values():
                array[index] = 0
        self.on_node[index] = {}
        self._slots[index] = {}

    def assume(self, index: int, binding: Binding) -> None:
        if self.paused:
            return
        key = binding.workload
        if key in self.bound:  # a replayed binding is counted once
            self.forget(self.bound[key].node, self.bound[key].binding)
        self._seq += 1
        annotations = binding.annotations
        if binding.devices or DEVICE_ALLOCATED in annotations:
            grants = tuple(
                (kind, g.minor, tuple((device_dimension(n), a) for n, a in g.resources.items()))
                for kind, given in binding_devices(binding).items()
                for g in given
            )
            bound = Bound(binding, index, self._seq, binding_amounts(binding), grants)
        else:  # scalar only: the requests are all it holds (an immutable vector: no copy)
            bound = Bound(binding, index, self._seq, binding.requests)
        if annotations:
            text = annotations.get(ANNOTATION_PREEMPTION)
            if text:
                _read_annotation(bound, text)
        self.bound[key] = bound
        self.on_node[index][key] = bound
        columns = self.held.get(binding.priority)
        if columns is None:
            columns = self.held[binding.priority] = {}
        for name, amount in bound.amounts.items():
            array = columns.get(name)
            if array is None:
                array = self._column(columns, name)
            array[index] += amount
        if bound.grants:
            self._hold_devices(bound, +1)
        if bound.gang:
            self.gangs.setdefault(bound.gang, set()).add(key)
        if bound.budget is not None:
            self.budgets[key] = bound.budget

    def forget(self, index: int, binding: Binding) -> None:
        if self.paused:
            return
        bound = self.bound.pop(binding.workload, None)
        if bound is None:
            return
        self.on_node[bound.node].pop(bound.key, None)
        columns = self.held[bound.binding.priority]
        for name, amount in bound.amounts.items():
            columns[name][bound.node] -= amount
        self._hold_devices(bound, -1)
        if bound.gang:
            members = self.gangs.get(bound.gang)
            if members is not None:
                members.discard(bound.key)
                if not members:
                    del self.gangs[bound.gang]
        self.budgets.pop(bound.key, None)

    def _hold_devices(self, bound: Bound, sign: int) -> None:
        if not bound.grants:
            return
        per_device = self.device_held.setdefault(bound.priority, {})
        slots = self._slots[bound.node]
        for kind, minor, amounts in bound.grants:
            slot = slots.get((kind, minor))
            if slot is None:
                continue
            if slot >= self._dmax:
                self._widen(slot + 1)
            for dim, amount in amounts:
                array = per_device.get((kind, dim))
                if array is None:
                    array = per_device[(kind, dim)] = np.zeros((self._capacity, self._dmax), dtype=np.int64)
                array[bound.node, slot] += sign * amount

    def _widen(self, slots: int) -> None:
        for per_device in self.device_held.values():
            for key, array in per_device.items():
                per_device[key] = np.concatenate(
                    [array, np.zeros((array.shape[0], slots - array.shape[1]), dtype=np.int64)], axis=1
                )
        self._dmax = slots

    def device_held_upto(self, levels: Iterable[int], kind: str, dim: str, n: int, d: int) -> Int64Array | None:
        """[n, d] amount of (kind, dim) held per device by workloads of the given priorities."""
        out = None
        for p in levels:
            array = self.device_held.get(p, {}).get((kind, dim))
            if array is not None:
                part = array[:n, :d]
                if part.shape[1] < d:
                    part = np.pad(part, ((0, 0), (0, d - part.shape[1])))
                out = part.copy() if out is None else out + part
        return out

    def snapshot(self) -> object:
        return (
            {p: {n: a.copy() for n, a in cols.items()} for p, cols in self.held.items()},
            {n: a.copy() for n, a in self.device_capacity.items()},
            {p: {k: a.copy() for k, a in cols.items()} for p, cols in self.device_held.items()},
            [dict(d) for d in self._slots],
            self._dmax,
            [dict(d) for d in self.on_node],
            dict(self.bound),
            {g: set(m) for g, m in self.gangs.items()},
            dict(self.budgets),
            self._seq,
            self._capacity,
        )

    def restore(self, snapshot: object) -> None:
        assert isinstance(snapshot, tuple)
        held, device_capacity, device_held, slots, dmax, on_node, bound, gangs, budgets, seq, capacity = snapshot
        self.held = {p: {n: a.copy() for n, a in cols.items()} for p, cols in held.items()}
        self.device_capacity = {n: a.copy() for n, a in device_capacity.items()}
        self.device_held = {p: {k: a.copy() for k, a in cols.items()} for p, cols in device_held.items()}
        self._slots, self._dmax = [dict(d) for d in slots], dmax
        self.on_node = [dict(d) for d in on_node]
        self.bound, self.gangs, self.budgets = dict(bound), {g: set(m) for g, m in gangs.items()}, dict(budgets)
        self._seq, self._capacity = seq, capacity

    def violations(self) -> list[str]:
        return [
            f"preemption index: priority {p} holds {int(a.min())} of {name} on some node (must not be negative)"
            for p, cols in self.held.items()
            for name, a in cols.items()
            if a.size and a.min() < 0
        ]

    # Queries ------------------------------------------------------------------------------------------
    def _column(self, columns: dict[str, Int64Array], name: str) -> Int64Array:
        array = columns.get(name)
        if array is None:
            array = columns[name] = np.zeros(self._capacity, dtype=np.int64)
        return array

    def held_below(self, priority: int, name: str, n: int, *, inclusive: bool = False) -> Int64Array:
        """[n] amount of `name` held on each node by workloads of lower (or equal) priority."""
        out = np.zeros(n, dtype=np.int64)
        for p, columns in self.held.items():
            if p < priority or (inclusive and p == priority):
                array = columns.get(name)
                if array is not None:
                    out += array[:n]
        return out

    def held_by_priority(self, name: str, n: int) -> dict[int, Int64Array]:
        return {p: cols[name][:n] for p, cols in self.held.items() if name in cols}

    def used(self, name: str, n: int) -> Int64Array:
        out = np.zeros(n, dtype=np.int64)
        for columns in self.held.values():
            array = columns.get(name)
            if array is not None:
                out += array[:n]
        return out

    def gang_members(self, bound: Bound) -> list[Bound]:
        """The bound members of `bound`'s gang (itself alone when it has none)."""
        if not bound.gang:
            return [bound]
        return [self.bound[k] for k in sorted(self.gangs.get(bound.gang, ())) if k in self.bound]

    def budget_groups(self) -> list[tuple[Budget, set[str]]]:
        """Every distinct declared budget with the keys of the bound workloads it covers."""
        if not self.budgets:
            return []
        groups, seen = [], set()
        for budget in self.budgets.values():
            # Members of a gang (or of a label group) usually all declare the same budget: one group.
            same = (budget.namespace, budget.selector, budget.min_available) + (
                () if budget.selector else (budget.gang or budget.owner,)
            )
            if same in seen:
                continue
            seen.add(same)
            groups.append((budget, {b.key for b in self._candidates(budget) if budget.covers(b)}))
        return groups

    def _candidates(self, budget: Budget) -> Iterable[Bound]:
        if not budget.selector and budget.gang:
            return (self.bound[k] for k in self.gangs.get(budget.gang, ()) if k in self.bound)
        if not budget.selector:
            return (b for b in (self.bound.get(budget.owner),) if b is not None)
        return self.bound.values()


def _read_annotation(bound: Bound, text: str) -> None:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return  # not ours to reject here: the binding is already accepted by the state
    if not isinstance(doc, dict):
        return
    gang = doc.get("gang")
    bound.gang = gang if isinstance(gang, str) and gang else None
    labels = doc.get("labels")
    if isinstance(labels, dict):
        bound.labels = {str(k): str(v) for k, v in labels.items()}
    budget = doc.get("budget")
    if isinstance(budget, dict) and isinstance(budget.get("minAvailable"), int):
        selector = budget.get("selector") or {}
        bound.budget = Budget(
            bound.key,
            bound.namespace,
            int(budget["minAvailable"]),
            tuple(sorted((str(k), str(v)) for k, v in selector.items())) if isinstance(selector, dict) else (),
            bound.gang,
        )
