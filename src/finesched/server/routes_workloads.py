"""/v1/workloads and /v1/bindings: submit, read, delete (release); agents ack, reject and report status."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Body, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from finesched.admission import World, admit_workload
from finesched.errors import ValidationError
from finesched.model.workload import Workload
from finesched.server import lifecycle
from finesched.server.auth import ADMIN, AGENT, TENANT, Identity
from finesched.server.context import MAX_ITEMS_PER_REQUEST, Caller, Ctx, ServerContext
from finesched.server.store import FAILED, HOLDING, PENDING, PHASES, RUNNING, SUCCEEDED, Conflict, NotFound
from finesched.server.views import (
    InputError,
    Integer,
    binding_row_view,
    canonical,
    invalid,
    namespace_of,
    parse_kind,
    workload_view,
)

router = APIRouter(prefix="/v1", tags=["workloads"])
Phase = Literal["Pending", "Bound", "Running", "Succeeded", "Failed", "Rejected"]
assert get_args(Phase) == PHASES

ManifestBody = Annotated[dict[str, Any] | list[dict[str, Any]], Body(description="A Workload manifest or a list")]


class StatusReport(BaseModel):
    """What a node agent says about a workload it runs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    phase: Literal["Running", "Succeeded", "Failed"]
    reason: str = Field(default="", max_length=4096)
    exit_code: Integer | None = Field(default=None, alias="exitCode")
    info: dict[str, Any] = Field(default_factory=dict)


class RejectReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=4096)


def parse_workloads(body: Any, caller: Identity, ctx: ServerContext, world: World) -> list[Workload]:
    """Every Workload of the body (one or a list) as admission stores it (its tenant is its
    namespace's): all valid, names unique, in namespaces the caller may write to (403 otherwise)."""
    docs = body if isinstance(body, list) else [body]
    if not docs:
        raise InputError([{"loc": ["body"], "msg": "no workloads given"}])
    if len(docs) > MAX_ITEMS_PER_REQUEST:
        raise InputError([{"loc": ["body"], "msg": f"at most {MAX_ITEMS_PER_REQUEST} workloads per request"}], 413)
    for namespace in dict.fromkeys(map(namespace_of, docs)):  # who may write there, before what is written
        ctx.check_namespace(caller, namespace, world)
    workloads, problems, seen = [], [], set()
    for i, doc in enumerate(docs):
        prefix: tuple[str | int, ...] = ("body", i) if isinstance(body, list) else ("body",)
        try:
            workload = parse_kind(doc, "Workload", prefix)
        except InputError as exc:
            problems += exc.details
            continue
        if workload.key in seen:
            problems.append({"loc": [*prefix, "metadata", "name"], "msg": f"duplicate workload {workload.key}"})
        seen.add(workload.key)
        workloads.append(workload)
    if problems:
        raise InputError(problems)
    admitted = []
    for i, workload in enumerate(workloads):
        prefix = ("body", i) if isinstance(body, list) else ("body",)
        try:
            admitted.append(admit_workload(workload, world))
        except ValidationError as exc:
            problems += invalid(exc, prefix).details
    if problems:
        raise InputError(problems)
    return admitted


@router.post("/workloads", status_code=201)
def submit_workloads(body: ManifestBody, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Submit one Workload manifest or a list (all or none); they are Pending until bound."""
    caller.require(ADMIN, TENANT)
    workloads = parse_workloads(body, caller, ctx, ctx.world())
    items = [(w.namespace, w.name, w.tenant, canonical(w)) for w in workloads]
    started = time.thread_time()
    try:
        ids, events = ctx.store.submit(items)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    ctx.metrics.submit_store_seconds.observe(time.thread_time() - started)
    ctx.loop.submitted(zip(ids, workloads, strict=True), events)
    return {"items": [_pending_view(w, i) for w, i in zip(workloads, ids, strict=True)]}


def _pending_view(workload: Workload, workload_id: int) -> dict[str, Any]:
    doc = canonical(workload)
    status = {"phase": PENDING, "reason": "", "tenant": workload.tenant, "binding": None, "id": workload_id}
    return {"metadata": {**doc["metadata"], "namespace": workload.namespace}, "spec": doc["spec"], "status": status}


@router.get("/workloads")
def list_workloads(
    ctx: Ctx,
    caller: Caller,
    namespace: str | None = None,
    tenant: str | None = None,
    phase: Annotated[Phase | None, Query(description=f"one of {', '.join(PHASES)}")] = None,
    node: str | None = None,
    job: str | None = None,
) -> dict[str, Any]:
    """Workloads, oldest first; a tenant token sees those of its tenant's namespaces, an agent token
    those bound to its node."""
    namespaces: tuple[str | None, ...] = (namespace,)
    if caller.role == TENANT:
        if tenant not in (None, caller.tenant):
            raise HTTPException(403, f"this token is for tenant {caller.tenant}, not {tenant}")
        world = ctx.world(devices=False)
        if namespace is not None:
            ctx.check_namespace(caller, namespace, world)
        else:
            namespaces = ctx.namespaces_of(caller, world) or ()
    elif caller.role == AGENT:
        node = caller.node
    rows = []
    for ns in namespaces:
        rows += ctx.store.list_workloads(namespace=ns, tenant=tenant, phase=phase, node=node, job=job)
    rows.sort(key=lambda r: r["id"])
    return {"items": [workload_view(r) for r in rows]}


def _visible_workload(ctx: ServerContext, caller: Identity, namespace: str, name: str) -> dict[str, Any]:
    """The workload if `caller` may see it: a tenant is refused (403) outside its namespaces before
    anything is looked up, so the answer never tells whether another tenant's name exists."""
    ctx.check_namespace(caller, namespace)
    try:
        row = ctx.store.get_workload(namespace, name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    if caller.role == AGENT and row.get("node") != caller.node:
        raise HTTPException(403, f"workload {namespace}/{name} is not bound to node {caller.node}")
    return row


@router.get("/workloads/{namespace}/{name}")
def get_workload(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    return workload_view(_visible_workload(ctx, caller, namespace, name))


@router.delete("/workloads/{namespace}/{name}")
def delete_workload(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Delete a workload; its binding is released (the node agent stops its process)."""
    caller.require(ADMIN, TENANT)
    row = _visible_workload(ctx, caller, namespace, name)
    try:
        ctx.store.delete_workload(namespace, name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    ctx.loop.changed("Workload", f"{namespace}/{name}")
    return {"deleted": f"{namespace}/{name}", "released": row["binding"] is not None}


@router.post("/workloads/{namespace}/{name}/status")
def report_status(namespace: str, name: str, report: StatusReport, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """A node agent reports Running, or the exit (Succeeded / Failed), which releases the binding."""
    row = _visible_workload(ctx, caller, namespace, name)
    if row["binding"] is None or row["phase"] not in HOLDING:
        raise HTTPException(409, f"workload {namespace}/{name} is {row['phase']}, not bound")
    caller.require_node(row["binding"]["node"])
    key = f"{namespace}/{name}"
    info = {**(row.get("info") or {}), **report.info}
    if report.exit_code is not None:
        info["exitCode"] = report.exit_code
    if report.phase == RUNNING:
        ctx.store.set_phase(key, RUNNING, report.reason, info)
        lifecycle.running(ctx.store, row)
        return {"workload": key, "phase": report.phase}
    # an exit: released, or restarted under its restart policy (server/lifecycle.py)
    outcome = lifecycle.exited(ctx.loop, key, SUCCEEDED if report.phase == "Succeeded" else FAILED, report.reason, info)
    return {"workload": key, "phase": report.phase, "outcome": outcome}


@router.get("/bindings")
def list_bindings(ctx: Ctx, caller: Caller, node: str | None = None) -> dict[str, Any]:
    """Bindings, optionally of one node (an agent token sees only its own node's)."""
    if caller.role == AGENT:
        if node not in (None, caller.node):
            raise HTTPException(403, f"this agent token is for node {caller.node}, not {node}")
        node = caller.node
    else:
        caller.require(ADMIN)
    rows = ctx.store.bindings(node)
    run_as = ctx.store.run_as(r["tenant"] for r in rows)  # one read of the tenants, whatever the count
    return {"items": [binding_row_view(r, run_as) for r in rows]}


@router.get("/bindings/{namespace}/{name}")
def get_binding(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    row = _visible_workload(ctx, caller, namespace, name)
    if row["binding"] is None:
        raise HTTPException(404, f"workload {namespace}/{name} is not bound")
    return binding_row_view({**row["binding"], "spec": row["spec"], "phase": row["phase"], "tenant": row["tenant"]},
                            ctx.store.run_as([row["tenant"]]))  # fmt: skip


def _agent_binding(ctx: Ctx, caller: Identity, namespace: str, name: str) -> str:
    row = _visible_workload(ctx, caller, namespace, name)
    if row["binding"] is None:
        raise HTTPException(404, f"workload {namespace}/{name} is not bound")
    caller.require_node(row["binding"]["node"])
    return f"{namespace}/{name}"


@router.post("/bindings/{namespace}/{name}/ack")
def ack_binding(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    key = _agent_binding(ctx, caller, namespace, name)
    try:
        ctx.store.ack(key)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return {"workload": key, "acked": True}


@router.post("/bindings/{namespace}/{name}/reject")
def reject_binding(namespace: str, name: str, report: RejectReport, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """The agent cannot apply the binding: it is released and the workload requeued with the reason,
    placed again after a backoff that grows with each rejection in a row (server/lifecycle.py)."""
    key = _agent_binding(ctx, caller, namespace, name)
    try:
        lifecycle.rejected(ctx.loop, key, report.reason)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return {"workload": key, "phase": PENDING}


#: Routes reached only when no other route matches (app.py includes them last): a workload stored
#: under a name refused today ("a/b", 300 characters) can still be read and deleted.
legacy = APIRouter(prefix="/v1", include_in_schema=False)
legacy.get("/workloads/{namespace}/{name:legacy}")(get_workload)
legacy.delete("/workloads/{namespace}/{name:legacy}")(delete_workload)
