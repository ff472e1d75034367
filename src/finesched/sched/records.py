"""Plain-data records of the Scheduler's decisions: one shape for `finesched plan -o json` and POST /v1/plan.

A decision is a `Binding` (node, score, devices, cpuset, NUMA grants, annotations) or a `FitError`
(why it fits nowhere, with the per-reason node counts); a preemption names who was evicted for whom
and why. The records are JSON-able dicts, so the offline planner and the server answer alike and
`finesched plan --server` renders the server's answer with the same tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from finesched.model.binding import Binding
from finesched.sched.defrag import DefragPlan, Move
from finesched.sched.diagnosis import QuotaWait
from finesched.sched.framework import Preemption
from finesched.sched.scheduler import Result

#: Shows a victim (workload key, tenant) to the reader, or hides it (None) from a tenant who may not see it.
VictimFilter = Callable[[str, str], bool]

#: What a hidden victim's or mover's name and reason are replaced with.
ANOTHER_TENANT = "a workload of another tenant"


def preemption_record(p: Preemption, visible: VictimFilter | None = None) -> dict[str, Any]:
    """Who was evicted for whom, where, and why; victims `visible` refuses are shown without name or tenant."""
    victims = []
    for v in p.victims:
        shown = visible is None or visible(v.workload, v.tenant)
        victims.append(
            {
                "workload": v.workload if shown else None,
                "tenant": v.tenant if shown else None,
                "priority": v.priority,
                "reason": p.reasons.get(v.workload, "") if shown else ANOTHER_TENANT,
            }
        )
    return {"preemptor": p.preemptor, "node": p.node, "victims": victims, "budgetViolations": p.violations}


def binding_record(binding: Binding) -> dict[str, Any]:
    """A placement: node, score, and where they are not empty devices, cpuset, NUMA grants, annotations."""
    record: dict[str, Any] = {
        "workload": binding.workload,
        "tenant": binding.tenant,
        "node": binding.node,
        "score": binding.score,
    }
    if binding.devices:  # exactly as the server's binding view shows them (a MIG grant's `mig` too)
        record["devices"] = binding.devices_doc()
    if binding.cpuset:
        record["cpuset"] = str(binding.cpuset)
    if binding.numa:
        record["numa"] = [g.numa for g in binding.numa]
        record["numaResources"] = {str(g.numa): g.resources.to_quantities() for g in binding.numa}
    if binding.annotations:  # Koordinator's resource-status (cpuset or cpuSharedPools) and device-allocated
        record["annotations"] = dict(binding.annotations)
    return record


def result_record(result: Result, tenants: Mapping[str, str]) -> dict[str, Any]:
    """A plain-data view of one decision; `tenants` maps workload keys to tenants (for the unplaced)."""
    if isinstance(result, Binding):
        return binding_record(result)
    return {
        "workload": result.workload,
        "tenant": tenants.get(result.workload),
        "node": None,
        "waiting" if isinstance(result, QuotaWait) else "error": result.message,
        "reasons": result.reasons,
    }


def move_record(move: Move, visible: VictimFilter | None = None) -> dict[str, Any]:
    """One move of a defragmentation plan: who, from where to where, why; a mover `visible` refuses
    is shown without name, tenant or reason (its reason names the workload it made room for)."""
    shown = visible is None or visible(move.workload, move.tenant)
    return {
        "workload": move.workload if shown else None,
        "tenant": move.tenant if shown else None,
        "from": {"node": move.source.node, "devices": move.source.devices_doc()},
        "to": {"node": move.target.node, "devices": move.target.devices_doc()},
        "reason": move.reason if shown else ANOTHER_TENANT,
    }


def plan_reason(plan: DefragPlan, visible: VictimFilter | None = None) -> str:
    """The plan's reason, with the name of every mover `visible` refuses replaced."""
    reason = plan.reason
    for move in plan.moves:
        if visible is not None and not visible(move.workload, move.tenant):
            reason = reason.replace(move.workload, ANOTHER_TENANT)
    return reason


def decision_records(
    results: Sequence[Result],
    preemptions: Sequence[Preemption],
    tenants: Mapping[str, str],
    misses: Mapping[str, str],
    visible: VictimFilter | None = None,
    defragmentations: Sequence[DefragPlan] = (),
) -> dict[str, Any]:
    """``{results, preemptions, summary}``: every decision in order, marked where it was evicted later
    (``evictedBy``), where it preempted (``preempts``: its victims) or why preemption found nothing;
    a workload placed by moving others lists the ``moves`` (and ``movesReason``), one moved later for
    another of the plan says so (``movedBy``, ``movedTo``: where it runs in the end)."""
    evicted = {key: p for p in preemptions for key in p.victim_keys}
    by_preemptor = {p.preemptor: p for p in preemptions}
    by_waiting = {plan.workload: plan for plan in defragmentations}
    moved = {m.workload: (plan, m) for plan in defragmentations for m in plan.moves}
    records = []
    for result in results:
        record = result_record(result, tenants)
        if result.workload in by_waiting:
            plan = by_waiting[result.workload]
            record["moves"] = [move_record(m, visible) for m in plan.moves]
            record["movesReason"] = plan_reason(plan, visible)
        if result.workload in moved:
            plan, move = moved[result.workload]
            record["movedBy"] = plan.workload
            record["movedTo"] = {"node": move.target.node, "devices": move.target.devices_doc()}
        if result.workload in evicted:
            record["evictedBy"] = evicted[result.workload].preemptor
            record["evictionReason"] = evicted[result.workload].reasons.get(result.workload, "")
        elif isinstance(result, Binding) and result.workload in by_preemptor:
            record["preempts"] = preemption_record(by_preemptor[result.workload], visible)["victims"]
        elif not isinstance(result, Binding) and result.workload in misses:
            record["preemption"] = misses[result.workload]
        records.append(record)
    placed = sum(isinstance(r, Binding) and r.workload not in evicted for r in results)
    unplaced = sum(not isinstance(r, Binding) for r in results)
    summary = {"placed": placed, "unschedulable": unplaced, "evicted": len(evicted)}
    doc: dict[str, Any] = {"results": records, "summary": summary}
    if preemptions:
        doc["preemptions"] = [preemption_record(p, visible) for p in preemptions]
    if defragmentations:
        summary["moves"] = sum(len(plan.moves) for plan in defragmentations)
    return doc
