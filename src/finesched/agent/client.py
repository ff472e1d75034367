"""The agent's HTTP client for the control plane (the contract in the API notes; agent-role token).

Every failure is a `ServerError`: the HTTP status and the server's reasons, or status 0 when the
server could not be reached (a TLS handshake refused included), so callers decide between "retry
later" and "give up on this one".
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx

from finesched.agent.executor import ServerError
from finesched.model.manifest import to_manifest
from finesched.model.node import Node
from finesched.tls import client_options


def _reasons(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:500]
    if isinstance(detail, list):
        parts = []
        for d in detail:
            loc = ".".join(str(x) for x in d.get("loc", ()) if x != "body") if isinstance(d, dict) else ""
            msg = d.get("msg", d) if isinstance(d, dict) else d
            parts.append(f"{loc}: {msg}" if loc else str(msg))
        return "; ".join(parts)
    return str(detail)


class AgentClient:
    """One node's calls: register, report, bindings, ack, reject, status, and log grants.

    The server's certificate is checked against `ca` (else the system's trust store, or `verify`
    when given); the token is never sent over plain HTTP to a host that is not loopback unless
    `insecure` (tls.py): the constructor raises TransportError instead."""

    def __init__(
        self,
        server: str,
        token: str,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        *,
        ca: Path | None = None,
        insecure: bool = False,
        verify: ssl.SSLContext | None = None,
    ):
        options = client_options(server, ca, insecure)
        self.http = httpx.Client(
            base_url=server.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
            verify=verify or options["verify"],
        )

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServerError(0, f"{method} {path}: {exc}") from None
        if response.status_code >= 400:
            raise ServerError(response.status_code, f"{method} {path}: {_reasons(response)}")
        return response.json() if response.content else None

    def register(self, node: Node) -> dict[str, Any]:
        return self._call("PUT", f"/v1/nodes/{node.name}", json=to_manifest(node))

    def report(self, name: str, body: dict[str, Any]) -> None:
        self._call("POST", f"/v1/nodes/{name}/report", json=body)

    def bindings(self, node: str) -> list[dict[str, Any]]:
        return list((self._call("GET", "/v1/bindings", params={"node": node}) or {}).get("items", []))

    # `object_uid` (the binding's uid, "" when the server gave none) goes as the query parameter
    # `uid`: the server refuses (409) a report about another object than the one of that name now,
    # and an older server ignores it.
    def ack(self, workload: str, object_uid: str = "") -> None:
        self._call("POST", f"/v1/bindings/{workload}/ack", params=_uid(object_uid))

    def reject(self, workload: str, reason: str, object_uid: str = "") -> None:
        self._call("POST", f"/v1/bindings/{workload}/reject", json={"reason": reason}, params=_uid(object_uid))

    def status(
        self, workload: str, phase: str, reason: str, exit_code: int | None, info: dict[str, Any], object_uid: str = ""
    ) -> None:
        body = {"phase": phase, "reason": reason, "exitCode": exit_code, "info": info}
        self._call("POST", f"/v1/workloads/{workload}/status", json=body, params=_uid(object_uid))

    def verify_log_grant(self, grant: str) -> dict[str, Any]:
        """What a log request's grant allows (workload, tail, follow); ServerError 403 when the server
        did not issue it for this node, or it was used or expired (agent/logs.py)."""
        return dict(self._call("POST", "/v1/log-grants/verify", json={"grant": grant}) or {})


def _uid(object_uid: str) -> dict[str, str]:
    """The query parameters naming the object a report is about (none when the server gave no uid)."""
    return {"uid": object_uid} if object_uid else {}
