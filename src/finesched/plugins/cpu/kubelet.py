"""The kubelet CPU manager's choice (pkg/kubelet/cm/cpumanager): `takeByTopology*` and the static policy.

Reproduces ../shared/reference/CPU-DEVICE-SEMANTICS.md "Kubelet" (cpu_assignment.go and
policy_static.go) so nodes whose kubelet runs the static policy with options get from finesched
exactly the cpuset their kubelet would give (seed S3.8):

* Hierarchy: NUMA-first (NUMA node -> socket -> core) when #sockets >= #NUMA nodes, else
  socket-first (socket -> NUMA node -> core). Each level sorts by ascending free CPUs, ties by
  id, which packs onto the fullest element.
* Packed: whole free first-level units, then second-level units, then whole free cores (skipped
  when distributing across cores), then single CPUs.
* Distributed (distribute-cpus-across-numa): the balanced search over NUMA-node combinations.
* Static policy: full-pcpus-only SMT checks, reserved CPUs excluded, NUMA-aligned CPUs first.

Where the kubelet would loop forever (the remainder walk over nodes whose free CPUs are not a
multiple of the group size), we treat that subset as unable to take the remainder.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from finesched.cpuset import CPUSet
from finesched.model.node import CPUTopology
from finesched.state.cpu_packed import CPUAccumulator, needs_cpus, packed
from finesched.state.cpu_topology import InsufficientCPUs, SMTAlignmentError, TopoInfo, topo_info, trusted_cpuset


def kubelet_take_by_topology(
    topology: CPUTopology | TopoInfo,
    available: CPUSet | Iterable[int],
    request: int,
    *,
    distribute_across_numa: bool = False,
    cpu_group_size: int = 1,
    distribute_across_cores: bool = False,
) -> CPUSet:
    """The kubelet's `takeByTopologyNUMAPacked` (or `...NUMADistributed` with `distribute_across_numa`).

    Raises InsufficientCPUs ``not enough cpus available to satisfy request: requested=R,
    available=A`` when `request` exceeds `available`.
    """
    topo = topo_info(topology)
    free = topo.check_cpus(available)
    if cpu_group_size < 1:
        raise ValueError(f"cpu_group_size must be >= 1, got {cpu_group_size}")
    if distribute_across_numa:
        return trusted_cpuset(_distributed(topo, free, request, cpu_group_size, distribute_across_cores))
    return trusted_cpuset(packed(topo, free, request, distribute_across_cores))


def kubelet_static_allocate(
    topology: CPUTopology | TopoInfo,
    available: CPUSet | Iterable[int],
    request: int,
    *,
    reserved: CPUSet | Iterable[int],
    full_pcpus_only: bool = False,
    numa_hint: Iterable[int] | None = None,
    align_by_socket: bool = False,
    distribute_across_numa: bool = False,
    distribute_across_cores: bool = False,
) -> CPUSet:
    """The static policy's `Allocate` + `allocateCPUs` for one Guaranteed container.

    `available` is the kubelet's default cpuset (CPUs no container holds); `reserved` CPUs are
    never handed out. With `full_pcpus_only` the request must be a multiple of CPUs per core
    and fit in whole free cores, else SMTAlignmentError. With `numa_hint` (NUMA ids) up to
    `request` CPUs come from the hinted nodes (their sockets with `align_by_socket`) first.
    """
    topo = topo_info(topology)
    free = topo.check_cpus(available)
    reserved_ids = topo.check_cpus(reserved, "reserved")
    if full_pcpus_only:
        per_core = topo.cpus_per_core
        if request % per_core:
            raise SMTAlignmentError(request, per_core)
        physical = whole_free_core_cpus(topo, free - reserved_ids)
        if request > physical:
            raise SMTAlignmentError(request, per_core, physical)
    allocatable = free - reserved_ids
    group = topo.cpus_per_core if full_pcpus_only else 1

    def take(cpus: frozenset[int], n: int) -> frozenset[int]:
        if distribute_across_numa:
            return frozenset(_distributed(topo, cpus, n, group, distribute_across_cores))
        return frozenset(packed(topo, cpus, n, distribute_across_cores))

    result: frozenset[int] = frozenset()
    if numa_hint is not None:
        hinted = set(numa_hint)
        if align_by_socket:
            sockets = {
                topo.socket_ids[s] for n in hinted if n in topo.numa_ids for s in topo.numa_sockets[topo.numa_index(n)]
            }
            aligned = frozenset(c for c in allocatable if topo.socket_ids[topo.socket_of[c]] in sockets)
        else:
            aligned = allocatable & topo.cpus_in_numa_ids(hinted)
        result = take(aligned, min(request, len(aligned)))
    return trusted_cpuset(result | take(allocatable - result, request - len(result)))


def whole_free_core_cpus(topo: TopoInfo, free: Iterable[int]) -> int:
    """CPUs in cores whose CPUs are all in `free` (the kubelet's available physical CPUs)."""
    have = frozenset(free)
    return sum(len(cpus) for cpus in topo.core_cpus if all(c in have for c in cpus))


# Distributed -------------------------------------------------------------------------------------------------


def _std(values: Iterable[int]) -> float:
    """The kubelet's standardDeviation: mean and result both rounded to 3 decimals."""
    xs = list(values)
    mean = _round3(sum(xs) / len(xs))
    return _round3(math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)))


def _round3(x: float) -> float:
    """Go's math.Round(x*1000)/1000 for x >= 0 (half away from zero, not Python's half to even)."""
    return math.floor(x * 1000 + 0.5) / 1000


def _combinations(items: list[int], k: int) -> Iterable[tuple[int, ...]]:
    """n-choose-k in the kubelet's iterateCombinations order (lexicographic over `items`' order)."""
    from itertools import combinations

    return combinations(items, k) if k >= 1 else ()


def _walk_remainder(avail: dict[int, int], subset: tuple[int, ...], remainder: int, group: int) -> bool:
    """Hand out `remainder` in groups round-robin over `subset` (mutates `avail`); False if stuck."""
    while remainder > 0:
        progressed = False
        for numa in subset:
            if remainder == 0:
                break
            if avail[numa] < group:
                continue
            avail[numa] -= group
            remainder -= group
            progressed = True
        if not progressed:
            return False
    return True


def _distributed(topo: TopoInfo, free: Iterable[int], request: int, group: int, spread: bool) -> list[int]:
    free = frozenset(free)
    if request % group:
        return packed(topo, free, request, spread)
    acc = CPUAccumulator(topo, free, request, spread)
    if not needs_cpus(request, free):
        return []
    numas = acc.sorted_numas()
    in_numa = {n: acc.count(topo.numa_cpus[n]) for n in numas}
    lo, hi = _numa_range(topo, len(numas), request, group)
    for k in range(lo, hi + 1):
        best: tuple[float, tuple[int, ...], tuple[int, ...]] | None = None
        for combo in _combinations(numas, k):
            if best is not None and best[0] == 0:
                break
            scored = _score_combo(numas, in_numa, combo, request, group)
            if scored is not None and (best is None or scored[0] < best[0]):
                best = (scored[0], combo, scored[1])
        if best is None:
            continue
        _, combo, remainder_set = best
        distribution = request // len(combo) // group * group
        for numa in combo:
            acc.take(packed(topo, acc.free & frozenset(topo.numa_cpus[numa]), distribution, spread))
        remainder = request - distribution * len(combo)
        while remainder > 0:
            progressed = False
            for numa in remainder_set:
                if remainder == 0:
                    break
                mine = acc.free & frozenset(topo.numa_cpus[numa])
                if len(mine) < group:
                    continue
                acc.take(packed(topo, mine, group, spread))
                remainder -= group
                progressed = True
            if not progressed:
                break
        if acc.need != 0:
            raise InsufficientCPUs(f"accounting error, not enough CPUs allocated, remaining: {acc.need}")
        return acc.result
    return packed(topo, free, request, spread)


def _numa_range(topo: TopoInfo, available_numas: int, request: int, group: int) -> tuple[int, int]:
    """The kubelet's rangeNUMANodesNeededToSatisfy."""
    groups = (topo.num_cpus - 1) // group + 1
    per_numa = (groups - 1) // topo.num_numa + 1
    needed = (request - 1) // group + 1
    return (needed - 1) // per_numa + 1, min(needed, available_numas)


def _score_combo(
    numas: list[int], in_numa: dict[int, int], combo: tuple[int, ...], request: int, group: int
) -> tuple[float, tuple[int, ...]] | None:
    """(balance, remainder subset) of one NUMA combination, or None when it cannot take the request."""
    if sum(in_numa[n] for n in combo) < request:
        return None
    if sum(in_numa[n] // group for n in combo) * group < request:
        return None
    distribution = request // len(combo) // group * group
    if any(in_numa[n] < distribution for n in combo):
        return None
    after = {n: in_numa[n] for n in numas}
    for n in combo:
        after[n] -= distribution
    remainder = request - distribution * len(combo)
    if remainder == 0:
        return _std(after.values()), ()
    candidates = [n for n in combo if after[n] >= group]
    best: tuple[float, tuple[int, ...]] | None = None
    for k in range(len(candidates), 0, -1):
        for subset in _combinations(candidates, k):
            if sum(after[n] for n in subset) < remainder:
                continue
            trial = dict(after)
            if not _walk_remainder(trial, subset, remainder, group):
                continue
            balance = _std(trial.values())
            if best is None or balance < best[0]:
                best = (balance, subset)
    return best
