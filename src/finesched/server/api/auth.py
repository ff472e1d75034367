"""Bearer tokens with roles: admin, agent (one node), tenant (one tenant's workloads and usage).

Tokens are random URL-safe strings shown once; the store keeps only their SHA-256 digest, so a
copy of the database does not hand out credentials. A token may expire (`expires`) and may be
revoked (`revoked`, a time): from then on it is refused (401). `issue_token`, `list_tokens` and
`revoke_tokens` are the one implementation behind both `finesched token ...` (straight on the
database) and the admin API (`/v1/tokens`, server/api/routes_tokens.py).

Every replica checks a token against the store at least every FRESH_S seconds (`TokenCache`), so a
revoked or deleted token is refused by all of them within a second, and an expired one at once
(the expiry is compared on every request); between two reads a request costs no database round
trip. Failed authentications are logged (source, time, path and why; never the token) and slowed
per source (server/api/auth_limit.py).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Connection, insert, select, update

from finesched.admission import DEFAULT_TENANT
from finesched.errors import ErrorDetail, ValidationError
from finesched.model.names import subdomain_problems
from finesched.server.api.auth_limit import FailedAuthLimiter
from finesched.server.store import schema as t
from finesched.server.store.store import NotFound, Store, aware, now

log = logging.getLogger("finesched.server.auth")

ADMIN, AGENT, TENANT = "admin", "agent", "tenant"
ROLES = (ADMIN, AGENT, TENANT)
#: The longest a token may live (`--ttl`, `ttlSeconds`): ten years.
MAX_TTL_S = 10 * 365 * 86400
#: `--ttl` units: a number of seconds, minutes, hours or days.
TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
TTL_FORMS = "seconds (3600) or a number with s, m, h or d (90s, 15m, 12h, 30d), from 1s to 3650d"
MAX_DESCRIPTION = 253
#: How long a replica trusts what it read of a token (revocation and deletion show within this).
FRESH_S = 0.5
#: The most token digests a replica remembers (valid or not); older ones are read again.
MAX_CACHED = 10_000
_TTL = re.compile(r"^\s*([0-9]+)\s*([smhd]?)\s*$")


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


# Creating, listing and revoking ---------------------------------------------------------------------------
def parse_ttl(text: str) -> int:
    """Seconds of a `--ttl` value ("90s", "15m", "12h", "30d", or plain seconds); ValueError naming
    the allowed forms otherwise."""
    found = _TTL.match(text)
    seconds = int(found.group(1)) * TTL_UNITS[found.group(2) or "s"] if found else None
    if seconds is None or not 1 <= seconds <= MAX_TTL_S:
        why = "is out of range" if seconds is not None else "is not a duration"
        raise ValueError(f"{text!r} {why}: use {TTL_FORMS}")
    return seconds


@dataclass(frozen=True)
class Issued:
    """A new token: the secret (shown once) and what `list_tokens` says of it."""

    token: str
    info: dict[str, Any]


def issue_token(store: Store, role: str, tenant: str | None = None, node: str | None = None, *,
                ttl_s: int | None = None, description: str = "") -> Issued:  # fmt: skip
    """A new token for `role` (tenant tokens name an existing tenant, agent tokens a node), living
    `ttl_s` seconds (None: until revoked); stored hashed. ValidationError names every bad field
    (as the API names them: role, tenant, node, ttlSeconds, description)."""
    problems = _problems(role, tenant, node, ttl_s, description)
    if problems:
        raise ValidationError(problems)
    token = f"fs_{secrets.token_urlsafe(32)}"
    stamp = now()
    expires = stamp + timedelta(seconds=ttl_s) if ttl_s is not None else None
    row = {"digest": digest(token), "role": role, "tenant": tenant, "node": node, "created": stamp,
           "expires": expires, "revoked": None, "description": description}  # fmt: skip
    with store.write() as conn:
        if role == TENANT and tenant != DEFAULT_TENANT:
            known = conn.execute(select(t.tenants.c.name).where(t.tenants.c.name == tenant)).first()
            if known is None:
                raise ValidationError(f"tenant {tenant} does not exist (create it first)", path="tenant", value=tenant)
        token_id = conn.execute(insert(t.tokens).returning(t.tokens.c.id), row).scalar_one()
    whom = f" for {TENANT} {tenant}" if tenant else f" for node {node}" if node else ""
    log.info("token %d created: %s%s%s", token_id, role, whom, f", expires {expires.isoformat()}" if expires else "")
    return Issued(token, _info({**row, "id": token_id}))


def create_token(store: Store, role: str, tenant: str | None = None, node: str | None = None, *,
                 ttl_s: int | None = None, description: str = "") -> str:  # fmt: skip
    """The secret of a new token (see `issue_token`)."""
    return issue_token(store, role, tenant, node, ttl_s=ttl_s, description=description).token


def _problems(role: str, tenant: str | None, node: str | None, ttl_s: int | None,
              description: str) -> list[ErrorDetail]:  # fmt: skip
    problems = []
    if role not in ROLES:
        problems.append(ErrorDetail("role", f"unknown role; valid roles: {', '.join(ROLES)}", role))
    if role == TENANT and not tenant:
        problems.append(ErrorDetail("tenant", "a tenant token needs a tenant"))
    if role == AGENT and not node:
        problems.append(ErrorDetail("node", "an agent token needs a node"))
    if role != TENANT and tenant:
        problems.append(ErrorDetail("tenant", "only tenant tokens name a tenant", tenant))
    if role != AGENT and node:
        problems.append(ErrorDetail("node", "only agent tokens name a node", node))
    for field, name in (("tenant", tenant), ("node", node)):
        if name:
            problems += [ErrorDetail(field, p, name) for p in subdomain_problems(name)]
    if ttl_s is not None and not 1 <= ttl_s <= MAX_TTL_S:
        problems.append(ErrorDetail("ttlSeconds", f"must be from 1 to {MAX_TTL_S} (ten years)", ttl_s))
    if len(description) > MAX_DESCRIPTION or not description.isprintable():
        problems.append(ErrorDetail("description", f"at most {MAX_DESCRIPTION} printable characters", description))
    return problems


def _time(value: datetime | None) -> str | None:
    stamp = aware(value)
    return stamp.isoformat() if stamp is not None else None


def _info(row: Any) -> dict[str, Any]:
    """What may be shown of a token: never the token, never its digest."""
    expires, revoked = aware(row["expires"]), aware(row["revoked"])
    state = "Revoked" if revoked is not None else "Expired" if expires is not None and expires <= now() else "Active"
    return {"id": row["id"], "role": row["role"], "tenant": row["tenant"], "node": row["node"],
            "created": _time(row["created"]), "expires": _time(expires), "revoked": _time(revoked),
            "description": row["description"] or "", "state": state}  # fmt: skip


_LISTED = [t.tokens.c[n] for n in ("id", "role", "tenant", "node", "created", "expires", "revoked", "description")]


def list_tokens(store: Store) -> list[dict[str, Any]]:
    """Every token, oldest first (id, role, tenant, node, created, expires, revoked, description, state)."""
    with store.read() as conn:
        return [_info(r._mapping) for r in conn.execute(select(*_LISTED).order_by(t.tokens.c.id))]


def revoke_tokens(store: Store, ids: Sequence[int]) -> list[dict[str, Any]]:
    """Revoke the tokens `ids`, all or none (NotFound naming the unknown ones, nothing changed); a
    token revoked before keeps its time. What `list_tokens` says of them afterwards."""
    wanted = list(dict.fromkeys(ids))
    stamp = now()
    with store.write() as conn:
        found = {r.id: r for r in conn.execute(select(*_LISTED).where(t.tokens.c.id.in_(wanted)))}
        missing = [str(i) for i in wanted if i not in found]
        if missing:
            raise NotFound(f"no token with id {', '.join(missing)}")
        fresh = [i for i in wanted if found[i].revoked is None]
        if fresh:
            conn.execute(update(t.tokens).where(t.tokens.c.id.in_(fresh)).values(revoked=stamp))
    for i in fresh:
        log.info("token %d revoked", i)
    return [_info({**found[i]._mapping, "revoked": found[i].revoked or stamp}) for i in wanted]


def revoke_tenant_tokens(conn: Connection, tenant: str) -> None:
    """In the caller's transaction (the tenant's deletion): revoke the tenant's tokens, so that a
    tenant created again under that name does not inherit them."""
    if tenant != DEFAULT_TENANT:  # it exists whether stored or not
        live = (t.tokens.c.tenant == tenant) & (t.tokens.c.role == TENANT) & t.tokens.c.revoked.is_(None)
        conn.execute(update(t.tokens).where(live).values(revoked=now()))


# Checking -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Seen:
    identity: Identity | None  # None: refused, for `reason`
    reason: str
    expires: float  # epoch seconds (inf: never)
    until: float  # trusted until (monotonic)


class TokenCache:
    """Token digest -> what the store says of it, read again after FRESH_S.

    A token is looked up in the store on its first use and then at most every FRESH_S on this
    replica, whatever the request rate; its expiry is compared with the clock on every request.
    Refusals are remembered as long (a client repeating a wrong token costs one read per FRESH_S).
    `limiter` counts failed authentications per source (server/api/auth_limit.py)."""

    def __init__(self, store: Store, fresh_s: float = FRESH_S, limiter: FailedAuthLimiter | None = None,
                 max_cached: int = MAX_CACHED):  # fmt: skip
        self.store = store
        self.fresh_s = fresh_s
        self.max_cached = max_cached
        self.limiter = limiter if limiter is not None else FailedAuthLimiter()
        self.reads = 0  # store look-ups so far (for the benchmark and the tests)
        self._seen: dict[str, _Seen] = {}
        self._lock = threading.Lock()

    def verify(self, token: str) -> tuple[Identity | None, str]:
        """The token's identity, or None and why it is refused (unknown, expired, revoked)."""
        key = digest(token)
        seen = self._seen.get(key)
        if seen is None or seen.until <= time.monotonic():
            seen = self._read(key)
        if seen.identity is not None and seen.expires <= time.time():
            return None, "expired token"
        return seen.identity, seen.reason

    def known(self, token: str) -> Identity | None:
        """The token's identity when `verify` would answer it without reading the store (read less
        than `fresh_s` ago, valid, not expired); None otherwise (ask `verify`)."""
        seen = self._seen.get(digest(token))
        if seen is None or seen.identity is None or seen.until <= time.monotonic() or seen.expires <= time.time():
            return None
        return seen.identity

    def identify(self, token: str) -> Identity | None:
        return self.verify(token)[0]

    def _read(self, key: str) -> _Seen:
        columns = (t.tokens.c.role, t.tokens.c.tenant, t.tokens.c.node, t.tokens.c.expires, t.tokens.c.revoked)
        with self.store.read() as conn:
            row = conn.execute(select(*columns).where(t.tokens.c.digest == key)).first()
        self.reads += 1
        until = time.monotonic() + self.fresh_s
        if row is None:
            seen = _Seen(None, "unknown token", math.inf, until)
        elif row.revoked is not None:
            seen = _Seen(None, "revoked token", math.inf, until)
        else:
            expires = aware(row.expires)
            stamp = expires.timestamp() if expires is not None else math.inf
            seen = _Seen(Identity(row.role, row.tenant, row.node), "", stamp, until)
        with self._lock:
            if len(self._seen) >= self.max_cached:
                self._forget()
            self._seen.pop(key, None)
            self._seen[key] = seen
        return seen

    def _forget(self) -> None:
        """Drop stale entries; if that is not enough, the oldest half (read again when used)."""
        moment = time.monotonic()
        kept = {k: v for k, v in self._seen.items() if v.until > moment}
        if len(kept) >= self.max_cached:
            kept = dict(list(kept.items())[len(kept) // 2 :])
        self._seen = kept


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def source_of(request: Request) -> str:
    """The peer address of the connection (a proxy's, behind one: see server/api/auth_limit.py)."""
    return request.client.host if request.client is not None else "unknown"


async def authenticate(request: Request) -> Identity:
    """FastAPI dependency: the caller's identity from `Authorization: Bearer <token>`; 401 otherwise,
    or 429 with `Retry-After` once its source failed too often (server/api/auth_limit.py).

    A token this replica has read recently and that holds is answered on the event loop; anything
    else (a read of the store, a refusal) in a worker thread, as a blocking call."""
    token = _bearer(request)
    if token:
        identity = request.app.state.ctx.tokens.known(token)
        if identity is not None:
            return identity
    return await run_in_threadpool(_authenticate, request)


def _authenticate(request: Request) -> Identity:
    tokens: TokenCache = request.app.state.ctx.tokens
    token = _bearer(request)
    identity, reason = tokens.verify(token) if token else (None, "missing bearer token")
    if identity is not None:
        return identity
    source = source_of(request)
    verdict = tokens.limiter.failed(source)
    when = now().isoformat(timespec="milliseconds")
    if verdict.log == "failure":
        log.warning("authentication failed: %s from %s at %s on %s %r", reason, source, when, request.method,
                    request.url.path)  # fmt: skip
    elif verdict.log == "limited":
        log.warning("authentication failures from %s at %s: refused with 429 for %ds (%d refused since the last "
                    "line; the last on %s %r: %s)", source, when, verdict.retry_after, verdict.refused,
                    request.method, request.url.path, reason)  # fmt: skip
    if verdict.retry_after is not None:
        raise HTTPException(429, f"too many failed authentications from {source}; retry in {verdict.retry_after}s",
                            headers={"Retry-After": str(verdict.retry_after)})  # fmt: skip
    raise HTTPException(401, reason, headers={"WWW-Authenticate": "Bearer"})
