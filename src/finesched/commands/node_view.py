"""`finesched describe node NAME`: a node's state, what its agent discovered (and how), devices,
its CPU pools as its agent applies them, and events.

The pools come from the agent's latest report (S3.9: ``cpuSharedPools``, ``beCPUSharedPools``,
``podCPUAllocs``, ``workloadCPUs``), so they show what the node enforces now; the allocation
comes from the scheduler's books. ``Enforcement`` says which cgroup controllers the agent uses, or
why none and that it falls back to CPU affinity. Simulated GPUs (``up --fake-gpus``) are marked.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

SIMULATED_LABEL = "finesched.io/simulated"


def render_node(out: Console, item: dict[str, Any], events: list[dict[str, Any]]) -> None:
    meta, spec, status = item["metadata"], item["spec"], item["status"]
    report = status.get("report") or {}
    discovery = report.get("discovery") or {}
    out.print(f"[bold]Node[/] {escape(meta['name'])}")
    state = ("Ready" if status["ready"] else "NotReady") + (", cordoned" if status["cordoned"] else "")
    out.print(f"State:       {state}   heartbeat: {status.get('heartbeat') or '-'}")
    labels = ", ".join(f"{k}={v}" for k, v in (meta.get("labels") or {}).items())
    out.print(f"Labels:      {escape(labels) or '-'}")
    allocatable = ", ".join(f"{k}={v}" for k, v in (spec.get("allocatable") or {}).items())
    out.print(f"Allocatable: {escape(allocatable) or '-'}")
    allocation = status.get("allocation") or {}
    used = allocation.get("resources") or {}
    if used:
        out.print("Allocated:   " + escape(", ".join(f"{k} {v['used']}/{v['allocatable']}" for k, v in used.items())))
    if allocation.get("workloads"):
        out.print(f"Workloads:   {escape(', '.join(allocation['workloads']))}")
    for source, how in (discovery.get("sources") or {}).items():
        style = "[bold yellow]" if how.startswith("SIMULATED") else ""
        out.print(f"Discovered:  {source}: {style}{escape(how)}{'[/]' if style else ''}")
    if discovery.get("logs"):
        out.print(f"Logs served: {escape(str(discovery['logs'].get('url')))}")
    out.print("Enforcement: " + escape(str(discovery.get("cgroup") or "not reported")))
    _devices(out, spec.get("devices") or [], report.get("health") or {})
    _pools(out, report)
    table = Table(title="events")
    for column in ("time", "reason", "message"):
        table.add_column(column, overflow="fold")
    for event in events:
        table.add_row(event["time"], event["reason"], escape(event["message"]))
    out.print(table)


def _devices(out: Console, devices: list[dict[str, Any]], health: dict[str, Any]) -> None:
    if not devices:
        return
    table = Table(title="devices")
    for column in ("type", "minor", "uuid", "healthy", "numa", "resources", "note"):
        table.add_column(column, overflow="fold")
    for device in devices:
        reported = health.get(device["type"], {}).get(str(device["minor"]))
        healthy = device.get("health", True) if reported is None else reported
        note = "SIMULATED" if (device.get("labels") or {}).get(SIMULATED_LABEL) == "true" else ""
        resources = ", ".join(f"{k}={v}" for k, v in (device.get("resources") or {}).items())
        table.add_row(device["type"], str(device["minor"]), device.get("uuid") or "-", str(healthy),
                      str(device.get("numa", "-")), resources, note)  # fmt: skip
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
