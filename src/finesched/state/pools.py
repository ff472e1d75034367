"""The S3.2 CPU pools of one node, and the pool each workload runs in: pure functions, no I/O.

One rule for both sides of a binding, so the node never disagrees with the scheduler:
`state/cpus.py` keeps a node's pools as bindings are assumed and forgotten, and the node agent
(`agent/executor.py`) recomputes them from the bindings it runs and moves the running processes,
as koordlet does. The rule (seed S3.2, Koordinator):

* **exclusive CPUs**: every CPU a binding's cpuset holds (LSE, LSR, a kubelet-static Guaranteed
  workload, or any other pinned workload);
* **the shared pool** (LS, Burstable): every CPU no cpuset holds; per NUMA node for LS workloads
  bound to a NUMA node's shared pool (ConstrainedBurst, ``cpuSharedPools`` in resource-status);
* **the BE pool**: every CPU not held by an LSE-like holder: LSR CPUs are shared with BE only.

`placement` says where one workload's processes belong: its own cpuset when it has one, else the
pool of its QoS class. An empty pool cannot be a kernel cpuset; the workload then runs on every
CPU of the node and the placement says so (the scheduler keeps LS requests within the shared pool,
so only a BE workload next to LSE holders of every CPU meets this).

`pools_report` is the node's S3.9 report of its pools (``node.koordinator.sh/cpu-shared-pools``
and ``be-cpu-shared-pools``: ``[{"socket", "node", "cpuset"}]``) and pinned workloads
(``pod-cpu-allocs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from finesched.cpuset import CPUSet

#: QoS classes whose cpuset BE workloads may share (S3.2: LSR CPUs are shared with BE only).
BE_SHAREABLE_QOS = frozenset({"LSR"})


def split_cpus(
    cpus: frozenset[int], holders: Iterable[tuple[Iterable[int], bool]]
) -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
    """(shared, BE, exclusive) CPUs of `cpus`, given each holder's CPUs and whether BE may share them."""
    exclusive: set[int] = set()
    not_be: set[int] = set()
    for held, be_shareable in holders:
        exclusive.update(held)
        if not be_shareable:
            not_be.update(held)
    return cpus - exclusive, cpus - not_be, cpus & frozenset(exclusive)


@dataclass(frozen=True, slots=True)
class Holder:
    """A workload that holds CPUs: its key, cpuset and QoS class."""

    workload: str
    cpuset: CPUSet
    qos: str


@dataclass(frozen=True, slots=True)
class CPUPools:
    """A node's pools (S3.2) over the CPUs it may use, with the NUMA layout to split them."""

    cpus: CPUSet
    shared: CPUSet
    be: CPUSet
    exclusive: CPUSet
    numa_cpus: Mapping[int, CPUSet]
    holders: tuple[Holder, ...] = ()

    def numa_shared(self, numa: int) -> CPUSet:
        return self.shared & self.numa_cpus.get(numa, CPUSet())


def node_pools(cpus: CPUSet, numa_cpus: Mapping[int, CPUSet], holders: Iterable[Holder]) -> CPUPools:
    """The pools of a node whose usable CPUs are `cpus`, with these `holders` (LSE, LSR, pinned)."""
    kept = tuple(sorted((h for h in holders if h.cpuset), key=lambda h: h.workload))
    shared, be, exclusive = split_cpus(frozenset(cpus), ((h.cpuset, h.qos in BE_SHAREABLE_QOS) for h in kept))
    return CPUPools(cpus, CPUSet(shared), CPUSet(be), CPUSet(exclusive), dict(numa_cpus), kept)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a workload's processes run: `cpus`, and which pool that is (for people)."""

    cpus: CPUSet
    pool: str


def placement(qos: str, cpuset: CPUSet, shared_numa: Iterable[int], pools: CPUPools) -> Placement:
    """The CPUs of a workload of class `qos` with its own `cpuset` (empty: none), bound to the
    shared pools of NUMA nodes `shared_numa` (empty: the whole shared pool)."""
    if cpuset:
        return Placement(cpuset, f"{qos} cpuset")
    if qos == "BE":
        cpus, pool = pools.be, "BE pool"
    else:
        numa = sorted(set(shared_numa))
        if numa:
            cpus = CPUSet().union(*(pools.numa_shared(n) for n in numa))
            pool = "shared pool of NUMA node " + ",".join(map(str, numa))
        else:
            cpus, pool = pools.shared, "shared pool"
    if not cpus:
        return Placement(pools.cpus, f"{pool} is empty: every CPU")
    return Placement(cpus, pool)


def pools_report(pools: CPUPools, socket_of_numa: Mapping[int, int]) -> dict[str, Any]:
    """The S3.9 report: ``cpuSharedPools``, ``beCPUSharedPools`` per NUMA node and ``podCPUAllocs``."""

    def per_numa(cpus: CPUSet) -> list[dict[str, Any]]:
        return [
            {"socket": socket_of_numa.get(n, 0), "node": n, "cpuset": (cpus & numa).format()}
            for n, numa in sorted(pools.numa_cpus.items())
        ]

    allocs = []
    for h in pools.holders:
        namespace, _, name = h.workload.partition("/")
        allocs.append({"namespace": namespace, "name": name, "cpuset": h.cpuset.format(), "qos": h.qos})
    return {"cpuSharedPools": per_numa(pools.shared), "beCPUSharedPools": per_numa(pools.be), "podCPUAllocs": allocs}
