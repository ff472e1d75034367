"""`finesched describe node NAME`: a node's state, its CPU pools as its agent applies them, and events.

The pools come from the agent's latest report (S3.9: ``cpuSharedPools``, ``beCPUSharedPools``,
``podCPUAllocs``, ``workloadCPUs``), so they show what the node enforces now; the allocation
comes from the scheduler's books. ``Enforcement`` says which cgroup controllers the agent uses, or
why none and that it falls back to CPU affinity.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def render_node(out: Console, item: dict[str, Any], events: list[dict[str, Any]]) -> None:
    name = item["metadata"]["name"]
    status = item["status"]
    report = status.get("report") or {}
    discovery = report.get("discovery") or {}
    out.print(f"[bold]Node[/] {escape(name)}")
    out.print(f"Ready:       {status['ready']}   cordoned: {status['cordoned']}   heartbeat: {status.get('heartbeat')}")
    allocatable = item["spec"].get("allocatable") or {}
    out.print("Allocatable: " + escape(", ".join(f"{k}={v}" for k, v in allocatable.items()) or "-"))
    allocation = status.get("allocation") or {}
    used = allocation.get("resources") or {}
    if used:
        out.print("Allocated:   " + escape(", ".join(f"{k} {v['used']}/{v['allocatable']}" for k, v in used.items())))
    out.print("Enforcement: " + escape(str(discovery.get("cgroup") or "not reported")))
    _pools(out, report)
    health = report.get("health") or {}
    devices = [
        f"{kind}{minor}{'' if ok else ' (unhealthy)'}" for kind, flags in health.items() for minor, ok in flags.items()
    ]
    out.print("Devices:     " + escape(" ".join(devices) or "-"))
    table = Table(title="events")
    for column in ("time", "reason", "message"):
        table.add_column(column, overflow="fold")
    for event in events:
        table.add_row(event["time"], event["reason"], escape(event["message"]))
    out.print(table)


def _pools(out: Console, report: dict[str, Any]) -> None:
    shared = report.get("cpuSharedPools")
    if shared is None:
        out.print("CPU pools:   not reported by the agent yet")
        return
    be = {p["node"]: p["cpuset"] for p in report.get("beCPUSharedPools") or ()}
    table = Table(title="CPU pools (as the agent applies them)")
    for column in ("NUMA node", "socket", "shared pool (LS)", "BE pool"):
        table.add_column(column)
    for pool in shared:
        table.add_row(str(pool["node"]), str(pool["socket"]), pool["cpuset"] or "-", be.get(pool["node"]) or "-")
    out.print(table)
    placed = report.get("workloadCPUs") or []
    if placed:
        table = Table(title="workloads on this node's CPUs")
        for column in ("workload", "QoS", "runs in", "CPUs"):
            table.add_column(column, overflow="fold")
        for w in placed:
            table.add_row(escape(f"{w['namespace']}/{w['name']}"), w.get("qos") or "-", escape(w.get("pool") or "-"),
                          w["cpuset"])  # fmt: skip
        out.print(table)
