"""A workload moved by the defragmenter (issue 29), as the node agent carries it out: its process is
stopped and started again on the target card with the new NVIDIA_VISIBLE_DEVICES, it is not counted
as a restart, and the waiting whole-card workload runs on the card the move freed.

The control plane (uvicorn in a thread, SQLite, a profile with the defragmenter on) and one agent
with two injected GPUs; the processes are real and write what they saw (agent_cluster.PROBE).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import Cluster, phase_is

from finesched.agent.launch import is_running, start_time
from finesched.server.loop.loop import LoopConfig
from profiles import defrag_profile
from reachable import SYSTEM_PYTHON

SHARE = {"cpu": "100m", "memory": "64Mi", "gpu-core": 40, "gpu-memory-ratio": 40}
WHOLE = {"cpu": "100m", "memory": "64Mi", "gpu-core": 100, "gpu-memory-ratio": 100}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    profile = str(defrag_profile(tmp_path))
    c = Cluster(tmp_path, LoopConfig(idle_wait_s=0.05, requeue_after_s=None, profile=profile))
    try:
        yield c
    finally:
        for agent in c.agents:
            agent.executor.stop_all()
        c.close()


def _seen(cluster: Cluster, name: str) -> tuple[list[str], Path]:
    """A command that writes its environment (agent_cluster.PROBE) and then sleeps; the file."""
    command, out = cluster.probe(name)
    probe = command[2] + "; import time; time.sleep(600)"
    return [SYSTEM_PYTHON, "-c", probe, str(out)], out


def _gpu_env(out: Path) -> str:
    return json.loads(out.read_text())["env"]["NVIDIA_VISIBLE_DEVICES"] if out.is_file() else ""


def test_a_moved_share_restarts_on_its_new_card(cluster: Cluster) -> None:
    agent = cluster.agent()
    agent.tick_report()
    outs: dict[str, Path] = {}
    pids: dict[str, int] = {}
    started: dict[int, int] = {}
    for name in ("s0", "s1"):
        command, outs[name] = _seen(cluster, name)
        cluster.submit(name, command, SHARE, migration={"allowed": True})
        running = cluster.until(agent, name, lambda w, o=outs[name]: phase_is("Running")(w) and _gpu_env(o) != "",
                                "to run and say its GPU")  # fmt: skip
        pids[name] = running["status"]["info"]["pid"]
        began = start_time(pids[name])
        assert began is not None
        started[pids[name]] = began
    before = {name: _gpu_env(out) for name, out in outs.items()}
    assert sorted(before.values()) == ["GPU-e2e-0", "GPU-e2e-1"]  # one share per card

    command, big_out = _seen(cluster, "big")
    cluster.submit("big", command, WHOLE)
    big = cluster.until(agent, "big", lambda w: phase_is("Running")(w) and _gpu_env(big_out) != "", "to run")
    (grant,) = big["status"]["binding"]["devices"]["gpu"]
    freed = f"GPU-e2e-{grant['minor']}"
    assert _gpu_env(big_out) == freed
    (moved,) = [name for name, gpu in before.items() if gpu == freed]
    (stayed,) = set(before) - {moved}

    def restarted(w: dict[str, Any]) -> bool:
        again = w["status"]["info"].get("pid") not in (None, pids[moved])
        return phase_is("Running")(w) and again and _gpu_env(outs[moved]) != freed

    after = cluster.until(agent, moved, restarted, "to run again on its new card")
    assert _gpu_env(outs[moved]) == before[stayed]  # both shares on one card, the whole card for big
    assert not is_running(pids[moved], started[pids[moved]])  # the old process was stopped
    assert cluster.workload(stayed)["status"]["info"]["pid"] == pids[stayed]  # the other one untouched
    assert after["status"].get("restarts", 0) == 0  # a move is not a failure
    events = cluster.admin.get("/v1/events", params={"object": f"t/{moved}"}).json()["items"]
    reasons = [e["reason"] for e in events]
    assert "Moved" in reasons and "Restarting" not in reasons and "Failed" not in reasons, reasons
