"""The extender over HTTP with nodes from manifests (``--cluster``): fixture bodies, verbs, bad input."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():  # starlette's TestClient warns about its httpx dependency on import
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from finesched.k8s import wire
from finesched.k8s.app import create_app
from finesched.k8s.extender import Extender
from finesched.k8s.setup import extender_from_manifests

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
CLUSTER = HERE / "fixture-cluster.yaml"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def extender() -> Extender:
    return extender_from_manifests(CLUSTER)


@pytest.fixture
def http(extender: Extender) -> TestClient:
    return TestClient(create_app(extender))


def lowercase_keys(doc: dict[str, Any]) -> dict[str, Any]:
    return {k.lower(): v for k, v in doc.items()}


# Fixture bodies round-trip -----------------------------------------------------------------------------------
def test_filter_response_fixture_round_trips() -> None:
    expected = fixture("extender-filter-response.json")
    args = wire.extender_args(fixture("extender-filter-request-nodecache.json"))
    assert args.names == ["gpu-node-a", "gpu-node-b"] and args.nodes is None
    built = wire.filter_result(args, [0], expected["FailedNodes"], {})
    assert built == expected
    assert json.loads(wire.encode(built)) == expected


def test_full_nodes_request_fixture_parses_and_answers_with_node_objects() -> None:
    doc = fixture("extender-filter-request.json")
    args = wire.extender_args(doc)
    assert args.names == ["gpu-node-a", "gpu-node-b"]
    built = wire.filter_result(args, [1], {}, {})
    assert built["NodeNames"] is None and built["Nodes"] == {"metadata": {}, "items": [doc["Nodes"]["items"][1]]}


def test_prioritize_bind_and_preempt_fixtures_round_trip() -> None:
    prio = fixture("extender-prioritize-response.json")
    assert wire.host_priorities([p["Host"] for p in prio], [p["Score"] for p in prio]) == prio
    bind = wire.binding_args(fixture("extender-bind-request.json"))
    assert (bind.pod_name, bind.namespace, bind.node) == ("train-resnet-0", "ml", "gpu-node-a")
    assert bind.uid == "5f0c3b7e-9a61-4c1e-9a3e-2f1d7c0b8a41"
    pod, victims = wire.preemption_args(fixture("extender-preempt-request.json"))
    assert pod["metadata"]["name"] == "serve-llm-0"
    assert victims["gpu-node-b"].uids == [
        "a1b2c3d4-0000-4e5f-8a9b-112233445566",
        "a1b2c3d4-0000-4e5f-8a9b-112233445577",
    ]
    assert victims["gpu-node-b"].pdb_violations == 1
    assert wire.preemption_result({"gpu-node-a": victims["gpu-node-a"]}) == fixture("extender-preempt-response.json")


def test_keys_match_case_insensitively_as_go_decodes_them() -> None:
    doc = fixture("extender-filter-request-nodecache.json")
    assert wire.extender_args(lowercase_keys(doc)) == wire.extender_args(doc)
    bind = fixture("extender-bind-request.json")
    assert wire.binding_args(lowercase_keys(bind)) == wire.binding_args(bind)


# The verbs over HTTP -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["extender-filter-request.json", "extender-filter-request-nodecache.json"])
def test_filter_fixture_pod_fits_node_a_only(http: TestClient, name: str) -> None:
    request = fixture(name)
    reply = http.post("/filter", json=request)
    assert reply.status_code == 200
    body = reply.json()
    assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert body["Error"] == ""
    if request["NodeNames"] is not None:
        assert body["NodeNames"] == ["gpu-node-a"] and body["Nodes"] is None
    else:
        assert body["NodeNames"] is None and body["Nodes"]["items"] == request["Nodes"]["items"][:1]
    # gpu-node-b's GPUs are taken: freeing them (preemption) could help, so the failure is resolvable.
    assert list(body["FailedNodes"]) == ["gpu-node-b"] and "NUMA" in body["FailedNodes"]["gpu-node-b"]
    assert body["FailedAndUnresolvableNodes"] == {}
    # the same verbs under a urlPrefix path
    assert http.post("/scheduler/filter", json=request).json() == body


def test_prioritize_scores_are_0_to_10_and_rank_the_feasible_node_first(http: TestClient) -> None:
    request = fixture("extender-filter-request-nodecache.json")
    reply = http.post("/prioritize", json=request)
    assert reply.status_code == 200
    scores = {p["Host"]: p["Score"] for p in reply.json()}
    assert set(scores) == {"gpu-node-a", "gpu-node-b"}
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["gpu-node-a"] > scores["gpu-node-b"] == 0


def test_bind_places_the_filtered_pod_with_annotations_and_uses_the_node(http: TestClient, extender: Extender) -> None:
    request = fixture("extender-filter-request-nodecache.json")
    http.post("/filter", json=request)  # the extender learns the Pod here (bind carries names only)
    reply = http.post("/bind", json=fixture("extender-bind-request.json"))
    assert reply.status_code == 200 and reply.json() == fixture("extender-bind-response.json")
    binding = extender.state.bindings["ml/train-resnet-0"]
    assert binding.node == "gpu-node-a" and extender.state.is_committed("ml/train-resnet-0")
    devices = json.loads(binding.annotations["scheduling.koordinator.sh/device-allocated"])
    assert devices == {
        "gpu": [
            {
                "minor": 0,
                "resources": {
                    "koordinator.sh/gpu-core": "50",
                    "koordinator.sh/gpu-memory": "40Gi",
                    "koordinator.sh/gpu-memory-ratio": "50",
                },
            }
        ]
    }
    status = json.loads(binding.annotations["scheduling.koordinator.sh/resource-status"])
    assert status["cpuset"] == "0-1,32-33"  # FullPCPUs: two whole cores on NUMA node 0
    assert status["numaNodeResources"] == [{"node": 0, "resources": {"cpu": "4", "memory": "16Gi"}}]
    # the state changed: a second identical pod gets the other half of GPU 0
    again = copy.deepcopy(request)
    again["Pod"]["metadata"].update(name="train-resnet-1", uid="u-2")
    assert http.post("/filter", json=again).json()["NodeNames"] == ["gpu-node-a"]
    bind = {"PodName": "train-resnet-1", "PodNamespace": "ml", "PodUID": "u-2", "Node": "gpu-node-a"}
    assert http.post("/bind", json=bind).json() == {"Error": ""}
    assert extender.state.bindings["ml/train-resnet-1"].device_minors("gpu") == [0]


def test_bind_errors_come_back_in_the_reply(http: TestClient) -> None:
    unknown = {"PodName": "ghost", "PodNamespace": "ml", "PodUID": "nope", "Node": "gpu-node-a"}
    assert "never filtered" in http.post("/bind", json=unknown).json()["Error"]
    http.post("/filter", json=fixture("extender-filter-request-nodecache.json"))
    wrong = {**fixture("extender-bind-request.json"), "Node": "gpu-node-b"}
    reply = http.post("/bind", json=wrong)
    assert reply.status_code == 200 and "does not fit on gpu-node-b" in reply.json()["Error"]
    assert "PodName must be" in http.post("/bind", json={"Node": "gpu-node-a"}).json()["Error"]


def test_malformed_pod_fails_every_node_with_a_reason_not_a_500(http: TestClient) -> None:
    request = fixture("extender-filter-request-nodecache.json")
    request["Pod"]["metadata"]["annotations"]["scheduling.koordinator.sh/resource-spec"] = (
        '{"preferredCPUBindPolicy":"Fast"}'
    )
    reply = http.post("/filter", json=request)
    assert reply.status_code == 200
    body = reply.json()
    assert body["NodeNames"] == [] and body["FailedNodes"] == {} and body["Error"] == ""
    reasons = body["FailedAndUnresolvableNodes"]
    assert set(reasons) == {"gpu-node-a", "gpu-node-b"}
    assert all("resource-spec" in r and "preferredCPUBindPolicy" in r for r in reasons.values())
    # prioritize answers every node with 0 rather than failing
    assert http.post("/prioritize", json=request).json() == [
        {"Host": "gpu-node-a", "Score": 0},
        {"Host": "gpu-node-b", "Score": 0},
    ]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": "x"}}, "NodeNames": ["gpu-node-a"]}',
    ],
)
def test_garbage_bodies_get_an_error_field_not_a_500(http: TestClient, body: bytes) -> None:
    reply = http.post("/filter", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200
    doc = reply.json()
    assert doc["Error"] or doc["FailedAndUnresolvableNodes"]
    assert doc["NodeNames"] == [] or doc["Nodes"] == {"metadata": {}, "items": []}


def test_unknown_node_is_unresolvable(http: TestClient) -> None:
    request = fixture("extender-filter-request-nodecache.json")
    request["NodeNames"] = ["gpu-node-a", "elsewhere"]
    body = http.post("/filter", json=request).json()
    assert body["NodeNames"] == ["gpu-node-a"]
    assert body["FailedAndUnresolvableNodes"] == {"elsewhere": "node unknown to finesched"}


def test_unresolvable_when_the_node_has_no_gpu_at_all(tmp_path: Path) -> None:
    cluster = tmp_path / "cpu.yaml"
    cluster.write_text(
        "apiVersion: finesched.io/v1alpha1\nkind: Node\nmetadata: {name: cpu-only}\n"
        "spec: {allocatable: {cpu: '64', memory: 256Gi}}\n"
    )
    http = TestClient(create_app(extender_from_manifests(cluster)))
    request = fixture("extender-filter-request-nodecache.json")
    request["NodeNames"] = ["cpu-only"]
    body = http.post("/filter", json=request).json()
    assert body["NodeNames"] == [] and list(body["FailedAndUnresolvableNodes"]) == ["cpu-only"]


def fill_gpu_node_a(http: TestClient) -> list[str]:
    """Bind two whole-GPU pods on gpu-node-a (filtered there first); their UIDs."""
    victims = []
    for k in range(2):
        request = fixture("extender-filter-request-nodecache.json")
        pod = request["Pod"]
        pod["metadata"].update(name=f"victim-{k}", uid=f"victim-uid-{k}", annotations={}, labels={})
        for part in ("requests", "limits"):
            pod["spec"]["containers"][0]["resources"][part] = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
        assert http.post("/filter", json=request).json()["NodeNames"] == ["gpu-node-a"]
        bind = {"PodName": f"victim-{k}", "PodNamespace": "ml", "PodUID": f"victim-uid-{k}", "Node": "gpu-node-a"}
        assert http.post("/bind", json=bind).json() == {"Error": ""}
        victims.append(f"victim-uid-{k}")
    return victims


def test_preempt_keeps_nodes_where_the_pod_fits_once_victims_are_gone(http: TestClient, extender: Extender) -> None:
    # Fill gpu-node-a's two GPUs with two whole-GPU pods, then preempt for the fixture's pod.
    victims = fill_gpu_node_a(http)
    request = fixture("extender-preempt-request.json")
    assert http.post("/filter", json={"Pod": request["Pod"], "NodeNames": ["gpu-node-a"]}).json()["NodeNames"] == []
    request["NodeNameToMetaVictims"]["gpu-node-a"]["Pods"] = [{"UID": victims[0]}]
    before = dict(extender.state.bindings)
    reply = http.post("/preempt", json=request)
    assert reply.status_code == 200
    # gpu-node-a fits once victim-0 is gone; gpu-node-b's GPUs are held outside finesched: dropped.
    assert reply.json() == {
        "NodeNameToMetaVictims": {"gpu-node-a": {"Pods": [{"UID": victims[0]}], "NumPDBViolations": 0}}
    }
    assert extender.state.bindings == before  # the check put the victims back
    extender.state.check_invariants()


def test_preempt_reprieves_the_victims_that_are_not_needed(http: TestClient, extender: Extender) -> None:
    # Two whole-GPU pods fill gpu-node-a; kube-scheduler offers both as victims, but the preemptor
    # needs one GPU: one is reprieved (equal priority: the first considered), one goes.
    victims = fill_gpu_node_a(http)
    request = fixture("extender-preempt-request.json")
    request["NodeNameToMetaVictims"] = {"gpu-node-a": {"Pods": [{"UID": u} for u in victims], "NumPDBViolations": 0}}
    reply = http.post("/preempt", json=request).json()
    assert reply == {"NodeNameToMetaVictims": {"gpu-node-a": {"Pods": [{"UID": victims[1]}], "NumPDBViolations": 0}}}
    extender.state.check_invariants()


def test_preempt_reads_full_victim_pods_and_answers_with_uids() -> None:
    request = fixture("extender-preempt-request.json")
    full = {
        node: {"Pods": [{"metadata": {"uid": p["UID"], "name": "v"}} for p in v["Pods"]], "NumPDBViolations": 0}
        for node, v in request["NodeNameToMetaVictims"].items()
    }
    request.update(NodeNameToMetaVictims=None, NodeNameToVictims=full)
    _, victims = wire.preemption_args(request)
    assert victims["gpu-node-a"].uids == ["9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"]
    result = wire.preemption_result(victims)
    assert set(result) == {"NodeNameToMetaVictims"} and len(result["NodeNameToMetaVictims"]["gpu-node-b"]["Pods"]) == 2
