"""NUMA topology hints and how a policy merges them: the kubelet Topology Manager's rules (seed S3.7).

Koordinator's frameworkext/topologymanager (the kubelet's Topology Manager moved into the scheduler):
hint providers propose, per resource, the sets of NUMA nodes that could hold a request
(`generate_hints`, or `hints_by` when "holds" is not a sum); a policy merges them (`merge_hints`,
the kubelet's mergeFilteredHints). plugins/numa.py's NUMAAlign runs them in the cycle.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from finesched.hashed import HashedOnce
from finesched.plugins.numa_devices import Holds
from finesched.state.cpu_config import NUMA_POLICIES


@dataclass(frozen=True, slots=True)
class TopologyHint(HashedOnce):
    """A set of NUMA ids that could hold a request (None: any node, no preference) and whether it is preferred."""

    affinity: frozenset[int] | None
    preferred: bool
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    __hash__ = HashedOnce.__hash__  # merge memo keys hash hints: once each (finesched/hashed.py)


_HINTS: dict[tuple[frozenset[int] | None, bool], TopologyHint] = {}


def _hint(affinity: frozenset[int] | None, preferred: bool) -> TopologyHint:
    """The shared TopologyHint of these values (hints are values; sharing saves building them)."""
    hint = _HINTS.get((affinity, preferred))
    if hint is None:
        if len(_HINTS) >= 4096:
            _HINTS.clear()
        hint = _HINTS[affinity, preferred] = TopologyHint(affinity, preferred)
    return hint


#: resource -> its hints; None = no preference (don't care), [] = no NUMA set can hold it.
Hints = Mapping[str, Sequence[TopologyHint] | None]


# Hints and merging -----------------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _masks(numa_ids: tuple[int, ...]) -> tuple[frozenset[int], ...]:
    """Every non-empty set of NUMA ids, smallest first (the kubelet's IterateBitMasks order)."""
    ids = sorted(numa_ids)
    return tuple(frozenset(combo) for k in range(1, len(ids) + 1) for combo in itertools.combinations(ids, k))


def generate_hints(
    numa_ids: Sequence[int],
    request: int,
    available: Mapping[int, int],
    capacity: Mapping[int, int],
    single_only: bool = False,
) -> list[TopologyHint]:
    """Koordinator's generateResourceHints / the kubelet's generateCPUTopologyHints for one resource.

    A set is a hint when its available amount covers `request`; it is preferred when its size
    equals the smallest size whose capacity covers the request. E.g. 2 nodes with 8 CPUs each,
    available {0: 2, 1: 6}, request 4 -> hints {1} (preferred), {0, 1} (not preferred).

    `single_only` (for SingleNUMANode, which keeps nothing else) yields the single-node hints
    only: a single node is preferred iff some single node's capacity covers the request, which
    is what comparing with the smallest size over all sets gives.
    """
    min_size = len(numa_ids)
    hints = []
    masks = _masks(tuple(numa_ids))
    if single_only:
        # The single-node masks come first, one per id ascending; a sum over one node is that
        # node's amount, and every single hint shares one preferred flag (see above).
        preferred = any(capacity.get(n, 0) >= request for n in numa_ids)
        return [
            _hint(mask, preferred)
            for mask, n in zip(masks, sorted(numa_ids), strict=False)
            if available.get(n, 0) >= request
        ]
    for mask in masks:
        if sum(capacity.get(n, 0) for n in mask) >= request and len(mask) < min_size:
            min_size = len(mask)
        if sum(available.get(n, 0) for n in mask) >= request:
            hints.append(mask)
    return [_hint(mask, len(mask) == min_size) for mask in hints]


def single_hints(
    numa_ids: tuple[int, ...], request: int, available: Sequence[int], capacity: Sequence[int]
) -> list[TopologyHint]:
    """`generate_hints(..., single_only=True)` for per-slot sequences aligned with `numa_ids` (ascending)."""
    preferred = any(c >= request for c in capacity)
    return [_hint(mask, preferred) for mask, a in zip(_masks(numa_ids), available, strict=False) if a >= request]


def hints_by(numa_ids: Sequence[int], holds: Holds, could_hold: Holds, single_only: bool = False) -> list[TopologyHint]:
    """`generate_hints` for a request whose fit on a set of NUMA nodes is a predicate, not a sum
    (a hinted device type, plugins/numa_devices.py): `holds` now, `could_hold` on an idle node."""
    ids = tuple(sorted(numa_ids))
    masks = _masks(ids)
    singles = masks[: len(ids)]
    if single_only:
        preferred = any(could_hold(m) for m in singles)
        return [_hint(m, preferred) for m in singles if holds(m)]
    min_size = next((len(m) for m in masks if could_hold(m)), len(ids))  # masks go smallest first
    return [_hint(m, len(m) == min_size) for m in masks if holds(m)]


def _narrower(a: frozenset[int], b: frozenset[int]) -> bool:
    """The kubelet's IsNarrowerThan: fewer nodes, or as many with a lower bitmask value."""
    if len(a) != len(b):
        return len(a) < len(b)
    return sum(1 << n for n in a) < sum(1 << n for n in b)


def merge_hints(policy: str, numa_ids: Sequence[int], providers: Iterable[Hints]) -> tuple[TopologyHint, bool]:
    """Merge every provider's hints under `policy`; return (best hint, admit)."""
    if policy not in NUMA_POLICIES:
        raise ValueError(f"unknown NUMA topology policy {policy!r}; valid: {', '.join(NUMA_POLICIES)}")
    per_resource: list[tuple[TopologyHint, ...]] = []
    for hints in providers:
        for resource_hints in hints.values():
            if resource_hints is None:
                per_resource.append((_hint(None, True),))
            elif not resource_hints:
                per_resource.append((_hint(None, False),))
            else:
                per_resource.append(tuple(resource_hints))
    return _merge(policy, tuple(numa_ids), tuple(per_resource))


@lru_cache(maxsize=4096)
def _merge(
    policy: str, numa_ids: tuple[int, ...], resources: tuple[tuple[TopologyHint, ...], ...]
) -> tuple[TopologyHint, bool]:
    """`merge_hints` on hashable inputs (memoized: a node's hints take few distinct forms)."""
    everything = frozenset(numa_ids)
    per_resource: Sequence[Sequence[TopologyHint]] = resources
    if policy == "SingleNUMANode":
        per_resource = [
            [h for h in hints if h.preferred and (h.affinity is None or len(h.affinity) == 1)] for hints in per_resource
        ]
    best = TopologyHint(everything, False)
    for permutation in itertools.product(*per_resource):
        merged = _merge_permutation(everything, permutation)
        if not merged.affinity:
            continue
        better = merged.preferred and not best.preferred
        if better or (merged.preferred == best.preferred and _narrower(merged.affinity, best.affinity or everything)):
            best = merged
    if policy == "SingleNUMANode" and best.affinity == everything:
        best = TopologyHint(None, best.preferred)
    return best, policy in ("None", "BestEffort") or best.preferred


def _merge_permutation(everything: frozenset[int], permutation: Sequence[TopologyHint]) -> TopologyHint:
    preferred = True
    affinity = everything
    first: frozenset[int] | None = None
    for hint in permutation:
        if hint.affinity is not None:
            first = hint.affinity if first is None else first
            if hint.affinity != first:
                preferred = False
            affinity = affinity & hint.affinity
        if not hint.preferred:
            preferred = False
    return TopologyHint(affinity, preferred)
