"""A binding as the agent receives it (GET /v1/bindings?node=): parsed once, checked, then immutable.

The server sends ``{"workload": "ns/name", "uid", "node", "cpuset": "0-3", "devices": {type: [{"minor",
"resources"}]}, "numa": [...], "qos", "cpuExclusivePolicy", "annotations", "version", "acked",
"workloadSpec": {...}, "tenant", "runAs": {"uid", "gid", "allowRoot"} | null}``; a MIG instance is
a gpu grant with ``"mig": {"profile", "start", "uuid"?}`` (kept in `AgentBinding.mig`). `raw` keeps
the item without the spec: it is what the child gets as FINESCHED_BINDING. The QoS class is the
server's (a server that sends none: the spec's, else derived as Kubernetes derives its class: no
cpu or memory request or limit is BE). An LS workload bound to NUMA shared pools
(ConstrainedBurst) names them in its resource-status annotation. `tenant` and
`run_as` say whose user the workload runs as (agent/identity.py); a server that sends no tenant
is an older one, and the namespace stands for it (a tenant owns the namespace of its name).
`uid` is the workload object's (`object_uid`): the agent keys its directories and log by it, so a
workload created with the name of a deleted one starts clean; an older server sends none ("").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from finesched.agent.identity import RunAs
from finesched.cpuset import CPUSet
from finesched.model.resources import CPU, MEMORY, ResourceVector
from finesched.model.workload import EXCLUSIVE_QOS, QoS
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS

QOS_CLASSES = frozenset(get_args(QoS))


class BindingError(ValueError):
    """A binding item the agent cannot read; the message names the field and the value."""


@dataclass(frozen=True)
class MIGUse:
    """A MIG instance the binding holds: card, profile, start, and the MIG device UUID once known."""

    minor: int
    profile: str
    start: int
    uuid: str | None = None


@dataclass(frozen=True)
class AgentBinding:
    workload: str
    node: str
    cpuset: CPUSet
    #: type -> [(minor, per-dimension amounts in canonical units)], in the server's order.
    devices: dict[str, list[tuple[int, ResourceVector]]]
    numa: tuple[int, ...]
    version: int
    acked: bool
    spec: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict)
    #: NUMA nodes whose shared pools an LS workload is bound to (resource-status cpuSharedPools).
    shared_numa: tuple[int, ...] = ()
    mig: tuple[MIGUse, ...] = ()
    tenant: str = ""
    run_as: RunAs | None = None
    #: The workload object's uid ("" from a server that gives none).
    object_uid: str = ""

    @property
    def namespace(self) -> str:
        return self.workload.partition("/")[0]

    @property
    def name(self) -> str:
        return self.workload.partition("/")[2]

    @property
    def qos(self) -> str:
        """LSE, LSR, LS or BE (see the module docstring)."""
        for named in (self.raw.get("qos"), self.spec.get("qos")):
            if named in QOS_CLASSES:
                return str(named)
        parts = [self.spec.get(p) for p in ("requests", "limits")]
        asked = any(isinstance(p, Mapping) and (p.get(CPU) or p.get(MEMORY)) for p in parts)
        return "LS" if asked else "BE"

    @property
    def exclusive(self) -> bool:
        """Whether this binding owns its CPUs: LSE/LSR QoS, or an explicit exclusive policy."""
        policy = self.raw.get("cpuExclusivePolicy") or "None"
        return self.qos in EXCLUSIVE_QOS or policy not in ("None", "")

    @property
    def placement(self) -> str:
        """What identifies this placement: node, cpuset, devices and NUMA grants (the version
        changes on every ack, so it cannot tell a new binding from the one being run)."""
        keys = ("node", "cpuset", "devices", "numa")
        return json.dumps({k: self.raw.get(k) for k in keys}, sort_keys=True, default=str)

    @property
    def command(self) -> list[str]:
        return [str(x) for x in (*(self.spec.get("command") or ()), *(self.spec.get("args") or ()))]


def parse_binding(item: Mapping[str, Any]) -> AgentBinding:
    """An API binding item -> AgentBinding; BindingError names the bad field."""
    if not isinstance(item, Mapping):
        raise BindingError(f"a binding is an object, got {type(item).__name__}")
    workload = item.get("workload")
    if not isinstance(workload, str) or workload.count("/") != 1:
        raise BindingError(f'workload: {workload!r} is not "namespace/name"')
    object_uid = item.get("uid") or ""
    try:
        object_uid = str(uuid.UUID(object_uid)) if object_uid else ""
    except (TypeError, ValueError, AttributeError):
        raise BindingError(f"uid: {object_uid!r} is not a UUID") from None
    try:
        cpuset = CPUSet(item.get("cpuset") or "")
    except ValueError as exc:
        raise BindingError(f"cpuset: {exc}") from None
    devices, mig = _devices(item.get("devices") or {})
    numa = _numa(item.get("numa") or ())
    spec = item.get("workloadSpec") or {}
    if not isinstance(spec, Mapping):
        raise BindingError(f"workloadSpec: an object, got {type(spec).__name__}")
    raw = {k: v for k, v in item.items() if k != "workloadSpec"}
    tenant = item.get("tenant") or workload.partition("/")[0]
    if not isinstance(tenant, str):
        raise BindingError(f"tenant: a name, got {tenant!r}")
    try:
        run_as = RunAs.parse(item.get("runAs"))
    except ValueError as exc:
        raise BindingError(str(exc)) from None
    return AgentBinding(
        workload=workload,
        node=str(item.get("node", "")),
        cpuset=cpuset,
        devices=devices,
        numa=tuple(sorted(set(numa))),
        version=int(item.get("version") or 0),
        acked=bool(item.get("acked")),
        spec=spec,
        raw=raw,
        shared_numa=_shared_numa(item.get("annotations")),
        mig=tuple(mig),
        tenant=tenant,
        run_as=run_as,
        object_uid=object_uid,
    )


def _devices(
    granted: Mapping[str, Any],
) -> tuple[dict[str, list[tuple[int, ResourceVector]]], list[MIGUse]]:
    """The `devices` field: per type, (minor, amounts) in the server's order, and the MIG instances
    among them; BindingError names the bad grant (devices.TYPE.INDEX)."""
    devices: dict[str, list[tuple[int, ResourceVector]]] = {}
    mig: list[MIGUse] = []
    for kind, grants in granted.items():
        devices[kind] = []
        for i, grant in enumerate(grants or ()):
            try:
                minor = int(grant["minor"])
                amounts = ResourceVector.parse(grant.get("resources") or {})
                if grant.get("mig") is not None:
                    m = grant["mig"]
                    mig.append(MIGUse(minor, str(m["profile"]), int(m["start"]), m.get("uuid") or None))
            except (KeyError, TypeError, ValueError) as exc:
                raise BindingError(f"devices.{kind}.{i}: {exc}") from None
            devices[kind].append((minor, amounts))
    return devices, mig


def _numa(entries: Any) -> list[int]:
    """The `numa` field's NUMA nodes (entries are numbers or {"numa": N} grants)."""
    numa: list[int] = []
    for i, entry in enumerate(entries):
        value = entry.get("numa") if isinstance(entry, Mapping) else entry
        if not isinstance(value, int):
            raise BindingError(f"numa.{i}: {entry!r} names no NUMA node")
        numa.append(value)
    return numa


def _shared_numa(annotations: Any) -> tuple[int, ...]:
    """The NUMA ids of the resource-status annotation's cpuSharedPools (BindingError if unreadable)."""
    text = annotations.get(ANNOTATION_RESOURCE_STATUS) if isinstance(annotations, Mapping) else None
    if not text:
        return ()
    try:
        pools = json.loads(text).get("cpuSharedPools") or []
        return tuple(sorted({int(p["node"]) for p in pools}))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BindingError(f"annotations.{ANNOTATION_RESOURCE_STATUS}: {exc}") from None
