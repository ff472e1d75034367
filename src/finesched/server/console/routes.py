"""/ui: the console's pages, its static assets, and the few summaries the /v1 API has no route for.

The pages are one HTML shell (`templates/console.html`) whose scripts draw each page from the API
with the token the user signed in with (kept in the tab's sessionStorage, sent as a Bearer
header): lists, workloads, events and what-if plans come from the /v1 routes themselves, so a
tenant's console shows exactly what the API shows that tenant. What the API has no route for is
here, under /ui/api, behind the same authentication: the overview (`overview.py`), every node's
flags and usage for the cluster map, and one node drawn to the device and logical CPU
(`node_page.py`). A tenant sees the nodes, and on them only its own workloads by name.

Nothing here is fetched from the internet: the shell, scripts, styles and icon are package data.
"""

from __future__ import annotations

import hashlib
import time
from importlib import resources
from string import Template
from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException, Request, Response

from finesched import __version__
from finesched.model.resources import CPU, MEMORY
from finesched.model.topology import Topology
from finesched.server.api import routes_nodes, routes_tenants, routes_workloads
from finesched.server.api.auth import ADMIN, TENANT
from finesched.server.api.context import Caller, Ctx
from finesched.server.api.visibility import visible_on_node
from finesched.server.console import overview as ov
from finesched.server.console.node_page import NodeInput, node_page
from finesched.server.store.views import InputError

router = APIRouter(tags=["console"], include_in_schema=False)

STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
#: The typical GPU request is relearned at most this often (it is statistics, not state).
TYPICAL_TTL_S = 10.0
#: No inline script or style, nothing from another origin.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")  # fmt: skip


def _package_files() -> tuple[dict[str, tuple[bytes, str, str]], Template]:
    """The static assets (name -> (bytes, media type, ETag)) and the page template, read once."""
    root = resources.files("finesched.server.console")
    static: dict[str, tuple[bytes, str, str]] = {}
    for entry in (root / "static").iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if suffix in STATIC_TYPES:
            data = entry.read_bytes()
            static[entry.name] = (data, STATIC_TYPES[suffix], f'"{hashlib.sha256(data).hexdigest()[:20]}"')
    return static, Template((root / "templates" / "console.html").read_text(encoding="utf-8"))


STATIC, PAGE = _package_files()


# Pages and assets ------------------------------------------------------------------------------------------
@router.get("/ui/static/{name}")
def static_file(name: str, request: Request) -> Response:
    found = STATIC.get(name)
    if found is None:
        raise HTTPException(404, f"no console asset {name}")
    data, media, etag = found
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=media, headers=headers)


# Data the /v1 API has no route for ---------------------------------------------------------------------------
@router.get("/ui/api/whoami")
def whoami(caller: Caller) -> dict[str, Any]:
    """Who the token is (the console says so, and offers only what the role may do)."""
    caller.require(ADMIN, TENANT)
    return {"role": caller.role, "tenant": caller.tenant}


@router.get("/ui/api/overview")
def overview(request: Request, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Nodes by state, resources, GPU fragmentation, pending work by reason, tenants' shares."""
    caller.require(ADMIN, TENANT)
    started = time.perf_counter()
    own = None if caller.role == ADMIN else caller.tenant or ""  # a tenant's figures come from its own work
    with ctx.loop.lock:
        scheduler = ctx.scheduler()
        data = ov.OverviewInput.capture(scheduler, [q.workload for q in ctx.loop.queued.values()], own)
    total, ready, cordoned, flagged = ctx.store.node_summary()
    pending_visible = tenants_visible = None
    if caller.role != ADMIN:
        listed = routes_workloads.visible_workloads(ctx, caller, phase="Pending")
        pending_visible = {f"{w['metadata']['namespace']}/{w['metadata']['name']}" for w in listed}
        tenants_visible = {t["metadata"]["name"] for t in routes_tenants.list_tenants(ctx, caller)["items"]}
        tenants_visible.add(caller.tenant or "")
    target, learned = _typical(request, data, own)
    pending = ov.pending_by_reason(data.waiting, pending_visible)
    return {
        "nodes": {
            "total": total,
            "ready": ready,
            "notReady": total - ready,
            "cordoned": cordoned,
            "scheduled": data.nodes,
            "attention": [{"name": n, "ready": r, "cordoned": c} for n, r, c in flagged],
        },
        "resources": ov.resources_view(data),
        "fragmentation": ov.fragmentation(data, target, learned, "cluster" if own is None else "tenant"),
        "pending": {"total": ov.pending_total(data.waiting, pending_visible), "byReason": pending},
        "tenants": ov.tenants_view(data, tenants_visible),
        "took_ms": round(1000 * (time.perf_counter() - started), 1),
    }


def _typical(request: Request, data: ov.OverviewInput, tenant: str | None) -> tuple[Any, bool]:
    """The typical GPU request of the cluster (`tenant` None) or of one tenant's own work, relearned at
    most every TYPICAL_TTL_S seconds (one entry per tenant that asked in that time)."""
    now = time.monotonic()
    cache: dict[str | None, tuple[float, Any, bool]] = getattr(request.app.state, "console_typical", None) or {}
    cache = {key: entry for key, entry in cache.items() if now - entry[0] < TYPICAL_TTL_S}
    request.app.state.console_typical = cache
    if tenant in cache:
        return cache[tenant][1], cache[tenant][2]
    target, learned = ov.typical_request(data.bindings, data.queued)
    cache[tenant] = (now, target, learned)
    return target, learned


@router.get("/ui/api/nodes")
def nodes(ctx: Ctx, caller: Caller, topology: str | None = None, level: str | None = None) -> dict[str, Any]:
    """Every node's state and use (cpu, memory, GPU core: percent; -1 without any), for the cluster map,
    and the topologies it can be grouped by; with `topology` and `level` (one of its levels' node
    labels) also the domains of that level with their capacity and nodes (`overview.domains_view`).
    What the boxes sum, the nodes' amounts, is what every token already reads of the nodes."""
    caller.require(ADMIN, TENANT)
    if (topology is None) != (level is None):
        missing = "level" if level is None else "topology"
        raise InputError([{"loc": ["query", missing], "msg": "give both topology and level to group the map"}])
    flags = {name: (ready, cordoned) for name, ready, cordoned, _ in ctx.store.node_flags()}
    with ctx.loop.lock:
        scheduler = ctx.scheduler()
        state = scheduler.state
        n, names = state.n, list(state.names)
        used = {r: _used_percent(state.allocatable[state.res_index[r]], state.free[state.res_index[r]])
                for r in (CPU, MEMORY) if r in state.res_index}  # fmt: skip
        gpu_core = ov.gpu_core_rows(state)
        if gpu_core is not None:
            used["gpu"] = _used_percent(*gpu_core)
        topologies = dict(scheduler.topologies)
        grouped = None
        if topology is not None and level is not None:
            depth = _level_of(topologies, topology, level)
            found = topologies[topology]
            grouped = ov.DomainInput.capture(state, scheduler.topology.domains(found), found, depth)
    order = sorted(range(n), key=names.__getitem__)
    missing = sorted(set(flags) - set(names))  # stored, but the scheduler could not load them
    out: dict[str, Any] = {"names": [names[i] for i in order] + missing}
    out["ready"] = [flags.get(name, (False, False))[0] for name in out["names"]]
    out["cordoned"] = [flags.get(name, (False, False))[1] for name in out["names"]]
    for key, values in used.items():
        out[key] = [int(values[i]) for i in order] + [-1] * len(missing)
    out["topologies"] = ov.topologies_view(topologies)
    if grouped is not None:
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        out["groups"] = ov.domains_view(grouped, position, len(missing))
    return out


def _level_of(topologies: dict[str, Topology], topology: str, level: str) -> int:
    """The depth of `level` in `topology`, or 422 naming the query parameter that is wrong."""
    found = topologies.get(topology)
    if found is None:
        known = ", ".join(sorted(topologies)) or "none"
        msg = f"no topology named {topology!r} (the scheduler knows: {known})"
        raise InputError([{"loc": ["query", "topology"], "msg": msg, "input": topology}])
    depth = found.depth_of(level)
    if depth is None:
        msg = f"topology {topology} has no level {level!r} (its levels: {', '.join(found.labels)})"
        raise InputError([{"loc": ["query", "level"], "msg": msg, "input": level}])
    return depth


def _used_percent(allocatable: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Used share in whole percent per node; -1 where the node has none of the resource."""
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(allocatable > 0, np.round(100 * (allocatable - free) / np.maximum(allocatable, 1)), -1)
    return share.astype(np.int64)


@router.get("/ui/api/nodes/{name}")
def node(name: str, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """One node to the device and logical CPU (see `node_page.py`)."""
    caller.require(ADMIN, TENANT)
    row = routes_nodes._row(ctx, name)  # 404 as GET /v1/nodes/{name} answers it
    with ctx.loop.lock:
        scheduler = ctx.scheduler()
        data = NodeInput.capture(scheduler, name) if name in scheduler.state.index else None
    if data is None:
        raise HTTPException(409, f"node {name} is stored but the scheduler could not load it (see its events)")
    return node_page(data, row, visible_on_node(ctx, caller, name))


# The pages (last: the catch-all path must not shadow /ui/api and /ui/static) --------------------------------
@router.get("/ui")
@router.get("/ui/{path:path}")
def page(path: str = "") -> Response:
    """Every console page is the same shell; its script draws the page the path names."""
    if path.startswith(("api/", "static/")):
        raise HTTPException(404, f"no console route /ui/{path}")
    html = PAGE.substitute(version=__version__)
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
               "Referrer-Policy": "no-referrer"}  # fmt: skip
    return Response(html, media_type="text/html; charset=utf-8", headers=headers)
