"""Resource offers (seed S4.5, Mesos style): a tenant asks for a demand, gets one node's resources for a TTL.

`POST /v1/offers {tenant, demand, ttlSeconds}` picks the node per seed S4 — among the nodes that
can hold the demand (the real filters: scalars, devices, CPUs, NUMA), the one whose remaining
amount of the demand's *dominant resource* is closest to it (best fit, S4.2/S4.4; the order of
the BucketFit plugin with every bucket above K searched) — and *holds* the demand there: the
scheduler places a hold binding for the tenant, so DRF counts it and nothing else takes it.
The answer names the node, its remaining resources and the expiry. `accept` releases the hold
and places the given workloads on that node as a gang (all or none), durably; `decline` or
expiry releases the hold. An expired offer cannot be accepted (410).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Body, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import insert, select, update

from finesched.admission import OFFER_NAMESPACE, admit_probe
from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.names import ObjectName
from finesched.model.resources import ResourceVector
from finesched.model.workload import MAX_PRIORITY, Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.server.api import quota
from finesched.server.api.auth import ADMIN, TENANT, Identity
from finesched.server.api.authz import AdminOrTenant, check_namespaces, sent_json
from finesched.server.api.context import Caller, Ctx, ServerContext
from finesched.server.api.routes_workloads import parse_workloads
from finesched.server.loop.placement import commit_after_write, insert_bound, leader_write, log_own
from finesched.server.store import schema as t
from finesched.server.store.cluster_view import binding_view, pinned
from finesched.server.store.store import Event, Store, as_dict, aware, now
from finesched.server.store.views import InputError, invalid

router = APIRouter(prefix="/v1/offers", tags=["offers"])

OPEN, ACCEPTED, DECLINED, EXPIRED = "Open", "Accepted", "Declined", "Expired"


class OfferRequest(BaseModel):
    """`demand`: resource name -> quantity, as a workload's requests are written (checked like them)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    tenant: ObjectName
    demand: dict[str, Any] = Field(min_length=1)  # quantities: the schema says so (server/api/openapi.py)
    ttl_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False, alias="ttlSeconds")


class AcceptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workloads: list[dict[str, Any]] = Field(min_length=1, max_length=1000)


def hold_key(offer_id: str) -> str:
    return f"{OFFER_NAMESPACE}/offer-{offer_id}"


def best_fit_node(scheduler: Scheduler, probe: Workload, feasible: dict[str, int]) -> str:
    """S4.2/S4.4: the feasible node with the least remaining of the demand's dominant resource."""
    state = scheduler.state
    totals = state.totals()
    requests = {r: a for r, a in probe.requests.items() if a > 0 and r in state.res_index and totals.get(r)}
    if not requests:
        return min(feasible)
    dominant = max(sorted(requests), key=lambda r: requests[r] / totals[r])
    row = state.res_index[dominant]
    free = state.free
    return min(feasible, key=lambda name: (int(free[row, state.index[name]]), name))


def remaining(scheduler: Scheduler, node: str) -> dict[str, str]:
    state = scheduler.state
    i = state.index[node]
    amounts = {r: int(state.free[state.res_index[r], i]) for r in state.resources}
    return ResourceVector({k: v for k, v in amounts.items() if v > 0}).to_quantities()


async def _offer_maker(caller: AdminOrTenant, sent: Annotated[Any, Depends(sent_json)]) -> Identity:
    """An admin, or a tenant asking for itself (the tenant the body names, before it is validated)."""
    if caller.role != TENANT or sent is None:  # a body that cannot be read is a 422 (server/api/authz.py)
        return caller
    tenant = sent.get("tenant") if isinstance(sent, dict) else None
    if tenant != caller.tenant:
        raise HTTPException(403, f"this token is for tenant {caller.tenant}, not {tenant!r}")
    return caller


@router.post("", status_code=201)
def make_offer(body: OfferRequest, ctx: Ctx, caller: Annotated[Identity, Depends(_offer_maker)]) -> dict[str, Any]:
    caller.require_tenant(body.tenant)
    offer_id = uuid.uuid4().hex[:12]
    name = hold_key(offer_id).split("/", 1)[1]
    try:
        # The hold is no preemption victim (nothing outranks it) and preempts nothing itself: what an
        # offer promised stays promised until it is accepted, declined or expires.
        probe = Workload.model_validate(
            {"name": name, "namespace": OFFER_NAMESPACE, "tenant": body.tenant, "requests": body.demand,
             "priority": MAX_PRIORITY, "preemptionPolicy": "Never"}
        )  # fmt: skip
    except pydantic.ValidationError as exc:  # re-reported under body.demand
        raise InputError([_demand_problem(e) for e in exc.errors()]) from None
    try:
        probe = admit_probe(probe, ctx.world())
    except ValidationError as exc:
        raise InputError([{**d, "loc": ["body", "demand"]} if d["loc"][1] == "spec" else d
                          for d in invalid(exc).details]) from None  # fmt: skip
    with ctx.loop.lock:
        scheduler = ctx.scheduler()
        try:
            feasible = scheduler.evaluate(probe)  # FitError (why nothing fits) when no node can
            node = best_fit_node(scheduler, probe, feasible)
            left = remaining(scheduler, node)
            hold = scheduler.schedule_one(pinned(probe, node))
        except FitError as exc:
            raise HTTPException(409, f"no node can hold the demand: {exc.message}") from None
        except ValidationError as exc:
            raise invalid(exc, ("body", "demand")) from None
        stamp = now()
        expires = stamp + timedelta(seconds=body.ttl_seconds)
        row = {"id": offer_id, "tenant": body.tenant, "node": node, "demand": dict(body.demand), "remaining": left,
               "hold": hold.model_dump(mode="json", by_alias=True), "state": OPEN, "expires": expires,
               "created": stamp}  # fmt: skip

        def write() -> None:
            with leader_write(ctx.loop) as conn:
                conn.execute(insert(t.offers), row)
                log_own(ctx.loop, conn, [Event("Offer", offer_id, "Offered", f"{node} for {body.tenant}")])

        commit_after_write(ctx.loop, [hold], write)
    ctx.loop.wake()
    return offer_view(row)


def _demand_problem(error: Any) -> dict[str, Any]:
    loc = ["body", "demand", *[p for p in error["loc"] if p != "requests"]]
    return {"loc": loc, "msg": error["msg"], "input": str(error.get("input"))}


def offer_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "tenant": row["tenant"],
        "node": row["node"],
        "demand": row["demand"],
        "remaining": row["remaining"],
        "state": row["state"],
        "expiresAt": aware(row["expires"]).isoformat(),
    }


def _offer(ctx: ServerContext, offer_id: str) -> dict[str, Any]:
    with ctx.store.read() as conn:
        row = as_dict(conn.execute(select(t.offers).where(t.offers.c.id == offer_id)).first())
    if row is None:
        raise HTTPException(404, f"offer {offer_id} not found")
    return row


@router.get("/{offer_id}")
def get_offer(offer_id: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    return offer_view(_offer_of(ctx, offer_id, caller))


def _offer_of(ctx: ServerContext, offer_id: str, caller: Any) -> dict[str, Any]:
    """The offer if `caller` may act on it. Another tenant's offer is "not found", exactly like an
    unknown id: an offer id names no tenant, so a 403 would tell that the id exists."""
    caller.require(ADMIN, TENANT)
    row = _offer(ctx, offer_id)
    if caller.role == TENANT and row["tenant"] != caller.tenant:
        raise HTTPException(404, f"offer {offer_id} not found")
    return row


def _open_offer(ctx: ServerContext, offer_id: str, caller: Any) -> dict[str, Any]:
    row = _offer_of(ctx, offer_id, caller)
    if row["state"] != OPEN:
        raise HTTPException(409, f"offer {offer_id} is {row['state']}")
    if aware(row["expires"]) <= now():
        raise HTTPException(410, f"offer {offer_id} expired at {aware(row['expires']).isoformat()}")
    return row


def _offer_to_accept(offer_id: str, ctx: Ctx, caller: AdminOrTenant, sent: Annotated[Any, Depends(sent_json)]
                     ) -> dict[str, Any]:  # fmt: skip
    """The open offer `caller` may accept, and a tenant's workloads in its own namespaces, before the
    body is validated."""
    row = _open_offer(ctx, offer_id, caller)
    workloads = sent.get("workloads") if isinstance(sent, dict) else None
    if caller.role == TENANT and isinstance(workloads, list):  # the offer, in the URL, is the tenant's
        check_namespaces(ctx, caller, workloads)
    return row


@router.post("/{offer_id}/accept", status_code=201)
def accept_offer(offer_id: str, body: Annotated[AcceptRequest, Body()], ctx: Ctx, caller: Caller,
                 row: Annotated[dict[str, Any], Depends(_offer_to_accept)]) -> dict[str, Any]:  # fmt: skip
    """Place the workloads on the offered node, all or none, and close the offer."""
    workloads = parse_workloads(body.workloads, caller, ctx, ctx.world())
    wrong = [w.key for w in workloads if w.tenant != row["tenant"]]
    if wrong:
        raise HTTPException(403, f"workloads {', '.join(wrong)} are not of tenant {row['tenant']}")
    with ctx.loop.lock:
        scheduler = ctx.scheduler()
        hold = Binding.model_validate(row["hold"])
        scheduler.state.forget(hold.workload)
        try:
            bindings = scheduler.schedule_gang([pinned(w, row["node"]) for w in workloads])
        except (FitError, ValidationError) as exc:
            _reassume(scheduler, hold)
            if isinstance(exc, ValidationError):
                raise invalid(exc, ("body", "workloads")) from None
            raise HTTPException(409, f"the workloads do not fit on {row['node']}: {exc.message}") from None
        try:
            commit_after_write(ctx.loop, bindings, lambda: _write_accept(ctx, offer_id, workloads, bindings))
        except BaseException:
            _reassume(scheduler, hold)
            raise
    ctx.loop.wake()
    return {"offer": offer_id, "state": ACCEPTED, "bindings": {b.workload: binding_view(b) for b in bindings}}


def _reassume(scheduler: Scheduler, hold: Binding) -> None:
    scheduler.state.assume(hold)
    scheduler.state.commit(hold.workload)


def _write_accept(ctx: ServerContext, offer_id: str, workloads: list[Workload], bindings: list[Binding]) -> None:
    """One transaction: the offer closes only if it is still open, and the workloads are stored bound."""
    with leader_write(ctx.loop) as conn:
        closed = conn.execute(
            update(t.offers).where(t.offers.c.id == offer_id, t.offers.c.state == OPEN).values(state=ACCEPTED)
        )
        if closed.rowcount != 1:
            raise HTTPException(409, f"offer {offer_id} was closed meanwhile")
        try:
            quota.charge(conn, workloads[0].tenant, quota.Charge(workloads=len(workloads)))
        except quota.QuotaExceeded as exc:
            raise HTTPException(403, str(exc)) from None
        events = [Event("Offer", offer_id, "Accepted", f"{len(workloads)} workload(s)")]
        events += insert_bound(conn, workloads, bindings, job=None, why=f" (offer {offer_id})")
        log_own(ctx.loop, conn, events)


@router.post("/{offer_id}/decline")
def decline_offer(offer_id: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    row = _open_offer(ctx, offer_id, caller)
    close_offer(ctx.loop, row, DECLINED)
    return {"offer": offer_id, "state": DECLINED}


def close_offer(loop: Any, row: dict[str, Any], state: str) -> None:
    """Close an open offer (declined or expired) and release its hold.

    Like making and accepting an offer, this takes the loop's lock first and writes inside it
    (server/store/locking.py), so the offer's row and the hold in memory change together."""
    with loop.lock:
        with leader_write(loop) as conn:
            closed = conn.execute(
                update(t.offers).where(t.offers.c.id == row["id"], t.offers.c.state == OPEN).values(state=state)
            )
            if closed.rowcount == 1:
                log_own(loop, conn, [Event("Offer", row["id"], state)])
        scheduler = loop.scheduler
        key = hold_key(row["id"])
        if scheduler is not None and key in scheduler.state.bindings:
            scheduler.release(key)
    loop.wake()


def open_offers(store: Store) -> list[dict[str, Any]]:
    with store.read() as conn:
        return [as_dict(r) for r in conn.execute(select(t.offers).where(t.offers.c.state == OPEN))]  # type: ignore[misc]


def restore_holds(store: Store, scheduler: Scheduler) -> None:
    """After a rebuild: hold the resources of every open, unexpired offer again."""
    for row in open_offers(store):
        if aware(row["expires"]) <= now():
            continue
        try:
            _reassume(scheduler, Binding.model_validate(row["hold"]))
        except Exception:  # the node changed and the hold no longer fits: the offer cannot be honoured
            with store.write() as conn:
                conn.execute(update(t.offers).where(t.offers.c.id == row["id"]).values(state=EXPIRED))


def expire_offers(store: Store, loop: Any) -> None:
    """Close every open offer whose TTL has passed (its hold is released)."""
    stamp = now()
    for row in open_offers(store):
        if aware(row["expires"]) <= stamp:
            close_offer(loop, row, EXPIRED)
