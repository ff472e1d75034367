"""POST /v1/jobs: a dataflow job compiled into a gang of slots, placed all or none."""

from __future__ import annotations

from pathlib import Path

import pytest
from manifests import node, tenant, workload
from server_harness import Api, wait_until

from finesched.model.manifest import read_documents

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_job_gang_waits_then_binds_all_slots_with_quotas(api: Api) -> None:
    (job,) = read_documents(EXAMPLES / "streaming-etl.yaml")
    assert api.admin.post("/v1/tenants", json=tenant("analytics")).status_code == 201  # owns its namespace
    api.admin.post("/v1/nodes", json=node("small", cpu="2", memory="4Gi"))
    answer = api.admin.post("/v1/jobs", json=job)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["job"] == "analytics/etl" and body["status"] == "Pending"
    slots = body["slots"]
    assert len(slots) == 4 and all(s["binding"] is None for s in slots)  # the seed's count: 4 slots, none placed
    assert any(s["quotas"] for s in slots)
    listed = api.admin.get("/v1/workloads", params={"job": "analytics/etl"}).json()["items"]
    assert {i["status"]["phase"] for i in listed} == {"Pending"}  # no partial placement
    regions = api.admin.get("/v1/jobs/analytics/etl").json()["status"]["regions"]
    reasons = [slot["reason"] for region in regions for slot in region["slots"]]
    assert len(reasons) == 4 and all(reasons), reasons  # a Pending slot always says why
    api.admin.post("/v1/nodes", json=node("big", cpu="64", memory="256Gi"))
    wait_until(lambda: {i["status"]["phase"] for i in api.admin.get("/v1/workloads", params={"job": "analytics/etl"})
                        .json()["items"]} == {"Bound"}, what="the whole gang")  # fmt: skip
    again = api.admin.post("/v1/jobs", json=job)
    assert again.status_code == 409


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_job_that_fits_is_bound_at_once_and_bad_jobs_are_refused(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("big", cpu="64", memory="256Gi"))
    (job,) = read_documents(EXAMPLES / "batch-shuffle.yaml")
    body = api.admin.post("/v1/jobs", json=job).json()
    assert body["status"] == "Bound" and all(s["binding"]["node"] == "big" for s in body["slots"])
    bad = dict(job, metadata={"name": "cyclic", "namespace": "x"})
    tasks = job["spec"]["tasks"]
    back_edge = {"from": tasks[-1]["id"], "to": tasks[0]["id"]}  # closes a cycle
    bad["spec"] = dict(job["spec"], edges=[*job["spec"].get("edges", []), back_edge])
    answer = api.admin.post("/v1/jobs", json=bad)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"][0] == "body"
    assert api.admin.get("/v1/workloads", params={"namespace": "x"}).json()["items"] == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_job_over_its_tenants_max_now_waits_for_room_and_binds_after_a_release(api: Api) -> None:
    """A Job's slots are placed at once when they fit, but never past their tenant's `max`: they wait
    in the queue, as any workload does, until a release makes room."""
    from finesched.dataflow import compile_job, gang_workloads
    from finesched.model.manifest import parse_manifest

    (job,) = read_documents(EXAMPLES / "streaming-etl.yaml")
    parsed = parse_manifest(job)
    slots_cpu = sum(w.requests["cpu"] for w in gang_workloads(parsed, compile_job(parsed)))
    cap = f"{slots_cpu + 1000}m"  # room for the whole job, but not beside a 2-cpu workload
    capped = {**tenant("analytics"), "spec": {"max": {"cpu": cap}}}
    assert api.admin.post("/v1/tenants", json=capped).status_code == 201
    api.admin.post("/v1/nodes", json=node("big", cpu="64", memory="256Gi"))
    holder = workload("holder", "analytics", cpu="2")
    assert api.admin.post("/v1/workloads", json=holder).status_code == 201
    wait_until(lambda: api.admin.get("/v1/workloads/analytics/holder").json()["status"]["phase"] == "Bound",
               what="the holder")  # fmt: skip
    answer = api.admin.post("/v1/jobs", json=job)
    assert answer.status_code == 201, answer.text
    assert answer.json()["status"] == "Pending"  # the node has room; the tenant's max has not
    listed = api.admin.get("/v1/workloads", params={"job": "analytics/etl"}).json()["items"]
    assert {i["status"]["phase"] for i in listed} == {"Pending"}
    assert api.admin.delete("/v1/workloads/analytics/holder").status_code == 200
    wait_until(lambda: {i["status"]["phase"] for i in api.admin.get("/v1/workloads", params={"job": "analytics/etl"})
                        .json()["items"]} == {"Bound"}, what="the whole gang after the release")  # fmt: skip
