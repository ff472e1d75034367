"""The finesched CLI: validate, encode/decode, plan; errors are one line with exit 1 (input) or 2 (usage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from finesched import __version__
from finesched.cli import app

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = str(ROOT / "examples" / "cluster.yaml")
WORKLOADS = str(ROOT / "examples" / "workloads.yaml")
runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.stdout.strip() == __version__


def test_validate_examples_summarizes_them() -> None:
    result = runner.invoke(app, ["validate", CLUSTER, WORKLOADS])
    assert result.exit_code == 0, result.output
    assert "valid objects in 2 file(s)" in result.stdout and "a100-0" in result.stdout


def test_validate_lists_a_topology_and_what_each_gang_asks_of_it() -> None:
    result = runner.invoke(app, ["validate", str(ROOT / "examples" / "topology.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "9 valid objects" in result.stdout
    assert "levels topology.finesched.io/block > topology.finesched.io/rack > kubernetes.io/hostname" in result.stdout
    assert "gang train in one topology.finesched.io/rack of dc" in result.stdout


def test_validate_prints_every_error_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: finesched.io/v1alpha1\nkind: Workload\nmetadata: {name: w}\n"
        "spec: {requests: {cpu: abc, memory: -1Gi}}\n"
    )
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert f'{bad} doc 1, line 4: spec.requests.cpu: "abc" is not a quantity' in result.stderr
    assert "spec.requests.memory" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "want"),
    [
        pytest.param(["encode", "--bits", "7", "100", "50", "0", "100"], "209721700", id="encode"),
        pytest.param(["decode", "209721700", "--count", "4", "--bits", "7"], "100 50 0 100", id="decode"),
    ],
)
def test_codec_commands(args: list[str], want: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and result.stdout.strip() == want


def test_codec_errors_are_one_line() -> None:
    result = runner.invoke(app, ["encode", "--bits", "7", "130"])
    assert result.exit_code == 1 and "does not fit in 7 bits" in result.stderr
    result = runner.invoke(app, ["decode", "209721700", "--count", "2", "--bits", "7"])
    assert result.exit_code == 1 and "needs" in result.stderr


def test_usage_errors_exit_2() -> None:
    assert runner.invoke(app, ["encode", "1", "2"]).exit_code == 2  # --bits missing
    assert runner.invoke(app, ["plan", CLUSTER, "-o", "xml"]).exit_code == 2


def test_plan_table_and_summary() -> None:
    result = runner.invoke(app, ["plan", CLUSTER, WORKLOADS], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Scheduling decisions" in result.stdout and "team-a/web-1" in result.stdout and "Summary:" in result.stdout


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_plan_machine_output(fmt: str) -> None:
    result = runner.invoke(app, ["plan", CLUSTER, WORKLOADS, "-o", fmt])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout) if fmt == "json" else yaml.safe_load(result.stdout)
    placed = [r for r in doc["results"] if r["node"]]
    assert doc["summary"]["placed"] == len(placed) > 0
    assert all(r["node"] in ("cpu-0", "a100-0", "t4-0", "mixed-0") for r in placed)
    assert 0 < doc["summary"]["utilization"]["cpu"] <= 1


def test_plan_rejects_unknown_profile() -> None:
    result = runner.invoke(app, ["plan", CLUSTER, WORKLOADS, "--profile", "nope"])
    assert result.exit_code == 1 and "unknown profile" in result.stderr


def test_console_script_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = subprocess.run(
        [sys.executable, "-m", "finesched.cli", "validate", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1 and "is not valid JSON: line 1 column 2" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["encode", "--bits", "0", "1"], "'--bits'"),
        (["decode", "5", "--count", "-1", "--bits", "7"], "'--count'"),
        (["encode", "--bits", "7", "abc"], "'values'"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_console_script_usage_errors_are_one_line_and_exit_2(args: list[str], names: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "finesched.cli", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], proc.stderr


def test_plan_shows_numa_amounts_and_shared_pools() -> None:
    table = runner.invoke(app, ["plan", CLUSTER, WORKLOADS], env={"COLUMNS": "220"})
    assert "shared pools: socket 0 numa 0" in table.stdout and "numa 0: cpu=1, memory=2Gi" in table.stdout
    data = json.loads(runner.invoke(app, ["plan", CLUSTER, WORKLOADS, "-o", "json"]).stdout)
    by_name = {r["workload"]: r for r in data["results"]}
    assert by_name["team-b/notebook-shortcut"]["numaResources"] == {"0": {"cpu": "1", "memory": "2Gi"}}
    status = by_name["team-b/api-burst"]["annotations"]["scheduling.koordinator.sh/resource-status"]
    assert json.loads(status) == {"cpuSharedPools": [{"socket": 0, "node": 0}]}
