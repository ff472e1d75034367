"""`finesched sim topology` (sim/topology.py): a small generated cluster in racks and blocks, gangs
beside trace pods; placements checked from the bindings, numbers checked against each other, and
bad options answered with what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from finesched.commands.sim import sim_app
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL
from finesched.sim.topology import TopologyRun, run_topology
from finesched.sim.topology_workload import TopologyConfig, arrange, generate_nodes, make_gangs, parse_gang_mix
from finesched.sim.trace import load_nodes, load_pods

runner = CliRunner()
#: 32 nodes of 8 GPUs: 8 racks of 4 nodes (32 GPUs), 4 blocks of 2 racks; busy enough that gangs wait.
SMALL = TopologyConfig(
    rack_size=4, block_size=2, gang_mix=parse_gang_mix("2:0.3,8:0.4,16:0.2,48:0.1"), fractional_share=0.3,
    gang_rate=40, gang_duration=1800, hours=2, background="none",
)  # fmt: skip


def rack_and_block(table_nodes: int, config: TopologyConfig) -> dict[str, tuple[str, str]]:
    """Node name -> (rack, block) from the labels the experiment gives the nodes."""
    nodes = arrange(generate_nodes(table_nodes), config.rack_size, config.block_size)
    return {n.name: (n.labels[RACK_LABEL], n.labels[BLOCK_LABEL]) for n in nodes}


def check_consistent(run: TopologyRun, where: dict[str, tuple[str, str]]) -> None:
    """The aggregate numbers agree with the bindings and with each other."""
    record = run.record()
    assert record["placed"] + record["never_placed"] == record["gangs"] == run.gangs
    assert len(run.gang_nodes) == run.placed
    in_rack = sum(len({where[n][0] for n in nodes}) == 1 for nodes in run.gang_nodes.values())
    in_block = sum(len({where[n][1] for n in nodes}) == 1 for nodes in run.gang_nodes.values())
    assert (run.in_rack, run.in_block) == (in_rack, in_block)
    assert run.in_rack <= run.in_block <= run.placed
    assert len(run.gang_waits) == run.placed and (run.gang_waits >= 0).all()
    assert 0 <= record["free_racks_min"] <= record["free_racks_mean"] <= run.racks == 8
    assert (run.alloc >= 0).all() and (run.alloc <= 100 + 1e-9).all()
    assert sum(s["placed"] for s in record["by_size"].values()) == run.placed


def test_arrange_labels_racks_and_blocks() -> None:
    nodes = arrange(generate_nodes(10), rack_size=3, block_size=2)
    assert [n.labels[RACK_LABEL] for n in nodes] == ["r0"] * 3 + ["r1"] * 3 + ["r2"] * 3 + ["r3"]
    assert [n.labels[BLOCK_LABEL] for n in nodes] == ["b0"] * 6 + ["b1"] * 4
    assert all(n.labels[HOSTNAME_LABEL] == n.name for n in nodes)


def test_unaware_run_is_consistent_and_seeded() -> None:
    run = run_topology(generate_nodes(32), None, "unaware", 7, SMALL)
    assert run.gangs > 20
    check_consistent(run, rack_and_block(32, SMALL))
    assert run.level_violations == 0  # not counted for gangs that ask no topology
    again = run_topology(generate_nodes(32), None, "Unaware", 7, SMALL)
    assert {**run.record(), "wall_s": 0} == {**again.record(), "wall_s": 0}
    assert again.gang_nodes == run.gang_nodes


@pytest.mark.parametrize("policy", ["BestFit", "KeepDomainsWhole"])
def test_required_levels_hold_in_the_bindings(policy: str) -> None:
    run = run_topology(generate_nodes(32), None, policy, 7, SMALL)
    where = rack_and_block(32, SMALL)
    check_consistent(run, where)
    gangs = make_gangs(SMALL, 7, rack_limit=32)
    for name, nodes in run.gang_nodes.items():
        level = gangs.level[int(name[1:])]
        column = 0 if level == RACK_LABEL else 1
        assert len({where[n][column] for n in nodes}) == 1, (name, level, nodes)
    assert run.level_violations == 0
    assert run.in_block == run.placed  # a 48-member gang requires a block; every other gang a rack


def test_trace_pods_beside_the_gangs(tiny_trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(tiny_trace[0]), load_pods(tiny_trace[1])
    config = TopologyConfig(rack_size=5, block_size=2, gang_rate=10, hours=1, time_scale=1, gang_duration=600)
    run = run_topology(nodes, pods, "unaware", 1, config)
    assert len(run.pod_waits) + run.pods_unplaced > 0
    assert run.record()["placed"] + run.record()["never_placed"] == run.gangs


def test_gangs_follow_the_rack_limit() -> None:
    gangs = make_gangs(SMALL, 3, rack_limit=8)
    demand = gangs.gpus(SMALL.share_milli)
    assert [lv == RACK_LABEL for lv in gangs.level] == [bool(d <= 8) for d in demand]
    assert set(gangs.members.tolist()) <= {2, 8, 16, 48}


@given(
    st.lists(st.tuples(st.integers(1, 1024), st.floats(0.01, 100)), min_size=1, max_size=6, unique_by=lambda t: t[0])
)
def test_gang_mix_round_trips(mix: list[tuple[int, float]]) -> None:
    text = ",".join(f"{m}:{w!r}" for m, w in mix)
    assert parse_gang_mix(text) == tuple(sorted(mix))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2:0.3,8", "bad element '8'"),
        ("0:1", "bad element '0:1'"),
        ("2:-1", "bad element '2:-1'"),
        ("2:0.5,2:0.5", "2 members given twice"),
        ("2:0,8:0", "positive sum"),
        ("2000:1", "at most 1024 members"),
    ],
)
def test_bad_gang_mix_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_gang_mix(text)


# CLI -----------------------------------------------------------------------------------------------------
def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(sim_app, ["topology", *args])
    return result.exit_code, result.stdout, result.stderr


SMALL_ARGS = ("--generate", "32", "--background", "none", "--rack-size", "4", "--block-size", "2",
              "--gang-rate", "20", "--hours", "1", "--gang-duration", "1800")  # fmt: skip


def test_cli_json_and_report(tmp_path: Path) -> None:
    code, stdout, stderr = invoke(*SMALL_ARGS, "--policy", "unaware", "--seeds", "1-2", "-o", "json",
                                  "--out", str(tmp_path / "out"))  # fmt: skip
    assert code == 0, stderr
    data = json.loads(stdout)
    assert [(r["policy"], r["seed"]) for r in data["results"]] == [("unaware", 1), ("unaware", 2)]
    assert data["summary"]["unaware"]["seeds"] == 2
    for name in ("topology.json", "alloc.png", "racks.png", "report.html"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    written = json.loads((tmp_path / "out" / "topology.json").read_text())
    assert written["results"] == data["results"] and len(written["series"]) == 2


def test_cli_table() -> None:
    code, stdout, stderr = invoke(*SMALL_ARGS, "--policy", "unaware")
    assert code == 0, stderr
    lines = stdout.splitlines()
    row = next(line for line in lines if line.startswith("│ unaware"))
    figures = row.replace("│", " ").split()[1:]
    assert len(figures) == 7 and all("…" not in f for f in figures)  # never cut
    assert any("rack" in line and "block" in line for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--rack-size", "0"), "--rack-size must be >= 1 node, got 0"),
        (("--block-size", "-1"), "--block-size must be >= 1 rack, got -1"),
        (("--gang-mix", "8"), "--gang-mix: bad element '8'"),
        (("--fractional-share", "1.5"), "--fractional-share must be in [0, 1], got 1.5"),
        (("--share-milli", "1000"), "--share-milli must be a multiple of 10 in [10, 990], got 1000"),
        (("--gang-rate", "-1"), "--gang-rate must be >= 0 gangs per hour"),
        (("--hours", "0"), "--hours must be in (0, 10000]"),
        (("--level", "row"), "--level must be auto, rack or block, got 'row'"),
        (("--background", "some"), "--background must be one of all, share, none"),
        (("--policy", "Tightest"), "unknown topology policy 'Tightest'"),
        (("--node-policy", "Nope"), "--node-policy: unknown policy 'Nope'"),
        (("--seeds", "5-1"), "--seeds: bad seed range '5-1'"),
        (("--generate", "0"), "--generate must be >= 1 node, got 0"),
        (("-o", "yaml"), "--output must be one of table, wide, json, got 'yaml'"),
    ],
)
def test_cli_bad_options_exit_2_with_the_reason(args: tuple[str, ...], message: str) -> None:
    code, stdout, stderr = invoke(*SMALL_ARGS, *args)
    assert code == 2
    assert message in stderr and stdout == ""


def test_cli_missing_node_file_exits_1(tmp_path: Path) -> None:
    code, _, stderr = invoke("--nodes", str(tmp_path / "none.csv"), "--background", "none")
    assert code == 1 and "--nodes file not found" in stderr
