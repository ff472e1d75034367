"""One tenant can never stop the cluster: admission at every door, DNS-1123 names, namespaces owned by
tenants, poison isolation in the scheduling loop, bounded numbers and a truthful API description.

Each test is the regression test of one symptom; "old data" (stored by a version without today's
rules) is written straight into the store, as that version would have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from manifests import node, tenant, workload
from server_harness import Api, inprocess_server, wait_until

from finesched.model.binding import Binding
from finesched.model.manifest import API_VERSION
from finesched.model.resources import ResourceVector
from finesched.sched.scheduler import Scheduler
from finesched.server.loop.loop import LoopConfig, SchedulerLoop
from finesched.server.store.store import Store

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def problems(answer: httpx.Response) -> dict[str, str]:
    """{"spec.requests": msg, ...} of a 422 answer; every problem carries the schema's `type`."""
    assert answer.status_code == 422, answer.text
    assert all({"loc", "msg", "type"} <= set(d) for d in answer.json()["detail"])
    return {".".join(str(p) for p in d["loc"][1:]): d["msg"] for d in answer.json()["detail"]}


def events(api: Api, obj: str) -> list[str]:
    return [e["reason"] for e in api.admin.get("/v1/events", params={"object": obj}).json()["items"]]


def stored_workloads(api: Api) -> list[str]:
    items = api.admin.get("/v1/workloads").json()["items"]
    return [f"{w['metadata']['namespace']}/{w['metadata']['name']}" for w in items]


def refused(api: Api, path: str, body: Any) -> dict[str, str]:
    """The problems of an admin POST that must be refused with 422."""
    return problems(api.admin.post(path, json=body))


def refused_raw(api: Api, path: str, text: str) -> dict[str, str]:
    return problems(api.admin.post(path, content=text, headers={"content-type": "application/json"}))


# 1. Admission: the same rules at every door, before anything is stored --------------------------------
def test_device_rules_and_references_are_checked_before_anything_is_stored(api: Api) -> None:
    alone = workload("g50", **{"requests": {"koordinator.sh/gpu-core": 50}})
    assert "invalid resource device requests" in refused(api, "/v1/workloads", alone)["spec.requests"]
    over = workload("g150", **{"requests": {"gpu-core": 150, "gpu-memory-ratio": 150}})
    assert "invalid resource unit" in refused(api, "/v1/workloads", [workload("ok"), over])["1.spec.requests"]
    orphan = workload("w", namespace="nowhere")
    assert "belongs to no tenant" in refused(api, "/v1/workloads", orphan)["metadata.namespace"]
    ghost = workload("w", tenant="ghost")
    assert "belongs to tenant team-a" in refused(api, "/v1/workloads", ghost)["spec.tenant"]
    assert stored_workloads(api) == []  # not even "ok": all or none
    missing = tenant("child") | {"spec": {"parent": "nobody"}}
    assert refused(api, "/v1/tenants", missing) == {"spec.parent": "tenant nobody does not exist"}
    assert api.admin.get("/v1/tenants/child").status_code == 404
    api.admin.put("/v1/tenants/team-a", json=tenant("team-a") | {"spec": {"parent": "team-b"}})
    cycle = api.admin.put("/v1/tenants/team-b", json=tenant("team-b") | {"spec": {"parent": "team-a"}})
    assert "makes a cycle" in problems(cycle)["spec.parent"]
    inverted = tenant("t") | {"spec": {"min": {"cpu": "4"}, "max": {"cpu": "2"}}}
    assert "is above max" in refused(api, "/v1/tenants", inverted)["spec.min.cpu"]
    assert "not a boolean" in refused(api, "/v1/offers", {"tenant": "team-a", "demand": {"x": False}})["demand.x"]
    assert "does not exist" in refused(api, "/v1/offers", {"tenant": "ghost", "demand": {"cpu": 1}})["tenant"]
    job = {"apiVersion": API_VERSION, "kind": "Job", "metadata": {"name": "j", "namespace": "nowhere"},
           "spec": {"tasks": [{"id": "t", "operators": [{"id": "o"}]}]}}  # fmt: skip
    assert "metadata.namespace" in refused(api, "/v1/jobs", job)
    assert "spec.allocatable.cpu" in refused(api, "/v1/nodes", node("n1", cpu="9e15"))
    assert api.admin.get("/v1/nodes").json()["items"] == []


# 2. Names as Kubernetes has them; old names stay readable and deletable ---------------------------------
def test_names_follow_dns_1123_at_every_door(api: Api) -> None:
    long = refused(api, "/v1/workloads", workload("w" * 300))["metadata.name"]
    assert long.startswith("must be no more than 253 characters")
    assert "RFC 1123 subdomain" in refused(api, "/v1/workloads", workload("x/y"))["metadata.name"]
    assert "RFC 1123 label" in refused(api, "/v1/workloads", workload("w", namespace="Team_A"))["metadata.namespace"]
    assert "metadata.name" in refused(api, "/v1/nodes", node("GPU_0"))
    assert "metadata.name" in refused(api, "/v1/tenants", tenant("Team A"))
    assert stored_workloads(api) == []


@sqlite_only
def test_an_old_name_with_a_slash_can_be_read_and_deleted_and_releases_its_cpu(db_url: str, tmp_path: Path) -> None:
    store = Store.open(db_url)  # as an older version stored it: no name rule then
    doc = workload("x/y", cpu="2") | {"metadata": {"name": "x/y", "namespace": "team-a"}}
    store.submit([("team-a", "x/y", "team-a", doc)])
    store.close()
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05)) as api:
        api.admin.post("/v1/nodes", json=node("n1", cpu="2"))
        status = api.wait_phase("team-a/x/y", ("Rejected",))["status"]  # set aside, still readable
        assert "metadata.name" in status["reason"]
        api.admin.post("/v1/workloads", json=workload("fits", cpu="2"))
        api.wait_phase("team-a/fits", ("Bound",))  # nothing held for the old one
        assert api.admin.delete("/v1/workloads/team-a/x%2Fy").status_code == 200
        assert api.admin.get("/v1/workloads/team-a/x/y").status_code == 404


@sqlite_only
def test_an_old_bound_name_an_agent_cannot_use_is_released_and_set_aside(db_url: str) -> None:
    store = Store.open(db_url)  # an older version bound "team-a/x/y" to n1 (its agent cannot run it)
    store.put_node("n1", node("n1", cpu="2"), create_only=True)
    doc = workload("x/y", cpu="2") | {"metadata": {"name": "x/y", "namespace": "team-a"}}
    ((row_id,), _) = store.submit([("team-a", "x/y", "team-a", doc)])
    held = Binding(workload="team-a/x/y", node="n1", tenant="team-a", requests=ResourceVector({"cpu": 2000}))
    store.bind([(row_id, 1, "team-a/x/y", "n1", held.model_dump(mode="json", by_alias=True))])
    store.close()
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05)) as api:
        status = api.wait_phase("team-a/x/y", ("Rejected",))["status"]
        assert status["binding"] is None and status["reason"].startswith("set aside: its name breaks today's rules")
        assert "SetAside" in events(api, "team-a/x/y")
        api.admin.post("/v1/workloads", json=workload("fits", cpu="2"))
        api.wait_phase("team-a/fits", ("Bound",))  # its CPUs were given back


# 3. Namespaces belong to tenants ----------------------------------------------------------------------
def test_a_tenant_acts_only_in_its_namespaces_and_learns_nothing_of_others(api: Api) -> None:
    a = api.client(api.token("tenant", tenant="team-a"))
    b = api.client(api.token("tenant", tenant="team-b"))
    squat = workload("db", namespace="team-b", tenant="team-a")
    assert a.post("/v1/workloads", json=squat).status_code == 403
    assert b.post("/v1/workloads", json=workload("db", namespace="team-b")).status_code == 201
    exists, missing = a.get("/v1/workloads/team-b/db"), a.get("/v1/workloads/team-b/nothing-here")
    assert exists.status_code == missing.status_code == 403 and exists.json() == missing.json()  # no oracle
    assert a.delete("/v1/workloads/team-b/db").status_code == 403
    assert a.get("/v1/workloads", params={"namespace": "team-b"}).status_code == 403
    assert a.get("/v1/workloads").json()["items"] == []
    assert not [e for e in a.get("/v1/events").json()["items"] if e["object"].startswith("team-b/")]
    # an admin grants a second namespace to team-a: its token may use it, team-b's may not
    granted = api.admin.put("/v1/tenants/team-a", json=tenant("team-a") | {"spec": {"namespaces": ["shared"]}})
    assert granted.status_code == 200
    assert a.post("/v1/workloads", json=workload("w", namespace="shared")).status_code == 201
    assert api.admin.get("/v1/workloads/shared/w").json()["status"]["tenant"] == "team-a"
    assert b.get("/v1/workloads/shared/w").status_code == 403
    taken = api.admin.put("/v1/tenants/team-b", json=tenant("team-b") | {"spec": {"namespaces": ["shared"]}})
    assert problems(taken) == {"spec.namespaces.0": "belongs to tenant team-a"}
    ungrant = api.admin.put("/v1/tenants/team-a", json=tenant("team-a"))
    assert ungrant.status_code == 409 and "shared still holds workloads" in ungrant.json()["detail"]


# 4. Tenant DELETE; poison isolation ----------------------------------------------------------------------
def test_tenant_delete_is_refused_while_referenced(api: Api) -> None:
    api.admin.post("/v1/tenants", json=tenant("child") | {"spec": {"parent": "team-b"}})
    api.admin.post("/v1/workloads", json=workload("w"))
    assert "still has workloads" in api.admin.delete("/v1/tenants/team-a").json()["detail"]
    assert "parent of child" in api.admin.delete("/v1/tenants/team-b").json()["detail"]
    assert api.admin.delete("/v1/tenants/nobody").status_code == 404
    assert api.client(api.token("tenant", tenant="child")).delete("/v1/tenants/child").status_code == 403
    assert api.admin.delete("/v1/tenants/child").json() == {"deleted": "child"}
    assert api.admin.delete("/v1/workloads/team-a/w").status_code == 200
    assert api.admin.delete("/v1/tenants/team-a").status_code == 200
    assert api.admin.get("/v1/tenants/team-a").status_code == 404
    assert "Deleted" in events(api, "team-a")


def _old_data(store: Store) -> None:
    """What an older version let through: a tenant whose parent is gone, a node whose manifest no
    longer parses (and a workload named in a way today's rules refuse)."""
    store.put_tenant("orphan", 1.0, tenant("orphan") | {"spec": {"parent": "gone"}}, create_only=True)
    store.put_node("Bad_Node", node("Bad_Node") | {"metadata": {"name": "Bad_Node"}}, create_only=True)


@sqlite_only
def test_stored_poison_is_set_aside_at_start_and_everything_else_is_scheduled(db_url: str) -> None:
    store = Store.open(db_url)
    _old_data(store)
    store.close()
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05)) as api:
        api.admin.post("/v1/nodes", json=node("n1"))
        api.admin.post("/v1/workloads", json=workload("w"))
        api.wait_phase("team-a/w", ("Bound",))
        orphan = api.admin.get("/v1/tenants/orphan").json()["status"]["conditions"]
        assert orphan[0]["type"] == "SetAside" and "names no tenant" in orphan[0]["message"]
        bad = api.admin.get("/v1/nodes/Bad_Node").json()["status"]["conditions"]
        assert bad[0]["type"] == "SetAside" and "RFC 1123" in bad[0]["message"]
        assert "SetAside" in events(api, "orphan") and "SetAside" in events(api, "Bad_Node")
        assert api.admin.delete("/v1/nodes/Bad_Node").status_code == 200  # an admin can clean up
        assert api.admin.delete("/v1/tenants/orphan").status_code == 200


def test_poison_written_while_running_is_set_aside_without_rebuilding(api: Api, monkeypatch: Any) -> None:
    rebuilds = []
    original = SchedulerLoop.rebuild
    monkeypatch.setattr(SchedulerLoop, "rebuild", lambda self: (rebuilds.append(1), original(self))[1])
    api.admin.post("/v1/nodes", json=node("n1"))
    _old_data(api.store)  # by another writer: the loop learns of it through the change feed
    wait_until(lambda: "SetAside" in events(api, "orphan") and "SetAside" in events(api, "Bad_Node"), what="set aside")
    b = api.client(api.token("tenant", tenant="team-b"))
    assert b.post("/v1/workloads", json=workload("good", namespace="team-b")).status_code == 201
    api.wait_phase("team-b/good", ("Bound",))
    assert rebuilds == []


def test_a_workload_the_scheduler_raises_on_is_set_aside_alone(api: Api, monkeypatch: Any) -> None:
    original = Scheduler._run_unit

    def buggy(self: Scheduler, unit: Any) -> Any:  # a scheduler bug only this workload triggers
        if any(w.name == "poison" for w in unit.workloads):
            raise RuntimeError("index out of range")
        return original(self, unit)

    monkeypatch.setattr(Scheduler, "_run_unit", buggy)
    api.admin.post("/v1/nodes", json=node("n1"))
    api.admin.post("/v1/workloads", json=[workload("poison"), workload("good")])
    status = api.wait_phase("team-a/poison", ("Rejected",))["status"]
    assert status["reason"] == "set aside: the scheduler raised on it: RuntimeError('index out of range')"
    assert "SetAside" in events(api, "team-a/poison")
    api.wait_phase("team-a/good", ("Bound",))
    b = api.client(api.token("tenant", tenant="team-b"))
    b.post("/v1/workloads", json=workload("later", namespace="team-b"))
    api.wait_phase("team-b/later", ("Bound",))


# 5. Numbers and query parameters ------------------------------------------------------------------------
def test_numbers_and_parameters_are_bounded_never_a_500_or_a_null(api: Api) -> None:
    huge = tenant("huge") | {"spec": {"weight": "WEIGHT"}}
    weight = refused_raw(api, "/v1/tenants", json.dumps(huge).replace('"WEIGHT"', "1e400"))["spec.weight"]
    assert weight == "numbers must be finite: 1e400 is not (it overflows a double)"
    assert api.admin.get("/v1/tenants/huge").status_code == 404
    nan = '{"tenant": "team-a", "demand": {"cpu": 1}, "ttlSeconds": NaN}'
    assert refused_raw(api, "/v1/offers", nan)["ttlSeconds"].endswith("NaN is not (JSON has no NaN or Infinity)")
    listed = '[{"kind": "Workload"}, {"kind": "Workload", "spec": {"limits": {"memory": -Infinity}}}]'
    assert "-Infinity" in refused_raw(api, "/v1/workloads", listed)["1.spec.limits.memory"]
    assert refused_raw(api, "/v1/workloads", "[" * 100_000 + "]" * 100_000)[""] == "JSON nested too deeply"
    assert "spec.weight" in problems(api.admin.put("/v1/tenants/team-a", json=tenant("team-a", weight=1e-9)))
    assert "spec.priority" in refused(api, "/v1/workloads", workload("p", priority=10**30))
    assert "spec.requests.memory" in refused(api, "/v1/workloads", workload("m", memory="9Pi"))
    assert "since" in problems(api.admin.get("/v1/events", params={"since": str(10**30)}))
    assert "limit" in problems(api.admin.get("/v1/events", params={"limit": "NaN"}))
    watch = api.admin.get("/v1/events/watch", headers={"Last-Event-ID": str(10**30)})
    assert "Last-Event-ID" in problems(watch)
    assert "phase" in problems(api.admin.get("/v1/workloads", params={"phase": ""}))
    assert api.admin.get("/v1/tenants/team-a").json()["spec"].get("weight", 1.0) == 1.0  # unchanged


# 9. The API describes itself truly -------------------------------------------------------------------------
def test_errors_are_documented_and_5xx_is_counted(api: Api, monkeypatch: Any) -> None:
    schema = api.admin.get("/openapi.json").json()
    post = schema["paths"]["/v1/workloads"]["post"]
    assert {"201", "401", "403", "409", "413", "422", "503"} <= set(post["responses"])
    assert post["requestBody"]["content"]["application/json"]["schema"]["oneOf"][0]["$ref"].endswith("WorkloadManifest")
    assert post["security"] == [{"bearer": []}]
    assert "text/event-stream" in schema["paths"]["/v1/events/watch"]["get"]["responses"]["200"]["content"]
    options = api.admin.options("/v1/nodes/n1")
    assert options.status_code == 204 and options.headers["allow"] == "DELETE, GET, HEAD, OPTIONS, PUT"
    wrong = api.admin.patch("/v1/nodes/n1")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "DELETE, GET, HEAD, OPTIONS, PUT"
    garbled = api.admin.post("/v1/nodes", content=b"\xff\xfe{", headers={"content-type": "application/json"})
    assert garbled.status_code == 422 and garbled.json()["detail"][0]["type"] == "json_invalid"

    def broken(self: Store) -> list:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Store, "list_tenants", broken)
    assert api.admin.get("/v1/tenants").status_code == 500
    monkeypatch.undo()
    metrics = api.client(None).get("/metrics").text  # a new connection: the 500 closed the last one
    assert 'finesched_http_requests_total{method="GET",status="500"} 1.0' in metrics
