"""/v1/tenants (weights and quotas, usage with dominant share) and /v1/events (list, Server-Sent Events watch)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from finesched.model.tenant import Tenant
from finesched.sched.queue import demand_of
from finesched.server.auth import ADMIN, TENANT, Identity
from finesched.server.context import Caller, Ctx, ServerContext
from finesched.server.feed import FeedCursor
from finesched.server.store import Conflict, NotFound
from finesched.server.views import InputError, canonical, event_view, parse_kind, tenant_view

router = APIRouter(prefix="/v1", tags=["tenants", "events"])

TenantBody = Annotated[dict[str, Any], Body(description="A Tenant manifest")]
PatchBody = Annotated[dict[str, Any], Body(description="Tenant spec fields to change, e.g. {weight, quota}")]
WATCH_POLL_S = 0.25
WATCH_KEEPALIVE_S = 15.0
WATCH_PAGE = 500


def _store_tenant(ctx: ServerContext, tenant: Tenant, *, create_only: bool) -> bool:
    try:
        created = ctx.store.put_tenant(tenant.name, tenant.weight, canonical(tenant), create_only=create_only)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    ctx.loop.changed("Tenant", tenant.name)
    return created


@router.post("/tenants", status_code=201)
def create_tenant(body: TenantBody, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    caller.require(ADMIN)
    tenant: Tenant = parse_kind(body, "Tenant")
    _store_tenant(ctx, tenant, create_only=True)
    return tenant_view(ctx.store.get_tenant(tenant.name))


@router.put("/tenants/{name}")
def put_tenant(name: str, body: TenantBody, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    caller.require(ADMIN)
    tenant: Tenant = parse_kind(body, "Tenant")
    if tenant.name != name:
        raise InputError([{"loc": ["body", "metadata", "name"], "msg": f"must be {name!r} (the URL's name)"}])
    _store_tenant(ctx, tenant, create_only=False)
    return tenant_view(ctx.store.get_tenant(name))


@router.patch("/tenants/{name}")
def patch_tenant(name: str, body: PatchBody, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Change some spec fields (weight, quota, ...); the result is validated like a whole manifest."""
    caller.require(ADMIN)
    row = _tenant_row(ctx, name)
    doc = dict(row["spec"])
    doc["spec"] = {**doc.get("spec", {}), **body}
    tenant: Tenant = parse_kind(doc, "Tenant", prefix=("body",))
    _store_tenant(ctx, tenant, create_only=False)
    return tenant_view(ctx.store.get_tenant(name))


def _tenant_row(ctx: ServerContext, name: str) -> dict[str, Any]:
    try:
        return ctx.store.get_tenant(name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("/tenants")
def list_tenants(ctx: Ctx, caller: Caller) -> dict[str, Any]:
    rows = ctx.store.list_tenants()
    if caller.role != ADMIN:
        caller.require(TENANT)
        rows = [r for r in rows if r["name"] == caller.tenant]
    return {"items": [tenant_view(r) for r in rows]}


@router.get("/tenants/{name}")
def get_tenant(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    caller.require_tenant(name)
    return tenant_view(_tenant_row(ctx, name))


@router.get("/tenants/{name}/usage")
def tenant_usage(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """What the tenant holds, its dominant share (DRF, S4.5) and its weighted share, from the leader's state."""
    caller.require_tenant(name)
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
    weight = next((r["weight"] for r in ctx.store.list_tenants() if r["name"] == name), 1.0)
    return {
        "tenant": name,
        "weight": weight,
        "usage": {k: v for k, v in usage.items() if v},
        "capacity": capacity,
        "dominantShare": share,
        "weightedShare": share / weight,
        "pending": {"workloads": len(pending), "requests": asked},
    }


# Events -------------------------------------------------------------------------------------------------
def _visible_events(ctx: ServerContext, caller: Identity, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Admins see everything; a tenant only its own workloads' events; an agent only its node's."""
    if caller.role == ADMIN:
        return rows
    if caller.role == TENANT:
        mine = {f"{r['namespace']}/{r['name']}" for r in ctx.store.list_workloads(tenant=caller.tenant)}
        return [r for r in rows if r["kind"] == "Workload" and r["object"] in mine]
    return [r for r in rows if r["kind"] == "Node" and r["object"] == caller.node]


@router.get("/events")
def list_events(
    ctx: Ctx,
    caller: Caller,
    since: Annotated[int, Query(ge=0, description="only events with a larger id")] = 0,
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
    since: Annotated[int | None, Query(ge=0, description="resume after this event id")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    kind: str | None = None,
    object: str | None = None,
) -> StreamingResponse:
    """Server-Sent Events: each event as `id`/`event`/`data`; resume with `Last-Event-ID` or `?since=`."""
    cursor = since
    if cursor is None and last_event_id is not None:
        if not last_event_id.isdigit():
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
