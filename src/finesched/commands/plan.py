"""`finesched plan`: schedule manifests offline through the queue and show every decision.

The same Scheduler the server and the simulator use; nothing is written anywhere. Output is a
rich table (or JSON/YAML for scripts) plus a summary: placed / waiting and the utilization of
every resource afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.devices import format_grants
from finesched.model.binding import Binding
from finesched.model.manifest import Manifests
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS, node_report, render_node_reports
from finesched.sched.diagnosis import QuotaWait
from finesched.sched.profile import Profile
from finesched.sched.scheduler import Result, Scheduler
from finesched.sched.tenant_usage import binding_amounts
from finesched.state.cluster import ClusterState

OUTPUTS = ("table", "json", "yaml")


@dataclass
class PlanOutcome:
    state: ClusterState
    scheduler: Scheduler
    results: list[Result]


def run_plan(manifests: Manifests, profile: str | Profile = "default") -> PlanOutcome:
    """Schedule every workload of `manifests` on its nodes through the queue (priority, DRF)."""
    state = ClusterState.from_nodes(manifests.nodes)
    scheduler = Scheduler(state, profile, manifests.tenants)
    scheduler.submit(manifests.workloads)
    return PlanOutcome(state, scheduler, scheduler.run())


def result_record(result: Result, workloads: dict[str, Any]) -> dict[str, Any]:
    """A plain-data view of one decision (for JSON/YAML output)."""
    if isinstance(result, Binding):
        record: dict[str, Any] = {
            "workload": result.workload,
            "tenant": result.tenant,
            "node": result.node,
            "score": result.score,
        }
        if result.devices:
            record["devices"] = {
                kind: [{"minor": g.minor, "resources": dict(g.resources)} for g in grants]
                for kind, grants in result.devices.items()
            }
        if result.cpuset:
            record["cpuset"] = str(result.cpuset)
        if result.numa:
            record["numa"] = [g.numa for g in result.numa]
            record["numaResources"] = {str(g.numa): g.resources.to_quantities() for g in result.numa}
        if result.annotations:  # Koordinator's resource-status (cpuset or cpuSharedPools) and device-allocated
            record["annotations"] = dict(result.annotations)
        return record
    w = workloads.get(result.workload)
    return {
        "workload": result.workload,
        "tenant": w.tenant if w is not None else None,
        "node": None,
        "waiting" if isinstance(result, QuotaWait) else "error": result.message,
        "reasons": result.reasons,
    }


def utilization(state: ClusterState) -> dict[str, float]:
    """Fraction of each resource held by bindings, cluster-wide (resources with capacity only).

    Held amounts are summed from the bindings themselves (scalar requests and device grants),
    so device dimensions count exactly like scalar ones.
    """
    held: dict[str, int] = {}
    for binding in state.bindings.values():
        for name, amount in binding_amounts(binding).items():
            held[name] = held.get(name, 0) + amount
    return {name: held.get(name, 0) / total for name, total in state.totals().items() if total > 0}


def summary(outcome: PlanOutcome) -> dict[str, Any]:
    placed = sum(isinstance(r, Binding) for r in outcome.results)
    return {
        "placed": placed,
        "unschedulable": len(outcome.results) - placed,
        "utilization": {k: round(v, 4) for k, v in utilization(outcome.state).items()},
    }


def render(
    outcome: PlanOutcome, manifests: Manifests, output: str, console: Console, *, show_nodes: bool = False
) -> None:
    workloads = {w.key: w for w in manifests.workloads}
    if output in ("json", "yaml"):
        doc: dict[str, Any] = {
            "results": [result_record(r, workloads) for r in outcome.results],
            "summary": summary(outcome),
        }
        if show_nodes:
            doc["nodes"] = [node_report(outcome.state, name) for name in outcome.state.names]
        text = json.dumps(doc, indent=2) if output == "json" else yaml.safe_dump(doc, sort_keys=False)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    console.print(decision_table(outcome.results, workloads))
    console.print(summary_table(outcome))
    if show_nodes:
        console.print(render_node_reports(outcome.state))


def decision_table(results: Sequence[Result], workloads: dict[str, Any]) -> Table:
    table = Table(title="Scheduling decisions (in decision order)", show_lines=False)
    for column in ("workload", "tenant", "node", "score", "placement / reason"):
        table.add_column(column, overflow="fold")
    for result in results:
        if isinstance(result, Binding):
            cpuset = f"cpuset {result.cpuset}" if result.cpuset else ""
            detail = "\n".join(filter(None, [cpuset, format_numa(result), format_grants(result)]))
            table.add_row(result.workload, result.tenant, result.node, str(result.score), escape(detail))
        else:
            w = workloads.get(result.workload)
            style = "yellow" if isinstance(result, QuotaWait) else "red"
            tenant = w.tenant if w is not None else ""
            table.add_row(result.workload, tenant, "-", "-", f"[{style}]{escape(result.message)}[/]")
    return table


def format_numa(binding: Binding) -> str:
    """``numa 0: cpu=2, memory=4Gi`` per NUMA node the binding takes from, and the NUMA shared
    pools an LS workload is bound to (Koordinator's resource-status ``cpuSharedPools``)."""
    parts = []
    for grant in binding.numa:
        amounts = ", ".join(f"{k}={v}" for k, v in grant.resources.to_quantities().items())
        parts.append(f"numa {grant.numa}: {amounts}")
    status = json.loads(binding.annotations.get(ANNOTATION_RESOURCE_STATUS, "{}"))
    pools = status.get("cpuSharedPools") or []
    if pools:
        parts.append("shared pools: " + ", ".join(f"socket {p['socket']} numa {p['node']}" for p in pools))
    return "; ".join(parts)


def summary_table(outcome: PlanOutcome) -> Table:
    data = summary(outcome)
    table = Table(title=f"Summary: {data['placed']} placed, {data['unschedulable']} not placed")
    table.add_column("resource")
    table.add_column("utilization", justify="right")
    for name, fraction in data["utilization"].items():
        table.add_row(name, f"{100 * fraction:.1f} %")
    return table
