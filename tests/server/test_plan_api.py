"""POST /v1/plan: a dry run on a copy of the live state; what it answers is what the scheduler then does,
nothing is stored, bad input is refused with field paths, and tenants see only their own workloads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from manifests import node, priority_class, tenant_with_classes, workload
from server_harness import FINESCHED, Api

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GPU_SHARE = {"cpu": "1", "memory": "1Gi", "gpu-core": 50, "gpu-memory-ratio": 50}


def exclusive(name: str, cpus: int, **spec: Any) -> dict:
    amount = {"cpu": str(cpus), "memory": "1Gi"}
    return workload(name, requests=amount, limits=amount, qos="LSE", **spec)


def placement(item: dict) -> tuple[str | None, str, dict]:
    """(node, cpuset, {type: [(minor, gpu-core)]}) of a plan record or a workload's binding view."""
    binding = item.get("status", {}).get("binding") if "status" in item else item
    if not binding or not binding.get("node"):
        return None, "", {}
    devices = {
        kind: sorted((g["minor"], int(g["resources"].get("gpu-core", 0))) for g in grants)
        for kind, grants in (binding.get("devices") or {}).items()
    }
    return binding["node"], binding.get("cpuset") or "", devices


def state_of(api: Api) -> tuple[list, dict]:
    """What the store and the leader hold: every workload with its phase and binding, each node's allocation."""
    items = api.admin.get("/v1/workloads").json()["items"]
    nodes = {n["metadata"]["name"]: n["status"]["allocation"] for n in api.admin.get("/v1/nodes").json()["items"]}
    return [(i["metadata"]["name"], i["status"]["phase"], placement(i)) for i in items], nodes


def test_plan_answers_what_the_scheduler_then_does_and_stores_nothing(api: Api) -> None:
    for name in ("n1", "n2"):
        assert api.admin.post("/v1/nodes", json=node(name, cores=4, gpus=2)).status_code == 201
    api.admin.post("/v1/workloads", json=[exclusive("held", 2), workload("share-0", requests=GPU_SHARE)])
    api.wait_phase("team-a/held", ("Bound",))
    api.wait_phase("team-a/share-0", ("Bound",))
    before = state_of(api)
    planned = [
        exclusive("db", 4),  # whole cores: 4 logical CPUs, exclusively
        workload("share-1", requests=GPU_SHARE),
        workload("share-2", requests=GPU_SHARE),
        workload("huge", cpu="64"),  # fits nowhere
    ]
    answer = api.admin.post("/v1/plan", json=planned)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    assert doc["dryRun"] is True and doc["cluster"] == {"nodes": 2, "pending": 0}
    by_name = {r["workload"]: r for r in doc["results"]}
    assert set(by_name) == {"team-a/db", "team-a/share-1", "team-a/share-2", "team-a/huge"}
    assert by_name["team-a/huge"]["node"] is None and "insufficient cpu" in by_name["team-a/huge"]["error"]
    assert by_name["team-a/huge"]["reasons"] == {"insufficient cpu": 2}
    assert len(by_name["team-a/db"]["cpuset"].replace("-", ",").split(",")) >= 1
    assert by_name["team-a/share-1"]["devices"]["gpu"][0]["resources"]["gpu-core"] == "50"  # as the binding view
    assert doc["summary"] == {"placed": 3, "unschedulable": 1, "evicted": 0}
    assert state_of(api) == before  # nothing stored, nothing placed
    # The same workloads submitted: the scheduler does exactly what the plan said.
    assert api.admin.post("/v1/workloads", json=planned).status_code == 201
    for name in ("db", "share-1", "share-2"):
        bound = api.wait_phase(f"team-a/{name}", ("Bound",))
        assert placement(bound) == placement(by_name[f"team-a/{name}"]), name
    assert api.admin.get("/v1/workloads/team-a/huge").json()["status"]["phase"] == "Pending"


def test_plan_refuses_bad_input_with_field_paths(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1"))
    docs = [workload("ok"), workload("bad", cpu="lots")]
    text = yaml.safe_dump_all(docs)
    refused = api.admin.post("/v1/plan", content=text, headers={"Content-Type": "application/yaml"})
    assert refused.status_code == 422
    (detail,) = refused.json()["detail"]
    assert detail["loc"] == ["body", 1, "spec", "requests", "cpu"] and "lots" in detail["msg"], detail
    assert text.splitlines()[detail["line"] - 1].strip() == "cpu: lots"  # the field's own line in the body
    single = api.admin.post("/v1/plan", json=workload("bad", cpu="lots"))
    assert single.status_code == 422 and single.json()["detail"][0]["loc"] == ["body", "spec", "requests", "cpu"]
    broken = api.admin.post("/v1/plan", content="kind: [unclosed", headers={"Content-Type": "application/yaml"})
    assert broken.status_code == 422 and broken.json()["detail"][0]["msg"].startswith("is not valid YAML: line 1")
    assert api.admin.post("/v1/plan", content="x", headers={"Content-Type": "text/plain"}).status_code == 415
    assert api.admin.post("/v1/plan", json=[]).status_code == 422
    # YAML as a file would be sent: planned like JSON
    fine = api.admin.post(
        "/v1/plan", content=yaml.safe_dump_all([workload("ok")]), headers={"Content-Type": "application/yaml"}
    )
    assert fine.status_code == 200 and fine.json()["results"][0]["node"] == "n1"
    api.admin.post("/v1/workloads", json=workload("taken"))
    assert api.admin.post("/v1/plan", json=workload("taken")).status_code == 409
    assert api.client(None).post("/v1/plan", json=workload("x")).status_code == 401
    assert api.client(api.token("agent", node="n1")).post("/v1/plan", json=workload("x")).status_code == 403


def test_plan_for_a_tenant_preempts_without_naming_others(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("g1", gpus=1))
    low = workload("batch", namespace="team-b", requests={"cpu": "1", "nvidia.com/gpu": 1}, priority=0)
    api.admin.post("/v1/workloads", json=low)
    api.wait_phase("team-b/batch", ("Bound",))
    # team-a may use the class "urgent" (a raw priority 100 from a tenant token is refused: 403)
    api.admin.post("/v1/priorityclasses", json=priority_class("urgent", 100)).raise_for_status()
    api.admin.put("/v1/tenants/team-a", json=tenant_with_classes("team-a", "urgent")).raise_for_status()
    urgent = workload("urgent", requests={"cpu": "1", "nvidia.com/gpu": 1}, priorityClassName="urgent")
    team_a = api.client(api.token("tenant", tenant="team-a"))
    assert team_a.post("/v1/plan", json={**urgent, "spec": {**urgent["spec"], "priority": 99}}).status_code == 422
    raw = team_a.post("/v1/plan", json=workload("raw", requests={"cpu": "1", "nvidia.com/gpu": 1}, priority=101))
    assert raw.status_code == 403 and "highest priority tenant team-a may set, 100" in raw.json()["detail"]
    assert team_a.post("/v1/plan", json=workload("x", namespace="team-b")).status_code == 403
    seen_by_a = team_a.post("/v1/plan", json=urgent).json()
    (record,) = seen_by_a["results"]
    assert record["node"] == "g1" and record["preempts"] == [
        {"workload": None, "tenant": None, "priority": 0, "reason": "a workload of another tenant"}
    ]
    (victim,) = api.admin.post("/v1/plan", json=urgent).json()["preemptions"][0]["victims"]
    assert victim["workload"] == "team-b/batch" and victim["tenant"] == "team-b"
    assert api.admin.get("/v1/workloads/team-b/batch").json()["status"]["phase"] == "Bound"  # not evicted


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_plan_against_the_server(api: Api, tmp_path: Path) -> None:
    # The example cluster, submitted; then `finesched plan --server` on examples/what-if.yaml.
    cluster = yaml.safe_load_all((EXAMPLES / "cluster.yaml").read_text())
    for doc in cluster:
        if doc["kind"] == "Node":
            api.admin.put(f"/v1/nodes/{doc['metadata']['name']}", json=doc).raise_for_status()
    common = ("--server", api.base, "--token", api.token("admin"))
    done = subprocess.run(
        [*FINESCHED, "plan", str(EXAMPLES / "what-if.yaml"), *common, "-o", "json"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    by_name = {r["workload"]: r for r in json.loads(done.stdout)["results"]}
    assert by_name["team-a/what-if-infer"]["node"] and by_name["team-a/what-if-infer"]["cpuset"]
    assert (
        by_name["team-a/what-if-huge"]["node"] is None and "insufficient cpu" in by_name["team-a/what-if-huge"]["error"]
    )
    table = subprocess.run([*FINESCHED, "plan", str(EXAMPLES / "what-if.yaml"), *common], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert table.returncode == 0 and "nothing stored" in table.stdout and "what-if-huge" in table.stdout
    assert api.admin.get("/v1/workloads").json()["items"] == []  # nothing submitted
    for args, code, message in (
        ((str(EXAMPLES / "cluster.yaml"),), 1, "not Node"),
        (("--waves", str(EXAMPLES / "what-if.yaml")), 2, "--waves: only for an offline plan"),
    ):
        refused = subprocess.run([*FINESCHED, "plan", *args, *common], capture_output=True, text=True, timeout=60)
        assert refused.returncode == code and message in refused.stderr, refused.stderr


def test_a_plan_sees_every_change_since_the_last(api: Api) -> None:
    # The dry run reuses its copy of the live state while nothing changed: a binding made in between
    # must be in the next answer.
    api.admin.post("/v1/nodes", json=node("n1", cpu="2"))
    assert api.admin.post("/v1/plan", json=workload("w", cpu="2")).json()["results"][0]["node"] == "n1"
    assert api.admin.post("/v1/plan", json=workload("w", cpu="2")).json()["results"][0]["node"] == "n1"
    api.admin.post("/v1/workloads", json=workload("x", cpu="2"))
    api.wait_phase("team-a/x", ("Bound",))
    (after,) = api.admin.post("/v1/plan", json=workload("w", cpu="2")).json()["results"]
    assert after["node"] is None and after["reasons"] == {"insufficient cpu": 1}
    api.admin.delete("/v1/workloads/team-a/x")
    api.admin.post("/v1/nodes/n1/cordon")
    (cordoned,) = api.admin.post("/v1/plan", json=workload("w", cpu="1")).json()["results"]
    assert cordoned["node"] is None and "cordoned" in cordoned["error"]
