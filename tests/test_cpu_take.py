"""Koordinator's takeCPUs rules, one table row per rule of CPU-DEVICE-SEMANTICS.md "Koordinator takeCPUs".

Topologies here use Koordinator's test numbering, ``koord(sockets, numa_per_socket, cores_per_numa,
threads)``: CPU ids run consecutively through a core's threads, cores through NUMA nodes, NUMA
nodes through sockets. So in koord(2, 2, 4, 2) core k holds CPUs 2k and 2k+1, NUMA node n holds
CPUs 8n..8n+7 and socket s holds CPUs 16s..16s+15 (not the Linux-style numbering of the manifest
builder, where a core's threads are CPUs k and k + cores).
"""

from __future__ import annotations

import re

import pytest

from finesched.cpuset import CPUSet
from finesched.model.node import CPUTopology
from finesched.plugins.cpu.koordinator import (
    REQUIRED_POLICY_NOT_MET,
    allocate_cpus,
    filter_required,
    satisfies_required,
    split_by_numa,
)
from finesched.plugins.cpu_orchestration import AllocatedCPU, InsufficientCPUs, UnknownPolicy, take_cpus
from finesched.state.cpu_topology import topo_info


def koord(sockets: int, numa_per_socket: int, cores_per_numa: int, threads: int) -> CPUTopology:
    cpus, core, numa = [], 0, 0
    for socket in range(sockets):
        for _ in range(numa_per_socket):
            for _ in range(cores_per_numa):
                for _ in range(threads):
                    cpus.append({"id": len(cpus), "core": core, "socket": socket, "numa": numa})
                core += 1
            numa += 1
    return CPUTopology.from_list(cpus)


T2242 = koord(2, 2, 4, 2)  # 32 CPUs, 4 NUMA nodes of 8, 2 sockets of 16
T2142 = koord(2, 1, 4, 2)  # 16 CPUs, 2 NUMA nodes = 2 sockets of 8
T1142 = koord(1, 1, 4, 2)  # 8 CPUs, one NUMA node
ALL32 = CPUSet(range(32))
ALL16 = CPUSet(range(16))


def cs(text: str) -> CPUSet:
    return CPUSet(text)


@pytest.mark.parametrize(
    ("topo", "available", "need", "options", "want"),
    [
        # Sizes: an idle machine, 4 CPUs <= 8 per NUMA node: every node has 8 whole-core CPUs, ties by id -> node 0.
        pytest.param(T2242, ALL32, 4, {}, "0-3", id="full-pcpus-numa-level-idle"),
        # MostAllocated picks the node with the fewest whole-core CPUs that still fits: core 0 held ->
        # node 0 has 6 (2-7) >= 4 -> CPUs 2-5.
        pytest.param(T2242, ALL32 - cs("0-1"), 4, {}, "2-5", id="full-pcpus-most-allocated"),
        # LeastAllocated: nodes 1, 2, 3 tie at 8; socket free count breaks the tie in the same direction:
        # socket 0 has 14 free, socket 1 16 -> node 2 (CPUs 16-23) -> 16-19.
        pytest.param(
            T2242, ALL32 - cs("0-1"), 4, {"numa_strategy": "LeastAllocated"}, "16-19", id="full-pcpus-least-allocated"
        ),
        # A request that is not whole cores takes the node list's first `need` CPUs (a partial core).
        pytest.param(T2142, ALL16, 3, {}, "0-2", id="full-pcpus-partial-core"),
        # 12 > 8 per NUMA node but <= 16 per socket: socket 0's whole-core list 0-15 -> 0-11.
        pytest.param(T2242, ALL32, 12, {}, "0-11", id="full-pcpus-socket-level"),
        # 20 > a socket: whole sockets largest first while need >= size (socket 0: 0-15), then whole cores
        # from the smallest remaining list (socket 1: 16-17, 18-19).
        pytest.param(T2242, ALL32, 20, {}, "0-19", id="full-pcpus-whole-socket-then-cores"),
        # CPU 0 held: socket 1's list (16) is the largest -> taken whole; socket 0's (14: 2-15) > 4 left ->
        # cores 2-3, 4-5.
        pytest.param(T2242, ALL32 - cs("0"), 20, {}, "2-5,16-31", id="full-pcpus-largest-socket-first"),
        # Fragmented: only core 2 (4-5) is whole -> taken; the remaining 2 come from the final fallback,
        # cores 0 (0), 1 (2), 3 (6) in core-id order (all else equal), round-robin -> 0, 2.
        pytest.param(T1142, cs("0,2,4-6"), 4, {}, "0,2,4-5", id="full-pcpus-fallback-fragmented"),
        # SpreadByPCPUs <= a NUMA node: node 0's free CPUs 0-7 round-robin over cores -> 0, 2, 4, 6.
        pytest.param(T2242, ALL32, 4, {"bind_policy": "SpreadByPCPUs"}, "0,2,4,6", id="spread-numa-level"),
        # Spread idle (2,2,4,2) order 0,2,...,30,1,3,...,31: 17 > a socket -> fallback order; the first
        # 17 are every even CPU and then 1.
        pytest.param(
            T2242, ALL32, 17, {"bind_policy": "SpreadByPCPUs"}, "0-2,4,6,8,10,12,14,16,18,20,22,24,26,28,30",
            id="spread-order-idle",
        ),
        pytest.param(T2242, ALL32, 32, {"bind_policy": "SpreadByPCPUs"}, "0-31", id="spread-whole-machine"),
        # Spread lists hold one CPU (the lowest) per core on the first pass: NUMA node 0 comes first
        # (fewest free, MostAllocated) but spans 3 free cores only, so 4 CPUs go to node 1's cores.
        pytest.param(
            T2142, cs("0-5,8-15"), 4, {"bind_policy": "SpreadByPCPUs", "numa_strategy": "MostAllocated"},
            "8,10,12,14", id="spread-one-cpu-per-core-first",
        ),
        # Without a group spanning `need` cores the second pass takes every free CPU, round-robin.
        pytest.param(
            T2142, cs("0-5,8-11"), 4, {"bind_policy": "SpreadByPCPUs", "numa_strategy": "MostAllocated"},
            "8-11", id="spread-second-pass-all-free-cpus",
        ),
        # The file's worked example: 10 CPUs Spread+PCPULevel on (2,1,4,2) gives 0-3,4,6,8,10,12,14
        # (the spread list 0,2,..,14,1,3,.. is built before any take, so 1 and 3 follow the evens).
        pytest.param(
            T2142, ALL16, 10, {"bind_policy": "SpreadByPCPUs", "exclusive_policy": "PCPULevel"},
            "0-3,4,6,8,10,12,14", id="spread-pcpulevel-worked-example",
        ),
        # PCPULevel avoids cores holding a PCPULevel CPU: CPU 0 held (core 0) -> CPU 1 is skipped -> 2, 4.
        pytest.param(
            T2142, ALL16 - cs("0"), 2,
            {"bind_policy": "SpreadByPCPUs", "exclusive_policy": "PCPULevel",
             "allocated": [AllocatedCPU(0, "PCPULevel")]},
            "2,4", id="pcpulevel-avoids-marked-core",
        ),
        # ... only when the pod's own policy matches: a pod without it takes CPU 1 (core 0 first in id order).
        pytest.param(
            T2142, ALL16 - cs("0"), 2, {"bind_policy": "SpreadByPCPUs", "allocated": [AllocatedCPU(0, "PCPULevel")]},
            "1-2", id="pcpulevel-soft-other-policy",
        ),
        # NUMANodeLevel avoids NUMA nodes holding a NUMANodeLevel CPU: node 0 marked -> node 1 (8-11).
        pytest.param(
            T2242, ALL32 - cs("0"), 4,
            {"exclusive_policy": "NUMANodeLevel", "allocated": [AllocatedCPU(0, "NUMANodeLevel")]},
            "8-11", id="numanodelevel-avoids-marked-node",
        ),
        # Soft: every node marked -> the unfiltered pass still allocates (node 0: 2-5 under MostAllocated).
        pytest.param(
            T2142, ALL16 - cs("0,8"), 4,
            {"exclusive_policy": "NUMANodeLevel",
             "allocated": [AllocatedCPU(0, "NUMANodeLevel"), AllocatedCPU(8, "NUMANodeLevel")]},
            "2-5", id="numanodelevel-falls-back",
        ),
        # Ref counts: with max_ref_count 2, core 0 (held once) is still available but ranks after idle cores.
        pytest.param(
            T2142, ALL16, 2, {"max_ref_count": 2, "allocated": [AllocatedCPU(0, ref_count=1), AllocatedCPU(1)]},
            "2-3", id="ref-count-lower-first",
        ),
        # A CPU held max_ref_count times is not available whatever `available` says.
        pytest.param(T1142, cs("0-3"), 2, {"allocated": [AllocatedCPU(0)]}, "2-3", id="ref-count-full-dropped"),
        # Preferred (reservation) CPUs first: 4 from 8-11, then 2 from the others by the same rules
        # (MostAllocated: node 1 has 12-15 left, node 0 has 8 -> 12-13).
        pytest.param(T2142, ALL16, 6, {"preferred": cs("8-11")}, "8-13", id="preferred-first"),
        pytest.param(
            T2142, ALL16, 4, {"preferred": cs("8-11"), "preferred_restricted": True}, "8-11", id="preferred-restricted"
        ),
        pytest.param(T2242, ALL32, 0, {}, "", id="zero-request"),
    ],
)  # fmt: skip
def test_take_cpus(topo, available, need, options, want):
    assert take_cpus(topo, available, need, **options) == CPUSet(want)


@pytest.mark.parametrize(
    ("available", "need", "options", "message"),
    [
        pytest.param(ALL16, 17, {}, "not enough cpus available to satisfy request", id="too-large"),
        pytest.param(cs("0-3"), 3, {"allocated": [AllocatedCPU(0), AllocatedCPU(1)]}, "not enough cpus", id="held"),
        pytest.param(
            ALL16, 6, {"preferred": cs("8-11"), "preferred_restricted": True},
            "Reservation(s) not enough cpus available to satisfy request", id="restricted-reservation",
        ),
    ],
)  # fmt: skip
def test_take_cpus_failures(available, need, options, message):
    with pytest.raises(InsufficientCPUs, match=re.escape(message)):
        take_cpus(T2142, available, need, **options)


@pytest.mark.parametrize(
    ("option", "value", "valid"),
    [
        ("bind_policy", "Packed", "FullPCPUs, SpreadByPCPUs"),
        ("exclusive_policy", "CoreLevel", "None, PCPULevel, NUMANodeLevel"),
        ("numa_strategy", "Random", "MostAllocated, LeastAllocated"),
    ],
)
def test_unknown_policy_names_list_the_valid_ones(option, value, valid):
    with pytest.raises(UnknownPolicy, match=valid):
        take_cpus(T2142, ALL16, 2, **{option: value})


def test_cpus_outside_the_topology_are_refused():
    with pytest.raises(ValueError, match="not in the topology"):
        take_cpus(T1142, cs("0-9"), 2)


def test_single_thread_cores_use_the_full_pcpus_path():
    # 1 thread per core: SpreadByPCPUs behaves as FullPCPUs (node list in id order).
    topo = koord(1, 2, 4, 1)
    assert take_cpus(topo, CPUSet(range(8)), 3, bind_policy="SpreadByPCPUs") == cs("0-2")


# The resource manager: required policies and the NUMA-hint split -------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "free", "nodes", "round_to", "want"),
    [
        # ascending free: node 1 gets min(6, 10 // 2) = 5, node 0 min(8, 5) = 5
        pytest.param(10, {0: 8, 1: 6}, [0, 1], 1, {1: 5, 0: 5}, id="even"),
        # node 1: min(6, 9 // 2) = 4; node 0: min(8, 5) = 5
        pytest.param(9, {0: 8, 1: 6}, [0, 1], 1, {1: 4, 0: 5}, id="odd"),
        # required FullPCPUs: node 0 min(8, 6 // 2 = 3) -> 2 (whole cores), node 1 gets 4
        pytest.param(6, {0: 8, 1: 8}, [0, 1], 2, {0: 2, 1: 4}, id="whole-cores"),
        pytest.param(4, {0: 8, 1: 8}, [1], 1, {1: 4}, id="single-hinted-node"),
    ],
)
def test_split_by_numa(request_, free, nodes, round_to, want):
    assert split_by_numa(request_, free, nodes, round_to=round_to) == want


def test_split_by_numa_leftover_fails():
    with pytest.raises(InsufficientCPUs, match="Insufficient NUMA cpu"):
        split_by_numa(10, {0: 3, 1: 4}, [0, 1])


def test_required_policies_filter_then_check():
    topo = topo_info(T1142)
    # FullPCPUs keeps whole free cores: core 0 has only CPU 0 free -> dropped.
    assert filter_required(topo, cs("0,2-5"), "FullPCPUs") == frozenset({2, 3, 4, 5})
    # SpreadByPCPUs keeps the lowest free CPU of each core.
    assert filter_required(topo, cs("0-3,5"), "SpreadByPCPUs") == frozenset({0, 2, 5})
    assert satisfies_required(topo, cs("2-5"), "FullPCPUs") and not satisfies_required(topo, cs("2-4"), "FullPCPUs")
    assert allocate_cpus(T1142, cs("0-3"), 2, bind_policy="SpreadByPCPUs", required=True) == cs("0,2")
    with pytest.raises(InsufficientCPUs, match=re.escape(REQUIRED_POLICY_NOT_MET)):
        allocate_cpus(T1142, cs("0,2-5"), 3, required=True)


def test_numa_hint_splits_then_takes_per_node():
    # hint {0, 1}, 4 CPUs: 2 per node, each taken with takeCPUs on that node: 0-1 and 8-9.
    got = allocate_cpus(T2142, ALL16, 4, numa_hint=[0, 1], numa_free_cpus={0: 8, 1: 8})
    assert got == cs("0-1,8-9")
    # the node's free cpu (from NUMA-bound usage) caps its share: node 0 has 1 CPU left -> 1 + 3
    assert allocate_cpus(T2142, ALL16, 4, numa_hint=[0, 1], numa_free_cpus={0: 1, 1: 8}) == cs("0,8-10")
