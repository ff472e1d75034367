"""Workload and job lifecycle through the API, the node agent played over HTTP: restart policies,
backoff limits, region failover with a slot placed again, job listing and authorization."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from manifests import node, workload
from server_harness import Api, inprocess_server, wait_until

from finesched.server.loop.lifecycle import Backoff
from finesched.server.loop.loop import LoopConfig

JOB = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "two-regions.yaml"


@pytest.fixture
def fast(db_url: str) -> Iterator[Api]:
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05, lease_ttl_s=5.0, backoff=Backoff(0.1, 0.4))) as api:
        yield api


def status(api: Api, key: str) -> dict[str, Any]:
    return dict(api.admin.get(f"/v1/workloads/{key}").json()["status"])


def start(agent: httpx.Client, key: str) -> None:
    """What a node agent does with a new binding: ack it, report it Running."""
    assert agent.post(f"/v1/bindings/{key}/ack").status_code == 200
    assert agent.post(f"/v1/workloads/{key}/status", json={"phase": "Running"}).status_code == 200


def end(agent: httpx.Client, key: str, code: int) -> dict[str, Any]:
    phase = "Succeeded" if code == 0 else "Failed"
    answer = agent.post(f"/v1/workloads/{key}/status", json={"phase": phase, "exitCode": code, "reason": f"rc {code}"})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def unacked(agent: httpx.Client, key: str) -> bool:
    """The binding is there and not acknowledged: the agent (re)starts it."""
    items = agent.get("/v1/bindings").json()["items"]
    return any(b["workload"] == key and not b["acked"] for b in items)


def test_on_failure_restarts_in_place_until_the_backoff_limit(fast: Api) -> None:
    fast.admin.post("/v1/nodes", json=node("n1"))
    agent = fast.client(fast.token("agent", node="n1"))
    spec = {"command": ["false"], "restartPolicy": "OnFailure", "backoffLimit": 1}
    fast.admin.post("/v1/workloads", json=workload("flaky", **spec))
    wait_until(lambda: unacked(agent, "team-a/flaky"), what="the binding")
    first_node = status(fast, "team-a/flaky")["node"]
    start(agent, "team-a/flaky")
    assert end(agent, "team-a/flaky", 3)["outcome"] == "Restarting"
    waiting = status(fast, "team-a/flaky")
    assert waiting["phase"] == "Bound" and waiting["restarts"] == 1 and "restart 1 of 1" in waiting["reason"]
    wait_until(lambda: unacked(agent, "team-a/flaky"), what="the restart after the backoff")
    assert status(fast, "team-a/flaky")["node"] == first_node  # in place: the same binding
    start(agent, "team-a/flaky")
    assert end(agent, "team-a/flaky", 3)["outcome"] == "Failed"
    final = status(fast, "team-a/flaky")
    assert final["phase"] == "Failed" and final["binding"] is None and "backoff limit 1 reached" in final["reason"]
    # Never (the default): the first failure is final
    fast.admin.post("/v1/workloads", json=workload("once", command=["false"]))
    wait_until(lambda: unacked(agent, "team-a/once"), what="the binding")
    start(agent, "team-a/once")
    assert end(agent, "team-a/once", 1)["outcome"] == "Failed"


def two_regions(namespace: str = "team-a") -> dict[str, Any]:
    doc = yaml.safe_load(JOB.read_text())
    doc["metadata"]["namespace"] = namespace
    return dict(doc)


SLOTS = ("team-a/clicks-region-0-0", "team-a/clicks-region-0-1", "team-a/clicks-region-1-0")


def test_region_failover_places_an_ended_slot_again_and_leaves_the_other_region(fast: Api) -> None:
    fast.admin.post("/v1/nodes", json=node("n1"))
    agent = fast.client(fast.token("agent", node="n1"))
    answer = fast.admin.post("/v1/jobs", json=two_regions())
    assert answer.status_code == 201 and answer.json()["status"] == "Bound", answer.text
    for key in SLOTS:
        start(agent, key)
    assert fast.admin.get("/v1/jobs/team-a/clicks").json()["status"]["phase"] == "Running"
    end(agent, SLOTS[1], 0)  # slot 1 of region 0 is done: released
    assert status(fast, SLOTS[1])["binding"] is None
    assert end(agent, SLOTS[0], 2)["outcome"] == "Restarting"  # its peer fails: region 0 restarts
    job = fast.admin.get("/v1/jobs/team-a/clicks").json()
    assert job["status"]["phase"] == "Restarting" and job["status"]["failures"] == 1
    assert [r["restarting"] for r in job["status"]["regions"]] == [True, False]
    # after the backoff: slot 0 starts again in place, slot 1 (which had ended) is placed again
    wait_until(lambda: unacked(agent, SLOTS[0]) and unacked(agent, SLOTS[1]), what="region 0 to restart")
    assert status(fast, SLOTS[2])["phase"] == "Running"  # region 1 never stopped
    for key in SLOTS[:2]:
        start(agent, key)
    job = fast.admin.get("/v1/jobs/team-a/clicks").json()
    assert job["status"]["phase"] == "Running" and job["status"]["regions"][0]["restarts"] == 1
    for key in SLOTS:
        end(agent, key, 0)
    assert fast.admin.get("/v1/jobs/team-a/clicks").json()["status"]["phase"] == "Succeeded"


def test_job_reads_by_name_and_tenant(fast: Api) -> None:
    fast.admin.post("/v1/nodes", json=node("n1"))
    team_a = fast.client(fast.token("tenant", tenant="team-a"))
    team_b = fast.client(fast.token("tenant", tenant="team-b"))
    assert team_a.post("/v1/jobs", json=two_regions()).status_code == 201
    assert team_b.post("/v1/jobs", json=two_regions("team-b")).status_code == 201
    names = lambda client, **params: sorted(  # noqa: E731
        w["metadata"]["name"] for w in client.get("/v1/workloads", params=params).json()["items"]
    )
    assert names(team_a, job="clicks") == ["clicks-region-0-0", "clicks-region-0-1", "clicks-region-1-0"]
    assert names(team_a, job="team-a/clicks") == names(team_a, job="clicks")
    assert len(names(fast.admin, job="clicks")) == 6 and names(fast.admin, job="clicks", namespace="nope") == []
    assert names(team_a, job="cli") == []  # a job's name, not a prefix of it
    assert [j["metadata"]["namespace"] for j in team_a.get("/v1/jobs").json()["items"]] == ["team-a"]
    assert team_a.get("/v1/jobs/team-b/clicks").status_code == 403
    assert team_a.delete("/v1/jobs/team-b/clicks").status_code == 403
    # another tenant's namespace answers the same whether the job exists or not (nothing revealed)
    missing = team_a.get("/v1/jobs/team-b/no-such-job")
    assert missing.status_code == 403 and missing.json() == team_a.get("/v1/jobs/team-b/clicks").json()
    assert team_a.get("/v1/jobs", params={"namespace": "team-b"}).status_code == 403
    assert team_a.get("/v1/jobs/team-a/no-such-job").status_code == 404  # its own namespace: the truth
    assert team_a.post("/v1/jobs", json=two_regions()).status_code == 409
    assert fast.client(fast.token("agent", node="n1")).get("/v1/jobs").status_code == 403


def test_a_job_without_commands_is_refused_naming_the_field(fast: Api) -> None:
    fast.admin.post("/v1/nodes", json=node("n1"))
    doc = two_regions()
    del doc["spec"]["tasks"][1]["command"]
    doc["spec"]["slotSharingGroups"] = {"region-9": {"command": ["true"]}}
    answer = fast.admin.post("/v1/jobs", json=doc)
    assert answer.status_code == 422
    locs = [d["loc"] for d in answer.json()["detail"]]
    assert ["body", "spec", "tasks", 1, "command"] in locs and ["body", "spec", "slotSharingGroups", "region-9"] in locs
    assert fast.admin.get("/v1/workloads").json()["items"] == [] and fast.admin.get("/v1/jobs").json()["items"] == []
    bad_env = two_regions()
    bad_env["spec"]["tasks"][0]["env"] = {"FINESCHED_SUBTASK_INDEX": "7"}
    detail = fast.admin.post("/v1/jobs", json=bad_env).json()["detail"]
    assert detail[0]["loc"][-2:] == ["env", "FINESCHED_SUBTASK_INDEX"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_slots_lost_with_their_node_fail_their_regions_and_are_placed_again_together(db_url: str) -> None:
    config = LoopConfig(idle_wait_s=0.05, heartbeat_s=0.2, missed_heartbeats=2, requeue_after_s=0.5,
                        backoff=Backoff(0.1, 0.4))  # fmt: skip
    with inprocess_server(db_url, config) as api:
        api.admin.post("/v1/nodes", json=node("n1"))
        agent = api.client(api.token("agent", node="n1"))
        assert agent.post("/v1/nodes/n1/report", json={}).status_code == 200  # an agent runs n1
        assert api.admin.post("/v1/jobs", json=two_regions()).json()["status"] == "Bound"
        for key in SLOTS:
            start(agent, key)
        # n1 goes silent: NotReady, then its slots are requeued, and each region counts a failure
        wait_until(lambda: status(api, SLOTS[0])["phase"] == "Pending", timeout=20, what="the requeue")
        wait_until(lambda: api.admin.get("/v1/jobs/team-a/clicks").json()["status"]["failures"] == 2, what="failovers")
        assert {status(api, key)["phase"] for key in SLOTS} == {"Pending"}
        # the agent is back (and keeps reporting): the three slots are placed again as one gang

        def placed_while_reporting() -> bool:
            assert agent.post("/v1/nodes/n1/report", json={}).status_code == 200
            return all(unacked(agent, key) for key in SLOTS)

        wait_until(placed_while_reporting, what="the slots placed again")
        job = api.admin.get("/v1/jobs/team-a/clicks").json()["status"]
        assert [r["restarts"] for r in job["regions"]] == [1, 1] and job["phase"] == "Starting"


def test_a_job_too_large_to_place_is_refused_before_compiling_its_slots(fast: Api) -> None:
    huge = two_regions()
    huge["spec"]["tasks"][0]["parallelism"] = 10**9
    detail = fast.admin.post("/v1/jobs", json=huge).json()["detail"]
    assert detail[0]["loc"][-3:] == ["tasks", 0, "parallelism"] and "must be <= 32768" in detail[0]["msg"]
    wide = two_regions()
    wide["spec"]["tasks"][0]["parallelism"] = 5000
    answer = fast.admin.post("/v1/jobs", json=wide)
    assert answer.status_code == 422 and "at most 1000" in answer.json()["detail"][0]["msg"]
