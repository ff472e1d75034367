"""`finesched plan`: schedule manifests offline through the queue and show every decision.

The same Scheduler the server and the simulator use; nothing is written anywhere. Output is a
rich table (or JSON/YAML for scripts) plus a summary: placed / waiting and the utilization of
every resource afterwards. Preemptions (on in the default profile; `--no-preemption` turns them
off) are listed with who was evicted for whom and why; an evicted workload's row says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.devices import format_grants
from finesched.model.binding import Binding
from finesched.model.manifest import Manifests
from finesched.model.workload import Workload
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS, node_report, render_node_reports
from finesched.sched.diagnosis import QuotaWait
from finesched.sched.framework import Preemption
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
    preemptions: list[Preemption] = field(default_factory=list)

    def evicted_by(self) -> dict[str, Preemption]:
        """Evicted workload -> the preemption that evicted it."""
        return {key: p for p in self.preemptions for key in p.victim_keys}


def run_plan(
    manifests: Manifests,
    profile: str | Profile = "default",
    *,
    preemption: bool = True,
    waves: Sequence[Sequence[Workload]] | None = None,
) -> PlanOutcome:
    """Schedule every workload of `manifests` on its nodes through the queue (priority, DRF, preemption).

    With `waves`, each group of workloads is submitted and scheduled after the previous one (work
    that arrives later, e.g. a high-priority service after batch jobs filled the cluster: what
    preemption is for); without, all workloads are submitted at once.
    """
    state = ClusterState.from_nodes(manifests.nodes)
    scheduler = Scheduler(state, profile, manifests.tenants, preemption=preemption)
    results: list[Result] = []
    for wave in waves if waves is not None else [manifests.workloads]:
        scheduler.submit(wave)
        results += scheduler.run(report_waiting=False)
    results += scheduler.run()
    return PlanOutcome(state, scheduler, results, scheduler.take_preemptions())


def preemption_record(p: Preemption) -> dict[str, Any]:
    """A plain-data view of one preemption: who was evicted for whom, where, and why."""
    return {
        "preemptor": p.preemptor,
        "node": p.node,
        "victims": [
            {
                "workload": v.workload,
                "tenant": v.tenant,
                "priority": v.priority,
                "reason": p.reasons.get(v.workload, ""),
            }
            for v in p.victims
        ],
        "budgetViolations": p.violations,
    }


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
    evicted = outcome.evicted_by()
    placed = sum(isinstance(r, Binding) and r.workload not in evicted for r in outcome.results)
    return {
        "placed": placed,
        "unschedulable": len(outcome.results) - placed - len(evicted),
        "evicted": len(evicted),
        "utilization": {k: round(v, 4) for k, v in utilization(outcome.state).items()},
    }


def render(
    outcome: PlanOutcome, manifests: Manifests, output: str, console: Console, *, show_nodes: bool = False
) -> None:
    workloads = {w.key: w for w in manifests.workloads}
    if output in ("json", "yaml"):
        evicted = outcome.evicted_by()
        records = []
        for r in outcome.results:
            record = result_record(r, workloads)
            if r.workload in evicted:
                record["evictedBy"] = evicted[r.workload].preemptor
            elif not isinstance(r, Binding) and r.workload in outcome.scheduler.preemption_misses:
                record["preemption"] = outcome.scheduler.preemption_misses[r.workload]
            records.append(record)
        doc: dict[str, Any] = {"results": records, "summary": summary(outcome)}
        if outcome.preemptions:
            doc["preemptions"] = [preemption_record(p) for p in outcome.preemptions]
        if show_nodes:
            doc["nodes"] = [node_report(outcome.state, name) for name in outcome.state.names]
        text = json.dumps(doc, indent=2) if output == "json" else yaml.safe_dump(doc, sort_keys=False)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    console.print(decision_table(outcome.results, workloads, outcome.evicted_by()))
    if outcome.preemptions:
        console.print(preemption_table(outcome.preemptions))
    console.print(summary_table(outcome))
    if show_nodes:
        console.print(render_node_reports(outcome.state))


def decision_table(
    results: Sequence[Result], workloads: dict[str, Any], evicted: dict[str, Preemption] | None = None
) -> Table:
    table = Table(title="Scheduling decisions (in decision order)", show_lines=False)
    for column in ("workload", "tenant", "node", "score", "placement / reason"):
        table.add_column(column, overflow="fold")
    evicted = evicted or {}
    for result in results:
        if isinstance(result, Binding) and result.workload in evicted:
            p = evicted[result.workload]
            why = f"evicted by {p.preemptor} ({p.reasons.get(result.workload, '')})"
            table.add_row(result.workload, result.tenant, result.node, str(result.score), f"[magenta]{escape(why)}[/]")
        elif isinstance(result, Binding):
            cpuset = f"cpuset {result.cpuset}" if result.cpuset else ""
            detail = "\n".join(filter(None, [cpuset, format_numa(result), format_grants(result)]))
            table.add_row(result.workload, result.tenant, result.node, str(result.score), escape(detail))
        else:
            w = workloads.get(result.workload)
            style = "yellow" if isinstance(result, QuotaWait) else "red"
            tenant = w.tenant if w is not None else ""
            table.add_row(result.workload, tenant, "-", "-", f"[{style}]{escape(result.message)}[/]")
    return table


def preemption_table(preemptions: Sequence[Preemption]) -> Table:
    table = Table(title="Preemptions (in decision order)")
    for column in ("preemptor", "node", "evicted", "why"):
        table.add_column(column, overflow="fold")
    for p in preemptions:
        victims = "\n".join(f"{v.workload} (tenant {v.tenant}, priority {v.priority})" for v in p.victims)
        reasons = "\n".join(p.reasons.get(v.workload, "") for v in p.victims)
        if p.violations:
            reasons += f"\nbreaks {p.violations} disruption budget(s)"
        table.add_row(p.preemptor, p.node, escape(victims), escape(reasons))
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
    evicted = f", {data['evicted']} evicted" if data["evicted"] else ""
    table = Table(title=f"Summary: {data['placed']} placed, {data['unschedulable']} not placed{evicted}")
    table.add_column("resource")
    table.add_column("utilization", justify="right")
    for name, fraction in data["utilization"].items():
        table.add_row(name, f"{100 * fraction:.1f} %")
    return table
