"""Bad input: each answer is a 4xx with a JSON body naming the field, and nothing changes."""

from __future__ import annotations

import time
from datetime import timedelta

from manifests import node, workload
from server_harness import Api, inprocess_server
from sqlalchemy import update

from finesched.codec import encode
from finesched.server.loop.loop import LoopConfig
from finesched.server.store import schema as t
from finesched.server.store.store import now


def _workload_count(api: Api) -> int:
    return len(api.admin.get("/v1/workloads").json()["items"])


def test_malformed_json(api: Api) -> None:
    answer = api.admin.post(
        "/v1/workloads", content=b'{"kind": "Workload",', headers={"content-type": "application/json"}
    )
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][0] == "body"
    assert _workload_count(api) == 0


def test_unknown_fields_and_bad_quantities_name_the_path(api: Api) -> None:
    doc = workload("w")
    doc["spec"]["requestz"] = {"cpu": "1"}
    doc["spec"]["requests"]["memory"] = "12 parsecs"
    answer = api.admin.post("/v1/workloads", json=doc)
    assert answer.status_code == 422
    locs = [tuple(d["loc"]) for d in answer.json()["detail"]]
    assert ("body", "spec", "requestz") in locs
    assert ("body", "spec", "requests", "memory") in locs
    bad_node = node("n1")
    bad_node["spec"]["allocatable"]["cpu"] = "-4"
    answer = api.admin.post("/v1/nodes", json=bad_node)
    assert answer.status_code == 422
    assert ["body", "spec", "allocatable", "cpu"] in [d["loc"] for d in answer.json()["detail"]]
    assert api.admin.get("/v1/nodes").json()["items"] == []
    assert _workload_count(api) == 0


def test_one_bad_item_refuses_the_whole_list(api: Api) -> None:
    items = [workload("ok-1"), workload("bad", cpu="lots"), workload("ok-2")]
    answer = api.admin.post("/v1/workloads", json=items)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][:2] == ["body", 1]
    assert _workload_count(api) == 0


def test_duplicate_names(api: Api) -> None:
    answer = api.admin.post("/v1/workloads", json=[workload("twin"), workload("twin")])
    assert answer.status_code == 422 and "duplicate" in answer.json()["detail"][0]["msg"]
    assert api.admin.post("/v1/workloads", json=workload("twin")).status_code == 201
    answer = api.admin.post("/v1/workloads", json=[workload("other"), workload("twin")])
    assert answer.status_code == 409 and "team-a/twin" in answer.json()["detail"]
    assert _workload_count(api) == 1  # "other" was not stored either
    assert api.admin.post("/v1/nodes", json=node("n1")).status_code == 201
    assert api.admin.post("/v1/nodes", json=node("n1")).status_code == 409


def test_wrong_kind_and_mismatched_names(api: Api) -> None:
    answer = api.admin.post("/v1/workloads", json=node("n1"))
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "kind"]
    answer = api.admin.put("/v1/nodes/n2", json=node("n1"))
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "metadata", "name"]
    answer = api.admin.get("/v1/workloads", params={"phase": "Sleeping"})
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["query", "phase"]
    assert api.admin.get("/v1/workloads/team-a/nobody").status_code == 404
    assert api.admin.delete("/v1/nodes/nobody").status_code == 404


def test_oversized_payloads(db_url: str) -> None:
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05), max_body_bytes=4096) as api:
        big = [workload(f"w{i}") for i in range(200)]
        answer = api.admin.post("/v1/workloads", json=big)
        assert answer.status_code == 413 and answer.json()["detail"][0]["loc"] == ["body"]

        def chunks():  # no Content-Length: the limit applies to what is streamed
            for _ in range(10):
                yield b" " * 1024

        answer = api.admin.post("/v1/workloads", content=chunks(), headers={"content-type": "application/json"})
        assert answer.status_code == 413
        assert api.admin.get("/v1/workloads").json()["items"] == []


def test_malformed_reports_are_rejected_and_the_last_good_state_kept(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("g1", gpus=2))
    agent = api.client(api.token("agent", node="g1"))
    good = {"devices": {"gpu": {"gpu-core": {"k": encode([100, 70], 7), "count": 2, "bits": 7}}}}
    assert agent.post("/v1/nodes/g1/report", json=good).status_code == 200
    cases = {
        "wrong width": ({"gpu-core": {"k": 1 << 20, "count": 2, "bits": 7}},
                        ["body", "devices", "gpu", "gpu-core", "k"]),
        "more devices than inventory": (
            {"gpu-core": {"k": encode([1, 1, 1], 7), "count": 3, "bits": 7}},
            ["body", "devices", "gpu", "gpu-core", "count"],
        ),
        "above the total": ({"gpu-core": {"k": encode([120, 0], 7), "count": 2, "bits": 7}},
                            ["body", "devices", "gpu", "gpu-core", "k"]),
        "negative": ({"gpu-core": {"k": -5, "count": 2, "bits": 7}}, ["body", "devices", "gpu", "gpu-core", "k"]),
    }  # fmt: skip
    for why, (dims, loc) in cases.items():
        answer = agent.post("/v1/nodes/g1/report", json={"devices": {"gpu": dims}})
        assert answer.status_code == 422, why
        assert loc in [d["loc"] for d in answer.json()["detail"]], (why, answer.json())
    unknown = agent.post("/v1/nodes/g1/report", json={"devices": {"fpga": good["devices"]["gpu"]}})
    assert unknown.status_code == 422
    assert agent.post("/v1/nodes/g1/report", json={"health": {"gpu": {"7": False}}}).status_code == 422
    assert api.admin.get("/v1/nodes/g1").json()["status"]["report"] == {**good, "health": {}, "totals": {},
                                                                         "discovery": {}}  # fmt: skip
    refused = api.admin.get("/v1/events", params={"object": "g1"}).json()["items"]
    # Five refusals are recorded as node events; the negative k fails the body schema before that.
    assert sum(e["reason"] == "ReportRefused" for e in refused) == 5


def test_expired_and_closed_offers_cannot_be_accepted(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="4"))
    offer = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "2"}, "ttlSeconds": 30}).json()
    with api.store.write() as conn:  # the offer's TTL passes
        conn.execute(update(t.offers).where(t.offers.c.id == offer["id"]).values(expires=now() - timedelta(seconds=1)))
    answer = api.admin.post(f"/v1/offers/{offer['id']}/accept", json={"workloads": [workload("w")]})
    assert answer.status_code == 410 and "expired" in answer.json()["detail"]
    assert api.admin.get("/v1/workloads").json()["items"] == []
    deadline = time.monotonic() + 10
    while api.admin.get(f"/v1/offers/{offer['id']}").json()["state"] != "Expired":
        assert time.monotonic() < deadline, "the expired offer was not closed"
        time.sleep(0.1)
    declined = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "2"}}).json()
    assert api.admin.post(f"/v1/offers/{declined['id']}/decline").status_code == 200
    answer = api.admin.post(f"/v1/offers/{declined['id']}/accept", json={"workloads": [workload("w")]})
    assert answer.status_code == 409
    bad = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "many"}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "demand"]
    bad = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "1"}, "ttlSeconds": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "ttlSeconds"]
