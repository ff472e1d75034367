"""One node as the console draws it: device bars by holder, the CPU topology coloured by pool, NUMA zones, the report.

* **Devices**: per device its totals, what bindings hold of it (one segment per workload, per
  dimension), what is used outside finesched (foreign) and what is free, and its health.
* **CPUs** (seed S3.2, S3.3): every logical CPU with socket, NUMA node, core, the workload holding
  it exclusively and its pool, from the state's CPU accounts (`state/cpus.py`: the pools the
  scheduler itself uses): ``LSE`` (held exclusively, BE excluded: LSE and kubelet-static
  Guaranteed), ``LSR`` (held exclusively, shared with BE only), ``LS`` (the shared pool) or
  ``reserved`` (kubelet reserved CPUs); `be` says whether BE workloads may run there (the BE
  pool: every CPU not held by an LSE-like workload).
* **NUMA zones**: cpu and memory capacity, allocatable and available per zone, and what
  the workloads hold outside any zone (`node_report`'s ``unboundUse``: the LS shared pool's).
* **Report**: the agent's last S0.2 report as it sent it (`k`, `count`, `bits` per dimension),
  with the per-device values decoded beside it.

Workloads the caller may not see (another tenant's) are shown as held, without their names; the
report's own lists of workloads (``podCPUAllocs``, ``workloadCPUs``) likewise, and of the agent's
discovery notes such a caller sees only which sources were found (not the agent's pid, log port or
cgroup paths).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from finesched.codec import CodecError, decode
from finesched.plugins.resource_status import node_report
from finesched.sched.scheduler import Scheduler
from finesched.server.api.device_usage import DeviceInput
from finesched.server.api.reports import tenant_report
from finesched.server.store.views import isolation_condition
from finesched.state.cpus import CPUAccounts, NodePools
from finesched.state.device_types import NodeDevices


@dataclass
class NodeInput:
    """What the node page reads from the leader's state, captured under the loop's lock."""

    on_devices: DeviceInput  # the node, its bindings and its devices (what describe node reads too)
    pools: NodePools | None
    holders: dict[int, tuple[str, str]]  # cpu -> (workload, qos) holding it exclusively
    report: dict[str, Any]
    scalars: dict[str, tuple[int, int]]  # resource -> (allocatable, free)

    @classmethod
    def capture(cls, scheduler: Scheduler, name: str) -> NodeInput:
        """Read node `name` (KeyError when the leader does not hold it); the caller holds the loop's lock."""
        state = scheduler.state
        devices = DeviceInput.capture(state, name)
        i = state.index[name]
        cpus = state.extras.get("cpus")
        pools = holders = None
        if isinstance(cpus, CPUAccounts) and cpus.topo[i] is not None:
            pools = cpus.pools(i)
            holders = {cpu: (key, hold.qos) for key, hold in cpus.held[i].items() for cpu in hold.cpus}
        scalars = {r: (int(state.allocatable[k, i]), int(state.free[k, i])) for k, r in enumerate(state.resources)}
        return cls(
            on_devices=devices,
            pools=pools,
            holders=holders or {},
            report=node_report(state, name),
            scalars={r: v for r, v in scalars.items() if v[0] > 0},
        )


def node_page(data: NodeInput, row: Mapping[str, Any], visible: set[str] | None) -> dict[str, Any]:
    """The node page's data; workloads outside `visible` (None: all visible) are named None."""

    def shown(key: str) -> str | None:
        return key if visible is None or key in visible else None

    node = data.on_devices.node
    return {
        "name": node.name,
        "labels": dict(node.labels),
        "status": {
            "ready": bool(row["ready"]),
            "cordoned": bool(row["cordoned"]),
            "heartbeat": row["heartbeat"].isoformat() if row.get("heartbeat") else None,
            "isolation": next(iter(isolation_condition(row)), None),  # TenantIsolation, once reported
        },
        "resources": {r: {"allocatable": a, "allocated": a - f, "free": f} for r, (a, f) in data.scalars.items()},
        "devices": _devices(data, shown),
        "cpus": _cpus(data, shown),
        "pools": _pools(data, shown),
        "zones": data.report.get("zones", []),
        "unboundUse": data.report.get("unboundUse", {}),
        "numaZones": [{"id": z.id, "memory": z.memory} for z in node.numa_zones] if node.numa_zones else [],
        "report": _report(row.get("report"), data.on_devices.devices, shown, private=visible is not None),
        "workloads": sorted(
            ({"workload": shown(b.workload), "qos": b.qos, "cpuset": str(b.cpuset)} for b in data.on_devices.bindings),
            key=lambda w: (w["workload"] is None, w["workload"] or ""),
        ),
    }


def _devices(data: NodeInput, shown: Any) -> list[dict[str, Any]]:
    return data.on_devices.usage(shown)


def _cpus(data: NodeInput, shown: Any) -> list[dict[str, Any]]:
    topology = data.on_devices.node.cpu_topology
    if topology is None or data.pools is None:
        return []
    pools = data.pools
    out = []
    for cpu in topology.cpus:
        holder = data.holders.get(cpu.id)
        if cpu.id in pools.reserved:
            pool = "reserved"
        elif holder is not None:
            pool = "LSR" if holder[1] == "LSR" else "LSE"
        else:
            pool = "LS"
        out.append(
            {
                "id": cpu.id,
                "socket": cpu.socket,
                "numa": cpu.numa,
                "core": cpu.core,
                "pool": pool,
                "be": cpu.id in pools.be,
                "holder": shown(holder[0]) if holder is not None else None,
                "holderQos": holder[1] if holder is not None else None,
            }
        )
    return out


def _pools(data: NodeInput, shown: Any) -> dict[str, Any]:
    """The pools as cpusets, and the workloads that run in the shared pools (LS and BE: no cpuset)."""
    if data.pools is None:
        return {}
    sharers = [b for b in data.on_devices.bindings if not b.cpuset]
    return {
        "shared": str(data.pools.shared),
        "be": str(data.pools.be),
        "exclusive": str(data.pools.exclusive),
        "reserved": str(data.pools.reserved),
        "numaShared": {str(numa): str(cpus) for numa, cpus in data.pools.numa_shared.items()},
        "ls": [shown(b.workload) for b in sharers if b.qos != "BE"],
        "beWorkloads": [shown(b.workload) for b in sharers if b.qos == "BE"],
    }


def _report(
    report: Mapping[str, Any] | None, devices: Mapping[str, NodeDevices], shown: Any, *, private: bool
) -> dict[str, Any] | None:
    """The agent's report as sent, with each encoded dimension decoded per device (minor order); for
    a `private` caller (a tenant) without what names other tenants' workloads or the agent itself."""
    if not report:
        return None
    if private:
        report = tenant_report(report, shown)
    decoded: dict[str, dict[str, Any]] = {}
    for kind, dims in (report.get("devices") or {}).items():
        for dim, enc in dims.items():
            try:
                values: Any = decode(int(enc["k"]), int(enc["count"]), int(enc["bits"]))
            except (CodecError, KeyError, TypeError, ValueError) as exc:
                values = f"cannot decode: {exc}"
            minors = devices[kind].minors.tolist() if kind in devices else []
            if isinstance(values, list) and len(minors) == len(values):
                values = dict(zip((str(m) for m in minors), values, strict=True))
            decoded.setdefault(kind, {})[dim] = values
    return {"sent": _exact_in_javascript(report), "decoded": decoded}


def _exact_in_javascript(value: Any) -> Any:
    """`value` with integers beyond 2^53 as decimal text (an encoded K of 8 GPUs' memory in bytes has
    ~290 bits; a browser's JSON numbers would round it)."""
    if isinstance(value, Mapping):
        return {k: _exact_in_javascript(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact_in_javascript(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return str(value)
    return value
