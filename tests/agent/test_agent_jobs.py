"""Jobs that run, end to end on 127.0.0.1: the control plane and a node agent running real slot processes.

The job is examples/jobs/two-regions.yaml with its commands replaced by small Python tasks that
record their pid and wait for a file, so the test decides when the job ends and whom it kills.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from agent_cluster import NODE, Cluster, wait

from finesched.agent.launch import is_running, start_time
from finesched.agent.loop import Agent
from finesched.server.api.auth import create_token
from finesched.server.loop.lifecycle import Backoff
from finesched.server.loop.loop import LoopConfig
from finesched.server.store.store import Store
from reachable import SYSTEM_PYTHON

ROOT = Path(__file__).resolve().parents[2]
FINESCHED = [sys.executable, "-m", "finesched.cli"]
FAST = LoopConfig(idle_wait_s=0.05, requeue_after_s=None, backoff=Backoff(0.2, 1.0))
TASK = """
import os, sys, time
pids, go = sys.argv[1], sys.argv[2]
me = f"{os.environ['FINESCHED_TASK']}-{os.environ['FINESCHED_SUBTASK_INDEX']}"
open(os.path.join(pids, f"{me}.{os.getpid()}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, FAST)
    yield c
    c.close()


def two_regions(exchange: Path, **spec: Any) -> tuple[dict[str, Any], Path, Path]:
    """The example job (namespace t) whose tasks wait for `go`; (manifest, pid directory, go file).
    `exchange`: a directory its tasks (running as the tenant's user) may write to (reachable.py)."""
    doc = yaml.safe_load((ROOT / "examples" / "jobs" / "two-regions.yaml").read_text())
    pids, go = exchange / "pids", exchange / "go"
    pids.mkdir(mode=0o1777)
    pids.chmod(0o1777)
    doc["metadata"]["namespace"] = "t"
    for task in doc["spec"]["tasks"]:
        task["command"] = [SYSTEM_PYTHON, "-c", TASK, str(pids), str(go)]
    doc["spec"].update(spec)
    return doc, pids, go


def task_pids(pids: Path) -> dict[str, list[int]]:
    """task-index -> every pid it ran as, in start order."""
    out: dict[str, list[int]] = {}
    for path in sorted(pids.iterdir(), key=lambda p: p.stat().st_mtime_ns):
        name, _, pid = path.name.rpartition(".")
        out.setdefault(name, []).append(int(pid))
    return out


def job(cluster: Cluster, name: str = "clicks") -> dict[str, Any]:
    response = cluster.admin.get(f"/v1/jobs/t/{name}")
    response.raise_for_status()
    return response.json()


def until(cluster: Cluster, agent: Agent, check: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def done() -> bool:
        agent.tick_bindings()
        seen.update(job(cluster))
        return bool(check(seen))

    wait(done, what, timeout)
    return seen


def all_running(pids: Path, expected: int) -> Any:
    return lambda j: j["status"]["slots"].get("Running") == 3 and len(list(pids.iterdir())) >= expected


def test_two_region_job_runs_to_completion(cluster: Cluster) -> None:
    agent = cluster.agent()
    doc, pids, go = two_regions(cluster.exchange)
    answer = cluster.admin.post("/v1/jobs", json=doc)
    assert answer.status_code == 201, answer.text
    running = until(cluster, agent, all_running(pids, 5), "every slot to run")
    status = running["status"]
    assert status["phase"] == "Running" and status["slots"]["total"] == 3
    assert [r["tasks"] for r in status["regions"]] == [
        ["clicks-source", "clicks-count"],
        ["orders-source", "orders-sink"],
    ]
    # each task's subtask i runs in slot i of its group, with the slot's place in the job in its env
    assert sorted(task_pids(pids)) == ["clicks-count-0", "clicks-source-0", "clicks-source-1", "orders-sink-0",
                                       "orders-source-0"]  # fmt: skip
    go.touch()
    done = until(cluster, agent, lambda j: j["status"]["phase"] == "Succeeded", "the job to succeed")
    assert done["status"]["slots"] == {"total": 3, "Succeeded": 3} and done["status"]["failures"] == 0
    listed = cluster.admin.get("/v1/jobs").json()["items"]
    assert [(j["metadata"]["name"], j["status"]["phase"]) for j in listed] == [("clicks", "Succeeded")]


def test_killing_one_slot_restarts_only_its_region(cluster: Cluster) -> None:
    agent = cluster.agent()
    doc, pids, go = two_regions(cluster.exchange)
    assert cluster.admin.post("/v1/jobs", json=doc).status_code == 201
    until(cluster, agent, all_running(pids, 5), "every slot to run")
    before = task_pids(pids)
    os.kill(before["clicks-count-0"][0], signal.SIGKILL)  # one task of region 0's first slot dies
    restarted = until(
        cluster, agent, lambda j: j["status"]["regions"][0]["restarts"] == 1 and j["status"]["phase"] == "Running"
        and len(list(pids.iterdir())) >= 8, "region 0 to restart and run again",
    )  # fmt: skip
    after = task_pids(pids)
    # region 0 (both clicks slots: the all-to-all edge joins them) started afresh, region 1 untouched
    for name in ("clicks-source-0", "clicks-source-1", "clicks-count-0"):
        assert len(after[name]) == 2, after
        assert not is_running(after[name][0], start_time(after[name][0]) or -1)
    for name in ("orders-source-0", "orders-sink-0"):
        assert after[name] == before[name] and is_running(after[name][0], start_time(after[name][0]) or -1)
    status = restarted["status"]
    assert status["failures"] == 1 and status["regions"][1]["restarts"] == 0
    reasons = [e["reason"] for e in restarted["events"]]
    assert "RegionRestart" in reasons and "Restarting" in reasons
    go.touch()
    until(cluster, agent, lambda j: j["status"]["phase"] == "Succeeded", "the job to succeed after the restart")


def test_a_job_fails_when_its_backoff_limit_is_used_up(cluster: Cluster) -> None:
    agent = cluster.agent()
    doc, pids, _ = two_regions(cluster.exchange, backoffLimit=0)
    assert cluster.admin.post("/v1/jobs", json=doc).status_code == 201
    until(cluster, agent, all_running(pids, 5), "every slot to run")
    os.kill(task_pids(pids)["orders-sink-0"][0], signal.SIGKILL)
    failed = until(cluster, agent, lambda j: j["status"]["phase"] == "Failed", "the job to fail")
    assert "backoff limit 0 reached" in failed["status"]["reason"]
    assert failed["status"]["slots"] == {"total": 3, "Failed": 3}
    agent.tick_bindings()  # the released slots' processes are stopped
    assert not [p for ps in task_pids(pids).values() for p in ps if is_running(p, start_time(p) or -1)]


def test_delete_job_stops_every_slot(cluster: Cluster) -> None:
    agent = cluster.agent()
    doc, pids, _ = two_regions(cluster.exchange)
    assert cluster.admin.post("/v1/jobs", json=doc).status_code == 201
    until(cluster, agent, all_running(pids, 5), "every slot to run")
    answer = cluster.admin.delete("/v1/jobs/t/clicks")
    assert answer.status_code == 200 and answer.json()["released"] == 3
    agent.tick_bindings()
    # the slots' processes are signalled in that tick; a task a slot's shell started may take a
    # moment to be reaped on a loaded machine, so its end is awaited (bounded), not sampled once
    wait(
        lambda: not [p for ps in task_pids(pids).values() for p in ps if is_running(p, start_time(p) or -1)],
        "every task of every slot to end",
        timeout=15,
    )
    assert cluster.admin.get("/v1/workloads", params={"job": "clicks"}).json()["items"] == []
    assert cluster.admin.get("/v1/jobs/t/clicks").status_code == 404


def test_a_rejected_binding_backs_off_and_its_events_are_counted(cluster: Cluster) -> None:
    agent = cluster.agent()
    cluster.submit("nothing", [], {"cpu": "100m"})  # no command: every agent refuses it

    def rejections() -> int:
        agent.tick_bindings()
        return int(cluster.store.get_workload("t", "nothing")["rejections"])

    wait(lambda: rejections() >= 4, "four rejections", timeout=20)  # after 0 + 0.2 + 0.4 + 0.8 s of backoff
    events = [e for e in cluster.admin.get("/v1/events", params={"object": "t/nothing"}).json()["items"]]
    requeued = [e for e in events if e["reason"] == "Requeued"]
    bound = [e for e in events if e["reason"] == "Bound"]
    assert len(bound) == 1 and bound[0]["count"] >= 4  # one row each, counted
    assert len(requeued) == 1 and requeued[0]["count"] >= 4 and "has no command" in requeued[0]["message"]
    assert len(events) <= 5  # Submitted, Bound, Requeued (and Waiting) however long it goes on
    w = cluster.workload("nothing")
    assert w["status"]["phase"] == "Pending" and "placed again in" in w["status"]["reason"]


def test_a_job_converges_after_its_server_and_agent_are_killed(tmp_path: Path, work_root: Path, exchange: Path) -> None:
    """SIGKILL `finesched serve` and `finesched agent` mid-job, kill a slot's task while both are
    down, start both again: the agent adopts the slots, reports the dead one, and only its region
    restarts; the job then runs to completion."""
    db = f"sqlite:///{tmp_path / 'fs.db'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    store = Store.open(db)
    admin_token, agent_token = create_token(store, "admin"), create_token(store, "agent", node=NODE)
    store.close()
    server_args = ["serve", "--db", db, "--port", str(port), "--log-level", "warning", "--heartbeat", "0.5"]
    agent_args = ["agent", "--server", url, "--token", agent_token, "--node-name", NODE, "--data",
                  str(tmp_path / "agent"), "--work-root", str(work_root), "--interval", "0.5", "--watch", "0.1",
                  "--quiet"]  # fmt: skip
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=10)

    def answers() -> bool:
        try:
            return admin.get("/readyz").json().get("leader") is True
        except httpx.HTTPError:
            return False

    def status() -> dict[str, Any]:
        return dict(admin.get("/v1/jobs/t/clicks").json()["status"])

    processes = [subprocess.Popen([*FINESCHED, *server_args], stderr=subprocess.DEVNULL)]
    try:
        wait(answers, "the server", timeout=60)
        tenant = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t"}}
        assert admin.post("/v1/tenants", json=tenant).status_code == 201  # owns namespace t
        processes.append(subprocess.Popen([*FINESCHED, *agent_args], stderr=subprocess.DEVNULL))
        doc, pids, go = two_regions(exchange)
        wait(lambda: admin.get(f"/v1/nodes/{NODE}").status_code == 200, "the agent to register", timeout=60)
        assert admin.post("/v1/jobs", json=doc).status_code == 201
        wait(lambda: status()["slots"].get("Running") == 3 and len(list(pids.iterdir())) == 5, "the slots to run")
        before = task_pids(pids)
        for process in processes:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        os.kill(before["orders-sink-0"][0], signal.SIGKILL)  # region 1 fails while nobody watches
        processes = [subprocess.Popen([*FINESCHED, *server_args], stderr=subprocess.DEVNULL)]
        wait(answers, "the server again", timeout=60)
        processes.append(subprocess.Popen([*FINESCHED, *agent_args], stderr=subprocess.DEVNULL))

        def region_1_restarted() -> bool:
            now = status()
            running = now["slots"].get("Running") == 3 and len(list(pids.iterdir())) == 7
            return running and now["regions"][1]["restarts"] == 1

        wait(region_1_restarted, "region 1 to restart and run", timeout=60)
        after = task_pids(pids)
        assert all(after[t] == before[t] for t in ("clicks-source-0", "clicks-source-1", "clicks-count-0"))
        assert status()["regions"][0]["restarts"] == 0 and status()["failures"] == 1
        go.touch()
        wait(lambda: status()["phase"] == "Succeeded", "the job to succeed", timeout=60)
    finally:
        admin.close()
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
