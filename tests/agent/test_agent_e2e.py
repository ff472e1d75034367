"""End to end on 127.0.0.1: the control plane (uvicorn in a thread, SQLite) and a node agent.

The agent's discovery is injected: this machine's real CPUs plus a fake GPU inventory, so device
environment checks run on a machine without GPUs. Processes, affinity and the HTTP calls are real.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from finesched.agent.cgroup import CgroupSupport
from finesched.agent.client import AgentClient
from finesched.agent.discover import Discovery
from finesched.agent.executor import ServerError
from finesched.agent.loop import Agent, AgentConfig
from finesched.cpuset import CPUSet
from finesched.model.node import Node
from finesched.server.app import create_app
from finesched.server.auth import create_token
from finesched.server.loop import LoopConfig
from finesched.server.store import Store

CPUS = sorted(os.sched_getaffinity(0))
NODE = "e2e-node"
PROBE = (
    "import json, os, sys; "
    "json.dump({'affinity': sorted(os.sched_getaffinity(0)), 'env': dict(os.environ)}, open(sys.argv[1], 'w'))"
)


def inventory(unhealthy: tuple[int, ...] = ()) -> Discovery:
    cpus = [{"id": c, "core": c, "socket": 0, "numa": 0} for c in CPUS]
    devices = [
        {"type": "gpu", "minor": i, "uuid": f"GPU-e2e-{i}", "health": i not in unhealthy, "numa": 0,
         "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "16Gi"}}
        for i in range(2)
    ]  # fmt: skip
    node = Node.model_validate(
        {"name": NODE, "cpuTopology": {"cpus": cpus}, "numaZones": [{"id": 0, "memory": "4Gi"}], "devices": devices}
    )
    return Discovery(node=node, online=CPUSet(CPUS), sources={"gpu": "ok: injected"})


class Cluster:
    def __init__(self, tmp: Path):
        self.store = Store.open(f"sqlite:///{tmp / 'fs.db'}")
        app = create_app(self.store, LoopConfig(idle_wait_s=0.05, requeue_after_s=None))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.admin = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {create_token(self.store, 'admin')}"}
        )
        wait(lambda: self.server.started, "the server to start")
        self.agent_token = create_token(self.store, "agent", node=NODE)
        self.tmp = tmp

    def agent(self, data: str = "agent", discovery: Callable[[], Discovery] = inventory) -> Agent:
        config = AgentConfig(self.url, self.agent_token, self.tmp / data, NODE)
        agent = Agent(config, AgentClient(self.url, self.agent_token), discovery, CgroupSupport(None, reason="test"))
        agent.start()
        return agent

    def submit(self, name: str, command: list[str], requests: dict[str, Any], **spec: Any) -> None:
        doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
               "metadata": {"name": name, "namespace": "t"},
               "spec": {"requests": requests, "command": command, **spec}}  # fmt: skip
        response = self.admin.post("/v1/workloads", json=doc)
        assert response.status_code == 201, response.text

    def workload(self, name: str) -> dict[str, Any]:
        response = self.admin.get(f"/v1/workloads/t/{name}")
        response.raise_for_status()
        return response.json()

    def until(self, agent: Agent | None, name: str, check: Callable[[dict[str, Any]], bool], what: str) -> dict:
        """Tick the agent until the workload satisfies `check` (bounded)."""
        found: dict[str, Any] = {}

        def done() -> bool:
            if agent is not None:
                agent.tick_bindings()
            found.update(self.workload(name))
            return check(found)

        wait(done, f"{name}: {what}")
        return found

    def close(self) -> None:
        self.admin.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.store.close()


def wait(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda w: w["status"]["phase"] in phases


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_exclusive_cpu_and_shared_gpu_reach_the_child(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.agent()
    agent.tick_report()
    out = tmp_path / "probe.json"
    cluster.submit(
        "probe", [sys.executable, "-c", PROBE, str(out)],
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
    assert info["affinity"] == str(cpuset) and info["exitCode"] == 0 and info["cgroup"] == "unavailable: test"


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


def test_agent_restart_adopts_its_running_child(cluster: Cluster, tmp_path: Path) -> None:
    go = tmp_path / "go"
    wait_for_go = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nraise SystemExit(4)"
    first = cluster.agent()
    cluster.submit("long", [sys.executable, "-c", wait_for_go], {"cpu": "1"}, limits={"cpu": "1"})
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
