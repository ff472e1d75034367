"""A fill run reuses the reasons of a failure for the next arrivals of the same shape while the
cluster is unchanged (sim/experiment.py `_Failures`): the run is the same as without reusing."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_traces import NODE_HEADER, NODES, POD_HEADER, pod_rows, write

from finesched.sim import experiment
from finesched.sim.experiment import run_fill
from finesched.sim.trace import load_nodes, load_pods


def _record(nodes: Path, pods: Path, policy: str, seed: int) -> dict[str, object]:
    run = run_fill(load_nodes(nodes), load_pods(pods), policy, seed, inflation=2.5)
    record = run.record()
    record.pop("wall_s")
    return record


@pytest.mark.parametrize("policy", ["FGD", "BestFit", "Random", "FGD-CPU", "GpuPacking"])
@pytest.mark.parametrize("seed", [1, 5])
def test_reusing_failures_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, seed: int
) -> None:
    # 30 nodes and pods of 7 shapes inflated to 250 % of the GPUs: runs of failures of one shape.
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, NODES)
    pods = write(tmp_path / "pods.csv", POD_HEADER, pod_rows(150, seed=seed))
    reused: list[list[str]] = []
    get = experiment._Failures.get

    def counting(self: experiment._Failures, key: experiment._FailureKey) -> list[str] | None:
        found = get(self, key)
        if found is not None:
            reused.append(found)
        return found

    monkeypatch.setattr(experiment._Failures, "get", counting)
    with_reuse = _record(nodes, pods, policy, seed)
    # BestFit normalizes its scores over all nodes and Random draws a node: not node-local, never reused
    assert bool(reused) == (policy not in ("BestFit", "Random"))
    monkeypatch.setattr(experiment._Failures, "get", lambda self, key: None)
    assert _record(nodes, pods, policy, seed) == with_reuse
    assert with_reuse["failed"] >= len(reused)


def test_failures_are_not_reused_with_preemption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With preemption a failing arrival may evict others: every one goes to the scheduler.
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, NODES)
    pods = write(tmp_path / "pods.csv", POD_HEADER, pod_rows(150))
    asked: list[object] = []
    monkeypatch.setattr(experiment._Failures, "get", lambda self, key: asked.append(key))
    run = run_fill(load_nodes(nodes), load_pods(pods), "FGD", 1, inflation=1.6, preemption=True, priorities=(1, 1))
    assert run.failed > 0
    assert asked == []
