"""The simulator's priority mix and --preemption: evictions per class and the final allocation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finesched.cli import app
from finesched.sim.experiment import run_fill
from finesched.sim.trace import load_nodes, load_pods
from sim.conftest import NODE_HEADER, NODES, POD_HEADER, pod_rows, write


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
