"""Reliability of the control plane with real `finesched serve` processes: concurrent clients, kill -9
in the middle of a burst, and two replicas on one PostgreSQL handing over the scheduler lease."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from manifests import node, workload
from server_harness import PG_URL, REQUIRE_PG, ServerProcess, create_tenants, fresh_database, wait_until

from finesched.model.binding import Binding
from finesched.server.api.auth import create_token
from finesched.server.store.cluster_view import node_from_row
from finesched.server.store.store import Store
from finesched.state.cluster import ClusterState


def mixed_workload(i: int, namespace: str = "team-a") -> dict[str, Any]:
    """Every third an exclusive CPU, a GPU share or a plain scalar request."""
    if i % 3 == 0:
        return workload(f"w{i}", namespace, cpu="1", memory="256Mi", qos="LSR", limits={"cpu": "1", "memory": "256Mi"})
    if i % 3 == 1:
        return workload(f"w{i}", namespace, **{"requests": {"cpu": "500m", "gpu-core": 25, "gpu-memory-ratio": 25}})
    return workload(f"w{i}", namespace, cpu="500m", memory="256Mi")


def register_nodes(client: httpx.Client, count: int, cores: int = 4, gpus: int = 2) -> None:
    for n in range(count):
        doc = node(f"n{n}", memory="256Gi", cores=cores, gpus=gpus)
        assert client.put(f"/v1/nodes/n{n}", json=doc).status_code == 200


def state_from_store(store: Store) -> ClusterState:
    """The state computed from the stored nodes and bindings; `assume` refuses any over-allocation."""
    state = ClusterState.from_nodes([node_from_row(r) for r in store.list_nodes()])
    for row in store.bindings():
        state.assume(Binding.model_validate(row["data"]))
    state.check_invariants()
    return state


def admin_client(server: ServerProcess, store: Store) -> httpx.Client:
    """An admin client of `server`, whose store has the harness's tenants (team-a, team-b)."""
    token = create_token(store, "admin")
    client = httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    create_tenants(client)
    return client


@pytest.mark.slow
def test_fifty_concurrent_clients_store_each_workload_once(db_url: str, tmp_path: Path) -> None:
    store = Store.open(db_url)
    server = ServerProcess(db_url, log=tmp_path / "server.log").start()
    try:
        admin = admin_client(server, store)
        register_nodes(admin, 20)
        accepted: list[str] = []
        lock = threading.Lock()

        def client(c: int) -> None:  # 50 clients x 40 workloads: batches of 5 and single submissions
            with httpx.Client(base_url=server.base, headers=admin.headers, timeout=60) as http:
                for start in range(0, 40, 8):
                    batch = [mixed_workload(c * 40 + start + k) for k in range(5)]
                    singles = [mixed_workload(c * 40 + start + k) for k in range(5, 8)]
                    for body in [batch, *singles]:
                        answer = http.post("/v1/workloads", json=body)
                        assert answer.status_code == 201, answer.text
                        with lock:
                            accepted.extend(f"{i['metadata']['namespace']}/{i['metadata']['name']}"
                                            for i in answer.json()["items"])  # fmt: skip

        with ThreadPoolExecutor(50) as pool:
            list(pool.map(client, range(50)))
        assert len(accepted) == 2000
        rows = store.list_workloads()
        stored = Counter(f"{r['namespace']}/{r['name']}" for r in rows)
        assert set(stored) == set(accepted) and max(stored.values()) == 1
        state = state_from_store(store)  # raises on any device, CPU or scalar over-allocation
        bound = [r for r in rows if r["phase"] == "Bound"]
        assert len(state.bindings) == len(store.bindings()) >= len(bound) > 0
    finally:
        server.stop()
        store.close()


@pytest.mark.slow
def test_kill_9_in_a_burst_loses_nothing_acknowledged(db_url: str, tmp_path: Path) -> None:
    store = Store.open(db_url)
    server = ServerProcess(db_url, log=tmp_path / "server.log").start()
    admin = admin_client(server, store)
    register_nodes(admin, 16, cores=32, gpus=8)
    acknowledged: dict[str, dict[str, Any]] = {}  # workload -> binding seen Bound through the API
    submitted: list[str] = []
    stop = threading.Event()

    def burst() -> None:
        i = 0
        with httpx.Client(base_url=server.base, headers=admin.headers, timeout=5) as http:
            while not stop.is_set() and i < 3000:
                body = [mixed_workload(i + k) for k in range(20)]
                try:
                    if http.post("/v1/workloads", json=body).status_code == 201:
                        submitted.extend(f"team-a/w{i + k}" for k in range(20))
                    for k in range(0, 20, 5):  # what the server says of the batch sent two posts ago
                        item = http.get(f"/v1/workloads/team-a/w{max(0, i - 40) + k}").json()
                        if item["status"]["phase"] == "Bound":
                            acknowledged[f"team-a/w{max(0, i - 40) + k}"] = item["status"]["binding"]
                except httpx.HTTPError:
                    return  # the server is gone
                i += 20

    writer = threading.Thread(target=burst)
    writer.start()
    wait_until(lambda: len(acknowledged) >= 40, timeout=60, what="a few bindings")
    server.kill()  # SIGKILL in the middle of the burst
    stop.set()
    writer.join(timeout=30)
    assert acknowledged
    restarted = ServerProcess(db_url, server.port, log=tmp_path / "server2.log").start()
    try:
        for key in submitted:  # every acknowledged submission survived
            assert admin.get(f"/v1/workloads/{key}").status_code == 200, key
        for key, binding in acknowledged.items():  # every acknowledged binding is there, unchanged
            status = admin.get(f"/v1/workloads/{key}").json()["status"]
            assert status["binding"]["node"] == binding["node"] and status["binding"]["cpuset"] == binding["cpuset"]
        wait_until(restarted.is_leader, timeout=30, what="leadership after restart")
        # The queue resumes: what was Pending and fits is bound by the restarted server.
        more = admin.post("/v1/workloads", json=[workload("after-restart", "team-b", cpu="100m", memory="1Mi")])
        assert more.status_code == 201
        wait_until(lambda: admin.get("/v1/workloads/team-b/after-restart").json()["status"]["phase"] == "Bound",
                   timeout=30, what="a binding after the restart")  # fmt: skip
        # The rebuilt state equals the state computed from the stored bindings, node by node.
        expected = state_from_store(store)
        for row in admin.get("/v1/nodes").json()["items"]:
            name = row["metadata"]["name"]
            served = row["status"]["allocation"]
            held = sorted(b.workload for b in expected.bindings_on(name))
            assert served["workloads"] == held, name
            i = expected.index[name]
            for resource, amounts in served["resources"].items():
                assert amounts["used"] == int(expected.used_of(resource)[i]), (name, resource)
    finally:
        restarted.stop()
        store.close()


def test_two_replicas_one_leader_and_handover(tmp_path: Path) -> None:
    if not PG_URL:
        if REQUIRE_PG:
            pytest.fail("FINESCHED_REQUIRE_PG=1 but FINESCHED_TEST_PG_URL is not set")
        pytest.skip("needs PostgreSQL (FINESCHED_TEST_PG_URL)")
    ttl = 3.0
    with fresh_database("postgres", tmp_path) as db:
        store = Store.open(db)
        first = ServerProcess(db, None, "--lease-ttl", str(ttl), log=tmp_path / "a.log").start()
        wait_until(first.is_leader, what="the first replica to lead")
        second = ServerProcess(db, None, "--lease-ttl", str(ttl), log=tmp_path / "b.log").start()
        try:
            time.sleep(ttl)
            assert first.is_leader() and not second.is_leader()  # only the lease holder schedules
            via_follower = admin_client(second, store)
            register_nodes(via_follower, 2)
            assert via_follower.post("/v1/workloads", json=[workload("one")]).status_code == 201
            wait_until(lambda: via_follower.get("/v1/workloads/team-a/one").json()["status"]["phase"] == "Bound",
                       what="the leader to bind work submitted to the follower")  # fmt: skip
            first.kill()
            killed_at = time.monotonic()
            wait_until(second.is_leader, timeout=ttl * 3, what="the follower to take over")
            handover = time.monotonic() - killed_at
            assert handover <= ttl + ttl / 3 + 2.0, handover  # expiry + one renewal period + slack
            assert via_follower.post("/v1/workloads", json=[workload("two")]).status_code == 201
            wait_until(lambda: via_follower.get("/v1/workloads/team-a/two").json()["status"]["phase"] == "Bound",
                       what="the new leader to bind")  # fmt: skip
            state_from_store(store)
        finally:
            first.stop()
            second.stop()
            store.close()
