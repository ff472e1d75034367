"""PriorityClasses through a real server: admin-only writes, one global default, events; the tenant
rule at every door a tenant submits through (workloads, jobs, offers, plan); the resolved priority
in the queue and preemption; and a preempted tenant never told another tenant's workload names."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from manifests import node, priority_class, tenant_with_classes, workload
from server_harness import FINESCHED, Api, wait_until

from finesched.model.manifest import to_manifest
from finesched.model.priority_class import PriorityClass
from finesched.server.store.priority_store import delete_priority_class, list_priority_classes, put_priority_class
from finesched.server.store.store import Conflict, Store

API = "finesched.io/v1alpha1"


def classes(api: Api, *docs: dict) -> None:
    for doc in docs:
        answer = api.admin.post("/v1/priorityclasses", json=doc)
        assert answer.status_code == 201, answer.text


def allow(api: Api, tenant: str, *names: str) -> httpx.Client:
    """Let `tenant` use the classes `names`; its token's client."""
    api.admin.put(f"/v1/tenants/{tenant}", json=tenant_with_classes(tenant, *names)).raise_for_status()
    return api.client(api.token("tenant", tenant=tenant))


def events(client: httpx.Client, **params: str) -> list[dict[str, Any]]:
    return client.get("/v1/events", params={"limit": 5000, **params}).json()["items"]


# The objects -------------------------------------------------------------------------------------------
def test_priority_classes_are_written_by_the_admin_and_read_by_anyone(api: Api) -> None:
    team_a = api.client(api.token("tenant", tenant="team-a"))
    agent = api.client(api.token("agent", node="n1"))
    high = priority_class("high", 1000, description="services")
    # Authorization before validation: a tenant's or agent's write is 403 whatever its body.
    for client in (team_a, agent):
        for body in (high, {"kind": "Nope"}, [1, 2], "text", None):
            assert client.post("/v1/priorityclasses", json=body).status_code == 403, body
            assert client.put("/v1/priorityclasses/high", json=body).status_code == 403, body
        assert client.post("/v1/priorityclasses").status_code == 403  # no body at all
        assert client.delete("/v1/priorityclasses/high").status_code == 403
    created = api.admin.post("/v1/priorityclasses", json=high)
    assert created.status_code == 201, created.text
    assert created.json()["spec"] == {"value": 1000, "description": "services"}
    assert api.admin.post("/v1/priorityclasses", json=high).status_code == 409
    for client in (team_a, agent, api.admin):  # every token reads them, as in Kubernetes
        assert [i["metadata"]["name"] for i in client.get("/v1/priorityclasses").json()["items"]] == ["high"]
        assert client.get("/v1/priorityclasses/high").json()["spec"]["value"] == 1000
    assert team_a.get("/v1/priorityclasses/nope").status_code == 404
    assert api.client(None).get("/v1/priorityclasses").status_code == 401
    # Bad input: 422 at the field; nothing stored.
    too_big = api.admin.post("/v1/priorityclasses", json=priority_class("huge", 2**31))
    assert too_big.status_code == 422 and too_big.json()["detail"][0]["loc"] == ["body", "spec", "value"]
    renamed = api.admin.put("/v1/priorityclasses/other", json=high)
    assert renamed.status_code == 422 and renamed.json()["detail"][0]["loc"] == ["body", "metadata", "name"]
    # One global default: a second one is refused naming the first; the first may be changed.
    classes(api, priority_class("base", 10, globalDefault=True))
    second = api.admin.post("/v1/priorityclasses", json=priority_class("base2", 20, globalDefault=True))
    assert second.status_code == 422, second.text
    (detail,) = second.json()["detail"]
    assert detail["loc"] == ["body", "spec", "globalDefault"] and "PriorityClass base is already" in detail["msg"]
    also = api.admin.put("/v1/priorityclasses/high", json=priority_class("high", 1000, globalDefault=True))
    assert also.status_code == 422 and "PriorityClass base" in also.json()["detail"][0]["msg"]
    assert api.admin.put("/v1/priorityclasses/base", json=priority_class("base", 11, globalDefault=True)).is_success
    assert sorted(i["metadata"]["name"] for i in team_a.get("/v1/priorityclasses").json()["items"]) == ["base", "high"]
    # Events, as other objects log their changes; a tenant does not see them.
    assert api.admin.delete("/v1/priorityclasses/high").json() == {"deleted": "high"}
    assert api.admin.delete("/v1/priorityclasses/high").status_code == 404
    assert api.admin.get("/v1/priorityclasses/high").status_code == 404
    logged = [(e["object"], e["reason"], e["message"]) for e in events(api.admin, kind="PriorityClass")]
    assert logged == [
        ("high", "Created", "value 1000, PreemptLowerPriority"),
        ("base", "Created", "value 10, PreemptLowerPriority, global default"),
        ("base", "Updated", "value 11, PreemptLowerPriority, global default (was 10; workloads admitted before "
                            "keep their priority)"),
        ("high", "Deleted", ""),
    ]  # fmt: skip
    assert events(team_a, kind="PriorityClass") == []


def test_a_class_changed_later_does_not_change_admitted_workloads(api: Api) -> None:
    classes(api, priority_class("batch", 10, preemptionPolicy="Never"))
    team_a = allow(api, "team-a", "batch")
    assert team_a.post("/v1/workloads", json=workload("before", priorityClassName="batch")).status_code == 201
    api.admin.put("/v1/priorityclasses/batch", json=priority_class("batch", 20)).raise_for_status()
    assert team_a.post("/v1/workloads", json=workload("after", priorityClassName="batch")).status_code == 201
    stored = {i["metadata"]["name"]: i["spec"] for i in team_a.get("/v1/workloads").json()["items"]}
    assert stored["before"]["priority"] == 10 and stored["before"]["preemptionPolicy"] == "Never"
    assert stored["after"]["priority"] == 20 and "preemptionPolicy" not in stored["after"]  # the default
    assert stored["before"]["priorityClassName"] == stored["after"]["priorityClassName"] == "batch"
    api.admin.delete("/v1/priorityclasses/batch").raise_for_status()  # admitted workloads keep theirs
    assert team_a.get("/v1/workloads/team-a/before").json()["spec"]["priority"] == 10
    gone = team_a.post("/v1/workloads", json=workload("later", priorityClassName="batch"))
    assert gone.status_code == 422 and gone.json()["detail"][0]["loc"] == ["body", "spec", "priorityClassName"]
    assert "no PriorityClass batch exists (known: none)" in gone.json()["detail"][0]["msg"]


# Every door a tenant submits through -------------------------------------------------------------------
def _job(name: str, **spec: Any) -> dict:
    task = {"id": "t", "parallelism": 2, "operators": [{"id": "o"}], "command": ["sleep", "1"]}
    return {"apiVersion": API, "kind": "Job", "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"defaultSlot": {"cpu": "100m", "taskHeap": "16Mi", "managedOffHeap": "16Mi", "network": "16Mi"},
                     "tasks": [task], **spec}}  # fmt: skip


def _through(door: str, api: Api, client: httpx.Client, name: str, spec: dict[str, Any]) -> httpx.Response:
    """Submit a team-a workload (or job) of `spec` through `door` with `client`."""
    if door == "workloads":
        return client.post("/v1/workloads", json=workload(name, cpu="100m", **spec))
    if door == "plan":
        return client.post("/v1/plan", json=[workload(name, cpu="100m", **spec)])
    if door == "jobs":
        return client.post("/v1/jobs", json=_job(name, **{k: v for k, v in spec.items() if k != "priority"}))
    offer = client.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "100m"}})
    assert offer.status_code == 201, offer.text
    accepted = client.post(f"/v1/offers/{offer.json()['id']}/accept", json={"workloads": [workload(
        name, cpu="100m", **spec)]})  # fmt: skip
    if accepted.status_code == 403:  # refused: the offer stays open, its hold in place
        assert client.get(f"/v1/offers/{offer.json()['id']}").json()["state"] == "Open"
    return accepted


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("door", ["workloads", "jobs", "offers", "plan"])
def test_every_door_applies_the_tenant_rule(api: Api, door: str) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="64")).raise_for_status()
    classes(api, priority_class("low", 5), priority_class("high", 1000), priority_class("top", 10**9))
    team_a = allow(api, "team-a", "low", "high")
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"priorityClassName": "top"}, 403, "tenant team-a may not use PriorityClass top (it may use: low, high)"),
        ({"priorityClassName": "high"}, 0, ""),
    ]
    if door != "jobs":  # a job names a class only, its slots have no raw priority of their own
        cases += [
            ({"priority": 2_000_000_000}, 403, "is above the highest priority tenant team-a may set, 1000"),
            ({"priority": 1000}, 0, ""),
            ({"priorityClassName": "high", "priority": 7}, 422, "must not be provided"),
        ]
    for i, (spec, status, words) in enumerate(cases):
        answer = _through(door, api, team_a, f"w{i}", spec)
        if status:
            assert answer.status_code == status and words in answer.text, (spec, answer.text)
        else:
            assert answer.is_success, (spec, answer.text)
    stored = [i for i in api.admin.get("/v1/workloads", params={"namespace": "team-a"}).json()["items"]]
    assert all(i["spec"].get("priority", 0) <= 1000 for i in stored)  # nothing refused was stored
    assert {i["spec"].get("priorityClassName") for i in stored} <= {"high", None}
    # An admin may set anything.
    assert _through(door, api, api.admin, "admin", {"priorityClassName": "top"}).is_success


# The queue and preemption use the resolved priority ----------------------------------------------------
def test_classes_decide_preemption_across_tenants(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="4")).raise_for_status()
    classes(api, priority_class("batch", 1), priority_class("polite", 100, preemptionPolicy="Never"),
            priority_class("urgent", 100))  # fmt: skip
    team_a, team_b = allow(api, "team-a", "polite", "urgent"), allow(api, "team-b", "batch")
    team_b.post(
        "/v1/workloads", json=workload("b", namespace="team-b", cpu="3", priorityClassName="batch")
    ).raise_for_status()
    api.wait_phase("team-b/b", ("Bound",))
    # A class whose policy is Never waits instead of preempting, however high its value.
    assert team_a.post("/v1/workloads", json=workload("polite", cpu="3", priorityClassName="polite")).is_success
    wait_until(lambda: "insufficient cpu" in api.admin.get("/v1/workloads/team-a/polite").json()["status"]["reason"],
               what="polite's waiting reason")  # fmt: skip
    assert api.admin.get("/v1/workloads/team-b/b").json()["status"]["phase"] == "Bound"
    api.admin.delete("/v1/workloads/team-a/polite").raise_for_status()
    # A higher class preempts a lower one of another tenant.
    assert team_a.post("/v1/workloads", json=workload("urgent", cpu="3", priorityClassName="urgent")).is_success
    assert api.wait_phase("team-a/urgent", ("Bound",))["status"]["node"] == "n1"
    assert api.admin.get("/v1/workloads/team-b/b").json()["status"]["phase"] == "Pending"


# Anonymity ---------------------------------------------------------------------------------------------
def _watch(client: httpx.Client, since: int, until: Any, out: list[dict[str, Any]]) -> threading.Thread:
    """Collect `client`'s SSE events after `since` into `out` until one satisfies `until`."""

    def run() -> None:
        with client.stream("GET", "/v1/events/watch", params={"since": since}, timeout=30) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    out.append(json.loads(line[6:]))
                    if until(out[-1]):
                        return

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    return reader


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_preempted_tenant_is_never_told_another_tenants_workload(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="4")).raise_for_status()
    classes(api, priority_class("low", 1), priority_class("high", 10))
    team_a, team_b = allow(api, "team-a", "low", "high"), allow(api, "team-b", "low")
    # Within one tenant the preemptor is named: the tenant may see its own workloads.
    team_a.post("/v1/workloads", json=workload("mine", cpu="3", priorityClassName="low")).raise_for_status()
    api.wait_phase("team-a/mine", ("Bound",))
    team_a.post("/v1/workloads", json=workload("boss", cpu="3", priorityClassName="high")).raise_for_status()
    api.wait_phase("team-a/boss", ("Bound",))
    (own,) = [e for e in events(team_a, object="team-a/mine") if e["reason"] == "Preempted"]
    assert own["message"] == "preempted by team-a/boss on n1: priority 1 < 10"
    for name in ("boss", "mine"):
        api.admin.delete(f"/v1/workloads/team-a/{name}").raise_for_status()
    # Across tenants it is not, wherever team-b looks: events, the watch, the workload, describe.
    victim = workload("victim", namespace="team-b", cpu="3", priorityClassName="low")
    team_b.post("/v1/workloads", json=victim).raise_for_status()
    api.wait_phase("team-b/victim", ("Bound",))
    since = max(e["id"] for e in events(api.admin))
    watched: list[dict[str, Any]] = []
    reader = _watch(team_b, since, lambda e: e["reason"] == "Preempted", watched)  # replays from `since`
    team_a.post("/v1/workloads", json=workload("secret-plan", cpu="3", priorityClassName="high")).raise_for_status()
    api.wait_phase("team-a/secret-plan", ("Bound",))
    reader.join(timeout=20)
    assert any(e["reason"] == "Preempted" for e in watched), watched
    seen_by_b = [
        json.dumps(events(team_b)),
        json.dumps(watched),
        team_b.get("/v1/workloads/team-b/victim").text,
        subprocess.run([*FINESCHED, "describe", "workload", "team-b/victim", "-o", "json", "--server", api.base,
                        "--token", team_b.headers["Authorization"].split()[1]],
                       capture_output=True, text=True, timeout=60, check=True).stdout,
    ]  # fmt: skip
    for text in seen_by_b:
        assert "secret-plan" not in text and "team-a" not in text, text
    (preempted,) = [e for e in events(team_b, object="team-b/victim") if e["reason"] == "Preempted"]
    assert preempted["message"] == "preempted by a higher-priority workload on n1: priority 1 < 10"
    # team-a's own events are as they were.
    mine = [(e["reason"], e["message"]) for e in events(team_a, object="team-a/secret-plan")]
    assert mine[:2] == [("Submitted", ""), ("Bound", "bound to n1")]


# The command line --------------------------------------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_submits_lists_describes_and_deletes_classes(api: Api, tmp_path: Path) -> None:
    def run(token: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*FINESCHED, *args, "--server", api.base, "--token", token], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})  # fmt: skip

    admin, team_b = api.token("admin"), api.token("tenant", tenant="team-b")
    files = tmp_path / "cluster.yaml"
    files.write_text(yaml.safe_dump_all([
        workload("web", priorityClassName="serving"), tenant_with_classes("team-a", "serving"),
        priority_class("serving", 100, description="services"), priority_class("base", 1, globalDefault=True),
    ]))  # fmt: skip
    done = run(admin, "submit", "-f", str(files))
    assert done.returncode == 0, done.stderr
    assert done.stdout.index("PriorityClass") < done.stdout.index("Tenant") < done.stdout.index("Workload")
    assert api.admin.get("/v1/workloads/team-a/web").json()["spec"]["priority"] == 100
    table = run(team_b, "get", "priorityclasses")
    assert table.returncode == 0 and "2 priority class(es)" in table.stdout and "serving" in table.stdout
    listed = json.loads(run(team_b, "get", "pc", "-o", "json").stdout)
    assert [(i["metadata"]["name"], i["spec"]["value"]) for i in listed] == [("base", 1), ("serving", 100)]
    described = run(admin, "describe", "priorityclass", "base")
    assert described.returncode == 0 and "Global default:    yes" in described.stdout and "Created" in described.stdout
    # team-b lists no class: naming one is refused with the rule, as the API says it
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(workload("x", namespace="team-b", priorityClassName="serving")))
    refused = run(team_b, "submit", "-f", str(mine))
    assert refused.returncode == 1 and "403" in refused.stderr and "may not use PriorityClass serving" in refused.stderr
    assert run(team_b, "delete", "priorityclass", "base").returncode == 1
    assert run(admin, "delete", "priorityclass", "base").returncode == 0
    assert json.loads(run(admin, "get", "priorityclasses", "-o", "json").stdout)[0]["metadata"]["name"] == "serving"


def _write_default(store: Store, name: str, start: threading.Barrier, outcomes: dict[str, str]) -> None:
    cls = PriorityClass(name=name, value=1, global_default=True)
    start.wait()
    try:
        put_priority_class(store, cls, to_manifest(cls), create_only=True)
        outcomes[name] = "stored"
    except Conflict as exc:
        outcomes[name] = str(exc)


def test_two_global_defaults_written_at_once_one_wins(store: Store) -> None:
    """Admission reads the stored classes before the write; the store checks again in its transaction
    (PostgreSQL: under a table lock), so two writers of two defaults cannot both succeed."""
    for round_ in range(5):
        names = [f"d{round_}-{i}" for i in range(4)]
        start, outcomes = threading.Barrier(len(names)), {}
        writers = [threading.Thread(target=_write_default, args=(store, n, start, outcomes)) for n in names]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(timeout=60)
        won = [n for n, outcome in outcomes.items() if outcome == "stored"]
        assert len(won) == 1 and len(outcomes) == len(names), outcomes
        assert all("is already the global default" in o for n, o in outcomes.items() if n not in won), outcomes
        defaults = [r["name"] for r in list_priority_classes(store) if r["spec"]["spec"].get("globalDefault")]
        assert defaults == won
        delete_priority_class(store, won[0])
