"""Authorization before validation: who may write is decided before what is written is checked.

Kubernetes authorizes a request before admission; so does this API. A caller that may not write
somewhere is answered 401 or 403 whatever its body, never a 422 that would describe what that
endpoint accepts. Two things stood in the way:

* FastAPI validates a route's typed body before the handler runs (where the role checks were):
  the checks here are *dependencies*, which FastAPI runs first. They look at the caller's role,
  at the node or tenant the URL names and, where the body names who it is for (a manifest's
  namespace, the node an agent registers, the tenant of an offer), at the body as sent
  (`sent_json`: read leniently, before anything is validated).
* `BodyLimit` (app.py) reads every JSON body before routing. A body that is not JSON, or has a
  NaN, an Infinity or a number that overflows, is not answered there: the problem is kept
  (`defer`), the app is handed an empty body, and the 422 naming the problem is answered only
  once the caller got past these checks (app.py's validation handler, or `raise_deferred` in a
  route that reads its body itself). A route that takes no body ignores one.

A body that cannot be read at all (empty, not JSON) names nothing: a caller whose right to write
depends on what the body names (a tenant on the workloads it submits, an agent registering its
node) then gets the 422 saying the body cannot be read, which tells nothing of the route. A
manifest that names no namespace is in `default` (`views.namespace_of`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, MutableMapping
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from finesched.server.api.auth import ADMIN, AGENT, TENANT, Identity
from finesched.server.api.context import Caller, ServerContext, get_context
from finesched.server.store.views import InputError, namespace_of

#: Where BodyLimit keeps a body's problem and the body itself (a key of the ASGI scope).
DEFERRED = "finesched.deferred_body"


def defer(scope: MutableMapping[str, Any], problem: dict[str, Any], data: bytes) -> None:
    """Keep the problem of a body that cannot be read (answered after authorization)."""
    scope[DEFERRED] = (problem, data)


def deferred_problem(request: Request) -> dict[str, Any] | None:
    """The problem `defer` kept for this request, if any."""
    kept = request.scope.get(DEFERRED)
    return kept[0] if kept is not None else None


def raise_deferred(request: Request) -> None:
    """For a route that reads its body itself: 422 with the kept problem, if any."""
    problem = deferred_problem(request)
    if problem is not None:
        raise InputError([problem])


async def sent_json(request: Request) -> Any:
    """The body as the client sent it, parsed leniently (NaN and Infinity taken), for deciding who
    may write it; None when it is empty or not JSON. Nothing here is validated."""
    kept = request.scope.get(DEFERRED)
    try:
        if kept is not None:
            return json.loads(kept[1]) if kept[1] else None
        return await request.json() if await request.body() else None
    except (ValueError, RecursionError):
        return None


def _role(*roles: str) -> Callable[[Identity], Coroutine[Any, Any, Identity]]:
    async def check(caller: Caller) -> Identity:
        caller.require(*roles)
        return caller

    return check


AdminCaller = Annotated[Identity, Depends(_role(ADMIN))]
AdminOrTenant = Annotated[Identity, Depends(_role(ADMIN, TENANT))]
AdminOrAgent = Annotated[Identity, Depends(_role(ADMIN, AGENT))]
AgentCaller = Annotated[Identity, Depends(_role(AGENT))]


async def _node_caller(name: str, caller: Caller) -> Identity:
    caller.require_node(name)
    return caller


#: An admin, or the agent of the node the URL names (`{name}`).
NodeCaller = Annotated[Identity, Depends(_node_caller)]


async def _node_reader(name: str, caller: Caller) -> Identity:
    if caller.role != TENANT:
        caller.require_node(name)
    return caller


#: An admin, the agent of the node the URL names, or a tenant (which reads it as the console's node
#: page shows it: other tenants' workloads unnamed).
NodeReader = Annotated[Identity, Depends(_node_reader)]


async def _node_writer(caller: AdminOrAgent, body: Annotated[Any, Depends(sent_json)]) -> Identity:
    if caller.role == AGENT and body is not None:
        metadata = body.get("metadata") if isinstance(body, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if name != caller.node:
            raise HTTPException(403, f"this agent token is for node {caller.node}, not {name!r}")
    return caller


#: An admin, or the agent of the node the body names (`metadata.name`).
NodeWriter = Annotated[Identity, Depends(_node_writer)]


def check_namespaces(ctx: ServerContext, caller: Identity, body: Any, world: Any = None) -> None:
    """403 unless `caller` may write in every namespace the manifests of `body` (one or a list)
    name; nothing is checked of a body that cannot be read (None)."""
    if body is None or caller.role != TENANT:
        return
    docs = body if isinstance(body, list) else [body]
    world = world or ctx.world(devices=False)  # read once, whatever the number of namespaces
    for namespace in dict.fromkeys(map(namespace_of, docs)):
        ctx.check_namespace(caller, namespace, world)


async def _manifest_writer(
    ctx: Annotated[ServerContext, Depends(get_context)],
    caller: AdminOrTenant,
    body: Annotated[Any, Depends(sent_json)],
) -> Identity:
    """`check_namespaces`: in a worker thread when it reads the store (a tenant's manifests), at
    once otherwise (an admin: nothing to read, no thread to wait for)."""
    if body is not None and caller.role == TENANT:
        await run_in_threadpool(check_namespaces, ctx, caller, body)
    return caller


#: An admin, or a tenant writing manifests (one or a list) in namespaces its tenant owns.
ManifestWriter = Annotated[Identity, Depends(_manifest_writer)]
