"""The rule for reading logs from agents' log ports, on its own (the refusal of plain HTTP to another
machine is decided from the URL, so no test has to reach one), and `finesched up --tls-cert`, whose
server reads its own agent's log port over HTTPS. End-to-end cases: tests/agent/test_agent_logs_tls.py."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from server_harness import FINESCHED, free_port, wait_until

from finesched.server.logs import AgentTrust
from finesched.tls import pinned_context
from tls_files import make_tls

TENANT = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t"}, "spec": {}}


@pytest.mark.parametrize(
    ("url", "insecure", "refused"),
    [
        pytest.param("http://127.0.0.1:10250", False, False, id="loopback"),
        pytest.param("http://127.3.4.5:10250", False, False, id="loopback-net"),
        pytest.param("http://[::1]:10250", False, False, id="loopback-v6"),
        pytest.param("http://localhost:10250", False, False, id="localhost"),
        pytest.param("https://10.0.0.5:10250", False, False, id="https-far"),
        pytest.param("https://gpu-2.example.org:10250", False, False, id="https-name"),
        pytest.param("http://10.0.0.5:10250", False, True, id="http-far"),
        pytest.param("http://[fd00::5]:10250", False, True, id="http-far-v6"),
        pytest.param("http://gpu-2.example.org:10250", False, True, id="http-name"),
        pytest.param("http://localhost.example.org:10250", False, True, id="http-lookalike"),
        pytest.param("http://10.0.0.5:10250", True, False, id="http-far-insecure"),
    ],
)
def test_a_grant_goes_in_clear_only_to_this_machine(url: str, insecure: bool, refused: bool) -> None:
    why = AgentTrust.load(insecure=insecure).refusal(url)
    assert (why is not None) == refused
    if why is not None:
        assert url in why and "--insecure-agent-logs" in why and "--tls-cert" in why


def test_the_local_certificate_is_trusted_on_loopback_only(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    trust = AgentTrust.load(ca=tls.ca, local_cert=tls.cert)
    assert trust.local is not None and not trust.local.check_hostname
    assert trust.context("https://127.0.0.1:1") is trust.local and trust.context("https://localhost:1") is trust.local
    assert trust.context("https://10.0.0.5:1") is trust.verify and trust.verify.check_hostname
    assert AgentTrust.load(ca=tls.ca).context("https://127.0.0.1:1").check_hostname  # no pin: names checked


def test_up_with_a_certificate_serves_logs_over_https(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls", "gpu-1.example.org")  # not 127.0.0.1: `up` pins its own certificate
    port, data = free_port(), tmp_path / "up"
    up = subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "0.5", "--quiet",
         "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        token_file = data / "admin.token"
        wait_until(lambda: token_file.is_file() and token_file.read_text().strip() != "", 60, "admin.token")
        url = f"https://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        with httpx.Client(base_url=url, headers=headers, verify=pinned_context(tls.cert)) as client:

            def reported_logs_url() -> str:
                nodes = client.get("/v1/nodes").json()["items"]
                report = (nodes[0]["status"].get("report") or {}) if nodes else {}
                return str(report.get("discovery", {}).get("logs", {}).get("url", ""))

            wait_until(reported_logs_url, 60, "this machine's report")
            assert reported_logs_url().startswith("https://127.0.0.1:")
            assert client.post("/v1/tenants", json=TENANT).status_code in (201, 409)
            doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
                   "metadata": {"name": "hello", "namespace": "t"},
                   "spec": {"requests": {"cpu": "100m"}, "command": ["echo", "hello over TLS"]}}  # fmt: skip
            assert client.post("/v1/workloads", json=doc).status_code == 201
            phase = lambda: client.get("/v1/workloads/t/hello").json()["status"]["phase"]  # noqa: E731
            wait_until(lambda: phase() == "Succeeded", 60, "the workload to end")
            answer = client.get("/v1/workloads/t/hello/logs")
            assert answer.status_code == 200 and answer.text == "hello over TLS\n", answer.text
    finally:
        up.send_signal(signal.SIGINT)
        output = up.communicate(timeout=60)[0]
    assert up.returncode == 0, output
    assert "--tls-cert NODE.pem" in output  # how another machine's log port joins
