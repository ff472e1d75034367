"""The fused device path (plugins/deviceshare/fused.py) decides exactly as the generic plugin path.

Two schedulers over copies of one random device cluster, one with the fused path and one without
(`Scheduler(fused=False)`), take the same random stream of device and scalar requests: every
decision must be the same node, score, device grants and annotations (ties included), and a
request that fits nowhere the same FitError. Releases now and then bring nodes back; the stream
repeats shapes, so the memo's patched subsets are compared as well as whole-cluster evaluations.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finesched import Scheduler
from finesched.model.mig import mig_resource
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.deviceshare.fused import FusedDevice
from finesched.plugins.node_unschedulable import UNSCHEDULABLE_LABEL
from finesched.state.cluster import ClusterState
from fused_equivalence import assert_decide_alike, decision
from test_fused_devices_filter import REQUESTS, nodes
from test_mig_properties import PROFILES as MIG_PROFILES
from test_mig_properties import mig_nodes

PROFILES: dict[str, Any] = {
    "default": "default",
    "spread": "spread",
    "devices-bench": {
        "name": "bench",
        "plugins": [
            {"name": n} for n in ("NodeSelector", "ResourcesFit", "DeviceShare", "LeastRequested", "MostBalanced")
        ],
    },
    "weighted-random-ties": {
        "name": "weighted",
        "plugins": [
            {"name": "NodeUnschedulable"},
            {"name": "DeviceShare", "args": {"strategy": "MostAllocated"}},  # pre_score before ResourcesFit
            {"name": "ResourcesFit"},
            {"name": "MostAllocated", "weight": 2},
            {"name": "MostBalanced", "weight": 3},
            {"name": "LeastRequested", "weight": 0},
        ],
        "tieBreak": "random",
        "seed": 5,
    },
}
#: Device requests (test_fused_devices_filter.REQUESTS) and two scalar ones (the scalar fused path).
SCALAR: list[dict[str, Any]] = [{"cpu": "2", "memory": "4Gi"}, {"cpu": "500m"}]


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    """Device nodes of uneven cpu and memory, some cordoned (NodeUnschedulable's label)."""
    out = []
    for k in range(draw(st.integers(1, 6))):
        node = draw(nodes(f"n{k}"))
        update: dict[str, Any] = {
            # small and even amounts: requests often fill a node exactly (the fit's boundary)
            "allocatable": {
                "cpu": str(draw(st.sampled_from([2, 4, 8, 64]))),
                "memory": f"{draw(st.sampled_from([4, 8, 64]))}Gi",
            }
        }
        if draw(st.integers(0, 5)) == 0:
            update["labels"] = {UNSCHEDULABLE_LABEL: "yes"}
        out.append(Node.model_validate({**node.model_dump(by_alias=True, exclude_none=True), **update}))
    return out


def _workload(i: int, pick: int, cpu: str) -> Workload:
    if pick >= len(REQUESTS):
        return Workload.model_validate({"name": f"w{i}", "requests": SCALAR[pick - len(REQUESTS)]})
    requests, scope = REQUESTS[pick]
    data: dict[str, Any] = {"name": f"w{i}", "requests": {"cpu": cpu, "memory": f"{int(cpu)}Gi", **requests}}
    if scope is not None:
        data["deviceJointAllocate"] = {"deviceTypes": ["gpu", "rdma"], "requiredScope": scope}
    return Workload.model_validate(data)


@pytest.mark.parametrize("profile", sorted(PROFILES))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=clusters(),
    stream=st.lists(
        st.tuples(st.integers(0, len(REQUESTS) + len(SCALAR) - 1), st.sampled_from(["1", "2", "4", "16"])),
        min_size=1,
        max_size=30,
    ),
)
def test_fused_device_path_decides_as_the_generic_path(
    profile: str, cluster: list[Node], stream: list[tuple[int, str]]
) -> None:
    fused = Scheduler(ClusterState.from_nodes(cluster), PROFILES[profile])
    generic = Scheduler(ClusterState.from_nodes(cluster), PROFILES[profile], fused=False)
    assert isinstance(fused._fused, FusedDevice) and generic._fused is None  # the two paths really differ
    assert_decide_alike(
        fused, generic, (_workload(i, pick, cpu) for i, (pick, cpu) in enumerate(stream)), release_every=5
    )


def test_profiles_the_fused_device_path_does_not_cover() -> None:
    node = {"name": "n0", "allocatable": {"cpu": "8"}, "devices": [{"type": "gpu", "minor": 0}]}
    state = ClusterState.from_nodes([Node.model_validate(node)])
    assert not isinstance(Scheduler(state, "binpack")._fused, FusedDevice)  # DeviceScore: not a share scorer
    assert isinstance(Scheduler(state, "default")._fused, FusedDevice)


def test_a_wrong_fused_device_total_is_caught() -> None:
    """The comparison above can fail: a fused path that leaves out the scalar shares scores otherwise."""
    node = Node.model_validate(
        {
            "name": "n0",
            "allocatable": {"cpu": "8", "memory": "16Gi"},
            "devices": [
                {"type": "gpu", "minor": m, "resources": {"gpu-core": 100, "gpu-memory-ratio": 100}} for m in range(2)
            ],
        }
    )
    fused = Scheduler(ClusterState.from_nodes([node]), "default")
    generic = Scheduler(ClusterState.from_nodes([node]), "default", fused=False)
    assert isinstance(fused._fused, FusedDevice)
    fused._fused._fit = None  # planted bug: ResourcesFit's shares left out
    w = Workload.model_validate({"name": "w", "requests": {"cpu": "6", "memory": "1Gi", "nvidia.com/gpu": 1}})
    assert decision(fused, w) != decision(generic, w)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ids=st.lists(st.integers(0, 10**6), min_size=1, max_size=4, unique=True),
    stream=st.lists(st.tuples(st.sampled_from(MIG_PROFILES), st.sampled_from([1, 1, 2])), min_size=1, max_size=20),
    data=st.data(),
)
def test_fused_device_path_decides_as_the_generic_path_on_mig_cards(
    ids: list[int], stream: list[tuple[str, int]], data: st.DataObject
) -> None:
    """MIG instances join the filter (mig_mask) and the shares (mig_share) on the fused path too."""
    cluster = [data.draw(mig_nodes(f"n{k}")) for k in ids]
    fused = Scheduler(ClusterState.from_nodes(cluster), "default")
    generic = Scheduler(ClusterState.from_nodes(cluster), "default", fused=False)
    assert isinstance(fused._fused, FusedDevice)
    workloads = (
        Workload.model_validate({"name": f"w{i}", "requests": {"cpu": "1", mig_resource(profile): count}})
        for i, (profile, count) in enumerate(stream)
    )
    assert_decide_alike(fused, generic, workloads, release_every=4)
