"""The exact allocator on one node: choice order (S0.5), scores, fill (S1.3), interconnect (S1.8), NUMA,
joint allocation, DeviceChooser, foreign and unhealthy devices."""

from __future__ import annotations

import pytest

from builders import make_node
from finesched.plugins.deviceshare import InsufficientDevices, allocate_devices, normalize_device_request
from finesched.plugins.deviceshare.allocator import device_scores
from finesched.plugins.deviceshare.request import JointSpec
from finesched.plugins.shared_keys import NUMAAffinity
from finesched.state.devices import node_devices_from_manifest

GI = 2**30


def gpu_node(count=4, memory="80Gi", foreign=(), **fields):
    """A node of `count` GPUs; `foreign` = [(minor, ratio used)] taken outside finesched."""
    builder = make_node("n").gpus(count, memory=memory)
    allocs = [{"type": "gpu", "minor": m, "resources": {"gpu-core": r, "gpu-memory-ratio": r}} for m, r in foreign]
    return builder.set(foreignAllocations=allocs, **fields)


def minors(allocation, kind="gpu"):
    return [g.minor for g in allocation.devices[kind]]


def allocate(builder, request, **kw):
    joint = kw.pop("joint", None)
    return allocate_devices(
        node_devices_from_manifest(builder.obj()), normalize_device_request(request, joint=joint), **kw
    )


# Card-level strategy ---------------------------------------------------------------------------------

# GPUs 0..3 with 50, 25, 0, 75 % used (foreign); a 25/25 share. Scored dims: ratio and bytes (not core).
# Least: (total - (used + 25))·100/total -> 25, 50, 75, 0 ; Most: (used + 25) -> 75, 50, 25, 100.
USED = [(0, 50), (1, 25), (3, 75)]


@pytest.mark.parametrize(
    ("strategy", "scores", "chosen"),
    [
        pytest.param("LeastAllocated", [25, 50, 75, 0], 2, id="least-used-device"),
        pytest.param("MostAllocated", [75, 50, 25, 100], 3, id="most-used-device-that-fits"),
    ],
)
def test_strategy_scores_and_choice(strategy, scores, chosen):
    nd = node_devices_from_manifest(gpu_node(foreign=USED).obj())["gpu"]
    tr = normalize_device_request({"gpu": 25}).types["gpu"]
    assert device_scores(nd, tr, strategy) == scores
    assert minors(allocate(gpu_node(foreign=USED), {"gpu": 25}, strategy=strategy)) == [chosen]


def test_ties_go_to_the_lowest_minor():
    assert minors(allocate(gpu_node(), {"gpu": 50})) == [0]
    assert minors(allocate(gpu_node(), {"nvidia.com/gpu": 2})) == [0, 1]


def test_most_allocated_keeps_whole_devices_free():
    # Two 50% shares: MostAllocated stacks them on GPU 0 (foreign 50 there); LeastAllocated would use GPU 1.
    assert minors(allocate(gpu_node(2, foreign=[(0, 50)]), {"gpu": 50}, strategy="MostAllocated")) == [0]
    assert minors(allocate(gpu_node(2, foreign=[(0, 50)]), {"gpu": 50}, strategy="LeastAllocated")) == [1]


def test_unknown_strategy_is_an_error():
    with pytest.raises(ValueError, match="unknown device allocate strategy"):
        allocate(gpu_node(), {"gpu": 50}, strategy="Random")


# Fill after allocation (ratio <-> bytes per card, S1.3) --------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "request_", "want"),
    [
        # ratio 50 of a 40Gi card = 20Gi; of an 80Gi card = 40Gi
        pytest.param("40Gi", {"gpu": 50}, {"gpu-core": 50, "gpu-memory-ratio": 50, "gpu-memory": 20 * GI}, id="40Gi"),
        pytest.param("80Gi", {"gpu": 50}, {"gpu-core": 50, "gpu-memory-ratio": 50, "gpu-memory": 40 * GI}, id="80Gi"),
        # 30Gi of an 80Gi card -> ratio ⌊30·100/80⌋ = ⌊37.5⌋ = 37
        pytest.param(
            "80Gi",
            {"gpu-core": 20, "gpu-memory": "30Gi"},
            {"gpu-core": 20, "gpu-memory": 30 * GI, "gpu-memory-ratio": 37},
            id="bytes-to-ratio-floor",
        ),
        # whole GPU without a memory figure: only what the card has
        pytest.param(None, {"nvidia.com/gpu": 1}, {"gpu-core": 100, "gpu-memory-ratio": 100}, id="no-memory-figure"),
    ],
)
def test_fill(memory, request_, want):
    grant = allocate(gpu_node(1, memory=memory), request_).devices["gpu"][0]
    assert grant.resources == want


def test_unequal_cards_convert_per_card():
    # GPU 0 40Gi, GPU 1 80Gi: a 2-GPU ratio-50 share (gpu.shared 2) gets 20Gi and 40Gi.
    builder = make_node("n").gpus(1, memory="40Gi").gpus(1, memory="80Gi")
    got = allocate(builder, {"gpu.shared": 2, "gpu": 100}).devices["gpu"]
    assert [(g.minor, g.resources["gpu-memory"]) for g in got] == [(0, 20 * GI), (1, 40 * GI)]


# Interconnect (S1.8) ------------------------------------------------------------------------------------


def test_nvlink_pair_beats_lower_minors():
    links = [{"type": "gpu", "a": 2, "b": 3, "kind": "NVLink", "bandwidth": "600G"}]
    assert minors(allocate(gpu_node(links=links), {"nvidia.com/gpu": 2})) == [2, 3]


def test_higher_bandwidth_wins_then_min_link():
    links = [
        {"type": "gpu", "a": 0, "b": 1, "bandwidth": "300G"},
        {"type": "gpu", "a": 2, "b": 3, "bandwidth": "600G"},
        {"type": "gpu", "a": 1, "b": 2, "bandwidth": "600G"},
    ]
    # pairs: {2,3} and {1,2} both 600G; sums equal; strategy ties -> lexicographic minors (1,2)
    assert minors(allocate(gpu_node(links=links), {"nvidia.com/gpu": 2})) == [1, 2]
    # 3 GPUs: {1,2,3} has links 600,600,0 -> min 0; {0,1,2}: 300,600,0 -> min 0; sum 1200 vs 900 -> {1,2,3}
    assert minors(allocate(gpu_node(links=links), {"nvidia.com/gpu": 3})) == [1, 2, 3]


def test_pcie_switch_pairs_when_no_links():
    devices = [
        {
            "type": "gpu",
            "minor": m,
            "pcie": p,
            "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "80Gi"},
        }
        for m, p in [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
    ]
    allocs = [{"type": "gpu", "minor": 1, "resources": {"gpu-core": 10, "gpu-memory-ratio": 10}}]
    node = make_node("n").set(devices=devices, foreignAllocations=allocs)
    # greedy by score alone would take 0 and 2 (GPU 1 is 10% used); same-switch pairs {0,1} and {2,3}
    # rank first, and {2,3} has the higher summed score
    assert minors(allocate(node, {"gpu": 200})) == [2, 3]


def test_large_search_falls_back_to_greedy():
    links = [{"type": "gpu", "a": a, "b": a + 1} for a in range(0, 16, 2)]
    assert len(minors(allocate(gpu_node(16, links=links), {"nvidia.com/gpu": 8}))) == 8


# NUMA affinity (plugins/shared_keys.py) ------------------------------------------------------------------


def numa_node(foreign=()):
    return (
        gpu_node(4, foreign=foreign)
        .gpus(0)
        .set(
            numaZones=[{"id": 0}, {"id": 1}],
            devices=[
                {
                    "type": "gpu",
                    "minor": m,
                    "numa": m % 2,
                    "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "80Gi"},
                }
                for m in range(4)
            ],
        )
    )


@pytest.mark.parametrize(
    ("foreign", "required", "want"),
    [
        pytest.param((), True, [1], id="required-numa-1"),
        pytest.param((), False, [1], id="preferred-numa-1"),
        pytest.param([(1, 100), (3, 100)], False, [0], id="preferred-falls-back"),
    ],
)
def test_numa_affinity(foreign, required, want):
    affinity = NUMAAffinity(node=0, numa=frozenset({1}), required=required)
    assert minors(allocate(numa_node(foreign), {"gpu": 100}, affinity=affinity)) == want


def test_required_numa_without_room_says_so():
    affinity = NUMAAffinity(node=0, numa=frozenset({1}))
    with pytest.raises(InsufficientDevices, match=r"insufficient free GPUs on NUMA node\(s\) \[1\]"):
        allocate(numa_node([(1, 100), (3, 100)]), {"gpu": 100}, affinity=affinity)


# Joint allocation ----------------------------------------------------------------------------------------


def joint_node(rdma_pcie="b", rdma_numa=1):
    gpus = [
        {
            "type": "gpu",
            "minor": m,
            "pcie": "a" if m < 2 else "b",
            "numa": 0 if m < 2 else 1,
            "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "80Gi"},
        }
        for m in range(4)
    ]
    rdma = {"type": "rdma", "minor": 0, "pcie": rdma_pcie, "numa": rdma_numa}
    return make_node("n").set(devices=[*gpus, rdma], numaZones=[{"id": 0}, {"id": 1}])


@pytest.mark.parametrize("scope", ["SamePCIe", "SameNUMA"])
def test_joint_gets_gpu_next_to_the_nic(scope):
    got = allocate(joint_node(), {"gpu": 100, "rdma": 100}, joint=JointSpec(("gpu", "rdma"), scope))
    assert (minors(got), minors(got, "rdma")) == ([2], [0])


def test_joint_without_a_shared_switch_gives_a_clear_reason():
    with pytest.raises(InsufficientDevices, match="no free gpu shares a PCIe switch with enough free rdma"):
        allocate(joint_node(rdma_pcie="c"), {"gpu": 100, "rdma": 100}, joint=JointSpec(("gpu", "rdma")))


def test_joint_multi_gpu():
    got = allocate(joint_node(), {"nvidia.com/gpu": 2, "rdma": 100}, joint=JointSpec(("gpu", "rdma")))
    assert minors(got) == [2, 3]


# DeviceChooser ---------------------------------------------------------------------------------------------


def test_chooser_answer_is_used():
    seen = []

    def choose(kind, fitting, count):
        seen.append((kind, list(fitting), count))
        return [3]

    assert minors(allocate(gpu_node(foreign=[(1, 100)]), {"gpu": 50}, chooser=choose)) == [3]
    assert seen == [("gpu", [0, 2, 3], 1)]  # GPU 1 is fully used, so it does not fit


def test_chooser_may_pass_and_must_answer_within_fitting():
    assert minors(allocate(gpu_node(), {"gpu": 50}, chooser=lambda *_: None)) == [0]
    with pytest.raises(ValueError, match="device chooser returned"):
        allocate(gpu_node(foreign=[(1, 100)]), {"gpu": 50}, chooser=lambda *_: [1])


# What is never given out ----------------------------------------------------------------------------------


def test_foreign_allocation_is_never_given_out():
    assert minors(allocate(gpu_node(2, foreign=[(0, 100)]), {"nvidia.com/gpu": 1})) == [1]
    with pytest.raises(InsufficientDevices, match="insufficient free GPUs"):
        allocate(gpu_node(2, foreign=[(0, 100)]), {"nvidia.com/gpu": 2})


@pytest.mark.parametrize(
    ("builder", "request_", "reason"),
    [
        pytest.param(make_node("n"), {"gpu": 50}, "node has no gpu", id="no-gpu"),
        pytest.param(make_node("n").gpus(2, healthy=False), {"gpu": 50}, "gpu device unhealthy", id="unhealthy-only"),
        pytest.param(
            make_node("n").gpus(2, memory=None), {"gpu": 50}, "GPUs report no gpu-memory", id="ratio-no-memory"
        ),
        pytest.param(
            gpu_node(1, memory="16Gi"),
            {"gpu-core": 10, "gpu-memory": "20Gi"},
            "insufficient gpu-memory on any single GPU",
            id="bytes-too-big",
        ),
        pytest.param(make_node("n").gpus(1), {"rdma": 100}, "node has no rdma", id="no-rdma"),
    ],
)
def test_insufficient_reasons(builder, request_, reason):
    with pytest.raises(InsufficientDevices, match=reason):
        allocate(builder, request_)
