"""The CLI as a kubectl user expects it, against a real server, in an 80-column terminal: a tenant
token's own namespace by default (GET /v1/whoami), 401/403 that say what to do, `get KIND [NAME]` in
every form, names that differ at their end kept apart, and `validate` knowing the server's tenants."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from manifests import node, tenant, workload
from server_harness import FINESCHED, Api

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
BOX = re.compile(r"[\u2500-\u257f]")


def cli(api: Api, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`finesched ARGS` at 80 columns against `api`, as a user with `token` in their environment runs it."""
    env = {**os.environ, "COLUMNS": "80", "FINESCHED_SERVER": api.base, "FINESCHED_TOKEN": token}
    done = subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=60, env=env)
    for line in done.stdout.splitlines():
        assert len(line) <= 80, line
    return done


@SQLITE
def test_whoami_says_who_a_token_is_and_where_it_acts(api: Api) -> None:
    api.admin.put("/v1/tenants/team-a", json={**tenant("team-a"), "spec": {"namespaces": ["team-a-ci"]}})
    answers = {
        "admin": api.client(api.token("admin")).get("/v1/whoami").json(),
        "tenant": api.client(api.token("tenant", tenant="team-a")).get("/v1/whoami").json(),
        "agent": api.client(api.token("agent", node="n1")).get("/v1/whoami").json(),
    }
    assert answers == {
        "admin": {"role": "admin", "tenant": None, "node": None, "namespaces": None},
        "tenant": {"role": "tenant", "tenant": "team-a", "node": None, "namespaces": ["team-a", "team-a-ci"]},
        "agent": {"role": "agent", "tenant": None, "node": "n1", "namespaces": []},
    }
    assert api.client(None).get("/v1/whoami").status_code == 401
    told = cli(api, api.token("tenant", tenant="team-a"), "whoami")
    assert told.returncode == 0 and told.stdout.splitlines() == [
        "Role:       tenant", "Tenant:     team-a", "Namespaces: team-a, team-a-ci"]  # fmt: skip
    assert json.loads(cli(api, api.token("admin"), "whoami", "-o", "json").stdout) == answers["admin"]
    refused = cli(api, "fs_wrong", "whoami")
    assert refused.returncode == 1 and "finesched token create" in refused.stderr  # how to get a token
    assert api.client("fs_wrong").get("/v1/whoami").status_code == 401


@SQLITE
def test_a_tenant_token_acts_in_its_own_namespace_and_is_told_which_it_may_use(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1")).raise_for_status()
    api.admin.post("/v1/workloads", json=[workload("gpu", "team-a"), workload("web", "default")]).raise_for_status()
    mine = api.token("tenant", tenant="team-a")
    described = cli(api, mine, "describe", "workload", "gpu")  # no -n: team-a's own namespace
    assert described.returncode == 0, described.stderr
    assert "Workload team-a/gpu" in described.stdout
    assert json.loads(cli(api, mine, "get", "workload", "gpu", "-o", "json").stdout)["metadata"]["name"] == "gpu"
    refused = cli(api, mine, "describe", "workload", "web", "-n", "default")
    assert refused.returncode == 1
    assert "403" in refused.stderr and "this token may use namespace team-a: pass -n team-a" in refused.stderr
    logs = cli(api, mine, "logs", "web", "-n", "default")
    assert logs.returncode == 1 and "pass -n team-a" in logs.stderr
    manifest = Path(api.db.removeprefix("sqlite:///")).parent / "default.yaml"  # no namespace: default
    manifest.write_text(yaml.safe_dump({**workload("x"), "metadata": {"name": "x"}}))
    sent = cli(api, mine, "submit", "-f", str(manifest))
    assert sent.returncode == 1 and "set metadata.namespace: team-a in the manifests" in sent.stderr
    # an admin's default stays `default`
    assert "Workload default/web" in cli(api, api.token("admin"), "describe", "workload", "web").stdout
    denied = cli(api, "fs_not_a_token", "get", "workloads")
    assert denied.returncode == 1 and "401" in denied.stderr
    assert "finesched token create" in denied.stderr and "FINESCHED_TOKEN" in denied.stderr


#: `get` as kubectl takes it: (arguments, what the output shows). Every kind, singular and plural,
#: short names, with and without a NAME, NAMESPACE/NAME.
GET_FORMS = [
    (("workloads",), ["default/web", "default/db", "team-a/api"]),
    (("workload",), ["default/web", "default/db", "team-a/api"]),
    (("workload", "web"), ["default/web"]),
    (("workloads", "web"), ["default/web"]),
    (("workload", "team-a/api"), ["team-a/api"]),
    (("workload", "api", "-n", "team-a"), ["team-a/api"]),
    (("nodes",), ["n1", "n2"]),
    (("node", "n1"), ["n1"]),
    (("no", "n2"), ["n2"]),
    (("no",), ["n1", "n2"]),
    (("tenants",), ["team-a", "team-b"]),
    (("tenant", "team-b"), ["team-b"]),
    (("priorityclasses",), ["high"]),
    (("priorityclass", "high"), ["high"]),
    (("pc", "high"), ["high"]),
    (("jobs",), ["0 job(s)"]),
    (("events",), ["Created"]),
    (("ev",), ["Created"]),
]


@SQLITE
def test_get_takes_every_form_kubectl_takes(api: Api) -> None:
    for name in ("n1", "n2"):
        api.admin.post("/v1/nodes", json=node(name)).raise_for_status()
    listed = [workload("web", "default"), workload("db", "default"), workload("api")]
    api.admin.post("/v1/workloads", json=listed).raise_for_status()
    high = {"apiVersion": "finesched.io/v1alpha1", "kind": "PriorityClass", "metadata": {"name": "high"},
            "spec": {"value": 1000}}  # fmt: skip
    api.admin.post("/v1/priorityclasses", json=high).raise_for_status()
    admin = api.token("admin")
    for args, shown in GET_FORMS:
        done = cli(api, admin, "get", *args)
        assert done.returncode == 0, (args, done.stderr)
        table = " ".join(BOX.sub(" ", done.stdout).split())
        for expected in shown:
            assert expected in table, (args, done.stdout)
        if len(args) > 1 and not args[1].startswith("-"):  # one object: only it
            others = {"web": "db", "team-a/api": "web", "api": "web", "n1": "n2", "n2": "n1", "team-b": "team-a"}
            if args[1] in others:
                assert others[args[1]] not in table, (args, done.stdout)
    one = json.loads(cli(api, admin, "get", "node", "n1", "-o", "json").stdout)
    assert one["metadata"]["name"] == "n1"  # the object itself, as kubectl prints one
    assert (
        yaml.safe_load(cli(api, admin, "get", "tenant", "team-a", "-o", "yaml").stdout)["metadata"]["name"] == "team-a"
    )
    for args, message in (
        (("events", "x"), "get events takes no NAME"),
        (("workload", "web", "--phase", "Bound"), "takes no filter (--phase)"),
        (("pods",), "use workloads, jobs, nodes, tenants, priorityclasses, topologies or events"),
    ):
        done = cli(api, admin, "get", *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    missing = cli(api, admin, "get", "workload", "nope")
    assert missing.returncode == 1 and "404" in missing.stderr


@SQLITE
def test_slots_that_differ_at_their_end_stay_apart_in_80_columns(api: Api, tmp_path: Path) -> None:
    api.admin.post("/v1/nodes", json=node("gpu-node-with-a-rather-long-name-1", cpu="64")).raise_for_status()
    command = ["sleep", "60"]
    job = {"apiVersion": "finesched.io/v1alpha1", "kind": "Job",
           "metadata": {"name": "clicks", "namespace": "team-a"},
           "spec": {"defaultSlot": {"cpu": "100m", "taskHeap": "32Mi", "managedOffHeap": "32Mi", "network": "1Mi"},
                    "tasks": [{"id": "clicks-source", "parallelism": 6, "operators": [{"id": "read"}],
                               "command": command},
                              {"id": "clicks-count", "parallelism": 6, "operators": [{"id": "count"}],
                               "command": command}],
                    "edges": [{"from": "clicks-source", "to": "clicks-count"}]}}  # fmt: skip
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    mine = api.token("tenant", tenant="team-a")
    slots = [f"team-a/clicks-region-0-{i}" for i in range(6)]
    for args in (("job", "submit", str(path)), ("describe", "job", "clicks"), ("get", "events"),
                 ("get", "workloads", "--job", "clicks")):  # fmt: skip
        done = cli(api, mine, *args)
        assert done.returncode == 0, (args, done.stderr)
        words = BOX.sub(" ", done.stdout).split()
        shown = [w for w in words if any(w == s or ("…" in w and _shortens(w, s)) for s in slots)]
        named = {s for s in slots for w in shown if w == s or _shortens(w, s)}
        assert named == set(slots), (args, done.stdout)  # every slot there, each told apart from the others
        for word in shown:
            assert sum(_shortens(word, s) or word == s for s in slots) == 1, (args, word)


def _shortens(word: str, whole: str) -> bool:
    head, sep, tail = word.partition("…")
    return bool(sep) and whole.startswith(head) and whole.endswith(tail) and len(whole) >= len(word)


@SQLITE
def test_validate_with_a_tenant_token_knows_its_namespaces(api: Api, tmp_path: Path) -> None:
    api.admin.put("/v1/tenants/team-a", json={**tenant("team-a"), "spec": {"namespaces": ["team-a-ci"]}})
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump_all([workload("w1", "team-a"), workload("w2", "team-a-ci"),
                                        workload("w3", "elsewhere")]))  # fmt: skip
    done = cli(api, api.token("tenant", tenant="team-a"), "validate", str(path))
    assert done.returncode == 0, done.stderr
    assert "team-a-ci" not in done.stderr and "namespace team-a " not in done.stderr
    assert "elsewhere" in done.stderr  # a namespace no tenant it knows owns: still a warning
    env = {k: v for k, v in os.environ.items() if not k.startswith("FINESCHED_")}
    offline = subprocess.run([*FINESCHED, "validate", str(path)], capture_output=True, text=True, env=env)
    assert offline.returncode == 0 and "team-a-ci" in offline.stderr  # the files alone do not say


@SQLITE
def test_describe_keeps_the_agents_paths_whole_in_80_columns(api: Api) -> None:
    """What the node agent applied, a field a line; a path wider than the terminal is never broken
    inside a word (the terminal folds it; a copy pastes it whole)."""
    api.admin.post("/v1/nodes", json=node("n1")).raise_for_status()
    api.admin.post("/v1/workloads", json=workload("w", "team-a")).raise_for_status()
    api.wait_phase("team-a/w", ("Bound",))
    agent = api.client(api.token("agent", node="n1"))
    assert agent.post("/v1/bindings/team-a/w/ack").status_code == 200
    log = "/var/lib/finesched/agent/workloads/team-a.w-5c558c6b-f20a-4eec-a1b1-bedf79852f35/output.log"
    cgroup = "/sys/fs/cgroup/memory/finesched/agent-bd6ed8535488/team-a.w-a4559ff8131f8daf"
    info = {"pid": 42, "log": log, "cgroup": {"paths": [cgroup], "cpu.shares": "819"}, "user": {"uid": 200000}}
    assert agent.post("/v1/workloads/team-a/w/status", json={"phase": "Running", "info": info}).status_code == 200
    env = {**os.environ, "COLUMNS": "80", "FINESCHED_SERVER": api.base, "FINESCHED_TOKEN": api.token("admin")}
    described = subprocess.run([*FINESCHED, "describe", "workload", "team-a/w"], capture_output=True, text=True,
                               timeout=60, env=env)  # fmt: skip
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert f"  log: {log}" in lines and f"      - {cgroup}" in lines and "    cpu.shares: 819" in lines
    assert "  pid: 42" in lines and "    uid: 200000" in lines
    assert all(len(line) <= 80 for line in lines if log not in line and cgroup not in line)


@SQLITE
def test_get_tenants_shows_every_cap_and_every_namespace_a_tenant_owns(api: Api) -> None:
    spec = {"quota": {"cpu": "8"}, "max": {"cpu": "4", "memory": "16Gi"}, "namespaces": ["team-a-ci"]}
    api.admin.put("/v1/tenants/team-a", json={**tenant("team-a"), "spec": spec}).raise_for_status()
    api.admin.put("/v1/tenants/team-b", json=tenant("team-b")).raise_for_status()
    done = cli(api, api.token("admin"), "get", "tenants")
    assert done.returncode == 0, done.stderr
    table = " ".join(BOX.sub(" ", done.stdout).split())
    assert "team-a 1.0 quota cpu=8; max cpu=4, team-a, team-a-ci memory=16Gi" in table  # wrapped in its cells
    assert "team-b 1.0 - team-b" in table  # no cap; its own namespace
