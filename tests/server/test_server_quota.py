"""Per-tenant object quotas (Tenant.spec.limits): what is counted, the 403 and its message, nothing
stored when refused, and two concurrent submissions that cannot both pass, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from manifests import API, node, workload
from server_harness import Api

from finesched.model.manifest import read_documents
from finesched.server.api.quota import Charge, QuotaExceeded, charge, charge_all
from finesched.server.store.store import Store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def limited(name: str, **limits: int) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Tenant", "metadata": {"name": name}, "spec": {"limits": limits}}


def put_limits(api: Api, name: str, **limits: int) -> None:
    answer = api.admin.put(f"/v1/tenants/{name}", json=limited(name, **limits))
    assert answer.status_code == 200, answer.text


def submit(api: Api, *names: str, namespace: str = "team-a", **spec: Any) -> Any:
    return api.admin.post("/v1/workloads", json=[workload(n, namespace, **spec) for n in names])


def count(api: Api, namespace: str = "team-a") -> int:
    return len(api.admin.get("/v1/workloads", params={"namespace": namespace}).json()["items"])


CASES = [
    # (limits, already submitted, then submitted, refused?, message part)
    ({"workloads": 3}, 2, 1, False, None),
    ({"workloads": 3}, 2, 2, True, "requested: workloads=2, used: workloads=2, limited: workloads=3"),
    ({"workloads": 0}, 0, 1, True, "requested: workloads=1, used: workloads=0, limited: workloads=0"),
    ({"pending": 2}, 2, 1, True, "requested: pending=1, used: pending=2, limited: pending=2"),
    ({"pending": 5, "workloads": 4}, 3, 2, True, "requested: workloads=2, used: workloads=3, limited: workloads=4"),
    ({"pending": 4, "workloads": 4}, 3, 2, True, "requested: pending=2,workloads=2, used: pending=3,workloads=3"),
    ({"jobs": 0}, 3, 3, False, None),  # a jobs limit does not count workloads
]


@pytest.mark.parametrize(("limits", "before", "then", "refused", "message"), CASES)
def test_workload_limits_table(
    api: Api, limits: dict[str, int], before: int, then: int, refused: bool, message: str | None
) -> None:
    put_limits(api, "team-a", **limits)
    if before:
        assert submit(api, *(f"w{i}" for i in range(before)), cpu="1000").status_code == 201  # fits nowhere: Pending
    answer = submit(api, *(f"x{i}" for i in range(then)), cpu="1000")
    if not refused:
        assert answer.status_code == 201, answer.text
        assert count(api) == before + then
        return
    assert answer.status_code == 403, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith("exceeded quota: tenant team-a, ") and message in detail
    assert count(api) == before  # refused whole: nothing of it stored
    assert submit(api, "other", namespace="team-b", cpu="1000").status_code == 201  # another tenant is not limited


def test_bound_workloads_count_against_workloads_but_not_pending(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="8"))
    put_limits(api, "team-a", workloads=3, pending=1)
    assert submit(api, "a").status_code == 201
    api.wait_phase("team-a/a", ("Bound",))
    assert submit(api, "b").status_code == 201  # a was bound: one Pending now
    api.wait_phase("team-a/b", ("Bound",))
    refused = submit(api, "c", "d")
    assert refused.status_code == 403 and "used: pending=0,workloads=2" in refused.json()["detail"]
    assert submit(api, "c").status_code == 201
    api.wait_phase("team-a/c", ("Bound",))
    assert submit(api, "e").status_code == 403  # 3 held, whatever their phase
    assert api.admin.delete("/v1/workloads/team-a/a").status_code == 200
    assert submit(api, "e").status_code == 201  # a deleted workload frees its count


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_jobs_limit_and_a_jobs_slots_count_as_workloads(api: Api) -> None:
    (job,) = read_documents(EXAMPLES / "streaming-etl.yaml")  # 4 slots in namespace analytics
    assert api.admin.post("/v1/tenants", json=limited("analytics", jobs=1, workloads=5)).status_code == 201
    answer = api.admin.post("/v1/jobs", json=job)
    assert answer.status_code == 201, answer.text
    second = dict(job, metadata={**job["metadata"], "name": "etl-2"})
    refused = api.admin.post("/v1/jobs", json=second)
    assert refused.status_code == 403
    assert (
        "requested: jobs=1,workloads=4, used: jobs=1,workloads=4, limited: jobs=1,workloads=5"
        in refused.json()["detail"]
    )
    assert len(api.admin.get("/v1/jobs").json()["items"]) == 1
    api.admin.put("/v1/tenants/analytics", json=limited("analytics", jobs=2, workloads=8))
    assert api.admin.post("/v1/jobs", json=second).status_code == 201


def test_limits_are_validated(api: Api) -> None:
    answer = api.admin.put("/v1/tenants/team-a", json=limited("team-a", workloads=-1))
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][-2:] == ["limits", "workloads"]


def test_concurrent_submissions_cannot_both_pass_a_limit(store: Store) -> None:
    """Two writers, each asking for 3 of the 4 workloads left: whichever counts second sees the
    first's rows (the tenant row is locked on PostgreSQL, the writer is exclusive on SQLite)."""
    store.put_tenant("team-a", 1.0, limited("team-a", workloads=4), create_only=True)
    doc = workload("x")
    barrier = threading.Barrier(2)
    outcome: dict[str, str] = {}

    def submit_three(prefix: str) -> None:
        items = [("team-a", f"{prefix}{i}", "team-a", doc) for i in range(3)]

        def check(conn: Any) -> None:
            barrier.wait(timeout=10)  # both transactions are open before either counts
            charge_all(conn, {"team-a": Charge(workloads=3, pending=3)})

        try:
            store.submit(items, check=check)
            outcome[prefix] = "stored"
        except QuotaExceeded as exc:
            outcome[prefix] = str(exc)
        except threading.BrokenBarrierError:
            outcome[prefix] = "waited"  # SQLite: the other writer held the only write lock; counted after it

    if store.engines.is_sqlite:  # one writer at a time: the second waits for the first to commit
        barrier = threading.Barrier(1)
    threads = [threading.Thread(target=submit_three, args=(p,)) for p in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcome.values())[1] == "stored", outcome
    assert "used: workloads=3, limited: workloads=4" in sorted(outcome.values())[0], outcome
    assert len(store.list_workloads(tenant="team-a")) == 3


def test_charge_without_limits_or_tenant_row_passes(store: Store) -> None:
    store.put_tenant("team-a", 1.0, {"apiVersion": API, "kind": "Tenant", "metadata": {"name": "team-a"}},
                     create_only=True)  # fmt: skip
    with store.write() as conn:
        charge(conn, "team-a", Charge(workloads=10**6, pending=10**6, jobs=10**6))
        charge(conn, "no-such-tenant", Charge(workloads=1))
