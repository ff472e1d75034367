"""The kubelet CPU manager's rules, one table row per rule of CPU-DEVICE-SEMANTICS.md "Kubelet".

`DUAL_SOCKET_HT` is the kubelet's own test topology ``topoDualSocketHT``: 2 sockets (= 2 NUMA
nodes), 6 cores of 2 threads, CPUs interleaved between sockets:

    socket/NUMA 0: cores 0 {0,6}, 2 {2,8}, 4 {4,10}      socket/NUMA 1: cores 1 {1,7}, 3 {3,9}, 5 {5,11}
"""

from __future__ import annotations

import re

import pytest

from finesched.cpuset import CPUSet
from finesched.model.node import CPUTopology
from finesched.plugins.cpu_orchestration import (
    InsufficientCPUs,
    SMTAlignmentError,
    kubelet_reserved_cpus,
    kubelet_static_allocate,
    kubelet_take_by_topology,
)

DUAL_SOCKET_HT = CPUTopology.from_list(
    [{"id": cpu, "core": cpu % 6, "socket": cpu % 2, "numa": cpu % 2} for cpu in range(12)]
)
ALL = CPUSet(range(12))
# One socket, two NUMA nodes (socket-first hierarchy), Linux-style numbering from the manifest builder:
# cores 0-3, CPUs 0-3 are first threads and 4-7 second; NUMA 0 = {0,1,4,5}, NUMA 1 = {2,3,6,7}.
ONE_SOCKET_TWO_NUMA = CPUTopology.model_validate(
    {"sockets": 1, "numaPerSocket": 2, "coresPerNuma": 2, "threadsPerCore": 2}
)


def cs(text: str) -> CPUSet:
    return CPUSet(text)


@pytest.mark.parametrize(
    ("topo", "available", "need", "options", "want"),
    [
        pytest.param(DUAL_SOCKET_HT, ALL, 0, {}, "", id="zero-gives-empty"),
        # A whole first-level unit (NUMA node 0: 0,2,4,6,8,10) when the request covers it.
        pytest.param(DUAL_SOCKET_HT, ALL, 6, {}, "0,2,4,6,8,10", id="whole-numa-node"),
        # One CPU: sockets tie (6 free each) -> socket 0 by id; its cores tie -> core 0 -> CPU 0.
        pytest.param(DUAL_SOCKET_HT, ALL, 1, {}, "0", id="single-cpu"),
        # Packing: socket 0 has 4 free (2,4,8,10) < socket 1's 6 -> socket 0; core 2 (2 free) -> CPU 2.
        pytest.param(DUAL_SOCKET_HT, cs("1-5,7-11"), 1, {}, "2", id="packs-onto-fullest-socket"),
        # Whole cores first (core 0: 0,6), then single CPUs packed: socket 0 (4 left) -> core 2 -> CPU 2.
        pytest.param(DUAL_SOCKET_HT, ALL, 3, {}, "0,2,6", id="whole-core-then-single"),
        # distribute-cpus-across-cores skips whole cores; single CPUs by id per socket -> 0, 2, 4.
        pytest.param(DUAL_SOCKET_HT, ALL, 3, {"distribute_across_cores": True}, "0,2,4", id="spread-across-cores"),
        # Socket-first hierarchy (1 socket < 2 NUMA nodes): CPU 0 busy, socket not free, NUMA 1 (2,3,6,7) is.
        pytest.param(ONE_SOCKET_TWO_NUMA, cs("1-7"), 4, {}, "2-3,6-7", id="socket-first-whole-numa"),
        # Distributed: 8 CPUs in groups of 2 need 2 NUMA nodes -> 4 each, packed: {0,6,2,8} and {1,7,3,9}.
        pytest.param(
            DUAL_SOCKET_HT, ALL, 8, {"distribute_across_numa": True, "cpu_group_size": 2}, "0-3,6-9",
            id="distributed-even",
        ),
        # 10 in groups of 2: 4 per node, remainder 2 to the best-balanced subset ({0,1} first at std 1.0)
        # -> node 0 gets core 4 (4,10) too.
        pytest.param(
            DUAL_SOCKET_HT, ALL, 10, {"distribute_across_numa": True, "cpu_group_size": 2}, "0-4,6-10",
            id="distributed-remainder",
        ),
        # One NUMA node can hold 6 -> k = 1 combinations only; node 1 (3 free) cannot, node 0 can.
        pytest.param(
            DUAL_SOCKET_HT, cs("0,2,4,6,8,10,1,3,5"), 6, {"distribute_across_numa": True}, "0,2,4,6,8,10",
            id="distributed-one-node-suffices",
        ),
        # A request that is not a multiple of the group size falls back to packed.
        pytest.param(
            DUAL_SOCKET_HT, ALL, 3, {"distribute_across_numa": True, "cpu_group_size": 2}, "0,2,6",
            id="distributed-not-multiple-falls-back",
        ),
    ],
)  # fmt: skip
def test_take_by_topology(topo, available, need, options, want):
    assert kubelet_take_by_topology(topo, available, need, **options) == CPUSet(want)


def test_take_by_topology_too_large_uses_the_kubelet_words():
    message = "not enough cpus available to satisfy request: requested=5, available=4"
    with pytest.raises(InsufficientCPUs, match=re.escape(message)):
        kubelet_take_by_topology(DUAL_SOCKET_HT, cs("0-3"), 5)


@pytest.mark.parametrize(
    ("need", "options", "want"),
    [
        # Reserved CPU 0 is never handed out: core 0 keeps only 6, so the whole core taken is core 2.
        pytest.param(2, {"full_pcpus_only": True}, "2,8", id="reserved-excluded"),
        # NUMA hint {1}: up to `request` from NUMA node 1 first: cores 1 and 3.
        pytest.param(4, {"numa_hint": [1]}, "1,3,7,9", id="numa-aligned-first"),
        # More than the hinted node holds: all 6 of node 1, the rest packed elsewhere (core 2: 2, 8).
        pytest.param(8, {"numa_hint": [1]}, "1-3,5,7-9,11", id="numa-aligned-then-rest"),
        # Distributed, groups of 2: one node suffices (k = 1); node 1 leaves the better balance
        # (free after: {0: 5, 1: 2}, std 1.5 < node 0's 2.5) -> cores 1 and 3.
        pytest.param(4, {"distribute_across_numa": True, "full_pcpus_only": True}, "1,3,7,9", id="distributed-static"),
    ],
)
def test_static_policy(need, options, want):
    assert kubelet_static_allocate(DUAL_SOCKET_HT, ALL, need, reserved=cs("0"), **options) == CPUSet(want)


def test_static_align_by_socket_widens_the_hint_to_the_socket():
    available = CPUSet(range(8)) - cs("2")
    # NUMA 1 has 3, 6, 7 free: without align-by-socket those 3 come first, then 1 more packed (CPU 0).
    assert kubelet_static_allocate(ONE_SOCKET_TWO_NUMA, available, 4, reserved=CPUSet(), numa_hint=[1]) == cs("0,3,6-7")
    # align-by-socket widens the hint to the whole socket, where packing takes the free NUMA node 0.
    got = kubelet_static_allocate(
        ONE_SOCKET_TWO_NUMA, available, 4, reserved=CPUSet(), numa_hint=[1], align_by_socket=True
    )
    assert got == cs("0-1,4-5")


@pytest.mark.parametrize(
    ("need", "message", "physical"),
    [
        pytest.param(
            3, "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2", None, id="not-multiple"
        ),
        # reserved CPU 0 spoils core 0: 10 CPUs in whole free cores < 12
        pytest.param(
            12,
            "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 10, requested CPUs = 12, "
            "CPUs per core = 2",
            10,
            id="not-enough-physical",
        ),
    ],
)
def test_smt_alignment_errors(need, message, physical):
    with pytest.raises(SMTAlignmentError, match=re.escape(message)) as info:
        kubelet_static_allocate(DUAL_SOCKET_HT, ALL, need, reserved=cs("0"), full_pcpus_only=True)
    assert info.value.available_physical == physical
    assert info.value.caused_by_physical_cpus is (physical is not None)
    assert info.value.requested == need and info.value.cpus_per_core == 2


def test_automatic_reservation_is_packed():
    # packed(all CPUs, 2): a whole core, core 0 -> {0, 6}
    assert kubelet_reserved_cpus(DUAL_SOCKET_HT, 2) == cs("0,6")
    assert kubelet_reserved_cpus(DUAL_SOCKET_HT, 0) == CPUSet()
