"""GPU partition tables through the extender, end to end: a Koordinator Device carrying
``scheduling.koordinator.sh/gpu-partitions`` and the policy label, a pod carrying
``scheduling.koordinator.sh/gpu-partition-spec``; filter, prioritize and bind over HTTP honour them
(PROTOCOLS.md section 2; Koordinator proposal 20241008-gpu-partition-api)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

with warnings.catch_warnings():  # starlette's TestClient warns about its httpx dependency on import
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from finesched.k8s.app import create_app
from finesched.k8s.convert import PodError, pod_workload
from finesched.k8s.extender import Extender
from finesched.k8s.nodes import NodeError, node_from_k8s
from finesched.k8s.setup import build_extender
from finesched.model.binding import Binding, DeviceGrant

PARTITIONS = "scheduling.koordinator.sh/gpu-partitions"
POLICY = "node.koordinator.sh/gpu-partition-policy"
SPEC = "scheduling.koordinator.sh/gpu-partition-spec"
ALLOCATED = "scheduling.koordinator.sh/device-allocated"

#: Four GPUs: NVLink pairs 0-1 and 2-3 (score 1), a slower cross pair 1-2 (score 0), the four.
TABLE = {
    "2": [
        {"minors": [0, 1], "gpuLinkType": "NVLink", "ringBusBandwidth": "400Gi", "allocationScore": 1},
        {"minors": [2, 3], "gpuLinkType": "NVLink", "ringBusBandwidth": "400Gi", "allocationScore": 1},
        {"minors": [1, 2], "gpuLinkType": "NVLink", "ringBusBandwidth": "100Gi", "allocationScore": 0},
    ],
    "4": [{"minors": [0, 1, 2, 3], "gpuLinkType": "NVLink", "ringBusBandwidth": "400Gi", "allocationScore": 1}],
}


def k8s_node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": labels or {}}, "status": {"allocatable": allocatable}}


def device_cr(name: str, table: Any = TABLE, policy: str | None = "Honor") -> dict[str, Any]:
    gpus = [
        {
            "type": "gpu",
            "id": f"GPU-{name}-{m}",
            "minor": m,
            "health": True,
            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                          "koordinator.sh/gpu-memory-ratio": "100"},
            "topology": {"socketID": 0, "nodeID": 0, "pcieID": f"pci{m // 2}"},
        }
        for m in range(4)
    ]  # fmt: skip
    meta: dict[str, Any] = {"name": name}
    if table is not None:
        meta["annotations"] = {PARTITIONS: json.dumps(table)}
    if policy is not None:
        meta["labels"] = {POLICY: policy}
    return {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device", "metadata": meta,
            "spec": {"devices": gpus}}  # fmt: skip


def pod(name: str, gpus: int, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    limits = {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": str(gpus)}
    annotations = {SPEC: json.dumps(spec)} if spec is not None else {}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"requests": limits, "limits": limits}}]},
    }


@pytest.fixture
def extender() -> Extender:
    return build_extender(
        [
            node_from_k8s(k8s_node("honor"), device_cr("honor")),
            node_from_k8s(k8s_node("prefer"), device_cr("prefer", policy="Prefer")),
            node_from_k8s(k8s_node("plain"), device_cr("plain", table=None, policy=None)),
        ]
    )


@pytest.fixture
def http(extender: Extender) -> TestClient:
    return TestClient(create_app(extender))


NODES = ["honor", "prefer", "plain"]


def filter_body(http: TestClient, doc: dict[str, Any], nodes: list[str] = NODES) -> dict[str, Any]:
    reply = http.post("/filter", json={"Pod": doc, "NodeNames": nodes, "Nodes": None})
    assert reply.status_code == 200
    return reply.json()


def bind(http: TestClient, name: str, node: str) -> None:
    body = {"PodName": name, "PodNamespace": "ml", "PodUID": f"uid-{name}", "Node": node}
    assert http.post("/bind", json=body).json() == {"Error": ""}


def minors(extender: Extender, name: str) -> list[int]:
    annotation = json.loads(extender.state.bindings[f"ml/{name}"].annotations[ALLOCATED])
    return [g["minor"] for g in annotation["gpu"]]


def test_device_annotation_and_label_become_the_node_table_and_policy() -> None:
    node = node_from_k8s(k8s_node("n"), device_cr("n"))
    assert node.partition_policy == "Honor"
    assert [p.minors for p in node.gpu_partitions[2]] == [(0, 1), (2, 3), (1, 2)]
    assert node.gpu_partitions[2][2].ring_bus_bandwidth == 100 * 2**30
    # the Node's own label wins over the Device's
    assert node_from_k8s(k8s_node("n", {POLICY: "Prefer"}), device_cr("n")).partition_policy == "Prefer"


@pytest.mark.parametrize(
    ("table", "policy", "match"),
    [
        ({"2": [{"minors": [0, 7]}]}, "Honor", r"gpuPartitions\.2\.0\.minors.*no shareable GPU has minor\(s\) \[7\]"),
        ({"2": [{"minors": [0]}]}, "Honor", r"gpuPartitions\.2\.0\.minors.*1 minors under key 2"),
        (TABLE, "Always", r"policies\.gpuPartitionPolicy"),
        ("[1]", "Honor", r"gpu-partitions: expected a JSON dict"),
    ],
)
def test_bad_device_partitions_name_the_field(table: Any, policy: str, match: str) -> None:
    doc = device_cr("n", table=None, policy=policy)
    doc["metadata"]["annotations"] = {PARTITIONS: table if isinstance(table, str) else json.dumps(table)}
    with pytest.raises(NodeError, match=match):
        node_from_k8s(k8s_node("n"), doc)


def test_pod_annotation_becomes_the_workload_spec() -> None:
    spec = pod_workload(pod("p", 2, {"allocatePolicy": "Restricted", "ringBusBandwidth": "200Gi"})).gpu_partition_spec
    assert spec is not None and spec.allocate_policy == "Restricted" and spec.ring_bus_bandwidth == 200 * 2**30
    assert pod_workload(pod("p", 2, {"allocatePolicy": ""})).gpu_partition_spec.allocate_policy == "BestEffort"
    with pytest.raises(PodError, match=r"gpu-partition-spec: field allocatePolicy: 'Strict' is not one of"):
        pod_workload(pod("p", 2, {"allocatePolicy": "Strict"}))
    with pytest.raises(PodError, match=r"gpu-partition-spec: unknown field 'bandwidth'"):
        pod_workload(pod("p", 2, {"bandwidth": "1Gi"}))


def occupy(extender: Extender, node: str, *gpus: int) -> None:
    """A pod another scheduler placed, holding a share of each of `gpus` (read back like Koordinator's)."""
    shares = {"gpu-core": 10, "gpu-memory-ratio": 10, "gpu-memory": 8 * 2**30}
    grants = [DeviceGrant(minor=m, resources=shares) for m in gpus]
    extender.state.assume(Binding(workload=f"other/{node}", node=node, devices={"gpu": grants}))


def test_filter_prioritize_and_bind_keep_to_the_partitions(http: TestClient, extender: Extender) -> None:
    first = filter_body(http, pod("a", 2))
    assert sorted(first["NodeNames"]) == sorted(NODES)
    bind(http, "a", "honor")
    assert minors(extender, "a") == [0, 1]  # the lowest of the equal NVLink pairs
    for node in ("prefer", "plain"):
        occupy(extender, node, 1, 3)  # GPUs 0 and 2 are free: two GPUs, but no partition of them
    body = filter_body(http, pod("b", 2))
    assert sorted(body["NodeNames"]) == ["honor", "plain", "prefer"]
    occupy(extender, "honor", 2)
    body = filter_body(http, pod("b", 2))
    assert body["FailedNodes"]["honor"] == "insufficient free GPUs (DeviceShare)"
    assert sorted(body["NodeNames"]) == ["plain", "prefer"]
    scores = http.post("/prioritize", json={"Pod": pod("b", 2), "NodeNames": body["NodeNames"], "Nodes": None})
    assert scores.status_code == 200 and {h["Host"] for h in scores.json()} == {"plain", "prefer"}
    bind(http, "b", "prefer")  # Prefer: no free partition, so the ordinary choice
    assert minors(extender, "b") == [0, 2]


def test_honor_refuses_two_free_gpus_that_are_no_partition(http: TestClient, extender: Extender) -> None:
    three = filter_body(http, pod("d", 3), ["honor", "prefer"])
    assert three["NodeNames"] == ["prefer"]
    assert three["FailedAndUnresolvableNodes"]["honor"] == (
        "GPU partition table has no 3-GPU partition (gpu-partition-policy Honor) (DeviceShare)"
    )
    occupy(extender, "honor", 1, 3)
    body = filter_body(http, pod("c", 2), ["honor"])
    assert body["NodeNames"] == []
    assert body["FailedNodes"]["honor"] == "no free 2-GPU partition (gpu-partition-policy Honor) (DeviceShare)"


def test_restricted_spec_over_http(http: TestClient, extender: Extender) -> None:
    for name in ("x", "y"):  # both score-1 pairs on honor
        assert "honor" in filter_body(http, pod(name, 2), ["honor"])["NodeNames"]
        bind(http, name, "honor")
    assert sorted([minors(extender, "x"), minors(extender, "y")]) == [[0, 1], [2, 3]]
    occupy(extender, "prefer", 0, 3)  # prefer: only the score-0 cross pair 1-2 is free
    restricted = filter_body(http, pod("r", 2, {"allocatePolicy": "Restricted"}), ["prefer", "plain"])
    assert restricted["NodeNames"] == []
    assert restricted["FailedNodes"]["prefer"] == (
        "no free 2-GPU partition (gpu-partition-spec allocatePolicy Restricted) (DeviceShare)"
    )
    assert restricted["FailedAndUnresolvableNodes"]["plain"] == (
        "node has no GPU partition table (gpu-partition-spec allocatePolicy Restricted) (DeviceShare)"
    )
    fast = filter_body(http, pod("f", 2, {"ringBusBandwidth": "200Gi"}), ["prefer"])  # the cross pair has 100Gi
    assert fast["FailedNodes"]["prefer"].startswith("no free 2-GPU partition (gpu-partition-spec allocatePolicy")
    best = filter_body(http, pod("e", 2, {"allocatePolicy": "BestEffort"}), ["prefer", "plain"])
    assert best["NodeNames"] == ["prefer"]
    bind(http, "e", "prefer")
    assert minors(extender, "e") == [1, 2]
