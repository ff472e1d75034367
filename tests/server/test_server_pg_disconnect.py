"""PostgreSQL connections ended by the server (pg_terminate_backend, as a restart or an idle timeout
would) are replaced when the pool hands them out (server/store/db.py `_postgres_engine`): the next
read, write and request succeed. The pool does not ping every checkout; a connection the server
ended has something to read on its socket, and one idle for PING_IDLE_S is pinged. Both ways are
tested on a real PostgreSQL server (skipped without FINESCHED_TEST_PG_URL)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from manifests import node, tenant, workload
from server_harness import PG_URL, REQUIRE_PG, fresh_database, inprocess_server

from finesched.server.loop.loop import LoopConfig
from finesched.server.store import db
from finesched.server.store.store import Store


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    if not PG_URL:
        if REQUIRE_PG:
            pytest.fail("FINESCHED_REQUIRE_PG=1 but FINESCHED_TEST_PG_URL is not set")
        pytest.skip("no PostgreSQL server (set FINESCHED_TEST_PG_URL, see scripts/with-postgres.sh)")
    with fresh_database("postgres", tmp_path) as url:
        yield url


def _backends(url: str) -> set[int]:
    """The server processes serving connections to `url`'s database (but the asking one)."""
    admin = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        return {pid for (pid,) in conn.execute(query, (url.rsplit("/", 1)[1],))}


def _terminate_all(url: str) -> set[int]:
    """End every connection to `url`'s database from the server's side and wait until they are gone."""
    pids = _backends(url)
    assert pids, "the store holds pooled connections"
    admin = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 30
    while _backends(url) & pids:
        assert time.monotonic() < deadline, "the terminated backends did not exit"
        time.sleep(0.05)
    return pids


@pytest.mark.parametrize("ping_idle_s", [3600.0, 0.0], ids=["socket-check", "idle-ping"])
def test_a_store_reads_and_writes_after_its_pooled_connections_were_terminated(
    pg_url: str, ping_idle_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """socket-check: no connection is idle long enough to be pinged, so only the socket tells it is
    gone; idle-ping: every checkout pings. The pool keeps several connections; all are ended."""
    monkeypatch.setattr(db, "PING_IDLE_S", ping_idle_s)
    store = Store.open(pg_url)
    try:
        with store.read() as r1, store.read() as r2, store.read() as r3:  # three pooled connections
            for conn in (r1, r2, r3):
                conn.exec_driver_sql("SELECT 1")
        store.put_tenant("team-a", 1.0, tenant("team-a"), create_only=True)
        ended = _terminate_all(pg_url)
        assert [row["name"] for row in store.list_tenants()] == ["team-a"]
        ids, _ = store.submit([("team-a", "w1", "team-a", workload("w1"))])
        assert len(ids) == 1
        assert [row["name"] for row in store.list_workloads()] == ["w1"]
        assert _backends(pg_url).isdisjoint(ended), "the ended connections were replaced, not reused"
    finally:
        store.close()


def test_the_server_answers_after_its_database_connections_were_terminated(pg_url: str) -> None:
    """A running server (its request pool, the scheduling loop's connections): every connection is
    ended; the next submission is stored and bound, and reads answer."""
    with inprocess_server(pg_url, LoopConfig(idle_wait_s=0.05, lease_ttl_s=5.0)) as api:
        api.admin.put("/v1/nodes/n1", json=node("n1")).raise_for_status()
        assert api.admin.post("/v1/workloads", json=workload("before")).status_code == 201
        api.wait_phase("team-a/before", ("Bound",))
        _terminate_all(pg_url)
        answer = api.admin.post("/v1/workloads", json=workload("after"))
        assert answer.status_code == 201, answer.text
        assert api.wait_phase("team-a/after", ("Bound",))["status"]["binding"]["node"] == "n1"
        names = {item["metadata"]["name"] for item in api.admin.get("/v1/workloads").json()["items"]}
        assert names == {"before", "after"}
