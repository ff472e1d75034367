"""Real servers for the control-plane tests: fresh databases (SQLite or PostgreSQL), an in-process
uvicorn server on 127.0.0.1, and `finesched serve` subprocesses that can be killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from finesched.server.api.auth import create_token
from finesched.server.api.http_server import Timeouts, server_config
from finesched.server.app import create_app
from finesched.server.loop.loop import LoopConfig
from finesched.server.store.store import Store

PG_URL = os.environ.get("FINESCHED_TEST_PG_URL", "")
REQUIRE_PG = os.environ.get("FINESCHED_REQUIRE_PG") == "1"
FINESCHED = [sys.executable, "-m", "finesched.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fresh_database(backend: str, tmp: Path) -> Iterator[str]:
    """A new, empty database URL of `backend` (sqlite | postgres), dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / f'fs-{uuid.uuid4().hex[:8]}.db'}"
        return
    import psycopg

    name = f"fs_test_{uuid.uuid4().hex[:10]}"
    admin = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Api:
    """A running server: its base URL and an httpx client per role."""

    base: str
    db: str
    store: Store
    admin: httpx.Client
    app: Any = None  # the FastAPI app, for tests that look inside the server (e.g. its watch hub)

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=30)

    def token(self, role: str, **kwargs: Any) -> str:
        return create_token(self.store, role, **kwargs)

    def wait_phase(self, key: str, phases: tuple[str, ...], timeout: float = 15.0) -> dict[str, Any]:
        return wait_phase(self.admin, key, phases, timeout)


def wait_phase(client: httpx.Client, key: str, phases: tuple[str, ...], timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(f"/v1/workloads/{key}").json()
        phase = body.get("status", {}).get("phase")
        if phase in phases:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} is {phase}, not {phases}: {body}")
        time.sleep(0.05)


def wait_until(predicate: Any, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


#: The tenants (and so namespaces) a test server has from the start; every other one is created by its test.
TENANTS = ("team-a", "team-b")


def create_tenants(admin: httpx.Client, names: tuple[str, ...] = TENANTS) -> None:
    """Create (or keep) the tenants `names`: each owns the namespace of its name."""
    for name in names:
        doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": name}}
        answer = admin.put(f"/v1/tenants/{name}", json=doc)
        assert answer.status_code == 200, answer.text


def store_tenants(store: Store, names: tuple[str, ...] = TENANTS) -> None:
    """The tenants `names`, written straight into a store (for tests that drive stores and loops by hand)."""
    for name in names:
        doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": name}}
        store.put_tenant(name, 1.0, doc, create_only=False)


@contextmanager
def inprocess_server(
    db: str, config: LoopConfig | None = None, tenants: tuple[str, ...] = TENANTS, timeouts: Timeouts | None = None,
    **app_kwargs: Any,
) -> Iterator[Api]:  # fmt: skip
    """A real uvicorn server in a thread on 127.0.0.1 (configured as `finesched serve` configures it,
    with `timeouts`), with an admin client and `tenants` created."""
    store = Store.open(db)
    app = create_app(store, config or LoopConfig(idle_wait_s=0.05), **app_kwargs)
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, timeouts, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn start")
    base = f"http://127.0.0.1:{port}"
    admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {create_token(store, 'admin')}"}, timeout=30)
    wait_until(lambda: admin.get("/readyz").json().get("leader"), what="leadership")
    create_tenants(admin, tenants)
    try:
        yield Api(base, db, store, admin, app)
    finally:
        admin.close()
        server.should_exit = True
        thread.join(timeout=30)
        store.close()


class ServerProcess:
    """`finesched serve` as a child process (so it can be killed with SIGKILL)."""

    def __init__(self, db: str, port: int | None = None, *extra: str, log: Path | None = None):
        self.db = db
        self.port = port or free_port()
        self.extra = extra
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        cmd = [*FINESCHED, "serve", "--db", self.db, "--port", str(self.port), "--log-level", "warning", *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        wait_until(self._answers, timeout=30, what=f"server on {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}")
        try:
            return httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def is_leader(self) -> bool:
        try:
            return bool(httpx.get(f"{self.base}/readyz", timeout=2).json().get("leader"))
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def add_topology(api: Api, doc: dict[str, Any]) -> None:
    """Create the Topology `doc` through `POST /v1/topologies` (the admin's token)."""
    answer = api.admin.post("/v1/topologies", json=doc)
    assert answer.status_code == 201, answer.text
