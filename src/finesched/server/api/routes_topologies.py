"""/v1/topologies: the network trees (levels of node labels) that gangs may name (model/topology.py).

Cluster-scoped, like PriorityClasses: writes are the admin's alone, refused (403) before the body
is looked at; every token reads them, since a tenant needs the names and levels to ask for a
placement. A change reaches the scheduler of every replica through the change feed (the loop
calls `Scheduler.set_topologies`). A topology deleted while gangs name it leaves them waiting,
with the scheduler's reason; new ones that name it are refused (422).

`GET /v1/topologies/{name}` adds, from the scheduling leader's cluster state, every domain of every
level with its node count and the allocatable and free amount of each resource (`status.domains`),
amounts as decimal strings of canonical units (millicores, bytes, counts), exact at any size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, HTTPException

from finesched.errors import ValidationError
from finesched.model.manifest import manifest_uid
from finesched.model.topology import Topology
from finesched.server.api.authz import AdminCaller
from finesched.server.api.context import Caller, Ctx, ServerContext
from finesched.server.store import topology_store
from finesched.server.store.store import Conflict, NotFound
from finesched.server.store.views import InputError, canonical, cluster_object_view, parse_kind
from finesched.state.cluster import ClusterState
from finesched.state.topology import DomainIndex, domain_capacities

router = APIRouter(prefix="/v1/topologies", tags=["topologies"])

TopologyBody = Annotated[Any, Body(description="A Topology manifest")]

T = TypeVar("T")


def _store(ctx: ServerContext, body: Any, *, name: str | None) -> Topology:
    topology: Topology = parse_kind(body, "Topology")
    if name is not None and topology.name != name:
        raise InputError([{"loc": ["body", "metadata", "name"], "msg": f"must be {name!r} (the URL's name)"}])
    try:
        uid = manifest_uid(body) if name is not None else None  # a create ignores it, as Kubernetes does
        topology_store.put_topology(ctx.store, topology, canonical(topology), create_only=name is None, uid=uid)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    ctx.loop.changed("Topology", topology.name)
    return topology


def topology_view(row: dict[str, Any], domains: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The stored manifest as {metadata, spec, status}; `domains` (the leader's view) when given."""
    view = cluster_object_view(row)
    if domains is not None:
        view["status"]["domains"] = domains
    return view


def _with_index(ctx: ServerContext, row: dict[str, Any], read: Callable[[ClusterState, DomainIndex], T]) -> T | None:
    """`read(state, index)` over the leader's cluster state and the topology's domain index (None on
    a replica that does not schedule, or when the stored manifest is invalid today)."""
    try:
        topology = topology_store.topology_from_row(row)
    except ValidationError:
        return None
    with ctx.loop.lock:
        scheduler = ctx.loop.scheduler
        if scheduler is None:
            return None
        return read(scheduler.state, scheduler.topology.domains(topology))


def _domains(state: ClusterState, index: DomainIndex) -> list[dict[str, Any]]:
    return [
        {"level": c.level, "name": c.name, "nodes": c.nodes,
         "allocatable": {r: str(v) for r, v in c.allocatable.items()}, "free": {r: str(v) for r, v in c.free.items()}}
        for c in domain_capacities(state, index)
    ]  # fmt: skip


def _counts(state: ClusterState, index: DomainIndex) -> dict[str, int]:
    return {label: index.count(depth) for depth, label in enumerate(index.topology.labels)}


def _row(ctx: ServerContext, name: str) -> dict[str, Any]:
    row = topology_store.find_topology(ctx.store, name)
    if row is None:
        raise HTTPException(404, f"Topology {name} not found")
    return row


@router.post("", status_code=201)
def create_topology(body: TopologyBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Create a topology (409 when the name is taken)."""
    topology = _store(ctx, body, name=None)
    return topology_view(_row(ctx, topology.name))


@router.get("")
def list_topologies(ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Every topology, by name (any token may read them), with how many domains each level has
    (`status.domainCounts`, from the leader's state)."""
    items = []
    for row in topology_store.list_topologies(ctx.store):
        view = topology_view(row)
        counts = _with_index(ctx, row, _counts)
        if counts is not None:
            view["status"]["domainCounts"] = counts
        items.append(view)
    return {"items": items}


@router.get("/{name}")
def get_topology(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """One topology, with every domain of every level: nodes, allocatable and free per resource."""
    row = _row(ctx, name)
    return topology_view(row, _with_index(ctx, row, _domains))


@router.put("/{name}")
def put_topology(name: str, body: TopologyBody, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Create or replace a topology; gangs already placed stay where they are."""
    _store(ctx, body, name=name)
    return topology_view(_row(ctx, name))


@router.delete("/{name}")
def delete_topology(name: str, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Delete a topology: gangs placed under it stay; gangs waiting on it wait until it exists again."""
    try:
        topology_store.delete_topology(ctx.store, name)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    ctx.loop.changed("Topology", name)
    return {"deleted": name}
