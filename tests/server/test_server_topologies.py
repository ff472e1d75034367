"""Topology objects through a real server: admin-only writes, reads by every token, bad input with
its field paths, events; each domain's nodes and free capacity from the leader's state; admission
of a gang's (and a job's) topology; the loop's scheduler kept current, also with changes another
writer made; migration 0005; and the CLI (`submit -f`, `get topologies`, `describe topology`,
`delete topology`, offline `validate` and `plan`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from manifests import API, node, workload
from manifests import topology as topology_doc
from server_harness import FINESCHED, Api, wait_until

from finesched.model.manifest import parse_manifest
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL, Topology
from finesched.server.store.migrate import alembic_config, current_revision, upgrade
from finesched.server.store.topology_store import delete_topology, put_topology

RACKS = [BLOCK_LABEL, RACK_LABEL]


def topology(name: str = "dc", *labels: str) -> dict[str, Any]:
    return topology_doc(name, *(labels or RACKS))


def racked(name: str, block: str | None, rack: str | None, **kwargs: Any) -> dict[str, Any]:
    labels = {k: v for k, v in ((BLOCK_LABEL, block), (RACK_LABEL, rack)) if v is not None}
    return node(name, **kwargs, **labels)


def gang(name: str, members: int = 1, **topo: Any) -> dict[str, Any]:
    return {"name": name, "minMember": members, "topology": {"name": "dc", **topo}}


def locs(answer: httpx.Response) -> list[list[Any]]:
    assert answer.status_code == 422, answer.text
    return [d["loc"] for d in answer.json()["detail"]]


def scheduler_topologies(api: Api) -> dict[str, Topology]:
    loop = api.app.state.ctx.loop
    with loop.lock:
        return dict(loop.scheduler.topologies) if loop.scheduler is not None else {}


# The objects -------------------------------------------------------------------------------------------
def test_topologies_are_written_by_the_admin_and_read_by_anyone(api: Api) -> None:
    team_a = api.client(api.token("tenant", tenant="team-a"))
    agent = api.client(api.token("agent", node="n1"))
    for client in (team_a, agent):  # authorization before validation: 403 whatever the body
        for body in (topology(), {"kind": "Nope"}, [1], None):
            assert client.post("/v1/topologies", json=body).status_code == 403, body
            assert client.put("/v1/topologies/dc", json=body).status_code == 403, body
        assert client.delete("/v1/topologies/dc").status_code == 403
    created = api.admin.post("/v1/topologies", json=topology())
    assert created.status_code == 201, created.text
    assert created.json()["spec"] == {"levels": [{"nodeLabel": BLOCK_LABEL}, {"nodeLabel": RACK_LABEL}]}
    assert api.admin.post("/v1/topologies", json=topology()).status_code == 409
    for client in (team_a, agent, api.admin):
        assert [i["metadata"]["name"] for i in client.get("/v1/topologies").json()["items"]] == ["dc"]
        assert client.get("/v1/topologies/dc").json()["spec"]["levels"][1] == {"nodeLabel": RACK_LABEL}
    assert team_a.get("/v1/topologies/nope").status_code == 404
    assert api.client(None).get("/v1/topologies").status_code == 401
    replaced = api.admin.put("/v1/topologies/dc", json=topology("dc", BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL))
    assert replaced.status_code == 200 and replaced.json()["status"]["version"] == 2
    assert api.admin.delete("/v1/topologies/dc").json() == {"deleted": "dc"}
    assert api.admin.delete("/v1/topologies/dc").status_code == 404
    assert api.admin.get("/v1/topologies/dc").status_code == 404
    events = api.admin.get("/v1/events", params={"kind": "Topology"}).json()["items"]
    assert [(e["object"], e["reason"], e["message"]) for e in events] == [
        ("dc", "Created", f"levels {BLOCK_LABEL} > {RACK_LABEL}"),
        ("dc", "Updated", f"levels {BLOCK_LABEL} > {RACK_LABEL} > {HOSTNAME_LABEL}"),
        ("dc", "Deleted", ""),
    ]
    assert team_a.get("/v1/events", params={"kind": "Topology"}).json()["items"] == []


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (topology("dc", "not a label"), ["body", "spec", "levels", 0, "nodeLabel"]),
        (topology("dc", RACK_LABEL, RACK_LABEL), ["body", "spec", "levels", 1, "nodeLabel"]),
        (topology("dc", HOSTNAME_LABEL, RACK_LABEL), ["body", "spec", "levels", 0, "nodeLabel"]),
        ({**topology(), "spec": {"levels": []}}, ["body", "spec", "levels"]),
        ({**topology(), "spec": {}}, ["body", "spec", "levels"]),
        ({**topology(), "metadata": {"name": "Not_DNS"}}, ["body", "metadata", "name"]),
        ({**topology(), "kind": "PriorityClass"}, ["body", "kind"]),
        ([topology()], ["body"]),
    ],
)
def test_bad_topologies_are_refused_at_their_field_and_store_nothing(api: Api, body: Any, loc: list[Any]) -> None:
    assert loc in locs(api.admin.post("/v1/topologies", json=body))
    assert api.admin.get("/v1/topologies").json()["items"] == []
    assert scheduler_topologies(api) == {}


def test_a_replace_names_its_object_in_the_url(api: Api) -> None:
    assert locs(api.admin.put("/v1/topologies/other", json=topology("dc"))) == [["body", "metadata", "name"]]
    assert api.admin.get("/v1/topologies/other").status_code == 404


# Domains and their capacity ----------------------------------------------------------------------------
def test_domains_show_nodes_and_free_capacity_that_a_binding_changes(api: Api) -> None:
    for doc in (racked("n1", "b1", "r1"), racked("n2", "b1", "r1"), racked("n3", "b1", "r2", gpus=2),
                racked("n4", "b2", None), racked("n5", None, "r9")):  # fmt: skip
        api.admin.post("/v1/nodes", json=doc).raise_for_status()
    api.admin.post("/v1/topologies", json=topology()).raise_for_status()
    before = {(d["level"], d["name"]): d for d in api.admin.get("/v1/topologies/dc").json()["status"]["domains"]}
    # n5 has a rack but no block: outside every domain; n4 is in block b2 but in no rack
    assert {k: d["nodes"] for k, d in before.items()} == {
        (BLOCK_LABEL, "b1"): 3, (BLOCK_LABEL, "b2"): 1, (RACK_LABEL, "b1/r1"): 2, (RACK_LABEL, "b1/r2"): 1,
    }  # fmt: skip
    assert before[(BLOCK_LABEL, "b1")]["allocatable"]["cpu"] == "24000"  # millicores, as decimal text
    assert before[(BLOCK_LABEL, "b1")]["allocatable"]["memory"] == str(3 * 32 * 2**30)
    assert before[(RACK_LABEL, "b1/r2")]["allocatable"]["gpu-core"] == "200"
    assert "gpu-core" not in before[(RACK_LABEL, "b1/r1")]["allocatable"]  # only what its nodes have
    assert all(d["free"] == d["allocatable"] for d in before.values())
    listed = api.admin.get("/v1/topologies").json()["items"][0]
    assert listed["status"]["domainCounts"] == {BLOCK_LABEL: 2, RACK_LABEL: 2}
    # a workload bound on n3 takes its amounts from rack b1/r2 and block b1, nothing from the others
    on_n3 = workload("w", cpu="1500m", memory="2Gi", nodeSelector={"finesched.io/hostname": "n3"})
    api.admin.post("/v1/workloads", json=on_n3).raise_for_status()
    api.wait_phase("team-a/w", ("Bound", "Running"))
    after = {(d["level"], d["name"]): d for d in api.admin.get("/v1/topologies/dc").json()["status"]["domains"]}
    for key in ((BLOCK_LABEL, "b1"), (RACK_LABEL, "b1/r2")):
        assert int(before[key]["free"]["cpu"]) - int(after[key]["free"]["cpu"]) == 1500
        assert int(before[key]["free"]["memory"]) - int(after[key]["free"]["memory"]) == 2 * 2**30
        assert after[key]["allocatable"] == before[key]["allocatable"]
    assert after[(RACK_LABEL, "b1/r1")] == before[(RACK_LABEL, "b1/r1")]
    assert after[(BLOCK_LABEL, "b2")] == before[(BLOCK_LABEL, "b2")]


# Admission ---------------------------------------------------------------------------------------------
def _job(name: str, parallelism: int, **topo: Any) -> dict[str, Any]:
    task = {"id": "t", "parallelism": parallelism, "operators": [{"id": "o"}], "command": ["sleep", "1"]}
    return {"apiVersion": API, "kind": "Job", "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"defaultSlot": {"cpu": "100m", "taskHeap": "16Mi", "managedOffHeap": "16Mi", "network": "16Mi"},
                     "tasks": [task], "topology": {"name": "dc", **topo}}}  # fmt: skip


def test_a_gang_or_job_naming_an_unknown_topology_or_level_is_refused(api: Api) -> None:
    team_a = api.client(api.token("tenant", tenant="team-a"))
    unknown = team_a.post("/v1/workloads", json=workload("w", gang=gang("g", required=RACK_LABEL)))
    assert locs(unknown) == [["body", "spec", "gang", "topology", "name"]]
    assert "no Topology dc exists (known: none)" in unknown.json()["detail"][0]["msg"]
    assert locs(team_a.post("/v1/jobs", json=_job("j", 2, required=RACK_LABEL))) == [
        ["body", "spec", "topology", "name"]
    ]
    api.admin.post("/v1/topologies", json=topology()).raise_for_status()
    level = team_a.post("/v1/workloads", json=[workload("ok"), workload("w", gang=gang("g", preferred="zone"))])
    assert locs(level) == [["body", 1, "spec", "gang", "topology", "preferred"]]
    assert RACK_LABEL in level.json()["detail"][0]["msg"]  # the levels it may name
    coarser = gang("g", 2, required=RACK_LABEL, slice={"size": 2, "required": BLOCK_LABEL})
    assert locs(team_a.post("/v1/workloads", json=workload("w", gang=coarser))) == [
        ["body", "spec", "gang", "topology", "slice", "required"]
    ]
    assert locs(team_a.post("/v1/jobs", json=_job("j", 3, required=RACK_LABEL, slice={"size": 2,
                                                                                      "required": RACK_LABEL}))) == [
        ["body", "spec", "topology", "slice", "size"]
    ]  # fmt: skip
    assert locs(team_a.post("/v1/jobs", json=_job("j", 2, required="zone"))) == [
        ["body", "spec", "topology", "required"]
    ]
    assert team_a.get("/v1/workloads").json()["items"] == []  # a refused request stores nothing
    # admitted: the gang as asked; a job's slots carry its topology in their gang
    good = team_a.post("/v1/workloads", json=workload("w", gang=gang("g", required=RACK_LABEL)))
    assert good.status_code == 201, good.text
    assert good.json()["items"][0]["spec"]["gang"]["topology"] == {"name": "dc", "required": RACK_LABEL}
    job = team_a.post("/v1/jobs", json=_job("j", 2, preferred=RACK_LABEL, slice={"size": 2, "required": RACK_LABEL}))
    assert job.status_code == 201, job.text
    slots = team_a.get("/v1/workloads", params={"job": "j"}).json()["items"]
    assert len(slots) == 2
    asked = {"name": "dc", "preferred": RACK_LABEL, "slice": {"size": 2, "required": RACK_LABEL}}
    assert [s["spec"]["gang"] for s in slots] == [{"name": "j", "minMember": 2, "topology": asked}] * 2
    # deleted: new gangs naming it are refused; the admitted ones stay (they wait, the scheduler says why)
    api.admin.delete("/v1/topologies/dc").raise_for_status()
    assert locs(team_a.post("/v1/workloads", json=workload("w2", gang=gang("g2", required=RACK_LABEL)))) == [
        ["body", "spec", "gang", "topology", "name"]
    ]
    assert team_a.get("/v1/workloads/team-a/w").status_code == 200


# The loop ----------------------------------------------------------------------------------------------
def test_the_scheduler_has_the_stored_topologies_also_when_another_writer_changed_them(api: Api) -> None:
    api.admin.post("/v1/topologies", json=topology()).raise_for_status()
    assert list(scheduler_topologies(api)) == ["dc"]  # through this process: at once
    other = parse_manifest(topology("other", RACK_LABEL))
    assert isinstance(other, Topology)
    put_topology(api.store, other, topology("other", RACK_LABEL), create_only=True)  # another replica's write
    wait_until(lambda: sorted(scheduler_topologies(api)) == ["dc", "other"], what="the feed's topology")
    assert scheduler_topologies(api)["other"].labels == (RACK_LABEL,)
    delete_topology(api.store, "dc")
    wait_until(lambda: sorted(scheduler_topologies(api)) == ["other"], what="the feed's deletion")


def test_a_rebuilt_scheduler_starts_with_the_stored_topologies(api: Api) -> None:
    api.admin.post("/v1/topologies", json=topology()).raise_for_status()
    loop = api.app.state.ctx.loop
    loop.rebuild()  # what a replica does when it takes the lease
    assert list(scheduler_topologies(api)) == ["dc"]


# Migration ---------------------------------------------------------------------------------------------
def test_migration_0005_adds_the_topologies_table_and_goes_back(tmp_path: Path) -> None:
    from alembic import command

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0004")
    assert "topologies" not in sa.inspect(engine).get_table_names()
    upgrade(engine)
    assert current_revision(engine) == "0005"
    columns = {c["name"] for c in sa.inspect(engine).get_columns("topologies")}
    assert columns == {"name", "spec", "version", "created", "uid"}
    assert any(i["unique"] and i["column_names"] == ["uid"] for i in sa.inspect(engine).get_indexes("topologies"))
    config = alembic_config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
    assert "topologies" not in sa.inspect(engine).get_table_names() and current_revision(engine) == "0004"
    engine.dispose()


# The CLI -----------------------------------------------------------------------------------------------
def _run(api: Api, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    token = api.token("admin")
    done = subprocess.run([*FINESCHED, *args, "--server", api.base, "--token", token], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_submits_lists_describes_and_deletes_topologies(api: Api, tmp_path: Path) -> None:
    files = tmp_path / "cluster.yaml"
    docs = [topology(), racked("n1", "b1", "r1"), racked("n2", "b1", "r2"), racked("n3", "b2", "r3", gpus=2)]
    files.write_text(yaml.safe_dump_all(docs))
    submitted = _run(api, "submit", "-f", str(files))
    assert "Topology" in submitted.stdout and "applied" in submitted.stdout
    listed = _run(api, "get", "topologies").stdout
    assert "name" in listed and "levels" in listed and "domains" in listed
    assert f"{BLOCK_LABEL} > {RACK_LABEL}" in listed and "2/3" in listed  # 2 blocks, 3 racks
    api.admin.post("/v1/workloads", json=workload("w", cpu="2", nodeSelector={"finesched.io/hostname": "n2"}))
    api.wait_phase("team-a/w", ("Bound", "Running"))
    described = _run(api, "describe", "topology", "dc").stdout
    assert "Topology dc" in described and f"1. {BLOCK_LABEL}" in described and f"2. {RACK_LABEL}" in described
    # Levels by the last part of their label ("block", "rack"), listed in full above the table.
    cells = [
        line.replace("│", " ").split() for line in described.splitlines() if line.startswith(("│ block", "│ rack"))
    ]
    rows = {cell[1]: cell for cell in cells}  # level, domain, nodes, cpu, memory, gpu-core (free/allocatable)
    assert rows["b1/r2"][2:] == ["1", "6/8", "31Gi/32Gi", "-"]
    assert rows["b1"][2:] == ["2", "14/16", "63Gi/64Gi", "-"] and rows["b1/r1"][3] == "8/8"
    assert rows["b2/r3"][2:] == ["1", "8/8", "32Gi/32Gi", "200/200"]  # gpu-core, where the cluster has it
    as_json = json.loads(_run(api, "describe", "topology", "dc", "-o", "json").stdout)
    assert [e["reason"] for e in as_json["events"]] == ["Created"]
    assert len(as_json["status"]["domains"]) == 5
    assert "topology dc deleted" in _run(api, "delete", "topology", "dc").stdout
    gone = _run(api, "describe", "topology", "dc", check=False)
    assert gone.returncode == 1 and "not found" in gone.stderr + gone.stdout


def test_validate_and_plan_check_gang_topologies_against_the_files(tmp_path: Path) -> None:
    nodes = [racked(f"n{i}", "b1", f"r{i % 2}") for i in range(4)]
    good = workload("w", gang=gang("g", required=RACK_LABEL), namespace="default")
    bad = workload("x", gang=gang("h", required="zone"), namespace="default")
    with_topology, without = tmp_path / "with.yaml", tmp_path / "without.yaml"
    with_topology.write_text(yaml.safe_dump_all([topology(), *nodes, good]))
    without.write_text(yaml.safe_dump_all([*nodes, good]))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump_all([topology(), *nodes, bad]))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=120)

    assert run("validate", str(with_topology)).returncode == 0
    unknown = run("validate", str(without))  # the files may not be the whole cluster: a warning
    assert unknown.returncode == 0 and "spec.gang.topology.name" in unknown.stderr + unknown.stdout
    level = run("validate", str(wrong))
    assert level.returncode == 1 and "spec.gang.topology.required" in level.stderr + level.stdout
    assert run("plan", str(with_topology)).returncode == 0
    for refused, path in ((without, "spec.gang.topology.name"), (wrong, "spec.gang.topology.required")):
        planned = run("plan", str(refused))  # the plan's cluster is the files': an error
        assert planned.returncode == 1 and path in planned.stderr, planned.stderr


def test_the_documented_label_key_pattern_is_the_models_rule(api: Api) -> None:
    import re

    from finesched.model.topology import label_key_problem

    schemas = api.admin.get("/openapi.json").json()["components"]["schemas"]
    pattern = schemas["TopologyLevel"]["properties"]["nodeLabel"]["pattern"]
    assert schemas["TopologySlice"]["properties"]["required"]["pattern"] == pattern
    assert schemas["GangTopology"]["properties"]["preferred"]["anyOf"][0]["pattern"] == pattern
    keys = [RACK_LABEL, HOSTNAME_LABEL, "rack", "a.b/c_d.e", "x" * 63, "x" * 64, "Upper/x", "/x", "a/", "a//b",
            "-a", "a-", "a/b/c", "a.-b/c", "0"]  # fmt: skip
    assert [k for k in keys if re.match(pattern, k)] == [k for k in keys if label_key_problem(k) is None]
