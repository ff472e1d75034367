"""The store's transactions: optimistic versions, conflicts, the lease and its fence, migrations."""

from __future__ import annotations

import threading
import time

import pytest
from manifests import node, workload

from finesched.server.loop.lease import Lease, LostLease
from finesched.server.store.migrate import current_revision
from finesched.server.store.store import BOUND, PENDING, Conflict, NotFound, Store


def _submit(store: Store, *names: str) -> list[int]:
    ids, _ = store.submit([("team-a", n, "team-a", workload(n)) for n in names])
    return ids


def _binding(key: str, node_name: str = "n1") -> dict:
    return {"workload": key, "node": node_name, "requests": {"cpu": "1"}}


def test_schema_is_migrated_to_head(store: Store) -> None:
    assert current_revision(store.engines.writer) == "0005"


def test_two_writers_cannot_both_bind_one_workload(store: Store) -> None:
    (wid,) = _submit(store, "w")
    results: list[list[int]] = []

    def writer(node_name: str) -> None:
        conflicts, _ = store.bind([(wid, 1, "team-a/w", node_name, _binding("team-a/w", node_name))])
        results.append(conflicts)

    threads = [threading.Thread(target=writer, args=(f"n{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(len(c) for c in results) == [0, 1]  # exactly one writer won
    row = store.get_workload("team-a", "w")
    assert row["phase"] == BOUND and row["version"] == 2 and row["binding"]["node"] == row["node"]
    assert len(store.bindings()) == 1


def test_a_stale_version_is_a_conflict(store: Store) -> None:
    (wid,) = _submit(store, "w")
    store.set_phase("team-a/w", PENDING, "touched by another writer")  # version 1 -> 2
    conflicts, _ = store.bind([(wid, 1, "team-a/w", "n1", _binding("team-a/w"))])
    assert conflicts == [wid] and store.bindings() == []
    assert store.bind([(wid, 2, "team-a/w", "n1", _binding("team-a/w"))])[0] == []


def test_submit_is_all_or_nothing_and_names_the_duplicate(store: Store) -> None:
    _submit(store, "a")
    with pytest.raises(Conflict, match="team-a/a"):
        _submit(store, "b", "a")
    assert [r["name"] for r in store.list_workloads()] == ["a"]


def test_release_and_delete(store: Store) -> None:
    (wid,) = _submit(store, "w")
    store.bind([(wid, 1, "team-a/w", "n1", _binding("team-a/w"))])
    store.release("team-a/w", PENDING, "agent rejected it")
    row = store.get_workload("team-a", "w")
    assert row["phase"] == PENDING and row["binding"] is None and row["reason"] == "agent rejected it"
    with pytest.raises(NotFound):
        store.release("team-a/w", PENDING, "again")
    with pytest.raises(NotFound):
        store.delete_workload("team-a", "w", tenant="team-b")  # another tenant's: not visible
    store.delete_workload("team-a", "w", tenant="team-a")
    assert store.list_workloads() == []
    assert [e["reason"] for e in store.events(kind="Workload")] == ["Submitted", "Bound", "Requeued", "Deleted"]


def test_deleting_a_node_requeues_its_workloads(store: Store) -> None:
    store.put_node("n1", node("n1"), create_only=True)
    (wid,) = _submit(store, "w")
    store.bind([(wid, 1, "team-a/w", "n1", _binding("team-a/w"))])
    assert store.delete_node("n1") == ["team-a/w"]
    assert store.get_workload("team-a", "w")["phase"] == PENDING and store.bindings() == []


def test_lease_is_exclusive_and_fenced(store: Store) -> None:
    first, second = Lease(store, ttl_s=0.5, holder="a"), Lease(store, ttl_s=0.5, holder="b")
    assert first.try_acquire() and not second.try_acquire()
    assert first.try_acquire()  # renewal
    time.sleep(0.6)  # the holder stops renewing: the lease expires
    assert second.try_acquire() and second.version == 2
    (wid,) = _submit(store, "w")
    with pytest.raises(LostLease):  # the old holder may no longer write bindings
        store.bind([(wid, 1, "team-a/w", "n1", _binding("team-a/w"))], fence=first.fence)
    assert store.bindings() == []
    assert store.bind([(wid, 1, "team-a/w", "n1", _binding("team-a/w"))], fence=second.fence)[0] == []
    second.release()
    assert first.try_acquire()


def test_the_migrations_build_exactly_the_tables_the_code_declares(store: Store) -> None:
    """A column or index added to schema.py without its migration (or the other way round) fails here."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from finesched.server.store import schema

    with store.engines.writer.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), schema.metadata)
    assert differences == []
