"""What a caller may see of workloads it does not own, decided by the API's own read routes.

The console and the what-if answer show other people's workloads only where the API would show
them to the same caller: a workload is visible exactly when `GET /v1/workloads/{ns}/{name}` (one
workload) or `GET /v1/workloads?node=` (a node's workloads) would answer it. These helpers call
those route functions, so whatever rule authorization applies there applies here too; nothing
here restates it.
"""

from __future__ import annotations

from fastapi import HTTPException

from finesched.server.api import routes_workloads
from finesched.server.api.auth import ADMIN, Identity
from finesched.server.api.context import ServerContext


def can_see_workload(ctx: ServerContext, caller: Identity, key: str) -> bool:
    """Whether `GET /v1/workloads/{key}` answers `caller` (admins: always, without a store read)."""
    if caller.role == ADMIN:
        return True
    namespace, _, name = key.partition("/")
    try:
        routes_workloads.get_workload(namespace, name, ctx, caller)
    except HTTPException:
        return False
    return True


def visible_on_node(ctx: ServerContext, caller: Identity, node: str) -> set[str] | None:
    """The keys of `node`'s workloads that `GET /v1/workloads?node=` lists for `caller`; None: all."""
    if caller.role == ADMIN:
        return None
    listed = routes_workloads.visible_workloads(ctx, caller, node=node)
    return {f"{w['metadata']['namespace']}/{w['metadata']['name']}" for w in listed}
