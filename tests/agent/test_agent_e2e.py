"""End to end on 127.0.0.1: the control plane (uvicorn in a thread, SQLite) and a node agent.

The agent's discovery is injected: this machine's real CPUs plus a fake GPU inventory, so device
environment checks run on a machine without GPUs. Processes, affinity and the HTTP calls are real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import NODE, Cluster, inventory, phase_is, wait

from finesched.agent.executor import ServerError
from finesched.agent.launch import is_running, start_time
from finesched.codec import decode
from finesched.cpuset import CPUSet
from finesched.server.loop.loop import LoopConfig
from reachable import SYSTEM_PYTHON


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_exclusive_cpu_and_shared_gpu_reach_the_child(cluster: Cluster) -> None:
    agent = cluster.agent()
    agent.tick_report()
    command, out = cluster.probe("probe")
    cluster.submit(
        "probe", command,
        {"cpu": "1", "memory": "64Mi", "gpu-core": 50, "gpu-memory-ratio": 50}, limits={"cpu": "1", "memory": "64Mi"},
        qos="LSR",
    )  # fmt: skip
    w = cluster.until(agent, "probe", phase_is("Succeeded", "Failed"), "to finish")
    assert w["status"]["phase"] == "Succeeded", w["status"]
    seen = json.loads(out.read_text())
    env = seen["env"]
    binding = json.loads(env["FINESCHED_BINDING"])
    assert binding["workload"] == "t/probe" and binding["node"] == NODE
    cpuset = CPUSet(binding["cpuset"])
    assert len(cpuset) == 1 and seen["affinity"] == cpuset.sorted()  # pinned to exactly the binding's CPUs
    (gpu,) = binding["devices"]["gpu"]
    uuid = f"GPU-e2e-{gpu['minor']}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == uuid
    assert env["CUDA_DEVICE_SM_LIMIT"] == "50"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == str(8 * 2**30)  # half of 16Gi
    info = w["status"]["info"]
    assert info["affinity"] == str(cpuset) and info["exitCode"] == 0 and info["cgroup"].startswith("unavailable: test")


def test_agent_rejects_a_binding_on_an_unhealthy_gpu(cluster: Cluster) -> None:
    agent = cluster.agent()  # registered with both GPUs healthy
    agent.discovery = inventory(unhealthy=(1,))  # GPU 1 fails before the next report
    cluster.submit("both", ["true"], {"gpu-core": 200, "gpu-memory-ratio": 200})
    w = cluster.until(agent, "both", lambda w: "gpu 1 is unhealthy" in (w["status"]["reason"] or ""), "the reject")
    assert w["status"]["phase"] == "Pending" and w["status"]["binding"] is None
    agent.discover = lambda: inventory(unhealthy=(1,))
    agent.tick_report()
    node = cluster.admin.get(f"/v1/nodes/{NODE}").json()
    assert node["status"]["report"]["health"]["gpu"] == {"0": True, "1": False}


def test_agent_restart_adopts_its_running_child(cluster: Cluster) -> None:
    go = cluster.exchange / "go"
    wait_for_go = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nraise SystemExit(4)"
    first = cluster.agent()
    cluster.submit("long", [SYSTEM_PYTHON, "-c", wait_for_go], {"cpu": "1"}, limits={"cpu": "1"})
    running = cluster.until(first, "long", phase_is("Running"), "to run")
    pid = running["status"]["info"]["pid"]
    del first  # the agent dies; its child keeps running

    second = cluster.agent()  # same data directory: the state file names the child
    second.tick_bindings()
    assert second.executor.state.records["t/long"].pid == pid
    assert cluster.workload("long")["status"]["phase"] == "Running"
    go.touch()
    w = cluster.until(second, "long", phase_is("Succeeded", "Failed"), "to end")
    assert (w["status"]["phase"], w["status"]["info"]["exitCode"]) == ("Failed", 4)


def test_binding_unknown_after_restart_is_reported(cluster: Cluster) -> None:
    first = cluster.agent("first")
    cluster.submit("lost", ["sleep", "30"], {"cpu": "100m"})
    cluster.until(first, "lost", phase_is("Running"), "to run")
    first.executor.stop_all()
    stranger = cluster.agent("other-data")  # a replacement agent without the state file
    stranger.tick_bindings()
    events = cluster.admin.get("/v1/events", params={"since": 0}).json()["items"]
    said = [e["message"] for e in events if e["object"] == "t/lost"]
    assert any("no process for this acked binding" in m for m in said), said
    # requeued, and (the node has room) placed again: this time the new agent runs it
    w = cluster.until(stranger, "lost", phase_is("Running"), "to run again")
    assert w["status"]["info"]["pid"] == stranger.executor.state.records["t/lost"].pid
    stranger.executor.stop_all()


def test_report_with_a_running_gpu_share_is_accepted(cluster: Cluster) -> None:
    agent = cluster.agent()
    agent.tick_report()
    cluster.submit("share", ["sleep", "30"], {"gpu-core": 30, "gpu-memory-ratio": 25})
    w = cluster.until(agent, "share", phase_is("Running"), "to run")
    (grant,) = w["status"]["binding"]["devices"]["gpu"]
    agent.tick_report()
    report = cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["report"]
    free = decode(**report["devices"]["gpu"]["gpu-core"])
    assert free[grant["minor"]] == 70 and free[1 - grant["minor"]] == 100
    events = cluster.admin.get("/v1/events", params={"since": 0}).json()["items"]
    assert not [e for e in events if e["reason"] in ("ReportRefused", "UpdateRefused")]
    agent.executor.stop_all()


def test_workload_deleted_on_the_server_stops_its_process(cluster: Cluster) -> None:
    agent = cluster.agent()
    cluster.submit("gone", ["sleep", "30"], {"cpu": "100m"})
    pid = cluster.until(agent, "gone", phase_is("Running"), "to run")["status"]["info"]["pid"]
    assert cluster.admin.delete("/v1/workloads/t/gone").status_code == 200
    agent.tick_bindings()
    assert not is_running(pid, start_time(pid) or -1) and "t/gone" not in agent.executor.state.records


def test_silent_agent_goes_not_ready_and_on_return_stops_the_requeued_workload(tmp_path: Path) -> None:
    config = LoopConfig(idle_wait_s=0.05, heartbeat_s=0.2, missed_heartbeats=2, requeue_after_s=0.5)
    cluster = Cluster(tmp_path, config)
    try:
        agent = cluster.agent()
        cluster.submit("held", ["sleep", "30"], {"cpu": "100m"})

        def running(pid_not: int = -1) -> bool:  # with heartbeats: 0.4 s of silence is NotReady here
            agent.tick_report()
            agent.tick_bindings()
            w = cluster.workload("held")
            return w["status"]["phase"] == "Running" and w["status"]["info"].get("pid") != pid_not

        wait(running, "the workload to run")
        first = cluster.workload("held")["status"]["info"]["pid"]
        ready = lambda: cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["ready"]  # noqa: E731
        wait(lambda: not ready(), "NotReady after missed heartbeats")  # the agent is silent now
        wait(lambda: cluster.workload("held")["status"]["phase"] == "Pending", "the requeue after the grace")
        agent.tick_report()  # the agent is back
        wait(ready, "Ready again")
        agent.tick_bindings()  # the binding it ran is gone: its process is stopped
        assert not is_running(first, start_time(first) or -1)
        wait(lambda: running(pid_not=first), "the workload to run again on the returned node")
        agent.executor.stop_all()
    finally:
        cluster.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param({"devices": {"gpu": {"gpu-core": {"k": 100 | (100 << 7), "count": 2, "bits": 6}}}},
                     "does not decode", id="wrong-bit-width"),
        pytest.param({"devices": {"gpu": {"gpu-core": {"k": 0, "count": 3, "bits": 7}}}},
                     "has 2 gpu device(s)", id="more-devices-than-inventory"),
        pytest.param({"devices": {"gpu": {"gpu-core": {"k": -1, "count": 2, "bits": 7}}}},
                     "greater than or equal to 0", id="negative-value"),
        pytest.param({"devices": {"gpu": {"gpu-core": {"k": 101 | (100 << 7), "count": 2, "bits": 7}}}},
                     "above its total 100", id="above-total"),
    ],
)  # fmt: skip
def test_malformed_reports_are_rejected_with_reasons(cluster: Cluster, body: dict[str, Any], message: str) -> None:
    agent = cluster.agent()
    agent.tick_report()
    good = cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["report"]
    with pytest.raises(ServerError) as caught:
        agent.client.report(NODE, body)
    assert caught.value.status == 422 and message in str(caught.value)
    assert cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["report"] == good  # last good state kept
