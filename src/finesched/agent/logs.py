"""The agent's log port: serves a workload's output to the control plane, and to no one else.

`GET /logs` with ``Authorization: Bearer GRANT``: the agent asks the server what the grant allows
(`AgentClient.verify_log_grant`, over the agent's own token; a grant works once, see
server/logs.py), then streams ``<data>/workloads/<safe name>/output.log`` (agent/executor.py
`rundir_of`) of the workload object the grant names (its uid: a deleted workload's log is never
served for a new one of its name): the last `tail` lines, or all of it, and with `follow` what the process writes next
until it ends. The URL the server reaches this port at goes into every report as
``discovery.logs.url``.

Like a kubelet's API, the port speaks HTTPS when the agent has a certificate and key
(``finesched agent --tls-cert/--tls-key``), and the server verifies it with its ``--agent-ca``.
Without one it speaks plain HTTP, which the server uses only on loopback (`finesched up`) or
when told ``--insecure-agent-logs``: the grant and the output would cross the network in clear.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import StreamingResponse

from finesched.agent.executor import ServerError, rundir_of
from finesched.tls import is_loopback

log = logging.getLogger("finesched.agent")

CHUNK = 64 * 1024
POLL_S = 0.2


def tail_offset(f: BinaryIO, lines: int) -> int:
    """Where the last `lines` lines of `f` start (a final newline ends the last line, it does not
    start an empty one); reads backwards in blocks, so a large log costs what its tail costs."""
    end = f.seek(0, 2)
    if lines <= 0:
        return end
    found, position = 0, end
    while position > 0:
        step = min(8192, position)
        position -= step
        f.seek(position)
        block = f.read(step)
        for i in range(len(block) - 1, -1, -1):
            if block[i] == 0x0A and position + i != end - 1:
                found += 1
                if found == lines:
                    return position + i + 1
    return 0


def read_log(path: Path, tail: int | None, follow: bool, running: Callable[[], bool]) -> Iterator[bytes]:
    """The log from the start (or its last `tail` lines); with `follow`, then what is appended, until
    the process no longer runs and everything it wrote was sent."""
    with path.open("rb") as f:
        f.seek(tail_offset(f, tail) if tail is not None else 0)
        while True:
            chunk = f.read(CHUNK)
            if chunk:
                yield chunk
                continue
            if not follow:
                return
            if not running():
                rest = f.read()
                if rest:
                    yield rest
                return
            time.sleep(POLL_S)


def advertised_host(server: str) -> str:
    """The address of this machine that the server at URL `server` reaches it by: the local end of a
    route to the server (127.0.0.1 for a server on this machine)."""
    parts = urlsplit(server)
    host = parts.hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, parts.port or 80))  # no packet is sent: this only picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


class LogServer:
    """The log port of one agent (module docstring), in a thread of the agent process."""

    def __init__(
        self,
        data: Path,
        verify: Callable[[str], dict[str, Any]],
        running: Callable[[str], bool],
        host: str,
        port: int = 0,
        bind: str | None = None,
        tls: dict[str, Any] | None = None,
        unnamed: Callable[[str], bool] | None = None,
    ):
        """`verify(grant)` asks the server; `running(workload)` says whether its process still runs;
        `unnamed(workload)`: whether the agent runs it from a binding without a uid (started before
        the server gave uids: its log has the name without one).
        Listens on `bind` (default `host`) at `port` (0: any free port) and is reached at `host`;
        speaks HTTPS with `tls` (uvicorn's certificate arguments, from `tls.server_tls`)."""
        self.data = data
        self.verify = verify
        self.running = running
        self.unnamed = unnamed or (lambda workload: False)
        self.sock = socket.socket(socket.AF_INET6 if ":" in (bind or host) else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind or host, port))
        self.sock.listen(64)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if tls else 'http'}://{shown}:{self.sock.getsockname()[1]}"
        self.host = host
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False, **(tls or {}))
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    def _app(self) -> FastAPI:
        app = FastAPI(title="finesched agent logs", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/logs")
        def logs(authorization: str = Header(default="")) -> StreamingResponse:
            scheme, _, grant = authorization.partition(" ")
            if scheme.lower() != "bearer" or not grant.strip():
                raise HTTPException(401, "a log grant from the control plane is required")
            try:
                granted = self.verify(grant.strip())
            except ServerError as exc:
                refused = exc.status in (401, 403, 404, 422)
                raise HTTPException(403 if refused else 502, f"grant not accepted: {exc}") from None
            workload = str(granted.get("workload", ""))
            path = self._log_path(workload, str(granted.get("uid") or ""))
            if path is None or not path.is_file():
                raise HTTPException(404, f"no output of {workload} on this node")
            tail = granted.get("tail")
            chunks = read_log(path, int(tail) if tail is not None else None, bool(granted.get("follow")),
                              lambda: self.running(workload))  # fmt: skip
            return StreamingResponse(chunks, media_type="text/plain; charset=utf-8")

        return app

    def _log_path(self, workload: str, object_uid: str = "") -> Path | None:
        """The log of the workload object `object_uid` ("": an older server's grant, by name only),
        or None for a name or uid that would lead out of the workloads directory."""
        if workload.count("/") != 1:
            return None
        base = (self.data / "workloads").resolve()
        path = (rundir_of(self.data, workload, object_uid) / "output.log").resolve()
        if object_uid and not path.is_file() and self.unnamed(workload):
            path = (rundir_of(self.data, workload) / "output.log").resolve()
        return path if path.is_relative_to(base) else None

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="finesched-agent-logs", daemon=True
        )
        self.thread.start()
        log.info("serving workload logs to the control plane at %s", self.url)
        if self.url.startswith("http:") and not is_loopback(self.host):
            log.warning(
                "the log port speaks plain HTTP to another machine: the server reads logs from it only when "
                "started with --insecure-agent-logs (grants and output cross the network in clear); give this "
                "agent --tls-cert/--tls-key and the server --agent-ca"
            )

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.sock.close()
