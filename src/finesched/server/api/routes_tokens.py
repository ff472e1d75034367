"""/v1/tokens (admins only): create a token (the secret shown once), list them, revoke one.

The same functions as `finesched token create|list|revoke --db` (server/api/auth.py). A list never
shows a token or its digest. Tenants and agents are answered 403 whatever they send (the role is
checked before the body is read: server/api/authz.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from finesched.errors import ValidationError
from finesched.server.api.auth import MAX_DESCRIPTION, MAX_TTL_S, issue_token, list_tokens, revoke_tokens
from finesched.server.api.authz import AdminCaller
from finesched.server.api.context import Ctx
from finesched.server.store.views import Integer, invalid

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])
MAX_ID = 2**63 - 1


class TokenRequest(BaseModel):
    """A new token: `tenant` for a tenant token (an existing tenant), `node` for an agent token;
    `ttlSeconds` from 1 s to ten years (none: until revoked)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    role: Literal["admin", "agent", "tenant"]
    tenant: str | None = Field(default=None, min_length=1, max_length=253)
    node: str | None = Field(default=None, min_length=1, max_length=253)
    ttl_seconds: Integer | None = Field(default=None, ge=1, le=MAX_TTL_S, alias="ttlSeconds")
    description: str = Field(default="", max_length=MAX_DESCRIPTION)


@router.post("", status_code=201)
def create(body: TokenRequest, ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """A new token: `token` is the secret, shown only in this answer (the store keeps its digest)."""
    try:
        issued = issue_token(ctx.store, body.role, body.tenant, body.node, ttl_s=body.ttl_seconds,
                             description=body.description)  # fmt: skip
    except ValidationError as exc:
        raise invalid(exc) from None
    return {"token": issued.token, **issued.info}


@router.get("")
def list_all(ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Every token: id, role, tenant or node, created, expires, revoked, description, state."""
    return {"items": list_tokens(ctx.store)}


@router.delete("/{token_id}")
def revoke(token_id: Annotated[int, Path(ge=1, le=MAX_ID)], ctx: Ctx, caller: AdminCaller) -> dict[str, Any]:
    """Revoke a token: every replica refuses it within a second. Revoking it again keeps the first time."""
    (info,) = revoke_tokens(ctx.store, [token_id])
    return info
