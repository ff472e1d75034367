"""Read timeouts of the HTTP server, with real sockets: a connection that never finishes its request
headers, or stalls its body, is closed after its timeout, while normal clients are served meanwhile."""

from __future__ import annotations

import socket
import time

import pytest
from server_harness import Api, inprocess_server

from finesched.server.api.http_server import Timeouts
from finesched.server.loop.loop import LoopConfig

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

SHORT = Timeouts(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=1.0)


def connect(api: Api) -> socket.socket:
    host, port = api.base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=15)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a 15 s socket timeout fails the test)."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_slow_requests_are_closed_while_others_are_served(db_url: str) -> None:
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05), timeouts=SHORT) as api:
        silent = connect(api)  # sends nothing at all
        half_line = connect(api)
        half_line.sendall(b"GET /v1/nod")
        half_headers = connect(api)
        half_headers.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        stalled_body = connect(api)
        stalled_body.sendall(
            b"POST /v1/workloads HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"
        )
        for _ in range(5):  # served meanwhile, on other connections
            assert api.admin.get("/healthz").status_code == 200
            assert api.admin.get("/v1/nodes").status_code == 200
        for sock in (silent, half_line, half_headers):
            assert read_until_closed(sock).startswith(b"HTTP/1.1 408 Request Timeout")
        assert b" 201 " not in read_until_closed(stalled_body)  # closed, nothing stored
        assert api.admin.get("/v1/workloads").json()["items"] == []
        for sock in (silent, half_line, half_headers, stalled_body):
            sock.close()


def test_a_keep_alive_connection_serves_requests_then_closes_when_idle(db_url: str) -> None:
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05), timeouts=SHORT) as api:
        sock = connect(api)
        for _ in range(3):  # each request in time: the header timer starts again for each
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"status":"ok"}'):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            time.sleep(0.3)  # less than the keep-alive and header timeouts
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # then a request that never ends
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408")
        idle = connect(api)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_until_closed(idle).startswith(b"HTTP/1.1 200")  # answered, then closed when idle


def test_a_body_sent_in_time_is_served(db_url: str) -> None:
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05), timeouts=SHORT) as api:
        token = api.admin.headers["Authorization"]
        body = b'{"apiVersion": "finesched.io/v1alpha1", "kind": "Workload", "metadata": {"name": "w", "namespace": "team-a"}, "spec": {"requests": {"cpu": "1"}}}'  # noqa: E501
        sock = connect(api)
        head = (f"POST /v1/workloads HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\ncontent-type: application/json"
                f"\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
        sock.sendall(head.encode() + body[:10])
        time.sleep(0.2)  # within the body timeout
        sock.sendall(body[10:])
        assert b" 201 " in read_until_closed(sock).split(b"\r\n", 1)[0]
