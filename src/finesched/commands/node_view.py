"""How `finesched describe node` prints a node: state, what its agent discovered (and how), devices."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

SIMULATED_LABEL = "finesched.io/simulated"


def print_node(out: Console, item: dict[str, Any]) -> None:
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
    for source, how in (discovery.get("sources") or {}).items():
        style = "[bold yellow]" if how.startswith("SIMULATED") else ""
        out.print(f"Discovered:  {source}: {style}{escape(how)}{'[/]' if style else ''}")
    if discovery.get("logs"):
        out.print(f"Logs served: {escape(str(discovery['logs'].get('url')))}")
    devices = spec.get("devices") or []
    if devices:
        health = report.get("health") or {}
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
    allocation = status.get("allocation") or {}
    if allocation:
        used = ", ".join(f"{k}={v['used']}/{v['allocatable']}" for k, v in allocation.get("resources", {}).items())
        out.print(f"Allocated:   {escape(used) or '-'}")
        out.print(f"Workloads:   {escape(', '.join(allocation.get('workloads', []))) or '-'}")
