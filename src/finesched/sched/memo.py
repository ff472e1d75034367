"""Filter and score results memoized per request shape, refreshed only where nodes changed.

Between two decisions only the nodes that took or gave back resources change, and clusters
see the same request shapes over and over (replicas of a deployment, tasks of a job). When
every filter and score plugin of the profile is *node-local* (its verdict on a node depends
only on the workload and that node: `Plugin.NODE_LOCAL`), the result for a node stays valid
until that node changes. So for each shape we keep the feasibility mask and the selection
key of every node, and on the next request of that shape we re-run the plugins on the nodes
changed since (a subset `NodeBatch`) and patch the arrays.

Every node is still filtered and scored for every decision: an unchanged node's result is
reused, not skipped. The ClusterState change log tells which nodes changed; a trimmed log,
a changed node set (add/remove/update, tracked by `nodes_version`) or a large dirty set
falls back to full evaluation. A shape is stored from its second sighting on (`ScoreMemo.wants`):
a one-off shape would pay for an entry it never uses.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from finesched.model.workload import Workload
from finesched.state.cluster import ClusterState

#: Above this fraction of dirty nodes a full evaluation is as cheap as patching.
FULL_REFRESH_FRACTION = 0.25
MAX_SHAPES = 512
#: An entry holds 9 bytes per node (mask + key): 512 shapes at 100,000 nodes would be 460 MB, so
#: the memo is also bounded in bytes and keeps fewer shapes on larger clusters.
MAX_BYTES = 128 * 2**20
#: Up to this many nodes the fused path patches with the raw change log (`lookup(distinct=False)`),
#: whose recount of the whole mask costs less than the dedup; above, the dedup is cheaper.
RECOUNT_NODES = 32768
#: Shapes seen once and not (yet) stored, remembered up to this many (then forgotten at once).
_SEEN_LIMIT = 65536


@dataclass
class MemoEntry:
    """Per-node results for one request shape, valid at change-log `position`."""

    position: int
    nodes_version: int
    feasible: npt.NDArray[np.bool_]
    key: npt.NDArray[np.int64]  # selection key: higher wins; -1 where infeasible
    feasible_count: int = -1  # kept in step by `patch`, so no O(n) scan is needed per decision

    def __post_init__(self) -> None:
        if self.feasible_count < 0:
            self.feasible_count = int(np.count_nonzero(self.feasible))

    def patched(self, delta: int, position: int) -> None:
        """The entry's mask and key were patched in place (the compiled fused patch) with `delta`
        more feasible nodes; the results are now valid at change-log `position`."""
        self.feasible_count += delta
        self.position = position

    def patch(
        self,
        dirty: npt.NDArray[np.intp],
        feasible: npt.NDArray[np.bool_],
        key: npt.NDArray[np.int64],
        position: int,
        *,
        repeats: bool = False,
    ) -> None:
        """Overwrite the results of the `dirty` nodes, now valid at change-log `position`.

        `repeats=True`: `dirty` may name a node more than once (with the same result each time);
        the feasible count is then taken afresh over the whole mask (one pass of count_nonzero),
        as a delta over a multiset would count a repeated node's change once per repeat."""
        if repeats:
            self.feasible[dirty] = feasible
            self.key[dirty] = key
            self.feasible_count = int(np.count_nonzero(self.feasible))
            self.position = position
            return
        self.feasible_count += int(np.count_nonzero(feasible)) - int(np.count_nonzero(self.feasible[dirty]))
        self.feasible[dirty] = feasible
        self.key[dirty] = key
        self.position = position


class RequestShape:
    """A request shape (`request_shape`): the flattened fields, hashed once.

    Shapes are dict keys several times per decision (request compiler, CPU request cache, score
    memo); hashing the field tuple each time would hash and compare every field again. Shapes
    are interned, so the later lookups of one decision find the very same object (a dict
    compares identity before calling `__eq__`).
    """

    __slots__ = ("_hash", "fields")

    def __init__(self, fields: tuple[Hashable, ...]):
        self.fields = fields
        self._hash = hash(fields)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, RequestShape):
            return NotImplemented
        return self._hash == other._hash and self.fields == other.fields

    def __repr__(self) -> str:
        return f"RequestShape{self.fields!r}"

    def __reduce__(self) -> tuple[object, ...]:
        return (RequestShape, (self.fields,))  # rehashed where it is unpickled (str hashes are per process)


_INTERNED: dict[tuple[Hashable, ...], RequestShape] = {}
_INTERN_LIMIT = 8192


def request_shape(workload: Workload) -> RequestShape:
    """Everything about a workload that node-local plugins may read (identity and tenancy left out).

    Flattened to strings, ints and frozensets so that a lookup never runs pydantic equality.
    """
    fields = _shape_fields(workload)
    shape = _INTERNED.get(fields)
    if shape is None:
        if len(_INTERNED) >= _INTERN_LIMIT:
            _INTERNED.clear()  # equal shapes still compare equal, only the identity shortcut is lost
        shape = _INTERNED[fields] = RequestShape(fields)
    return shape


def _shape_fields(w: Workload) -> tuple[Hashable, ...]:
    spec = w.resource_spec
    joint = w.device_joint_allocate
    # Amounts as frozensets of items: each workload brings its own vectors, whose first hash
    # builds this frozenset anyway, and frozenset equality runs in C (the vector's is Python).
    return (
        frozenset(w.requests.items()),
        frozenset(w.limits.items()),
        w.qos,
        frozenset(w.node_selector.items()) if w.node_selector else None,
        tuple((t.key, t.operator, t.values) for t in w.node_affinity),
        spec.required_cpu_bind_policy,
        spec.preferred_cpu_bind_policy,
        spec.preferred_cpu_exclusive_policy,
        w.numa_topology_policy,
        w.device_allocate_strategy,
        (joint.device_types, joint.required_scope) if joint is not None else None,
        w.device_allocate_hint or None,
        w.gpu_partition_spec,
        frozenset(w.labels.items()) if w.labels else None,
        frozenset(w.annotations.items()) if w.annotations else None,
    )


class ScoreMemo:
    """LRU map from request shape to `MemoEntry` (see the module docstring)."""

    def __init__(self, max_shapes: int = MAX_SHAPES, max_bytes: int = MAX_BYTES):
        self._entries: OrderedDict[Hashable, MemoEntry] = OrderedDict()
        self._seen: dict[Hashable, None] = {}
        self._max = max_shapes
        self._max_bytes = max_bytes

    def lookup(
        self, shape: Hashable, state: ClusterState, *, distinct: bool = True
    ) -> tuple[MemoEntry | None, npt.NDArray[np.intp] | None]:
        """The entry for `shape` and the nodes to re-evaluate (empty: none), or (None, None) if stale.

        With `distinct=False` the nodes are the change log's entries as they are (repeats, log
        order; a read-only view valid until the state next changes): `MemoEntry.patch(...,
        repeats=True)` gives the same entry (a repeated node gets the same result twice), and on
        ~100 changes the dedup (six numpy calls) costs more than evaluating the few repeats and
        recounting the mask. The fused path takes them so on clusters up to `RECOUNT_NODES`.
        """
        entry = self._entries.get(shape)
        if entry is None or entry.nodes_version != state.nodes_version:
            return None, None
        changed = state.changed_since(entry.position)
        if changed is None or len(changed) > FULL_REFRESH_FRACTION * state.n:
            return None, None
        self._entries.move_to_end(shape)
        return entry, state.distinct_changed(entry.position, changed) if distinct else changed

    def wants(self, shape: Hashable) -> bool:
        """Whether an evaluation of `shape` is worth keeping: the shape was seen before.

        A shape's first evaluation is not stored: keeping an entry pins two fresh [n] arrays and
        evicts an older shape, which only pays off when the shape comes back. A stream of one-off
        shapes (every request different) so pays for none of it; a repeated shape pays one more
        full evaluation, at its second sighting. The shapes seen once are kept in a bounded dict."""
        if shape in self._entries:
            return True
        seen = self._seen
        if shape in seen:
            del seen[shape]
            return True
        if len(seen) >= _SEEN_LIMIT:
            seen.clear()
        seen[shape] = None
        return False

    def store(self, shape: Hashable, entry: MemoEntry) -> None:
        """Keep `entry` as the most recent; evict the least recent beyond the shape or byte bound."""
        self._entries[shape] = entry
        self._entries.move_to_end(shape)
        per_entry = entry.feasible.nbytes + entry.key.nbytes
        limit = max(1, min(self._max, self._max_bytes // max(1, per_entry)))
        while len(self._entries) > limit:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._seen.clear()
