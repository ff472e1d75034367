"""/v1/priorityclasses: the PriorityClasses workloads name (Kubernetes' scheduling.k8s.io/v1).

Writes are the admin's alone, and refused (403) before the body is looked at: priorities decide
who waits and who is evicted. Reads are open to every token, as in Kubernetes (any authenticated
user may list PriorityClasses): a tenant needs the names and values to choose among the classes
its Tenant lists. A class's `value` may change; workloads admitted before keep the priority they
were admitted with (a stored workload holds the resolved value), as pods keep theirs.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException

from finesched.admission import admit_priority_class
from finesched.errors import ValidationError
from finesched.model.manifest import manifest_uid
from finesched.model.priority_class import PriorityClass
from finesched.server.api.authz import AdminCaller
from finesched.server.api.context import Caller, Ctx, ServerContext
from finesched.server.store import priority_store
from finesched.server.store.store import Conflict, NotFound
from finesched.server.store.views import InputError, canonical, cluster_object_view, invalid, parse_kind

router = APIRouter(prefix="/v1/priorityclasses", tags=["priorityclasses"])


ClassBody = Annotated[Any, Body(description="A PriorityClass manifest")]


def _store(ctx: ServerContext, body: Any, *, name: str | None) -> PriorityClass:
    """Admit the class against the stored ones (at most one global default), then store it."""
    cls: PriorityClass = parse_kind(body, "PriorityClass")
    if name is not None and cls.name != name:
        raise InputError([{"loc": ["body", "metadata", "name"], "msg": f"must be {name!r} (the URL's name)"}])
    try:
        cls = admit_priority_class(cls, ctx.world(devices=False))
    except ValidationError as exc:
        raise invalid(exc) from None
    try:
        uid = manifest_uid(body) if name is not None else None  # a create ignores it, as Kubernetes does
        priority_store.put_priority_class(ctx.store, cls, canonical(cls), create_only=name is None, uid=uid)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    return cls


def _row(ctx: ServerContext, name: str) -> dict[str, Any]:
    row = priority_store.find_priority_class(ctx.store, name)
    if row is None:
        raise HTTPException(404, f"PriorityClass {name} not found")
    return row


@router.post("", status_code=201)
def create_priority_class(body: ClassBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Create a class (409 when the name is taken; at most one `globalDefault`, else 422 naming it)."""
    cls = _store(ctx, body, name=None)
    return cluster_object_view(_row(ctx, cls.name))


@router.get("")
def list_priority_classes(ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Every class, by name (any token may read them)."""
    return {"items": [cluster_object_view(r) for r in priority_store.list_priority_classes(ctx.store)]}


@router.get("/{name}")
def get_priority_class(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    return cluster_object_view(_row(ctx, name))


@router.put("/{name}")
def put_priority_class(name: str, body: ClassBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Create or replace a class; workloads admitted before keep the priority they were given."""
    _store(ctx, body, name=name)
    return cluster_object_view(_row(ctx, name))


@router.delete("/{name}")
def delete_priority_class(name: str, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Delete a class: workloads admitted under it keep their priority; new ones may no longer name it."""
    try:
        priority_store.delete_priority_class(ctx.store, name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return {"deleted": name}
