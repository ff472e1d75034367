"""The Resource Manager's report and the agent loop against an in-memory stand-in for the server."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from finesched.agent.binding import parse_binding
from finesched.agent.cgroup import CgroupSupport
from finesched.agent.discover import Discovery
from finesched.agent.executor import ServerError
from finesched.agent.loop import Agent, AgentConfig
from finesched.agent.report import build_report, device_free
from finesched.codec import decode
from finesched.cpuset import CPUSet
from finesched.model.node import Node
from finesched.state.device_wire import encode_node_devices

NO_CGROUP = CgroupSupport(None, reason="test")

CPUS = sorted(os.sched_getaffinity(0))


def gpu_node(count: int = 4, unhealthy: tuple[int, ...] = (), missing: tuple[int, ...] = ()) -> Discovery:
    devices = [
        {"type": "gpu", "minor": i, "uuid": f"GPU-{i}", "health": i not in unhealthy,
         "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "16Gi"}}
        for i in range(count) if i not in missing
    ] + [{"type": "rdma", "minor": 0}]  # fmt: skip
    cpus = [{"id": c, "core": c, "socket": 0, "numa": 0} for c in CPUS]
    node = Node.model_validate({"name": "n1", "cpuTopology": {"cpus": cpus}, "devices": devices})
    return Discovery(node=node, online=CPUSet(CPUS), sources={"gpu": "ok: fake"})


def held(name: str, grants: dict[str, list[dict[str, Any]]], requests: dict[str, Any] | None = None):
    item = {"workload": f"t/{name}", "node": "n1", "devices": grants, "requests": requests or {}, "version": 1}
    return parse_binding(item)


def test_free_vectors_subtract_grants_and_match_the_scheduler_encoding() -> None:
    d = gpu_node()
    node = d.node
    bindings = [
        held("a", {"gpu": [{"minor": 1, "resources": {"gpu-core": 30, "gpu-memory-ratio": 25, "gpu-memory": "4Gi"}}]}),
        held("b", {"gpu": [{"minor": 1, "resources": {"gpu-core": 20}}, {"minor": 3, "resources": {"gpu-core": 100}}]}),
    ]
    free = device_free(node, bindings)
    assert free["gpu"]["gpu-core"] == [100, 50, 100, 0]
    assert free["gpu"]["gpu-memory"] == [16 * 2**30, 12 * 2**30, 16 * 2**30, 16 * 2**30]
    body = build_report(node, bindings, d)
    core = body["devices"]["gpu"]["gpu-core"]
    assert (core["count"], core["bits"]) == (4, 7)  # 100 needs 7 bits
    assert decode(core["k"], core["count"], core["bits"]) == [100, 50, 100, 0]
    # with nothing bound, exactly what the scheduler side exports for this node
    empty = build_report(node, [], d)["devices"]
    want = encode_node_devices(node)
    for kind, dims in want.items():
        for dim, ev in dims.items():
            assert empty[kind][dim] == {"k": ev.k, "count": ev.count, "bits": ev.bits}, (kind, dim)


def test_health_follows_the_latest_discovery() -> None:
    registered = gpu_node().node
    now = gpu_node(unhealthy=(2,), missing=(3,))
    body = build_report(registered, [], now)
    assert body["health"]["gpu"] == {"0": True, "1": True, "2": False, "3": False}
    assert body["health"]["rdma"] == {"0": True}


def test_totals_and_available() -> None:
    d = gpu_node()
    b = held("a", {}, {"cpu": "1", "memory": "1Gi"})
    totals = build_report(d.node, [b], d)["totals"]
    assert totals["available"]["cpu"] == totals["allocatable"]["cpu"] - 1000


class FakeServer:
    """Bindings handed out by the test; every call recorded."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ServerError(0, "connection refused")

    def register(self, node: Node) -> dict[str, Any]:
        self._check()
        self.calls.append(("register", node.name, len(node.devices)))
        return {}

    def report(self, name: str, body: dict[str, Any]) -> None:
        self._check()
        self.calls.append(("report", name, body))

    def bindings(self, node: str) -> list[dict[str, Any]]:
        self._check()
        return list(self.items)

    def ack(self, workload: str, object_uid: str = "") -> None:
        self.calls.append(("ack", workload))
        for item in self.items:
            if item["workload"] == workload:
                item["acked"] = True

    def reject(self, workload: str, reason: str, object_uid: str = "") -> None:
        self.calls.append(("reject", workload, reason))
        self.items = [i for i in self.items if i["workload"] != workload]

    def status(
        self, workload: str, phase: str, reason: str, exit_code: int | None, info: dict[str, Any], object_uid: str = ""
    ) -> None:
        self.calls.append(("status", workload, phase, exit_code))
        if phase in ("Succeeded", "Failed"):
            self.items = [i for i in self.items if i["workload"] != workload]


def test_agent_loop_registers_reports_runs_and_reregisters_new_hardware(tmp_path: Path, work_root: Path) -> None:
    server = FakeServer()
    shapes = [gpu_node(2), gpu_node(2, unhealthy=(1,)), gpu_node(3)]
    calls = {"n": 0}

    def discovery() -> Discovery:
        d = shapes[min(calls["n"], len(shapes) - 1)]
        calls["n"] += 1
        return d

    agent = Agent(
        AgentConfig("unused", "t", tmp_path, work_root=work_root), server, discovery, CgroupSupport(None, reason="test")
    )
    agent.start()
    assert server.calls == [("register", "n1", 3)]
    cmd = ["true"]
    server.items = [{"workload": "t/w", "node": "n1", "cpuset": str(CPUS[0]), "version": 1, "acked": False,
                     "devices": {"gpu": [{"minor": 0, "resources": {"gpu-core": 100}}]},
                     "workloadSpec": {"command": cmd}}]  # fmt: skip
    agent.tick_bindings()
    assert ("ack", "t/w") in server.calls
    agent.tick_report()  # second discovery: GPU 1 unhealthy; GPU 0 held by t/w
    report = [c for c in server.calls if c[0] == "report"][-1][2]
    assert report["health"]["gpu"] == {"0": True, "1": False}
    assert decode(**report["devices"]["gpu"]["gpu-core"]) == [0, 100]
    end = time.monotonic() + 20
    while server.items and time.monotonic() < end:
        agent.tick_bindings()
        time.sleep(0.05)
    assert [c[2] for c in server.calls if c[0] == "status"] == ["Running", "Succeeded"]
    agent.tick_report()  # third discovery: a new GPU appeared -> registered again
    assert server.calls[-2] == ("register", "n1", 4)


def test_unreadable_binding_is_rejected_with_the_field(tmp_path: Path, work_root: Path) -> None:
    server = FakeServer()
    agent = Agent(
        AgentConfig("unused", "t", tmp_path, work_root=work_root), server, gpu_node, CgroupSupport(None, reason="test")
    )
    agent.start()
    server.items = [{"workload": "t/bad", "node": "n1", "cpuset": "0-x", "version": 1}]
    agent.tick_bindings()
    (reject,) = [c for c in server.calls if c[0] == "reject"]
    assert reject[1] == "t/bad" and "cpuset" in reject[2]


def test_server_down_is_retried_not_fatal(tmp_path: Path, work_root: Path) -> None:
    server = FakeServer()
    agent = Agent(
        AgentConfig("unused", "t", tmp_path, work_root=work_root), server, gpu_node, CgroupSupport(None, reason="test")
    )
    agent.start()
    server.down = True
    agent.tick_bindings()
    agent.tick_report()
    assert agent.last_report_error.startswith("connection refused")
    server.down = False
    agent.tick_report()
    assert agent.last_report_error == ""


def test_run_survives_a_failing_tick_and_stops_its_workloads_on_exit(tmp_path: Path, work_root: Path) -> None:
    import threading

    server = FakeServer()
    calls = {"n": 0}

    def flaky() -> Discovery:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("sysfs hiccup")
        return gpu_node()

    config = AgentConfig(
        "unused", "t", tmp_path, work_root=work_root, interval=0.2, watch=0.05, stop_workloads_on_exit=True
    )
    agent = Agent(config, server, flaky, CgroupSupport(None, reason="test"))
    server.items = [{"workload": "t/sleeper", "node": "n1", "cpuset": "", "version": 1, "acked": False,
                     "workloadSpec": {"command": ["sleep", "30"]}}]  # fmt: skip
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        end = time.monotonic() + 20
        while len([c for c in server.calls if c[0] == "report"]) < 2 and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        agent.stopping.set()
        runner.join(timeout=30)
    assert calls["n"] >= 3  # the failed discovery did not end the loop
    assert len([c for c in server.calls if c[0] == "report"]) >= 2
    statuses = [c[2:] for c in server.calls if c[0] == "status"]
    assert statuses[0] == ("Running", None) and statuses[-1][0] == "Failed"  # stopped on exit (SIGTERM)
    assert agent.executor.state.records["t/sleeper"].reason.startswith("stopped by the agent on its exit")
