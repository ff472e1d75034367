"""GET /v1/whoami: who a token is, as `kubectl auth whoami` asks (Kubernetes' SelfSubjectReview).

Any valid token may ask. The CLI uses it to default a tenant's commands to the tenant's own
namespace and to say, when a namespace is refused, which ones the token may use.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from finesched.server.api.auth import AGENT
from finesched.server.api.context import Caller, Ctx

router = APIRouter(prefix="/v1/whoami", tags=["tokens"])


class Whoami(BaseModel):
    """The token's role; its tenant (tenant tokens) or node (agent tokens); and the namespaces it
    acts in: a tenant's own (its name's first, then the ones granted to it), none for an agent,
    null for an admin (every namespace)."""

    role: str = Field(description="admin, agent or tenant")
    tenant: str | None = None
    node: str | None = None
    namespaces: list[str] | None = None


@router.get("", response_model=Whoami)
def whoami(ctx: Ctx, caller: Caller) -> Whoami:
    """Who this token is and where it may act."""
    namespaces = ctx.namespaces_of(caller)
    if caller.role == AGENT:
        namespaces = ()
    return Whoami(role=caller.role, tenant=caller.tenant, node=caller.node,
                  namespaces=None if namespaces is None else list(namespaces))  # fmt: skip
