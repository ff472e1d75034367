"""The simulator's priority mix and --preemption: evictions per class and the final allocation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finesched.cli import app
from finesched.sim.experiment import run_fill
from finesched.sim.replay import run_replay
from finesched.sim.trace import load_nodes, load_pods
from sim.sim_traces import NODE_HEADER, NODES, POD_HEADER, pod_rows, write


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "nodes.csv", NODE_HEADER, NODES), write(tmp_path / "pods.csv", POD_HEADER, pod_rows(150))


def test_priority_mix_with_and_without_preemption(trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(trace[0]), load_pods(trace[1])
    plain = run_fill(nodes, pods, "FGD", 3, 1.3, priorities=(60, 30, 10))
    assert plain.record()["evictions"] == 0  # a priority mix alone evicts nothing
    run = run_fill(nodes, pods, "FGD", 3, 1.3, preemption=True, priorities=(60, 30, 10))
    row = run.record()
    assert row["evictions"] > 0 and row["evictions"] == sum(row["evicted_by_priority"].values())
    # Victims are never of the top class: nothing outranks it.
    assert row["evicted_by_priority"]["2"] == 0
    # The final allocation by class adds up to the final allocation rate.
    assert sum(row["alloc_by_priority"].values()) == pytest.approx(run.alloc[-1], abs=1e-3)
    # The top class holds at least as much as without preemption.
    assert row["alloc_by_priority"]["2"] >= plain.record()["alloc_by_priority"]["2"]


def test_no_mix_keeps_the_row_shape(trace: tuple[Path, Path]) -> None:
    row = run_fill(load_nodes(trace[0]), load_pods(trace[1]), "FGD", 3, 1.3).record()
    assert "evictions" not in row and "alloc_by_priority" not in row


def test_sim_cli_flags(trace: tuple[Path, Path]) -> None:
    args = ["sim", "fill", "--nodes", str(trace[0]), "--pods", str(trace[1]), "--seeds", "3", "--policy", "FGD"]
    result = CliRunner().invoke(app, [*args, "--preemption", "--priorities", "60,30,10", "-o", "json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["results"]
    assert row["evictions"] > 0
    bad = CliRunner().invoke(app, [*args, "--priorities", "60,x"])
    assert bad.exit_code == 2 and "--priorities" in bad.output


def test_replay_with_priorities_and_preemption(trace: tuple[Path, Path]) -> None:
    # Everything arrives within 10 s (time scale 200), so pods queue; with preemption a waiting pod may
    # evict lower-priority running ones, which queue again and rerun their whole duration.
    nodes, pods = load_nodes(trace[0]), load_pods(trace[1])
    plain = run_replay(nodes, pods, "FGD", 3, 200.0, priorities=(60, 30, 10)).record()
    assert plain["evictions"] == 0 and plain["evicted_by_priority"] == {"0": 0, "1": 0, "2": 0}
    run = run_replay(nodes, pods, "FGD", 3, 200.0, preemption=True, priorities=(60, 30, 10))
    row = run.record()
    assert row["evictions"] > 0 and row["evictions"] == sum(row["evicted_by_priority"].values())
    assert row["evicted_by_priority"]["2"] == 0  # nothing outranks the top class
    by_class = row["by_priority"]
    assert sum(c["pods"] for c in by_class.values()) == len(pods)
    # every pod ran to its end in the end: none lost, none unplaced (the trace fits once pods leave)
    assert all(c["unplaced"] == 0 and c["evicted_unfinished"] == 0 for c in by_class.values())
    assert run.unplaced == 0 and run.alloc[-1] == pytest.approx(0.0)
    # the top class waits less on average with preemption than without
    assert by_class["2"]["delay_s"]["mean"] <= plain["by_priority"]["2"]["delay_s"]["mean"]


def test_replay_cli_reports_evictions_per_class(trace: tuple[Path, Path]) -> None:
    args = ["sim", "replay", "--nodes", str(trace[0]), "--pods", str(trace[1]), "--seeds", "3", "--policy", "FGD"]
    args += ["--time-scale", "200", "--priorities", "60,30,10"]
    result = CliRunner().invoke(app, [*args, "--preemption", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    (row,) = doc["results"]
    assert row["evictions"] > 0 and set(row["evicted_by_priority"]) == {"0", "1", "2"}
    assert doc["summary"]["FGD"]["evictions"] == row["evictions"]
    table = CliRunner().invoke(app, [*args, "--preemption"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "Replay by priority class" in table.output
    assert CliRunner().invoke(app, [*args[:-2], "--priorities", "x"]).exit_code == 2
