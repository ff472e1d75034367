"""The agent's log port over TLS, as a kubelet's: the agent serves HTTPS with its certificate, the
server verifies it with --agent-ca (an agent on the server's own machine also by the certificate
`finesched up` pins) and sends no grant in clear to another machine. Throwaway certificates
(trustme); every connection goes to 127.0.0.1."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agent_cluster import NODE, Cluster, inventory, phase_is
from typer.testing import CliRunner

from finesched.agent.cgroup import CgroupSupport
from finesched.agent.client import AgentClient
from finesched.agent.loop import Agent, AgentConfig
from finesched.cli import app
from finesched.server.logs import AgentTrust, use_agent_trust
from finesched.server.store import schema as t
from finesched.tls import pinned_context
from reachable import SYSTEM_PYTHON
from tls_files import TlsFiles, make_tls

LINES = "for i in range(1, 4):\n    print(f'line {i}', flush=True)\n"
TENANT = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t"}, "spec": {}}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    assert c.admin.post("/v1/tenants", json=TENANT).status_code in (201, 409)
    yield c
    c.close()


def trust(cluster: Cluster, **files: object) -> None:
    """Make the cluster's server reach log ports as `finesched serve --agent-ca ...` would."""
    use_agent_trust(cluster.server.config.app, AgentTrust.load(**files))  # type: ignore[arg-type]


def agent(cluster: Cluster, tls: TlsFiles | None, host: str = "127.0.0.1") -> Agent:
    """A started agent whose log port listens on 127.0.0.1, with `tls` over HTTPS, advertised at `host`."""
    config = AgentConfig(cluster.url, cluster.agent_token, cluster.tmp / "agent", NODE, logs_port=0, logs_host=host,
                         logs_bind="127.0.0.1", tls_cert=tls and tls.cert, tls_key=tls and tls.key,
                         work_root=cluster.work_root)  # fmt: skip
    started = Agent(
        config, AgentClient(cluster.url, cluster.agent_token), inventory, CgroupSupport(None, reason="test")
    )
    started.start()
    cluster.agents.append(started)
    started.tick_report()  # the report carries the log port's URL
    return started


def ran(cluster: Cluster, started: Agent) -> None:
    cluster.submit("printer", [SYSTEM_PYTHON, "-c", LINES], {"cpu": "100m"})
    cluster.until(started, "printer", phase_is("Succeeded"), "to finish")


def grants(cluster: Cluster) -> int:
    with cluster.store.read() as conn:
        return len(conn.execute(t.log_grants.select()).all())


def test_logs_are_relayed_over_https_verified_with_the_agent_ca(cluster: Cluster, tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    trust(cluster, ca=tls.ca)
    started = agent(cluster, tls)
    assert started.logs is not None and started.logs.url.startswith("https://127.0.0.1:")
    reported = cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["report"]["discovery"]["logs"]["url"]
    assert reported == started.logs.url
    ran(cluster, started)
    assert cluster.admin.get("/v1/workloads/t/printer/logs").text == "line 1\nline 2\nline 3\n"
    assert cluster.admin.get("/v1/workloads/t/printer/logs", params={"tail": 1}).text == "line 3\n"
    with pytest.raises(httpx.HTTPError):  # the port speaks only TLS: no plain-HTTP request reaches it
        httpx.get(reported.replace("https://", "http://") + "/logs", timeout=5)
    answer = httpx.get(f"{reported}/logs", verify=pinned_context(tls.ca), timeout=5)
    assert answer.status_code == 401  # TLS alone reads nothing: a grant from the server is needed


@pytest.mark.parametrize(
    ("names", "agent_ca", "says"),
    [
        pytest.param((), "other_ca", "give this server the CA that issued it (--agent-ca)", id="another-CA"),
        pytest.param((), None, "give this server the CA that issued it (--agent-ca)", id="system-trust-store"),
        pytest.param(
            ("gpu-1.example.org",),
            "ca",
            "it must name the address the agent reports (finesched agent --logs-address)",
            id="name-not-in-the-certificate",
        ),
    ],
)
def test_an_untrusted_log_port_is_refused_with_the_reason(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture, names: tuple[str, ...], agent_ca: str | None,
    says: str,
) -> None:  # fmt: skip
    tls = make_tls(tmp_path / "tls", *names)
    trust(cluster, ca=getattr(tls, agent_ca) if agent_ca else None)
    started = agent(cluster, tls)
    ran(cluster, started)
    with caplog.at_level(logging.WARNING, logger="finesched.server"):
        answer = cluster.admin.get("/v1/workloads/t/printer/logs")
    assert answer.status_code == 502, answer.text
    detail = answer.json()["detail"]
    assert f"the agent of node {NODE}: the certificate of its log port https://127.0.0.1:" in detail
    assert "is not trusted" in detail and detail.endswith(says), detail
    assert any(
        "logs of t/printer not read" in r.getMessage() and "not trusted" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize(
    ("agent_cert", "trusted"),
    [
        pytest.param("pinned", True, id="the-pinned-certificate"),
        pytest.param("from-agent-ca", True, id="another-agent-with-a-certificate-from-agent-ca"),
        pytest.param("unrelated", False, id="a-certificate-of-another-CA"),
    ],
)
def test_an_agent_on_this_machine_is_trusted_by_the_pinned_certificate_or_the_agent_ca(
    cluster: Cluster, tmp_path: Path, agent_cert: str, trusted: bool
) -> None:
    pinned = make_tls(tmp_path / "pinned", "first-machine.example.org")  # names the machine, not 127.0.0.1
    other = make_tls(tmp_path / "other", "gpu-2.example.org")
    # what `finesched up --tls-cert ... --agent-ca` gives its server
    trust(cluster, ca=other.ca if agent_cert == "from-agent-ca" else None, local_cert=pinned.cert)
    started = agent(cluster, pinned if agent_cert == "pinned" else other)
    ran(cluster, started)
    answer = cluster.admin.get("/v1/workloads/t/printer/logs")
    if trusted:
        assert answer.status_code == 200 and answer.text == "line 1\nline 2\nline 3\n", answer.text
    else:
        assert answer.status_code == 502 and "is not trusted" in answer.json()["detail"]


def test_no_grant_goes_in_clear_to_another_machine(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        started = agent(cluster, None, host="192.0.2.10")  # TEST-NET-1: advertised, never contacted
    assert started.logs is not None and started.logs.url.startswith("http://192.0.2.10:")
    assert any("plain HTTP to another machine" in r.getMessage() for r in caplog.records)
    ran(cluster, started)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finesched.server"):
        answer = cluster.admin.get("/v1/workloads/t/printer/logs")
    assert answer.status_code == 502
    detail = answer.json()["detail"]
    assert "speaks plain HTTP and is not on this machine" in detail and "--insecure-agent-logs" in detail
    assert grants(cluster) == 0  # refused before a grant was made
    assert any("logs of t/printer not read from node" in r.getMessage() for r in caplog.records)


def test_the_grant_check_uses_the_agent_s_own_transport(tmp_path: Path, work_root: Path) -> None:
    """An agent told --insecure for a server on another machine checks grants over that same client
    (it used to build a second one that refused the URL, and the agent stopped at start)."""
    far = "http://192.0.2.10:8080"  # TEST-NET-1: never contacted here
    config = AgentConfig(
        far, "token", tmp_path / "agent", NODE, logs_port=0, logs_host="127.0.0.1", work_root=work_root
    )
    started = Agent(config, AgentClient(far, "token", insecure=True), inventory, CgroupSupport(None, reason="test"))
    started._serve_logs()
    try:
        assert started.logs is not None and started.logs.url.startswith("http://127.0.0.1:")
        assert started.logs.verify == started.client.verify_log_grant
    finally:
        started.close()
        started.client.close()


def test_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    missing = tmp_path / "nope.pem"

    def refused(*args: str) -> str:
        done = CliRunner().invoke(app, list(args))
        assert done.exit_code == 2, done.output
        return " ".join(done.output.replace("│", " ").split())  # rich's error box, unwrapped

    said = refused("serve", "--db", f"sqlite:///{tmp_path}/x.db", "--agent-ca", str(missing))
    assert "--agent-ca" in said and "not a readable PEM certificate file" in said
    said = refused("serve", "--db", f"sqlite:///{tmp_path}/x.db", "--local-agent-cert", str(tls.key))
    assert "--local-agent-cert" in said and "not a readable PEM certificate file" in said
    assert not (tmp_path / "x.db").exists()
    said = refused("agent", "--server", "http://127.0.0.1:9", "--token", "t", "--tls-cert", str(tls.cert))
    assert "both --tls-cert and --tls-key" in said
    said = refused("up", "--data", str(tmp_path / "up"), "--agent-ca", str(missing))
    assert "--agent-ca" in said and not (tmp_path / "up").exists()
