"""The topology index every CPU algorithm reads, the allocation errors, and `AllocatedCPU`.

`CPUTopology` (model/node.py) is the validated user-facing list of logical CPUs. The allocators
need the same facts many times per call (which core holds CPU 17? which CPUs are on NUMA node
1?), so `topo_info` derives a `TopoInfo` once per topology and caches it: by object identity
first (nodes built from one shape share one `CPUTopology`), then by content, so 10,000 nodes of
one shape share one index (and its numpy arrays) however they were built.

Dense indices: cores, NUMA nodes and sockets are numbered 0..n-1 in ascending order of their own
ids, so comparing dense indices orders them exactly as comparing ids does (every tie-break
"by id" in the Koordinator and kubelet rules can use them).

Sizes follow both peers: CPUs per core = NumCPUs / NumCores (integer division), and alike for
NUMA nodes and sockets (`topology.CPUTopology.CPUsPerCore()` in the kubelet, the same in
Koordinator).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from finesched.cpuset import CPUSet
from finesched.cpuset import _wrap as _trusted_wrap  # the one place that skips id checks (see trusted_cpuset)
from finesched.model.node import CPUTopology

IntArray = npt.NDArray[np.intp]

FULL_PCPUS = "FullPCPUs"
SPREAD_BY_PCPUS = "SpreadByPCPUs"
CONSTRAINED_BURST = "ConstrainedBurst"
BIND_POLICIES = (FULL_PCPUS, SPREAD_BY_PCPUS)
EXCLUSIVE_NONE = "None"
PCPU_LEVEL = "PCPULevel"
NUMA_NODE_LEVEL = "NUMANodeLevel"
EXCLUSIVE_POLICIES = (EXCLUSIVE_NONE, PCPU_LEVEL, NUMA_NODE_LEVEL)
MOST_ALLOCATED = "MostAllocated"
LEAST_ALLOCATED = "LeastAllocated"
DISTRIBUTE_EVENLY = "DistributeEvenly"
NUMA_STRATEGIES = (MOST_ALLOCATED, LEAST_ALLOCATED)


class UnknownPolicy(ValueError):
    """A policy name that is not one of the valid ones (the message lists them)."""


def trusted_cpuset(ids: Iterable[int]) -> CPUSet:
    """A CPUSet of ids that come from a topology (already valid), without re-checking each id.

    `CPUSet(ids)` validates every id (an ABC isinstance check each), which was a third of the
    exact step's time; ids taken from a `TopoInfo` are valid by construction.
    """
    return _trusted_wrap(frozenset(ids))


def check_choice(kind: str, value: str, valid: Iterable[str]) -> str:
    """`value` if it is one of `valid`, else UnknownPolicy naming every valid value."""
    if type(valid) is tuple and value in valid:  # the allocators check policies on every call
        return value
    valid = tuple(valid)
    if value not in valid:
        raise UnknownPolicy(f"unknown {kind} {value!r}; valid: {', '.join(v for v in valid if v)}")
    return value


class CPUAllocationError(Exception):
    """The exact allocator cannot give this request on this node (the node is skipped, not the workload)."""


class InsufficientCPUs(CPUAllocationError):
    """Not enough CPUs; the message is the peer's own wording where it has one."""


class SMTAlignmentError(CPUAllocationError):
    """The kubelet's full-pcpus-only refusal (pkg/kubelet/cm/cpumanager/policy_static.go), same words.

    `available_physical` is set when the refusal is caused by too few CPUs in whole free cores
    (the kubelet's `CausedByPhysicalCPUs`), else the request is not a multiple of CPUs per core.
    """

    def __init__(self, requested: int, cpus_per_core: int, available_physical: int | None = None):
        self.requested = requested
        self.cpus_per_core = cpus_per_core
        self.available_physical = available_physical
        super().__init__(self._message())

    @property
    def caused_by_physical_cpus(self) -> bool:
        return self.available_physical is not None

    def _message(self) -> str:
        if self.available_physical is not None:
            return (
                "SMT Alignment Error: not enough free physical CPUs: "
                f"available physical CPUs = {self.available_physical}, requested CPUs = {self.requested}, "
                f"CPUs per core = {self.cpus_per_core}"
            )
        return f"SMT Alignment Error: requested {self.requested} cpus not multiple cpus per core = {self.cpus_per_core}"


@dataclass(frozen=True, slots=True)
class AllocatedCPU:
    """A CPU already held by others: the holder's exclusive policy and how many times it is bound."""

    cpu: int
    exclusive_policy: str = EXCLUSIVE_NONE
    ref_count: int = 1


@dataclass(frozen=True, eq=False)
class TopoInfo:
    """Derived, immutable index of one CPUTopology (see the module docstring for dense indices)."""

    ids: tuple[int, ...]  # CPU ids ascending; a CPU's *position* is its index here
    pos_of: tuple[int, ...]  # by CPU id: its position (-1 for ids not in the topology)
    core_of: tuple[int, ...]  # by CPU id: dense core index (-1 for ids not in the topology)
    numa_of: tuple[int, ...]
    socket_of: tuple[int, ...]
    core_ids: tuple[int, ...]  # dense core -> its core id
    numa_ids: tuple[int, ...]
    socket_ids: tuple[int, ...]
    core_cpus: tuple[tuple[int, ...], ...]  # dense core -> its CPU ids ascending
    core_len: tuple[int, ...]  # dense core -> how many CPUs it has
    core_numa: tuple[int, ...]  # dense core -> dense NUMA node
    core_socket: tuple[int, ...]
    numa_cpus: tuple[tuple[int, ...], ...]  # dense NUMA node -> CPU ids ascending
    socket_cpus: tuple[tuple[int, ...], ...]
    numa_cores: tuple[tuple[int, ...], ...]  # dense NUMA node -> dense cores ascending
    socket_cores: tuple[tuple[int, ...], ...]
    socket_numas: tuple[tuple[int, ...], ...]  # dense socket -> dense NUMA nodes with CPUs on it
    numa_sockets: tuple[tuple[int, ...], ...]
    all: frozenset[int]
    cpus_per_core: int
    cpus_per_numa: int
    cpus_per_socket: int
    # numpy views by *position* (for the state's vectorized per-node arrays)
    pos_core: IntArray = field(repr=False)
    pos_numa: IntArray = field(repr=False)
    pos_socket: IntArray = field(repr=False)
    core_size: IntArray = field(repr=False)
    core_numa_arr: IntArray = field(repr=False)
    core_socket_arr: IntArray = field(repr=False)

    @property
    def num_cpus(self) -> int:
        return len(self.ids)

    @property
    def num_cores(self) -> int:
        return len(self.core_ids)

    @property
    def num_numa(self) -> int:
        return len(self.numa_ids)

    @property
    def num_sockets(self) -> int:
        return len(self.socket_ids)

    def numa_index(self, numa_id: int) -> int:
        return self.numa_ids.index(numa_id)

    def cpus_in_numa_ids(self, numa_ids: Iterable[int]) -> frozenset[int]:
        """CPU ids of the NUMA nodes with these (original) ids; unknown ids contribute nothing."""
        return _cpus_in_numa(self, frozenset(numa_ids))

    def check_cpus(self, cpus: Iterable[int], what: str = "available") -> frozenset[int]:
        """`cpus` as a frozenset, or ValueError naming CPUs the topology does not have."""
        if type(cpus) is frozenset and cpus <= self.all:  # already checked (the allocators pass these on)
            return cpus
        ids = frozenset(cpus)
        stray = ids - self.all
        if stray:
            raise ValueError(f"{what} CPUs {CPUSet(stray)} are not in the topology (CPUs {CPUSet(self.all)})")
        return ids


@lru_cache(maxsize=4096)
def _cpus_in_numa(topo: TopoInfo, numa_ids: frozenset[int]) -> frozenset[int]:
    return frozenset(c for k, nid in enumerate(topo.numa_ids) if nid in numa_ids for c in topo.numa_cpus[k])


def _members_of(group_of: list[int], groups: int) -> list[list[int]]:
    """Per group (NUMA node or socket index), the indexes whose entry in `group_of` names it, ascending."""
    members: list[list[int]] = [[] for _ in range(groups)]
    for k, group in enumerate(group_of):
        members[group].append(k)
    return members


def _build(rows: tuple[tuple[int, int, int, int], ...]) -> TopoInfo:
    """rows: (cpu id, core id, socket id, numa id) sorted by cpu id (CPUTopology already validated them)."""
    ids = tuple(r[0] for r in rows)
    core_ids = tuple(sorted({r[1] for r in rows}))
    socket_ids = tuple(sorted({r[2] for r in rows}))
    numa_ids = tuple(sorted({r[3] for r in rows}))
    core_ix = {c: k for k, c in enumerate(core_ids)}
    sock_ix = {s: k for k, s in enumerate(socket_ids)}
    numa_ix = {n: k for k, n in enumerate(numa_ids)}
    size = (max(ids) + 1) if ids else 0
    core_of, numa_of, socket_of, pos_of = [-1] * size, [-1] * size, [-1] * size, [-1] * size
    for p, cpu in enumerate(ids):
        pos_of[cpu] = p
    core_cpus: list[list[int]] = [[] for _ in core_ids]
    numa_cpus: list[list[int]] = [[] for _ in numa_ids]
    socket_cpus: list[list[int]] = [[] for _ in socket_ids]
    core_numa, core_socket = [0] * len(core_ids), [0] * len(core_ids)
    for cpu, core, socket, numa in rows:
        c, s, n = core_ix[core], sock_ix[socket], numa_ix[numa]
        core_of[cpu], numa_of[cpu], socket_of[cpu] = c, n, s
        core_cpus[c].append(cpu)
        numa_cpus[n].append(cpu)
        socket_cpus[s].append(cpu)
        core_numa[c], core_socket[c] = n, s
    numa_cores, socket_cores = _members_of(core_numa, len(numa_ids)), _members_of(core_socket, len(socket_ids))
    socket_numas = tuple(tuple(sorted({core_numa[c] for c in cores})) for cores in socket_cores)
    numa_sockets = tuple(tuple(sorted({core_socket[c] for c in cores})) for cores in numa_cores)
    n_cpus = len(ids)
    return TopoInfo(
        ids=ids,
        pos_of=tuple(pos_of),
        core_of=tuple(core_of),
        numa_of=tuple(numa_of),
        socket_of=tuple(socket_of),
        core_ids=core_ids,
        numa_ids=numa_ids,
        socket_ids=socket_ids,
        core_cpus=tuple(tuple(c) for c in core_cpus),
        core_len=tuple(len(c) for c in core_cpus),
        core_numa=tuple(core_numa),
        core_socket=tuple(core_socket),
        numa_cpus=tuple(tuple(c) for c in numa_cpus),
        socket_cpus=tuple(tuple(c) for c in socket_cpus),
        numa_cores=tuple(tuple(c) for c in numa_cores),
        socket_cores=tuple(tuple(c) for c in socket_cores),
        socket_numas=socket_numas,
        numa_sockets=numa_sockets,
        all=frozenset(ids),
        cpus_per_core=n_cpus // max(1, len(core_ids)),
        cpus_per_numa=n_cpus // max(1, len(numa_ids)),
        cpus_per_socket=n_cpus // max(1, len(socket_ids)),
        pos_core=np.array([core_of[i] for i in ids], dtype=np.intp),
        pos_numa=np.array([numa_of[i] for i in ids], dtype=np.intp),
        pos_socket=np.array([socket_of[i] for i in ids], dtype=np.intp),
        core_size=np.array([len(c) for c in core_cpus], dtype=np.intp),
        core_numa_arr=np.array(core_numa, dtype=np.intp),
        core_socket_arr=np.array(core_socket, dtype=np.intp),
    )


_BY_ID: dict[int, tuple[CPUTopology, TopoInfo]] = {}
_BY_CONTENT: dict[tuple[tuple[int, int, int, int], ...], TopoInfo] = {}
_CACHE_LIMIT = 4096


def topo_info(topology: CPUTopology | TopoInfo) -> TopoInfo:
    """The shared index of `topology` (built once per distinct topology; see the module docstring)."""
    if isinstance(topology, TopoInfo):
        return topology
    hit = _BY_ID.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    rows = tuple((c.id, c.core, c.socket, c.numa) for c in topology.cpus)
    info = _BY_CONTENT.get(rows)
    if info is None:
        if len(_BY_CONTENT) >= _CACHE_LIMIT:
            _BY_CONTENT.clear()
        info = _BY_CONTENT[rows] = _build(rows)
    if len(_BY_ID) >= _CACHE_LIMIT:
        _BY_ID.clear()
    _BY_ID[id(topology)] = (topology, info)  # keeps the object alive, so its id is never reused
    return info
