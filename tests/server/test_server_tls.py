"""Tokens never cross a network in clear: `serve` and `up` speak HTTPS with a certificate and key,
the agent and the CLI verify it against a CA file, and refuse plain HTTP to another host unless
--insecure. Certificates are throwaway ones from a test CA (trustme)."""

from __future__ import annotations

import shlex
import signal
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import typer
from manifests import node
from server_harness import FINESCHED, free_port, wait_until
from typer.testing import CliRunner

from docs_pages import page_text
from finesched.agent.client import AgentClient
from finesched.agent.executor import ServerError
from finesched.cli import app
from finesched.model.manifest import parse_manifest
from finesched.server.api.auth import create_token
from finesched.server.store.store import Store
from finesched.tls import TransportError, check_url, is_loopback, pinned_context, server_tls
from reachable import work_root
from tls_files import TlsFiles, make_tls

__all__ = ["work_root"]  # the fixture: where the agent's workloads' working directories go (--work-root)

runner = CliRunner()


@pytest.mark.parametrize(
    ("url", "insecure", "allowed"),
    [
        ("http://127.0.0.1:8080", False, True),
        ("http://127.1.2.3:8080", False, True),
        ("http://[::1]:8080", False, True),
        ("http://localhost:8080", False, True),
        ("https://10.0.0.5:8443", False, True),
        ("https://gpu-1.example.org", False, True),
        ("http://10.0.0.5:8080", False, False),
        ("http://gpu-1.example.org:8080", False, False),
        ("http://localhost.example.org:8080", False, False),
        ("http://10.0.0.5:8080", True, True),
        ("ftp://127.0.0.1/", True, False),
        ("127.0.0.1:8080", False, False),
    ],
)
def test_a_token_goes_in_clear_only_to_this_machine(url: str, insecure: bool, allowed: bool) -> None:
    if allowed:
        check_url(url, insecure=insecure)
    else:
        with pytest.raises(TransportError):
            check_url(url, insecure=insecure)


def test_loopback_is_decided_without_resolving_names() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("myhost") and not is_loopback("192.168.1.10")


def test_server_certificate_files_are_checked_before_listening(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    assert server_tls(None, None) == {}
    assert server_tls(tls.cert, tls.key)["ssl_certfile"] == str(tls.cert)
    required = server_tls(tls.cert, tls.key, tls.ca)
    assert required["ssl_cert_reqs"] == ssl.CERT_REQUIRED and required["ssl_ca_certs"] == str(tls.ca)
    for cert, key, client_ca, says in [
        (tls.cert, None, None, "both --tls-cert and --tls-key"),
        (tls.cert, tls.client_key, None, "cannot be used together"),  # a key of another certificate
        (tmp_path / "nope.pem", tls.key, None, "no such file"),
        (None, None, tls.ca, "needs --tls-cert"),
    ]:
        with pytest.raises(TransportError, match=says):
            server_tls(cert, key, client_ca)
    refused = runner.invoke(app, ["serve", "--db", f"sqlite:///{tmp_path}/x.db", "--tls-cert", str(tls.cert)])
    assert refused.exit_code == 2 and "both --tls-cert and --tls-key" in refused.output


def test_clients_refuse_plain_http_to_another_host(tmp_path: Path) -> None:
    far = "http://192.0.2.10:8080"  # TEST-NET-1: never contacted, the refusal comes first
    for args in (["get", "nodes"], ["cordon", "n1"], ["watch"]):
        done = runner.invoke(app, [*args, "--server", far, "--token", "t"])
        assert done.exit_code == 2 and "refusing to send a token over plain HTTP" in done.output, done.output
    job = Path(__file__).parents[2] / "examples" / "jobs" / "streaming-etl.yaml"
    done = runner.invoke(app, ["job", "submit", str(job), "--server", far, "--token", "t"])
    assert done.exit_code == 2 and "refusing to send a token over plain HTTP" in done.output, done.output
    done = runner.invoke(app, ["agent", "--server", far, "--token", "t", "--data", str(tmp_path)])
    assert done.exit_code == 2 and "--insecure" in done.output
    with pytest.raises(TransportError):
        AgentClient(far, "t")
    AgentClient(far, "t", insecure=True).close()  # told so: allowed (nothing is sent here)


class TlsServer:
    """`finesched serve --tls-cert --tls-key` as a child process on 127.0.0.1."""

    def __init__(self, tmp: Path, tls: TlsFiles):
        self.db = f"sqlite:///{tmp / 'fs.db'}"
        self.store = Store.open(self.db)
        self.admin = create_token(self.store, "admin")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        cmd = [*FINESCHED, "serve", "--db", self.db, "--port", str(self.port), "--log-level", "warning",
               "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        verify = ssl.create_default_context(cafile=str(tls.ca))
        wait_until(lambda: self._answers(verify), timeout=30, what="the HTTPS server")

    def _answers(self, verify: ssl.SSLContext) -> bool:
        assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
        try:
            return httpx.get(f"{self.url}/healthz", verify=verify, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.store.close()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[TlsServer, TlsFiles]]:
    tls = make_tls(tmp_path / "tls")
    server = TlsServer(tmp_path, tls)
    yield server, tls
    server.stop()


def test_serve_speaks_https_to_the_cli_and_the_agent(tls_server: tuple[TlsServer, TlsFiles], tmp_path: Path) -> None:
    server, tls = tls_server
    base = ["--server", server.url, "--token", server.admin]
    manifest = tmp_path / "n1.yaml"
    manifest.write_text(f"{node('n1')}".replace("'", '"'))
    assert runner.invoke(app, ["submit", "-f", str(manifest), *base, "--ca", str(tls.ca)]).exit_code == 0
    listed = runner.invoke(app, ["get", "nodes", *base, "--ca", str(tls.ca), "-o", "json"])
    assert listed.exit_code == 0 and '"n1"' in listed.output
    unverified = runner.invoke(app, ["get", "nodes", *base])  # the system's trust store does not know the test CA
    assert unverified.exit_code == 1 and "CERTIFICATE_VERIFY_FAILED" in unverified.output
    wrong_ca = runner.invoke(app, ["get", "nodes", *base, "--ca", str(tls.other_ca)])
    assert wrong_ca.exit_code == 1 and "CERTIFICATE_VERIFY_FAILED" in wrong_ca.output
    plain = runner.invoke(app, ["get", "nodes", "--server", server.url.replace("https", "http"), "--token", "t"])
    assert plain.exit_code == 1  # an HTTPS port does not answer plain HTTP
    # The agent's client: verified against the CA, refused with another one.
    agent_token = create_token(server.store, "agent", node="n2")
    doc = node("n2")
    doc["spec"]["allocatable"]["cpu"] = "4"
    agent = AgentClient(server.url, agent_token, ca=tls.ca)
    assert agent.register(parse_manifest(doc))["metadata"]["name"] == "n2"  # type: ignore[arg-type]
    agent.close()
    with pytest.raises(ServerError, match="CERTIFICATE_VERIFY_FAILED"):
        AgentClient(server.url, agent_token, ca=tls.other_ca).bindings("n2")


def test_the_agent_command_joins_over_https(
    tls_server: tuple[TlsServer, TlsFiles], tmp_path: Path, work_root: Path
) -> None:
    server, tls = tls_server
    token = create_token(server.store, "agent", node="joiner")
    args = ["agent", "--server", server.url, "--token", token, "--node-name", "joiner", "--ca", str(tls.ca),
            "--data", str(tmp_path / "agent"), "--interval", "0.5", "--quiet",
            "--work-root", str(work_root)]  # fmt: skip
    agent = subprocess.Popen([*FINESCHED, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: server.store.find_node("joiner") is not None, timeout=60, what="the agent to register")
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, agent.stderr.read() if agent.stderr else ""


def test_up_with_a_certificate_serves_https_and_its_agent_trusts_exactly_it(tmp_path: Path, work_root: Path) -> None:
    """... and its agent's log port serves HTTPS with the same pair, which the server trusts there."""
    tls = make_tls(tmp_path / "tls", "gpu-1.example.org")  # not 127.0.0.1: the local agent pins the certificate
    port = free_port()
    data = tmp_path / "up"
    up = subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "0.5", "--quiet",
         "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--work-root", str(work_root)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        token_file = data / "admin.token"
        wait_until(lambda: token_file.is_file() and token_file.read_text().strip() != "", timeout=60, what="token")
        token = token_file.read_text().strip()
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                          verify=pinned_context(tls.cert)) as client:  # fmt: skip
            wait_until(lambda: len(client.get("/v1/nodes").json()["items"]) == 1, timeout=60, what="the node")

            def logs_url() -> str:
                report = client.get("/v1/nodes").json()["items"][0]["status"].get("report") or {}
                return str(report.get("discovery", {}).get("logs", {}).get("url", ""))

            wait_until(logs_url, timeout=60, what="the node's report")
            assert logs_url().startswith("https://127.0.0.1:")
            tenant = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t"}, "spec": {}}
            assert client.post("/v1/tenants", json=tenant).status_code == 201
            doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
                   "metadata": {"name": "hello", "namespace": "t"},
                   "spec": {"requests": {"cpu": "100m"}, "command": ["echo", "hello over TLS"]}}  # fmt: skip
            assert client.post("/v1/workloads", json=doc).status_code == 201
            phase = lambda: client.get("/v1/workloads/t/hello").json()["status"]["phase"]  # noqa: E731
            wait_until(lambda: phase() == "Succeeded", timeout=60, what="the workload to end")
            answer = client.get("/v1/workloads/t/hello/logs")
            assert answer.status_code == 200 and answer.text == "hello over TLS\n", answer.text
    finally:
        up.send_signal(signal.SIGINT)
        output = up.communicate(timeout=60)[0]
    assert up.returncode == 0, output
    assert f"finesched is up: https://127.0.0.1:{port}" in output and "--ca CA.pem" in output
    assert "--tls-cert NODE.pem" in output  # how another machine's log port joins


def test_the_docs_add_a_machine_over_tls_with_options_that_exist() -> None:
    readme = page_text("operations/many-machines.md")
    section = readme[readme.index("**Adding a second machine.**") : readme.index("`finesched agent` options:")]
    lines = [line.split(" #")[0] for line in section.splitlines() if line.startswith("finesched ")]
    group = typer.main.get_command(app)
    for line in lines:
        words = shlex.split(line)
        command = group.commands[words[1]]  # type: ignore[attr-defined]
        if words[1] == "token":
            command = command.commands[words[2]]
        known = {opt for param in command.params for opt in param.opts}
        assert {w for w in words if w.startswith("--")} <= known, line
    assert any(w.startswith("finesched up") and "--tls-cert" in w for w in lines)
    assert any(w.startswith("finesched agent") and "https://" in w and "--ca" in w for w in lines)
    assert any(w.startswith("finesched up") and "--agent-ca" in w for w in lines)  # log ports verified, ...
    assert any(w.startswith("finesched agent") and "--tls-cert" in w for w in lines)  # ... and served over TLS
