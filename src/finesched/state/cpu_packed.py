"""The kubelet's packed CPU take (pkg/kubelet/cm/cpumanager cpu_assignment.go, takeByTopologyPacked).

In state/ because the CPU accounts need it when a node is set: a static kubelet without
reservedSystemCPUs reserves packed(all CPUs, count) (state/cpu_config.py `reserved_cpus`). The
kubelet plugin (plugins/cpu/kubelet.py) takes with it too, and builds its distributed take on it.
Packed: whole free first-level units, then second-level units, then whole free cores (skipped
when distributing across cores), then single CPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from finesched.cpuset import CPUSet
from finesched.model.node import CPUTopology
from finesched.state.cpu_topology import InsufficientCPUs, TopoInfo, topo_info, trusted_cpuset


def kubelet_reserved_cpus(topology: CPUTopology | TopoInfo, count: int) -> CPUSet:
    """The kubelet's automatic reservation when no reservedSystemCPUs are given: packed(all CPUs, count)."""
    topo = topo_info(topology)
    return trusted_cpuset(packed(topo, topo.all, min(count, topo.num_cpus), False))


class CPUAccumulator:
    """The kubelet's cpuAccumulator over one topology and a set of available CPUs."""

    __slots__ = ("free", "need", "result", "spread", "topo")

    def __init__(self, topo: TopoInfo, free: Iterable[int], need: int, spread: bool):
        self.topo, self.free, self.need, self.spread = topo, set(free), need, spread
        self.result: list[int] = []

    def take(self, cpus: Iterable[int]) -> None:
        cpus = [c for c in cpus]
        self.free.difference_update(cpus)
        self.result += cpus
        self.need -= len(cpus)

    def count(self, cpus: Iterable[int]) -> int:
        free = self.free
        return sum(1 for c in cpus if c in free)

    def _sorted(self, ids: Iterable[int], cpus_of: Callable[[int], tuple[int, ...]]) -> list[int]:
        """Ascending free CPUs, ties by id; elements without free CPUs dropped."""
        keyed = [(self.count(cpus_of(i)), i) for i in ids]
        return [i for n, i in sorted(keyed) if n > 0]

    def numa_first(self) -> bool:
        return self.topo.num_sockets >= self.topo.num_numa

    def sorted_numas(self) -> list[int]:
        topo = self.topo
        if self.numa_first():
            return self._sorted(range(topo.num_numa), topo.numa_cpus.__getitem__)
        return [
            n for s in self.sorted_sockets() for n in self._sorted(topo.socket_numas[s], topo.numa_cpus.__getitem__)
        ]

    def sorted_sockets(self) -> list[int]:
        topo = self.topo
        if self.numa_first():
            out: list[int] = []
            for n in self.sorted_numas():
                out += [s for s in self._sorted(topo.numa_sockets[n], topo.socket_cpus.__getitem__) if s not in out]
            return out
        return self._sorted(range(topo.num_sockets), topo.socket_cpus.__getitem__)

    def sorted_cores(self) -> list[int]:
        topo = self.topo
        if self.numa_first():
            parents, children = self.sorted_sockets(), topo.socket_cores
        else:
            parents, children = self.sorted_numas(), topo.numa_cores
        return [c for p in parents for c in self._sorted(children[p], topo.core_cpus.__getitem__)]

    def take_full_numas(self) -> None:
        topo = self.topo
        self._take_whole([topo.numa_cpus[n] for n in self.sorted_numas()], None)

    def take_full_sockets(self) -> None:
        topo = self.topo
        self._take_whole([topo.socket_cpus[s] for s in self.sorted_sockets()], topo.cpus_per_socket)

    def take_full_cores(self) -> None:
        topo = self.topo
        self._take_whole([topo.core_cpus[c] for c in self.sorted_cores()], topo.cpus_per_core)

    def _take_whole(self, units: Sequence[Sequence[int]], size: int | None) -> None:
        """Take every unit (in order) that is wholly free, while the need covers it. A unit is whole
        when all its CPUs are free and, for sockets and cores, it has the topology's full size."""
        for cpus in units:
            if self.count(cpus) == (len(cpus) if size is None else size) and self.need >= len(cpus):
                self.take(cpus)

    def take_remaining(self) -> None:
        topo = self.topo
        if self.spread:  # CPU ids ascending per socket, sockets in order
            order = [c for s in self.sorted_sockets() for c in topo.socket_cpus[s] if c in self.free]
        else:  # CPUs ascending per core, cores in order
            order = [c for core in self.sorted_cores() for c in topo.core_cpus[core] if c in self.free]
        for cpu in order:
            if self.need < 1:
                return
            self.take([cpu])


def needs_cpus(request: int, free: frozenset[int]) -> bool:
    """False for a request of nothing; InsufficientCPUs (the kubelet's words) when `free` is too small."""
    if request < 1:
        return False
    if request > len(free):
        raise InsufficientCPUs(
            f"not enough cpus available to satisfy request: requested={request}, available={len(free)}"
        )
    return True


def packed(topo: TopoInfo, free: Iterable[int], request: int, spread: bool) -> list[int]:
    free = frozenset(free)
    acc = CPUAccumulator(topo, free, request, spread)
    if not needs_cpus(request, free):
        return []
    steps = [acc.take_full_numas, acc.take_full_sockets]
    if not acc.numa_first():
        steps.reverse()
    if not spread:
        steps.append(acc.take_full_cores)
    steps.append(acc.take_remaining)
    for step in steps:
        step()
        if acc.need < 1:
            return acc.result
    raise InsufficientCPUs("failed to allocate cpus")
