"""A job as the API shows it: its phase, aggregated from its slots, and what each failover region does.

Phase: Succeeded or Failed once the job has ended (stored on the job); otherwise Restarting while
a region waits out its backoff, Running while a slot runs, Starting when slots are placed (Bound)
but none runs yet (their node agents are starting them: Kubernetes' ContainerCreating, Flink's
DEPLOYING), else Pending (no slot is placed: the job waits for room).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from finesched.model.workload import DEFAULT_BACKOFF_LIMIT
from finesched.server.store import job_store
from finesched.server.store.store import BOUND, PENDING, RUNNING
from finesched.server.store.views import event_view, pending_reason

PENDING_JOB, STARTING, RUNNING_JOB, RESTARTING = PENDING, "Starting", RUNNING, "Restarting"
#: Every phase a job shows (`GET /v1/jobs`), in the order a job goes through them.
JOB_PHASES = (PENDING_JOB, STARTING, RUNNING_JOB, RESTARTING, job_store.SUCCEEDED, job_store.FAILED)


def job_phase(job: Mapping[str, Any], slots: Sequence[Mapping[str, Any]]) -> str:
    """The job's phase (module docstring), from its stored phase and its slots' phases."""
    if job["phase"] in (job_store.SUCCEEDED, job_store.FAILED):
        return str(job["phase"])
    if any(slot["restart_at"] is not None for slot in slots):
        return RESTARTING
    if any(slot["phase"] == RUNNING for slot in slots):
        return RUNNING_JOB
    if any(slot["phase"] == BOUND for slot in slots):
        return STARTING
    return PENDING_JOB


def _slot_view(slot: Mapping[str, Any], live_reasons: Mapping[str, str]) -> dict[str, Any]:
    key = f"{slot['namespace']}/{slot['name']}"
    reason = slot["reason"]
    if slot["phase"] == PENDING:  # never empty, the scheduler's reason now first, as a workload's own view
        reason = pending_reason(reason, live_reasons.get(key))
    return {
        "workload": key,
        "phase": slot["phase"],
        "node": slot.get("node"),
        "restarting": slot["restart_at"] is not None,
        "reason": reason,
    }


def job_view(
    job: Mapping[str, Any],
    slots: Sequence[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]] | None = None,
    live_reasons: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """{metadata, spec, status: {phase, reason, restartPolicy, backoffLimit, failures, slots (count per
    phase), regions: [{index, tasks, slots, phases, restarts}]}} (+ events when given); a Pending
    slot's reason is `pending_reason` of its stored one and `live_reasons` (the scheduler's now)."""
    doc = job["spec"]
    spec = doc.get("spec", {})
    by_name = {slot["name"]: slot for slot in slots}
    regions = []
    for index, region in enumerate(job["regions"]):
        members = [by_name[name] for name in region["slots"] if name in by_name]
        regions.append(
            {
                "index": index,
                "tasks": region["tasks"],
                "slots": [_slot_view(slot, live_reasons or {}) for slot in members],
                "phases": dict(Counter(slot["phase"] for slot in members)),
                "restarts": region.get("restarts", 0),
                "restarting": any(slot["restart_at"] is not None for slot in members),
            }
        )
    view: dict[str, Any] = {
        "metadata": {
            **doc.get("metadata", {}),
            "namespace": job["namespace"],
            "name": job["name"],
            "uid": job.get("uid"),
        },
        "spec": spec,
        "status": {
            "phase": job_phase(job, slots),
            "reason": job["reason"],
            "tenant": job["tenant"],
            "restartPolicy": spec.get("restartPolicy", "OnFailure"),
            "backoffLimit": spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT),
            "failures": job["failures"],
            "slots": {"total": len(slots), **Counter(slot["phase"] for slot in slots)},
            "regions": regions,
            "created": job["created"].isoformat(),
            "updated": job["updated"].isoformat(),
        },
    }
    if events is not None:
        view["events"] = [event_view(e) for e in events]
    return view
