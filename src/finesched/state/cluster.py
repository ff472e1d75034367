"""ClusterState: what every node has and has left, as numpy struct-of-arrays.

The scheduling cycle filters and scores *all* nodes in a few numpy passes (DESIGN.md
"Performance model"), so per-resource amounts are stored resource-major: ``free[r]`` is one
contiguous int64 row over nodes. Capacity grows by doubling, so adding nodes one at a time
costs amortized O(R) each. Removing a node moves the last node into its slot (indices of other
nodes may change; names never do).

Only this class changes free amounts, and only through `assume` / `forget` (DESIGN.md "State
and concurrency rules"). `assume` checks that the binding fits first and changes nothing when
it does not, so over-allocation cannot happen through the public API. Plugins that keep their
own per-node accounts (devices, CPUs, bucket indexes) attach a `NodeExtra`; the state keeps it
in step with every node and binding change.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from finesched.errors import InvariantViolation
from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.resources import CPU, MEMORY, PODS
from finesched.state.labels import LabelIndex

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Rows every state has, so the common requests never add a row mid-run.
BASE_RESOURCES = (CPU, MEMORY, PODS)


class StateError(ValueError):
    """A state operation that cannot be done (unknown node, binding that does not fit, ...)."""


class NodeExtra(Protocol):
    """Per-node accounts a plugin keeps beside the scalar arrays (devices, CPUs, bucket index).

    Contract: `set_node`, `move` and `clear` mirror node changes; `assume` raises `StateError`
    and changes nothing when the binding does not fit; `forget` is the exact inverse of
    `assume`; `snapshot`/`restore` round-trip everything the extra holds.
    """

    name: str

    def resize(self, capacity: int) -> None: ...
    def set_node(self, index: int, node: Node) -> None: ...
    def move(self, src: int, dst: int) -> None: ...
    def clear(self, index: int) -> None: ...
    def assume(self, index: int, binding: Binding) -> None: ...
    def forget(self, index: int, binding: Binding) -> None: ...
    def snapshot(self) -> object: ...
    def restore(self, snapshot: object) -> None: ...
    def violations(self) -> list[str]: ...


class NodeObserver(Protocol):
    """An extra that indexes the final per-node amounts (e.g. the S4 bucket index).

    `refresh(i)` is called after every change to node i has been applied (scalar free and all
    other extras), so the observer reads settled values from the state.
    """

    def refresh(self, index: int) -> None: ...


E = TypeVar("E", bound=NodeExtra)


@dataclass(frozen=True)
class Snapshot:
    """Everything `restore` needs to put a state back exactly as it was."""

    n: int
    resources: tuple[str, ...]
    allocatable: Int64Array
    free: Int64Array
    nodes: tuple[Node, ...]
    bindings: dict[str, Binding]
    committed: frozenset[str]
    extras: dict[str, object]
    labels: object


class ClusterState:
    """Numpy struct-of-arrays over nodes: allocatable and free per resource, labels, bindings."""

    def __init__(self, resources: Sequence[str] = BASE_RESOURCES, capacity: int = 64):
        self.resources: list[str] = list(dict.fromkeys([*BASE_RESOURCES, *resources]))
        self.res_index: dict[str, int] = {r: i for i, r in enumerate(self.resources)}
        self._capacity = max(capacity, 1)
        self._alloc = np.zeros((len(self.resources), self._capacity), dtype=np.int64)
        self._free = np.zeros_like(self._alloc)
        self._inv_alloc = np.zeros((len(self.resources), self._capacity), dtype=np.float64)
        self.n = 0
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.nodes: list[Node] = []
        self.labels = LabelIndex(self._capacity)
        self.bindings: dict[str, Binding] = {}
        self._committed: set[str] = set()
        self._on_node: list[set[str]] = []
        self.extras: dict[str, NodeExtra] = {}
        self._observers: list[NodeObserver] = []
        #: Bumped whenever capacity may have grown (node added/updated, binding forgotten):
        #: the queue retries unschedulable workloads when it changes.
        self.capacity_version = 0
        #: Bumped whenever the node set or a node's manifest changes (caches keyed on it).
        self.nodes_version = 0
        self._totals: tuple[int, dict[str, int]] = (-1, {})

    # Construction ---------------------------------------------------------------------------------
    @classmethod
    def from_nodes(cls, nodes: Iterable[Node], bindings: Iterable[Binding] = ()) -> ClusterState:
        """A state holding `nodes`, with `bindings` assumed and committed (the start-up rebuild)."""
        nodes = list(nodes)
        names = dict.fromkeys(r for node in nodes for r in node.allocatable)
        state = cls(resources=list(names), capacity=max(64, len(nodes)))
        for node in nodes:
            state.add_node(node)
        for binding in bindings:
            state.assume(binding)
            state.commit(binding.workload)
        return state

    # Array views ------------------------------------------------------------------------------------
    @property
    def allocatable(self) -> Int64Array:
        """[R, n] allocatable amounts (a view; do not write)."""
        return self._alloc[:, : self.n]

    @property
    def free(self) -> Int64Array:
        """[R, n] amounts not held by any binding (a view; do not write)."""
        return self._free[:, : self.n]

    @property
    def inv_allocatable(self) -> npt.NDArray[np.float64]:
        """[R, n] 1/allocatable, 0 where allocatable is 0, so share math never divides by zero."""
        return self._inv_alloc[:, : self.n]

    def row(self, resource: str) -> int | None:
        return self.res_index.get(resource)

    # Nodes ------------------------------------------------------------------------------------------
    def add_node(self, node: Node) -> int:
        """Add `node` (its name must be new); return its index."""
        if node.name in self.index:
            raise StateError(f"node {node.name!r} already exists")
        self._ensure_rows(node.allocatable)
        if self.n == self._capacity:
            self._grow(self._capacity * 2)
        i = self.n
        self.n += 1
        self.names.append(node.name)
        self.index[node.name] = i
        self.nodes.append(node)
        self._on_node.append(set())
        self._write_node(i, node)
        for extra in self.extras.values():
            extra.set_node(i, node)
        self._refresh(i)
        self.capacity_version += 1
        self.nodes_version += 1
        return i

    def update_node(self, node: Node) -> None:
        """Replace a node's manifest; its bindings stay, and must still fit (else nothing changes)."""
        i = self._node_index(node.name)
        saved = self.snapshot()
        try:
            self._ensure_rows(node.allocatable)
            self.nodes[i] = node
            self._write_node(i, node)
            for extra in self.extras.values():
                extra.set_node(i, node)
            for key in self._on_node[i]:
                binding = self.bindings[key]
                self._take(i, binding)
                for extra in self.extras.values():
                    extra.assume(i, binding)
        except StateError as exc:
            self.restore(saved)
            raise StateError(f"cannot update node {node.name!r}: its bindings no longer fit ({exc})") from None
        self._refresh(i)
        self.capacity_version += 1
        self.nodes_version += 1

    def remove_node(self, name: str, *, force: bool = False) -> list[Binding]:
        """Remove a node. Refused while bindings exist on it unless `force`, which forgets them (returned)."""
        i = self._node_index(name)
        on_node = [self.bindings[k] for k in sorted(self._on_node[i])]
        if on_node and not force:
            raise StateError(f"node {name!r} holds {len(on_node)} binding(s); remove them first or force")
        for binding in on_node:
            self.forget(binding.workload)
        last = self.n - 1
        if i != last:
            self._alloc[:, i] = self._alloc[:, last]
            self._free[:, i] = self._free[:, last]
            self._inv_alloc[:, i] = self._inv_alloc[:, last]
            self.names[i], self.nodes[i], self._on_node[i] = self.names[last], self.nodes[last], self._on_node[last]
            self.index[self.names[i]] = i
            self.labels.move(last, i)
            for extra in self.extras.values():
                extra.move(last, i)
            self._refresh(i)
        self._alloc[:, last] = 0
        self._free[:, last] = 0
        self._inv_alloc[:, last] = 0
        self.labels.clear(last)
        for extra in self.extras.values():
            extra.clear(last)
        del self.index[name]
        self.names.pop()
        self.nodes.pop()
        self._on_node.pop()
        self.n -= 1
        self.nodes_version += 1
        return on_node

    def node(self, name: str) -> Node:
        return self.nodes[self._node_index(name)]

    def bindings_on(self, name: str) -> list[Binding]:
        return [self.bindings[k] for k in sorted(self._on_node[self._node_index(name)])]

    def _node_index(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise StateError(f"no node named {name!r}") from None

    def _write_node(self, i: int, node: Node) -> None:
        self._alloc[:, i] = 0
        for name, amount in node.allocatable.items():
            self._alloc[self.res_index[name], i] = amount
        self._free[:, i] = self._alloc[:, i]
        column = self._alloc[:, i]
        with np.errstate(divide="ignore"):
            self._inv_alloc[:, i] = np.where(column > 0, 1.0 / np.maximum(column, 1), 0.0)
        self.labels.set(i, node.labels)

    def _ensure_rows(self, names: Iterable[str]) -> None:
        new = [r for r in names if r not in self.res_index]
        if not new:
            return
        for r in new:
            self.res_index[r] = len(self.resources)
            self.resources.append(r)
        pad = np.zeros((len(new), self._capacity), dtype=np.int64)
        self._alloc = np.vstack([self._alloc, pad])
        self._free = np.vstack([self._free, pad])
        self._inv_alloc = np.vstack([self._inv_alloc, pad.astype(np.float64)])

    def _grow(self, capacity: int) -> None:
        def grown(a: np.ndarray) -> np.ndarray:
            out = np.zeros((a.shape[0], capacity), dtype=a.dtype)
            out[:, : self.n] = a[:, : self.n]
            return out

        self._alloc, self._free, self._inv_alloc = grown(self._alloc), grown(self._free), grown(self._inv_alloc)
        self.labels.resize(capacity)
        for extra in self.extras.values():
            extra.resize(capacity)
        self._capacity = capacity

    # Bindings ----------------------------------------------------------------------------------------
    def assume(self, binding: Binding) -> None:
        """Take the binding's amounts on its node; raise StateError and change nothing if they do not fit."""
        if binding.workload in self.bindings:
            raise StateError(f"workload {binding.workload} is already bound to {self.bindings[binding.workload].node}")
        i = self._node_index(binding.node)
        self._take(i, binding)
        done: list[NodeExtra] = []
        try:
            for extra in self.extras.values():
                extra.assume(i, binding)
                done.append(extra)
        except StateError:
            for extra in reversed(done):
                extra.forget(i, binding)
            self._give(i, binding)
            raise
        self.bindings[binding.workload] = binding
        self._on_node[i].add(binding.workload)
        self._refresh(i)

    def commit(self, workload: str) -> None:
        """Mark an assumed binding as durable (the driver wrote it)."""
        if workload not in self.bindings:
            raise StateError(f"no binding for workload {workload}")
        self._committed.add(workload)

    def is_committed(self, workload: str) -> bool:
        return workload in self._committed

    def forget(self, workload: str) -> Binding:
        """Drop a binding (assumed or committed) and give its amounts back; returns it."""
        binding = self.bindings.pop(workload, None)
        if binding is None:
            raise StateError(f"no binding for workload {workload}")
        self._committed.discard(workload)
        i = self.index[binding.node]
        self._on_node[i].discard(workload)
        self._give(i, binding)
        for extra in reversed(self.extras.values()):
            extra.forget(i, binding)
        self._refresh(i)
        self.capacity_version += 1
        return binding

    def _refresh(self, i: int) -> None:
        for observer in self._observers:
            observer.refresh(i)

    def _take(self, i: int, binding: Binding) -> None:
        short = []
        for name, amount in binding.requests.items():
            r = self.res_index.get(name)
            have = int(self._free[r, i]) if r is not None else 0
            if amount > have:
                short.append(f"{name} (asks {amount}, {have} free)")
        if short:
            raise StateError(f"binding {binding.workload} does not fit on {binding.node}: " + ", ".join(short))
        for name, amount in binding.requests.items():
            self._free[self.res_index[name], i] -= amount

    def _give(self, i: int, binding: Binding) -> None:
        for name, amount in binding.requests.items():
            self._free[self.res_index[name], i] += amount

    # Extras --------------------------------------------------------------------------------------------
    def attach(self, extra: E) -> E:
        """Attach (or return the already attached) extra of the same name, filled from nodes and bindings."""
        existing = self.extras.get(extra.name)
        if existing is not None:
            return existing  # type: ignore[return-value]
        extra.resize(self._capacity)
        for i, node in enumerate(self.nodes):
            extra.set_node(i, node)
        for binding in self.bindings.values():
            extra.assume(self.index[binding.node], binding)
        self.extras[extra.name] = extra
        if hasattr(extra, "refresh"):
            self._observers.append(extra)  # type: ignore[arg-type]
            for i in range(self.n):
                extra.refresh(i)  # type: ignore[attr-defined]
        self.nodes_version += 1
        return extra

    # Snapshots and checks ---------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot(
            n=self.n,
            resources=tuple(self.resources),
            allocatable=self._alloc[:, : self.n].copy(),
            free=self._free[:, : self.n].copy(),
            nodes=tuple(self.nodes),
            bindings=dict(self.bindings),
            committed=frozenset(self._committed),
            extras={name: extra.snapshot() for name, extra in self.extras.items()},
            labels=self.labels.snapshot(),
        )

    def restore(self, snap: Snapshot) -> None:
        """Put the state back exactly as it was at `snap` (extras attached later are dropped)."""
        self.resources = list(snap.resources)
        self.res_index = {r: i for i, r in enumerate(self.resources)}
        self._capacity = max(64, snap.n)
        rows = len(self.resources)
        self._alloc = np.zeros((rows, self._capacity), dtype=np.int64)
        self._free = np.zeros_like(self._alloc)
        self._alloc[:, : snap.n] = snap.allocatable
        self._free[:, : snap.n] = snap.free
        with np.errstate(divide="ignore"):
            self._inv_alloc = np.where(self._alloc > 0, 1.0 / np.maximum(self._alloc, 1), 0.0)
        self.n = snap.n
        self.nodes = list(snap.nodes)
        self.names = [node.name for node in self.nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.bindings = dict(snap.bindings)
        self._committed = set(snap.committed)
        self._on_node = [set() for _ in range(self.n)]
        for key, binding in self.bindings.items():
            self._on_node[self.index[binding.node]].add(key)
        self.labels.restore(snap.labels, self._capacity)
        self.extras = {name: extra for name, extra in self.extras.items() if name in snap.extras}
        self._observers = [o for o in self._observers if getattr(o, "name", None) in self.extras]
        for name, extra in self.extras.items():
            extra.resize(self._capacity)
            extra.restore(snap.extras[name])
        self.capacity_version += 1
        self.nodes_version += 1

    def copy(self) -> ClusterState:
        """An independent deep copy (for what-if planning and tests)."""
        return copy.deepcopy(self)

    def check_invariants(self) -> None:
        """Raise InvariantViolation listing every broken invariant (see state/invariants.py)."""
        from finesched.state.invariants import check

        violations = check(self)
        if violations:
            raise InvariantViolation(violations)

    def totals(self) -> dict[str, int]:
        """Cluster capacity per resource: scalar allocatable sums plus extras' device totals (cached)."""
        version, cached = self._totals
        if version != self.nodes_version:
            cached = {r: int(self._alloc[i, : self.n].sum()) for i, r in enumerate(self.resources)}
            for extra in self.extras.values():
                totals = getattr(extra, "totals", None)
                if totals is not None:
                    cached.update(totals())
            self._totals = (self.nodes_version, cached)
        return cached

    def used(self, name: str) -> Any:
        """[n] amount of resource `name` held by bindings on each node."""
        r = self.res_index.get(name)
        if r is None:
            return np.zeros(self.n, dtype=np.int64)
        return self._alloc[r, : self.n] - self._free[r, : self.n]
