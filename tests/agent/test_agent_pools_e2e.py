"""End to end on 127.0.0.1: pools kept by the agent for workloads bound through the API.

The control plane places an LSE workload next to running LS and BE ones; the agent starts it on
the first pass that sees the binding and moves every thread of the LS and BE processes out of its
CPU, then back when it is deleted; it reports its pools, and `finesched describe node` shows them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_cluster import NODE, Cluster, phase_is, wait
from pool_probe import CPUS, all_on, command, pids
from typer.testing import CliRunner

from finesched.cli import app
from finesched.cpuset import CPUSet

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
ALL = CPUSet(CPUS)
WHOLE = {"cpu": "1", "memory": "64Mi"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_lse_bound_next_to_ls_and_be_starts_at_once_and_they_move(cluster: Cluster) -> None:
    agent = cluster.agent()
    agent.tick_report()
    cluster.submit("web", command(cluster.exchange / "web"), {"cpu": "100m"})  # LS
    cluster.submit("batch", command(cluster.exchange / "batch"), {})  # BE: no request
    for name in ("web", "batch"):
        cluster.until(agent, name, phase_is("Running"), "to run")
    web, batch = pids(cluster.exchange / "web"), pids(cluster.exchange / "batch")
    assert all_on(web) == all_on(batch) == {ALL.format()}
    try:
        cluster.submit("db", ["sleep", "600"], WHOLE, limits=WHOLE, qos="LSE")
        wait(lambda: cluster.workload("db")["status"]["binding"] is not None, "the LSE to be bound")
        agent.tick_bindings()  # the first pass that sees it
        db = cluster.workload("db")
        held = CPUSet(db["status"]["binding"]["cpuset"])
        rest = (ALL - held).format()
        assert db["status"]["phase"] == "Running" and len(held) == 1
        assert all_on(web) == all_on(batch) == {rest}
        events = cluster.admin.get("/v1/events", params={"since": 0}).json()["items"]
        assert not [e for e in events if e["object"] == "t/db" and e["reason"] == "Rejected"]
        assert cluster.workload("web")["status"]["info"]["cpuset"] == rest  # the server heard of the move

        agent.tick_report()
        report = cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["report"]
        assert report["cpuSharedPools"] == [{"socket": 0, "node": 0, "cpuset": rest}]
        assert report["beCPUSharedPools"] == [{"socket": 0, "node": 0, "cpuset": rest}]
        assert [(a["name"], a["cpuset"]) for a in report["podCPUAllocs"]] == [("db", held.format())]
        token = cluster.admin.headers["Authorization"].split()[1]
        shown = CliRunner().invoke(app, ["describe", "node", NODE, "--server", cluster.url, "--token", token])
        assert shown.exit_code == 0, shown.output
        assert "CPU pools" in shown.output and "t/web" in shown.output and "shared pool" in shown.output
        assert "Enforcement: unavailable: test; CPU affinity only" in shown.output

        assert cluster.admin.delete("/v1/workloads/t/db").status_code == 200
        agent.tick_bindings()
        assert all_on(web) == all_on(batch) == {ALL.format()}  # LS and BE grow back

        cluster.submit("cache", ["sleep", "600"], WHOLE, limits=WHOLE, qos="LSR")
        held = CPUSet(cluster.until(agent, "cache", phase_is("Running"), "to run")["status"]["binding"]["cpuset"])
        assert all_on(web) == {(ALL - held).format()} and all_on(batch) == {ALL.format()}  # BE keeps LSR CPUs
    finally:
        agent.executor.stop_all()


def test_a_report_with_pools_off_the_node_is_refused(cluster: Cluster) -> None:
    cluster.agent()  # registers the node
    bad = {"cpuSharedPools": [{"socket": 0, "node": 0, "cpuset": "0-63"}], "podCPUAllocs": [
        {"namespace": "t", "name": "x", "cpuset": "99"}]}  # fmt: skip
    response = cluster.admin.post(f"/v1/nodes/{NODE}/report", json=bad)
    assert response.status_code == 422
    text = response.text
    assert "are not on NUMA node 0" in text and "cpuSharedPools" in text and "not CPUs of node" in text
    wrong_numa = {"beCPUSharedPools": [{"socket": 0, "node": 7, "cpuset": ""}]}
    assert "has NUMA nodes [0]" in cluster.admin.post(f"/v1/nodes/{NODE}/report", json=wrong_numa).text
