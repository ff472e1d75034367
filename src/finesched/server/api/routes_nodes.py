"""/v1/nodes: register (admin, or the node's own agent), report, read, cordon/uncordon, delete.

Who may write is decided before the body is read (server/api/authz.py): a tenant, or the agent of
another node, is answered 403 whatever it sends, never a 422 describing what a node accepts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException

from finesched.admission import World, admit_node
from finesched.errors import ValidationError
from finesched.model.manifest import manifest_uid
from finesched.model.node import Node
from finesched.server.api import paging
from finesched.server.api.auth import TENANT, Identity
from finesched.server.api.authz import AdminCaller, NodeCaller, NodeReader, NodeWriter
from finesched.server.api.context import Ctx, ServerContext
from finesched.server.api.device_usage import DeviceInput
from finesched.server.api.paging import ContinueQuery, LimitQuery
from finesched.server.api.reports import NodeReport, check_report, tenant_report
from finesched.server.api.visibility import visible_on_node
from finesched.server.store.cluster_view import node_from_row
from finesched.server.store.store import Conflict, Event, NotFound
from finesched.server.store.views import InputError, canonical, invalid, node_view, parse_kind

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])

NodeBody = Annotated[dict[str, Any], Body(description="A Node manifest")]


def _register(ctx: ServerContext, caller: Identity, body: dict[str, Any], *, name: str | None) -> tuple[dict, bool]:
    node: Node = parse_kind(body, "Node")
    if name is not None and node.name != name:
        raise InputError([{"loc": ["body", "metadata", "name"], "msg": f"must be {name!r} (the URL's name)"}])
    caller.require_node(node.name)
    try:
        admit_node(node, World())  # a node's rules are its own
    except ValidationError as exc:
        raise invalid(exc) from None
    try:
        uid = manifest_uid(body) if name is not None else None  # a create ignores it, as Kubernetes does
        row, created = ctx.store.put_node(node.name, canonical(node), create_only=name is None, uid=uid)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    ctx.loop.changed("Node", node.name)
    return _view(ctx, row), created


@router.post("", status_code=201)
def register_node(body: NodeBody, ctx: Ctx, caller: NodeWriter) -> dict[str, Any]:
    """Register a node (409 when the name is taken; use PUT to replace)."""
    view, _ = _register(ctx, caller, body, name=None)
    return view


@router.put("/{name}")
def put_node(name: str, body: NodeBody, ctx: Ctx, caller: NodeCaller) -> dict[str, Any]:
    """Create or replace a node (what an agent does at start-up); bound workloads stay if they still fit."""
    view, _ = _register(ctx, caller, body, name=name)
    return view


@router.get("")
def list_nodes(
    ctx: Ctx, caller: AdminCaller, limit: LimitQuery = None, continue_: ContinueQuery = None
) -> dict[str, Any]:
    """Nodes by name, a page at a time (`limit`, `continue`)."""
    page = paging.request("nodes", {}, limit, continue_, key=str)
    found = ctx.store.node_page(page.after, page.limit)  # type: ignore[arg-type]
    items = [_view(ctx, r, _allocation(ctx, r["name"])) for r in found.rows]
    return page.answer(items, found.rows[-1]["name"] if found.rows else None, found.remaining)


@router.get("/{name}")
def get_node(name: str, ctx: Ctx, caller: NodeReader) -> dict[str, Any]:
    """One node, with what is allocated on it per resource and per device (each device's holders).

    A tenant reads it as the console's node page shows it: other tenants' workloads are not named
    (a device holder is ``workload: null``; ``allocation.workloads`` lists its own, and
    ``otherWorkloads`` counts the rest), and of the agent's report only the public parts."""
    row = _row(ctx, name)
    visible = visible_on_node(ctx, caller, name) if caller.role == TENANT else None  # an agent reads its bindings
    view = _view(ctx, row, _allocation(ctx, name, visible, devices=True))
    if visible is not None and view["status"].get("report"):
        view["status"]["report"] = tenant_report(view["status"]["report"], _shown(visible))
    return view


def _view(ctx: ServerContext, row: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """The node, with a SetAside condition when the scheduler cannot use it (why, from the stored
    manifest or from the scheduling loop)."""
    reason = ctx.loop.set_aside.get(("Node", row["name"]))
    try:
        node_from_row(row)
    except ValidationError as exc:
        reason = f"the stored manifest is invalid: {exc}"
    return node_view(row, usage, reason)


def _row(ctx: ServerContext, name: str) -> dict[str, Any]:
    try:
        return ctx.store.get_node(name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None


def _allocation(
    ctx: ServerContext, name: str, visible: set[str] | None = None, *, devices: bool = False
) -> dict[str, Any] | None:
    """Allocated / allocatable per resource and the bindings on the node, from the leader's state;
    with `devices`, each device's use and holders (`device_usage`). Only the workloads in `visible`
    are named (None: all)."""
    with ctx.loop.lock:
        scheduler = ctx.loop.scheduler
        if scheduler is None or name not in scheduler.state.index:
            return None
        state = scheduler.state
        i = state.index[name]
        out = {r: {"used": int(state.used_of(r)[i]), "allocatable": int(state.allocatable[state.res_index[r], i])}
               for r in state.resources}  # fmt: skip
        keys = sorted(b.workload for b in state.bindings_on(name))
        usage: dict[str, Any] = {"resources": out, "workloads": [k for k in keys if visible is None or k in visible]}
        if visible is not None:
            usage["otherWorkloads"] = len(keys) - len(usage["workloads"])
        if devices:
            usage["devices"] = DeviceInput.capture(state, name).usage(_shown(visible))
        return usage


def _shown(visible: set[str] | None) -> Callable[[str], str | None]:
    return lambda key: key if visible is None or key in visible else None


@router.post("/{name}/report")
def report(name: str, body: NodeReport, ctx: Ctx, caller: NodeCaller) -> dict[str, Any]:
    """An agent's heartbeat and Resource Manager sync (S0.2-encoded device free amounts, health)."""
    row = _row(ctx, name)
    try:
        node = node_from_row({**row, "report": None, "cordoned": False, "ready": True})
    except ValidationError as exc:
        raise HTTPException(409, f"node {name}'s stored spec is invalid: {exc}") from None
    problems = check_report(node, body)
    if problems:
        ctx.store.note([Event("Node", name, "ReportRefused", "; ".join(p["msg"] for p in problems))])
        raise InputError(problems)
    data = body.model_dump(mode="json")
    if ctx.store.heartbeat(name, data):
        ctx.loop.changed("Node", name)
    return {"accepted": True, "node": name}


@router.post("/{name}/cordon")
def cordon(name: str, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Take no new work on the node (bound workloads stay)."""
    return _set_flag(ctx, name, "Cordoned", cordoned=True)


@router.post("/{name}/uncordon")
def uncordon(name: str, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    return _set_flag(ctx, name, "Uncordoned", cordoned=False)


def _set_flag(ctx: ServerContext, name: str, reason: str, **flags: Any) -> dict[str, Any]:
    try:
        row = ctx.store.set_node_flags(name, reason, **flags)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    ctx.loop.changed("Node", name)
    return _view(ctx, row)


@router.delete("/{name}")
def delete_node(name: str, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Remove the node; its workloads are requeued."""
    try:
        requeued = ctx.store.delete_node(name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    ctx.loop.changed("Node", name)
    for key in requeued:
        ctx.loop.changed("Workload", key)
    return {"deleted": name, "requeued": requeued}


#: Routes reached only when no other route matches (app.py includes them last): a node stored under
#: a name refused today can still be read and deleted.
legacy = APIRouter(prefix="/v1/nodes", include_in_schema=False)
legacy.get("/{name:legacy}")(get_node)
legacy.delete("/{name:legacy}")(delete_node)
