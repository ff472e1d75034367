"""/v1/tenants (weights and quotas, usage with dominant share) and /v1/events (list, Server-Sent Events watch)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import delete, or_, select
from starlette.concurrency import run_in_threadpool

from finesched.admission import admit_tenant, sound_tenants
from finesched.errors import ValidationError
from finesched.model.tenant import Tenant
from finesched.sched.queue import demand_of
from finesched.server import schema as t
from finesched.server.auth import ADMIN, TENANT, Identity, revoke_tenant_tokens
from finesched.server.authz import AdminCaller
from finesched.server.cluster_view import tenant_from_row
from finesched.server.context import Caller, Ctx, ServerContext
from finesched.server.feed import FeedCursor
from finesched.server.store import Conflict, Event, NotFound, Store
from finesched.server.views import InputError, canonical, event_view, invalid, parse_kind, tenant_view

router = APIRouter(prefix="/v1", tags=["tenants", "events"])

TenantBody = Annotated[dict[str, Any], Body(description="A Tenant manifest")]
PatchBody = Annotated[dict[str, Any], Body(description="Tenant spec fields to change, e.g. {weight, quota}")]
WATCH_POLL_S = 0.25
WATCH_KEEPALIVE_S = 15.0
WATCH_PAGE = 500
#: Event ids are 64-bit (the store's sequence); a larger `since` is refused, not sent to the database.
MAX_EVENT_ID = 2**63 - 1


def _store_tenant(ctx: ServerContext, tenant: Tenant, *, create_only: bool) -> bool:
    """Admit `tenant` against the stored tenants (parent, cycles, namespaces), then store it.

    A namespace taken away from the tenant must be empty first (409): its workloads would
    otherwise change owner under their tenant's tokens."""
    world = ctx.world(devices=False)
    try:
        tenant = admit_tenant(tenant, world)
    except ValidationError as exc:
        raise invalid(exc) from None
    before = world.tenants.get(tenant.name)
    if before is not None:
        dropped = [n for n in before.owned_namespaces if n not in tenant.owned_namespaces]
        in_use = [n for n in dropped if ctx.store.list_workloads(namespace=n)]
        if in_use:
            raise HTTPException(409, f"namespace {in_use[0]} still holds workloads; delete them before ungranting it")
    try:
        created = ctx.store.put_tenant(tenant.name, tenant.weight, canonical(tenant), create_only=create_only)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    ctx.loop.changed("Tenant", tenant.name)
    return created


@router.post("/tenants", status_code=201)
def create_tenant(body: TenantBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    caller.require(ADMIN)
    tenant: Tenant = parse_kind(body, "Tenant")
    _store_tenant(ctx, tenant, create_only=True)
    return _tenant_view(ctx, ctx.store.get_tenant(tenant.name))


@router.put("/tenants/{name}")
def put_tenant(name: str, body: TenantBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    caller.require(ADMIN)
    tenant: Tenant = parse_kind(body, "Tenant")
    if tenant.name != name:
        raise InputError([{"loc": ["body", "metadata", "name"], "msg": f"must be {name!r} (the URL's name)"}])
    _store_tenant(ctx, tenant, create_only=False)
    return _tenant_view(ctx, ctx.store.get_tenant(name))


@router.patch("/tenants/{name}")
def patch_tenant(name: str, body: PatchBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Change some spec fields (weight, quota, ...); the result is validated like a whole manifest."""
    caller.require(ADMIN)
    row = _tenant_row(ctx, name)
    doc = dict(row["spec"])
    doc["spec"] = {**doc.get("spec", {}), **body}
    tenant: Tenant = parse_kind(doc, "Tenant", prefix=("body",))
    _store_tenant(ctx, tenant, create_only=False)
    return _tenant_view(ctx, ctx.store.get_tenant(name))


@router.delete("/tenants/{name}")
def delete_tenant(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Delete a tenant; refused (409) while a workload, a child tenant or an open offer refers to it."""
    caller.require(ADMIN)
    row = _tenant_row(ctx, name)
    try:
        tenant: Tenant | None = tenant_from_row(row)
    except ValidationError:
        tenant = None  # stored before today's rules: it owns nothing it could be asked about
    namespaces = tenant.owned_namespaces if tenant is not None else ()
    with ctx.store.write() as conn:
        if conn.execute(select(t.tenants.c.name).where(t.tenants.c.name == name)).first() is None:
            raise HTTPException(404, f"tenant {name} not found")
        held = conn.execute(
            select(t.workloads.c.namespace, t.workloads.c.name)
            .where(or_(t.workloads.c.tenant == name, t.workloads.c.namespace.in_(namespaces)))
            .limit(1)
        ).first()
        if held is not None:
            raise HTTPException(409, f"tenant {name} still has workloads (e.g. {held[0]}/{held[1]}); delete them first")
        children = [r.name for r in conn.execute(select(t.tenants.c.name, t.tenants.c.spec)) if _parent(r.spec) == name]
        if children:
            raise HTTPException(409, f"tenant {name} is the parent of {', '.join(sorted(children))}")
        offer = conn.execute(
            select(t.offers.c.id).where(t.offers.c.tenant == name, t.offers.c.state == "Open").limit(1)
        ).first()
        if offer is not None:
            raise HTTPException(409, f"tenant {name} holds open offer {offer[0]}; decline it or let it expire")
        conn.execute(delete(t.tenants).where(t.tenants.c.name == name))
        revoke_tenant_tokens(conn, name)
        Store.log(conn, [Event("Tenant", name, "Deleted")])
    ctx.loop.changed("Tenant", name)
    return {"deleted": name}


def _parent(spec: Any) -> Any:
    return ((spec or {}).get("spec") or {}).get("parent") if isinstance(spec, dict) else None


def _tenant_row(ctx: ServerContext, name: str) -> dict[str, Any]:
    try:
        return ctx.store.get_tenant(name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None


def _tenant_view(ctx: ServerContext, row: dict[str, Any], refused: dict[str, str] | None = None) -> dict[str, Any]:
    """The tenant, with a SetAside condition when the scheduler cannot use it (stored before today's
    rules: an invalid manifest, a parent that does not exist, a cycle)."""
    if refused is None:
        refused = _refused_tenants(ctx.store.list_tenants())
    return tenant_view(row, refused.get(row["name"]))


def _refused_tenants(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Why each stored tenant the scheduler leaves out is left out (see `sound_tenants`)."""
    parsed, refused = [], {}
    for row in rows:
        try:
            parsed.append(tenant_from_row(row))
        except ValidationError as exc:
            refused[row["name"]] = f"the stored manifest is invalid: {exc}"
    return {**refused, **sound_tenants(parsed)[1]}


@router.get("/tenants")
def list_tenants(ctx: Ctx, caller: Caller) -> dict[str, Any]:
    rows = ctx.store.list_tenants()
    refused = _refused_tenants(rows)
    if caller.role != ADMIN:
        caller.require(TENANT)
        rows = [r for r in rows if r["name"] == caller.tenant]
    return {"items": [_tenant_view(ctx, r, refused) for r in rows]}


@router.get("/tenants/{name}/usage")
def tenant_usage(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """What the tenant holds, its dominant share (DRF, S4.5) and its weighted share, from the leader's state."""
    caller.require_tenant(name)
    try:
        weight = tenant_from_row(_tenant_row(ctx, name)).weight
    except ValidationError as exc:
        raise HTTPException(409, f"tenant {name} is set aside (its stored manifest is invalid): {exc}") from None
    with ctx.loop.lock:
        scheduler = ctx.scheduler()
        usage = scheduler.queue.usage(name)
        share = scheduler.queue.dominant_share(name)
        capacity = dict(scheduler.state.totals())
        pending = [q.workload for q in ctx.loop.queued.values() if q.workload.tenant == name]
    asked: dict[str, int] = {}
    for workload in pending:
        for resource, amount in demand_of(workload).items():
            asked[resource] = asked.get(resource, 0) + amount
    return {
        "tenant": name,
        "weight": weight,
        "usage": {k: v for k, v in usage.items() if v},
        "capacity": capacity,
        "dominantShare": share,
        "weightedShare": share / weight,
        "pending": {"workloads": len(pending), "requests": asked},
    }


@router.get("/tenants/{name}")
def get_tenant(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    caller.require_tenant(name)
    return _tenant_view(ctx, _tenant_row(ctx, name))


# Events -------------------------------------------------------------------------------------------------
def _visible_events(ctx: ServerContext, caller: Identity, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Admins see everything; a tenant its own events and those of the workloads in its namespaces;
    an agent only its node's."""
    if caller.role == ADMIN:
        return rows
    if caller.role == TENANT:
        namespaces = set(ctx.namespaces_of(caller) or ())
        return [r for r in rows if (r["kind"] == "Workload" and r["object"].split("/", 1)[0] in namespaces)
                or (r["kind"] == "Tenant" and r["object"] == caller.tenant)]  # fmt: skip
    return [r for r in rows if r["kind"] == "Node" and r["object"] == caller.node]


@router.get("/events")
def list_events(
    ctx: Ctx,
    caller: Caller,
    since: Annotated[int, Query(ge=0, le=MAX_EVENT_ID, description="only events with a larger id")] = 0,
    kind: str | None = None,
    object: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> dict[str, Any]:
    rows = ctx.store.events(since, kind=kind, obj=object, limit=limit)
    return {"items": [event_view(r) for r in _visible_events(ctx, caller, rows)]}


@router.get("/events/watch")
async def watch_events(
    request: Request,
    ctx: Ctx,
    caller: Caller,
    since: Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID, description="resume after this event id")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    kind: str | None = None,
    object: str | None = None,
) -> StreamingResponse:
    """Server-Sent Events: each event as `id`/`event`/`data`; resume with `Last-Event-ID` or `?since=`."""
    cursor = since
    if cursor is None and last_event_id is not None:
        if not last_event_id.isdigit() or int(last_event_id) > MAX_EVENT_ID:
            raise InputError(
                [{"loc": ["header", "Last-Event-ID"], "msg": "must be an event id", "input": last_event_id}]
            )
        cursor = int(last_event_id)
    if cursor is None:
        cursor = await run_in_threadpool(ctx.store.last_event_id)

    async def stream(position: int) -> AsyncIterator[str]:
        yield f": watching events after {position}\n\n"
        feed, quiet = FeedCursor(position), 0.0
        while not await request.is_disconnected():
            read = await run_in_threadpool(feed.read, ctx.store, WATCH_PAGE)
            rows = [r for r in read if (not kind or r["kind"] == kind) and (not object or r["object"] == object)]
            for row in await run_in_threadpool(_visible_events, ctx, caller, rows) if rows else ():
                yield f"id: {row['id']}\nevent: {row['kind']}\ndata: {json.dumps(event_view(row))}\n\n"
                quiet = 0.0
            if len(read) == WATCH_PAGE:  # more to catch up on: no pause
                continue
            await asyncio.sleep(WATCH_POLL_S)
            quiet += WATCH_POLL_S
            if quiet >= WATCH_KEEPALIVE_S:
                yield ": keep-alive\n\n"
                quiet = 0.0

    return StreamingResponse(stream(cursor), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


#: Routes reached only when no other route matches (app.py includes them last): a tenant stored
#: under a name refused today can still be read and deleted.
legacy = APIRouter(prefix="/v1", include_in_schema=False)
legacy.get("/tenants/{name:legacy}")(get_tenant)
legacy.delete("/tenants/{name:legacy}")(delete_tenant)
