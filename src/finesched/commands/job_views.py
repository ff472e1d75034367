"""How `finesched get jobs` and `finesched describe job` print jobs (the API's job views)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.tables import Columns, col, print_table

#: Slot phases in the order a job's counts are shown.
PHASE_ORDER = ("Pending", "Bound", "Running", "Succeeded", "Failed", "Rejected")


def _counts(phases: dict[str, Any]) -> str:
    shown = [f"{phases[p]} {p}" for p in PHASE_ORDER if phases.get(p)]
    return ", ".join(shown) or "-"


JOB_COLUMNS = Columns(
    col("job"), col("phase", keep=True), col("slots"), col("regions", wide=True), col("restarts", keep=True),
    col("reason"),
)  # fmt: skip
REGION_COLUMNS = Columns(col("region"), col("tasks"), col("slot"), col("phase", keep=True), col("node"),
                         col("restarts", right=True))  # fmt: skip
EVENT_COLUMNS = Columns(col("time (UTC)", keep=True), col("object"), col("reason"), col("count", right=True),
                        col("message"))  # fmt: skip


def jobs_table(items: list[dict[str, Any]], wide: bool = False) -> Table:
    table = JOB_COLUMNS.table(f"{len(items)} job(s)", wide=wide)
    for item in items:
        status = item["status"]
        slots = status["slots"]
        regions = status["regions"]
        restarting = sum(1 for r in regions if r["restarting"])
        region_text = f"{len(regions)}" + (f" ({restarting} restarting)" if restarting else "")
        restarts = f"{status['failures']}/{status['backoffLimit']}"
        meta = item["metadata"]
        JOB_COLUMNS.add_row(table, escape(f"{meta['namespace']}/{meta['name']}"), status["phase"],
                            f"{slots['total']}: {_counts(slots)}", region_text, restarts,
                            escape(status.get("reason") or ""), wide=wide)  # fmt: skip
    return table


def print_job(out: Console, item: dict[str, Any], wide: bool = False) -> None:
    """`describe job`: phase, policy, each failover region with its tasks, slots and restarts, events."""
    meta, status = item["metadata"], item["status"]
    out.print(f"[bold]Job[/] {escape(meta['namespace'])}/{escape(meta['name'])}  tenant {escape(status['tenant'])}")
    reason = f" ({escape(status['reason'])})" if status.get("reason") else ""
    out.print(f"Phase:    {status['phase']}{reason}")
    out.print(f"UID:      {meta.get('uid') or '-'}")
    out.print(f"Mode:     {item['spec'].get('mode', 'streaming')}   slots: {status['slots']['total']} "
              f"({_counts(status['slots'])})")  # fmt: skip
    out.print(f"Restarts: {status['failures']} of {status['backoffLimit']} (restartPolicy {status['restartPolicy']})")
    table = REGION_COLUMNS.table("failover regions (a failed slot restarts its region only)", wide=wide)
    for region in status["regions"]:
        label = f"{region['index']}" + (" (restarting)" if region["restarting"] else "")
        tasks = ", ".join(region["tasks"])
        for i, slot in enumerate(region["slots"]):
            first = i == 0
            REGION_COLUMNS.add_row(table, label if first else "", escape(tasks) if first else "",
                                   escape(slot["workload"]), slot["phase"], escape(slot.get("node") or "-"),
                                   str(region["restarts"]) if first else "", wide=wide)  # fmt: skip
    print_table(out, table, wide=wide)
    events = EVENT_COLUMNS.table("events (the job's and its slots')", wide=wide)
    for event in item.get("events", []):
        when = event["time"][11:19]  # hh:mm:ss of the last occurrence (UTC)
        EVENT_COLUMNS.add_row(events, when, escape(event["object"]), escape(event["reason"]),
                              str(event.get("count", 1)), escape(event["message"]), wide=wide)  # fmt: skip
    print_table(out, events, wide=wide)
