"""Defragmentation end to end (issue 29): `finesched up --profile` with the defragmenter on and two
simulated GPUs; two GPU shares on the two cards, then a workload that needs a whole card. A share
without `spec.migration` is never moved (the whole-card workload waits); a movable one is moved onto
the other card, its process started again there with its new NVIDIA_VISIBLE_DEVICES (read with
`finesched logs`), `describe workload` says why it moved, and the whole-card workload runs.

Everything is a real process on 127.0.0.1 over SQLite; the helpers of tests/server/test_up_topology.py
start, watch and stop them (whatever a failure leaves behind is killed by its session).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from manifests import API, tenant
from server_harness import wait_until
from test_up_topology import FAILURE, Fleet, _workload_processes, cleanup, start_up

from profiles import defrag_profile

NODE = "n1"
#: What each workload prints before it sleeps (until it is deleted or moved).
COMMAND = ["sh", "-c", 'echo "$NVIDIA_VISIBLE_DEVICES"; exec sleep 600']
SHARE = {"cpu": "100m", "memory": "64Mi", "gpu-core": 40, "gpu-memory-ratio": 40}
WHOLE = {"cpu": "100m", "memory": "64Mi", "gpu-core": 100, "gpu-memory-ratio": 100}


def doc(name: str, requests: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Workload", "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"requests": requests, "command": COMMAND, **spec}}  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """`up` alone (its own agent, two simulated GPUs) with the defragmenter's profile."""
    profile = defrag_profile(tmp_path)
    fleet = start_up(tmp_path, "--node-name", NODE, "--fake-gpus", "2:16Gi", "--profile", str(profile))
    try:
        wait_until(lambda: _two_gpus(fleet), 60, "the node with its two GPUs")
        yield fleet
    finally:
        cleanup(fleet)


def _two_gpus(fleet: Fleet) -> bool:
    assert fleet.admin is not None and fleet.up.poll() is None, (fleet.tmp / "up.out").read_text()
    answer = fleet.admin.get(f"/v1/nodes/{NODE}")
    return answer.status_code == 200 and answer.json()["status"]["ready"] and len(answer.json()["spec"]["devices"]) == 2


def _running(fleet: Fleet, name: str, other_than: int | None = None) -> dict[str, Any]:
    """Workload team-a/NAME once it runs (a process other than `other_than`)."""
    assert fleet.admin is not None
    found: dict[str, Any] = {}

    def runs() -> bool:
        found.update(fleet.admin.get(f"/v1/workloads/team-a/{name}").json())  # type: ignore[union-attr]
        pid = found["status"]["info"].get("pid") if found["status"].get("info") else None
        return found["status"]["phase"] == "Running" and pid is not None and pid != other_than

    wait_until(runs, 60, f"team-a/{name} to run")
    return found


def _printed(fleet: Fleet, token: str, name: str, lines: int = 1) -> list[str]:
    """What team-a/NAME's process(es) printed (`finesched logs`), once `lines` lines are there."""
    seen: list[str] = []

    def printed() -> bool:
        (out,) = fleet.cli(("logs", f"team-a/{name}"), token=token)
        seen[:] = out.split()
        return len(seen) >= lines

    wait_until(printed, 30, f"team-a/{name}'s output")
    return seen


def _reasons(fleet: Fleet, name: str) -> list[str]:
    assert fleet.admin is not None
    items = fleet.admin.get("/v1/events", params={"object": f"team-a/{name}"}).json()["items"]
    return [e["reason"] for e in items]


@pytest.mark.slow
def test_a_share_is_moved_to_free_a_card_and_restarts_on_its_new_card(fleet: Fleet) -> None:
    admin = fleet.admin
    assert admin is not None
    admin_token = admin.headers["Authorization"].removeprefix("Bearer ")
    fleet.submit("tenants", [tenant("team-a")], admin_token)
    (token,) = fleet.tokens("tenant", "team-a")
    uuids = {d["minor"]: d["uuid"] for d in admin.get(f"/v1/nodes/{NODE}").json()["spec"]["devices"]}

    # wrong input: refused with the field, nothing stored
    bad = doc("bad", SHARE, migration={"allowed": "maybe"})
    answer = fleet.client(token).post("/v1/workloads", json=bad)
    assert answer.status_code == 422, answer.text
    assert [d["loc"][-3:] for d in answer.json()["detail"]] == [["spec", "migration", "allowed"]], answer.text
    assert admin.get("/v1/workloads/team-a/bad").status_code == 404

    # two shares without spec.migration, one per card (the cards' LeastAllocated): never moved,
    # so the whole-card workload waits
    fleet.submit("s0", [doc("s0", SHARE)], token)
    s0 = _running(fleet, "s0")
    fleet.submit("s1", [doc("s1", SHARE)], token)
    s1 = _running(fleet, "s1")
    cards = {n: w["status"]["binding"]["devices"]["gpu"][0]["minor"] for n, w in (("s0", s0), ("s1", s1))}
    assert sorted(cards.values()) == [0, 1]
    fleet.submit("wait", [doc("wait", WHOLE)], token)
    wait_until(lambda: admin.get("/v1/workloads/team-a/wait").json()["status"]["reason"] != "", 30, "a reason")
    assert admin.get("/v1/workloads/team-a/wait").json()["status"]["phase"] == "Pending"
    assert admin.delete("/v1/workloads/team-a/wait").status_code == 200
    assert "Moved" not in _reasons(fleet, "s0") + _reasons(fleet, "s1")

    # s1 replaced by a movable share (on the card s1 left); then a whole card is asked for
    s1_sessions = _workload_processes(fleet.work)
    assert admin.delete("/v1/workloads/team-a/s1").status_code == 200
    wait_until(lambda: len(_workload_processes(fleet.work)) == len(s1_sessions) - 1, 30, "s1's process to end")
    fleet.submit("m", [doc("m", SHARE, migration={"allowed": True})], token)
    m = _running(fleet, "m")
    card = m["status"]["binding"]["devices"]["gpu"][0]["minor"]
    assert card == cards["s1"] and _printed(fleet, token, "m") == [uuids[card]]
    fleet.submit("big", [doc("big", WHOLE)], token)
    big = _running(fleet, "big")
    assert big["status"]["binding"]["devices"]["gpu"][0]["minor"] == cards["s1"]  # the card the move freed
    assert _printed(fleet, token, "big") == [uuids[cards["s1"]]]

    # m was moved onto s0's card: its process started again there, with the new card's UUID
    moved = _running(fleet, "m", other_than=m["status"]["info"]["pid"])
    assert moved["status"]["binding"]["devices"]["gpu"][0]["minor"] == cards["s0"]
    assert moved["status"]["node"] == NODE
    assert _printed(fleet, token, "m", lines=2)[-1] == uuids[cards["s0"]]
    assert _running(fleet, "s0")["status"]["info"]["pid"] == s0["status"]["info"]["pid"]  # never moved
    assert "Moved" in _reasons(fleet, "m") and "Defragmented" in _reasons(fleet, "big")
    assert "Restarting" not in _reasons(fleet, "m") and "Failed" not in _reasons(fleet, "m")
    (described,) = fleet.cli(("describe", "workload", "team-a/m"), token=token)
    why = f"moved from {NODE} (GPU {cards['s1']}) to {NODE} (GPU {cards['s0']}) to make room for team-a/big"
    assert "Moved" in described and why in " ".join(described.split()), described
    assert "finesched_defragmentation_moves_total 1.0" in admin.get("/metrics").text

    # everything deleted: every process ends; `up` stops cleanly when asked
    for name in ("s0", "m", "big"):
        assert admin.delete(f"/v1/workloads/team-a/{name}").status_code == 200
    wait_until(lambda: not _workload_processes(fleet.work), 30, "the processes to end")
    cleanup(fleet)
    assert fleet.up.returncode == 0
    for log in fleet.logs:
        bad = [line for line in log.read_text(errors="replace").splitlines() if FAILURE.search(line)]
        assert not bad, f"{log.name}: {bad}"
