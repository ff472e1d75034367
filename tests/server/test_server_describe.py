"""`describe node` and `describe tenant` as people read them, at 80 columns: each GPU's use (core and
memory used of total) and its holders, named only for a caller that may see them (a tenant's token
sees its own workloads, the others counted); a tenant's effective spec with its defaults; and the
quantities in the same form every view uses (`human_quantity`)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from manifests import node, workload
from server_harness import FINESCHED, Api, inprocess_server

from finesched.server.loop.loop import LoopConfig


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    done = subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert max(map(len, done.stdout.splitlines())) <= 80, done.stdout
    return done


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """n1: 2 GPUs of 16Gi; team-a's `train` holds half of GPU 0 (8Gi), team-b's `infer` a quarter of it."""
    db = f"sqlite:///{tmp_path_factory.mktemp('describe') / 'db.sqlite'}"
    with inprocess_server(db, LoopConfig(idle_wait_s=0.05)) as api:
        api.admin.post("/v1/nodes", json=node("n1", cpu="8", memory="10307921510", gpus=2))
        half = {"cpu": "500m", "memory": "1536Mi", "gpu-core": 50, "gpu-memory-ratio": 50}
        quarter = {"cpu": "1", "memory": "1Gi", "gpu-core": 25, "gpu-memory-ratio": 25}
        api.admin.post("/v1/workloads", json=[workload("train", requests=half),
                                              workload("infer", namespace="team-b", requests=quarter)])  # fmt: skip
        api.wait_phase("team-a/train", ("Bound",))
        api.wait_phase("team-b/infer", ("Bound",))
        yield api


def test_describe_node_shows_each_gpu_use_and_holders_to_an_admin(cluster: Api) -> None:
    shown = run("describe", "node", "n1", "--server", cluster.base, "--token", cluster.token("admin")).stdout
    node = cluster.admin.get("/v1/nodes/n1").json()
    usage = {d["minor"]: d for d in node["status"]["allocation"]["devices"]}
    holders = {h["workload"] for d in usage.values() for h in d["holders"]}
    assert holders == {"team-a/train", "team-b/infer"}
    for device in usage.values():  # the API's own numbers: used = total - free
        core = device["total"]["gpu-core"] - device["free"]["gpu-core"]
        assert core == sum(h["resources"]["gpu-core"] for h in device["holders"])
    assert "Allocatable: memory=9.6Gi, cpu=8" in shown
    assert "memory 2.5Gi/9.6Gi" in shown  # 1536Mi + 1Gi of the node's 10307921510 bytes
    assert "team-a/train: 50%" in shown and "team-b/infer: 25%" in shown  # a cell wraps after these
    rows = {_cell(shown, "team-a/train: 50%"), _cell(shown, "team-b/infer: 25%")}
    if len(rows) == 1:  # both on one GPU
        assert "core 75/100" in rows.pop() and "memory 12Gi/16Gi" in shown
    else:
        assert "core 50/100" in shown and "memory 8Gi/16Gi" in shown and "core 25/100" in shown
    assert "other" not in shown


def _cell(table: str, text: str) -> str:
    """The table row where `text` appears (the first line of it)."""
    return next(line for line in table.splitlines() if text in line)


def test_a_tenant_sees_its_own_holders_and_the_others_counted(cluster: Api) -> None:
    token = cluster.token("tenant", tenant="team-a")
    shown = run("describe", "node", "n1", "--server", cluster.base, "--token", token).stdout
    assert "team-a/train: 50%" in shown
    assert "team-b" not in shown and "infer" not in shown and "1 other" in shown
    raw = json.loads(run("describe", "node", "n1", "-o", "json", "--server", cluster.base, "--token", token).stdout)
    allocation = raw["status"]["allocation"]
    assert allocation["workloads"] == ["team-a/train"] and allocation["otherWorkloads"] == 1
    named = [h["workload"] for d in allocation["devices"] for h in d["holders"]]
    assert sorted(named, key=str) == sorted(["team-a/train", None], key=str)
    assert set(raw["status"].get("report") or {}) <= {"devices", "mig", "health", "totals", "cpuSharedPools",
                                                       "beCPUSharedPools", "podCPUAllocs", "workloadCPUs",
                                                       "discovery"}  # fmt: skip
    # -o json keeps exact integers; the table rounds
    assert raw["status"]["allocation"]["resources"]["memory"]["allocatable"] == 10307921510


def test_another_nodes_agent_is_still_refused(cluster: Api) -> None:
    agent = cluster.client(cluster.token("agent", node="n2"))
    assert agent.get("/v1/nodes/n1").status_code == 403
    assert cluster.client(cluster.token("tenant", tenant="team-a")).get("/v1/nodes/nope").status_code == 404


def test_describe_tenant_shows_the_effective_spec_with_defaults(cluster: Api, tmp_path: Path) -> None:
    admin = ("--server", cluster.base, "--token", cluster.token("admin"))
    shown = run("describe", "tenant", "team-a", *admin).stdout
    assert "Spec: {}" not in shown and "Spec:" not in shown
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in shown.splitlines() if ":" in line}
    assert lines["Weight"] == "1 (default)"
    assert lines["Quota"] == "none: no hard cap (default)"
    assert lines["Namespaces"] == "team-a"
    assert lines["Limits"] == "workloads no limit, jobs no limit, pending no limit (default)"
    spec = {"weight": 2.5, "quota": {"cpu": "1500m", "memory": "10307921510"}, "limits": {"jobs": 3}}
    doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "capped"}, "spec": spec}
    assert cluster.admin.put("/v1/tenants/capped", json=doc).status_code == 200
    capped = run("describe", "tenant", "capped", *admin).stdout
    assert "Weight:           2.5\n" in capped and "Quota:            cpu=1500m, memory=9.6Gi\n" in capped
    assert "jobs 3" in capped
    exact = json.loads(run("describe", "tenant", "capped", "-o", "json", *admin).stdout)
    assert exact["spec"]["quota"] == {"cpu": "1500m", "memory": "10307921510"}  # as written, exact
