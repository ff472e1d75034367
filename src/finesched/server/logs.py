"""Logs from anywhere: `GET /v1/workloads/{ns}/{name}/logs`, fetched from the node agent that ran it.

The output of a workload stays on its node (``<agent data>/workloads/NS/NAME/output.log``). The
server reaches it the way the Kubernetes API server reaches a kubelet's logs: the agent serves them
on a port of its own, whose URL it sends in its reports (``discovery.logs.url``), and the server
asks it and streams the answer to the client. The client needs only the server, with the same
authorization as reading the workload; the node's port needs to be reachable from the server only.

The agent answers no one but the server: each request carries a one-time grant the server makes
for that workload (random, 60 s), which the agent checks with the server over its own
authenticated channel (`POST /v1/log-grants/verify`, agent token) before it reads anything. The
store keeps only the grant's SHA-256 digest, and the verification consumes it, so a copied
database or a replayed request reads nothing.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, insert
from starlette.concurrency import run_in_threadpool

from finesched.server import schema as t
from finesched.server.auth import AGENT, Identity, digest
from finesched.server.context import Caller, Ctx, ServerContext
from finesched.server.routes_workloads import _visible_workload
from finesched.server.store import as_dict, now

router = APIRouter(prefix="/v1", tags=["logs"])

GRANT_TTL_S = 60.0
MAX_TAIL_LINES = 100_000
#: How long the server waits for the agent to answer (a followed stream then runs until it ends).
AGENT_TIMEOUT_S = 10.0


class GrantBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grant: str = Field(min_length=16, max_length=256)


def _agent_url(ctx: ServerContext, node: str) -> str:
    row = ctx.store.find_node(node)
    url = (((row or {}).get("report") or {}).get("discovery") or {}).get("logs", {}).get("url")
    if row is None:
        raise HTTPException(404, f"node {node} is gone, and the workload's output with it")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        # 404, not 5xx: nothing is wrong with the server; this node's output cannot be read from here
        raise HTTPException(404, f"the agent of node {node} does not serve logs (it reports no logs URL)")
    return url.rstrip("/")


def _grant(ctx: ServerContext, caller: Identity, namespace: str, name: str, tail: int | None, follow: bool) -> tuple:
    """Authorize the caller, find where the workload ran, and store a one-time grant for it."""
    row = _visible_workload(ctx, caller, namespace, name)
    node = row.get("node")
    if not node:
        raise HTTPException(404, f"workload {namespace}/{name} has not been placed on a node: it has no output yet")
    url = _agent_url(ctx, node)
    grant = secrets.token_urlsafe(32)
    stamp = now()
    with ctx.store.write() as conn:
        conn.execute(delete(t.log_grants).where(t.log_grants.c.expires < stamp))
        conn.execute(insert(t.log_grants), {"digest": digest(grant), "workload": f"{namespace}/{name}", "node": node,
                                            "tail": tail, "follow": follow,
                                            "expires": stamp + timedelta(seconds=GRANT_TTL_S)})  # fmt: skip
    return node, url, grant


@router.get("/workloads/{namespace}/{name}/logs")
async def workload_logs(
    namespace: str,
    name: str,
    ctx: Ctx,
    caller: Caller,
    tail: Annotated[int | None, Query(ge=0, le=MAX_TAIL_LINES, description="only the last N lines")] = None,
    follow: Annotated[bool, Query(description="keep streaming until the process ends")] = False,
) -> StreamingResponse:
    """The workload's output (stdout and stderr) as its node agent recorded it, as plain text."""
    node, url, grant = await run_in_threadpool(_grant, ctx, caller, namespace, name, tail, follow)
    client = httpx.AsyncClient(timeout=httpx.Timeout(AGENT_TIMEOUT_S, read=None if follow else AGENT_TIMEOUT_S))
    request = client.build_request("GET", f"{url}/logs", headers={"Authorization": f"Bearer {grant}"})
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise HTTPException(502, f"cannot reach the agent of node {node} at {url}: {exc}") from None
    if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")[:500]
        await response.aclose()
        await client.aclose()
        raise HTTPException(404 if response.status_code == 404 else 502, f"the agent of node {node}: {body}")

    async def relay() -> Any:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()
            await client.aclose()

    return StreamingResponse(relay(), media_type="text/plain; charset=utf-8")


@router.post("/log-grants/verify")
def verify_grant(body: GrantBody, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """A node agent checks a grant it was shown (once): what it may serve, or 403."""
    caller.require(AGENT)
    with ctx.store.write() as conn:
        gone = delete(t.log_grants).where(t.log_grants.c.digest == digest(body.grant)).returning(t.log_grants)
        row = as_dict(conn.execute(gone).first())
    if row is None or row["expires"] < now() or row["node"] != caller.node:
        raise HTTPException(403, "unknown, used or expired log grant, or one for another node")
    return {"workload": row["workload"], "tail": row["tail"], "follow": bool(row["follow"])}
