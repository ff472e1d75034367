"""Turning store rows into the scheduler's objects: the Node the scheduler sees, bindings, tenants.

The scheduler's view of a node is its manifest plus what the control plane knows about it: a
cordoned or NotReady node carries the `NodeUnschedulable` label, devices the agent last
reported unhealthy are marked so, so nothing new is placed on them, and the tenant-isolation
label says what the agent last reported (``discovery.tenantIsolation``: whether it runs workloads
as their tenants' users, and whether the admin lets tenants share it if not), so the
TenantIsolation filter keeps one tenant at a time on a node that cannot keep them apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from finesched.model.binding import Binding
from finesched.model.manifest import parse_decoded_manifest, parse_manifest
from finesched.model.node import Node
from finesched.model.tenant import Tenant
from finesched.model.workload import Workload
from finesched.plugins.node_unschedulable import UNSCHEDULABLE_LABEL
from finesched.plugins.tenant_isolation import TENANT_ISOLATION_LABEL, isolation_label

#: Every node the control plane hands the scheduler carries its own name under this label (as
#: Kubernetes nodes carry kubernetes.io/hostname), so a workload can be pinned to one node.
HOSTNAME_LABEL = "finesched.io/hostname"
#: ... and under Kubernetes' own, unless its manifest gives that label another value, so a
#: Topology's finest level can be `kubernetes.io/hostname` as in Kueue's examples.
KUBERNETES_HOSTNAME_LABEL = "kubernetes.io/hostname"


def node_from_row(row: Mapping[str, Any]) -> Node:
    """The scheduler's Node for a `nodes` row (raises ValidationError if the stored spec is invalid)."""
    # Copies of only what is changed below (the envelope, its metadata, and the spec when a device
    # is marked): the rest (a CPU list of hundreds of entries) is read, never written, and a deep
    # copy of every node's manifest was a fifth of a rebuild.
    doc = dict(row["spec"])
    metadata = doc.get("metadata", {})
    labels = {KUBERNETES_HOSTNAME_LABEL: row["name"], **(metadata.get("labels") or {}), HOSTNAME_LABEL: row["name"]}
    why = "cordoned" if row.get("cordoned") else ("not-ready" if not row.get("ready", True) else "")
    if why:
        labels[UNSCHEDULABLE_LABEL] = why
    isolation = tenant_isolation(row)
    if isolation is not None:  # the agent's word (it also labels the node it registers)
        labels[TENANT_ISOLATION_LABEL] = isolation_label(isolation["isolated"], isolation["allowTenantSharing"])
    doc["metadata"] = {**metadata, "labels": labels}
    health = ((row.get("report") or {}).get("health")) or {}
    spec = doc.get("spec") or {}
    devices, marked = [], False
    for device in spec.get("devices") or ():
        reported = health.get(device.get("type"), {}).get(str(device.get("minor")))
        if reported is False:
            device, marked = {**device, "health": False}, True
        devices.append(device)
    if marked:
        doc["spec"] = {**spec, "devices": devices}
    node = parse_decoded_manifest(doc, where=f"node {row['name']}")  # the row's spec was JSON text
    assert isinstance(node, Node)
    return node


def tenant_isolation(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"isolated", "reason", "allowTenantSharing"}`` from the node's latest report (None: not reported)."""
    found = (((row.get("report") or {}).get("discovery") or {}).get("tenantIsolation")) or None
    if not isinstance(found, Mapping) or not isinstance(found.get("isolated"), bool):
        return None
    return {"isolated": found["isolated"], "reason": str(found.get("reason") or ""),
            "allowTenantSharing": found.get("allowTenantSharing") is True}  # fmt: skip


def pinned(workload: Workload, node: str) -> Workload:
    """`workload` restricted to `node` (through the hostname label every node carries)."""
    selector = {**workload.node_selector, HOSTNAME_LABEL: node}
    return Workload.model_validate({**workload.model_dump(by_alias=True), "nodeSelector": selector})


def workload_from_row(row: Mapping[str, Any]) -> Workload:
    workload = parse_manifest(row["spec"], where=f"workload {row['namespace']}/{row['name']}")
    assert isinstance(workload, Workload)
    return workload


def tenant_from_row(row: Mapping[str, Any]) -> Tenant:
    tenant = parse_manifest(row["spec"], where=f"tenant {row['name']}")
    assert isinstance(tenant, Tenant)
    return tenant


def binding_from_row(row: Mapping[str, Any]) -> Binding:
    return Binding.model_validate(row["data"])


def binding_view(binding: Binding) -> dict[str, Any]:
    """What a client sees of a binding: node, cpuset (Linux cpulist), QoS class and CPU exclusive
    policy (which pool the agent runs it in), devices per type, NUMA grants."""
    data = binding.model_dump(mode="json", by_alias=True, exclude={"devices"})
    return {
        "node": binding.node,
        "cpuset": str(binding.cpuset),
        "qos": binding.qos,
        "cpuExclusivePolicy": binding.cpu_exclusive_policy,
        "devices": binding.devices_doc(),
        "numa": data.get("numa", []),
        "requests": data.get("requests", {}),
        "annotations": data.get("annotations", {}),
    }
