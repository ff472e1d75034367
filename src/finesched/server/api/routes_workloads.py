"""/v1/workloads and /v1/bindings: submit, read, delete (release); agents ack, reject and report status."""

from __future__ import annotations

import gc
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Body, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from finesched.admission import World, admit_workload
from finesched.errors import ValidationError
from finesched.model.manifest import uid_problem
from finesched.model.selector import parse_selector
from finesched.model.workload import Workload
from finesched.server.api import paging
from finesched.server.api.auth import ADMIN, AGENT, TENANT, Identity
from finesched.server.api.authz import ManifestWriter, check_namespaces
from finesched.server.api.context import MAX_ITEMS_PER_REQUEST, Caller, Ctx, ServerContext
from finesched.server.api.group_commit import Pending
from finesched.server.api.paging import ContinueQuery, LimitQuery
from finesched.server.api.quota import Charge, QuotaExceeded, charge_all
from finesched.server.loop import lifecycle, memory
from finesched.server.store.schema import new_uid
from finesched.server.store.store import FAILED, HOLDING, PENDING, PHASES, RUNNING, SUCCEEDED, Conflict, NotFound
from finesched.server.store.views import (
    InputError,
    Integer,
    binding_row_view,
    canonical,
    invalid,
    parse_kind,
    pending_reason,
    workload_view,
)

log = logging.getLogger("finesched.server")
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
    namespace's): all valid, names unique, in namespaces the caller may write to, with priorities a
    tenant's token may ask for (403 otherwise: `NotAllowed`, answered by the app)."""
    docs = body if isinstance(body, list) else [body]
    if not docs:
        raise InputError([{"loc": ["body"], "msg": "no workloads given"}])
    if len(docs) > MAX_ITEMS_PER_REQUEST:
        raise InputError([{"loc": ["body"], "msg": f"at most {MAX_ITEMS_PER_REQUEST} workloads per request"}], 413)
    check_namespaces(ctx, caller, docs, world)  # who may write there, before what is written
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
            admitted.append(admit_workload(workload, world, as_tenant=caller.role == TENANT))
        except ValidationError as exc:
            problems += invalid(exc, prefix).details
    if problems:
        raise InputError(problems)
    return admitted


@router.post("/workloads", status_code=201)
async def submit_workloads(body: ManifestBody, ctx: Ctx, caller: ManifestWriter) -> dict[str, Any]:
    """Submit one Workload manifest or a list (all or none); they are Pending until bound.
    Concurrent submissions are checked and written together (`_submit_group`)."""
    return await ctx.submissions.run((body, caller), lambda group: _submit_group(ctx, group))  # type: ignore[no-any-return]


def _submit_group(ctx: ServerContext, group: list[Pending[tuple[Any, Identity]]]) -> None:
    """Concurrent submissions, each checked as alone (admission against the stored objects read once
    for the group, the tenants' quotas in its own savepoint, in arrival order) and written in one
    transaction: a refused one changes nothing and its error is its own; the loop is handed the
    group's workloads and woken once, after the commit (server/api/group_commit.py)."""
    world = ctx.world()
    accepted: list[tuple[Pending[tuple[Any, Identity]], list[Workload], list[str]]] = []
    for pending in group:
        body, caller = pending.item
        try:
            workloads = parse_workloads(body, caller, ctx, world)
        except Exception as exc:  # its answer (422, 403, 413); the others go on
            pending.error = exc
            continue
        accepted.append((pending, workloads, [new_uid() for _ in workloads]))
    if not accepted:
        return
    requests = [([(w.namespace, w.name, w.tenant, canonical(w)) for w in workloads], uids)
                for _, workloads, uids in accepted]  # fmt: skip

    def check(conn: Connection, indexes: Sequence[int]) -> None:
        per_tenant: dict[str, int] = {}
        for i in indexes:
            for w in accepted[i][1]:
                per_tenant[w.tenant] = per_tenant.get(w.tenant, 0) + 1
        charge_all(conn, {tenant: Charge(workloads=n, pending=n) for tenant, n in per_tenant.items()})

    started = time.thread_time()
    results = ctx.store.submit_group(requests, check, refusals=(QuotaExceeded,))
    ctx.metrics.submit_store_seconds.observe(time.thread_time() - started)
    stored, events = [], []
    for (pending, workloads, uids), (items, _), result in zip(accepted, requests, results, strict=True):
        if isinstance(result, Conflict):
            pending.error = HTTPException(409, str(result))
        elif isinstance(result, QuotaExceeded):
            pending.error = HTTPException(403, str(result))
        elif isinstance(result, Exception):
            pending.error = result
        else:
            ids, event_ids = result
            stored += zip(ids, workloads, strict=True)
            events += event_ids
            pending.answer = (workloads, [doc for _, _, _, doc in items], ids, uids)
    if stored:
        ctx.loop.submitted(stored, events)
    live = ctx.loop.reasons((w.key for _, w in stored), wait=False)
    for pending, _, _ in accepted:
        if pending.error is None:
            workloads, docs, ids, uids = pending.answer
            views = zip(workloads, docs, ids, uids, strict=True)
            pending.answer = {"items": [_pending_view(w, d, i, u, live.get(w.key)) for w, d, i, u in views]}


def _pending_view(
    workload: Workload, doc: dict[str, Any], workload_id: int, uid: str, live_reason: str | None
) -> dict[str, Any]:
    """The answer for a workload just stored: `doc` is its canonical manifest, as stored."""
    reason = pending_reason("", live_reason)
    status = {"phase": PENDING, "reason": reason, "tenant": workload.tenant, "binding": None, "id": workload_id}
    metadata = {**doc["metadata"], "namespace": workload.namespace, "uid": uid}
    return {"metadata": metadata, "spec": doc["spec"], "status": status}


@router.get("/workloads")
def list_workloads(
    ctx: Ctx,
    caller: Caller,
    namespace: str | None = None,
    tenant: str | None = None,
    phase: Annotated[Phase | None, Query(description=f"one of {', '.join(PHASES)}")] = None,
    node: str | None = None,
    job: str | None = None,
    limit: LimitQuery = None,
    continue_: ContinueQuery = None,
) -> dict[str, Any]:
    """Workloads, oldest first, a page at a time (`limit`, `continue`); a tenant token sees those of
    its tenant's namespaces, an agent token those bound to its node."""
    namespaces: tuple[str, ...] | None = None
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
    filters = {"namespace": namespace, "tenant": tenant, "phase": phase, "node": node, "job": job}
    page = paging.request("workloads", filters, limit, continue_)
    found = ctx.store.workload_page(page.after, page.limit, namespaces, **filters)  # type: ignore[arg-type]
    last = found.rows[-1]["id"] if found.rows else None
    live = ctx.loop.reasons(_pending_keys(found.rows))
    items = [workload_view(r, live.get(f"{r['namespace']}/{r['name']}")) for r in found.rows]
    return page.answer(items, last, found.remaining)


def _pending_keys(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    return [f"{r['namespace']}/{r['name']}" for r in rows if r["phase"] == PENDING]


def visible_workloads(ctx: ServerContext, caller: Identity, **filters: str | None) -> list[dict[str, Any]]:
    """Every workload `GET /v1/workloads` lists for `caller` with these filters, all pages followed
    (for the server's own views; each page is answered by the route itself)."""
    items: list[dict[str, Any]] = []
    token = None
    query: dict[str, Any] = {"namespace": None, "tenant": None, "phase": None, "node": None, "job": None, **filters}
    while True:
        answer = list_workloads(ctx, caller, **query, limit=paging.MAX_PAGE, continue_=token)
        items += answer["items"]
        token = answer["metadata"].get("continue")
        if token is None:
            return items


@router.delete("/workloads")
def delete_workloads(
    ctx: Ctx,
    caller: Caller,
    namespace: Annotated[str | None, Query(description="The namespace (required for a tenant token)")] = None,
    label_selector: Annotated[
        str | None,
        Query(alias="labelSelector", description="Only workloads whose labels match, e.g. `app=web,tier!=db`"),
    ] = None,
) -> dict[str, Any]:
    """Delete many workloads at once (Kubernetes' deletecollection): those of `namespace` (an admin
    without one: of every namespace) whose labels match `labelSelector` (none: all). Their bindings
    are released (node agents stop the processes), a thousand per transaction, with one Deleted event
    each. A Job's slots are left to their job (`DELETE /v1/jobs/{namespace}/{name}`)."""
    caller.require(ADMIN, TENANT)
    if namespace is None and caller.role == TENANT:
        raise InputError([{"loc": ["query", "namespace"], "msg": "a tenant token names the namespace to delete in"}])
    if namespace is not None:
        ctx.check_namespace(caller, namespace)
    matches: Callable[[Mapping[str, str]], bool] | None = None
    if label_selector:
        try:
            matches = parse_selector(label_selector).matches
        except ValidationError as exc:
            raise invalid(exc, ("query",)) from None
    deleted = released = 0
    for keys, bound, event_ids in ctx.store.delete_workloads(namespace, matches):
        ctx.loop.deleted(keys, event_ids)
        deleted += len(keys)
        released += len(bound)
    if deleted >= 1000:
        _give_memory_back(ctx)
    log.info("deleted %d workloads (namespace %s, selector %r)", deleted, namespace or "*", label_selector or "")
    return {"deleted": deleted, "released": released, "namespace": namespace, "labelSelector": label_selector or ""}


def _give_memory_back(ctx: ServerContext) -> None:
    """After a large delete: shrink what grew with the deleted workloads and stays (the loop's table
    of queued workloads, the database connections' caches), collect, and let the C allocator
    return its free pages to the system (glibc keeps them otherwise). BENCHMARKS.md ("Fairness
    under one tenant's flood") has what held the memory and what this gives back."""
    ctx.loop.compact()
    ctx.store.engines.release_idle()
    gc.collect()
    memory.trim()


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
    row = _visible_workload(ctx, caller, namespace, name)
    return workload_view(row, ctx.loop.reasons(_pending_keys([row])).get(f"{namespace}/{name}"))


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


def _agent_workload(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """The workload an agent reports on (an admin's: any), before the report is read: another
    node's agent, or a tenant, is answered 403 whatever it sends."""
    row = _visible_workload(ctx, caller, namespace, name)
    caller.require(ADMIN, AGENT)
    return row


AgentWorkload = Annotated[dict[str, Any], Depends(_agent_workload)]
#: The workload object an agent's report is about (the binding's uid); none from older agents.
ObjectUid = Annotated[
    str | None,
    Query(
        description="the uid of the workload the agent's binding is for: a report about another object "
        "(deleted since, its name taken again) is refused with 409; older agents send none"
    ),
]


def _same_object(row: Mapping[str, Any], uid: str | None) -> None:
    """Refuse (409) an agent's report about an earlier object of this name (an older agent sends no
    uid: its report is taken as about the workload of that name now, as before uids)."""
    if uid is None:
        return
    if uid_problem(uid):
        raise InputError([{"loc": ["query", "uid"], "msg": uid_problem(uid), "input": uid}])
    if str(uuid.UUID(uid)) != row["uid"]:
        key = f"{row['namespace']}/{row['name']}"
        raise HTTPException(409, f"workload {key} is another object now (uid {row['uid']}, not {uid}): the "
                                 "binding reported on was for a workload deleted since")  # fmt: skip


@router.post("/workloads/{namespace}/{name}/status")
def report_status(namespace: str, name: str, report: StatusReport, ctx: Ctx, caller: Caller,
                  row: AgentWorkload, uid: ObjectUid = None) -> dict[str, Any]:  # fmt: skip
    """A node agent reports Running, or the exit (Succeeded / Failed), which releases the binding."""
    _same_object(row, uid)
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
    # an exit: released, or restarted under its restart policy (server/loop/lifecycle.py)
    outcome = lifecycle.exited(ctx.loop, key, SUCCEEDED if report.phase == "Succeeded" else FAILED, report.reason, info)
    return {"workload": key, "phase": report.phase, "outcome": outcome}


@router.get("/bindings")
def list_bindings(
    ctx: Ctx, caller: Caller, node: str | None = None, limit: LimitQuery = None, continue_: ContinueQuery = None
) -> dict[str, Any]:
    """Bindings, optionally of one node (an agent token sees only its own node's), by workload id, a
    page at a time. One node's bindings without `limit` come in one answer, all of them (what node
    agents read; a node holds what fits on it)."""
    if caller.role == AGENT:
        if node not in (None, caller.node):
            raise HTTPException(403, f"this agent token is for node {caller.node}, not {node}")
        node = caller.node
    else:
        caller.require(ADMIN)
    default = None if node is not None else paging.DEFAULT_PAGE
    page = paging.request("bindings", {"node": node}, limit, continue_, default=default)
    found = ctx.store.binding_page(node, page.after, page.limit)  # type: ignore[arg-type]
    last = found.rows[-1]["workload_id"] if found.rows else None
    run_as = ctx.store.run_as(r["tenant"] for r in found.rows)  # one read of the tenants, whatever the count
    return page.answer([binding_row_view(r, run_as) for r in found.rows], last, found.remaining)


@router.get("/bindings/{namespace}/{name}")
def get_binding(namespace: str, name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    row = _visible_workload(ctx, caller, namespace, name)
    if row["binding"] is None:
        raise HTTPException(404, f"workload {namespace}/{name} is not bound")
    return binding_row_view({**row["binding"], "spec": row["spec"], "phase": row["phase"], "tenant": row["tenant"],
                             "uid": row["uid"]}, ctx.store.run_as([row["tenant"]]))  # fmt: skip


def _agent_binding(ctx: Ctx, caller: Identity, namespace: str, name: str, uid: str | None = None) -> str:
    row = _visible_workload(ctx, caller, namespace, name)
    _same_object(row, uid)
    if row["binding"] is None:
        raise HTTPException(404, f"workload {namespace}/{name} is not bound")
    caller.require_node(row["binding"]["node"])
    return f"{namespace}/{name}"


@router.post("/bindings/{namespace}/{name}/ack")
def ack_binding(namespace: str, name: str, ctx: Ctx, caller: Caller, uid: ObjectUid = None) -> dict[str, Any]:
    key = _agent_binding(ctx, caller, namespace, name, uid)
    try:
        ctx.store.ack(key)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return {"workload": key, "acked": True}


@router.post("/bindings/{namespace}/{name}/reject", dependencies=[Depends(_agent_workload)])
def reject_binding(
    namespace: str, name: str, report: RejectReport, ctx: Ctx, caller: Caller, uid: ObjectUid = None
) -> dict[str, Any]:
    """The agent cannot apply the binding: it is released and the workload requeued with the reason,
    placed again after a backoff that grows with each rejection in a row (server/loop/lifecycle.py)."""
    key = _agent_binding(ctx, caller, namespace, name, uid)
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
