"""POST /v1/plan with `defragment` and `finesched plan --defragment`: the moves of running workloads
that allow them (`spec.migration`) which WOULD let a workload fit, answered without making them;
another tenant's movers unnamed; bad options refused naming the field; the live state unchanged."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from defrag_cluster import MOVABLE, WHOLE_GPU, fragmented, share
from manifests import node, workload
from server_harness import FINESCHED, Api, inprocess_server

from finesched.sched.profile import BUILTIN_PROFILES
from finesched.server.loop.loop import LoopConfig


def live(api: Api) -> tuple[list, list]:
    """Everything the store and the leader answer of workloads and nodes (versions, bindings, allocations)."""
    return api.admin.get("/v1/workloads").json()["items"], api.admin.get("/v1/nodes").json()["items"]


def test_dry_run_answers_the_moves_and_changes_nothing(api: Api) -> None:
    fragmented(api)
    big = workload("big", requests=WHOLE_GPU)
    before = live(api)
    (plain,) = api.admin.post("/v1/plan", json=big).json()["results"]
    assert plain["node"] is None and "moves" not in plain  # without defragment: as before
    answer = api.admin.post("/v1/plan", json={"workloads": [big], "defragment": True})
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    (record,) = doc["results"]
    assert record["node"] == "n1" and record["movesReason"]
    (move,) = record["moves"]
    assert move["workload"] == "team-b/mover" and move["tenant"] == "team-b" and move["reason"]
    assert move["from"]["node"] == move["to"]["node"] == "n1"
    (source,), (target,) = move["from"]["devices"]["gpu"], move["to"]["devices"]["gpu"]
    assert source["minor"] != target["minor"] and target["resources"]["gpu-core"] == "30"
    (granted,) = record["devices"]["gpu"]
    assert granted["minor"] == source["minor"]  # the card the move frees is the one it gets
    assert doc["summary"]["moves"] == 1
    assert doc["defragmentation"]["source"] == "defaults"  # the server's profile does not defragment
    assert doc["defragmentation"]["settings"]["maxMovesPerPlan"] == 4
    # YAML bodies take the option as a query parameter: the same answer.
    text = yaml.safe_dump_all([big])
    same = api.admin.post("/v1/plan?defragment=true", content=text, headers={"Content-Type": "application/yaml"})
    assert same.status_code == 200 and same.json()["results"] == doc["results"]
    assert live(api) == before  # nothing moved, stored or placed
    assert api.admin.get("/v1/workloads/team-b/mover").json()["status"]["binding"]["devices"]["gpu"] == [source]


def test_another_tenants_mover_is_not_named(api: Api) -> None:
    fragmented(api)
    team_a = api.client(api.token("tenant", tenant="team-a"))
    answer = team_a.post("/v1/plan", json={"workloads": workload("big", requests=WHOLE_GPU), "defragment": True})
    assert answer.status_code == 200, answer.text
    (record,) = answer.json()["results"]
    (move,) = record["moves"]
    assert move["workload"] is None and move["tenant"] is None and move["reason"] == "a workload of another tenant"
    assert move["from"]["node"] == "n1" and move["to"]["devices"]["gpu"][0]["resources"]["gpu-core"] == "30"
    assert "mover" not in answer.text and "team-b" not in answer.text


def test_bad_options_are_refused_naming_the_field(api: Api) -> None:
    fragmented(api)
    before = live(api)
    big = workload("big", requests=WHOLE_GPU)
    for body, query, loc in (
        ({"workloads": [big], "defragment": "yes"}, "", ["body", "defragment"]),
        ({"workloads": [big], "defragment": 1}, "", ["body", "defragment"]),
        ({"workloads": [big], "defrag": True}, "", ["body", "defrag"]),
        ([big], "?defragment=yes", ["query", "defragment"]),
        ({"workloads": [big], "defragment": True}, "?defragment=true", ["body", "defragment"]),
        ({"workloads": [workload("bad", cpu="lots")]}, "", ["body", "workloads", 0, "spec", "requests", "cpu"]),
        ({"workloads": workload("bad", cpu="lots")}, "", ["body", "workloads", "spec", "requests", "cpu"]),
    ):
        refused = api.admin.post(f"/v1/plan{query}", json=body)
        assert refused.status_code == 422, (body, refused.text)
        assert [d["loc"] for d in refused.json()["detail"]] == [loc], refused.text
    assert api.admin.post("/v1/plan", json={"workloads": []}).status_code == 422
    team_a = api.client(api.token("tenant", tenant="team-a"))
    for defragment in (True, "yes"):  # another tenant's namespace: 403 before any other problem
        body = {"workloads": [workload("x", namespace="team-b")], "defragment": defragment}
        assert team_a.post("/v1/plan", json=body).status_code == 403
    assert live(api) == before


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_plan_defragment_against_the_server(api: Api, tmp_path: Path) -> None:
    fragmented(api)
    manifest = tmp_path / "big.yaml"
    manifest.write_text(yaml.safe_dump(workload("big", requests=WHOLE_GPU)))
    common = ("plan", "--defragment", str(manifest), "--server", api.base, "--token", api.token("admin"))
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run([*FINESCHED, *common, "-o", "json"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    (record,) = json.loads(done.stdout)["results"]
    assert record["node"] == "n1" and record["moves"][0]["workload"] == "team-b/mover"
    table = subprocess.run([*FINESCHED, *common], capture_output=True, text=True, timeout=60, env=env)
    assert table.returncode == 0, table.stderr
    assert "Moves" in table.stdout and "team-b/mover" in table.stdout and "default" in table.stdout
    assert "…" not in table.stdout and max(map(len, table.stdout.splitlines())) <= 80
    (move,) = record["moves"]
    source, target = (f"n1 GPU {move[end]['devices']['gpu'][0]['minor']}" for end in ("from", "to"))
    moves = table.stdout[table.stdout.index("Moves") :]
    row = next(line for line in moves.splitlines() if "team-b/mover" in line)
    cells = [c.strip() for c in row.split("│")]
    assert source in cells and target in cells and "30" in cells, row  # the figures whole
    assert api.admin.get("/v1/workloads/team-a/big").status_code == 404  # nothing submitted


def test_cli_plan_defragment_offline(tmp_path: Path) -> None:
    # Offline: the first file's workloads are placed, then the second's; a workload of the second that
    # fits nowhere moves one of the first that allows it.
    cluster = tmp_path / "cluster.yaml"
    first = tmp_path / "running.yaml"
    second = tmp_path / "big.yaml"
    cluster.write_text(yaml.safe_dump(node("n1", gpus=2)))
    running = [workload("pinned", requests=share(30)), workload("mover", requests=share(30), migration=MOVABLE)]
    first.write_text(yaml.safe_dump_all(running))
    second.write_text(yaml.safe_dump(workload("big", requests=WHOLE_GPU)))
    env = {**os.environ, "COLUMNS": "80"}
    files = (str(cluster), str(first), str(second))
    without = subprocess.run([*FINESCHED, "plan", "--waves", *files, "-o", "json"], capture_output=True, text=True,
                             timeout=60, env=env)  # fmt: skip
    assert without.returncode == 0, without.stderr
    assert {r["workload"]: r["node"] for r in json.loads(without.stdout)["results"]}["team-a/big"] is None
    done = subprocess.run([*FINESCHED, "plan", "--waves", "--defragment", *files, "-o", "json"], capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    by_name = {r["workload"]: r for r in doc["results"]}
    (move,) = by_name["team-a/big"]["moves"]
    assert by_name["team-a/big"]["node"] == "n1" and move["workload"] == "team-a/mover"
    assert by_name["team-a/mover"]["movedBy"] == "team-a/big" and by_name["team-a/mover"]["movedTo"] == move["to"]
    assert doc["defragmentation"]["source"] == "defaults" and doc["summary"]["moves"] == 1
    table = subprocess.run([*FINESCHED, "plan", "--waves", "--defragment", *files], capture_output=True, text=True,
                           timeout=60, env=env)  # fmt: skip
    assert table.returncode == 0 and "Moves" in table.stdout and "1 move(s)" in table.stdout, table.stdout


def test_dry_run_plans_with_the_profiles_settings(tmp_path: Path) -> None:
    # A profile that defragments: the dry run plans under its settings (and says so); without the
    # option the copy moves nothing, whatever the profile says.
    profile = BUILTIN_PROFILES["default"].model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    profile["defragmentation"] = {"maxMovesPerPlan": 1, "cooldownSeconds": 30}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    config = LoopConfig(idle_wait_s=0.05, profile=str(path))
    with inprocess_server(f"sqlite:///{tmp_path / 'profile.db'}", config) as api:
        fragmented(api)
        big = workload("big", requests=WHOLE_GPU)
        (plain,) = api.admin.post("/v1/plan", json=big).json()["results"]
        assert plain["node"] is None and "moves" not in plain
        doc = api.admin.post("/v1/plan", json={"workloads": big, "defragment": True}).json()
        assert doc["defragmentation"]["source"] == "profile"
        assert doc["defragmentation"]["settings"]["maxMovesPerPlan"] == 1
        assert doc["defragmentation"]["settings"]["cooldownSeconds"] == 30
        assert [m["workload"] for m in doc["results"][0]["moves"]] == ["team-b/mover"]
