"""Group commit of concurrent submissions (server/api/group_commit.py, Store.submit_group): a group
answers each request as if it had been written alone in arrival order; a refused one (bad input,
another tenant's namespace, a name taken, a quota reached) changes nothing and leaves the others
of its group as they are. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
from fastapi import HTTPException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manifests import node, workload
from server_harness import Api
from test_server_quota import limited

from finesched.server.api.auth import ADMIN, TENANT, Identity
from finesched.server.api.group_commit import Pending
from finesched.server.api.quota import Charge, QuotaExceeded, charge_all
from finesched.server.api.routes_workloads import _submit_group
from finesched.server.store.schema import new_uid
from finesched.server.store.store import PENDING, Conflict, Store
from finesched.server.store.views import InputError

ADMIN_CALLER = Identity(ADMIN)


def _group(*bodies: tuple[Any, Identity]) -> list[Pending[tuple[Any, Identity]]]:
    loop = asyncio.new_event_loop()
    try:
        return [Pending(body, loop.create_future()) for body in bodies]
    finally:
        loop.close()


def _stored(store: Store) -> set[str]:
    return {f"{r['namespace']}/{r['name']}" for r in store.list_workloads()}


def test_a_refused_submission_in_a_group_changes_nothing_and_the_others_are_stored(api: Api) -> None:
    """One group (what concurrent requests make): two good submissions among one of each refusal."""
    api.admin.put("/v1/tenants/team-a", json=limited("team-a", workloads=100)).raise_for_status()
    api.admin.put("/v1/tenants/team-b", json=limited("team-b", workloads=1)).raise_for_status()
    api.admin.put("/v1/nodes/n1", json=node("n1")).raise_for_status()
    assert api.admin.post("/v1/workloads", json=workload("taken")).status_code == 201
    assert api.admin.post("/v1/workloads", json=workload("b0", "team-b")).status_code == 201
    before = _stored(api.store)
    events_before = len(api.admin.get("/v1/events", params={"kind": "Workload", "limit": 500}).json()["items"])
    bad = workload("bad")
    bad["spec"]["requests"]["cpu"] = "-1"
    group = _group(
        (workload("g1"), ADMIN_CALLER),
        (bad, ADMIN_CALLER),  # 422
        (workload("b1", "team-b"), ADMIN_CALLER),  # over team-b's quota: 403
        (workload("taken"), ADMIN_CALLER),  # stored before: 409
        (workload("g1"), ADMIN_CALLER),  # taken by the first of this group: 409
        (workload("x", "team-b"), Identity(TENANT, "team-a")),  # another tenant's namespace: 403
        ([workload("g2"), workload("g3")], ADMIN_CALLER),
    )
    ctx = api.app.state.ctx
    _submit_group(ctx, group)
    errors = [p.error for p in group]
    assert errors[0] is None and errors[6] is None
    assert isinstance(errors[1], InputError) and errors[1].details[0]["loc"][:3] == ["body", "spec", "requests"]
    assert isinstance(errors[2], HTTPException) and errors[2].status_code == 403
    assert errors[2].detail == (
        "exceeded quota: tenant team-b, requested: workloads=1, used: workloads=1, limited: workloads=1"
    )
    assert isinstance(errors[3], HTTPException) and errors[3].status_code == 409
    assert errors[3].detail == "workload team-a/taken already exists"
    assert isinstance(errors[4], HTTPException) and errors[4].status_code == 409
    assert errors[4].detail == "workload team-a/g1 already exists"
    assert isinstance(errors[5], HTTPException) and errors[5].status_code == 403
    assert [i["metadata"]["name"] for i in group[0].answer["items"]] == ["g1"]
    assert [i["metadata"]["name"] for i in group[6].answer["items"]] == ["g2", "g3"]
    assert all(i["status"]["phase"] == PENDING for p in (group[0], group[6]) for i in p.answer["items"])
    assert _stored(api.store) == before | {"team-a/g1", "team-a/g2", "team-a/g3"}
    for name in ("g1", "g2", "g3"):
        row = api.store.get_workload("team-a", name)
        answered = next(i for p in (group[0], group[6]) for i in p.answer["items"] if i["metadata"]["name"] == name)
        assert (row["id"], row["uid"]) == (answered["status"]["id"], answered["metadata"]["uid"])
    events = api.admin.get("/v1/events", params={"kind": "Workload", "limit": 500}).json()["items"]
    submitted = [e for e in events[events_before:] if e["reason"] == "Submitted"]
    assert sorted(e["object"] for e in submitted) == ["team-a/g1", "team-a/g2", "team-a/g3"]
    for name in ("g1", "g2", "g3"):  # handed to the loop by the group: bound without a reload
        api.wait_phase(f"team-a/{name}", ("Bound",))


def test_concurrent_posts_each_get_their_own_answer(api: Api) -> None:
    """Many clients at once, a few of them refused: every 201 is stored, every refusal stores nothing."""
    api.admin.put("/v1/tenants/team-b", json=limited("team-b", workloads=2)).raise_for_status()
    assert api.admin.post("/v1/workloads", json=workload("taken")).status_code == 201
    bad = workload("bad")
    bad["spec"]["requests"]["cpu"] = "lots"
    bodies = [workload(f"w{i}") for i in range(24)]
    bodies += [bad, workload("taken"), *(workload(f"b{i}", "team-b") for i in range(4))]
    barrier = threading.Barrier(len(bodies))
    statuses: dict[str, int] = {}

    def post(body: dict[str, Any]) -> None:
        with httpx.Client(base_url=api.base, headers=api.admin.headers, timeout=60) as client:
            barrier.wait(timeout=30)
            answer = client.post("/v1/workloads", json=body)
            statuses[f"{body['metadata']['namespace']}/{body['metadata']['name']}"] = answer.status_code

    threads = [threading.Thread(target=post, args=(b,)) for b in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert len(statuses) == len(bodies)
    assert all(statuses[f"team-a/w{i}"] == 201 for i in range(24)), statuses
    assert statuses["team-a/bad"] == 422 and statuses["team-a/taken"] == 409
    team_b = sorted(statuses[f"team-b/b{i}"] for i in range(4))
    assert team_b == [201, 201, 403, 403], statuses
    created = {key for key, status in statuses.items() if status == 201}
    assert _stored(api.store) == created | {"team-a/taken"}


# Store.submit_group against submitting one at a time ---------------------------------------------
NAMES = st.sampled_from(["a", "b", "c", "d"])
REQUEST = st.tuples(st.sampled_from(["team-a", "team-b"]), st.lists(NAMES, min_size=1, max_size=3))


def _outcomes(store: Store, requests: list[tuple[str, list[str]]], grouped: bool) -> list[str]:
    submissions = [([(ns, n, ns, workload(n, ns)) for n in names], [new_uid() for _ in names])
                   for ns, names in requests]  # fmt: skip

    def check(conn: Any, indexes: Any) -> None:
        per_tenant: dict[str, int] = {}
        for i in indexes:
            per_tenant[requests[i][0]] = per_tenant.get(requests[i][0], 0) + len(requests[i][1])
        charge_all(conn, {t: Charge(workloads=n, pending=n) for t, n in per_tenant.items()})

    if grouped:
        results = store.submit_group(submissions, check, refusals=(QuotaExceeded,))
    else:
        results = []
        for i, (items, uids) in enumerate(submissions):
            try:
                results.append(store.submit(items, check=lambda conn, i=i: check(conn, [i]), uids=uids))
            except (Conflict, QuotaExceeded) as exc:
                results.append(exc)
    return [f"{type(r).__name__}: {r}" if isinstance(r, Exception) else f"stored {len(r[0])}" for r in results]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(REQUEST, min_size=1, max_size=6), stored_first=st.lists(NAMES, max_size=2, unique=True))
def test_a_group_answers_as_its_requests_one_at_a_time(
    requests: list[tuple[str, list[str]]], stored_first: list[str]
) -> None:
    """Same answers (stored, or the same Conflict / quota message) and the same rows whether a group
    is written together or each of its requests alone, in order (team-b may hold 3 workloads)."""
    with tempfile.TemporaryDirectory() as tmp:
        found = []
        for grouped in (False, True):
            store = Store.open(f"sqlite:///{Path(tmp) / f'{grouped}.db'}")
            try:
                store.put_tenant("team-b", 1.0, limited("team-b", workloads=3), create_only=True)
                if stored_first:
                    store.submit([("team-a", n, "team-a", workload(n)) for n in stored_first])
                outcome = _outcomes(store, requests, grouped)
                found.append((outcome, sorted(_stored(store))))
            finally:
                store.close()
    assert found[0] == found[1]
