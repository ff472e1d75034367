"""Agent reports (seed S0.2 sync): check the encoded per-device vectors against the node's inventory.

An agent sends, per device type and dimension, the free amounts of its devices (minor order) as
one integer `k` with the bit width and device count. The server decodes them and refuses the
whole report, keeping the last good state, when the count is not the node's device count of that
type, a value is out of range for the width, or a decoded value is above the device's total.
Health flags must name devices the node has. GPUs in MIG mode are not in the free vectors; the
``mig`` part lists each MIG card's instances (valid together for the card's profile table) and,
S0.2-encoded, the card's occupied memory slices, which must be what those instances occupy.

With them the agent reports its CPU pools as it applies them now (S3.9): ``cpuSharedPools`` and
``beCPUSharedPools`` (``[{socket, node, cpuset}]``, one per NUMA node, as koordlet's
``cpu-shared-pools`` / ``be-cpu-shared-pools``), ``podCPUAllocs`` (workloads with a cpuset) and
``workloadCPUs`` (where each running workload is). Every cpuset must be CPUs of the node, a pool's
those of its NUMA node; the server shows them (``finesched describe node``) and keeps its own books.

What a tenant may read of a report (`tenant_report`: not other tenants' workloads, not the agent's
own details) is here too, for ``GET /v1/nodes/{name}`` and the console's node page alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from finesched.codec import MAX_BITS, CodecError, decode
from finesched.cpuset import MAX_CPU_ID, CPUSet
from finesched.model.mig import MIGInstance, MIGSpec
from finesched.model.node import Node, device_totals
from finesched.server.store.views import Integer


class EncodedDim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: Integer = Field(ge=0)
    count: Integer = Field(ge=1, le=4096)
    bits: Integer = Field(ge=1, le=MAX_BITS)


#: Workload names as stored (an older server took names longer than DNS-1123's 253): a report
#: naming one must not be refused, or the node would go silent.
Name = Annotated[str, Field(max_length=4096)]
POOL_FIELDS = ("cpuSharedPools", "beCPUSharedPools", "podCPUAllocs", "workloadCPUs")
OPTIONAL_PARTS = (*POOL_FIELDS, "mig")


class SharedPool(BaseModel):
    """One NUMA node's pool: koordlet's CPUSharedPool."""

    model_config = ConfigDict(extra="forbid")
    socket: Integer = Field(ge=0, le=MAX_CPU_ID)
    node: Integer = Field(ge=0, le=MAX_CPU_ID)
    cpuset: CPUSet


class WorkloadCPUs(BaseModel):
    """A workload's CPUs on the node: its cpuset (``podCPUAllocs``) or the pool it runs in now."""

    model_config = ConfigDict(extra="forbid")
    namespace: Name
    name: Name
    cpuset: CPUSet
    qos: Literal["LSE", "LSR", "LS", "BE"] | None = None
    pool: str | None = Field(default=None, max_length=200)


class MIGReport(BaseModel):
    """``slices``: S0.2 occupied-slice masks of the MIG cards (minor order); ``instances``: per minor."""

    model_config = ConfigDict(extra="forbid")
    slices: EncodedDim
    instances: dict[str, list[MIGInstance]] = Field(default_factory=dict)


class NodeReport(BaseModel):
    """`devices`: {type: {dimension: {k, count, bits}}}; `health`: {type: {minor: healthy}}; the pools."""

    model_config = ConfigDict(extra="forbid")
    devices: dict[str, dict[str, EncodedDim]] = Field(default_factory=dict)
    health: dict[str, dict[str, bool]] = Field(default_factory=dict)
    totals: dict[str, Any] = Field(default_factory=dict)
    discovery: dict[str, Any] = Field(default_factory=dict)
    cpuSharedPools: list[SharedPool] | None = Field(default=None, max_length=4096)  # the wire names (S3.9)
    beCPUSharedPools: list[SharedPool] | None = Field(default=None, max_length=4096)
    podCPUAllocs: list[WorkloadCPUs] | None = Field(default=None, max_length=65536)
    workloadCPUs: list[WorkloadCPUs] | None = Field(default=None, max_length=65536)
    mig: MIGReport | None = None

    @model_serializer(mode="wrap")
    def _without_absent_parts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A report without pools (an older agent) or MIG cards is stored as it came, not with nulls."""
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in OPTIONAL_PARTS}


def check_report(node: Node, report: NodeReport) -> list[dict[str, Any]]:
    """Every problem of `report` against `node`'s inventory, as API error details (empty: valid)."""
    problems: list[dict[str, Any]] = []
    inventory: dict[str, list[Any]] = {}
    for device in sorted(node.devices, key=lambda d: (d.type, d.minor)):
        if device.mig is None:  # MIG cards are reported under "mig"
            inventory.setdefault(device.type, []).append(device)
    for kind, dims in report.devices.items():
        devices = inventory.get(kind)
        if devices is None:
            problems.append(_problem(["devices", kind], f"node {node.name} has no {kind} devices", kind))
            continue
        for dim, enc in dims.items():
            loc = ["devices", kind, dim]
            if enc.count != len(devices):
                problems.append(
                    _problem([*loc, "count"], f"node {node.name} has {len(devices)} {kind} device(s)", enc.count)
                )
                continue
            try:
                values = decode(enc.k, enc.count, enc.bits)
            except CodecError as exc:
                problems.append(_problem([*loc, "k"], f"does not decode with bits={enc.bits}: {exc}", enc.k))
                continue
            for device, value in zip(devices, values, strict=True):
                total = device_totals(device).get(dim)
                if total is None:
                    problems.append(_problem(loc, f"{kind} devices have no dimension {dim!r}", dim))
                    break
                if value > total:
                    problems.append(
                        _problem([*loc, "k"], f"{kind} {device.minor}: free {value} is above its total {total}", value)
                    )
    if report.mig is not None:
        problems += _mig_problems(node, report.mig)
    for kind, flags in report.health.items():
        minors = {str(d.minor) for d in node.devices if d.type == kind}
        for minor in flags:
            if minor not in minors:
                problems.append(_problem(["health", kind, minor], f"node {node.name} has no {kind} {minor}", minor))
    return problems + _pool_problems(node, report)


def _pool_problems(node: Node, report: NodeReport) -> list[dict[str, Any]]:
    """Pools must name the node's NUMA nodes and hold only their CPUs; workload cpusets the node's CPUs."""
    if node.cpu_topology is None:
        return []
    numa_cpus: dict[int, CPUSet] = {}
    for info in node.cpu_topology.cpus:
        numa_cpus[info.numa] = numa_cpus.get(info.numa, CPUSet()) | CPUSet([info.id])
    everything = CPUSet().union(*numa_cpus.values())
    problems = []
    for field in POOL_FIELDS[:2]:
        for i, pool in enumerate(getattr(report, field) or ()):
            loc = [field, str(i)]
            if pool.node not in numa_cpus:
                problems.append(
                    _problem([*loc, "node"], f"node {node.name} has NUMA nodes {sorted(numa_cpus)}", pool.node)
                )
            elif not pool.cpuset.is_subset(numa_cpus[pool.node]):
                stray = pool.cpuset - numa_cpus[pool.node]
                msg = f"CPUs {stray} are not on NUMA node {pool.node} ({numa_cpus[pool.node]})"
                problems.append(_problem([*loc, "cpuset"], msg, str(pool.cpuset)))
    for field in POOL_FIELDS[2:]:
        for i, entry in enumerate(getattr(report, field) or ()):
            if not entry.cpuset.is_subset(everything):
                msg = f"CPUs {entry.cpuset - everything} are not CPUs of node {node.name} ({everything})"
                problems.append(_problem([field, str(i), "cpuset"], msg, str(entry.cpuset)))
    return problems


def _mig_problems(node: Node, report: MIGReport) -> list[dict[str, Any]]:
    cards = {str(d.minor): d.mig for d in sorted(node.devices, key=lambda d: d.minor) if d.type == "gpu" and d.mig}
    problems: list[dict[str, Any]] = []
    masks = []
    for minor, spec in cards.items():
        assert spec is not None
        found = report.instances.get(minor, [])
        try:
            fresh = MIGSpec.model_validate(
                {**spec.model_dump(by_alias=True), "instances": [i.model_dump() for i in found]}
            )
        except pydantic.ValidationError as exc:
            for e in exc.errors():
                problems.append(
                    _problem(["mig", "instances", minor, *map(str, e["loc"][1:])], e["msg"], e.get("input"))
                )
            masks.append(None)
            continue
        g = fresh.geometry
        masks.append(sum(g.masks[g.placement_lookup[(i.profile, i.start)]] for i in fresh.instances))
    for minor in sorted(set(report.instances) - set(cards)):
        problems.append(_problem(["mig", "instances", minor], f"node {node.name} has no MIG gpu {minor}", minor))
    enc = report.slices
    if enc.count != len(cards):
        problems.append(
            _problem(["mig", "slices", "count"], f"node {node.name} has {len(cards)} MIG gpu(s)", enc.count)
        )
        return problems
    try:
        values = decode(enc.k, enc.count, enc.bits)
    except CodecError as exc:
        return [*problems, _problem(["mig", "slices", "k"], f"does not decode with bits={enc.bits}: {exc}", enc.k)]
    for minor, value, want in zip(cards, values, masks, strict=True):
        if want is not None and value != want:
            problems.append(
                _problem(["mig", "slices", "k"], f"gpu {minor}: slices {value:#b} != its instances' {want:#b}", value)
            )
    return problems


def _problem(loc: list[str], msg: str, value: Any) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "input": value}


# What a tenant may read of a report (GET /v1/nodes/{name}, the console's node page) ---------------
#: The parts of an agent's report any caller may read: device vectors, health, totals and pools.
PUBLIC_REPORT_PARTS = ("devices", "mig", "health", "totals", "cpuSharedPools", "beCPUSharedPools")
#: The parts that name workloads, one entry per workload (``{namespace, name, cpuset, ...}``).
WORKLOAD_REPORT_PARTS = ("podCPUAllocs", "workloadCPUs")


def tenant_report(report: Mapping[str, Any], shown: Any) -> dict[str, Any]:
    """The report a tenant may read: the public parts, the workload lists with every workload it may
    not see left unnamed (held, as on the rest of the page), and only the discovery's sources."""
    out: dict[str, Any] = {k: report[k] for k in PUBLIC_REPORT_PARTS if k in report}
    for part in WORKLOAD_REPORT_PARTS:
        entries = report.get(part)
        if isinstance(entries, list):
            out[part] = [_unnamed_unless_shown(e, shown) for e in entries if isinstance(e, Mapping)]
    discovery = report.get("discovery")
    if isinstance(discovery, Mapping) and "sources" in discovery:
        out["discovery"] = {"sources": discovery["sources"]}
    return out


def _unnamed_unless_shown(entry: Mapping[str, Any], shown: Any) -> dict[str, Any]:
    if shown(f"{entry.get('namespace')}/{entry.get('name')}") is not None:
        return dict(entry)
    return {**entry, "namespace": None, "name": None}
