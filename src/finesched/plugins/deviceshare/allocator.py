"""Exact device choice on one node (S0.5, S1.8): which minors, and how much of each.

Per requested type, the candidates are the healthy devices on which one instance fits (the shared
`fit_mask`), restricted to a required NUMA affinity. Then:

* **Card-level strategy** (S0.5, Koordinator's device scorer): over the scored dimensions (every
  dimension but gpu-core, with total > 0), ``req = total - free + request``;
  LeastAllocated scores ``(total - req) · 100 // total`` (least-used device: balance),
  MostAllocated ``req · 100 // total`` (most-used device that still fits: keeps whole devices
  free); a device's score is the integer mean. Order: score descending, then minor ascending.
  E.g. ratio 50 on two 80Gi cards, one half used: Least scores (100-50)·100//100 = 50 for the
  idle card (for both ratio and bytes: mean 50) and 0 for the other -> the idle card wins.
* **Interconnect** (S1.8): for several devices, sets are ranked by the minimum then the sum of
  pairwise link class (bandwidth, 1 for a link without one, 0 for none), then the minimum and sum
  of the topology class (2 same PCIe switch, 1 same NUMA node, 0 otherwise), then the summed
  strategy score, then minors (lexicographic). With no link or topology difference among the
  candidates this is exactly Koordinator's "first `count` by score, then minor".
* **NUMA affinity** (plugins/shared_keys.py): required -> only devices on those NUMA nodes;
  preferred -> sets with fewer devices outside them rank first.
* **Joint allocation** (deviceJointAllocate): the first type's sets are tried best-first; the other
  types must find their devices on the PCIe switches (SamePCIe) or NUMA nodes (SameNUMA) of the
  chosen first-type devices.
* **Hints** (deviceAllocateHint, hints.py): a hinted type's candidates are only the devices its
  selector and exclusive policy allow; ApplyForAll takes every matching device; a required
  PCIe / NUMA scope takes the best set within one switch / NUMA node (each group's best set, then
  the best of those); DeviceLevel grants each device whole.
* **A DeviceChooser** in the cycle (e.g. fragmentation-aware) is given the fitting minors and its
  answer is used when not None (for a joint first type, only if the other types then fit).

Grants carry both gpu-memory and gpu-memory-ratio, filled per card (`fill_gpu_amounts`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from finesched.model.binding import DeviceGrant
from finesched.model.device_allocated import format_device_allocated
from finesched.model.resources import GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, ResourceVector
from finesched.plugins.deviceshare.hints import (
    SCOPE_WORDS,
    Labels,
    hint_candidates,
    hint_problem,
    needed,
    scope_groups,
    scoped_sets,
)
from finesched.plugins.deviceshare.request import (
    DeviceRequest,
    FitRule,
    TypeRequest,
    compile_rule,
    device_label,
    explain_type,
    fit_mask,
)
from finesched.plugins.shared_keys import NUMAAffinity
from finesched.state.device_types import NodeDevices, fill_gpu_amounts
from finesched.state.devices import STRATEGIES

Int64Array = npt.NDArray[np.int64]
#: chooser(device type, fitting minors ascending, count) -> chosen minors, or None to decide here.
ChooseFn = Callable[[str, Sequence[int], int], Sequence[int] | None]


class PartitionPick(Protocol):
    """A node's GPU partition table as it applies to one request (partitions.py `PartitionRule`)."""

    honor: bool

    def pick(self, slots: Sequence[int], count: int) -> tuple[int, ...] | None: ...
    def refusal(self, count: int) -> str: ...


#: Above this many candidate sets, multi-device choice is greedy instead of exhaustive.
SEARCH_LIMIT = 5000


class InsufficientDevices(Exception):
    """The node cannot give the request its devices; `reason` says why (as filter reasons do)."""

    def __init__(self, reason: str, device_type: str = ""):
        self.reason = reason
        self.device_type = device_type
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """An offer: per device type, the grants (minor + amounts per dimension), minor ascending."""

    devices: Mapping[str, tuple[DeviceGrant, ...]]
    _annotation: str | None = field(default=None, compare=False, repr=False)

    def binding_devices(self) -> dict[str, list[DeviceGrant]]:
        return {kind: list(grants) for kind, grants in self.devices.items()}

    def annotation(self) -> str:
        """The device-allocated annotation of these grants, formatted once: offers are memoized
        (DeviceShare.reserve) and the same offer is bound again and again."""
        text = self._annotation
        if text is None:
            text = format_device_allocated(self.devices)
            object.__setattr__(self, "_annotation", text)  # a cache, not a field of the value
        return text


def device_scores(
    nd: NodeDevices, request: TypeRequest, strategy: str, slots: Sequence[int] | None = None
) -> list[int]:
    """Koordinator card-level score of one instance of `request` on each device (module docstring).

    Only `slots` are scored when given (the others read 0). Plain Python: for a handful of devices
    it is faster than numpy's per-call overhead.
    """
    ask, scored, ratio_bytes, bytes_ratio = _score_plan(request, nd.dims)
    total, free = nd.total.tolist(), nd.free.tolist()
    least = strategy == "LeastAllocated"
    out = [0] * len(nd)
    for j in range(len(nd)) if slots is None else slots:
        points = counted = 0
        for k in scored:
            t = total[k][j]
            if t <= 0:
                continue
            want = ask[k]
            if ratio_bytes is not None and k == ratio_bytes[1]:  # bytes of a ratio share differ per card
                want += t * ratio_bytes[0] // 100
            elif bytes_ratio is not None and k == bytes_ratio[2]:
                want += bytes_ratio[0] * 100 // max(total[bytes_ratio[1]][j], 1)
            req = t - free[k][j] + want
            points += (t - req) * 100 // t if least else req * 100 // t
            counted += 1
        out[j] = points // counted if counted else 0
    return out


@lru_cache(maxsize=1024)
def _score_plan(
    request: TypeRequest, dims: tuple[str, ...]
) -> tuple[list[int], list[int], tuple[int, int] | None, tuple[int, int, int] | None]:
    """Per-dimension request, the scored dimensions (all but gpu-core), and the per-card
    conversions: (ratio, memory dim) for a ratio share, (bytes, memory dim, ratio dim) for bytes."""
    per = request.per_device
    ask = [per.get(name, 0) for name in dims]
    scored = [k for k, name in enumerate(dims) if name != GPU_CORE]
    mem = dims.index(GPU_MEMORY) if GPU_MEMORY in dims else None
    ratio = dims.index(GPU_MEMORY_RATIO) if GPU_MEMORY_RATIO in dims else None
    ratio_bytes = bytes_ratio = None
    if mem is not None and GPU_MEMORY_RATIO in per and GPU_MEMORY not in per:
        ratio_bytes = (per[GPU_MEMORY_RATIO], mem)
    if mem is not None and ratio is not None and GPU_MEMORY in per and GPU_MEMORY_RATIO not in per:
        bytes_ratio = (per[GPU_MEMORY], mem, ratio)
    return ask, scored, ratio_bytes, bytes_ratio


@dataclass
class _Pool:
    """One type's candidates on the node."""

    nd: NodeDevices
    request: TypeRequest
    slots: list[int]  # fitting (and NUMA-allowed) device slots, minor ascending
    scores: list[int]
    outside: list[int]  # 1 where a preferred NUMA affinity is not met
    minors: list[int]

    def single_key(self, slot: int) -> tuple[int, int, int]:
        return self.outside[slot], -self.scores[slot], self.minors[slot]


def _signature(nd: NodeDevices) -> tuple[int, bytes, bytes, bytes]:
    """What the interconnect ranking of a node's devices depends on (nodes share a few shapes)."""
    links = b"" if nd.links is None else np.ascontiguousarray(nd.links, dtype=np.int64).tobytes()
    return len(nd), np.ascontiguousarray(nd.pcie).tobytes(), np.ascontiguousarray(nd.numa).tobytes(), links


@lru_cache(maxsize=4096)
def _set_plan(signature: tuple[int, bytes, bytes, bytes], cand: tuple[int, ...], count: int) -> tuple[Any, Any, bool]:
    """(combos [C, count] of candidate slots, their interconnect rank [C] (0 best), whether flat).

    The rank orders sets by minimum then sum of link class, then minimum then sum of topology
    class (2 same PCIe switch, 1 same NUMA node); "flat" means every pair of candidates is alike.
    None combos when there are more than SEARCH_LIMIT sets. Memoized per node shape.
    """
    d, pcie_b, numa_b, links_b = signature
    pcie, numa = np.frombuffer(pcie_b, dtype=np.int64), np.frombuffer(numa_b, dtype=np.int64)
    link = np.frombuffer(links_b, dtype=np.int64).reshape(d, d) if links_b else np.zeros((d, d), dtype=np.int64)
    same_pcie = (pcie[:, None] == pcie[None, :]) & (pcie[:, None] >= 0)
    same_numa = (numa[:, None] == numa[None, :]) & (numa[:, None] >= 0)
    topo = np.where(same_pcie, 2, np.where(same_numa, 1, 0)).astype(np.int64)
    c = np.asarray(cand, dtype=np.intp)
    sub_link, sub_topo = link[np.ix_(c, c)], topo[np.ix_(c, c)]
    off = ~np.eye(len(c), dtype=bool)
    flat = bool((sub_link[off] == sub_link[off][0]).all() and (sub_topo[off] == sub_topo[off][0]).all())
    if math.comb(len(c), count) > SEARCH_LIMIT:
        return None, None, flat
    combos = c[np.array(list(itertools.combinations(range(len(c)), count)), dtype=np.intp)]
    a_idx, b_idx = zip(*itertools.combinations(range(count), 2), strict=True)
    a, b = combos[:, list(a_idx)], combos[:, list(b_idx)]
    links, topos = link[a, b], topo[a, b]
    keys = np.stack([-links.min(axis=1), -links.sum(axis=1), -topos.min(axis=1), -topos.sum(axis=1)], axis=1)
    _, rank = np.unique(keys, axis=0, return_inverse=True)  # lexicographic rank of the key rows
    return combos, rank.reshape(-1), flat


def ranked_sets(
    pool: _Pool, candidates: Sequence[int], count: int, *, all_sets: bool = False
) -> Iterator[tuple[int, ...]]:
    """Sets of `count` candidate slots, best first (the module docstring's order).

    Without interconnect differences the best set is the greedy one; with them, every set is
    ranked (up to SEARCH_LIMIT sets; beyond it only the greedy set is offered). `all_sets` asks
    for every set in order (joint allocation tries them until the other types fit).
    """
    if len(candidates) < count:
        return
    if len(candidates) == count:  # the only set
        yield tuple(sorted(candidates, key=lambda s: pool.minors[s]))
        return
    greedy = sorted(candidates, key=pool.single_key)
    if count == 1:
        yield from ((s,) for s in (greedy if all_sets else greedy[:1]))
        return
    combos, rank, flat = _set_plan(_signature(pool.nd), tuple(sorted(candidates)), count)
    if (flat and not all_sets) or combos is None:
        yield tuple(sorted(greedy[:count], key=lambda s: pool.minors[s]))
        return
    keys = [np.arange(len(combos)), -np.asarray(pool.scores)[combos].sum(axis=1), rank]
    if any(pool.outside):
        keys.append(np.asarray(pool.outside)[combos].sum(axis=1))
    for row in np.lexsort(keys).tolist():
        yield tuple(int(s) for s in combos[row])


def _pool(
    nd: NodeDevices | None,
    request: TypeRequest,
    strategy: str,
    affinity: NUMAAffinity | None,
    labels: Labels = (),
) -> _Pool:
    kind = request.type
    if nd is None or len(nd) == 0:
        raise InsufficientDevices(f"node has no {kind}", kind)
    rule = compile_rule(request, nd.dims)
    fits = fit_mask(rule, nd.free, nd.total, nd.healthy)
    allowed = fits
    if request.hint is not None:  # hints.py: the same candidates and verdict as the filter
        problem = hint_problem(nd, request, labels, fits)
        if problem is not None:
            raise InsufficientDevices(problem, kind)
        matching, allowed = hint_candidates(nd, request, labels, fits)
        fits = allowed
        if request.hint.apply_all:
            request = dataclasses.replace(request, count=needed(request, matching))
    outside = [0] * len(nd)
    if affinity is not None:
        in_numa = np.zeros(len(nd), dtype=bool)
        for numa in affinity.numa:  # one or two ids: cheaper than np.isin's general machinery
            in_numa |= nd.numa == numa
        if affinity.required:
            allowed = fits & in_numa
        else:
            outside = (~in_numa).astype(int).tolist()
    slots = np.flatnonzero(allowed).tolist()
    if len(slots) < request.count:
        raise InsufficientDevices(_why(nd, request, rule, int(fits.sum()), affinity), kind)
    scores = device_scores(nd, request, strategy, slots)
    return _Pool(nd, request, slots, scores, outside, nd.minors.tolist())


def _why(nd: NodeDevices, request: TypeRequest, rule: FitRule, fitting: int, affinity: NUMAAffinity | None) -> str:
    if affinity is not None and affinity.required and fitting >= request.count:
        return f"insufficient free {device_label(request.type, True)} on NUMA node(s) {sorted(affinity.numa)}"
    valid = np.ones((1, len(nd)), dtype=bool)
    reasons = explain_type(
        request.type, rule, request.count, nd.dims, nd.free[:, None], nd.total[:, None], nd.healthy[None], valid
    )
    return ", ".join(reasons) or f"insufficient free {device_label(request.type, True)}"


def _chosen(pool: _Pool, chooser: ChooseFn | None) -> tuple[int, ...] | None:
    """The chooser's answer as slots (validated), or None when there is no chooser or it passes."""
    if chooser is None:
        return None
    count = pool.request.count
    minors = [pool.minors[s] for s in pool.slots]
    choice = chooser(pool.request.type, minors, count)
    if choice is None:
        return None
    picked = [int(m) for m in choice]
    if len(picked) != count or len(set(picked)) != count or not set(picked) <= set(minors):
        raise ValueError(f"device chooser returned {picked} for {count} {pool.request.type} of fitting minors {minors}")
    return tuple(pool.slots[minors.index(m)] for m in sorted(picked))


def _grants(pool: _Pool, slots: Sequence[int]) -> tuple[DeviceGrant, ...]:
    nd = pool.nd
    mem = nd.dim(GPU_MEMORY) if nd.type == GPU else None
    out = []
    hint = pool.request.hint
    for slot in sorted(slots, key=lambda s: int(nd.minors[s])):
        if hint is not None and hint.exclusive == "DeviceLevel":  # the whole (unused) device: nobody shares it
            whole = {name: int(nd.total[k, slot]) for k, name in enumerate(nd.dims) if nd.total[k, slot] > 0}
            out.append(DeviceGrant.model_construct(minor=int(nd.minors[slot]), resources=ResourceVector(whole)))
            continue
        memory = int(nd.total[mem, slot]) if mem is not None else -1
        out.append(_grant(nd.type, int(nd.minors[slot]), pool.request.per_device, memory))
    return tuple(out)


@lru_cache(maxsize=8192)
def _grant(kind: str, minor: int, per_device: ResourceVector, memory_total: int) -> DeviceGrant:
    """One device's grant, gpu-memory / ratio filled for its card (memoized: grants are immutable)."""
    amounts = fill_gpu_amounts(per_device, max(memory_total, 0)) if kind == GPU else dict(per_device)
    return DeviceGrant.model_construct(minor=minor, resources=ResourceVector(amounts))


def allocate_devices(
    node_devices: Mapping[str, NodeDevices | None],
    request: DeviceRequest,
    *,
    strategy: str = "LeastAllocated",
    affinity: NUMAAffinity | None = None,
    chooser: ChooseFn | None = None,
    labels: Mapping[str, Labels] | None = None,
    partition: PartitionPick | None = None,
) -> DeviceAllocation:
    """Choose the devices of `request` on one node; raise InsufficientDevices when it cannot.

    `node_devices` maps each requested type to the node's devices of it (missing/None: none);
    `labels` their device labels in slot order (read only for hinted types with a selector);
    `partition` the node's GPU partition table for a whole-GPU request (partitions.py): its pick
    comes first, and when it is binding (`honor`) nothing else is taken.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown device allocate strategy {strategy!r}; valid: {list(STRATEGIES)}")
    labels = labels or {}
    pools = {
        kind: _pool(node_devices.get(kind), tr, strategy, affinity, labels.get(kind, ()))
        for kind, tr in request.types.items()
    }
    chosen: dict[str, tuple[int, ...]] = {}
    joint = request.joint
    if joint is not None:
        chosen.update(_joint(pools, joint.types, joint.scope, chooser))
    for kind in sorted(pools):
        if kind in chosen:
            continue
        pool = pools[kind]
        if partition is not None and kind == GPU and not pool.request.shared and pool.request.hint is None:
            pick = partition.pick(pool.slots, pool.request.count)
            if pick is None and partition.honor:
                raise InsufficientDevices(partition.refusal(pool.request.count), kind)
            if pick is not None:
                chosen[kind] = pick
                continue
        pick = _chosen(pool, chooser)
        if pick is not None and not _in_scope(pool, pick):
            pick = None  # a chooser's set outside the hint's required scope is not taken
        if pick is None and pool.request.count == 1:  # the common case, without the set machinery
            pick = (min(pool.slots, key=pool.single_key),)
        pick = pick or _best_set(pool, pool.slots)
        if pick is None:  # only with a required scope: no group holds enough (e.g. under a NUMA affinity)
            where = SCOPE_WORDS[str(_scope_of(pool))]
            raise InsufficientDevices(f"deviceAllocateHint {kind}: no {where} has enough free {kind}", kind)
        chosen[kind] = pick
    return DeviceAllocation({kind: _grants(pools[kind], chosen[kind]) for kind in sorted(chosen)})


def _scope_of(pool: _Pool) -> str | None:
    return None if pool.request.hint is None else pool.request.hint.scope


def _in_scope(pool: _Pool, slots: Sequence[int]) -> bool:
    """True when `slots` respect the pool's required topology scope (always, without one)."""
    scope = _scope_of(pool)
    return scope is None or len({int(g) for g in scope_groups(pool.nd, scope)[list(slots)]}) == 1


def _best_set(pool: _Pool, candidates: Sequence[int]) -> tuple[int, ...] | None:
    """The best set of the pool's count among `candidates` (None: none), within one scope group when
    the hint requires a scope: each group's best set, then the best of those by the set order's
    own keys (fewer devices outside a preferred NUMA affinity, higher summed score, lower minors)."""
    count = pool.request.count
    scope = _scope_of(pool)
    if scope is None:
        return next(ranked_sets(pool, candidates, count), None)
    best: tuple[tuple[int, int, list[int]], tuple[int, ...]] | None = None
    for group in scoped_sets(scope_groups(pool.nd, scope), candidates):
        found = next(ranked_sets(pool, group, count), None)
        if found is None:
            continue
        key = (
            sum(pool.outside[s] for s in found),
            -sum(pool.scores[s] for s in found),
            sorted(pool.minors[s] for s in found),
        )
        if best is None or key < best[0]:
            best = (key, found)
    return None if best is None else best[1]


def _joint(
    pools: Mapping[str, _Pool], types: Sequence[str], scope: str, chooser: ChooseFn | None
) -> dict[str, tuple[int, ...]]:
    primary, secondaries = pools[types[0]], [pools[t] for t in types[1:]]

    def scope_of(pool: _Pool) -> Int64Array:
        return pool.nd.pcie if scope == "SamePCIe" else pool.nd.numa

    first = _chosen(primary, chooser)
    tries = itertools.chain(
        [first] if first is not None else [], ranked_sets(primary, primary.slots, primary.request.count, all_sets=True)
    )
    for pset in tries:
        if not _in_scope(primary, pset):
            continue
        scopes = {int(scope_of(primary)[s]) for s in pset} - {-1}
        picks = {types[0]: pset}
        for pool in secondaries:
            near = [s for s in pool.slots if int(scope_of(pool)[s]) in scopes]
            best = _best_set(pool, near)
            if best is None:
                break
            picks[pool.request.type] = best
        else:
            return picks
    where = "PCIe switch" if scope == "SamePCIe" else "NUMA node"
    others = ", ".join(types[1:])
    raise InsufficientDevices(f"no free {types[0]} shares a {where} with enough free {others}", types[0])
