"""A control plane on 127.0.0.1 for agent tests: uvicorn in a thread over SQLite, with admin and agent tokens.

Its tenant ``t`` (namespace t) runs as a uid of the agent's range when the tests run as root, so
its workloads run system programs and write what they saw to `Cluster.exchange` (reachable.py);
`run_as` gives the tenant a runAs instead (ROOT_RUN_AS for a test about something else that must
run the tests' own interpreter).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from finesched.agent.cgroup import CgroupSupport
from finesched.agent.client import AgentClient
from finesched.agent.discover import Discovery
from finesched.agent.identity import Users
from finesched.agent.loop import Agent, AgentConfig
from finesched.cpuset import CPUSet
from finesched.model.node import Node
from finesched.server.api.auth import create_token
from finesched.server.app import create_app
from finesched.server.loop.loop import LoopConfig
from finesched.server.store.store import Store
from reachable import SYSTEM_PYTHON, reachable_dir, remove

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
    def __init__(self, tmp: Path, config: LoopConfig | None = None, run_as: dict[str, Any] | None = None):
        self.store = Store.open(f"sqlite:///{tmp / 'fs.db'}")
        app = create_app(self.store, config or LoopConfig(idle_wait_s=0.05, requeue_after_s=None))
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
        self.tenant("t", run_as)  # owns namespace t
        self.agent_token = create_token(self.store, "agent", node=NODE)
        self.tmp = tmp
        self.agents: list[Agent] = []
        #: Where workloads' working directories go, and where they leave what the test reads.
        self.work_root = reachable_dir(0o711, "finesched-work-")
        self.exchange = reachable_dir(0o1777, "finesched-exchange-")

    def tenant(self, name: str, run_as: dict[str, Any] | None = None) -> None:
        spec = {"runAs": run_as} if run_as else {}
        doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec}
        response = self.admin.post("/v1/tenants", json=doc)
        assert response.status_code == 201, response.text

    def agent(
        self,
        data: str = "agent",
        discovery: Callable[[], Discovery] = inventory,
        logs: bool = False,
        cgroups: CgroupSupport | None = None,
        users: Users | None = None,
        **options: Any,
    ) -> Agent:
        """A started agent; with `logs`, serving workload logs on a free port of 127.0.0.1; `options`
        are more AgentConfig fields (sandbox, tenant_uids, ...)."""
        config = AgentConfig(self.url, self.agent_token, self.tmp / data, NODE, work_root=self.work_root, **options)
        if logs:
            config.logs_port, config.logs_host = 0, "127.0.0.1"
        cgroups = cgroups or CgroupSupport(None, reason="test")
        agent = Agent(config, AgentClient(self.url, self.agent_token), discovery, cgroups, users)
        agent.start()
        self.agents.append(agent)
        return agent

    def probe(self, name: str) -> tuple[list[str], Path]:
        """A command that writes its CPU affinity and environment to a file of `exchange`, and that file."""
        out = self.exchange / f"{name}.json"
        return [SYSTEM_PYTHON, "-c", PROBE, str(out)], out

    def submit(
        self, name: str, command: list[str], requests: dict[str, Any], namespace: str = "t", **spec: Any
    ) -> None:
        doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"requests": requests, "command": command, **spec}}  # fmt: skip
        response = self.admin.post("/v1/workloads", json=doc)
        assert response.status_code == 201, response.text

    def workload(self, name: str, namespace: str = "t") -> dict[str, Any]:
        response = self.admin.get(f"/v1/workloads/{namespace}/{name}")
        response.raise_for_status()
        return response.json()

    def until(
        self, agent: Agent | None, name: str, check: Callable[[dict[str, Any]], bool], what: str, namespace: str = "t"
    ) -> dict:
        """Tick the agent until the workload satisfies `check` (bounded)."""
        found: dict[str, Any] = {}

        def done() -> bool:
            if agent is not None:
                agent.tick_bindings()
            found.update(self.workload(name, namespace))
            return check(found)

        wait(done, f"{name}: {what}")
        return found

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
        self.admin.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.store.close()
        remove(self.work_root)
        remove(self.exchange)


def wait(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda w: w["status"]["phase"] in phases
