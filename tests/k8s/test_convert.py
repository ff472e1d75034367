"""Pods, Nodes, Device CRs and NodeResourceTopologies converted to finesched models (k8s/convert.py, k8s/nodes.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from finesched.cpuset import CPUSet
from finesched.k8s.convert import PodError, k8s_qos_class, pod_binding, pod_workload
from finesched.k8s.extender import binding_annotations
from finesched.k8s.nodes import NODE_NAME_LABEL, NodeError, node_from_k8s
from finesched.model.binding import Binding, DeviceGrant, NUMAGrant
from finesched.model.resources import ResourceVector

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def pod(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"containers": containers, **spec}}


def res(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}
    return {"name": "c", "resources": resources, **extra}


def test_fixture_pod_becomes_its_workload() -> None:
    w = pod_workload(fixture("extender-filter-request.json")["Pod"])
    assert w.key == "ml/train-resnet-0" and w.tenant == "ml" and w.qos == "LSR"
    assert w.requests == {"cpu": 4000, "memory": 16 << 30, "gpu-core": 50, "gpu-memory-ratio": 50}
    assert w.limits == w.requests
    assert w.resource_spec.preferred_cpu_bind_policy == "FullPCPUs"
    assert w.numa_topology_policy == "SingleNUMANode"


def test_requests_sum_containers_take_init_max_with_sidecars_and_add_overhead() -> None:
    p = pod(
        [res({"cpu": "1"}), res({"cpu": "2", "memory": "1Gi"})],
        initContainers=[res({"cpu": "500m"}, restartPolicy="Always"), res({"cpu": "4", "memory": "512Mi"})],
        overhead={"cpu": "250m", "memory": "64Mi"},
    )
    w = pod_workload(p)
    # regular 3 + sidecar 0.5 = 3.5; the init container runs beside the sidecar: 4 + 0.5 = 4.5 wins.
    assert w.requests["cpu"] == 4500 + 250
    assert w.requests["memory"] == (1 << 30) + (64 << 20)


def test_qos_class_per_container_and_label_override() -> None:
    assert k8s_qos_class(pod([res()])["spec"]) == "BestEffort"
    guaranteed = [
        res({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}),
        res(None, {"cpu": "2", "memory": "2Gi"}),
    ]
    assert k8s_qos_class(pod(guaranteed)["spec"]) == "Guaranteed"
    assert k8s_qos_class(pod([*guaranteed, res({"cpu": "1"})])["spec"]) == "Burstable"
    assert pod_workload(pod([res()])).qos == "BE"
    labelled = pod(guaranteed)
    labelled["metadata"]["labels"] = {"koordinator.sh/qosClass": "LSE"}
    assert pod_workload(labelled).qos == "LSE"


@pytest.mark.parametrize(
    ("annotations", "labels", "expected"),
    [
        ({"scheduling.koordinator.sh/resource-spec": "{nope"}, {}, "resource-spec: not JSON"),
        ({"scheduling.koordinator.sh/resource-spec": "[1]"}, {}, "resource-spec: expected a JSON object"),
        (
            {"scheduling.koordinator.sh/resource-spec": '{"preferedCPUBindPolicy":"FullPCPUs"}'},
            {},
            "unknown field 'preferedCPUBindPolicy'",
        ),
        (
            {"scheduling.koordinator.sh/resource-spec": '{"preferredCPUBindPolicy":"Full"}'},
            {},
            "field preferredCPUBindPolicy: 'Full'",
        ),
        (
            {"scheduling.koordinator.sh/numa-topology-spec": '{"numaTopologyPolicy":"Single"}'},
            {},
            "field numaTopologyPolicy",
        ),
        ({"scheduling.koordinator.sh/device-joint-allocate": '{"deviceTypes":["gpu"]}'}, {}, "field deviceTypes"),
        (
            {"scheduling.koordinator.sh/device-joint-allocate": '{"deviceTypes":["gpu","rdma"],"requiredScope":"x"}'},
            {},
            "field requiredScope",
        ),
        (
            {"scheduling.koordinator.sh/device-allocate-hint": '{"gpu":{"requiredTopologyScope":"Rack"}}'},
            {},
            "field requiredTopologyScope",
        ),
        ({"scheduling.koordinator.sh/device-allocate-hint": '{"gpu":{"colour":"red"}}'}, {}, "unknown field 'colour'"),
        ({}, {"koordinator.sh/qosClass": "Gold"}, "label koordinator.sh/qosClass: 'Gold'"),
    ],
)
def test_malformed_annotations_name_the_annotation_and_field(
    annotations: dict[str, str], labels: dict[str, str], expected: str
) -> None:
    p = pod([res({"cpu": "1"})])
    p["metadata"].update(annotations=annotations, labels=labels)
    with pytest.raises(PodError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        pod_workload(p)


def test_bad_quantity_and_bad_shape_name_the_field_path() -> None:
    with pytest.raises(PodError, match=r"spec\.containers\[0\]\.resources\.requests\.cpu"):
        pod_workload(pod([res({"cpu": "lots"})]))
    with pytest.raises(PodError, match=r"spec\.initContainers\[0\]\.resources\.limits"):
        pod_workload(pod([res()], initContainers=[{"name": "i", "resources": {"limits": ["cpu"]}}]))
    with pytest.raises(PodError, match=r"metadata\.name"):
        pod_workload({"metadata": {}, "spec": {}})
    with pytest.raises(PodError, match="LSR needs whole CPUs"):
        bad = pod([res({"cpu": "1500m"}, {"cpu": "1500m"})])
        bad["metadata"]["labels"] = {"koordinator.sh/qosClass": "LSR"}
        pod_workload(bad)


def test_known_annotations_become_typed_fields() -> None:
    p = pod([res({"cpu": "2"}, {"cpu": "2"})])
    p["metadata"]["annotations"] = {
        "scheduling.koordinator.sh/resource-spec": json.dumps(
            {"requiredCPUBindPolicy": "SpreadByPCPUs", "preferredCPUExclusivePolicy": "PCPULevel"}
        ),
        "scheduling.koordinator.sh/device-joint-allocate": '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
        "scheduling.koordinator.sh/numa-topology-spec": '{"numaTopologyPolicy":""}',
        "some.other/annotation": "left alone",
    }
    w = pod_workload(p)
    assert w.resource_spec.required_cpu_bind_policy == "SpreadByPCPUs"
    assert w.resource_spec.preferred_cpu_exclusive_policy == "PCPULevel"
    assert w.device_joint_allocate is not None and w.device_joint_allocate.device_types == ("gpu", "rdma")
    assert w.numa_topology_policy is None  # "" means unset, as in Koordinator


def test_bound_pod_becomes_the_binding_its_annotations_record() -> None:
    p = copy.deepcopy(fixture("extender-filter-request.json")["Pod"])
    p["spec"]["nodeName"] = "gpu-node-a"
    original = Binding(
        workload="ml/train-resnet-0",
        node="gpu-node-a",
        cpuset=CPUSet("0-1,32-33"),
        numa=(NUMAGrant(numa=0, resources=ResourceVector({"cpu": 4000, "memory": 16 << 30})),),
        devices={"gpu": [DeviceGrant(minor=1, resources=ResourceVector({"gpu-core": 50, "gpu-memory-ratio": 50}))]},
        annotations={
            "scheduling.koordinator.sh/resource-status": json.dumps(
                {"cpuset": "0-1,32-33", "numaNodeResources": [{"node": 0, "resources": {"cpu": "4", "memory": "16Gi"}}]}
            )
        },
    )
    p["metadata"]["annotations"].update(binding_annotations(original))
    b = pod_binding(p, lambda name: name.startswith("gpu"))
    assert b.node == "gpu-node-a" and b.workload == "ml/train-resnet-0" and b.qos == "LSR"
    assert b.requests == {"cpu": 4000, "memory": 16 << 30, "pods": 1}
    assert b.cpuset == original.cpuset and b.numa == original.numa and b.devices == original.devices
    assert binding_annotations(b) == binding_annotations(original)  # the annotations round-trip


def test_bound_pod_with_a_bad_annotation_is_refused_with_its_name() -> None:
    p = pod([res({"cpu": "1"})], nodeName="n1")
    p["metadata"]["annotations"] = {"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":-1}]}'}
    with pytest.raises(PodError, match=r"device-allocated\.gpu\[0\]\.minor"):
        pod_binding(p, lambda _: False)
    p["metadata"]["annotations"] = {"scheduling.koordinator.sh/resource-status": '{"cpuset":"3-1"}'}
    with pytest.raises(PodError, match="resource-status: field cpuset"):
        pod_binding(p, lambda _: False)


def _device_cr(name: str) -> dict[str, Any]:
    gpu = {
        "koordinator.sh/gpu-core": "100",
        "koordinator.sh/gpu-memory": "80Gi",
        "koordinator.sh/gpu-memory-ratio": "100",
    }
    return {
        "metadata": {"name": name},
        "spec": {
            "devices": [
                {
                    "type": "gpu",
                    "id": "GPU-0",
                    "minor": 0,
                    "health": True,
                    "resources": gpu,
                    "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:3a"},
                },
                {
                    "type": "gpu",
                    "id": "GPU-1",
                    "minor": 1,
                    "health": False,
                    "resources": gpu,
                    "topology": {"socketID": 1, "nodeID": 1, "pcieID": "pci0000:8a"},
                },
                {
                    "type": "rdma",
                    "minor": 0,
                    "health": True,
                    "resources": {"koordinator.sh/rdma": "100"},
                    "topology": {"nodeID": 0, "pcieID": "pci0000:3a"},
                },
            ]
        },
    }


def _nrt(name: str) -> dict[str, Any]:
    detail = [{"id": c, "core": c % 32, "socket": (c % 32) // 16, "node": (c % 32) // 16} for c in range(64)]
    return {
        "metadata": {
            "name": name,
            "annotations": {
                "node.koordinator.sh/cpu-topology": json.dumps({"detail": detail}),
                "kubelet.koordinator.sh/cpu-manager-policy": json.dumps(
                    {"policy": "static", "options": {"full-pcpus-only": "true"}, "reservedCPUs": "0"}
                ),
            },
        },
        "topologyPolicies": ["SingleNUMANodePodLevel"],
        "zones": [
            {
                "name": f"node-{i}",
                "type": "Node",
                "resources": [{"name": "memory", "capacity": "64Gi", "allocatable": "60Gi", "available": "60Gi"}],
            }
            for i in (0, 1)
        ],
    }


def test_node_with_device_cr_and_nrt() -> None:
    k8s_node = fixture("extender-filter-request.json")["Nodes"]["items"][0]
    node = node_from_k8s(k8s_node, _device_cr("gpu-node-a"), _nrt("gpu-node-a"))
    assert node.labels[NODE_NAME_LABEL] == "gpu-node-a"
    assert (
        node.allocatable["cpu"] == 62000
        and "gpu-core" not in node.allocatable
        and "nvidia.com/gpu" not in node.allocatable
    )
    gpus = node.devices_of("gpu")
    assert [(d.minor, d.uuid, d.health, d.numa, d.pcie) for d in gpus] == [
        (0, "GPU-0", True, 0, "pci0000:3a"),
        (1, "GPU-1", False, 1, "pci0000:8a"),
    ]
    assert gpus[0].resources == {"gpu-core": 100, "gpu-memory": 80 << 30, "gpu-memory-ratio": 100}
    assert node.devices_of("rdma")[0].resources == {"rdma": 100}
    assert node.cpu_topology is not None and len(node.cpu_topology.cpus) == 64 and node.numa_ids == (0, 1)
    assert node.kubelet.cpu_manager_policy == "static" and node.kubelet.option("full-pcpus-only")
    assert node.kubelet.reserved_cpus == CPUSet("0")
    assert [z.memory for z in node.numa_zones] == [60 << 30, 60 << 30]


def test_nrt_topology_policy_from_v1alpha1_or_v1alpha2_unless_a_label_sets_it() -> None:
    k8s_node = {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "64"}}}
    topo = _nrt("n")
    assert node_from_k8s(k8s_node, None, topo).policies.numa_topology_policy == "SingleNUMANode"
    topo["attributes"] = [{"name": "topologyManagerPolicy", "value": "best-effort"}]
    assert node_from_k8s(k8s_node, None, topo).policies.numa_topology_policy == "BestEffort"
    labelled = {
        **k8s_node,
        "metadata": {"name": "n", "labels": {"node.koordinator.sh/numa-topology-policy": "Restricted"}},
    }
    node = node_from_k8s(labelled, None, topo)
    assert (
        node.policies.numa_topology_policy is None
        and node.labels["node.koordinator.sh/numa-topology-policy"] == "Restricted"
    )


def test_node_without_device_cr_gets_the_gpus_it_advertises() -> None:
    node = node_from_k8s(fixture("extender-filter-request.json")["Nodes"]["items"][1])
    assert [d.minor for d in node.devices_of("gpu")] == [0, 1]
    assert all(d.resources["gpu-memory"] == 80 << 30 and d.numa is None for d in node.devices)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d, n: d["spec"]["devices"][0].update(type="tpu"), r"spec\.devices\[0\]\.type"),
        (lambda d, n: d["spec"]["devices"][1].pop("minor"), r"spec\.devices\[1\]\.minor"),
        (lambda d, n: d["spec"]["devices"][0]["topology"].update(nodeID=7), "devices.0.numa"),
        (
            lambda d, n: n["metadata"]["annotations"].update({"node.koordinator.sh/cpu-topology": "{"}),
            "cpu-topology: not JSON",
        ),
        (
            lambda d, n: n["metadata"]["annotations"].update(
                {"kubelet.koordinator.sh/cpu-manager-policy": '{"polcy":"static"}'}
            ),
            "unknown field",
        ),
    ],
)
def test_bad_node_objects_name_the_field(mutate: Any, expected: str) -> None:
    device, nrt = _device_cr("n"), _nrt("n")
    mutate(device, nrt)
    with pytest.raises(NodeError, match=expected):
        node_from_k8s({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "8"}}}, device, nrt)
