"""Kubernetes Pods -> finesched Workloads and Bindings (PROTOCOLS.md sections 1-2).

* `pod_workload`: a pending Pod as the Workload the scheduler places. Requests and limits are
  summed over containers the way kube-scheduler does (``PodRequests``): regular containers add
  up, sidecars (init containers with ``restartPolicy: Always``) add to them, every other init
  container counts with the sidecars started before it, the pod takes the larger of the two, and
  ``spec.overhead`` is added on top. The QoS class is Kubernetes' own, per container; the label
  ``koordinator.sh/qosClass`` overrides it. Koordinator's annotations become typed fields.
* `pod_binding`: a Pod already bound to a node (by us or by any other scheduler) as the Binding
  that holds what it uses, read from its ``device-allocated`` and ``resource-status`` annotations,
  so the state is rebuilt from the API server at start (S1.6).

Bad input raises `PodError`, whose message names the field path or the annotation and its field.
Unknown fields inside the annotations we read are refused: a typo must not silently schedule the
pod without the policy its owner asked for. Unknown annotation keys are left alone (they belong to
other components).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from finesched.cpuset import CPUSet
from finesched.model.binding import Binding, NUMAGrant
from finesched.model.device_allocated import DEVICE_ALLOCATED, AnnotationError, parse_device_allocated
from finesched.model.gpu_partitions import ALLOCATE_POLICIES, ANNOTATION_GPU_PARTITION_SPEC, GPUPartitionSpec
from finesched.model.resources import CPU, MEMORY, PODS, ResourceVector
from finesched.model.workload import DeviceHint, DeviceJointAllocate, ResourceSpec, Workload
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS

RESOURCE_SPEC = "scheduling.koordinator.sh/resource-spec"
NUMA_TOPOLOGY_SPEC = "scheduling.koordinator.sh/numa-topology-spec"
DEVICE_ALLOCATE_HINT = "scheduling.koordinator.sh/device-allocate-hint"
DEVICE_JOINT_ALLOCATE = "scheduling.koordinator.sh/device-joint-allocate"
LABEL_QOS = "koordinator.sh/qosClass"
KOORDINATOR_QOS = ("LSE", "LSR", "LS", "BE", "SYSTEM")

_BIND = ("Default", "FullPCPUs", "SpreadByPCPUs", "ConstrainedBurst")
#: Field -> allowed values (None: any value of the right JSON type, checked by the reader).
_ANNOTATION_FIELDS: dict[str, dict[str, tuple[str, ...] | None]] = {
    RESOURCE_SPEC: {
        "requiredCPUBindPolicy": _BIND,
        "preferredCPUBindPolicy": _BIND,
        "preferredCPUExclusivePolicy": ("Default", "None", "PCPULevel", "NUMANodeLevel"),
    },
    NUMA_TOPOLOGY_SPEC: {
        "numaTopologyPolicy": ("None", "BestEffort", "Restricted", "SingleNUMANode"),
        "singleNUMANodeExclusive": ("Preferred", "Required"),
    },
    DEVICE_JOINT_ALLOCATE: {"deviceTypes": None, "requiredScope": ("SamePCIe",)},
    ANNOTATION_GPU_PARTITION_SPEC: {"allocatePolicy": ALLOCATE_POLICIES, "ringBusBandwidth": None},
}
_HINT_FIELDS: dict[str, tuple[str, ...] | None] = {
    "selector": None,
    "vfSelector": None,
    "allocateStrategy": ("ApplyForAll", "RequestsAsCount"),
    "requiredTopologyScope": ("Device", "PCIe", "NUMANode", "Node"),
    "exclusivePolicy": ("DeviceLevel", "PCIeLevel"),
}


class PodError(ValueError):
    """A Pod finesched cannot read; the message names the field path or annotation and field."""


# Requests and limits ---------------------------------------------------------------------------------
def _amounts(raw: object, where: str) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise PodError(f"{where}: expected an object of resource name -> quantity, got {type(raw).__name__}")
    try:
        return dict(ResourceVector.parse(raw))
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise PodError(f"{where}.{field}: {first['input']!r} {first['msg']}") from None


def _add(a: dict[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _max(a: dict[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        if v > out.get(k, 0):
            out[k] = v
    return out


def _container(c: Mapping[str, Any], where: str) -> tuple[dict[str, int], dict[str, int]]:
    """A container's requests and limits, with Kubernetes' defaulting: no request = the limit."""
    res = _resources(c)
    limits = _amounts(res.get("limits"), f"{where}.resources.limits")
    requests = {**limits, **_amounts(res.get("requests"), f"{where}.resources.requests")}
    return requests, limits


def _pod_total(spec: Mapping[str, Any], field: int) -> dict[str, int]:
    """kube-scheduler's PodRequests (field 0) / PodLimits (field 1): containers, init containers, overhead.

    A resource some container leaves unlimited has no pod limit at all (the pod may use the node's).
    """
    containers = [_container(c, f"spec.containers[{i}]") for i, c in enumerate(_list(spec, "containers"))]
    inits = [_container(c, f"spec.initContainers[{i}]") for i, c in enumerate(_list(spec, "initContainers"))]
    total: dict[str, int] = {}
    for amounts in containers:
        total = _add(total, amounts[field])
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c, amounts in zip(_list(spec, "initContainers"), inits, strict=True):
        own = amounts[field]
        if c.get("restartPolicy") == "Always":
            total = _add(total, own)
            sidecars = _add(sidecars, own)
            own = sidecars
        else:
            own = _add(own, sidecars)
        init_max = _max(init_max, own)
    total = _add(_max(total, init_max), _amounts(spec.get("overhead"), "spec.overhead"))
    if field == 1:
        everyone = [limits for _, limits in (*containers, *inits)]
        total = {k: v for k, v in total.items() if all(k in limits for limits in everyone)}
    return total


def _list(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
        raise PodError(f"spec.{key}: expected a list of container objects")
    return value


def _resources(container: Mapping[str, Any]) -> Mapping[str, Any]:
    res = container.get("resources") or {}
    return res if isinstance(res, Mapping) else {}


def k8s_qos_class(spec: Mapping[str, Any]) -> str:
    """Kubernetes' QoS class (Guaranteed / Burstable / BestEffort), container by container."""
    containers = [*_list(spec, "containers"), *_list(spec, "initContainers")]
    any_set = False
    guaranteed = True
    for i, c in enumerate(containers):
        requests, limits = _container(c, f"container {i}")
        for name in (CPU, MEMORY):
            if requests.get(name) or limits.get(name):
                any_set = True
            if name not in limits or requests.get(name) != limits[name]:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# Annotations ------------------------------------------------------------------------------------------
def _annotation(annotations: Mapping[str, str], key: str) -> dict[str, Any] | None:
    text = annotations.get(key)
    if text is None or text == "":
        return None
    try:
        value = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise PodError(f"annotation {key}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise PodError(f"annotation {key}: expected a JSON object, got {type(value).__name__}")
    return value


def _check_fields(key: str, value: Mapping[str, Any], fields: Mapping[str, tuple[str, ...] | None]) -> None:
    for field, given in value.items():
        if field not in fields:
            raise PodError(f"annotation {key}: unknown field {field!r}; known fields: {', '.join(fields)}")
        valid = fields[field]
        if valid is not None and given not in (None, "") and given not in valid:
            raise PodError(f"annotation {key}: field {field}: {given!r} is not one of {', '.join(valid)}")


def _policies(annotations: Mapping[str, str]) -> dict[str, Any]:
    """Workload fields from Koordinator's pod annotations (each checked field by field)."""
    out: dict[str, Any] = {}
    spec = _annotation(annotations, RESOURCE_SPEC)
    if spec is not None:
        _check_fields(RESOURCE_SPEC, spec, _ANNOTATION_FIELDS[RESOURCE_SPEC])
        fields = {k: v for k, v in spec.items() if v not in (None, "")}
        if fields.get("preferredCPUExclusivePolicy") == "Default":
            fields["preferredCPUExclusivePolicy"] = "None"
        out["resource_spec"] = ResourceSpec.model_validate(fields)
    numa = _annotation(annotations, NUMA_TOPOLOGY_SPEC)
    if numa is not None:
        _check_fields(NUMA_TOPOLOGY_SPEC, numa, _ANNOTATION_FIELDS[NUMA_TOPOLOGY_SPEC])
        if numa.get("numaTopologyPolicy"):
            out["numa_topology_policy"] = numa["numaTopologyPolicy"]
    joint = _annotation(annotations, DEVICE_JOINT_ALLOCATE)
    if joint is not None:
        _check_fields(DEVICE_JOINT_ALLOCATE, joint, _ANNOTATION_FIELDS[DEVICE_JOINT_ALLOCATE])
        types = joint.get("deviceTypes")
        if not isinstance(types, list) or len(types) < 2 or not all(isinstance(t, str) and t for t in types):
            raise PodError(f"annotation {DEVICE_JOINT_ALLOCATE}: field deviceTypes: expected 2 or more type names")
        out["device_joint_allocate"] = DeviceJointAllocate(
            device_types=tuple(types), required_scope=joint.get("requiredScope") or "SamePCIe"
        )
    hint = _annotation(annotations, DEVICE_ALLOCATE_HINT)
    if hint is not None:
        out["device_allocate_hint"] = _device_hint(hint)
    partition = _annotation(annotations, ANNOTATION_GPU_PARTITION_SPEC)
    if partition is not None:
        _check_fields(ANNOTATION_GPU_PARTITION_SPEC, partition, _ANNOTATION_FIELDS[ANNOTATION_GPU_PARTITION_SPEC])
        fields = {k: v for k, v in partition.items() if v not in (None, "")}
        try:
            out["gpu_partition_spec"] = GPUPartitionSpec.model_validate(fields)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise PodError(f"annotation {ANNOTATION_GPU_PARTITION_SPEC}: field {field}: {first['msg']}") from None
    return out


def _device_hint(hint: Mapping[str, Any]) -> dict[str, DeviceHint]:
    """The annotation as the Workload's deviceAllocateHint (model/workload.py DeviceHint): the same
    JSON shape, Go's empty strings and null selectors meaning unset; errors name the field."""
    out = {}
    for kind, entry in hint.items():
        if not isinstance(entry, dict):
            raise PodError(f"annotation {DEVICE_ALLOCATE_HINT}: field {kind}: expected an object")
        _check_fields(f"{DEVICE_ALLOCATE_HINT} ({kind})", entry, _HINT_FIELDS)
        for selector in ("selector", "vfSelector"):
            if entry.get(selector) not in (None, {}) and not isinstance(entry.get(selector), dict):
                raise PodError(f"annotation {DEVICE_ALLOCATE_HINT}: field {kind}.{selector}: expected an object")
        fields = {k: v for k, v in entry.items() if v not in (None, "")}
        try:
            out[kind] = DeviceHint.model_validate(fields)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise PodError(f"annotation {DEVICE_ALLOCATE_HINT}: field {kind}.{field}: {first['msg']}") from None
    return out


# The workload ----------------------------------------------------------------------------------------
def _meta(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any], dict[str, str], dict[str, str]]:
    if not isinstance(pod, Mapping):
        raise PodError(f"Pod: expected an object, got {type(pod).__name__}")
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise PodError("metadata.name: a Pod needs a name")
    if not isinstance(spec, Mapping):
        raise PodError("spec: a Pod needs a spec object")
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    for field, value in (("labels", labels), ("annotations", annotations)):
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise PodError(f"metadata.{field}: expected an object of string values")
    return meta, spec, dict(labels), dict(annotations)


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def pod_workload(pod: Mapping[str, Any]) -> Workload:
    """The Workload for a Pod (see the module docstring); raise PodError for bad input."""
    meta, spec, labels, annotations = _meta(pod)
    requests = _pod_total(spec, 0)
    limits = _pod_total(spec, 1)
    qos = labels.get(LABEL_QOS)
    if qos is not None and qos not in KOORDINATOR_QOS:
        raise PodError(f"label {LABEL_QOS}: {qos!r} is not one of {', '.join(KOORDINATOR_QOS)}")
    if qos in (None, "SYSTEM"):  # SYSTEM pods share the LS pools
        qos = "BE" if k8s_qos_class(spec) == "BestEffort" else "LS"
    priority = spec.get("priority") or 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PodError(f"spec.priority: expected an integer, got {priority!r}")
    fields = _policies(annotations)
    try:
        return Workload(
            name=str(meta["name"]),
            namespace=str(meta.get("namespace") or "default"),
            labels=labels,
            priority=priority,
            qos=qos,
            requests=ResourceVector(requests),
            limits=ResourceVector(limits),
            **fields,
        )
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise PodError(f"{pod_key(pod)}: {problems}") from None


# Bound pods ------------------------------------------------------------------------------------------
def pod_holds_resources(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not finished: a Pod in this state uses what it asked for."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return bool(spec.get("nodeName")) and status.get("phase") not in ("Succeeded", "Failed")


def pod_binding(pod: Mapping[str, Any], owns: Callable[[str], bool]) -> Binding:
    """The Binding of a Pod bound to ``spec.nodeName``: its scalar requests (names `owns` claims
    excluded, pods: 1 added, as the scheduler's own bindings hold them) plus the devices, cpuset and
    NUMA amounts its Koordinator annotations record. Raise PodError for an unreadable annotation."""
    workload = pod_workload(pod)
    spec = pod.get("spec") or {}
    annotations = dict((pod.get("metadata") or {}).get("annotations") or {})
    scalar = {k: v for k, v in workload.requests.items() if v > 0 and not owns(k)}
    scalar[PODS] = 1
    devices = {}
    text = annotations.get(DEVICE_ALLOCATED)
    if text:
        try:
            devices = parse_device_allocated(text)
        except AnnotationError as exc:
            raise PodError(f"annotation {exc}") from None
    cpuset, numa = _resource_status(annotations.get(ANNOTATION_RESOURCE_STATUS))
    kept = {k: v for k, v in annotations.items() if k in (DEVICE_ALLOCATED, ANNOTATION_RESOURCE_STATUS)}
    exclusive = workload.resource_spec.preferred_cpu_exclusive_policy or "None"
    return Binding(
        workload=workload.key,
        node=str(spec["nodeName"]),
        tenant=workload.tenant,
        priority=workload.priority,
        qos=workload.qos or "LS",
        requests=ResourceVector(scalar),
        cpuset=cpuset,
        cpu_exclusive_policy=exclusive if cpuset else "None",
        numa=numa,
        devices=devices,
        annotations=kept,
    )


def _resource_status(text: str | None) -> tuple[CPUSet, tuple[NUMAGrant, ...]]:
    where = f"annotation {ANNOTATION_RESOURCE_STATUS}"
    if not text:
        return CPUSet(), ()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PodError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise PodError(f"{where}: expected a JSON object")
    try:
        cpuset = CPUSet.parse(doc.get("cpuset") or "")
    except (ValueError, TypeError) as exc:
        raise PodError(f"{where}: field cpuset: {exc}") from None
    grants = []
    for i, entry in enumerate(doc.get("numaNodeResources") or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("node"), int):
            raise PodError(f"{where}: field numaNodeResources[{i}]: expected {{node: int, resources: {{...}}}}")
        amounts = _amounts(entry.get("resources"), f"{where}: field numaNodeResources[{i}].resources")
        grants.append(NUMAGrant(numa=entry["node"], resources=ResourceVector(amounts)))
    return cpuset, tuple(sorted(grants, key=lambda g: g.numa))
