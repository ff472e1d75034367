"""BucketIndex: nodes filed into gradient buckets by what they have left, one set per resource (S4).

Seed S4 keeps, per resource, a *resource set* of *subsets* ("rings") covering consecutive
ranges of remaining amount (l..l+n, l+n..l+2n, ...), and files every node into the subset that
holds its remaining amount (S4.1). A demand X then looks first in the subset K that holds X
(S4.2), so the best fit is found without scanning every node. `plugins/bucket_fit.py` does the
searching; this module only keeps the buckets right.

Bucket edges (`BucketSpec`) are a tuple of ascending lower bounds ``e0 < e1 < ... < em``:

* bucket k covers ``[e_k, e_{k+1})``; the last bucket ``[e_m, ∞)`` is open-ended, so an amount
  above every edge still has a bucket;
* an amount below ``e0`` goes to bucket 0 (so every amount >= 0 has exactly one bucket).

The equal-width form ``(lower, width, count)`` is the same thing with ``e_k = lower + k·width``
for ``k < count``, i.e. bucket k covers ``[lower + k·width, lower + (k+1)·width)`` and the last
one is open-ended. Example: lower 0, width 2000 (2 cpu), count 4 -> edges (0, 2000, 4000, 6000);
a node with 4500m left is in bucket 2, one with 9000m in bucket 3, one with 0 in bucket 0.

Which resources are indexed: every state row. Rows the index has not seen yet (present when it
is attached, or added later when a node brings a new resource) are added lazily, at the next
`refresh` or query, with the caller's spec for that name if one was given, else the *default
spec*: 16 equal-width buckets over [0, max allocatable of the resource across nodes]
(``width = max(1, ceil(max / 16))``). A default spec follows the cluster: when a node arrives
with more allocatable than the spec was cut for, that resource's buckets are re-cut from the
new maximum and re-filed (O(N log N), only when the maximum grows).

Each bucket is a `SortedList` of ``(remaining, node index)``, so ties go to the lowest index and
a range scan is O(log N + k). A per-resource array remembers the amount each node was filed
under, so a node is removed from its bucket in O(log N) without searching.

Keeping it current: the index is a `NodeObserver`. `ClusterState` calls `refresh(i)` after every
change to node i has settled (node added or updated, binding assumed or forgotten, slot moved),
and refresh re-reads ``state.free[:, i]`` and re-files node i in every resource: O(R log N).
So `assume`/`forget`/`set_node` do nothing here (S4.4: after an allocation *every* resource's
buckets are updated, not only the dominant one's, because refresh re-files them all).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedList

from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.state.cluster import ClusterState

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DEFAULT_COUNT = 16


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """Ascending lower bounds of one resource's buckets (see the module docstring for the ranges)."""

    edges: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.edges:
            raise ValueError("a bucket spec needs at least one edge")
        if any(type(e) is not int for e in self.edges):
            raise ValueError(f"bucket edges are ints, got {self.edges!r}")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError(f"bucket edges must be strictly ascending, got {self.edges!r}")

    @classmethod
    def equal(cls, lower: int, width: int, count: int) -> BucketSpec:
        """`count` buckets of `width` from `lower`: bucket k = [lower + k·width, lower + (k+1)·width)."""
        lower, width, count = int(lower), int(width), int(count)
        if width < 1 or count < 1:
            raise ValueError(f"width and count must be >= 1, got width={width}, count={count}")
        return cls(tuple(lower + k * width for k in range(count)))

    @classmethod
    def explicit(cls, edges: Sequence[int]) -> BucketSpec:
        """Buckets [e_k, e_{k+1}) and a last open-ended [e_m, ∞)."""
        return cls(tuple(int(e) for e in edges))

    @classmethod
    def default_for(cls, max_allocatable: int, count: int = DEFAULT_COUNT) -> BucketSpec:
        """`count` equal buckets over [0, max_allocatable]: 8000m cpu -> width 500m, edges 0, 500, ..., 7500."""
        width = max(1, -(-max_allocatable // count))
        return cls.equal(0, width, count)

    @property
    def count(self) -> int:
        return len(self.edges)

    def bucket_of(self, amount: int) -> int:
        """The bucket holding `amount`: the last edge <= amount, or bucket 0 below the first edge."""
        return max(0, bisect.bisect_right(self.edges, amount) - 1)

    def range_of(self, k: int) -> tuple[int, int | None]:
        """[low, high) of bucket k; high is None for the open-ended last bucket."""
        return self.edges[k], self.edges[k + 1] if k + 1 < len(self.edges) else None


class _Ring:
    """One resource's buckets (one S4 resource set), plus the amount each node is filed under."""

    __slots__ = ("auto_upper", "buckets", "filed", "resource", "spec")

    def __init__(self, resource: str, spec: BucketSpec, auto_upper: int | None, capacity: int):
        self.resource = resource
        self.spec = spec
        #: For a default spec, the max allocatable it was cut for (None: the caller's spec, fixed).
        self.auto_upper = auto_upper
        self.buckets: list[SortedList] = [SortedList() for _ in range(spec.count)]
        self.filed: Int64Array = np.zeros(capacity, dtype=np.int64)

    def add(self, i: int, value: int) -> None:
        self.buckets[self.spec.bucket_of(value)].add((value, i))
        self.filed[i] = value

    def drop(self, i: int) -> None:
        value = int(self.filed[i])
        self.buckets[self.spec.bucket_of(value)].remove((value, i))

    def recut(self, spec: BucketSpec, upper: int, present: BoolArray) -> None:
        """Re-file every present node under a new spec (default specs only, when the max grows)."""
        self.spec, self.auto_upper = spec, upper
        self.buckets = [SortedList() for _ in range(spec.count)]
        for i in np.flatnonzero(present).tolist():
            self.add(i, int(self.filed[i]))


@dataclass(frozen=True)
class _RingSnapshot:
    resource: str
    spec: BucketSpec
    auto_upper: int | None
    filed: Int64Array
    buckets: tuple[tuple[tuple[int, int], ...], ...]


@dataclass(frozen=True)
class IndexSnapshot:
    """Everything `BucketIndex.restore` needs (arrays are copies; never shared with the index)."""

    present: BoolArray
    rings: tuple[_RingSnapshot, ...]


class BucketIndex:
    """Per-resource gradient buckets over nodes' remaining amounts (S4.1); a NodeExtra + NodeObserver.

    Built with the state it reads and optional specs by resource name; attach it with
    ``state.attach(BucketIndex(state, specs))``. Construction is pure: nothing is read from the
    state until it is attached.
    """

    name: str = "buckets"

    def __init__(self, state: ClusterState, specs: Mapping[str, BucketSpec] | None = None):
        self._state = state
        #: The caller's specs by resource name; other resources get `BucketSpec.default_for`.
        self.specs: dict[str, BucketSpec] = dict(specs or {})
        self._capacity = 0
        self._present: BoolArray = np.zeros(0, dtype=bool)
        self._rings: list[_Ring] = []  # by state row

    # Queries ------------------------------------------------------------------------------------------
    def spec(self, resource: str) -> BucketSpec:
        return self._ring(resource).spec

    def bucket_count(self, resource: str) -> int:
        return self._ring(resource).spec.count

    def bucket_of(self, resource: str, amount: int) -> int:
        """The bucket of `resource` whose range holds `amount` (S4.2: demand X -> subset K)."""
        return self._ring(resource).spec.bucket_of(int(amount))

    def iter_bucket_ascending(self, resource: str, k: int, from_amount: int = 0) -> Iterator[int]:
        """Nodes in bucket k with remaining >= from_amount: smallest remaining first, ties by index."""
        bucket = self._ring(resource).buckets[k]
        for _value, i in bucket.irange(minimum=(int(from_amount), -1)):
            yield i

    def members(self, resource: str, k: int) -> list[tuple[int, int]]:
        """``(remaining, node index)`` of bucket k, ascending (for tests and diagnostics)."""
        return list(self._ring(resource).buckets[k])

    def _ring(self, resource: str) -> _Ring:
        self._sync_rows()
        r = self._state.res_index.get(resource)
        if r is None or r >= len(self._rings):
            raise KeyError(f"resource {resource!r} is not indexed (no node offers it)")
        return self._rings[r]

    # NodeObserver -------------------------------------------------------------------------------------
    def refresh(self, index: int) -> None:
        """Re-file node `index` in every resource from its settled free amounts: O(R log N)."""
        self._sync_rows()
        state = self._state
        free = state.free[:, index]
        alloc = state.allocatable[:, index]
        present = bool(self._present[index])
        for r, ring in enumerate(self._rings):
            if ring.auto_upper is not None and alloc[r] > ring.auto_upper:
                upper = int(state.allocatable[r].max())
                ring.recut(BucketSpec.default_for(upper), upper, self._present)
            value = int(free[r])
            if present:
                if ring.filed[index] == value:
                    continue
                ring.drop(index)
            ring.add(index, value)
        self._present[index] = True

    def _sync_rows(self) -> None:
        """Add a ring for each state row not indexed yet, filing every filed node from the state."""
        state = self._state
        while len(self._rings) < len(state.resources):
            r = len(self._rings)
            resource = state.resources[r]
            spec, upper = self.specs.get(resource), None
            if spec is None:
                upper = int(state.allocatable[r].max()) if state.n else 0
                spec = BucketSpec.default_for(upper)
            ring = _Ring(resource, spec, upper, self._capacity)
            for i in np.flatnonzero(self._present[: state.n]).tolist():
                ring.add(i, int(state.free[r, i]))
            self._rings.append(ring)

    # NodeExtra ------------------------------------------------------------------------------------------
    def resize(self, capacity: int) -> None:
        for i in np.flatnonzero(self._present[capacity:]).tolist():
            self.clear(capacity + i)
        present = np.zeros(capacity, dtype=bool)
        keep = min(capacity, self._present.size)
        present[:keep] = self._present[:keep]
        self._present = present
        for ring in self._rings:
            filed = np.zeros(capacity, dtype=np.int64)
            filed[:keep] = ring.filed[:keep]
            ring.filed = filed
        self._capacity = capacity

    def set_node(self, index: int, node: Node) -> None:
        """Nothing to do: the state calls `refresh(index)` once the node's amounts have settled."""

    def move(self, src: int, dst: int) -> None:
        """Slot `src` becomes slot `dst`: drop both; `refresh(dst)` files dst from the state."""
        self.clear(src)
        self.clear(dst)

    def clear(self, index: int) -> None:
        """Drop node `index` from every resource's buckets (no-op if it is not filed)."""
        if index >= self._present.size or not self._present[index]:
            return
        for ring in self._rings:
            ring.drop(index)
        self._present[index] = False

    def assume(self, index: int, binding: Binding) -> None:
        """Never refuses; `refresh(index)` re-files the node after the state took the amounts."""

    def forget(self, index: int, binding: Binding) -> None:
        """Inverse of `assume` (nothing); `refresh(index)` re-files the node."""

    def snapshot(self) -> IndexSnapshot:
        rings = tuple(
            _RingSnapshot(
                ring.resource, ring.spec, ring.auto_upper, ring.filed.copy(), tuple(tuple(b) for b in ring.buckets)
            )
            for ring in self._rings
        )
        return IndexSnapshot(self._present.copy(), rings)

    def restore(self, snapshot: object) -> None:
        assert isinstance(snapshot, IndexSnapshot), type(snapshot)
        capacity = self._capacity
        keep = min(capacity, snapshot.present.size)
        self._present = np.zeros(capacity, dtype=bool)
        self._present[:keep] = snapshot.present[:keep]
        self._rings = []
        for saved in snapshot.rings:
            ring = _Ring(saved.resource, saved.spec, saved.auto_upper, capacity)
            ring.filed[:keep] = saved.filed[:keep]
            ring.buckets = [SortedList(items) for items in saved.buckets]
            self._rings.append(ring)

    def violations(self) -> list[str]:
        """Every node filed exactly once per resource, in the bucket its current free amount belongs to."""
        state = self._state
        n, out = state.n, []
        if len(self._rings) < len(state.resources):
            self._sync_rows()  # rows appear lazily; a missing one is not a fault
        out += [f"node {state.names[i]} is not filed" for i in np.flatnonzero(~self._present[:n]).tolist()]
        out += [f"empty slot {n + i} is filed" for i in np.flatnonzero(self._present[n:]).tolist()]
        for r, ring in enumerate(self._rings[: len(state.resources)]):
            if ring.resource != state.resources[r]:
                out.append(f"row {r} indexes {ring.resource}, the state has {state.resources[r]}")
                continue
            seen = np.zeros(max(n, 1), dtype=np.int64)
            for k, bucket in enumerate(ring.buckets):
                for value, i in bucket:
                    where = f"{ring.resource} bucket {k}: ({value}, {i})"
                    if ring.spec.bucket_of(value) != k:
                        out.append(f"{where} belongs in bucket {ring.spec.bucket_of(value)}")
                    if not (i < n and self._present[i]):
                        out.append(f"{where} is not a filed node")
                        continue
                    seen[i] += 1
                    if value != state.free[r, i] or value != ring.filed[i]:
                        out.append(f"{where} but free is {state.free[r, i]}, filed {ring.filed[i]}")
            for i in np.flatnonzero((seen[:n] != 1) & self._present[:n]).tolist():
                out.append(f"{ring.resource}: node {state.names[i]} filed {seen[i]} times")
        return out
