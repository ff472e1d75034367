"""A tenant's queue under its `max`, on a real `finesched serve`: a request its caps can never admit
is refused at submit (403, Kubernetes' "exceeded quota"), one that only does not fit now waits aside
without holding the tenant's later work, a delete frees the queue, a stored workload the max was
lowered under waits with that reason; and no Pending workload is ever shown without a reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from manifests import API, node, workload
from server_harness import Api, ServerProcess, wait_phase, wait_until

from finesched.server.api.auth import create_token
from finesched.server.loop.loop import LoopConfig, SchedulerLoop
from finesched.server.store.store import Store
from finesched.server.store.views import canonical


def capped(max_cpu: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Tenant", "metadata": {"name": "tb"}, "spec": {"max": {"cpu": max_cpu}}}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """`finesched serve` (a subprocess, SQLite): an admin client and tenant tb's client."""
    db = f"sqlite:///{tmp_path / 'quota.db'}"
    store = Store.open(db)
    admin_token, tenant_token = create_token(store, "admin"), None
    server = ServerProcess(db, None, log=tmp_path / "serve.log").start()
    try:
        wait_until(server.is_leader, what="leadership")
        admin = httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30)
        assert admin.put("/v1/nodes/n1", json=node("n1", cpu="16")).status_code in (200, 201)
        assert admin.put("/v1/tenants/tb", json=capped("4")).status_code == 200
        tenant_token = create_token(store, "tenant", tenant="tb")
        tb = httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {tenant_token}"}, timeout=30)
        yield admin, tb
    finally:
        server.stop()
        store.close()


def status(client: httpx.Client, name: str) -> dict[str, Any]:
    return client.get(f"/v1/workloads/tb/{name}").json()["status"]


def reason_of(client: httpx.Client, name: str, starts: str) -> str:
    found: list[str] = []
    wait_until(lambda: (found.append(status(client, name)["reason"]) or found[-1].startswith(starts)),
               what=f"tb/{name}'s reason to start with {starts!r} (last: {found[-1:]})")  # fmt: skip
    return found[-1]


def test_the_issues_sequence_on_serve(serve: tuple[httpx.Client, httpx.Client]) -> None:
    admin, tb = serve
    # big can never fit in tb's max: refused at submit, nothing stored
    refused = tb.post("/v1/workloads", json=workload("big", "tb", cpu="8"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"].startswith("exceeded quota: tenant tb, requested: cpu=8, max: cpu=4")
    assert tb.get("/v1/workloads/tb/big").status_code == 404
    # small goes, as does every later workload while the max admits it
    assert tb.post("/v1/workloads", json=workload("small", "tb", cpu="1")).status_code == 201
    wait_phase(tb, "tb/small", ("Bound",))
    # hold + small take 3: mid (2) waits aside for room, and does not hold tiny (1) behind it
    assert tb.post("/v1/workloads", json=workload("hold", "tb", cpu="2")).status_code == 201
    wait_phase(tb, "tb/hold", ("Bound",))
    assert tb.post("/v1/workloads", json=workload("mid", "tb", cpu="2")).status_code == 201
    assert reason_of(tb, "mid", "waiting: tenant tb would exceed its max: cpu (holds 3, asks 2")
    assert tb.post("/v1/workloads", json=workload("tiny", "tb", cpu="1")).status_code == 201
    wait_phase(tb, "tb/tiny", ("Bound",))
    assert status(tb, "mid")["phase"] == "Pending"
    # a delete frees the queue: mid goes, and later work after it
    assert tb.delete("/v1/workloads/tb/hold").status_code == 200
    wait_phase(tb, "tb/mid", ("Bound",))
    # lowered under a stored workload's demand: it waits with that reason, and blocks nothing
    assert tb.post("/v1/workloads", json=workload("late", "tb", cpu="3")).status_code == 201
    reason_of(tb, "late", "waiting: tenant tb would exceed its max")
    assert admin.put("/v1/tenants/tb", json=capped("2")).status_code == 200
    assert reason_of(tb, "late", "waiting: exceeded quota: tenant tb, requested: cpu=3, max: cpu=2")
    for name in ("mid", "tiny", "small"):
        assert tb.delete(f"/v1/workloads/tb/{name}").status_code == 200
    for i in range(3):
        assert tb.post("/v1/workloads", json=workload(f"after{i}", "tb", cpu="0.5")).status_code == 201
    for i in range(3):
        wait_phase(tb, f"tb/after{i}", ("Bound",))
    assert status(tb, "late")["phase"] == "Pending"


def test_no_pending_workload_is_shown_without_a_reason(api: Api) -> None:
    """Through the API, during a flood (some not tried yet) and after it: every Pending workload has
    a reason, in the list, in a single read and in the submission's answer."""
    api.admin.post("/v1/nodes", json=node("n1", cpu="4"))
    answer = api.admin.post("/v1/workloads", json=[workload(f"f{i}", cpu="64") for i in range(300)])
    assert answer.status_code == 201
    assert all(item["status"]["reason"] for item in answer.json()["items"])
    for _ in range(3):
        items = api.admin.get("/v1/workloads", params={"namespace": "team-a", "phase": "Pending"}).json()["items"]
        assert len(items) == 300 and all(item["status"]["reason"] for item in items)
        assert api.admin.get("/v1/workloads/team-a/f299").json()["status"]["reason"]

    def tried() -> bool:
        return api.admin.get("/v1/workloads/team-a/f299").json()["status"]["reason"].startswith("0/1 nodes available")

    wait_until(tried, what="the last of the flood to be tried")


def test_a_workload_not_tried_yet_says_how_many_are_ahead(db_url: str) -> None:
    """Driven by hand (no loop thread): what the API shows before the scheduler decided anything."""
    store = Store.open(db_url)
    try:
        from server_harness import store_tenants

        store_tenants(store)
        loop = SchedulerLoop(store, LoopConfig(batch_size=2))
        loop.rebuild()
        items = [("team-a", f"w{i}", "team-a", canonical_workload(f"w{i}")) for i in range(4)]
        ids, events = store.submit(items)
        loop.submitted(zip(ids, [parse(item[3]) for item in items], strict=True), events)
        keys = [f"team-a/w{i}" for i in range(4)]
        assert loop.reasons(keys) == {k: f"queued: {i} ahead of it in tenant team-a" for i, k in enumerate(keys)}
        assert loop._schedule_batch()  # two decided (no node: parked), two left in the line: go on at once
        reasons = loop.reasons(keys)
        assert reasons["team-a/w0"] == reasons["team-a/w1"] == "0/0 nodes available: the cluster has no nodes"
        assert reasons["team-a/w2"] == "queued: 0 ahead of it in tenant team-a"
        assert reasons["team-a/w3"] == "queued: 1 ahead of it in tenant team-a"
        assert not loop._schedule_batch()  # the rest decided; nothing is left in a line
    finally:
        store.close()


def canonical_workload(name: str) -> dict[str, Any]:
    return canonical(parse(workload(name)))


def parse(doc: dict[str, Any]) -> Any:
    from finesched.model.manifest import parse_manifest

    return parse_manifest(doc)
