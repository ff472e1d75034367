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
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from finesched.errors import InvariantViolation
from finesched.model.binding import Binding
from finesched.model.device_allocated import DEVICE_ALLOCATED
from finesched.model.node import Node
from finesched.model.resources import CPU, MEMORY, PODS, ResourceVector
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


#: The attribute an extra sets to True when its `assume` and `forget` do nothing for a plain
#: scalar binding (`plain_scalar`): no device grants, no device-allocated annotation (grants
#: carried there instead, model/device_allocated.py), no cpuset,
#: no NUMA grants. ClusterState then does not call it for such bindings (most bindings of a
#: scalar workload); an extra without it is always called.
QUIET_FOR_PLAIN_SCALAR = "quiet_for_plain_scalar"


def plain_scalar(binding: Binding) -> bool:
    """Whether `binding` holds scalar amounts only (see QUIET_FOR_PLAIN_SCALAR)."""
    annotations = binding.annotations
    return not (binding.devices or binding.cpuset or binding.numa or (annotations and DEVICE_ALLOCATED in annotations))


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
        # Amounts held, as float64 (allocatable - free): share math mixes it with 1/allocatable,
        # and int->float conversion on every cycle would cost more than the arithmetic itself.
        # (The int form, `used`, is computed on demand: only checks read it.)
        self._used_f = np.zeros((len(self.resources), self._capacity), dtype=np.float64)
        self._inv_alloc = np.zeros((len(self.resources), self._capacity), dtype=np.float64)
        self.n = 0
        #: Node indices in the order their amounts changed (assume, forget, update); the score
        #: memo re-evaluates only nodes logged since it last looked. Positions are absolute:
        #: `change_base` counts entries trimmed from the front.
        #: (A numpy buffer, `_log[:_log_len]`: reading a stretch of it touches one contiguous
        #: block, where a list would reach every entry's int object, cold in memory.)
        self._log = np.empty(4096, dtype=np.intp)
        self._log_len = 0
        self.change_base = 0
        #: Per node slot, the absolute log position of its latest change (-1: none yet).
        self._stamp = np.full(self._capacity, -1, dtype=np.int64)
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.nodes: list[Node] = []
        self.labels = LabelIndex(self._capacity)
        self.bindings: dict[str, Binding] = {}
        self._committed: set[str] = set()
        self._on_node: list[set[str]] = []
        self.extras: dict[str, NodeExtra] = {}
        #: The extras a plain scalar binding concerns (`plain_scalar`), in attach order.
        self._busy_extras: list[NodeExtra] = []
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
    def used(self) -> Int64Array:
        """[R, n] amounts held by bindings (allocatable − free; computed, a new array)."""
        return self._alloc[:, : self.n] - self._free[:, : self.n]

    @property
    def used_float(self) -> npt.NDArray[np.float64]:
        """[R, n] `used` as float64, kept in step (for share arithmetic; do not write)."""
        return self._used_f[:, : self.n]

    @property
    def inv_allocatable(self) -> npt.NDArray[np.float64]:
        """[R, n] 1/allocatable, 0 where allocatable is 0, so share math never divides by zero."""
        return self._inv_alloc[:, : self.n]

    def row(self, resource: str) -> int | None:
        return self.res_index.get(resource)

    # Column gathers for a few nodes: [R, len(index)] copies, taken from the whole (contiguous)
    # buffers. `take` on the [R, n] views above would first copy the entire array whenever the
    # capacity exceeds n, and mixed fancy indexing (``free[:, index]``) takes numpy's slow path.
    def free_at(self, index: npt.NDArray[np.intp]) -> Int64Array:
        """[R, k] free amounts of the nodes `index`."""
        return self._free.take(index, axis=1)

    def used_float_at(self, index: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """[R, k] `used_float` of the nodes `index`."""
        return self._used_f.take(index, axis=1)

    def inv_allocatable_at(self, index: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """[R, k] `inv_allocatable` of the nodes `index`."""
        return self._inv_alloc.take(index, axis=1)

    def column_buffers(
        self,
    ) -> tuple[Int64Array, npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """The whole C-contiguous [R, capacity] buffers behind `free`, `used_float` and
        `inv_allocatable` (columns past `n` are unused; do not write), for a compiled kernel that
        reads a few node columns in place (plugins/fused_kernel.py) instead of gathering them."""
        return self._free, self._used_f, self._inv_alloc

    # Nodes ------------------------------------------------------------------------------------------
    def add_node(self, node: Node) -> int:
        """Add `node` (its name must be new); return its index."""
        if node.name in self.index:
            raise StateError(f"node {node.name!r} already exists")
        rows = len(self.resources)
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
        try:
            for extra in self.extras.values():
                extra.set_node(i, node)
        except StateError:
            self._drop_last_slot()  # an extra refused the node: the state is as before the call
            self._drop_rows_from(rows)
            raise
        self._refresh(i)
        self.capacity_version += 1
        self.nodes_version += 1
        return i

    def _drop_last_slot(self) -> None:
        """Undo the slot `add_node` appended (the last one), in arrays, labels, extras and indexes."""
        last = self.n - 1
        for array in (self._alloc, self._free, self._used_f, self._inv_alloc):
            array[:, last] = 0
        self.labels.clear(last)
        for extra in self.extras.values():
            extra.clear(last)
        del self.index[self.names.pop()]
        self.nodes.pop()
        self._on_node.pop()
        self.n -= 1

    def update_node(self, node: Node) -> None:
        """Replace a node's manifest; its bindings stay, and must still fit (else nothing changes).

        On failure the old manifest is applied again the same way (its bindings fit it), which
        touches this node alone: no whole-state snapshot, so an update costs the same at any size.
        """
        i = self._node_index(node.name)
        old, rows = self.nodes[i], len(self.resources)
        try:
            self._apply_node(i, node)
        except StateError as exc:
            self._apply_node(i, old)
            self._drop_rows_from(rows)
            raise StateError(f"cannot update node {node.name!r}: its bindings no longer fit ({exc})") from None
        self._refresh(i)
        self.capacity_version += 1
        self.nodes_version += 1

    def update_node_releasing(self, node: Node) -> list[tuple[Binding, str]]:
        """Replace a node's manifest even when some of its bindings no longer fit it (a device gone
        from the machine, less memory); those bindings are forgotten and returned with the reason,
        for the driver to requeue. The node's own report is the truth about the machine: keeping
        the old manifest would leave the state promising devices that are not there.

        The others are kept in the order of their keys, each as long as it still fits beside the
        ones before it (a device-gone binding never fits, whatever the order)."""
        try:
            self.update_node(node)
            return []
        except StateError:
            pass
        held = self.bindings_on(node.name)
        committed = {b.workload for b in held if self.is_committed(b.workload)}
        for binding in held:
            self.forget(binding.workload)
        try:
            self.update_node(node)
        except StateError:  # the manifest itself cannot be applied: put everything back as it was
            for binding in held:
                self._restore(binding, binding.workload in committed)
            raise
        dropped: list[tuple[Binding, str]] = []
        for binding in held:
            try:
                self._restore(binding, binding.workload in committed)
            except StateError as exc:
                dropped.append((binding, str(exc)))
        return dropped

    def _restore(self, binding: Binding, committed: bool) -> None:
        self.assume(binding)
        if committed:
            self.commit(binding.workload)

    def _apply_node(self, i: int, node: Node) -> None:
        """Write `node` into slot i (scalars and every extra) and replay the bindings it holds."""
        self._ensure_rows(node.allocatable)
        self.nodes[i] = node
        self._write_node(i, node)
        for extra in self.extras.values():
            extra.set_node(i, node)
        for key in sorted(self._on_node[i]):
            binding = self.bindings[key]
            self._take(i, binding)
            for extra in self.extras.values():
                extra.assume(i, binding)

    def remove_node(self, name: str, *, force: bool = False) -> list[Binding]:
        """Remove a node. Refused while bindings exist on it unless `force`, which forgets them (returned)."""
        i = self._node_index(name)
        on_node = [self.bindings[k] for k in sorted(self._on_node[i])]
        if on_node and not force:
            raise StateError(f"node {name!r} holds {len(on_node)} binding(s); remove them first or force")
        for binding in on_node:
            self.forget(binding.workload)
        last = self.n - 1
        moved = i != last
        if moved:
            for array in (self._alloc, self._free, self._used_f, self._inv_alloc):
                array[:, i] = array[:, last]
            self.names[i], self.nodes[i], self._on_node[i] = self.names[last], self.nodes[last], self._on_node[last]
            self.index[self.names[i]] = i
            self.labels.move(last, i)
            for extra in self.extras.values():
                extra.move(last, i)
        for array in (self._alloc, self._free, self._used_f, self._inv_alloc):
            array[:, last] = 0
        self.labels.clear(last)
        for extra in self.extras.values():
            extra.clear(last)
        del self.index[name]
        self.names.pop()
        self.nodes.pop()
        self._on_node.pop()
        self.n -= 1
        self.nodes_version += 1
        if moved:
            self._refresh(i)  # after n shrank, so observers see the settled node set
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
        self._used_f[:, i] = 0
        column = self._alloc[:, i]
        with np.errstate(divide="ignore"):
            self._inv_alloc[:, i] = np.where(column > 0, 1.0 / np.maximum(column, 1), 0.0)
        self.labels.set(i, node.labels)

    def _drop_rows_from(self, rows: int) -> None:
        """Forget resource rows `rows`.. (added by a node update or add that was then refused)."""
        for name in self.resources[rows:]:
            del self.res_index[name]
        del self.resources[rows:]
        self._alloc, self._free = self._alloc[:rows].copy(), self._free[:rows].copy()
        self._used_f, self._inv_alloc = self._used_f[:rows].copy(), self._inv_alloc[:rows].copy()

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
        self._used_f = np.vstack([self._used_f, pad.astype(np.float64)])
        self._inv_alloc = np.vstack([self._inv_alloc, pad.astype(np.float64)])

    def _grow(self, capacity: int) -> None:
        def grown(a: np.ndarray) -> np.ndarray:
            out = np.zeros((a.shape[0], capacity), dtype=a.dtype)
            out[:, : self.n] = a[:, : self.n]
            return out

        self._alloc, self._free = grown(self._alloc), grown(self._free)
        self._used_f, self._inv_alloc = grown(self._used_f), grown(self._inv_alloc)
        stamp = np.full(capacity, -1, dtype=np.int64)
        stamp[: self.n] = self._stamp[: self.n]
        self._stamp = stamp
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
            for extra in self._busy_extras if plain_scalar(binding) else self.extras.values():
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
        for extra in reversed(self._busy_extras if plain_scalar(binding) else self.extras.values()):
            extra.forget(i, binding)
        self._refresh(i)
        self.capacity_version += 1
        return binding

    def mark_changed(self, index: int) -> None:
        """Record that node `index`'s amounts changed outside assume/forget (e.g. an agent report).

        Memos re-evaluate the node, observers re-index it, and the queue retries waiting work.
        """
        self._refresh(index)
        self.capacity_version += 1

    def _refresh(self, i: int) -> None:
        length = self._log_len
        self._stamp[i] = self.change_base + length
        if length == len(self._log):
            limit = max(65536, 4 * self.n)
            if length >= limit:  # trim the older half (memos that far behind re-evaluate fully)
                drop = length // 2
                self._log[: length - drop] = self._log[drop:length]
                self.change_base += drop
                length -= drop
            else:
                self._log = np.concatenate([self._log, np.empty(min(length, limit - length), dtype=np.intp)])
        self._log[length] = i
        self._log_len = length + 1
        for observer in self._observers:
            observer.refresh(i)

    @property
    def version(self) -> tuple[int, int, int, int, int]:
        """Changes whenever anything a snapshot holds changes (amounts, nodes, bindings, commits), so
        a snapshot taken at one version still equals the state while it reads the same."""
        return (self.change_position, self.capacity_version, self.nodes_version, len(self.bindings),
                len(self._committed))  # fmt: skip

    @property
    def change_position(self) -> int:
        """The absolute position of the next change-log entry."""
        return self.change_base + self._log_len

    @property
    def change_log(self) -> list[int]:
        """Node indices in the order their amounts changed, from position `change_base` on (a copy)."""
        return self._log[: self._log_len].tolist()

    def changed_since(self, position: int) -> npt.NDArray[np.intp] | None:
        """Node indices changed since `position` (with repeats; a read-only view of the log), or
        None if that part of the log was trimmed."""
        if position < self.change_base:
            return None
        view = self._log[position - self.change_base : self._log_len]
        view.flags.writeable = False
        return view

    def distinct_changed(self, position: int, changed: Sequence[int]) -> npt.NDArray[np.intp]:
        """The distinct nodes of `changed` (what `changed_since(position)` returned), ascending.

        Each node is kept at its latest log entry (where its stamp points): a few numpy calls
        whatever the length, where a Python set and sort grow with it.
        """
        if len(changed) <= 32:  # a few entries: Python's set and sort beat five numpy calls
            few = sorted(set(changed.tolist() if isinstance(changed, np.ndarray) else changed))
            return np.array(few, dtype=np.intp)
        nodes = np.array(changed, dtype=np.intp)  # a copy: the log buffer is reused
        latest = self._stamp[nodes] == np.arange(position, position + len(nodes))
        nodes = nodes[latest]
        nodes.sort()
        return nodes

    def _rows_of(self, amounts: ResourceVector) -> tuple[list[tuple[int, int]], list[str]]:
        """(row, amount) pairs of a vector in this state, and names the state does not know.

        Cached on the vector (one request shape, many bindings). Unknown names can only fit
        when zero. Single-node updates loop in Python: numpy fancy indexing on one column costs
        more than the arithmetic.
        """
        cached = amounts.layout_cache
        if cached is not None and cached[0] is self.res_index and cached[1] == len(self.resources):
            return cached[2]  # type: ignore[return-value]
        pairs = [(self.res_index[n], a) for n, a in amounts.items() if n in self.res_index]
        unknown = [n for n, a in amounts.items() if n not in self.res_index and a > 0]
        amounts.layout_cache = (self.res_index, len(self.resources), (pairs, unknown))
        return pairs, unknown

    def _take(self, i: int, binding: Binding) -> None:
        pairs, unknown = self._rows_of(binding.requests)
        free, used = self._free, self._used_f
        short = bool(unknown)
        for r, a in pairs:
            if free[r, i] < a:
                short = True
        if short:
            missing = [f"{name} (asks {binding.requests[name]}, 0 free)" for name in unknown]
            missing += [f"{self.resources[r]} (asks {a}, {free[r, i]} free)" for r, a in pairs if free[r, i] < a]
            raise StateError(f"binding {binding.workload} does not fit on {binding.node}: " + ", ".join(missing))
        for r, a in pairs:
            free[r, i] -= a
            used[r, i] += a

    def _give(self, i: int, binding: Binding) -> None:
        pairs, _ = self._rows_of(binding.requests)
        free, used = self._free, self._used_f
        for r, a in pairs:
            free[r, i] += a
            used[r, i] -= a

    # Extras --------------------------------------------------------------------------------------------
    def attach(self, extra: E) -> E:
        """Attach (or return the already attached) extra of the same name, filled from nodes and bindings."""
        existing = self.extras.get(extra.name)
        if existing is not None:
            return existing  # type: ignore[return-value]
        extra.resize(self._capacity)
        self._refill(extra)
        self.extras[extra.name] = extra
        if not getattr(extra, QUIET_FOR_PLAIN_SCALAR, False):
            self._busy_extras.append(extra)
        if hasattr(extra, "refresh"):
            self._observers.append(extra)  # type: ignore[arg-type]
            for i in range(self.n):
                extra.refresh(i)  # type: ignore[attr-defined]
        self.nodes_version += 1
        return extra

    def _refill(self, extra: NodeExtra) -> None:
        """Fill an extra from every node and binding. Extras with a `rebuilding` flag see it set:
        a rebuild replays grants that already exist (e.g. on a device that has since turned
        unhealthy), which a new reservation would be refused."""
        flag = hasattr(extra, "rebuilding")
        if flag:
            extra.rebuilding = True  # type: ignore[attr-defined]
        try:
            for i, node in enumerate(self.nodes):
                extra.set_node(i, node)
            for binding in self.bindings.values():
                extra.assume(self.index[binding.node], binding)
        finally:
            if flag:
                extra.rebuilding = False  # type: ignore[attr-defined]

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
        """Put the state back exactly as it was at `snap`.

        Extras attached after the snapshot stay attached and are refilled from the restored
        nodes and bindings, so plugins holding them keep working.
        """
        self.resources = list(snap.resources)
        self.res_index = {r: i for i, r in enumerate(self.resources)}
        self._capacity = max(64, snap.n)
        rows = len(self.resources)
        self._alloc = np.zeros((rows, self._capacity), dtype=np.int64)
        self._free = np.zeros_like(self._alloc)
        self._alloc[:, : snap.n] = snap.allocatable
        self._free[:, : snap.n] = snap.free
        self._used_f = (self._alloc - self._free).astype(np.float64)
        with np.errstate(divide="ignore"):
            self._inv_alloc = np.where(self._alloc > 0, 1.0 / np.maximum(self._alloc, 1), 0.0)
        self._stamp = np.full(self._capacity, -1, dtype=np.int64)  # memo entries die with nodes_version
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
        for name, extra in self.extras.items():
            extra.resize(self._capacity)
            if name in snap.extras:
                extra.restore(snap.extras[name])
            else:  # attached after the snapshot: refill it from the restored nodes and bindings
                self._refill(extra)
        for i in range(self.n):
            for observer in self._observers:
                observer.refresh(i)
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

    def used_of(self, name: str) -> Int64Array:
        """[n] amount of resource `name` held by bindings on each node."""
        r = self.res_index.get(name)
        return np.zeros(self.n, dtype=np.int64) if r is None else self._alloc[r, : self.n] - self._free[r, : self.n]
