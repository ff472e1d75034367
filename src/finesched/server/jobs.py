"""/v1/jobs: submit a dataflow Job (seed S2), list and read jobs, delete one with all its slots.

A job is compiled into a gang of slot workloads, each running the command its manifest gives
(`finesched.dataflow.commands`; a job that would leave a slot with nothing to run is refused with
422 naming the field). The gang is placed at once when it fits (bindings returned, each carrying
its operators' managed-memory quotas); otherwise its slots are stored Pending as one gang and the
scheduling loop places them together when capacity allows. The job row and its slots are written
in one transaction. What a job does afterwards (phase, region restarts) is server/loop/lifecycle.py's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, HTTPException
from sqlalchemy.exc import IntegrityError

from finesched.admission import admit_job
from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.job import Job
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.server.api import paging
from finesched.server.api.auth import ADMIN, TENANT, Identity
from finesched.server.api.authz import ManifestWriter
from finesched.server.api.context import Caller, Ctx, ServerContext
from finesched.server.api.paging import ContinueQuery, LimitQuery
from finesched.server.api.quota import Charge, QuotaExceeded, charge
from finesched.server.loop.placement import commit_after_write, insert_bound, leader_write, log_own
from finesched.server.store import job_store
from finesched.server.store.cluster_view import binding_view
from finesched.server.store.job_status import job_view
from finesched.server.store.store import PENDING, Event, NotFound, Store
from finesched.server.store.views import InputError, canonical, detail_of, invalid, parse_kind

if TYPE_CHECKING:
    from finesched.dataflow.compile import CompiledJob

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobBody = Annotated[dict[str, Any], Body(description="A Job manifest (dataflow job, seed S2)")]
MAX_JOB_EVENTS = 200


@router.post("", status_code=201)
def submit_job(body: JobBody, ctx: Ctx, caller: ManifestWriter) -> dict[str, Any]:
    """Compile the Job into its slots and place them all at once if they fit now (and its tenant's
    quota admits them), else store them Pending for the loop: all slots or none, never some."""
    from finesched.dataflow.failover import failover_regions, region_tasks
    from finesched.dataflow.gang import slot_name

    job, compiled, workloads = _admitted(body, ctx, caller)
    regions = [
        {"tasks": region_tasks(compiled, region), "slots": [slot_name(job, g, i) for g, i in sorted(region)],
         "restarts": 0}
        for region in failover_regions(compiled)
    ]  # fmt: skip
    with ctx.loop.lock:
        bindings, reason = _place_now(ctx, job, workloads, regions)
    if not bindings:
        _store_pending(ctx, job, workloads, regions, reason)
    ctx.loop.wake()
    return _submitted(job, workloads, bindings, reason)


def _admitted(body: JobBody, ctx: ServerContext, caller: Identity) -> tuple[Job, CompiledJob, list[Workload]]:
    """The Job, compiled, and its slots as workloads, admitted as a submission is (422 with the
    field, 403 for a rule the caller may not break); 409 when it or one of its slots exists."""
    from finesched.dataflow.commands import command_problems

    world = ctx.world()  # the caller's role and namespace were checked before the body was (ManifestWriter)
    job: Job = parse_kind(body, "Job")
    try:
        # CompileError is a ValidationError too; NotAllowed (a tenant's PriorityClass rule) is a 403
        compiled, workloads = admit_job(job, world, as_tenant=caller.role == TENANT)
    except ValidationError as exc:
        raise invalid(exc, ("body",)) from None
    problems = command_problems(job, compiled)
    if problems:
        raise InputError([detail_of(p) for p in problems])
    if job_store.find_job(ctx.store, job.namespace, job.name) is not None:
        raise HTTPException(409, f"job {job.namespace}/{job.name} already exists")
    taken = ctx.store.existing_workloads([w.key for w in workloads])
    if taken:
        raise HTTPException(409, f"workload {taken[0]} already exists")
    return job, compiled, workloads


def _place_now(
    ctx: ServerContext, job: Job, workloads: list[Workload], regions: list[dict[str, Any]]
) -> tuple[list[Binding], str]:
    """Place every slot now and store the job with them bound (the caller holds the loop's lock);
    none placed, with why, when they do not all fit or the tenant's quota does not admit them."""
    scheduler = ctx.scheduler()
    quota = scheduler.queue.group_quota_problem(workloads)
    if quota is not None:  # over its tenant's quota now: the slots wait in the queue, as any unit
        return [], f"waiting: {quota}"
    try:
        bindings = scheduler.schedule_gang(workloads)
    except FitError as exc:
        return [], exc.message
    except ValidationError as exc:
        raise invalid(exc, ("body",)) from None
    job_key = f"{job.namespace}/{job.name}"
    submitted = Event("Job", job_key, "Submitted", f"{len(workloads)} slots, {len(regions)} region(s): bound")

    def write() -> None:
        with leader_write(ctx.loop) as conn:
            charge(conn, workloads[0].tenant, Charge(workloads=len(workloads), jobs=1))
            job_store.insert_job(conn, job.namespace, job.name, workloads[0].tenant, canonical(job), regions)
            events = insert_bound(conn, workloads, bindings, job=job_key, why=f" (job {job_key})")
            log_own(ctx.loop, conn, [*events, submitted])

    try:
        commit_after_write(ctx.loop, bindings, write)
    except IntegrityError:
        raise HTTPException(409, f"job {job_key} or one of its slots already exists") from None
    except QuotaExceeded as exc:
        raise HTTPException(403, str(exc)) from None
    return bindings, ""


def _store_pending(
    ctx: ServerContext, job: Job, workloads: list[Workload], regions: list[dict[str, Any]], reason: str
) -> None:
    """Store the job with every slot Pending, and hand the slots to the loop's queue."""
    job_key = f"{job.namespace}/{job.name}"
    items = [(w.namespace, w.name, w.tenant, canonical(w)) for w in workloads]
    try:
        with ctx.store.write() as conn:
            charge(conn, workloads[0].tenant, Charge(workloads=len(workloads), pending=len(workloads), jobs=1))
            job_store.insert_job(conn, job.namespace, job.name, workloads[0].tenant, canonical(job), regions)
            ids, events = Store.insert_pending(conn, items, job_key)
            why = f"{len(workloads)} slots, {len(regions)} region(s): pending ({reason})"
            events += Store.log(conn, [Event("Job", job_key, "Submitted", why)])
    except IntegrityError:
        raise HTTPException(409, f"job {job_key} or one of its slots already exists") from None
    except QuotaExceeded as exc:
        raise HTTPException(403, str(exc)) from None
    ctx.loop.submitted(zip(ids, workloads, strict=True), events)


def _submitted(job: Job, workloads: list[Workload], bindings: list[Binding], reason: str) -> dict[str, Any]:
    """The answer: each slot's binding (or none yet) and its operators' managed-memory quotas."""
    from finesched.dataflow import QUOTAS_ANNOTATION
    from finesched.dataflow.gang import GROUP_LABEL

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
    return {"job": f"{job.namespace}/{job.name}", "status": status, "reason": reason, "slots": slots}


@router.get("")
def list_jobs(
    ctx: Ctx, caller: Caller, namespace: str | None = None, limit: LimitQuery = None, continue_: ContinueQuery = None
) -> dict[str, Any]:
    """Jobs with their phase and slot counts, oldest first, a page at a time (`limit`, `continue`); a
    tenant token sees those of its tenant's namespaces, as for workloads."""
    caller.require(ADMIN, TENANT)
    namespaces: tuple[str, ...] | None = (namespace,) if namespace is not None else None
    if caller.role == TENANT:
        world = ctx.world(devices=False)
        if namespace is not None:
            ctx.check_namespace(caller, namespace, world)
        else:
            namespaces = ctx.namespaces_of(caller, world) or ()
    page = paging.request("jobs", {"namespace": namespace}, limit, continue_)
    found = job_store.job_page(ctx.store, page.after, page.limit, namespaces)  # type: ignore[arg-type]
    rows = found.rows
    slots = job_store.slots_by_job(ctx.store, [f"{r['namespace']}/{r['name']}" for r in rows])
    items = [job_view(r, slots[f"{r['namespace']}/{r['name']}"]) for r in rows]
    return page.answer(items, rows[-1]["id"] if rows else None, found.remaining)


def _visible_job(ctx: ServerContext, caller: Identity, namespace: str, name: str) -> dict[str, Any]:
    """The job if `caller` may see it: a tenant is refused (403) outside its namespaces before
    anything is looked up, so the answer never tells whether another tenant's job exists."""
    caller.require(ADMIN, TENANT)
    ctx.check_namespace(caller, namespace)
    row = job_store.find_job(ctx.store, namespace, name)
    if row is None:
        raise HTTPException(404, f"job {namespace}/{name} not found")
    return row


@router.get("/{namespace}/{name}")
def get_job(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """The job, its phase aggregated from its slots, per-region slot phases and restarts, and the
    latest events of the job and its slots."""
    row = _visible_job(ctx, caller, namespace, name)
    key = f"{namespace}/{name}"
    slots = job_store.slots_by_job(ctx.store, [key])[key]
    slot_keys = [f"{s['namespace']}/{s['name']}" for s in slots]
    uids = [row["uid"], *(s["uid"] for s in slots)]
    events = job_store.events_of(ctx.store, key, slot_keys, MAX_JOB_EVENTS, uids)
    live = ctx.loop.reasons(f"{s['namespace']}/{s['name']}" for s in slots if s["phase"] == PENDING)
    return job_view(row, slots, events, live)


@router.delete("/{namespace}/{name}")
def delete_job(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Delete the job and all its slots at once: their bindings are released and the node agents
    stop the slots' processes."""
    _visible_job(ctx, caller, namespace, name)
    try:
        _, slots = job_store.delete_job(ctx.store, namespace, name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    keys = [f"{s['namespace']}/{s['name']}" for s in slots]
    for key in keys:
        ctx.loop.changed("Workload", key)
    return {"deleted": f"{namespace}/{name}", "slots": keys, "released": sum(1 for s in slots if s["bound"])}
