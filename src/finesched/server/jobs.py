"""POST /v1/jobs: a dataflow Job (seed S2) compiled into a gang of slot workloads and placed all or none.

The gang is placed at once when it fits (bindings returned, each carrying its operators'
managed-memory quotas); otherwise its slots are stored Pending as one gang and the scheduling
loop places them together when capacity allows.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException

from finesched.admission import admit_job
from finesched.errors import ValidationError
from finesched.model.job import Job
from finesched.sched.diagnosis import FitError
from finesched.server.auth import ADMIN, TENANT
from finesched.server.cluster_view import binding_view
from finesched.server.context import Caller, Ctx
from finesched.server.placement import commit_after_write, insert_bound, log_own
from finesched.server.store import Conflict
from finesched.server.views import InputError, canonical, invalid, namespace_of, parse_kind

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobBody = Annotated[dict[str, Any], Body(description="A Job manifest (dataflow job, seed S2)")]


@router.post("", status_code=201)
def submit_job(body: JobBody, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    from finesched.dataflow import QUOTAS_ANNOTATION, CompileError
    from finesched.dataflow.gang import GROUP_LABEL

    caller.require(ADMIN, TENANT)
    world = ctx.world()
    ctx.check_namespace(caller, namespace_of(body), world)
    job: Job = parse_kind(body, "Job")
    try:
        workloads = admit_job(job, world)
    except CompileError as exc:
        raise InputError([{"loc": ["body", "spec"], "msg": str(exc)}]) from None
    except ValidationError as exc:
        raise invalid(exc, ("body",)) from None
    job_key = f"{job.namespace}/{job.name}"
    taken = ctx.store.existing_workloads([w.key for w in workloads])
    if taken:
        raise HTTPException(409, f"workload {taken[0]} already exists")
    with ctx.loop.lock:
        scheduler = ctx.scheduler()
        try:
            bindings = scheduler.schedule_gang(workloads)
        except FitError as exc:
            bindings, reason = [], exc.message
        except ValidationError as exc:
            raise invalid(exc, ("body",)) from None
        if bindings:

            def write() -> None:
                with ctx.store.write() as conn:
                    log_own(
                        ctx.loop, conn, insert_bound(conn, workloads, bindings, job=job_key, why=f" (job {job_key})")
                    )

            commit_after_write(ctx.loop, bindings, write)
    if not bindings:
        try:
            ids, events = ctx.store.submit([(w.namespace, w.name, w.tenant, canonical(w)) for w in workloads], job_key)
        except Conflict as exc:
            raise HTTPException(409, str(exc)) from None
        ctx.loop.submitted(zip(ids, workloads, strict=True), events)
    ctx.loop.wake()
    by_key = {b.workload: b for b in bindings}
    slots = [
        {
            "workload": w.key,
            "group": w.annotations.get(GROUP_LABEL, ""),
            "binding": binding_view(by_key[w.key]) if w.key in by_key else None,
            "quotas": json.loads(w.annotations.get(QUOTAS_ANNOTATION, "{}")),
        }
        for w in workloads
    ]
    status = "Bound" if bindings else "Pending"
    return {"job": job_key, "status": status, "reason": "" if bindings else reason, "slots": slots}
