"""The simulator's report says why pods failed: the scheduler's reason counts, per run, in the summary,
the CLI table and the HTML report."""

from __future__ import annotations

import json
from pathlib import Path

from sim_traces import NODE_HEADER, POD_HEADER, write
from typer.testing import CliRunner

from finesched.commands.sim import sim_app
from finesched.sim.experiment import run_fill
from finesched.sim.replay import run_replay
from finesched.sim.report import fill_summary, mean_reasons
from finesched.sim.trace import load_nodes, load_pods

runner = CliRunner()


def tiny(tmp_path: Path, pods: list[str]) -> tuple[Path, Path]:
    # 2 nodes of 4 CPUs: one with 2 GPUs, one without any.
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, ["g0,4000,16384,2,A", "c0,4000,16384,0,"])
    return nodes, write(tmp_path / "pods.csv", POD_HEADER, pods)


def test_fill_counts_each_failed_pod_under_its_reasons(tmp_path: Path) -> None:
    # Pods of one whole GPU and 1 CPU: the GPU node takes two (2 GPUs), the CPU node none. Inflated
    # to 200 % of 2 GPUs, 4 arrive; the last two fit nowhere: on g0 no GPU is left (the device
    # filter names both dimensions), on c0 there is no GPU at all: 2 failed pods under each reason.
    nodes, pods = tiny(tmp_path, [f"p{i},1000,1024,1,1000,,LS,Running,0,10,0" for i in range(2)])
    run = run_fill(load_nodes(nodes), load_pods(pods), "FGD", seed=1, inflation=2.0)
    assert run.failed == 2
    assert run.failed_reasons == {
        "node has no gpu": 2,
        "insufficient gpu-core on any single GPU": 2,
        "insufficient gpu-memory on any single GPU": 2,
    }
    record = run.record()
    assert record["failed_reasons"] == run.failed_reasons


def test_cpu_bound_failures_name_cpu(tmp_path: Path) -> None:
    # Pods of 3 CPUs and 10 % of a GPU: after one pod per node... only g0 has GPUs, and 4 CPUs hold
    # one such pod: every later arrival fails on g0 for cpu (and on c0 for having no GPU).
    nodes, pods = tiny(tmp_path, [f"p{i},3000,1024,1,100,,LS,Running,0,10,0" for i in range(20)])
    run = run_fill(load_nodes(nodes), load_pods(pods), "BestFit", seed=3)
    assert run.failed > 0
    assert run.failed_reasons["insufficient cpu"] == run.failed
    assert max(run.failed_reasons.values()) <= run.failed


def test_mean_reasons_over_seeds() -> None:
    rows = [{"failed_reasons": {"insufficient cpu": 4, "b": 1}}, {"failed_reasons": {"insufficient cpu": 2}}, {}]
    # (4 + 2 + 0) / 3 = 2.0; b: 1 / 3 = 0.3; most first
    assert mean_reasons(rows, "failed_reasons") == {"insufficient cpu": 2.0, "b": 0.3}


def test_replay_says_why_pods_were_never_placed(tmp_path: Path) -> None:
    # A pod asking 3 GPUs never fits (2 GPUs at most on one node): unplaced, with the reasons.
    rows = ["big,1000,1024,3,1000,,LS,Running,0,100,0", "ok,1000,1024,1,1000,,LS,Running,1,50,1"]
    nodes, pods = tiny(tmp_path, rows)
    run = run_replay(load_nodes(nodes), load_pods(pods), "FGD", seed=1)
    assert run.unplaced == 1
    assert run.unplaced_reasons and set(run.unplaced_reasons.values()) == {1}
    assert run.record()["unplaced_reasons"] == run.unplaced_reasons


def test_cli_and_html_show_the_reasons(tiny_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = map(str, tiny_trace)
    out = tmp_path / "report"
    args = ["fill", "--nodes", nodes, "--pods", pods, "--policy", "FGD", "--seeds", "1", "--out", str(out)]
    result = runner.invoke(sim_app, [*args, "--no-lp-bound"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    reasons = fill_summary(saved["results"])["FGD"]["failed_reasons"]
    assert reasons and "Why pods failed" in result.stdout
    top = next(iter(reasons))
    assert top in result.stdout and top in (out / "report.html").read_text()
    data = json.loads(runner.invoke(sim_app, [*args[:-2], "-o", "json"]).stdout)
    assert data["results"][0]["failed_reasons"] == saved["results"][0]["failed_reasons"]
