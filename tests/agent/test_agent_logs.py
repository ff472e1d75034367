"""`finesched logs` from anywhere: the server fetches a workload's output from its node agent, with the
same rights as reading the workload; the agent's log port answers only grants the server made."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agent_cluster import NODE, Cluster, phase_is, wait
from typer.testing import CliRunner

from finesched.agent.logs import tail_offset
from finesched.cli import app
from finesched.server.api.auth import create_token
from reachable import SYSTEM_PYTHON

LINES = "import sys\nfor i in range(1, 6):\n    print(f'line {i}', flush=True)\n"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


@pytest.mark.parametrize(
    ("text", "lines", "want"),
    [
        pytest.param(b"a\nb\nc\n", 2, b"b\nc\n", id="two-of-three"),
        pytest.param(b"a\nb\nc", 2, b"b\nc", id="no-final-newline"),
        pytest.param(b"a\nb\n", 5, b"a\nb\n", id="more-than-there-are"),
        pytest.param(b"a\nb\n", 0, b"", id="none"),
        pytest.param(b"x" * 20000 + b"\nlast\n", 1, b"last\n", id="across-blocks"),
    ],
)
def test_tail_offset(text: bytes, lines: int, want: bytes) -> None:
    f = io.BytesIO(text)
    f.seek(tail_offset(f, lines))
    assert f.read() == want


def test_logs_through_the_server_with_tenant_rights(cluster: Cluster) -> None:
    agent = cluster.agent(logs=True)
    agent.tick_report()  # the report carries the agent's logs URL
    cluster.submit("printer", [SYSTEM_PYTHON, "-c", LINES], {"cpu": "100m"})
    cluster.until(agent, "printer", phase_is("Succeeded"), "to finish")
    assert cluster.admin.get("/v1/workloads/t/printer/logs").text == "".join(f"line {i}\n" for i in range(1, 6))
    assert cluster.admin.get("/v1/workloads/t/printer/logs", params={"tail": 2}).text == "line 4\nline 5\n"
    token = create_token(cluster.store, "tenant", tenant="t")
    own = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {token}"})
    tenant_u = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "u"}}
    assert cluster.admin.post("/v1/tenants", json=tenant_u).status_code == 201  # a token's tenant must exist
    other_token = create_token(cluster.store, "tenant", tenant="u")
    other = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {other_token}"})
    assert own.get("/v1/workloads/t/printer/logs", params={"tail": 1}).text == "line 5\n"
    assert other.get("/v1/workloads/t/printer/logs").status_code == 403
    shown = CliRunner().invoke(
        app, ["logs", "printer", "-n", "t", "--tail", "3", "--server", cluster.url, "--token", token]
    )
    assert shown.exit_code == 0 and shown.stdout == "line 3\nline 4\nline 5\n"
    missing = CliRunner().invoke(app, ["logs", "t/nope", "--server", cluster.url, "--token", token])
    assert missing.exit_code == 1 and "not found" in missing.output


def test_follow_streams_until_the_process_ends(cluster: Cluster) -> None:
    agent = cluster.agent(logs=True)
    agent.tick_report()
    go = cluster.exchange / "go"
    body = "\n".join(["import os, time", "print('before', flush=True)",
                      f"while not os.path.exists({str(go)!r}): time.sleep(0.05)", "print('after')"])  # fmt: skip
    cluster.submit("waiter", [SYSTEM_PYTHON, "-c", body], {"cpu": "100m"})
    cluster.until(agent, "waiter", phase_is("Running"), "to run")
    received: list[bytes] = []
    done = threading.Event()

    def follow() -> None:
        with cluster.admin.stream("GET", "/v1/workloads/t/waiter/logs", params={"follow": "true"}) as response:
            for chunk in response.iter_raw():
                received.append(chunk)
        done.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    wait(lambda: b"before" in b"".join(received), "the first line while it runs")
    assert not done.is_set()
    go.touch()
    wait(lambda: (agent.tick_bindings(), done.is_set())[1], "the stream to end with the process")
    assert b"".join(received) == b"before\nafter\n"


def test_the_agent_answers_only_grants_the_server_made(cluster: Cluster) -> None:
    agent = cluster.agent(logs=True)
    agent.tick_report()
    assert agent.logs is not None
    url = cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["report"]["discovery"]["logs"]["url"]
    assert url == agent.logs.url
    assert httpx.get(f"{url}/logs").status_code == 401
    forged = httpx.get(f"{url}/logs", headers={"Authorization": "Bearer " + "x" * 43})
    assert forged.status_code == 403
    agent_client = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.agent_token}"})
    assert agent_client.post("/v1/log-grants/verify", json={"grant": "y" * 43}).status_code == 403
    assert cluster.admin.post("/v1/log-grants/verify", json={"grant": "y" * 43}).status_code == 403  # agents only
    assert cluster.admin.get("/v1/workloads/t/never/logs").status_code == 404
    cluster.submit("pending", ["true"], {"cpu": "64"})  # fits nowhere: never placed, no output
    answer = cluster.admin.get("/v1/workloads/t/pending/logs")
    assert answer.status_code == 404 and "has not been placed" in answer.json()["detail"]
