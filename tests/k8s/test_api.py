"""The extender against an in-process API server (tests/k8s/fakeapi.py), through the real kubernetes client:
start-up rebuild, bind (patch, then Binding), 409 handling, expiry, watches with resume and relist on 410."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeapi import FakeAPI
from kubernetes import client

from finesched.k8s import wire
from finesched.k8s.api import KubeAPI
from finesched.k8s.extender import Extender
from finesched.k8s.setup import build_extender
from finesched.k8s.sync import ClusterSync

FIXTURES = Path(__file__).parent / "fixtures"
GPU = {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi", "koordinator.sh/gpu-memory-ratio": "100"}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def k8s_node(name: str) -> dict[str, Any]:
    node = copy.deepcopy(fixture("extender-filter-request.json")["Nodes"]["items"][0])
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return node


def device_cr(name: str) -> dict[str, Any]:
    gpus = [
        {
            "type": "gpu",
            "id": f"GPU-{name}-{m}",
            "minor": m,
            "health": True,
            "resources": GPU,
            "topology": {"nodeID": m},
        }
        for m in (0, 1)
    ]
    return {"metadata": {"name": name}, "spec": {"devices": gpus}}


def nrt(name: str) -> dict[str, Any]:
    detail = [{"id": c, "core": c % 32, "socket": (c % 32) // 16, "node": (c % 32) // 16} for c in range(64)]
    return {
        "metadata": {"name": name, "annotations": {"node.koordinator.sh/cpu-topology": json.dumps({"detail": detail})}},
        "topologyPolicies": ["None"],
        "zones": [{"name": f"node-{i}", "type": "Node", "resources": []} for i in (0, 1)],
    }


def pending_pod(name: str, uid: str) -> dict[str, Any]:
    pod = copy.deepcopy(fixture("extender-filter-request.json")["Pod"])
    pod["metadata"].update(name=name, uid=uid)
    return pod


def foreign_pod(name: str, node: str, minor: int) -> dict[str, Any]:
    """A pod another scheduler bound: a whole GPU recorded in its device-allocated annotation."""
    allocated = {
        "gpu": [
            {"minor": minor, "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}}
        ]
    }
    container = {"name": "c", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"}}}
    return {
        "metadata": {
            "name": name,
            "namespace": "other",
            "uid": f"uid-{name}",
            "annotations": {"scheduling.koordinator.sh/device-allocated": json.dumps(allocated)},
        },
        "spec": {"containers": [container], "nodeName": node, "schedulerName": "koord-scheduler"},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def fake() -> Iterator[FakeAPI]:
    with FakeAPI() as api:
        for name in ("gpu-node-a", "gpu-node-b"):
            api.put("nodes", k8s_node(name))
            api.put("devices", device_cr(name))
            api.put("noderesourcetopologies", nrt(name))
        for minor in (0, 1):
            api.put("pods", foreign_pod(f"busy-{minor}", "gpu-node-b", minor))
        api.put("pods", pending_pod("train-resnet-0", "uid-0"))
        api.put("pods", pending_pod("train-resnet-1", "uid-1"))
        yield api


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def start(fake: FakeAPI, clock: Clock | None = None) -> tuple[Extender, ClusterSync]:
    configuration = client.Configuration()
    configuration.host = fake.url
    api = KubeAPI(client.ApiClient(configuration), request_timeout=5)
    extender = build_extender(binder=api, assume_ttl=30)
    if clock is not None:
        extender.clock = clock
    sync = ClusterSync(extender, api)
    extender.pod_source = sync.pod
    sync.sync_all()
    return extender, sync


def filter_names(extender: Extender, pod: dict[str, Any], names: list[str] | None = None) -> dict[str, Any]:
    args = wire.extender_args({"Pod": pod, "NodeNames": names or ["gpu-node-a", "gpu-node-b"]})
    return extender.filter(args)


def bind(extender: Extender, name: str, uid: str, node: str = "gpu-node-a") -> str:
    return extender.bind(wire.BindingArgs(name, "ml", uid, node))


def test_start_rebuilds_state_and_counts_pods_of_other_schedulers(fake: FakeAPI) -> None:
    extender, sync = start(fake)
    state = extender.state
    assert sorted(state.names) == ["gpu-node-a", "gpu-node-b"]
    assert sorted(state.bindings) == ["other/busy-0", "other/busy-1"]
    assert state.bindings["other/busy-1"].device_minors("gpu") == [1]
    assert all(state.is_committed(k) for k in state.bindings)
    result = filter_names(extender, fake.objects["pods"]["ml/train-resnet-0"])
    assert result["NodeNames"] == ["gpu-node-a"] and list(result["FailedNodes"]) == ["gpu-node-b"]
    state.check_invariants()
    assert sync.waiting == {} and sync.node_problems == {}


def test_bind_patches_the_annotations_then_creates_the_binding(fake: FakeAPI) -> None:
    extender, sync = start(fake)
    fake.calls.clear()
    # bind without a filter first: the Pod comes from the watch cache
    assert bind(extender, "train-resnet-0", "uid-0") == ""
    assert fake.calls == [
        ("PATCH", "/api/v1/namespaces/ml/pods/train-resnet-0"),
        ("POST", "/api/v1/namespaces/ml/pods/train-resnet-0/binding"),
    ]
    pod = fake.objects["pods"]["ml/train-resnet-0"]
    assert pod["spec"]["nodeName"] == "gpu-node-a"
    annotations = pod["metadata"]["annotations"]
    binding = extender.state.bindings["ml/train-resnet-0"]
    assert (
        annotations["scheduling.koordinator.sh/device-allocated"]
        == binding.annotations["scheduling.koordinator.sh/device-allocated"]
    )
    status = json.loads(annotations["scheduling.koordinator.sh/resource-status"])
    assert status["cpuset"] == str(binding.cpuset) and len(binding.cpuset) == 4
    # assumed until the watch shows the pod bound, then committed
    assert not extender.state.is_committed("ml/train-resnet-0") and "ml/train-resnet-0" in extender.pending
    sync.watch_once("pods", timeout_seconds=1)
    assert extender.state.is_committed("ml/train-resnet-0") and extender.pending == {}


def test_a_409_unreserves_and_returns_the_error(fake: FakeAPI) -> None:
    extender, _ = start(fake)
    before = dict(extender.state.bindings)
    fake.fail_bindings = [409]
    error = bind(extender, "train-resnet-0", "uid-0")
    assert "409" in error and "Conflict" in error
    assert extender.state.bindings == before and extender.pending == {}
    extender.state.check_invariants()
    # the annotations written before the failed Binding are taken off again
    annotations = fake.objects["pods"]["ml/train-resnet-0"]["metadata"]["annotations"]
    assert "scheduling.koordinator.sh/device-allocated" not in annotations
    assert "scheduling.koordinator.sh/resource-spec" in annotations
    assert bind(extender, "train-resnet-0", "uid-0") == ""  # kube-scheduler's retry succeeds


def test_a_pod_recreated_under_the_same_name_is_not_bound(fake: FakeAPI) -> None:
    extender, _ = start(fake)
    filter_names(extender, fake.objects["pods"]["ml/train-resnet-0"])  # the extender remembers uid-0's Pod
    fake.delete("pods", "ml/train-resnet-0")
    fake.put("pods", pending_pod("train-resnet-0", "uid-new"))
    error = bind(extender, "train-resnet-0", "uid-0")
    assert "409" in error and "ml/train-resnet-0" not in extender.state.bindings
    assert "nodeName" not in fake.objects["pods"]["ml/train-resnet-0"]["spec"]


def test_a_pod_already_bound_elsewhere_gets_409(fake: FakeAPI) -> None:
    extender, _ = start(fake)
    pod = fake.objects["pods"]["ml/train-resnet-1"]
    pod["spec"]["nodeName"] = "gpu-node-b"  # bound behind the extender's back
    error = bind(extender, "train-resnet-1", "uid-1")
    assert "409" in error and "ml/train-resnet-1" not in extender.state.bindings


def test_assumed_bindings_never_confirmed_expire(fake: FakeAPI) -> None:
    clock = Clock()
    extender, _ = start(fake, clock)
    assert bind(extender, "train-resnet-0", "uid-0") == ""
    clock.now += 29
    assert extender.expire() == [] and "ml/train-resnet-0" in extender.state.bindings
    clock.now += 2
    assert extender.expire() == ["ml/train-resnet-0"]
    assert "ml/train-resnet-0" not in extender.state.bindings and extender.pending == {}


def test_restart_rebuilds_the_same_state_from_the_annotations(fake: FakeAPI) -> None:
    extender, sync = start(fake)
    assert bind(extender, "train-resnet-0", "uid-0") == ""
    assert bind(extender, "train-resnet-1", "uid-1") == ""
    sync.watch_once("pods", timeout_seconds=1)
    assert extender.pending == {}
    restarted, sync2 = start(fake)
    assert sorted(restarted.state.bindings) == sorted(extender.state.bindings)
    for key, old in extender.state.bindings.items():
        new = restarted.state.bindings[key]
        assert (new.node, new.cpuset, new.devices, new.numa, new.requests) == (
            old.node,
            old.cpuset,
            old.devices,
            old.numa,
            old.requests,
        ), key
    assert restarted.state.free.tolist() == extender.state.free.tolist()
    assert sync2.waiting == {}
    restarted.state.check_invariants()


def test_watches_resume_and_relist_after_410(fake: FakeAPI) -> None:
    extender, sync = start(fake)
    fake.put("nodes", k8s_node("gpu-node-c"))
    sync.watch_once("nodes", timeout_seconds=1)
    assert "gpu-node-c" in extender.state.index and sync.versions["nodes"] == str(fake.version)
    fake.compact()  # the history is gone: the next watch gets ERROR 410 and lists again
    fake.put("nodes", k8s_node("gpu-node-d"))
    fake.delete("nodes", "gpu-node-c")
    sync.watch_once("nodes", timeout_seconds=1)
    assert sorted(extender.state.names) == ["gpu-node-a", "gpu-node-b", "gpu-node-d"]
    fake.gone_as_status = True  # the other form: HTTP 410 on the watch request itself
    fake.compact()
    fake.delete("nodes", "gpu-node-d")
    sync.watch_once("nodes", timeout_seconds=1)
    assert sorted(extender.state.names) == ["gpu-node-a", "gpu-node-b"]


def test_pod_events_release_and_count_usage(fake: FakeAPI) -> None:
    extender, sync = start(fake)
    fake.delete("pods", "other/busy-0")
    finished = copy.deepcopy(fake.objects["pods"]["other/busy-1"])
    finished["status"]["phase"] = "Succeeded"
    fake.put("pods", finished)
    newcomer = foreign_pod("busy-2", "gpu-node-a", 1)
    fake.put("pods", newcomer)
    sync.watch_once("pods", timeout_seconds=1)
    assert sorted(extender.state.bindings) == ["other/busy-2"]
    result = filter_names(extender, fake.objects["pods"]["ml/train-resnet-0"])
    assert result["NodeNames"] == ["gpu-node-a", "gpu-node-b"]


def test_bad_objects_affect_only_themselves(fake: FakeAPI) -> None:
    bad = foreign_pod("broken", "gpu-node-a", 0)
    bad["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"] = '{"gpu": 3}'
    fake.put("pods", bad)
    broken_device = device_cr("gpu-node-b")
    broken_device["spec"]["devices"][0]["type"] = "tpu"
    fake.put("devices", broken_device)
    extender, sync = start(fake)
    assert "device-allocated.gpu" in sync.waiting["other/broken"]
    assert "spec.devices[0].type" in sync.node_problems["gpu-node-b"]
    assert sorted(extender.state.names) == ["gpu-node-a"]
    result = filter_names(extender, fake.objects["pods"]["ml/train-resnet-0"])
    assert result["NodeNames"] == ["gpu-node-a"]
    assert "spec.devices[0].type" in result["FailedAndUnresolvableNodes"]["gpu-node-b"]
    # fixing the Device CR brings the node (and the pods bound there) back
    fake.put("devices", device_cr("gpu-node-b"))
    sync.watch_once("devices", timeout_seconds=1)
    assert sorted(extender.state.names) == ["gpu-node-a", "gpu-node-b"] and sync.node_problems == {}
    assert extender.state.bindings["other/busy-0"].node == "gpu-node-b"


def test_kubelet_pinned_cpusets_from_pod_cpu_allocs(fake: FakeAPI) -> None:
    pinned = foreign_pod("pinned", "gpu-node-a", 0)
    pinned["metadata"]["annotations"] = {}
    pinned["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
    fake.put("pods", pinned)
    topology = nrt("gpu-node-a")
    allocs = [{"namespace": "other", "name": "pinned", "uid": "uid-pinned", "cpuset": "2,34", "managedByKubelet": True}]
    topology["metadata"]["annotations"]["node.koordinator.sh/pod-cpu-allocs"] = json.dumps(allocs)
    fake.put("noderesourcetopologies", topology)
    extender, sync = start(fake)
    assert str(extender.state.bindings["other/pinned"].cpuset) == "2,34"
    allocs[0]["cpuset"] = "3,35"  # koordlet reports a new assignment
    topology["metadata"]["annotations"]["node.koordinator.sh/pod-cpu-allocs"] = json.dumps(allocs)
    fake.put("noderesourcetopologies", topology)
    sync.watch_once("noderesourcetopologies", timeout_seconds=1)
    assert str(extender.state.bindings["other/pinned"].cpuset) == "3,35"
    extender.state.check_invariants()
    topology["metadata"]["annotations"]["node.koordinator.sh/pod-cpu-allocs"] = '[{"cpuset": "1"}]'
    fake.put("noderesourcetopologies", topology)
    sync.watch_once("noderesourcetopologies", timeout_seconds=1)
    assert "pod-cpu-allocs: entry [0]" in sync.node_problems["gpu-node-a"]


def test_the_watch_threads_follow_the_cluster_until_stopped(fake: FakeAPI) -> None:
    configuration = client.Configuration()
    configuration.host = fake.url
    api = KubeAPI(client.ApiClient(configuration), request_timeout=5)
    extender = build_extender(binder=api, assume_ttl=30)
    sync = ClusterSync(extender, api)
    sync.start(timeout_seconds=1)
    try:
        fake.put("nodes", k8s_node("gpu-node-c"))
        fake.delete("pods", "other/busy-0")
        for _ in range(100):  # bounded: 10 s
            with extender.lock:
                done = "gpu-node-c" in extender.state.index and "other/busy-0" not in extender.state.bindings
            if done:
                break
            time.sleep(0.1)
        assert done
    finally:
        stopped = sync.close(timeout=10)
    assert stopped
