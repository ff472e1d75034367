"""Bearer tokens with roles: admin, agent (one node), tenant (one tenant's workloads and usage).

Tokens are random URL-safe strings shown once; the store keeps only their SHA-256 digest, so a
copy of the database does not hand out credentials.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request
from sqlalchemy import insert, select

from finesched.errors import ValidationError
from finesched.server import schema as t
from finesched.server.store import Store, now

ADMIN, AGENT, TENANT = "admin", "agent", "tenant"
ROLES = (ADMIN, AGENT, TENANT)


@dataclass(frozen=True)
class Identity:
    role: str
    tenant: str | None = None
    node: str | None = None

    def require(self, *roles: str) -> None:
        if self.role not in roles:
            raise HTTPException(403, f"role {self.role} may not do this (needs {' or '.join(roles)})")

    def require_node(self, node: str) -> None:
        """Admins may act for any node; an agent only for its own."""
        self.require(ADMIN, AGENT)
        if self.role == AGENT and self.node != node:
            raise HTTPException(403, f"this agent token is for node {self.node}, not {node}")

    def require_tenant(self, tenant: str) -> None:
        """Admins may act for any tenant; a tenant token only for its own."""
        self.require(ADMIN, TENANT)
        if self.role == TENANT and self.tenant != tenant:
            raise HTTPException(403, f"this token is for tenant {self.tenant}, not {tenant}")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(store: Store, role: str, tenant: str | None = None, node: str | None = None) -> str:
    """A new token for `role` (tenant tokens name a tenant, agent tokens a node); printed once, stored hashed."""
    if role not in ROLES:
        raise ValidationError(f"unknown role; valid roles: {', '.join(ROLES)}", path="--role", value=role)
    if role == TENANT and not tenant:
        raise ValidationError("a tenant token needs --tenant", path="--tenant")
    if role == AGENT and not node:
        raise ValidationError("an agent token needs --node", path="--node")
    if role != TENANT and tenant:
        raise ValidationError("only tenant tokens name a tenant", path="--tenant", value=tenant)
    if role != AGENT and node:
        raise ValidationError("only agent tokens name a node", path="--node", value=node)
    token = f"fs_{secrets.token_urlsafe(32)}"
    with store.write() as conn:
        conn.execute(insert(t.tokens), {"digest": digest(token), "role": role, "tenant": tenant, "node": node,
                                        "created": now()})  # fmt: skip
    return token


class TokenCache:
    """Token digest -> Identity, looked up once per token (tokens are never changed, only added)."""

    def __init__(self, store: Store):
        self.store = store
        self._known: dict[str, Identity] = {}

    def identify(self, token: str) -> Identity | None:
        key = digest(token)
        found = self._known.get(key)
        if found is not None:
            return found
        with self.store.read() as conn:
            row = conn.execute(select(t.tokens).where(t.tokens.c.digest == key)).first()
        if row is None:
            return None
        identity = Identity(row.role, row.tenant, row.node)
        self._known[key] = identity
        return identity


def authenticate(request: Request) -> Identity:
    """FastAPI dependency: the caller's identity from `Authorization: Bearer <token>` (401 otherwise)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    tokens: Any = request.app.state.ctx.tokens
    identity = tokens.identify(token.strip())
    if identity is None:
        raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
    return identity
