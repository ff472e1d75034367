"""A scheduling decision: which node, and exactly which CPUs, NUMA nodes and device shares.

A binding is what the node agent applies (S0.6 deploy executor, S1.7 runtime hook) and what the
state is rebuilt from on start-up (S1.6), so it records every amount it takes: scalar requests,
per-device grants (both gpu-memory and gpu-memory-ratio filled in), cpuset, per-NUMA amounts.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from finesched.cpuset import CPUSet
from finesched.model.base import Model
from finesched.model.mig import MIGPlacement
from finesched.model.resources import ResourceVector


class DeviceGrant(Model):
    """A share of one device: its minor and the amount taken per dimension, or, on a GPU in MIG
    mode, the MIG instance (`mig`) the workload holds there (then `resources` is empty)."""

    minor: int = Field(ge=0)
    resources: ResourceVector = Field(default_factory=ResourceVector)
    mig: MIGPlacement | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if isinstance(out, dict) and out.get("mig", 0) is None:
            del out["mig"]  # grants of shared devices keep their two-field shape
        return out


class NUMAGrant(Model):
    """Amounts taken from one NUMA node (cpu in millicores, memory in bytes, ...)."""

    numa: int = Field(ge=0)
    resources: ResourceVector = Field(default_factory=ResourceVector)


class Binding(Model):
    """Workload `workload` (``namespace/name``) placed on `node`, with everything it holds there."""

    workload: str
    node: str
    tenant: str = ""
    priority: int = 0
    qos: str = "LS"
    requests: ResourceVector = Field(default_factory=ResourceVector)
    cpuset: CPUSet = Field(default_factory=CPUSet)
    cpu_exclusive_policy: str = "None"
    numa: tuple[NUMAGrant, ...] = ()
    devices: dict[str, list[DeviceGrant]] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    score: int | None = None

    def device_minors(self, kind: str) -> list[int]:
        return [g.minor for g in self.devices.get(kind, ())]

    def devices_doc(self) -> dict[str, list[dict[str, Any]]]:
        """The device grants as every client reads them (the server's binding view, `finesched plan`
        and ``POST /v1/plan`` records): per type ``[{minor, resources, mig?}]``, one serializer
        (DeviceGrant's), so a MIG grant's ``mig: {profile, start, uuid}`` is never left out."""
        return {kind: [g.model_dump(mode="json", by_alias=True) for g in gs] for kind, gs in self.devices.items()}
