"""The resource model: what nodes have, what workloads ask for, and the decisions in between."""

from finesched.model.binding import Binding, DeviceGrant, NUMAGrant
from finesched.model.job import Job
from finesched.model.manifest import Manifests, dump, load_manifests, parse_manifest, to_manifest
from finesched.model.node import CPUInfo, CPUTopology, Device, DeviceLink, ForeignAllocation, Node, NUMAZone
from finesched.model.resources import ResourceVector, canonical_name, resource_kind
from finesched.model.tenant import Tenant
from finesched.model.workload import Workload

__all__ = [
    "Binding",
    "CPUInfo",
    "CPUTopology",
    "Device",
    "DeviceGrant",
    "DeviceLink",
    "ForeignAllocation",
    "Job",
    "Manifests",
    "NUMAGrant",
    "NUMAZone",
    "Node",
    "ResourceVector",
    "Tenant",
    "Workload",
    "canonical_name",
    "dump",
    "load_manifests",
    "parse_manifest",
    "resource_kind",
    "to_manifest",
]
