"""Koordinator's exact cpuset choice: `take_cpus` and the resource manager's NUMA-hint split.

Reproduces, rule for rule, ../shared/reference/CPU-DEVICE-SEMANTICS.md "Koordinator takeCPUs"
(koord-scheduler `nodenumaresource/cpu_accumulator.go` and `resource_manager.go`), so a user who
moves from Koordinator gets the same CPUs. Where that file is silent we chose, and say so here:

* "socket free count" / "NUMA node free count" used to break ties are the CPUs still available in
  that socket / NUMA node (any CPU, exclusivity not applied), recounted at the start of each step.
* A core's ref-count is the sum of the ref-counts of its available CPUs; ref-counts only order
  anything when ``max_ref_count > 1`` (with 1, every available CPU has ref-count 0).
* Every level is tried exclusivity-filtered first, then unfiltered, before moving to the next
  level (NUMA node, then socket, then the whole-socket / whole-core steps, then the fallback), so
  the exclusive policy never costs locality. A pass's list is built before its first take
  ("the spread list is built before any take"), and CPUs it takes mark their core / NUMA node for
  the passes that follow.
* Sorts are stable: where Go's `sort.Slice` leaves equal elements in an unspecified order we
  keep the order of the previous key (ids ascending), which is what Go yields on these sizes.
* `allocated` entries for one CPU combine: the largest ref-count, every exclusive policy named.
* "Whole socket lists ... while need >= size" skips a list bigger than the need and goes on to
  the next (smaller) one, as the kubelet's takeFullSockets does; then the whole-core step walks
  the (recomputed) socket lists smallest first.
* The final fallback's round-robin applies to FullPCPUs too (the file states it for the
  fallback as a whole): it only runs when whole cores ran out, and then prefers partly used
  cores first (rule 4), so it fills holes before breaking new cores.
* Preferred CPUs: "the others" are the available CPUs outside the preferred set; the two
  passes do not share exclusivity marks (two takeCPUs calls, as in Koordinator).

Worked examples (threads of a core are consecutive ids in these, as in Koordinator's tests):
idle 2 sockets x 2 NUMA x 4 cores x 2 threads, SpreadByPCPUs for 32 CPUs -> order 0,2,..,30,1,3,..,31;
2 x 1 x 4 x 2, 10 CPUs SpreadByPCPUs + PCPULevel -> 0-3,4,6,8,10,12,14 (see tests/test_cpu_take.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from finesched.cpuset import CPUSet
from finesched.model.node import CPUTopology
from finesched.state.cpu_topology import (
    BIND_POLICIES,
    EXCLUSIVE_NONE,
    EXCLUSIVE_POLICIES,
    FULL_PCPUS,
    MOST_ALLOCATED,
    NUMA_NODE_LEVEL,
    NUMA_STRATEGIES,
    PCPU_LEVEL,
    AllocatedCPU,
    InsufficientCPUs,
    TopoInfo,
    check_choice,
    topo_info,
    trusted_cpuset,
)

NOT_ENOUGH = "not enough cpus available to satisfy request"
RESERVATION_NOT_ENOUGH = "Reservation(s) not enough cpus available to satisfy request"
INSUFFICIENT_NUMA_CPU = "Insufficient NUMA cpu"
REQUIRED_POLICY_NOT_MET = "node(s) cannot satisfy the required cpu bind policy"


def take_cpus(
    topology: CPUTopology | TopoInfo,
    available: CPUSet | Iterable[int],
    request: int,
    *,
    bind_policy: str = FULL_PCPUS,
    exclusive_policy: str = EXCLUSIVE_NONE,
    numa_strategy: str = MOST_ALLOCATED,
    allocated: Iterable[AllocatedCPU] = (),
    max_ref_count: int = 1,
    preferred: CPUSet | None = None,
    preferred_restricted: bool = False,
) -> CPUSet:
    """Koordinator's `takeCPUs` (with `takePreferredCPUs` when `preferred` is given): `request` CPUs of `available`.

    `allocated` are CPUs held by others (their exclusive policy and ref-count); a CPU held
    `max_ref_count` times is not available whatever `available` says. `preferred` (a
    reservation's CPUs) are taken first, min(request, |preferred ∩ available|) of them with the
    same algorithm, the rest from the other available CPUs; `preferred_restricted` allows only
    preferred CPUs. Raises InsufficientCPUs with Koordinator's message, UnknownPolicy on a bad name.
    """
    check_choice("bind_policy", bind_policy, BIND_POLICIES)
    check_choice("exclusive_policy", exclusive_policy, EXCLUSIVE_POLICIES)
    check_choice("numa_strategy", numa_strategy, NUMA_STRATEGIES)
    if request < 0:
        raise ValueError(f"request must be >= 0, got {request}")
    if max_ref_count < 1:
        raise ValueError(f"max_ref_count must be >= 1, got {max_ref_count}")
    topo = topo_info(topology)
    checked = topo.check_cpus(available)
    if preferred is None and isinstance(allocated, tuple | list) and not allocated:
        use_ref = max_ref_count > 1
        return _take_unheld(topo, checked, request, bind_policy, exclusive_policy, numa_strategy, use_ref)
    free: frozenset[int] | set[int] = checked  # `_take` copies what it changes
    held = _Held.of(topo, allocated)
    if held.refs:
        free = {cpu for cpu in free if held.refs.get(cpu, 0) < max_ref_count}
    args = (bind_policy, exclusive_policy, numa_strategy, held, max_ref_count > 1)
    if preferred is None:
        return trusted_cpuset(_take(topo, free, request, *args))
    in_preferred = free & set(preferred)
    if preferred_restricted:
        if request > len(in_preferred):
            raise InsufficientCPUs(RESERVATION_NOT_ENOUGH)
        return trusted_cpuset(_take(topo, in_preferred, request, *args))
    first = min(request, len(in_preferred))
    taken = _take(topo, in_preferred, first, *args) if first else []
    rest = _take(topo, free - set(preferred), request - len(taken), *args)
    return trusted_cpuset([*taken, *rest])


@lru_cache(maxsize=4096)
def _take_unheld(
    topo: TopoInfo, free: frozenset[int], request: int, bind: str, excl: str, strategy: str, use_ref: bool
) -> CPUSet:
    """`take_cpus` when no CPU is held by others: a pure function of its arguments, memoized.

    Nodes of one shape filled by one stream of request shapes pass through the same free sets
    again and again (most often: whole free NUMA nodes), and the accumulator is the costliest
    part of an exclusive reservation. Failures raise (and are not cached). `topo` compares by
    identity: one `TopoInfo` per distinct topology (`topo_info`).
    """
    return trusted_cpuset(_take(topo, free, request, bind, excl, strategy, _Held(), use_ref))


def filter_required(topo: TopoInfo, available: Iterable[int], bind_policy: str) -> frozenset[int]:
    """Koordinator's `filterAvailableCPUsByRequiredCPUBindPolicy`: FullPCPUs keeps whole free cores,
    SpreadByPCPUs keeps the lowest free CPU of each core (so one CPU per core can be taken)."""
    free = frozenset(available)
    out: list[int] = []
    for cpus in topo.core_cpus:
        have = [c for c in cpus if c in free]
        if not have:
            continue
        if bind_policy == FULL_PCPUS:
            if len(have) == topo.cpus_per_core:
                out += have
        else:
            out.append(have[0])
    return frozenset(out)


def satisfies_required(topo: TopoInfo, cpus: Iterable[int], bind_policy: str) -> bool:
    """Whether `cpus` is whole cores (FullPCPUs) or at most one CPU per core (SpreadByPCPUs)."""
    chosen = frozenset(cpus)
    per_core: dict[int, int] = {}
    for cpu in chosen:
        core = topo.core_of[cpu]
        per_core[core] = per_core.get(core, 0) + 1
    if bind_policy == FULL_PCPUS:
        return all(n == len(topo.core_cpus[core]) for core, n in per_core.items())
    return all(n == 1 for n in per_core.values())


def split_by_numa(
    request: int, free: Mapping[int, int], numa_nodes: Iterable[int], *, round_to: int = 1, what: str = "cpu"
) -> dict[int, int]:
    """Split `request` over the hinted NUMA nodes (resource manager `allocateResourcesByHint`).

    Nodes in ascending order of `free` (ties by id); each gets min(free, remaining // nodes
    left), rounded down to a multiple of `round_to` (CPUs per core under required FullPCPUs).
    Whatever is left fails ``Insufficient NUMA <what>``. Example: 10 over free {0: 8, 1: 6} ->
    node 1 gets min(6, 10 // 2) = 5, node 0 min(8, 5) = 5.
    """
    order = sorted(set(numa_nodes), key=lambda n: (free.get(n, 0), n))
    out: dict[int, int] = {}
    remaining = request
    for k, numa in enumerate(order):
        share = min(free.get(numa, 0), remaining // (len(order) - k))
        share -= share % round_to
        if share > 0:
            out[numa] = share
            remaining -= share
    if remaining > 0:
        raise InsufficientCPUs(f"Insufficient NUMA {what}")
    return out


def allocate_cpus(
    topology: CPUTopology | TopoInfo,
    available: CPUSet | Iterable[int],
    request: int,
    *,
    bind_policy: str = FULL_PCPUS,
    required: bool = False,
    numa_hint: Iterable[int] | None = None,
    numa_free_cpus: Mapping[int, int] | None = None,
    **options: object,
) -> CPUSet:
    """The resource manager's cpuset step: required-policy pre-filter, NUMA-hint split, then `take_cpus`.

    With `required`, available CPUs are first filtered (`filter_required`) and the result must
    satisfy the policy. With `numa_hint` (NUMA ids), the request is split by `split_by_numa`
    over the hinted nodes (free = min(`numa_free_cpus`, filtered CPUs on the node)) and each
    share is taken on its node. `options` go to `take_cpus` (exclusive policy, strategy, ...).
    """
    topo = topo_info(topology)
    free = topo.check_cpus(available)
    if required:
        free = filter_required(topo, free, bind_policy)
    if numa_hint is None:
        result = take_cpus(topo, free, request, bind_policy=bind_policy, **options)  # type: ignore[arg-type]
    else:
        by_numa = {n: free & topo.cpus_in_numa_ids([n]) for n in numa_hint}
        caps = {n: min(len(c), (numa_free_cpus or {}).get(n, len(c))) for n, c in by_numa.items()}
        round_to = topo.cpus_per_core if required and bind_policy == FULL_PCPUS else 1
        shares = split_by_numa(request, caps, by_numa, round_to=round_to)
        parts: list[int] = []
        for numa, share in shares.items():
            parts += take_cpus(topo, by_numa[numa], share, bind_policy=bind_policy, **options)  # type: ignore[arg-type]
        result = trusted_cpuset(parts)
        if len(result) != request:
            raise InsufficientCPUs(NOT_ENOUGH)
    if required and not satisfies_required(topo, result, bind_policy):
        raise InsufficientCPUs(REQUIRED_POLICY_NOT_MET)
    return result


# The accumulator ---------------------------------------------------------------------------------------


class _Held:
    """What `allocated` says: ref-count per CPU, and cores / NUMA nodes marked by each exclusive policy."""

    __slots__ = ("numas", "pcpu_cores", "refs")

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.pcpu_cores: set[int] = set()
        self.numas: set[int] = set()

    @classmethod
    def of(cls, topo: TopoInfo, allocated: Iterable[AllocatedCPU]) -> _Held:
        held = cls()
        for a in allocated:
            if a.cpu not in topo.all:
                continue
            held.refs[a.cpu] = max(held.refs.get(a.cpu, 0), a.ref_count)
            if a.exclusive_policy == PCPU_LEVEL:
                held.pcpu_cores.add(topo.core_of[a.cpu])
            elif a.exclusive_policy == NUMA_NODE_LEVEL:
                held.numas.add(topo.numa_of[a.cpu])
        return held


def _first_per_core(cpus: Sequence[int], core_of: Sequence[int]) -> list[int]:
    """The first CPU of each core, in the order of `cpus`."""
    seen: set[int] = set()
    out = []
    for cpu in cpus:
        if core_of[cpu] not in seen:
            seen.add(core_of[cpu])
            out.append(cpu)
    return out


def _take(
    topo: TopoInfo,
    free: frozenset[int] | set[int],
    need: int,
    bind: str,
    excl: str,
    strategy: str,
    held: _Held,
    use_ref: bool,
) -> list[int]:
    if need <= 0:
        return []
    if need > len(free):
        raise InsufficientCPUs(NOT_ENOUGH)
    acc = _Acc(topo, set(free), need, excl, strategy, held, use_ref)
    if bind == FULL_PCPUS or topo.cpus_per_core == 1:
        acc.full_pcpus()
    else:
        acc.spread()
    if acc.need > 0:
        acc.fallback()
    if acc.need > 0:  # unreachable: the unfiltered fallback sees every free CPU
        raise InsufficientCPUs(NOT_ENOUGH)
    return acc.result


class _Acc:
    """One allocation in progress (Koordinator's cpuAccumulator)."""

    __slots__ = (
        "_per_core",
        "excl",
        "free",
        "held",
        "need",
        "numas",
        "passes",
        "pcpu_cores",
        "refs",
        "result",
        "sign",
        "topo",
        "use_ref",
    )

    def __init__(self, topo: TopoInfo, free: set[int], need: int, excl: str, strategy: str, held: _Held, use_ref: bool):
        self.topo, self.free, self.need, self.excl = topo, free, need, excl
        self.sign = 1 if strategy == MOST_ALLOCATED else -1  # MostAllocated: fewest free first
        self.refs, self.use_ref = held.refs, use_ref
        self.pcpu_cores = set(held.pcpu_cores) if excl == PCPU_LEVEL else set()
        self.numas = set(held.numas) if excl == NUMA_NODE_LEVEL else set()
        self.held = held
        self.result: list[int] = []
        #: The exclusivity-filtered pass, then the unfiltered one; one pass when nothing can be excluded.
        self.passes = (True, False) if excl != EXCLUSIVE_NONE else (False,)
        self._per_core: tuple[dict[int, list[int]], list[int], list[int]] | None = None

    # Bookkeeping -----------------------------------------------------------------------------------------
    def take(self, cpus: Sequence[int]) -> None:
        topo = self.topo
        for cpu in cpus:
            self.free.discard(cpu)
            self.result.append(cpu)
            if self.excl == PCPU_LEVEL:
                self.pcpu_cores.add(topo.core_of[cpu])
            elif self.excl == NUMA_NODE_LEVEL:
                self.numas.add(topo.numa_of[cpu])
        self.need -= len(cpus)
        self._per_core = None

    def excluded_core(self, core: int) -> bool:
        return core in self.pcpu_cores or self.topo.core_numa[core] in self.numas

    def ref(self, cpu: int) -> int:
        return self.refs.get(cpu, 0) if self.use_ref else 0

    def free_in_cores(self) -> dict[int, list[int]]:
        """Dense core -> its free CPUs ordered by (ref-count, id), for cores with a free CPU, ascending
        core (recomputed after each take; the lists are never mutated)."""
        return self._state()[0]

    def free_counts(self) -> tuple[list[int], list[int]]:
        """Free CPUs per dense socket and per dense NUMA node (tie-break counts, unfiltered)."""
        _, sockets, numas = self._state()
        return sockets, numas

    def _state(self) -> tuple[dict[int, list[int]], list[int], list[int]]:
        cached = self._per_core
        if cached is None:
            topo = self.topo
            core_of = topo.core_of
            per: dict[int, list[int]] = {}
            for cpu in sorted(self.free):
                core = core_of[cpu]
                cpus = per.get(core)
                if cpus is None:
                    per[core] = [cpu]
                else:
                    cpus.append(cpu)
            if self.use_ref:
                for cpus in per.values():
                    cpus.sort(key=lambda c: (self.ref(c), c))
            ordered = {c: per[c] for c in sorted(per)}
            # Counted per core, not per CPU: a core's threads share its socket and NUMA node
            # (CPUTopology validates it), and there are half as many cores as CPUs.
            core_socket, core_numa = topo.core_socket, topo.core_numa
            sockets, numas = [0] * topo.num_sockets, [0] * topo.num_numa
            for core, cpus in ordered.items():
                sockets[core_socket[core]] += len(cpus)
                numas[core_numa[core]] += len(cpus)
            cached = self._per_core = (ordered, sockets, numas)
        return cached

    # FullPCPUs --------------------------------------------------------------------------------------------
    def whole_core_lists(self, by_numa: bool, filtered: bool) -> list[list[list[int]]]:
        """Per NUMA node (or socket) with any, its fully free cores' CPUs; groups in strategy order."""
        topo = self.topo
        per_core, socket_free, _ = self._state()
        group_of, core_len = (topo.core_numa if by_numa else topo.core_socket), topo.core_len
        check = filtered and (self.pcpu_cores or self.numas)
        groups: dict[int, list[list[int]]] = {}
        counts: dict[int, int] = {}
        for c, cpus in per_core.items():
            if len(cpus) == core_len[c] and not (check and self.excluded_core(c)):
                g = group_of[c]
                if g in groups:
                    groups[g].append(cpus)
                    counts[g] += len(cpus)
                else:
                    groups[g], counts[g] = [cpus], len(cpus)
        keyed = []
        sign = self.sign
        for g, whole in groups.items():
            if self.use_ref:
                whole.sort(key=lambda cpus: sum(self.ref(c) for c in cpus))  # stable: core id among equals
            tie = socket_free[topo.numa_sockets[g][0]] if by_numa and topo.numa_sockets[g] else 0
            keyed.append(((sign * counts[g], sign * tie, g), whole))
        keyed.sort(key=lambda item: item[0])
        return [whole for _, whole in keyed]

    def full_pcpus(self) -> None:
        topo = self.topo
        for by_numa, size in ((True, topo.cpus_per_numa), (False, topo.cpus_per_socket)):
            if self.need > size:
                continue
            for filtered in self.passes:
                for cores in self.whole_core_lists(by_numa, filtered):
                    cpus = [c for core in cores for c in core]
                    if len(cpus) >= self.need:
                        self.take(cpus[: self.need])
                        return
        # Whole sockets, largest first, each while the need covers it.
        for filtered in self.passes:
            lists = sorted(self.whole_core_lists(False, filtered), key=lambda cores: -sum(map(len, cores)))
            for cores in lists:
                size = sum(map(len, cores))
                if size and self.need >= size:
                    self.take([c for core in cores for c in core])
            if self.need <= 0:
                return
        # Then whole cores, from the smallest socket list first.
        for filtered in self.passes:
            lists = sorted(self.whole_core_lists(False, filtered), key=lambda cores: sum(map(len, cores)))
            for cores in lists:
                for core in cores:
                    if self.need >= topo.cpus_per_core:
                        self.take(core)
            if self.need <= 0:
                return

    # SpreadByPCPUs ----------------------------------------------------------------------------------------
    def spread(self) -> None:
        topo = self.topo
        for by_numa, size in ((True, topo.cpus_per_numa), (False, topo.cpus_per_socket)):
            if self.need > size:
                continue
            # First one CPU (the lowest) per core, so a group that can spread `need` over distinct
            # cores wins over one that would double up; then every free CPU.
            for one_per_core in (True, False):
                for filtered in self.passes:
                    for cpus in self.free_cpu_lists(by_numa, filtered, one_per_core):
                        if len(cpus) >= self.need:
                            self.take(self.round_robin(cpus)[: self.need])
                            return

    def free_cpu_lists(self, by_numa: bool, filtered: bool, one_per_core: bool = False) -> list[list[int]]:
        """Per NUMA node (or socket) with any, its free CPUs by (ref-count, id); groups in strategy order.

        Groups are ordered by their whole free count; with `one_per_core` each list keeps only the
        first CPU of each core (in that order)."""
        topo = self.topo
        per_core, socket_free, _ = self._state()
        group_of = topo.core_numa if by_numa else topo.core_socket
        groups: dict[int, list[int]] = {}
        for c, cpus in per_core.items():
            if not (filtered and self.excluded_core(c)):
                groups.setdefault(group_of[c], []).extend(cpus)
        keyed = []
        for g, cpus in groups.items():
            cpus.sort(key=lambda c: (self.ref(c), c))
            tie = socket_free[topo.numa_sockets[g][0]] if by_numa and topo.numa_sockets[g] else 0
            listed = _first_per_core(cpus, topo.core_of) if one_per_core else cpus
            keyed.append(((self.sign * len(cpus), self.sign * tie, g), listed))
        keyed.sort(key=lambda item: item[0])
        return [cpus for _, cpus in keyed]

    def round_robin(self, cpus: Sequence[int]) -> list[int]:
        """Every core's first CPU (in list order), then every core's second, ... (cores by first appearance)."""
        by_core: dict[int, list[int]] = {}
        for cpu in cpus:
            by_core.setdefault(self.topo.core_of[cpu], []).append(cpu)
        return _interleave(list(by_core.values()))

    # Final fallback ---------------------------------------------------------------------------------------
    def fallback(self) -> None:
        for filtered in self.passes:
            for cpu in self.fallback_order(filtered):
                if self.need < 1:
                    return
                if cpu in self.free:
                    self.take([cpu])
            if self.need < 1:
                return

    def fallback_order(self, filtered: bool) -> list[int]:
        """Cores by (same socket as the result, socket free, NUMA free, fewer free in core, socket id,
        ref-count, core id), then round-robin across them."""
        topo = self.topo
        per_core, socket_free, numa_free = self._state()
        colo = [0] * topo.num_sockets
        for cpu in self.result:
            colo[topo.socket_of[cpu]] += 1
        sign = self.sign
        keyed = []
        for core, cpus in per_core.items():
            if filtered and self.excluded_core(core):
                continue
            s, n = topo.core_socket[core], topo.core_numa[core]
            ref = sum(self.ref(c) for c in cpus)
            keyed.append(((-colo[s], sign * socket_free[s], sign * numa_free[n], len(cpus), s, ref, core), cpus))
        keyed.sort(key=lambda item: item[0])
        return _interleave([cpus for _, cpus in keyed])


def _interleave(groups: list[list[int]]) -> list[int]:
    out: list[int] = []
    depth = max((len(g) for g in groups), default=0)
    for k in range(depth):
        out += [g[k] for g in groups if len(g) > k]
    return out
