"""`finesched sim fill|replay` through typer's CliRunner: output shapes, files, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sim_traces import POD_HEADER, write
from typer.testing import CliRunner

from finesched.commands.sim import DEFAULT_NODES, DEFAULT_PODS, parse_policies, sim_app
from finesched.sim.policies import BASELINES, BEST

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(sim_app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_fill_json_shape(tiny_trace: tuple[Path, Path]) -> None:
    nodes, pods = map(str, tiny_trace)
    code, stdout, _ = invoke(
        "fill", "--nodes", nodes, "--pods", pods, "--policy", "FGD,best", "--seeds", "1-2", "-o", "json"
    )
    assert code == 0
    data = json.loads(stdout)
    assert set(data) == {"results", "summary"}
    assert [(r["policy"], r["seed"]) for r in data["results"]] == [("FGD", 1), ("FGD", 2), (BEST, 1), (BEST, 2)]
    row = data["results"][0]
    keys = {"policy", "seed", "alloc", "unallocated_130", "frag_amount", "failed", "failed_reasons", "wall_s"}
    assert set(row) == keys
    assert set(row["alloc"]) == {"90", "95", "100", "110", "120", "130"}
    assert set(data["summary"]) == {"FGD", BEST}
    assert set(data["summary"]["FGD"]) == {"mean_130", "std_130"}


def test_fill_table_and_out_dir(tiny_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = map(str, tiny_trace)
    out = tmp_path / "report"
    code, stdout, stderr = invoke(
        "fill",
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--policy",
        "BestFit",
        "--seeds",
        "3",
        "--jobs",
        "2",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    assert "BestFit" in stdout and "LP bound" in stdout
    for name in ("results.csv", "results.json", "alloc.png", "frag.png", "report.html"):
        assert (out / name).stat().st_size > 0
    assert "data:image/png;base64," in (out / "report.html").read_text()
    saved = json.loads((out / "results.json").read_text())
    assert saved["lp_bound"]["3"]["130"] >= saved["results"][0]["alloc"]["130"]
    assert (out / "results.csv").read_text().splitlines()[0].startswith("policy,seed,trace,pods,alloc_90")
    # the fragmentation ratio F / Σ R_n reaches the table, the summary and the HTML next to the amount
    assert "ratio" in stdout
    summary = saved["summary"]["BestFit"]
    assert {"mean_130", "std_130", "frag_amount_130", "failed_mean", "wall_s_mean"} <= set(summary)
    assert summary["frag_ratio_130"] == pytest.approx(saved["results"][0]["frag_ratio"]["130"])
    assert "<th>frag amount @130</th><th>frag ratio @130</th>" in (out / "report.html").read_text()


def test_replay_json(tiny_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = map(str, tiny_trace)
    out = tmp_path / "replay"
    code, stdout, _ = invoke(
        "replay", "--nodes", nodes, "--pods", pods, "--time-scale", "100", "-o", "json", "--out", str(out)
    )
    assert code == 0
    data = json.loads(stdout)
    assert data["results"][0]["placed"] == 150 and "delay_s" in data["results"][0]
    assert (out / "utilization.png").exists() and (out / "report.html").exists()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param(["--policy", "Tetris"], 2, "unknown policy 'Tetris'; valid: Random, DotProd", id="unknown-policy"),
        pytest.param(["--seeds", "9-3"], 2, "error: --seeds: bad seed range '9-3'", id="bad-seeds"),
        pytest.param(["--seeds", "1-5,5x"], 2, "error: --seeds: bad seed range '5x': use N", id="bad-seed-element"),
        pytest.param(["-o", "yaml"], 2, "--output must be one of table, wide, json", id="bad-output"),
        pytest.param(["--jobs", "0"], 2, "--jobs must be >= 1", id="bad-jobs"),
        pytest.param(["--inflation", "-1"], 2, "--inflation must be in (0, 10]", id="bad-inflation"),
        pytest.param(["--nodes", "/nonexistent.csv"], 1, "--nodes file not found", id="missing-file"),
    ],
)
def test_fill_usage_errors_are_one_line(
    tiny_trace: tuple[Path, Path], args: list[str], code: int, message: str
) -> None:
    base = ["fill", "--nodes", str(tiny_trace[0]), "--pods", str(tiny_trace[1])]
    got, stdout, stderr = invoke(*base, *args)
    assert got == code
    assert message in stderr and "Traceback" not in stderr + stdout
    assert len(stderr.strip().splitlines()) == 1


def test_fill_bad_csv_names_the_line(tiny_trace: tuple[Path, Path], tmp_path: Path) -> None:
    bad = write(
        tmp_path / "bad.csv",
        POD_HEADER,
        ["p0,1000,512,1,500,,LS,Running,0,1,0", "p1,1000,512,1,1500,,LS,Running,0,1,0"],
    )
    code, _, stderr = invoke("fill", "--nodes", str(tiny_trace[0]), "--pods", str(bad))
    assert code == 1
    assert f"{bad}:3: gpu_milli must be in 1..1000" in stderr.replace("\n", "")


def test_replay_rejects_pod_lists_without_times(tiny_trace: tuple[Path, Path], tmp_path: Path) -> None:
    short = write(tmp_path / "short.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", ["p0,1000,512,1,500"])
    code, _, stderr = invoke("replay", "--nodes", str(tiny_trace[0]), "--pods", str(short))
    assert code == 1 and "no creation/deletion times" in stderr


def test_parse_policies_and_defaults() -> None:
    assert parse_policies("fgd, best") == ["FGD", BEST]
    assert parse_policies("baselines") == list(BASELINES)
    assert parse_policies("all") == [*BASELINES, BEST]
    assert DEFAULT_NODES.name == "openb_node_list_gpu_node.csv" and DEFAULT_NODES.is_file()
    assert DEFAULT_PODS.name == "openb_pod_list_default.csv" and DEFAULT_PODS.is_file()


def _forbid_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any run fail the test: the error must come before a worker starts."""

    def no_run(*_: object, **__: object) -> list[dict[str, object]]:
        raise AssertionError("a run started although --out is unusable")

    monkeypatch.setattr("finesched.sim.runner.run_all", no_run)


@pytest.mark.parametrize("command", ["fill", "replay"])
def test_unusable_out_fails_before_any_run(
    tiny_trace: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    _forbid_runs(monkeypatch)
    taken = tmp_path / "taken"
    taken.write_text("a regular file\n")
    for out in (taken, taken / "sub"):  # the path itself, or a parent of it, is a file
        code, stdout, stderr = invoke(
            command, "--nodes", str(tiny_trace[0]), "--pods", str(tiny_trace[1]), "--out", str(out)
        )
        assert code == 1, stderr
        assert f"--out {out}:" in stderr.replace("\n", "") and "Traceback" not in stderr + stdout
        assert len(stderr.strip().splitlines()) == 1
    assert taken.read_text() == "a regular file\n"


def test_out_is_created_before_the_runs(
    tiny_trace: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import finesched.sim.runner as runner_module

    out = tmp_path / "new" / "report"
    seen: list[bool] = []
    real_run_all = runner_module.run_all

    def spy(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        seen.append(out.is_dir())
        return real_run_all(*args, **kwargs)

    monkeypatch.setattr(runner_module, "run_all", spy)
    code, _, stderr = invoke(
        "fill",
        "--nodes",
        str(tiny_trace[0]),
        "--pods",
        str(tiny_trace[1]),
        "--seeds",
        "1",
        "--no-lp-bound",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    assert seen == [True]
    assert (out / "results.json").is_file()
