"""Object identity on the control plane: every stored object has a server-given `metadata.uid`,
read-only and kept across restarts; events belong to it; migration 0004 gives existing rows one.
Also: a placement backoff is never taken for a restart, and the phases a job shows."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from manifests import API, node, priority_class, tenant, workload
from server_harness import Api, inprocess_server, wait_until
from sqlalchemy import create_engine, select
from test_server_lifecycle import fast, start, status, unacked  # noqa: F401 - `fast` is a fixture

from finesched.server.loop import lifecycle
from finesched.server.store import schema as t
from finesched.server.store.job_status import job_phase
from finesched.server.store.migrate import upgrade
from finesched.server.store.store import now

OTHER = "0f8fad5b-d9cb-469f-a165-70867728950e"
OBJECTS = [  # (create path, object path, manifest)
    ("/v1/nodes", "/v1/nodes/n9", node("n9")),
    ("/v1/tenants", "/v1/tenants/t9", tenant("t9")),
    ("/v1/priorityclasses", "/v1/priorityclasses/p9", priority_class("p9", 10)),
    ("/v1/topologies", "/v1/topologies/t9", {"apiVersion": API, "kind": "Topology", "metadata": {"name": "t9"},
                                             "spec": {"levels": [{"nodeLabel": "topology.finesched.io/rack"}]}}),
]  # fmt: skip


def _uid(doc: dict[str, Any]) -> str:
    return str(doc["metadata"]["uid"])


def _with_uid(manifest: dict[str, Any], uid: str) -> dict[str, Any]:
    return {**manifest, "metadata": {**manifest["metadata"], "uid": uid}}


@pytest.mark.parametrize(("create", "path", "manifest"), OBJECTS)
def test_uids_are_given_by_the_server_and_read_only(api: Api, create: str, path: str, manifest: dict) -> None:
    # a create ignores a uid the client sends (Kubernetes overwrites it): the server gives its own
    made = api.admin.post(create, json=_with_uid(manifest, OTHER))
    assert made.status_code == 201, made.text
    uid = _uid(made.json())
    assert uid != OTHER and str(uuid.UUID(uid)) == uid and _uid(api.admin.get(path).json()) == uid
    # a replace that names another object is refused, and changes nothing
    refused = api.admin.put(path, json=_with_uid(manifest, OTHER))
    assert refused.status_code == 409 and uid in refused.json()["detail"] and OTHER in refused.json()["detail"]
    # the object's own uid, or none: replaced, the uid kept
    assert api.admin.put(path, json=_with_uid(manifest, uid)).status_code == 200
    assert api.admin.put(path, json=manifest).status_code == 200
    assert _uid(api.admin.get(path).json()) == uid
    bad = api.admin.put(path, json=_with_uid(manifest, "not-a-uid"))
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "metadata", "uid"]
    # deleted and created again: another object
    assert api.admin.delete(path).status_code == 200
    again = api.admin.post(create, json=manifest)
    assert again.status_code == 201 and _uid(again.json()) != uid
    events = api.admin.get("/v1/events", params={"object": path.rsplit("/", 1)[1]}).json()["items"]
    assert {e["uid"] for e in events} == {uid, _uid(again.json())}
    only_new = api.admin.get("/v1/events", params={"object": path.rsplit("/", 1)[1], "uid": _uid(again.json())})
    assert [e["reason"] for e in only_new.json()["items"]] in (["Registered"], ["Created"])


def test_workload_and_job_uids_and_their_events(api: Api) -> None:
    made = api.admin.post("/v1/workloads", json=_with_uid(workload("w"), OTHER))
    uid = _uid(made.json()["items"][0])
    assert uid != OTHER and _uid(api.admin.get("/v1/workloads/team-a/w").json()) == uid
    listed = api.admin.get("/v1/workloads", params={"namespace": "team-a"}).json()["items"]
    assert [_uid(w) for w in listed] == [uid]
    assert api.admin.delete("/v1/workloads/team-a/w").status_code == 200
    second = _uid(api.admin.post("/v1/workloads", json=workload("w")).json()["items"][0])
    assert second != uid
    mine = api.admin.get("/v1/events", params={"kind": "Workload", "object": "team-a/w", "uid": second}).json()
    assert mine["items"] and all(e["uid"] == second for e in mine["items"])
    assert mine["items"][0]["reason"] == "Submitted"
    bad = api.admin.get("/v1/events", params={"uid": "x"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "uid"]


def test_uids_stay_across_a_server_restart(db_url: str) -> None:
    with inprocess_server(db_url) as api:
        api.admin.post("/v1/nodes", json=node("n1"))
        api.admin.post("/v1/workloads", json=workload("w"))
        before = {path: _uid(api.admin.get(path).json()) for path in
                  ("/v1/nodes/n1", "/v1/workloads/team-a/w", "/v1/tenants/team-a")}  # fmt: skip
    with inprocess_server(db_url, tenants=()) as api:
        after = {path: _uid(api.admin.get(path).json()) for path in before}
        binding = api.admin.get("/v1/bindings/team-a/w")
    assert after == before and len(set(before.values())) == 3
    assert binding.status_code == 200 and binding.json()["uid"] == before["/v1/workloads/team-a/w"]


def old_table(table_name: str, /, **values: Any) -> Any:
    """An insert of `values` into a table naming only these columns (typed as schema.py types them)."""
    table = sa.table(table_name, *[sa.column(c, t.metadata.tables[table_name].c[c].type) for c in values])
    return sa.insert(table).values(**values)


def test_migration_0004_gives_existing_rows_uids_and_their_events(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0003")
    stamp = now()
    earlier, later = stamp - timedelta(hours=1), stamp + timedelta(seconds=1)

    def row(name: str, **values: Any) -> dict[str, Any]:
        return {"namespace": "a", "name": name, "tenant": "a", "spec": {}, "phase": "Pending", "reason": "",
                "version": 1, "created": stamp, "updated": stamp, "not_before": None, **values}  # fmt: skip

    with engine.begin() as conn:  # rows as version 0003 wrote them (no uid, no restart_at)
        conn.execute(old_table("nodes", name="n1", spec={}, cordoned=False, ready=True, version=1, created=stamp))
        conn.execute(old_table("tenants", name="a", weight=1.0, spec={}, version=1))
        for values in (
            row("w"),
            row("restarting", phase="Bound", reason="back-off 2s restarting failed process", not_before=later),
            row("rejected", phase="Bound", not_before=earlier),
        ):
            conn.execute(old_table("workloads", **values))
        history = [(earlier, "Workload", "a/w", "Deleted"), (later, "Workload", "a/w", "Submitted"),
                   (earlier, "Tenant", "a", "Created")]  # fmt: skip
        for when, kind, obj, reason in history:
            conn.execute(old_table("events", time=when, kind=kind, object=obj, reason=reason, message="", count=1))
    upgrade(engine)
    with engine.connect() as conn:
        uids = {r.name: r.uid for r in conn.execute(select(t.workloads.c.name, t.workloads.c.uid))}
        node_uid = conn.execute(select(t.nodes.c.uid)).scalar_one()
        tenant_uid = conn.execute(select(t.tenants.c.uid)).scalar_one()
        tagged = {(r.object, r.reason): r.uid for r in conn.execute(select(t.events))}
        w = t.workloads.c
        times = {r.name: (r.not_before, r.restart_at) for r in conn.execute(select(w.name, w.not_before, w.restart_at))}
    engine.dispose()
    every = [*uids.values(), node_uid, tenant_uid]
    assert len(set(every)) == len(every) and all(str(uuid.UUID(u)) == u for u in every)
    # an event before the object's creation was an earlier object's: no uid, not this one's history
    assert tagged == {("a/w", "Deleted"): None, ("a/w", "Submitted"): uids["w"], ("a", "Created"): tenant_uid}
    assert times["restarting"][0] is None and times["restarting"][1] is not None  # a restart in place
    assert times["rejected"][0] is not None and times["rejected"][1] is None  # a placement backoff only
    assert times["w"] == (None, None)


def test_a_workload_placed_again_after_a_rejection_is_not_restarted(fast: Api) -> None:  # noqa: F811
    """The stray "Restarting": a rejected workload of restartPolicy Never, placed again, is never
    taken for one to restart in place (its placement backoff is not a restart time)."""
    fast.admin.post("/v1/nodes", json=node("n1"))
    agent = fast.client(fast.token("agent", node="n1"))
    fast.admin.post("/v1/workloads", json=workload("once", command=["true"]))
    wait_until(lambda: unacked(agent, "team-a/once"), what="the binding")
    assert agent.post("/v1/bindings/team-a/once/reject", json={"reason": "not now"}).status_code == 200
    wait_until(lambda: unacked(agent, "team-a/once"), what="the binding after the backoff")
    assert lifecycle.start_due_restarts(fast.store) == []  # what the leader runs every second
    start(agent, "team-a/once")
    assert status(fast, "team-a/once")["phase"] == "Running"
    assert lifecycle.start_due_restarts(fast.store) == []
    reasons = [e["reason"] for e in fast.admin.get("/v1/events", params={"object": "team-a/once"}).json()["items"]]
    assert "Rejected" in " ".join(reasons) or "Requeued" in reasons
    assert "Restarting" not in reasons


def _slot(phase: str, restarting: bool = False) -> dict[str, Any]:
    return {"phase": phase, "restart_at": now() if restarting else None}


@pytest.mark.parametrize(
    ("stored", "slots", "shown"),
    [
        ("Active", ["Pending", "Pending"], "Pending"),  # waiting for room
        ("Active", ["Bound", "Bound"], "Starting"),  # placed; the agents start them
        ("Active", ["Bound", "Pending"], "Starting"),
        ("Active", ["Running", "Bound"], "Running"),
        ("Active", ["Running", "Running"], "Running"),
        ("Active", ["Succeeded", "Running"], "Running"),
        ("Active", ["Succeeded", "Bound"], "Starting"),
        ("Active", [("Bound", True), "Running"], "Restarting"),
        ("Active", [("Pending", True), "Running"], "Restarting"),
        ("Succeeded", ["Succeeded", "Succeeded"], "Succeeded"),
        ("Failed", ["Failed", "Running"], "Failed"),
    ],
)
def test_job_phases(stored: str, slots: list[Any], shown: str) -> None:
    made = [_slot(*s) if isinstance(s, tuple) else _slot(s) for s in slots]
    assert job_phase({"phase": stored}, made) == shown
