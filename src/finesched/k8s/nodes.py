"""Kubernetes Node + Koordinator Device CR + NodeResourceTopology -> finesched Node (PROTOCOLS.md 2-3).

* Node: labels (Koordinator's policy labels are read by the plugins from there) and
  ``status.allocatable``; device resources (``koordinator.sh/gpu-*``, ``nvidia.com/gpu``, ...) are
  left out of the scalar amounts, since the devices carry them.
* Device (``scheduling.koordinator.sh/v1alpha1``, named after the node): one finesched Device per
  ``spec.devices[]`` entry (type, minor, UUID, health, NUMA node, PCIe switch, resources, labels).
  The Device's annotation ``scheduling.koordinator.sh/gpu-partitions`` becomes the node's GPU
  partition table and its label ``node.koordinator.sh/gpu-partition-policy`` the policy unless the
  Node carries that label (model/gpu_partitions.py).
  Without a Device CR, a node that advertises GPUs (``koordinator.sh/gpu-core`` or
  ``nvidia.com/gpu``) gets that many whole GPUs, sharing ``koordinator.sh/gpu-memory`` evenly,
  with no topology: Koordinator's koordlet is what reports the real inventory.
* NodeResourceTopology (named after the node): CPU topology from the annotation
  ``node.koordinator.sh/cpu-topology``, kubelet CPU manager policy from
  ``kubelet.koordinator.sh/cpu-manager-policy``, NUMA zones (``node-<id>``) with their cpu and
  memory allocatable, and the NUMA topology policy from ``topologyPolicies`` (v1alpha1) or the
  ``topologyManagerPolicy`` attribute (v1alpha2) unless a node label sets one.
  `kubelet_cpusets` reads ``node.koordinator.sh/pod-cpu-allocs``: the cpusets pods hold without a
  resource-status annotation (the kubelet's static CPU manager gave them), which the sync adds to
  those pods' bindings. The shared-pool annotations are not read: finesched derives the pools.

Every node gets the label `NODE_NAME_LABEL` = its name, so a bind can pin a pod to the node
kube-scheduler chose through an ordinary node selector. Bad input raises `NodeError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pydantic

from finesched.cpuset import CPUSet
from finesched.model.base import FrozenDict
from finesched.model.gpu_partitions import ANNOTATION_GPU_PARTITIONS, LABEL_GPU_PARTITION_POLICY
from finesched.model.node import Node, numa_policy_of
from finesched.model.resources import (
    DEVICE_RESOURCE_NAMES,
    GPU,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    NVIDIA_GPU,
    ResourceVector,
    canonical_name,
)

NODE_NAME_LABEL = "finesched.io/node-name"
CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
_DEVICE_TYPES = ("gpu", "rdma", "fpga")
#: NodeResourceTopology v1alpha2 ``topologyManagerPolicy`` attribute values -> NUMA topology policy.
_V1ALPHA2_POLICIES = {
    "none": "None",
    "best-effort": "BestEffort",
    "restricted": "Restricted",
    "single-numa-node": "SingleNUMANode",
}


class NodeError(ValueError):
    """A Node, Device or NodeResourceTopology object finesched cannot read (message names the field)."""


def _amounts(raw: object, where: str) -> dict[str, int]:
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise NodeError(f"{where}: expected an object of resource name -> quantity")
    try:
        return dict(ResourceVector.parse(raw))
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise NodeError(f"{where}.{'.'.join(map(str, first['loc']))}: {first['input']!r} {first['msg']}") from None


def _json_annotation(annotations: Mapping[str, str], key: str, kind: type) -> Any:
    text = annotations.get(key)
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NodeError(f"annotation {key}: not JSON ({exc})") from None
    if not isinstance(value, kind):
        raise NodeError(f"annotation {key}: expected a JSON {kind.__name__}")
    return value


def _devices(device_cr: Mapping[str, Any] | None, allocatable: Mapping[str, int]) -> list[dict[str, Any]]:
    if device_cr is None:
        return _advertised_gpus(allocatable)
    entries = (device_cr.get("spec") or {}).get("devices") or []
    out = []
    for i, d in enumerate(entries):
        where = f"Device {device_cr.get('metadata', {}).get('name')}: spec.devices[{i}]"
        kind = d.get("type")
        if kind not in _DEVICE_TYPES:
            raise NodeError(f"{where}.type: {kind!r} is not one of {', '.join(_DEVICE_TYPES)}")
        minor = d.get("minor")
        if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
            raise NodeError(f"{where}.minor: expected a non-negative integer, got {minor!r}")
        topo = d.get("topology") or {}
        device: dict[str, Any] = {
            "type": kind,
            "minor": minor,
            "health": bool(d.get("health", False)),
            "resources": {k: v for k, v in _amounts(d.get("resources"), f"{where}.resources").items() if v > 0},
        }
        if d.get("id"):
            device["uuid"] = str(d["id"])
        if isinstance(topo.get("nodeID"), int) and topo["nodeID"] >= 0:
            device["numa"] = topo["nodeID"]
        if topo.get("pcieID"):
            device["pcie"] = str(topo["pcieID"])
        labels = d.get("labels") or {}
        if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
            raise NodeError(f"{where}.labels: expected an object of string values")
        if labels:  # what a pod's device-allocate-hint selector matches
            device["labels"] = dict(labels)
        out.append(device)
    return out


def _advertised_gpus(allocatable: Mapping[str, int]) -> list[dict[str, Any]]:
    cores = allocatable.get(GPU_CORE, 0)
    count = cores // 100 if cores >= 100 else allocatable.get(NVIDIA_GPU, 0)
    if count <= 0:
        return []
    memory = allocatable.get(GPU_MEMORY, 0) // count
    resources = {GPU_CORE: 100, GPU_MEMORY_RATIO: 100, **({GPU_MEMORY: memory} if memory else {})}
    return [{"type": GPU, "minor": m, "health": True, "resources": resources} for m in range(count)]


def _partitions(device_cr: Mapping[str, Any] | None, data: dict[str, Any], labels: Mapping[str, str]) -> None:
    """The Device's partition table annotation and policy label (checked with the Node)."""
    if device_cr is None:
        return
    meta = device_cr.get("metadata") or {}
    table = _json_annotation(meta.get("annotations") or {}, ANNOTATION_GPU_PARTITIONS, dict)
    if table:
        data["gpuPartitions"] = table
    policy = (meta.get("labels") or {}).get(LABEL_GPU_PARTITION_POLICY)
    if policy and LABEL_GPU_PARTITION_POLICY not in labels:
        data.setdefault("policies", {})["gpuPartitionPolicy"] = policy


def _topology(nrt: Mapping[str, Any] | None, data: dict[str, Any], labels: Mapping[str, str]) -> None:
    if nrt is None:
        return
    annotations = (nrt.get("metadata") or {}).get("annotations") or {}
    topo = _json_annotation(annotations, CPU_TOPOLOGY, dict)
    if topo is not None:
        detail = topo.get("detail") or []
        if not isinstance(detail, list):
            raise NodeError(f"annotation {CPU_TOPOLOGY}: field detail: expected a list")
        cpus = []
        for i, c in enumerate(detail):
            if not isinstance(c, dict) or not all(isinstance(c.get(k), int) for k in ("id", "core", "socket", "node")):
                raise NodeError(
                    f"annotation {CPU_TOPOLOGY}: field detail[{i}]: expected integer id, core, socket, node"
                )
            cpus.append({"id": c["id"], "core": c["core"], "socket": c["socket"], "numa": c["node"]})
        if cpus:
            data["cpuTopology"] = {"cpus": cpus}
    policy = _json_annotation(annotations, CPU_MANAGER_POLICY, dict)
    if policy is not None:
        unknown = set(policy) - {"policy", "options", "reservedCPUs"}
        if unknown:
            raise NodeError(f"annotation {CPU_MANAGER_POLICY}: unknown field(s) {sorted(unknown)}")
        kubelet: dict[str, Any] = {"cpuManagerPolicy": policy.get("policy") or "none"}
        if policy.get("options"):
            kubelet["options"] = policy["options"]
        if policy.get("reservedCPUs"):
            kubelet["reservedCPUs"] = policy["reservedCPUs"]
        data["kubelet"] = kubelet
    zones = []
    for zone in nrt.get("zones") or []:
        name = str(zone.get("name", ""))
        if zone.get("type", "Node") != "Node" or not name.startswith("node-") or not name[5:].isdigit():
            continue
        entry: dict[str, Any] = {"id": int(name[5:])}
        for res in zone.get("resources") or []:
            if res.get("name") in ("cpu", "memory") and res.get("allocatable") is not None:
                entry[res["name"]] = res["allocatable"]
        zones.append(entry)
    if zones:
        data["numaZones"] = zones
    policies = [numa_policy_of(str(p)) for p in nrt.get("topologyPolicies") or []]
    attributes = {a.get("name"): a.get("value") for a in nrt.get("attributes") or [] if isinstance(a, dict)}
    if attributes.get("topologyManagerPolicy") in _V1ALPHA2_POLICIES:  # v1alpha2 (topologyPolicies deprecated)
        policies = [_V1ALPHA2_POLICIES[attributes["topologyManagerPolicy"]]]
    labelled = any(k.startswith("node.koordinator.sh/numa-topology") for k in labels)
    if policies and not labelled and policies[0] in ("None", "BestEffort", "Restricted", "SingleNUMANode"):
        data.setdefault("policies", {})["numaTopologyPolicy"] = policies[0]


def kubelet_cpusets(nrt: Mapping[str, Any] | None) -> dict[str, CPUSet]:
    """Pod UID -> cpuset from a NodeResourceTopology's ``pod-cpu-allocs`` annotation ({} without one)."""
    if nrt is None:
        return {}
    allocs = _json_annotation((nrt.get("metadata") or {}).get("annotations") or {}, POD_CPU_ALLOCS, list)
    out: dict[str, CPUSet] = {}
    for i, entry in enumerate(allocs or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("uid"), str):
            raise NodeError(f"annotation {POD_CPU_ALLOCS}: entry [{i}]: expected an object with a uid")
        try:
            cpus = CPUSet.parse(entry.get("cpuset") or "")
        except (ValueError, TypeError) as exc:
            raise NodeError(f"annotation {POD_CPU_ALLOCS}: entry [{i}] field cpuset: {exc}") from None
        if cpus:
            out[entry["uid"]] = cpus
    return out


def node_from_k8s(
    node: Mapping[str, Any], device_cr: Mapping[str, Any] | None = None, nrt: Mapping[str, Any] | None = None
) -> Node:
    """The finesched Node for a Kubernetes Node and its Device CR and NodeResourceTopology."""
    meta = node.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise NodeError("Node metadata.name: a Node needs a name")
    labels = dict(meta.get("labels") or {})
    labels[NODE_NAME_LABEL] = str(name)
    allocatable = _amounts((node.get("status") or {}).get("allocatable"), f"Node {name}: status.allocatable")
    scalar = {k: v for k, v in allocatable.items() if canonical_name(k) not in DEVICE_RESOURCE_NAMES}
    data: dict[str, Any] = {
        "name": name,
        "labels": labels,
        "allocatable": ResourceVector(scalar),
        "devices": _devices(device_cr, allocatable),
    }
    _partitions(device_cr, data, labels)
    _topology(nrt, data, labels)
    kubelet_cpusets(nrt)  # checked here too: a malformed annotation leaves the node out, with its reason
    numa_ids = {d["numa"] for d in data["devices"] if "numa" in d}
    if numa_ids and "cpuTopology" not in data and "numaZones" not in data:
        data["numaZones"] = [{"id": n} for n in sorted(numa_ids)]
    try:
        return Node.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise NodeError(f"Node {name}: {problems}") from None


def with_name_label(node: Node) -> Node:
    """`node` carrying `NODE_NAME_LABEL` (for nodes from finesched manifests, in --cluster mode)."""
    if node.labels.get(NODE_NAME_LABEL) == node.name:
        return node
    return node.model_copy(update={"labels": FrozenDict({**node.labels, NODE_NAME_LABEL: node.name})})
