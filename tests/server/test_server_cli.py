"""The CLI client against a real server: token create, submit, get, describe, delete, watch, cordon."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from manifests import node, workload
from server_harness import FINESCHED, Api

from finesched.server.api.auth import digest
from finesched.server.store.store import Store


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=60, env=env)


def test_token_create_stores_only_a_digest(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    done = run("token", "create", "--db", db, "--role", "agent", "--node", "n1")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    store = Store.open(db)
    with store.read() as conn:
        rows = conn.exec_driver_sql("SELECT digest, role, node FROM tokens").all()
    assert rows == [(digest(token), "agent", "n1")]
    assert token not in (tmp_path / "db.sqlite").read_bytes().decode("latin-1")
    bad = run("token", "create", "--db", db, "--role", "root")
    assert bad.returncode == 1 and "--role" in bad.stderr and "admin, agent, tenant" in bad.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_client_commands(api: Api, tmp_path: Path) -> None:
    token = api.token("admin")
    common = ("--server", api.base, "--token", token)
    manifests = tmp_path / "cluster.yaml"
    manifests.write_text(
        yaml.safe_dump_all(
            [node("n1", cores=4), workload("db", cpu="2", qos="LSR", limits={"cpu": "2", "memory": "1Gi"})]
        )
    )
    done = run("submit", "-f", str(manifests), *common)
    assert done.returncode == 0, done.stderr
    assert "team-a/db" in done.stdout and "registered" in done.stdout
    api.wait_phase("team-a/db", ("Bound",))
    listed = run("get", "workloads", "-o", "json", *common)
    (item,) = json.loads(listed.stdout)
    assert item["status"]["phase"] == "Bound" and item["status"]["binding"]["node"] == "n1"
    table = run("get", "workloads", *common)
    assert "Bound" in table.stdout and "team-a/db" in table.stdout
    wide = run("get", "workloads", "-o", "wide", *common)  # the binding's details: -o wide
    assert item["status"]["binding"]["cpuset"] in wide.stdout and "team-a" in wide.stdout
    described = run("describe", "workload", "team-a/db", *common)
    assert described.returncode == 0
    assert "Cpuset:" in described.stdout and "Submitted" in described.stdout and "Bound" in described.stdout
    as_yaml = yaml.safe_load(run("describe", "workload", "db", "-n", "team-a", "-o", "yaml", *common).stdout)
    assert [e["reason"] for e in as_yaml["events"]][:2] == ["Submitted", "Bound"]
    tenant = run("describe", "tenant", "team-a", *common)
    assert tenant.returncode == 0 and "Tenant team-a" in tenant.stdout and "Weight:" in tenant.stdout
    tenant_json = json.loads(run("describe", "tenant", "team-a", "-o", "json", *common).stdout)
    assert tenant_json["metadata"]["name"] == "team-a" and isinstance(tenant_json["events"], list)
    watched = run("watch", "--since", "0", "--count", "3", "-o", "json", *common)  # team-a, team-b, then n1
    assert watched.returncode == 0 and '"Registered"' in watched.stdout
    assert run("cordon", "n1", *common).returncode == 0
    assert json.loads(run("get", "nodes", "-o", "json", *common).stdout)[0]["status"]["cordoned"] is True
    assert run("delete", "workload", "team-a/db", *common).returncode == 0
    assert json.loads(run("get", "workloads", "-o", "json", *common).stdout) == []
    # Errors: bad manifests are reported with their file and field, a bad token is refused.
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(workload("w", cpu="lots")))
    refused = run("submit", "-f", str(bad), *common)
    assert refused.returncode == 1 and "spec.requests.cpu" in refused.stderr
    denied = run("get", "nodes", "--server", api.base, "--token", "fs_wrong")
    assert denied.returncode == 1 and "401" in denied.stderr
    usage = run("get", "pods", *common)
    assert usage.returncode == 2
    assert "workloads, jobs, nodes, tenants, priorityclasses, topologies or events" in usage.stderr


def test_serve_refuses_bad_options_in_one_line(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    for args, fragment in (
        (["--log-level", "loud"], "--log-level"),
        (["--port", "0"], "--port"),
        (["--profile", "nope"], "unknown profile"),
        (["--db", "mysql://x/y"], "unsupported database"),
    ):
        done = run("serve", "--db", db, *args) if args[0] != "--db" else run("serve", *args)
        assert done.returncode in (1, 2) and fragment in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
