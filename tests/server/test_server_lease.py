"""The scheduler lease across restarts: a replica's next life takes its own lease over at once, a
different replica still waits for the lease to expire, and a still-running old life is fenced out."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from manifests import node, workload
from server_harness import PG_URL, REQUIRE_PG, ServerProcess, fresh_database, store_tenants, wait_until

from finesched.server.api.auth import create_token
from finesched.server.loop.lease import Lease, LostLease, replica_identity, split_holder
from finesched.server.store.store import Store

LONG_TTL = 60.0  # far longer than any wait below: a takeover seen here did not wait for expiry


def test_a_new_life_takes_its_own_lease_at_once_and_fences_the_old_one(store: Store) -> None:
    old_life = Lease(store, ttl_s=LONG_TTL, holder="replica-a")
    assert old_life.try_acquire() and old_life.version == 1
    stranger = Lease(store, ttl_s=LONG_TTL, holder="replica-b")
    assert not stranger.try_acquire()  # another replica waits for the lease to expire
    new_life = Lease(store, ttl_s=LONG_TTL, holder="replica-a")  # the same replica, restarted
    assert new_life.try_acquire() and new_life.version == 2  # at once, with a new fencing version
    assert split_holder(new_life.holder)[0] == "replica-a" and new_life.holder != old_life.holder
    with pytest.raises(LostLease), store.write() as conn:  # the old life, if still running, cannot write
        old_life.fence(conn)
    # ... and does not take the lease back: it waits like any follower, so the two never alternate.
    assert not old_life.try_acquire() and not stranger.try_acquire()
    assert new_life.try_acquire() and new_life.version == 2  # renewal keeps the version
    with store.write() as conn:
        new_life.fence(conn)


def test_a_life_that_held_the_lease_waits_for_another_life_of_its_identity(store: Store) -> None:
    first = Lease(store, ttl_s=LONG_TTL, holder="replica-a")
    second = Lease(store, ttl_s=LONG_TTL, holder="replica-a")  # one identity started twice
    assert first.try_acquire()
    assert second.try_acquire()  # has never held it: the shortcut
    assert not first.try_acquire()  # has held it: no shortcut back
    assert second.try_acquire() and second.version == 2


def test_one_data_directory_is_one_live_replica(tmp_path: Path) -> None:
    first = replica_identity(tmp_path)
    assert first.name == replica_identity_name(tmp_path) and first.lock is not None
    second = replica_identity(tmp_path)  # the directory is locked by a live holder
    assert second.lock is None and second.name != first.name and "one-off" in second.source
    first.lock.close()  # the holder ends (the kernel drops the lock, even on SIGKILL)
    again = replica_identity(tmp_path)
    assert again.name == first.name and again.lock is not None
    again.lock.close()
    given = replica_identity(tmp_path / "other", "finesched-0")
    assert given.name == "finesched-0"
    assert given.lock is not None
    given.lock.close()


def replica_identity_name(data: Path) -> str:
    return (data / "replica-id").read_text().strip()


def _bound_after(base: str, token: str, name: str) -> None:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as admin:
        assert admin.post("/v1/workloads", json=workload(name, cpu="100m", memory="1Mi")).status_code == 201
        wait_until(lambda: admin.get(f"/v1/workloads/team-a/{name}").json()["status"]["phase"] == "Bound",
                   timeout=20, what=f"{name} bound")  # fmt: skip


def _lease(base: str) -> dict[str, object]:
    return httpx.get(f"{base}/readyz", timeout=5).json()["lease"]  # type: ignore[no-any-return]


def test_a_server_restarted_after_kill_9_schedules_at_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'fs.db'}"
    store = Store.open(db)
    token = create_token(store, "admin")
    store_tenants(store)  # team-a owns the namespace its workloads go to
    server = ServerProcess(db, None, "--lease-ttl", str(LONG_TTL), log=tmp_path / "a.log").start()
    try:
        wait_until(server.is_leader, what="leadership")
        httpx.post(f"{server.base}/v1/nodes", json=node("n1"), headers={"Authorization": f"Bearer {token}"})
        _bound_after(server.base, token, "before")
        before = _lease(server.base)
        server.kill()
        restarted = ServerProcess(db, server.port, "--lease-ttl", str(LONG_TTL), log=tmp_path / "b.log").start()
        try:
            wait_until(restarted.is_leader, timeout=20, what="the restarted server to lead (lease TTL 60 s)")
            after = _lease(restarted.base)
            assert after["version"] == int(before["version"]) + 1  # type: ignore[call-overload]
            assert split_holder(str(after["holder"]))[0] == split_holder(str(before["holder"]))[0]
            _bound_after(restarted.base, token, "after")
        finally:
            restarted.stop()
    finally:
        server.stop()
        store.close()


def test_a_restarted_leader_takes_over_at_once_while_the_follower_waits(tmp_path: Path) -> None:
    if not PG_URL:
        if REQUIRE_PG:
            pytest.fail("FINESCHED_REQUIRE_PG=1 but FINESCHED_TEST_PG_URL is not set")
        pytest.skip("needs PostgreSQL (FINESCHED_TEST_PG_URL)")
    ttl = ["--lease-ttl", str(LONG_TTL)]
    with fresh_database("postgres", tmp_path) as db:
        store = Store.open(db)
        token = create_token(store, "admin")
        store_tenants(store)  # team-a owns the namespace its workloads go to
        first = ServerProcess(db, None, *ttl, "--data", str(tmp_path / "a"), log=tmp_path / "a.log").start()
        wait_until(first.is_leader, what="the first replica to lead")
        second = ServerProcess(db, None, *ttl, "--data", str(tmp_path / "b"), log=tmp_path / "b.log").start()
        restarted = ServerProcess(db, first.port, *ttl, "--data", str(tmp_path / "a"), log=tmp_path / "a2.log")
        try:
            httpx.post(f"{first.base}/v1/nodes", json=node("n1"), headers={"Authorization": f"Bearer {token}"})
            _bound_after(second.base, token, "before")  # submitted to the follower, bound by the leader
            first.kill()
            time.sleep(1.0)
            assert not second.is_leader()  # a foreign lease: the follower waits for it to expire
            restarted.start()
            wait_until(restarted.is_leader, timeout=20, what="the restarted replica to lead (lease TTL 60 s)")
            assert not second.is_leader()
            _bound_after(second.base, token, "after")
        finally:
            for server in (first, second, restarted):
                server.stop()
            store.close()
