"""The defragmenter in the control plane (issue 29): a plan's moves written with the waiting
workload's binding in one transaction, or not at all; events on both workloads; the moved workload
Bound again on its target; the moves counted; bad input refused; the budget respected.

A real server (uvicorn on 127.0.0.1, SQLite and PostgreSQL) with a profile that enables the
defragmenter; the conflict cases drive a SchedulerLoop by hand (no loop thread) so that the store
can change between its decision and its write.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from manifests import node, workload
from server_harness import Api, inprocess_server, store_tenants, wait_until

from finesched.model.binding import Binding
from finesched.sched.defrag import DefragPlan, Move
from finesched.server.loop.loop import LoopConfig, SchedulerLoop
from finesched.server.store.move_store import PlanWrite
from finesched.server.store.store import BOUND, PENDING, RUNNING, SUCCEEDED, Store
from profiles import defrag_profile

SHARE = {"cpu": "1", "memory": "1Gi", "gpu-core": 40, "gpu-memory-ratio": 40}
WHOLE = {"cpu": "1", "memory": "1Gi", "gpu-core": 100, "gpu-memory-ratio": 100}
MOVABLE = {"migration": {"allowed": True}}


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[Api]:
    config = LoopConfig(idle_wait_s=0.05, lease_ttl_s=5.0, profile=str(defrag_profile(tmp_path)))
    with inprocess_server(db_url, config) as running:
        yield running


def _events(api: Api, key: str) -> list[dict[str, Any]]:
    return api.admin.get("/v1/events", params={"object": key}).json()["items"]


def _gpu(body: dict[str, Any]) -> int:
    (grant,) = body["status"]["binding"]["devices"]["gpu"]
    return int(grant["minor"])


def _two_shares(api: Api, **spec: Any) -> tuple[int, int]:
    """Two shares of 40 on n1 (2 GPUs), one per card (LeastAllocated cards); each seen Running."""
    agent = api.client(api.token("agent", node="n1"))
    assert api.admin.put("/v1/nodes/n1", json=node("n1", gpus=2)).status_code == 200
    gpus = []
    for name in ("s0", "s1"):
        answer = api.admin.post("/v1/workloads", json=[workload(name, requests=SHARE, **spec)])
        assert answer.status_code == 201, answer.text
        gpus.append(_gpu(api.wait_phase(f"team-a/{name}", (BOUND,))))
        assert agent.post(f"/v1/workloads/team-a/{name}/status", json={"phase": RUNNING}).status_code == 200
    assert sorted(gpus) == [0, 1]
    return gpus[0], gpus[1]


def test_a_share_is_moved_so_a_whole_card_workload_binds(api: Api) -> None:
    _two_shares(api, **MOVABLE)
    assert api.admin.post("/v1/workloads", json=[workload("big", requests=WHOLE)]).status_code == 201
    big = api.wait_phase("team-a/big", (BOUND,))
    shares = {n: api.admin.get(f"/v1/workloads/team-a/{n}").json() for n in ("s0", "s1")}
    # one share moved onto the other card: both shares on one card, the big one on the freed card
    assert {_gpu(s) for s in shares.values()} == {1 - _gpu(big)}
    moved = [n for n in shares if any(e["reason"] == "Moved" for e in _events(api, f"team-a/{n}"))]
    assert len(moved) == 1
    mover = shares[moved[0]]
    # Bound again on its target (the agent starts it there: a new, unacknowledged binding)
    assert mover["status"]["phase"] == BOUND and mover["status"]["node"] == "n1"
    (event,) = [e for e in _events(api, f"team-a/{moved[0]}") if e["reason"] == "Moved"]
    assert "team-a/big" in event["message"] and mover["status"]["reason"] == event["message"]
    (defragmented,) = [e for e in _events(api, "team-a/big") if e["reason"] == "Defragmented"]
    assert f"team-a/{moved[0]}: n1 gpu {_gpu(big)} -> n1 gpu {1 - _gpu(big)}" in defragmented["message"]
    agent = api.client(api.token("agent", node="n1"))
    items = {b["workload"]: b for b in agent.get("/v1/bindings").json()["items"]}
    assert not items[f"team-a/{moved[0]}"]["acked"]
    assert "finesched_defragmentation_moves_total 1.0" in api.admin.get("/metrics").text
    # the moved workload reports Running from its new card: it is not counted as a restart
    assert agent.post(f"/v1/workloads/team-a/{moved[0]}/status", json={"phase": RUNNING}).status_code == 200
    after = api.admin.get(f"/v1/workloads/team-a/{moved[0]}").json()
    assert after["status"]["phase"] == RUNNING and after["status"].get("restarts", 0) == 0


def test_a_tenant_is_not_told_the_names_of_another_tenants_workloads(api: Api) -> None:
    assert api.admin.put("/v1/nodes/n1", json=node("n1", gpus=2)).status_code == 200
    for name, namespace in (("s0", "team-b"), ("s1", "team-b")):
        doc = workload(name, namespace=namespace, requests=SHARE, **MOVABLE)
        assert api.admin.post("/v1/workloads", json=[doc]).status_code == 201
        api.wait_phase(f"{namespace}/{name}", (BOUND,))
    assert api.admin.post("/v1/workloads", json=[workload("big", requests=WHOLE)]).status_code == 201
    api.wait_phase("team-a/big", (BOUND,))
    (moved,) = [e for n in ("s0", "s1") for e in _events(api, f"team-b/{n}") if e["reason"] == "Moved"]
    mover = api.admin.get(f"/v1/workloads/{moved['object']}").json()
    for told in (moved["message"], mover["status"]["reason"]):
        assert "team-a" not in told and "to make room for a workload of another tenant" in told, told
    (defragmented,) = [e for e in _events(api, "team-a/big") if e["reason"] == "Defragmented"]
    assert "team-b" not in defragmented["message"], defragmented["message"]
    assert "a workload of another tenant: n1 gpu" in defragmented["message"], defragmented["message"]


def test_a_workload_without_migration_is_never_moved(api: Api) -> None:
    before = _two_shares(api)
    assert api.admin.post("/v1/workloads", json=[workload("big", requests=WHOLE)]).status_code == 201
    wait_until(lambda: api.store.get_workload("team-a", "big")["reason"] != "", what="big's waiting reason")
    assert api.admin.get("/v1/workloads/team-a/big").json()["status"]["phase"] == PENDING
    after = tuple(_gpu(api.admin.get(f"/v1/workloads/team-a/{n}").json()) for n in ("s0", "s1"))
    assert after == before
    assert not [e for n in ("s0", "s1", "big") for e in _events(api, f"team-a/{n}") if e["reason"] == "Moved"]
    assert "finesched_defragmentation_moves_total 0.0" in api.admin.get("/metrics").text


def test_a_migration_setting_that_is_not_a_boolean_is_refused(api: Api) -> None:
    doc = workload("bad", requests=SHARE, migration={"allowed": "maybe"})
    answer = api.admin.post("/v1/workloads", json=[doc])
    assert answer.status_code == 422, answer.text
    locs = [d["loc"] for d in answer.json()["detail"]]
    assert any(loc[-3:] == ["spec", "migration", "allowed"] for loc in locs), locs
    assert api.admin.get("/v1/workloads/team-a/bad").status_code == 404


def test_a_second_fragmented_workload_beyond_the_budget_waits(db_url: str, tmp_path: Path) -> None:
    config = LoopConfig(idle_wait_s=0.05, lease_ttl_s=5.0, profile=str(defrag_profile(tmp_path, maxMovesPerMinute=1)))
    with inprocess_server(db_url, config) as api:
        for name in ("n1", "n2"):
            assert api.admin.put(f"/v1/nodes/{name}", json=node(name, gpus=2)).status_code == 200
        shares = [workload(f"s{i}", requests=SHARE, **MOVABLE) for i in range(4)]  # one per card (spread)
        assert api.admin.post("/v1/workloads", json=shares).status_code == 201
        for i in range(4):
            api.wait_phase(f"team-a/s{i}", (BOUND,))
        cards = {(b["node"], b["devices"]["gpu"][0]["minor"]) for b in (r["data"] for r in api.store.bindings())}
        assert len(cards) == 4
        bigs = [workload(f"big{i}", requests=WHOLE) for i in range(2)]
        assert api.admin.post("/v1/workloads", json=bigs).status_code == 201
        wait_until(lambda: {api.store.get_workload("team-a", f"big{i}")["phase"] for i in range(2)} == {BOUND, PENDING},
                   what="one big workload bound, the other waiting")  # fmt: skip
        waiting = next(w for i in range(2) if (w := api.store.get_workload("team-a", f"big{i}"))["phase"] == PENDING)
        wait_until(lambda: api.store.get_workload("team-a", waiting["name"])["reason"] != "", what="a reason")
        moved = [e for i in range(4) for e in _events(api, f"team-a/s{i}") if e["reason"] == "Moved"]
        assert len(moved) == 1
        assert "finesched_defragmentation_moves_total 1.0" in api.admin.get("/metrics").text


# The write path, driven by hand ---------------------------------------------------------------------
@pytest.fixture
def loop(db_url: str, tmp_path: Path) -> Iterator[SchedulerLoop]:
    store = Store.open(db_url)
    store_tenants(store)
    leader = SchedulerLoop(store, LoopConfig(lease_ttl_s=60.0, profile=str(defrag_profile(tmp_path))))
    assert leader.lease.try_acquire()
    try:
        yield leader
    finally:
        leader.lease.release()
        store.close()


def _fragmented(loop: SchedulerLoop) -> None:
    """n1 with two movable shares, one per card, bound through the loop; then `big` submitted."""
    store = loop.store
    store.put_node("n1", node("n1", gpus=2), create_only=True)
    store.submit([("team-a", n, "team-a", workload(n, requests=SHARE, **MOVABLE)) for n in ("s0", "s1")])
    loop.rebuild()
    loop._schedule_batch()
    assert {store.get_workload("team-a", n)["phase"] for n in ("s0", "s1")} == {BOUND}
    store.submit([("team-a", "big", "team-a", workload("big", requests=WHOLE))])
    loop._follow_feed()


def _placed(loop: SchedulerLoop) -> dict[str, Binding]:
    assert loop.scheduler is not None
    return dict(loop.scheduler.state.bindings)


def test_a_rebuild_remembers_the_movable_bindings(loop: SchedulerLoop) -> None:
    _fragmented(loop)
    loop.rebuild()
    assert loop.scheduler is not None and sorted(loop.scheduler.movable) == ["team-a/s0", "team-a/s1"]
    loop._schedule_batch()  # the rebuilt state moves a share as the first one would
    assert loop.store.get_workload("team-a", "big")["phase"] == BOUND


def test_the_waiting_workload_changed_meanwhile_leaves_no_move_made(loop: SchedulerLoop) -> None:
    _fragmented(loop)
    before = _placed(loop)
    loop.store.set_phase("team-a/big", PENDING, "touched by another writer")  # its version moves on
    loop._schedule_batch()  # decides with a move; the write finds big changed: nothing of it written
    rows = {r["workload"]: r for r in loop.store.bindings()}
    assert sorted(rows) == ["team-a/s0", "team-a/s1"]
    assert {k: Binding.model_validate(r["data"]) for k, r in rows.items()} == {
        k: b for k, b in before.items() if k in rows
    }
    assert not [e for e in loop.store.events(kind="Workload") if e["reason"] in ("Moved", "Defragmented")]
    state = loop.scheduler.state  # type: ignore[union-attr]
    assert _placed(loop) == before and all(state.is_committed(k) for k in before)  # the movers back, durable
    loop._schedule_batch()  # queued again at its new version: now it binds, with the move
    assert loop.store.get_workload("team-a", "big")["phase"] == BOUND
    assert len([e for e in loop.store.events(kind="Workload") if e["reason"] == "Moved"]) == 1


def test_a_mover_that_ended_meanwhile_makes_the_plan_a_conflict(loop: SchedulerLoop) -> None:
    _fragmented(loop)
    assert loop.scheduler is not None
    plan, why = loop.scheduler.find_defragmentation(loop.queued["team-a/big"].workload)
    assert plan is not None, why
    (move,) = plan.moves
    loop.store.release(move.workload, SUCCEEDED, "exited with code 0")  # the loop has not seen it yet
    loop._schedule_batch()
    assert loop.store.get_workload("team-a", "big")["phase"] == PENDING
    assert not [e for e in loop.store.events(kind="Workload") if e["reason"] in ("Moved", "Defragmented")]
    assert move.workload not in _placed(loop)  # the state follows the store: the ended mover let go


def test_the_store_writes_a_plan_whole_or_not_at_all(store: Store) -> None:
    store_tenants(store)
    ids, _ = store.submit([("team-a", n, "team-a", workload(n)) for n in ("mover", "other", "big")])
    mover, other, big = ids
    source = Binding(workload="team-a/mover", node="n1", tenant="team-a", requests={"cpu": "1"})
    target = Binding(workload="team-a/mover", node="n2", tenant="team-a", requests={"cpu": "1"})
    store.bind([(mover, 1, "team-a/mover", "n1", source.model_dump(mode="json", by_alias=True))])
    wanted = Binding(workload="team-a/big", node="n1", tenant="team-a", requests={"cpu": "2"})
    data = wanted.model_dump(mode="json", by_alias=True)
    # a mover that is not bound as planned (here: `other` is not bound at all): nothing written
    stray = Move("team-a/other", "team-a", 0, source.model_copy(update={"workload": "team-a/other"}),
                 target.model_copy(update={"workload": "team-a/other"}), "moved")  # fmt: skip
    good = Move("team-a/mover", "team-a", 0, source, target, "moved from n1 to n2 for team-a/big")
    bad_plan = DefragPlan("team-a/big", wanted, (good, stray), "no node holds 2 cpu")
    conflicts, _ = store.bind([(big, 1, "team-a/big", "n1", data)], moves={big: PlanWrite(bad_plan)})
    assert conflicts == [big] and other
    assert store.get_workload("team-a", "mover")["binding"]["node"] == "n1"
    assert store.get_workload("team-a", "big")["phase"] == PENDING
    # the plan as found: the mover's binding replaced (unacked), then big bound; events on both
    plan = DefragPlan("team-a/big", wanted, (good,), "no node holds 2 cpu")
    conflicts, _ = store.bind([(big, 1, "team-a/big", "n1", data)], moves={big: PlanWrite(plan)})
    assert conflicts == []
    row = store.get_workload("team-a", "mover")
    assert (row["phase"], row["node"], row["binding"]["node"], row["binding"]["acked"]) == (BOUND, "n2", "n2", False)
    assert Binding.model_validate(row["binding"]["data"]) == target
    reasons = [(e["object"], e["reason"]) for e in store.events(kind="Workload") if e["reason"] != "Submitted"]
    assert reasons[-3:] == [("team-a/mover", "Moved"), ("team-a/big", "Defragmented"), ("team-a/big", "Bound")]
