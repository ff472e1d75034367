"""`sim replay --defragment` on a hand-made trace where placement alone leaves a whole-GPU pod waiting
beside two half-used cards, and one move frees a card (the replay's side of issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sim_traces import NODE_HEADER, POD_HEADER, write
from typer.testing import CliRunner

from finesched.commands.sim import sim_app
from finesched.sim.replay import run_replay
from finesched.sim.trace import load_nodes, load_pods

#: One node, two cards. a and b fill card 0, c and d card 1 (best-fit GPU pick); b and d leave at
#: t=10, so both cards are half used when `whole` (1 x 1000 m) arrives at t=20. Without moves it
#: waits until a leaves (t=1000); moving a or c onto the other card frees one at t=20.
ROWS = [
    "a,1000,1024,1,500,,LS,Running,0,1000,0",
    "b,1000,1024,1,500,,LS,Running,1,10,1",
    "c,1000,1024,1,500,,LS,Running,2,1002,2",
    "d,1000,1024,1,500,,LS,Running,3,10,3",
    "whole,1000,1024,1,1000,,LS,Running,20,120,20",
]


@pytest.fixture
def fragmented(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "nodes.csv", NODE_HEADER, ["n0,16000,65536,2,A"]), write(
        tmp_path / "pods.csv", POD_HEADER, ROWS
    )


def test_a_move_frees_a_card_for_the_waiting_whole_gpu_pod(fragmented: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(fragmented[0]), load_pods(fragmented[1])
    alone = run_replay(nodes, pods, "BestFit", seed=1)
    moved = run_replay(nodes, pods, "BestFit", seed=1, defragmentation={})
    assert alone.unplaced == moved.unplaced == 0
    # without moves the whole-GPU pod waits for a to leave; with one move it starts on arrival
    assert alone.record()["whole_gpu"]["delay_max_s"] == pytest.approx(980.0)
    assert moved.record()["whole_gpu"]["delay_max_s"] == 0.0
    assert alone.record()["waited_gpu_s"] == pytest.approx(980.0)
    assert moved.record()["waited"] == 0 and moved.record()["waited_gpu_s"] == 0.0
    record = moved.record()
    assert record["moves"]["moves"] == 1 and record["moves"]["moved_pods"] == 1 and record["moves"]["plans"] == 1
    assert record["moves"]["moves_pct_of_pods"] == pytest.approx(20.0)
    # the mover (a, started at 0, or c, started at 2) restarts at 20: its half card's work is lost
    assert record["moves"]["restarted_gpu_s"] in (pytest.approx(0.5 * 20), pytest.approx(0.5 * 18))
    assert record["moves"]["planner_answers"] == {"plan found": 1}
    assert record["defragmentation"]["maxMovesPerPlan"] == 4
    # the mover's departure was pushed back from 1000 or 1002 to 20 + its whole duration (the last
    # event); without moves the last event is the whole-GPU pod's end (placed at 1000, runs 100 s)
    assert moved.times[-1] == pytest.approx(20 + 1000.0)
    assert alone.times[-1] == pytest.approx(1000.0 + 100.0)
    assert "moves" not in alone.record() and "defragmentation" not in alone.record()


def test_the_mover_restarts_and_is_counted_once_per_move(fragmented: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(fragmented[0]), load_pods(fragmented[1])
    run = run_replay(nodes, pods, "BestFit", seed=1, defragmentation={"cooldownSeconds": 0})
    # the GPU allocation never exceeds the two cards, also at the move (a mover is not counted twice)
    assert np.all(run.alloc <= 100.0 + 1e-9)
    assert run.alloc.max() == pytest.approx(100.0)
    assert run.record()["moves"]["moves"] == 1


runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(sim_app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_cli_runs_without_and_with_and_reports_side_by_side(fragmented: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = map(str, fragmented)
    out = tmp_path / "report"
    code, stdout, stderr = invoke(
        "replay", "--nodes", nodes, "--pods", pods, "--policy", "BestFit", "--defragment", "--out", str(out)
    )
    assert code == 0, stderr
    assert "Without / with the defragmenter" in stdout and "BestFit +defrag" in stdout
    saved = json.loads((out / "results.json").read_text())
    assert [r.get("defragmentation") is not None for r in saved["results"]] == [False, True]
    assert saved["summary"]["BestFit +defrag"]["moves"] == 1
    assert saved["summary"]["BestFit"]["waited"] == 1 and saved["summary"]["BestFit +defrag"]["waited"] == 0
    assert "every pod movable" in saved["meta"]["defragmentation"]
    page = (out / "report.html").read_text()
    assert "Without and with the defragmenter" in page and "GPU·s of work restarted" in page
    assert "What the planner answered" in page and "plan found" in page
    header = (out / "results.csv").read_text().splitlines()[0]
    assert header.endswith("defrag,waited_gpu_s,moves,restarted_gpu_s")
    code, stdout, _ = invoke("replay", "--nodes", nodes, "--pods", pods, "--defragment", "-o", "json")
    assert code == 0 and json.loads(stdout)["summary"]["FGD +defrag"]["moves"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--cooldown", "-1"], "--cooldown: input should be greater than or equal to 0", id="cooldown"),
        pytest.param(["--max-moves-per-plan", "0"], "--max-moves-per-plan: input should be greater", id="plan"),
        pytest.param(["--max-moves-per-plan", "17"], "--max-moves-per-plan: input should be less", id="plan-hi"),
        pytest.param(["--candidate-nodes", "0"], "--candidate-nodes: input should be greater", id="nodes"),
        pytest.param(["--max-moves-per-minute", "0"], "--max-moves-per-minute: input should be greater", id="minute"),
        pytest.param(["--max-moves-per-tenant-per-minute", "0"], "-per-tenant-per-minute: input", id="tenant"),
    ],
)  # fmt: skip
def test_cli_rejects_bad_defragmentation_settings(
    fragmented: tuple[Path, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    nodes, pods = map(str, fragmented)
    out = tmp_path / "never"
    code, stdout, stderr = invoke("replay", "--nodes", nodes, "--pods", pods, "--defragment", *args, "--out", str(out))
    assert code == 2 and message in stderr and stdout == ""
    assert not out.exists()  # refused before anything ran or was written


def test_cli_settings_need_defragment(fragmented: tuple[Path, Path]) -> None:
    nodes, pods = map(str, fragmented)
    code, _, stderr = invoke("replay", "--nodes", nodes, "--pods", pods, "--cooldown", "5")
    assert code == 2 and "--cooldown needs --defragment" in stderr
