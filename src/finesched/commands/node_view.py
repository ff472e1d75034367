"""`finesched describe node NAME`: a node's state, what its agent discovered (and how), devices,
its CPU pools as its agent applies them, and events.

The pools come from the agent's latest report (S3.9: ``cpuSharedPools``, ``beCPUSharedPools``,
``podCPUAllocs``, ``workloadCPUs``), so they show what the node enforces now; the allocation
comes from the scheduler's books. ``Enforcement`` says which cgroup controllers the agent uses, or
why none and that it falls back to CPU affinity. ``Isolation`` is the TenantIsolation condition:
whether workloads run as their tenants' users there, or why not and what the scheduler does
about it. Simulated GPUs (``up --fake-gpus``) are marked. Each device shows what is used of it and by whom
(``status.allocation.devices``); a tenant's token sees its own workloads' names, the others counted.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from finesched.commands.devices import format_grants
from finesched.commands.tables import Columns, col, event_time, print_table, simple_table
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.resources import GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, human_amount, human_amounts

SIMULATED_LABEL = "finesched.io/simulated"
DEVICE_COLUMNS = Columns(col("type"), col("minor", right=True), col("uuid", wide=True), col("healthy", keep=True),
                         col("numa", right=True), col("used/total"), col("held by"), col("note"))  # fmt: skip
PLACED_COLUMNS = Columns(col("workload"), col("QoS", keep=True), col("runs in"), col("CPUs"))


def render_node(out: Console, item: dict[str, Any], events: list[dict[str, Any]], wide: bool = False) -> None:
    meta, spec, status = item["metadata"], item["spec"], item["status"]
    report = status.get("report") or {}
    discovery = report.get("discovery") or {}
    out.print(f"[bold]Node[/] {escape(meta['name'])}")
    out.print(f"UID:         {meta.get('uid') or '-'}")
    state = ("Ready" if status["ready"] else "NotReady") + (", cordoned" if status["cordoned"] else "")
    out.print(f"State:       {state}   heartbeat: {status.get('heartbeat') or '-'}")
    labels = ", ".join(f"{k}={v}" for k, v in (meta.get("labels") or {}).items())
    out.print(f"Labels:      {escape(labels) or '-'}")
    allocatable = human_amounts(spec.get("allocatable") or {})
    out.print(f"Allocatable: {escape(allocatable) or '-'}")
    allocation = status.get("allocation") or {}
    used = allocation.get("resources") or {}
    if used:
        shown = (f"{k} {human_amount(k, v['used'])}/{human_amount(k, v['allocatable'])}" for k, v in used.items())
        out.print("Allocated:   " + escape(", ".join(shown)))
    if allocation.get("workloads"):
        out.print(f"Workloads:   {escape(', '.join(allocation['workloads']))}")
    for source, how in (discovery.get("sources") or {}).items():
        style = "[bold yellow]" if how.startswith("SIMULATED") else ""
        out.print(f"Discovered:  {source}: {style}{escape(how)}{'[/]' if style else ''}")
    if discovery.get("logs"):
        out.print(f"Logs served: {escape(str(discovery['logs'].get('url')))}")
    out.print("Enforcement: " + escape(str(discovery.get("cgroup") or "not reported")))
    _isolation(out, status.get("conditions") or [])
    _devices(out, item, wide)
    _pools(out, report, wide)
    rows = [(event_time(e["time"], wide), escape(e["reason"]), escape(e["message"])) for e in events]
    print_table(out, simple_table("events", ["time (UTC)", "reason", "message"], rows), wide=wide)


def _isolation(out: Console, conditions: list[dict[str, Any]]) -> None:
    found = next((c for c in conditions if c.get("type") == "TenantIsolation"), None)
    if found is None:
        out.print("Isolation:   not reported by the agent yet")
        return
    style = "[bold yellow]" if found.get("status") != "True" else ""
    text = f"TenantIsolation={found.get('status')}: {found.get('message', '')}"
    out.print(f"Isolation:   {style}{escape(text)}{'[/]' if style else ''}", soft_wrap=True)


def _devices(out: Console, item: dict[str, Any], wide: bool) -> None:
    """One row per device: capacity, what is used of each dimension (grants and use outside
    finesched) and who holds it; holders the caller may not see are counted as "N other"."""
    devices = item["spec"].get("devices") or []
    if not devices:
        return
    health = (item["status"].get("report") or {}).get("health") or {}
    usage = {(u["type"], u["minor"]): u for u in ((item["status"].get("allocation") or {}).get("devices") or ())}
    table = DEVICE_COLUMNS.table("devices (used/total; held by)", wide=wide)
    for device in devices:
        reported = health.get(device["type"], {}).get(str(device["minor"]))
        healthy = device.get("health", True) if reported is None else reported
        note = "SIMULATED" if (device.get("labels") or {}).get(SIMULATED_LABEL) == "true" else ""
        use = usage.get((device["type"], device["minor"]))
        used = _used_text(use) if use else human_amounts(device.get("resources") or {})
        uuid = escape(device.get("uuid") or "-")
        DEVICE_COLUMNS.add_row(table, escape(device["type"]), str(device["minor"]), uuid, str(healthy),
                               str(device.get("numa", "-")), escape(used), escape(_holders_text(use)), note,
                               wide=wide)  # fmt: skip
    print_table(out, table, wide=wide)


def _used_text(use: dict[str, Any]) -> str:
    """``core 50/100, memory 8Gi/16Gi`` (a GPU), else ``rdma 100/100``: used (total less free) of total."""
    total, free = use.get("total") or {}, use.get("free") or {}
    dims = list(total)
    if use["type"] == GPU:  # core and memory: bytes when the card gives them, else the ratio
        dims = [GPU_CORE, GPU_MEMORY if total.get(GPU_MEMORY) else GPU_MEMORY_RATIO]
    shown = []
    for dim in dims:
        cap = int(total.get(dim, 0))
        label = _GPU_LABELS.get(dim, dim) if use["type"] == GPU else dim
        shown.append(f"{label} {human_amount(dim, cap - int(free.get(dim, cap)))}/{human_amount(dim, cap)}")
    return ", ".join(shown)


def _holders_text(use: dict[str, Any] | None) -> str:
    """One line per holder the caller may see (``team-a/db: 50% core, 8Gi``), then "N other"."""
    if not use:
        return "-"
    lines, others = [], 0
    for holder in use.get("holders") or ():
        if holder.get("workload") is None:
            others += 1
            continue
        if holder.get("mig"):
            what = f"MIG {holder['mig']['profile']} at slice {holder['mig']['start']}"
        else:
            grant = DeviceGrant(minor=use["minor"], resources=holder.get("resources") or {})
            text = format_grants(Binding(workload="-", node="-", devices={use["type"]: [grant]}))
            what = text.removeprefix(f"{use['type']} {use['minor']}: ")
        lines.append(f"{holder['workload']}: {what}" if what else holder["workload"])
    if others:
        lines.append(f"{others} other")
    return "\n".join(lines) or "-"


_GPU_LABELS = {GPU_CORE: "core", GPU_MEMORY: "memory", GPU_MEMORY_RATIO: "memory %"}


def _pools(out: Console, report: dict[str, Any], wide: bool) -> None:
    shared = report.get("cpuSharedPools")
    if shared is None:
        out.print("CPU pools:   not reported by the agent yet")
        return
    be = {p["node"]: p["cpuset"] for p in report.get("beCPUSharedPools") or ()}
    rows = [(str(p["node"]), str(p["socket"]), p["cpuset"] or "-", be.get(p["node"]) or "-") for p in shared]
    headers = [col("NUMA node", right=True), col("socket", right=True), "shared pool (LS)", "BE pool"]
    print_table(out, simple_table("CPU pools (as the agent applies them)", headers, rows), wide=wide)
    placed = report.get("workloadCPUs") or []
    if placed:
        table = PLACED_COLUMNS.table("workloads on this node's CPUs", wide=wide)
        for w in placed:
            PLACED_COLUMNS.add_row(table, escape(f"{w['namespace']}/{w['name']}"), w.get("qos") or "-",
                                   escape(w.get("pool") or "-"), w["cpuset"], wide=wide)  # fmt: skip
        print_table(out, table, wide=wide)
