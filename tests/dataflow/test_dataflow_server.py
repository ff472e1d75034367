"""`finesched job submit` end to end: the real control plane (SQLite, uvicorn on 127.0.0.1) places the gang
and answers with per-slot bindings that carry the managed-memory quotas."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml
from typer.testing import CliRunner

from finesched.cli import app
from finesched.model.manifest import load_manifests, to_manifest
from finesched.server.api.auth import create_token
from finesched.server.app import create_app
from finesched.server.loop.loop import LoopConfig
from finesched.server.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"
runner = CliRunner(env={"COLUMNS": "250"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(URL, admin token) of a server whose only node is examples/cluster.yaml's a100-0 (8 GPUs, 128 cpu)."""
    store = Store.open(f"sqlite:///{tmp_path / 'fs.db'}")
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(store, LoopConfig(idle_wait_s=0.05)), host="127.0.0.1", port=_free_port(), log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait(lambda: server.started, "uvicorn start")
    url = f"http://127.0.0.1:{server.config.port}"
    token = create_token(store, "admin")
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as admin:
            _wait(lambda: admin.get("/readyz").json().get("leader"), "leadership")
            a100 = next(n for n in load_manifests(ROOT / "examples" / "cluster.yaml").nodes if n.name == "a100-0")
            assert admin.post("/v1/nodes", json=to_manifest(a100)).status_code == 201
            for namespace in ("ml", "analytics", "demo"):  # the examples' namespaces need their tenants
                tenant = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": namespace}}
                assert admin.post("/v1/tenants", json=tenant).status_code == 201
        yield url, token
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        store.close()


def test_submit_places_the_gang_and_prints_each_slots_binding_and_quotas(control_plane: tuple[str, str]) -> None:
    url, token = control_plane
    args = ["job", "submit", str(JOBS / "gpu-inference.yaml"), "--server", url, "--token", token, "-o", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["job"] == "ml/image-tagging" and answer["status"] == "Bound"
    assert [s["workload"] for s in answer["slots"]] == ["ml/image-tagging-region-0-0", "ml/image-tagging-region-0-1"]
    for slot in answer["slots"]:
        assert slot["group"] == "region-0" and slot["binding"]["node"] == "a100-0"
        assert slot["quotas"]["resnet"] == 2**30
        assert len(slot["binding"]["devices"]["gpu"]) == 1
    # the stored binding itself carries the quotas annotation (the node agent reads it from there)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as admin:
        stored = admin.get("/v1/workloads/ml/image-tagging-region-0-1").json()
    assert (
        json.loads(stored["status"]["binding"]["annotations"]["finesched.io/managed-memory-quotas"])["resnet"] == 2**30
    )
    table = runner.invoke(app, ["job", "submit", str(JOBS / "named-groups.yaml"), "--server", url, "--token", token])
    assert table.exit_code == 0, table.output
    assert (
        "Job default/fraud-detection: Gang placement: Bound" in table.stdout and "feature-state=768Mi" in table.stdout
    )


def test_submit_with_a_bad_token_is_refused(control_plane: tuple[str, str]) -> None:
    url, _ = control_plane
    result = runner.invoke(app, ["job", "submit", str(JOBS / "gpu-inference.yaml"), "--server", url, "--token", "nope"])
    assert result.exit_code == 1 and "refused the job (401)" in result.stderr
    assert "finesched token create" in result.stderr  # how to get a token


def test_get_describe_and_delete_job_from_the_cli(control_plane: tuple[str, str]) -> None:
    url, token = control_plane
    auth = ["--server", url, "--token", token]
    assert runner.invoke(app, ["job", "submit", str(JOBS / "two-regions.yaml"), *auth]).exit_code == 0
    listed = runner.invoke(app, ["get", "jobs", *auth])
    assert listed.exit_code == 0 and "clicks" in listed.stdout and "3: 3 Bound" in listed.stdout
    as_json = json.loads(runner.invoke(app, ["get", "jobs", "-n", "default", "-o", "json", *auth]).stdout)
    assert [j["status"]["phase"] for j in as_json] == ["Starting"]  # bound, no agent runs them yet
    slots = runner.invoke(app, ["get", "workloads", "--job", "clicks", "-o", "json", *auth])
    assert len(json.loads(slots.stdout)) == 3
    described = runner.invoke(app, ["describe", "job", "clicks", *auth])
    assert described.exit_code == 0, described.output
    assert "clicks-source, clicks-count" in described.stdout and "Restarts: 0 of 3" in described.stdout
    deleted = runner.invoke(app, ["delete", "job", "default/clicks", *auth])
    assert deleted.exit_code == 0 and "3 slot(s), 3 released" in deleted.stdout
    gone = runner.invoke(app, ["describe", "job", "default/clicks", *auth])
    assert gone.exit_code == 1 and "not found" in gone.output


def test_submit_refuses_a_job_without_commands_before_sending(control_plane: tuple[str, str], tmp_path: Path) -> None:
    url, token = control_plane
    doc = yaml.safe_load((JOBS / "two-regions.yaml").read_text())
    del doc["spec"]["tasks"][0]["command"]
    path = tmp_path / "no-command.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = runner.invoke(app, ["job", "submit", str(path), "--server", url, "--token", token])
    assert result.exit_code == 1 and "spec.tasks[0].command" in result.stderr and "refused" not in result.stderr
