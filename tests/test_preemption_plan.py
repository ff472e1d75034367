"""`finesched plan`: preemptions shown (who is evicted for whom and why), `--no-preemption` turns them off."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from finesched.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WAVES = ["--waves", str(EXAMPLES / "preemption-batch.yaml"), str(EXAMPLES / "preemption-serving.yaml")]
runner = CliRunner()


def plan(*args: str) -> dict:
    result = runner.invoke(app, ["plan", "-o", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plan_shows_preemption() -> None:
    # Wave 1 spreads train-a and train-b over both GPUs (half each); train-c (a whole GPU) waits.
    # Wave 2: infer (priority 100, a whole GPU) evicts one half: the latest-started, train-b on GPU 1.
    doc = plan(*WAVES)
    assert doc["preemptions"] == [
        {
            "preemptor": "serving/infer",
            "node": "gpu-1",
            "victims": [{"workload": "batch/train-b", "tenant": "batch", "priority": 0, "reason": "priority 0 < 100"}],
            "budgetViolations": 0,
        }
    ]
    by_name = {r["workload"]: r for r in doc["results"]}
    assert by_name["batch/train-b"]["evictedBy"] == "serving/infer"
    assert by_name["serving/infer"]["devices"]["gpu"][0]["minor"] == 1
    assert doc["summary"]["evicted"] == 1 and doc["summary"]["placed"] == 2


def test_plan_no_preemption() -> None:
    doc = plan("--no-preemption", *WAVES)
    assert "preemptions" not in doc and doc["summary"]["evicted"] == 0
    by_name = {r["workload"]: r for r in doc["results"]}
    assert by_name["serving/infer"]["node"] is None


def test_plan_table_names_victim_and_reason() -> None:
    result = runner.invoke(app, ["plan", *WAVES], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert "evicted by serving/infer (priority 0 < 100)" in result.output
    assert "Preemptions" in result.output
