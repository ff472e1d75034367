"""Logs from anywhere: `GET /v1/workloads/{ns}/{name}/logs`, fetched from the node agent that ran it.

The output of a workload stays on its node (``<agent data>/workloads/<NS.NAME>-<uid>/output.log``,
one per workload object: a workload created with the name of a deleted one has its own). The
server reaches it the way the Kubernetes API server reaches a kubelet's logs: the agent serves them
on a port of its own, whose URL it sends in its reports (``discovery.logs.url``), and the server
asks it and streams the answer to the client. The client needs only the server, with the same
authorization as reading the workload; the node's port needs to be reachable from the server only.

The agent answers no one but the server: each request carries a one-time grant the server makes
for that workload (random, 60 s), which the agent checks with the server over its own
authenticated channel (`POST /v1/log-grants/verify`, agent token) before it reads anything. The
store keeps only the grant's SHA-256 digest, and the verification consumes it, so a copied
database or a replayed request reads nothing.

The grant and the output cross the network between server and node, so, as the API server verifies
a kubelet with ``--kubelet-certificate-authority``, the server reaches an agent's ``https://`` port
only if its certificate is issued by the CA of ``--agent-ca`` (default: the system's trust store)
for the address in the URL, and sends a grant to an ``http://`` port only on loopback, unless told
``--insecure-agent-logs`` (`AgentTrust`). Every refusal is a 502 that says why, logged as well.
"""

from __future__ import annotations

import logging
import secrets
import ssl
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, insert
from starlette.concurrency import run_in_threadpool

from finesched.server.api.auth import Identity, digest
from finesched.server.api.authz import AgentCaller
from finesched.server.api.context import Caller, Ctx, ServerContext
from finesched.server.api.routes_workloads import _visible_workload
from finesched.server.store import schema as t
from finesched.server.store.store import as_dict, now
from finesched.tls import ca_context, in_clear_to_another_host, is_loopback, pinned_context

if TYPE_CHECKING:  # httpx is imported by the one route that reads an agent (a server's start needs it not)
    import httpx

log = logging.getLogger("finesched.server")
router = APIRouter(prefix="/v1", tags=["logs"])

GRANT_TTL_S = 60.0
MAX_TAIL_LINES = 100_000
#: How long the server waits for the agent to answer (a followed stream then runs until it ends).
AGENT_TIMEOUT_S = 10.0
#: OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: a trusted certificate
#: issued for another name than the one in the agent's URL.
NAME_MISMATCH = (62, 64)


class GrantBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grant: str = Field(min_length=16, max_length=256)


@dataclass(frozen=True)
class AgentTrust:
    """How the server may reach node agents' log ports (`finesched serve --agent-ca`,
    `--local-agent-cert`, `--insecure-agent-logs`); the contexts are built once, not per request."""

    #: Verifies an agent's certificate and its name against the URL: --agent-ca, or the system's store.
    verify: ssl.SSLContext
    #: For an agent on this machine (a loopback URL): exactly this certificate, or one from the
    #: --agent-ca file, whatever names it carries (`finesched up`: its agent serves with the
    #: server's own pair and is reached at 127.0.0.1, a name that certificate need not list).
    local: ssl.SSLContext | None = None
    #: Send grants over plain HTTP to other machines too (they cross the network in clear).
    insecure: bool = False

    @classmethod
    def load(cls, ca: Path | None = None, local_cert: Path | None = None, insecure: bool = False) -> AgentTrust:
        """From the files (raises tls.TransportError naming the option of a file that cannot be read)."""
        verify = ca_context(ca, "--agent-ca")
        local = pinned_context(local_cert, "--local-agent-cert") if local_cert is not None else None
        if local is not None and ca is not None:
            local.load_verify_locations(cafile=str(ca))  # another agent on this machine, with its own certificate
        return cls(verify, local, insecure)

    def context(self, url: str) -> ssl.SSLContext:
        """What an https:// log port at `url` is verified with."""
        if self.local is not None and is_loopback(urlsplit(url).hostname or ""):
            return self.local
        return self.verify

    def refusal(self, url: str) -> str | None:
        """Why no grant may be sent to `url` (None: it may)."""
        if self.insecure or not in_clear_to_another_host(url):
            return None
        return (
            f"its log port {url} speaks plain HTTP and is not on this machine: the server does not send a log "
            "grant, nor relay output, in clear; start that agent with --tls-cert/--tls-key (and this server with "
            "--agent-ca, the CA of its certificate), or this server with --insecure-agent-logs"
        )


def use_agent_trust(app: FastAPI, trust: AgentTrust) -> None:
    """Make `app` reach agents' log ports as `trust` says (`finesched serve` does, from its options)."""
    app.state.agent_trust = trust


def _agent_trust(request: Request) -> AgentTrust:
    """The app's `AgentTrust`; by default the system's trust store and no plain HTTP to another host."""
    trust = getattr(request.app.state, "agent_trust", None)
    if trust is None:
        trust = AgentTrust.load()
        use_agent_trust(request.app, trust)
    return trust  # type: ignore[no-any-return]


def _refuse(workload: str, node: str, why: str) -> HTTPException:
    """A 502 for the client, and the same reason in the server's log."""
    log.warning("logs of %s not read from node %s: %s", workload, node, why)
    return HTTPException(502, f"the agent of node {node}: {why}")


def _unreachable(url: str, exc: httpx.HTTPError) -> str:
    """Why the agent's log port could not be used, an untrusted certificate said as such."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return f"cannot reach its log port {url}: {exc}"
    why = f"the certificate of its log port {url} is not trusted ({cause.verify_message.rstrip('.')})"
    if cause.verify_code in NAME_MISMATCH:
        return f"{why}: it must name the address the agent reports (finesched agent --logs-address)"
    return f"{why}: give this server the CA that issued it (--agent-ca)"


def _agent_url(ctx: ServerContext, node: str) -> str:
    row = ctx.store.find_node(node)
    url = (((row or {}).get("report") or {}).get("discovery") or {}).get("logs", {}).get("url")
    if row is None:
        raise HTTPException(404, f"node {node} is gone, and the workload's output with it")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        # 404, not 5xx: nothing is wrong with the server; this node's output cannot be read from here
        raise HTTPException(404, f"the agent of node {node} does not serve logs (it reports no logs URL)")
    return url.rstrip("/")


def _grant(
    ctx: ServerContext, trust: AgentTrust, caller: Identity, namespace: str, name: str, tail: int | None, follow: bool
) -> tuple:
    """Authorize the caller, find where the workload ran, check the agent may be sent a grant, and
    store a one-time grant for it."""
    row = _visible_workload(ctx, caller, namespace, name)
    node = row.get("node")
    if not node:
        raise HTTPException(404, f"workload {namespace}/{name} has not been placed on a node: it has no output yet")
    url = _agent_url(ctx, node)
    why = trust.refusal(url)
    if why is not None:
        raise _refuse(f"{namespace}/{name}", node, why)
    grant = secrets.token_urlsafe(32)
    stamp = now()
    with ctx.store.write() as conn:
        conn.execute(delete(t.log_grants).where(t.log_grants.c.expires < stamp))
        conn.execute(insert(t.log_grants), {"digest": digest(grant), "workload": f"{namespace}/{name}", "node": node,
                                            "uid": row["uid"], "tail": tail, "follow": follow,
                                            "expires": stamp + timedelta(seconds=GRANT_TTL_S)})  # fmt: skip
    return node, url, grant


@router.get("/workloads/{namespace}/{name}/logs")
async def workload_logs(
    namespace: str,
    name: str,
    ctx: Ctx,
    caller: Caller,
    trust: Annotated[AgentTrust, Depends(_agent_trust)],
    tail: Annotated[int | None, Query(ge=0, le=MAX_TAIL_LINES, description="only the last N lines")] = None,
    follow: Annotated[bool, Query(description="keep streaming until the process ends")] = False,
) -> StreamingResponse:
    """The workload's output (stdout and stderr) as its node agent recorded it, as plain text."""
    import httpx

    node, url, grant = await run_in_threadpool(_grant, ctx, trust, caller, namespace, name, tail, follow)
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(AGENT_TIMEOUT_S, read=None if follow else AGENT_TIMEOUT_S), verify=trust.context(url)
    )
    request = client.build_request("GET", f"{url}/logs", headers={"Authorization": f"Bearer {grant}"})
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise _refuse(f"{namespace}/{name}", node, _unreachable(url, exc)) from None
    if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")[:500]
        await response.aclose()
        await client.aclose()
        if response.status_code == 404:
            raise HTTPException(404, f"the agent of node {node}: {body}")
        raise _refuse(f"{namespace}/{name}", node, f"its log port answered {response.status_code}: {body}")

    async def relay() -> Any:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()
            await client.aclose()

    return StreamingResponse(relay(), media_type="text/plain; charset=utf-8")


@router.post("/log-grants/verify")
def verify_grant(body: GrantBody, ctx: Ctx, caller: AgentCaller) -> dict[str, Any]:
    """A node agent checks a grant it was shown (once): what it may serve, or 403."""
    with ctx.store.write() as conn:
        gone = delete(t.log_grants).where(t.log_grants.c.digest == digest(body.grant)).returning(t.log_grants)
        row = as_dict(conn.execute(gone).first())
    if row is None or row["expires"] < now() or row["node"] != caller.node:
        raise HTTPException(403, "unknown, used or expired log grant, or one for another node")
    return {"workload": row["workload"], "uid": row["uid"], "tail": row["tail"], "follow": bool(row["follow"])}
