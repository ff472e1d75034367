"""The device-allocate-hint annotation through the extender: Device CR labels become device labels, the
annotation becomes the Workload's deviceAllocateHint, and filter/bind honour it."""

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

HINT = "scheduling.koordinator.sh/device-allocate-hint"
ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def k8s_node(name: str) -> dict[str, Any]:
    allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {}}, "status": {"allocatable": allocatable}}


def device_cr(name: str, roles: list[str | None], pcie: list[str]) -> dict[str, Any]:
    nics = []
    for minor, (role, switch) in enumerate(zip(roles, pcie, strict=True)):
        nic: dict[str, Any] = {
            "type": "rdma",
            "minor": minor,
            "health": True,
            "resources": {"koordinator.sh/rdma": "100"},
            "topology": {"pcieID": switch, "nodeID": 0},
        }
        if role is not None:
            nic["labels"] = {"role": role}
        nics.append(nic)
    return {"metadata": {"name": name}, "spec": {"devices": nics}}


def pod(name: str, hint: Any, rdma: str = "2") -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi", "koordinator.sh/rdma": rdma}
    annotations = {HINT: json.dumps(hint)} if hint is not None else {}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"requests": requests, "limits": requests}}]},
    }


@pytest.fixture
def extender() -> Extender:
    nodes = [
        node_from_k8s(k8s_node("node-a"), device_cr("node-a", ["compute", "storage"], ["p0", "p0"])),
        node_from_k8s(k8s_node("node-b"), device_cr("node-b", ["storage", "storage", None], ["p0", "p0", "p1"])),
    ]
    return build_extender(nodes)


@pytest.fixture
def http(extender: Extender) -> TestClient:
    return TestClient(create_app(extender))


STORAGE_PAIR = {"rdma": {"selector": {"matchLabels": {"role": "storage"}}, "allocateStrategy": "RequestsAsCount"}}


def filter_body(http: TestClient, doc: dict[str, Any]) -> dict[str, Any]:
    reply = http.post("/filter", json={"Pod": doc, "NodeNames": ["node-a", "node-b"], "Nodes": None})
    assert reply.status_code == 200
    return reply.json()


def test_device_cr_labels_become_device_labels() -> None:
    node = node_from_k8s(k8s_node("n"), device_cr("n", ["storage", None], ["p0", "p1"]))
    assert [d.labels for d in node.devices] == [{"role": "storage"}, {}]
    bad = device_cr("n", ["storage"], ["p0"])
    bad["spec"]["devices"][0]["labels"] = {"role": 1}
    with pytest.raises(NodeError, match=r"spec\.devices\[0\]\.labels"):
        node_from_k8s(k8s_node("n"), bad)


def test_annotation_becomes_the_workload_hint() -> None:
    workload = pod_workload(pod("p", {"rdma": {**STORAGE_PAIR["rdma"], "vfSelector": {}, "exclusivePolicy": ""}}))
    hint = workload.device_allocate_hint["rdma"]
    assert hint.allocate_strategy == "RequestsAsCount" and hint.selector.match_labels == {"role": "storage"}
    assert hint.exclusive_policy is None  # Go's "" means unset
    with pytest.raises(PodError, match=r"device-allocate-hint: field rdma\.vfSelector"):
        pod_workload(pod("p", {"rdma": {"vfSelector": {"matchLabels": {"pf": "0"}}}}))
    with pytest.raises(PodError, match=r"field rdma\.selector\.matchExpressions\.0\.operator"):
        pod_workload(pod("p", {"rdma": {"selector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}}))


def test_filter_and_bind_follow_the_hint(http: TestClient) -> None:
    body = filter_body(http, pod("train-0", STORAGE_PAIR))
    assert body["NodeNames"] == ["node-b"] and body["Error"] == ""
    # only one storage NIC on node-a, even idle: no eviction helps there (unresolvable)
    assert "deviceAllocateHint rdma" in body["FailedAndUnresolvableNodes"]["node-a"]
    bind = {"PodName": "train-0", "PodNamespace": "ml", "PodUID": "uid-train-0", "Node": "node-b"}
    assert http.post("/bind", json=bind).json() == {"Error": ""}
    # a second pod of the same shape finds no two storage NICs anywhere now
    body = filter_body(http, pod("train-1", STORAGE_PAIR))
    assert body["NodeNames"] == []
    assert body["FailedNodes"] == {
        "node-b": "insufficient free rdma devices (DeviceShare)",  # one NIC (unlabelled) is left
    }
    assert body["FailedAndUnresolvableNodes"] == {
        "node-a": "deviceAllocateHint rdma: 1 matching free rdma devices, needs 2 (DeviceShare)",
    }


def test_bound_devices_are_the_selected_ones(http: TestClient, extender: Extender) -> None:
    filter_body(http, pod("train-0", STORAGE_PAIR))
    http.post("/bind", json={"PodName": "train-0", "PodNamespace": "ml", "PodUID": "uid-train-0", "Node": "node-b"})
    devices = json.loads(extender.state.bindings["ml/train-0"].annotations[ALLOCATED])
    assert [d["minor"] for d in devices["rdma"]] == [0, 1]


def test_exclusive_pcie_level_and_invalid_hint_over_http(http: TestClient) -> None:
    exclusive = {"rdma": {"exclusivePolicy": "PCIeLevel"}}
    body = filter_body(http, pod("x", exclusive, rdma="100"))
    assert sorted(body["NodeNames"]) == ["node-a", "node-b"]
    bad = filter_body(http, pod("bad", {"rdma": {"allocateStrategy": "Everything"}}, rdma="100"))
    assert bad["NodeNames"] == [] and set(bad["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}
    assert all("allocateStrategy" in r for r in bad["FailedAndUnresolvableNodes"].values())
