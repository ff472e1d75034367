"""How `finesched get jobs` and `finesched describe job` print jobs (the API's job views)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

#: Slot phases in the order a job's counts are shown.
PHASE_ORDER = ("Pending", "Bound", "Running", "Succeeded", "Failed", "Rejected")


def _counts(phases: dict[str, Any]) -> str:
    shown = [f"{phases[p]} {p}" for p in PHASE_ORDER if phases.get(p)]
    return ", ".join(shown) or "-"


def jobs_table(items: list[dict[str, Any]]) -> Table:
    table = Table(title=f"{len(items)} job(s)")
    for column in ("namespace", "name", "phase", "slots", "regions", "restarts", "reason"):
        table.add_column(column, overflow="fold")
    for item in items:
        status = item["status"]
        slots = status["slots"]
        regions = status["regions"]
        restarting = sum(1 for r in regions if r["restarting"])
        region_text = f"{len(regions)}" + (f" ({restarting} restarting)" if restarting else "")
        restarts = f"{status['failures']}/{status['backoffLimit']}"
        meta = item["metadata"]
        table.add_row(meta["namespace"], meta["name"], status["phase"], f"{slots['total']}: {_counts(slots)}",
                      region_text, restarts, status.get("reason") or "")  # fmt: skip
    return table


def print_job(out: Console, item: dict[str, Any]) -> None:
    """`describe job`: phase, policy, each failover region with its tasks, slots and restarts, events."""
    meta, status = item["metadata"], item["status"]
    out.print(f"[bold]Job[/] {escape(meta['namespace'])}/{escape(meta['name'])}  tenant {escape(status['tenant'])}")
    reason = f" ({escape(status['reason'])})" if status.get("reason") else ""
    out.print(f"Phase:    {status['phase']}{reason}")
    out.print(f"Mode:     {item['spec'].get('mode', 'streaming')}   slots: {status['slots']['total']} "
              f"({_counts(status['slots'])})")  # fmt: skip
    out.print(f"Restarts: {status['failures']} of {status['backoffLimit']} (restartPolicy {status['restartPolicy']})")
    table = Table(title="failover regions (a failed slot restarts its region only)")
    for column in ("region", "tasks", "slot", "phase", "node", "restarts"):
        table.add_column(column, overflow="fold")
    for region in status["regions"]:
        label = f"{region['index']}" + (" (restarting)" if region["restarting"] else "")
        tasks = ", ".join(region["tasks"])
        for i, slot in enumerate(region["slots"]):
            first = i == 0
            table.add_row(label if first else "", tasks if first else "", slot["workload"], slot["phase"],
                          slot.get("node") or "-", str(region["restarts"]) if first else "")  # fmt: skip
    out.print(table)
    events = Table(title="events (the job's and its slots')")
    for column in ("time (UTC)", "object", "reason", "count", "message"):
        events.add_column(column, overflow="fold")
    for event in item.get("events", []):
        when = event["time"][11:19]  # hh:mm:ss of the last occurrence (UTC)
        events.add_row(when, event["object"], event["reason"], str(event.get("count", 1)), event["message"])
    out.print(events)
