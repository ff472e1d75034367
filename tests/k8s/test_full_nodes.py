"""nodeCacheCapable: false: nodes the extender does not know are learned from the Node objects sent."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any

with warnings.catch_warnings():  # starlette's TestClient warns about its httpx dependency on import
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from finesched.k8s.app import create_app
from finesched.k8s.setup import extender_from_manifests

FIXTURES = Path(__file__).parent / "fixtures"


def _request() -> dict[str, Any]:
    return json.loads((FIXTURES / "extender-filter-request.json").read_text())


def test_unknown_nodes_are_learned_from_the_request_and_updated_by_resource_version(tmp_path: Path) -> None:
    empty = tmp_path / "none.yaml"
    empty.write_text("")
    extender = extender_from_manifests(empty)  # knows no node at all
    http = TestClient(create_app(extender))
    body = _request()
    answer = http.post("/filter", json=body).json()
    # Both nodes were learned and judged. The fixture Pod (LSR, SingleNUMANode) needs the CPU and
    # NUMA topology a NodeResourceTopology would give; a Node object alone has none, which is said.
    assert set(extender.state.index) == {"gpu-node-a", "gpu-node-b"}
    for reason in answer["FailedAndUnresolvableNodes"].values():
        assert "no NUMA topology" in reason and "no CPU topology" in reason
    # Without the nodes' SingleNUMANode policy label (a new resourceVersion, so they are read again),
    # a plain half-GPU Pod fits on the GPUs the Node objects advertise in their allocatable.
    body = copy.deepcopy(body)
    for item in body["Nodes"]["items"]:
        item["metadata"]["labels"].pop("node.koordinator.sh/numa-topology-policy")
        item["metadata"]["resourceVersion"] += "-1"
    plain = {"metadata": {"name": "p", "namespace": "default", "uid": "u-1"},
             "spec": {"containers": [{"name": "c", "resources": {"requests": {
                 "cpu": "1", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}}}]}}  # fmt: skip
    fits = http.post("/filter", json={**body, "Pod": plain}).json()
    assert [n["metadata"]["name"] for n in fits["Nodes"]["items"]] == ["gpu-node-a", "gpu-node-b"]
    cpu = extender.state.row("cpu")
    assert int(extender.state.allocatable[cpu, extender.state.index["gpu-node-a"]]) == 62_000
    # A new resourceVersion with less cpu updates the learned node; the same version changes nothing.
    changed = copy.deepcopy(body)
    node_a = changed["Nodes"]["items"][0]
    node_a["metadata"]["resourceVersion"] = "917002"  # any new version
    node_a["status"]["allocatable"]["cpu"] = "30"
    http.post("/prioritize", json=changed)
    assert int(extender.state.allocatable[cpu, extender.state.index["gpu-node-a"]]) == 30_000
    node_a["status"]["allocatable"]["cpu"] = "20"  # same version: not read again
    http.post("/filter", json=changed)
    assert int(extender.state.allocatable[cpu, extender.state.index["gpu-node-a"]]) == 30_000


def test_a_node_that_cannot_be_converted_is_unresolvable_with_its_reason(tmp_path: Path) -> None:
    empty = tmp_path / "none.yaml"
    empty.write_text("")
    http = TestClient(create_app(extender_from_manifests(empty)))
    body = _request()
    body["Nodes"]["items"][1]["status"]["allocatable"]["cpu"] = "lots"
    answer = http.post("/filter", json=body).json()
    assert "gpu-node-b" in answer["FailedAndUnresolvableNodes"]
    assert "allocatable" in answer["FailedAndUnresolvableNodes"]["gpu-node-b"]
    assert answer["Error"] == ""


def test_nodes_known_from_the_cluster_file_keep_that_source() -> None:
    extender = extender_from_manifests(Path(__file__).parent / "fixture-cluster.yaml")
    before = extender.state.node("gpu-node-a")
    body = _request()
    body["Nodes"]["items"][0]["status"]["allocatable"]["cpu"] = "2"
    TestClient(create_app(extender)).post("/filter", json=body)
    assert extender.state.node("gpu-node-a") == before
