"""A node whose agent cannot keep tenants apart (not root): it says so, and the scheduler places one
tenant's workloads there at a time, unless the admin lets tenants share it. End to end: a real
control plane and agent on 127.0.0.1 (the agent told it is not root: the tests run as root)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_cluster import NODE, Cluster, phase_is, wait
from typer.testing import CliRunner

from finesched.agent.identity import TenantUids, Users
from finesched.cli import app
from finesched.plugins.tenant_isolation import ISOLATION_REASON, TENANT_ISOLATION_LABEL


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.tenant("team-a")
    c.tenant("team-b")
    yield c
    for agent in c.agents:
        agent.executor.stop_all()
    c.close()


def not_root(tmp_path: Path, allow_sharing: bool = False) -> Users:
    """What an agent run by an ordinary user decides (this test process is root: told otherwise)."""
    (tmp_path / "agent").mkdir(exist_ok=True)
    return Users(
        TenantUids(tmp_path / "agent", range(200000, 300000)), False, allow_sharing, (os.getuid(), os.getgid())
    )


def condition(cluster: Cluster) -> dict[str, str]:
    node = cluster.admin.get(f"/v1/nodes/{NODE}").json()
    (found,) = [c for c in node["status"]["conditions"] if c["type"] == "TenantIsolation"]
    return found


def test_a_non_root_node_runs_one_tenant_at_a_time(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.agent(users=not_root(tmp_path))
    node = cluster.admin.get(f"/v1/nodes/{NODE}").json()
    assert node["metadata"]["labels"][TENANT_ISOLATION_LABEL] == "false"  # from the registration on
    agent.tick_report()
    said = condition(cluster)
    assert said["status"] == "False" and said["reason"] == "AgentNotRoot"
    assert f"the agent runs as uid {os.getuid()}, not root" in said["message"]
    assert "one tenant's workloads at a time" in said["message"]
    token = cluster.admin.headers["Authorization"].split()[1]
    shown = CliRunner().invoke(app, ["describe", "node", NODE, "--server", cluster.url, "--token", token])
    assert shown.exit_code == 0 and "Isolation:   TenantIsolation=False: the agent runs as uid" in shown.output

    cluster.submit("first", ["sleep", "60"], {"cpu": "100m"}, namespace="team-a")
    cluster.until(agent, "first", phase_is("Running"), "team-a's workload to run", namespace="team-a")
    cluster.submit("other", ["sleep", "60"], {"cpu": "100m"}, namespace="team-b")
    waiting = cluster.until(agent, "other", lambda w: ISOLATION_REASON in (w["status"]["reason"] or ""),
                            "team-b's workload to wait", namespace="team-b")  # fmt: skip
    assert waiting["status"]["phase"] == "Pending" and waiting["status"]["binding"] is None
    cluster.submit("second", ["sleep", "60"], {"cpu": "100m"}, namespace="team-a")  # a's own work still goes there
    cluster.until(agent, "second", phase_is("Running"), "team-a's second workload to run", namespace="team-a")

    for name in ("first", "second"):
        assert cluster.admin.delete(f"/v1/workloads/team-a/{name}").status_code == 200
    cluster.until(agent, "other", phase_is("Running"), "team-b's workload to run once a left", namespace="team-b")
    agent.tick_bindings()
    assert set(agent.executor.state.records) == {"team-b/other"}


def test_the_admin_may_let_tenants_share_it(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.agent(users=not_root(tmp_path, allow_sharing=True))
    agent.tick_report()
    said = condition(cluster)
    assert said["status"] == "False" and "--allow-tenant-sharing" in said["message"]
    wait(lambda: cluster.admin.get(f"/v1/nodes/{NODE}").json()["metadata"]["labels"][TENANT_ISOLATION_LABEL]
         == "shared", "the shared label")  # fmt: skip
    for tenant in ("team-a", "team-b"):
        cluster.submit("w", ["sleep", "60"], {"cpu": "100m"}, namespace=tenant)
        cluster.until(agent, "w", phase_is("Running"), f"{tenant}'s workload to run", namespace=tenant)


def test_a_root_agent_says_its_node_keeps_tenants_apart(cluster: Cluster) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    agent = cluster.agent()
    agent.tick_report()
    said = condition(cluster)
    assert said["status"] == "True" and "workloads run as their tenants' users" in said["message"]
    assert "200000-299999" in said["message"] and "sandbox: none" in said["message"]
    labels = cluster.admin.get(f"/v1/nodes/{NODE}").json()["metadata"]["labels"]
    assert labels[TENANT_ISOLATION_LABEL] == "true"
    for tenant in ("team-a", "team-b"):
        cluster.submit("w", ["sleep", "60"], {"cpu": "100m"}, namespace=tenant)
        cluster.until(agent, "w", phase_is("Running"), f"{tenant}'s workload to run", namespace=tenant)
