"""/v1/tenants (weights and quotas, usage with dominant share) and /v1/events (list, Server-Sent Events watch)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import delete, or_, select
from starlette.concurrency import run_in_threadpool

from finesched.admission import admit_tenant, sound_tenants
from finesched.errors import ValidationError
from finesched.model.manifest import manifest_uid, uid_problem
from finesched.model.tenant import Tenant
from finesched.sched.queue import demand_of
from finesched.server.api import paging
from finesched.server.api.auth import ADMIN, TENANT, Identity, digest, revoke_tenant_tokens
from finesched.server.api.authz import AdminCaller
from finesched.server.api.context import Caller, Ctx, ServerContext
from finesched.server.api.paging import ContinueQuery, LimitQuery
from finesched.server.api.watch_hub import Chunk, TooManyWatches, Watcher, WatchHub
from finesched.server.store import schema as t
from finesched.server.store.cluster_view import tenant_from_row
from finesched.server.store.store import Conflict, Event, EventScope, NotFound, Store, with_uids
from finesched.server.store.views import InputError, canonical, event_view, invalid, parse_kind, tenant_view

router = APIRouter(prefix="/v1", tags=["tenants", "events"])

TenantBody = Annotated[dict[str, Any], Body(description="A Tenant manifest")]
PatchBody = Annotated[dict[str, Any], Body(description="Tenant spec fields to change, e.g. {weight, quota}")]
WATCH_KEEPALIVE_S = 15.0
#: How often a tenant's watch reads its tenant's namespaces again (a namespace granted or taken away).
SCOPE_REFRESH_S = 30.0
#: Event ids are 64-bit (the store's sequence); a larger `since` is refused, not sent to the database.
MAX_EVENT_ID = 2**63 - 1


def _store_tenant(ctx: ServerContext, tenant: Tenant, *, create_only: bool, uid: str | None = None) -> bool:
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
        in_use = [n for n in dropped if ctx.store.has_workloads(n)]
        if in_use:
            raise HTTPException(409, f"namespace {in_use[0]} still holds workloads; delete them before ungranting it")
    try:
        created = ctx.store.put_tenant(tenant.name, tenant.weight, canonical(tenant), create_only=create_only,
                                       uid=uid)  # fmt: skip
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    ctx.loop.changed("Tenant", tenant.name)
    return created


@router.post("/tenants", status_code=201)
def create_tenant(body: TenantBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    tenant: Tenant = parse_kind(body, "Tenant")
    _store_tenant(ctx, tenant, create_only=True)
    return _tenant_view(ctx, ctx.store.get_tenant(tenant.name))


@router.put("/tenants/{name}")
def put_tenant(name: str, body: TenantBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    tenant: Tenant = parse_kind(body, "Tenant")
    if tenant.name != name:
        raise InputError([{"loc": ["body", "metadata", "name"], "msg": f"must be {name!r} (the URL's name)"}])
    _store_tenant(ctx, tenant, create_only=False, uid=manifest_uid(body))
    return _tenant_view(ctx, ctx.store.get_tenant(name))


@router.patch("/tenants/{name}")
def patch_tenant(name: str, body: PatchBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Change some spec fields (weight, quota, ...); the result is validated like a whole manifest."""
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
        gone = with_uids(conn, [Event("Tenant", name, "Deleted")])  # the uid, read before the row goes
        conn.execute(delete(t.tenants).where(t.tenants.c.name == name))
        revoke_tenant_tokens(conn, name)
        Store.log(conn, gone)
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
def list_tenants(ctx: Ctx, caller: Caller, limit: LimitQuery = None, continue_: ContinueQuery = None) -> dict[str, Any]:
    """Tenants by name, a page at a time (`limit`, `continue`); a tenant token sees its own."""
    if caller.role != ADMIN:
        caller.require(TENANT)
    page = paging.request("tenants", {}, limit, continue_, key=str)
    rows = ctx.store.list_tenants()  # all of them: whether one is sound depends on the others (parents)
    refused = _refused_tenants(rows)
    if caller.role != ADMIN:
        rows = [r for r in rows if r["name"] == caller.tenant]
    if page.after is not None:
        rows = [r for r in rows if r["name"] > page.after]
    shown = rows if page.limit is None else rows[: page.limit]
    last = shown[-1]["name"] if shown else None
    return page.answer([_tenant_view(ctx, r, refused) for r in shown], last, len(rows) - len(shown))


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
def event_scope(ctx: ServerContext, caller: Identity) -> EventScope | None:
    """The events `caller` may see (None: all of them, an admin): a tenant its own events and those of
    the workloads in its namespaces; an agent only its node's."""
    if caller.role == ADMIN:
        return None
    if caller.role == TENANT:
        return EventScope(namespaces=tuple(ctx.namespaces_of(caller) or ()), tenant=caller.tenant)
    return EventScope(node=caller.node or "")


def _visible_events(ctx: ServerContext, caller: Identity, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of `rows` that `caller` may see (see `event_scope`)."""
    scope = event_scope(ctx, caller)
    return rows if scope is None else [r for r in rows if scope.allows(r)]


@router.get("/events")
def list_events(
    ctx: Ctx,
    caller: Caller,
    since: Annotated[int, Query(ge=0, le=MAX_EVENT_ID, description="only events with a larger id")] = 0,
    kind: str | None = None,
    object: str | None = None,
    uid: Annotated[
        str | None,
        Query(
            description="only the events of the object with this uid (its metadata.uid), not those of "
            "earlier objects of its name"
        ),
    ] = None,
    limit: LimitQuery = None,
    continue_: ContinueQuery = None,
) -> dict[str, Any]:
    """Events, oldest first, a page at a time (`limit`, `continue`); what the token may see is decided
    in the query, so every page is full until the last."""
    if uid is not None and uid_problem(uid):
        raise InputError([{"loc": ["query", "uid"], "msg": uid_problem(uid), "input": uid}])
    uid = str(uuid.UUID(uid)) if uid is not None else None
    filters = {"since": since, "kind": kind, "object": object, "uid": uid}
    page = paging.request("events", filters, limit, continue_)
    after = since if page.after is None else page.after
    scope = event_scope(ctx, caller)
    found = ctx.store.event_page(after, page.limit, kind, object, scope, uid=uid)  # type: ignore[arg-type]
    last = found.rows[-1]["id"] if found.rows else None
    return page.answer([event_view(r) for r in found.rows], last, found.remaining)


def watch_hub(request: Request) -> WatchHub:
    """The process's shared feed of SSE watches (app.py makes it; made here with default limits otherwise)."""
    hub = getattr(request.app.state, "watch_hub", None)
    if hub is None:
        hub = request.app.state.watch_hub = WatchHub(request.app.state.ctx.store)
    return hub  # type: ignore[no-any-return]


class _WatchResponse(StreamingResponse):
    """A streaming response that gives its watch back however it ends (even before the first event)."""

    def __init__(self, content: Any, release: Callable[[], None], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


@router.get("/events/watch", responses={429: {"description": "Too many watches (per token or in total)"}})
async def watch_events(
    request: Request,
    ctx: Ctx,
    caller: Caller,
    since: Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID, description="resume after this event id")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    kind: str | None = None,
    object: str | None = None,
) -> StreamingResponse:
    """Server-Sent Events: each event as `id`/`event`/`data`; resume with `Last-Event-ID` or `?since=`.
    Every watch of the process is served from one shared read of the event table (server/api/watch_hub.py);
    a client that reads too slowly is closed with a comment saying where to resume."""
    cursor = _resume_after(since, last_event_id)
    hub = watch_hub(request)
    token = digest(request.headers.get("authorization", "").partition(" ")[2].strip())
    try:
        hub.admit(token)
    except TooManyWatches as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": str(hub.limits.retry_after_s)}) from None
    try:
        scope = await run_in_threadpool(event_scope, ctx, caller)
    except BaseException:
        hub.release(token)
        raise
    watcher = Watcher(kind, object, scope, hub.limits.buffer)

    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            hub.leave(watcher)
            hub.release(token)

    stream = _event_stream(hub, watcher, cursor, ctx, caller)
    return _WatchResponse(stream, release, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _resume_after(since: int | None, last_event_id: str | None) -> int | None:
    """Where a watch resumes: `?since=`, else the `Last-Event-ID` header (422 unless an event id)."""
    if since is not None or last_event_id is None:
        return since
    if not last_event_id.isdigit() or int(last_event_id) > MAX_EVENT_ID:
        raise InputError([{"loc": ["header", "Last-Event-ID"], "msg": "must be an event id", "input": last_event_id}])
    return int(last_event_id)


async def _event_stream(
    hub: WatchHub, watcher: Watcher, cursor: int | None, ctx: ServerContext, caller: Identity
) -> AsyncIterator[bytes | str]:
    """A watch's stream: the events after `cursor` read from the database while it catches up, then
    the shared feed's, with keep-alives; it ends when the watcher falls too far behind (saying where
    to resume). A tenant's scope is read again every SCOPE_REFRESH_S."""
    outbox: asyncio.Queue[Chunk] = asyncio.Queue(maxsize=2)  # catch-up reads wait for the client
    last = cursor
    joining: asyncio.Future[None] | None = None
    try:
        yield f": watching events after {'the newest' if cursor is None else cursor}\n\n"
        if cursor is not None:
            note = await hub.pruned_after(cursor)
            if note is not None:
                yield f": {note}\n\n"
        joining = asyncio.ensure_future(hub.join(watcher, cursor, outbox.put))
        while not joining.done() or not outbox.empty():  # catching up from the database
            getter = asyncio.ensure_future(outbox.get())
            await asyncio.wait({getter, joining}, timeout=WATCH_KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                chunk = getter.result()
                last = chunk.last_id
                yield chunk.data
                continue
            getter.cancel()
            if not joining.done():
                yield ": keep-alive\n\n"
        joining.result()
        if last is None:
            last = watcher.joined_at
        refreshed = time.monotonic()
        while True:
            chunks = await watcher.next(WATCH_KEEPALIVE_S)
            for chunk in chunks:
                last = chunk.last_id
                yield chunk.data
            if watcher.overflowed:
                yield (f": this watch fell more than {watcher.limit} events behind and is closed; "
                       f"resume with Last-Event-ID: {last}\n\n")  # fmt: skip
                return
            if not chunks:
                yield ": keep-alive\n\n"
            if caller.role == TENANT and time.monotonic() - refreshed > SCOPE_REFRESH_S:
                # namespaces granted or taken away since: the next fan-out filters by the new scope
                watcher.scope = await run_in_threadpool(event_scope, ctx, caller)
                refreshed = time.monotonic()
    finally:
        if joining is not None:
            joining.cancel()
        hub.leave(watcher)


#: Routes reached only when no other route matches (app.py includes them last): a tenant stored
#: under a name refused today can still be read and deleted.
legacy = APIRouter(prefix="/v1", include_in_schema=False)
legacy.get("/tenants/{name:legacy}")(get_tenant)
legacy.delete("/tenants/{name:legacy}")(delete_tenant)
