"""`sim fill --mig`: MIG nodes in the trace cluster, profile mapping, and the three-way comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finesched.commands.sim import sim_app
from finesched.model.mig import PRODUCTS
from finesched.sim.mig import MODES, balanced_layout, mig_nodes, run_mig_fill, smallest_profile
from finesched.sim.trace import load_nodes, load_pods
from finesched.state.mig_slices import node_mig_cards

runner = CliRunner()


@pytest.mark.parametrize(
    ("product", "milli", "want"),
    [
        # A100-80GB: 7 compute / 8 memory slices; both fractions must reach d/1000 (MIG.md §1.2)
        ("A100-80GB", 100, "1g.10gb"),  # 1/7 = 0.14, 1/8 = 0.125
        ("A100-80GB", 250, "2g.20gb"),  # 1g.20gb has 1/7 < 0.25 compute; 2g: 0.29, 0.25
        ("A100-80GB", 460, "4g.40gb"),  # 3g: 3/7 = 0.43 < 0.46
        ("A100-80GB", 810, "7g.80gb"),
        ("A30-24GB", 250, "1g.6gb"),  # 1/4 each (MIG.md §1.6)
        ("A30-24GB", 500, "2g.12gb"),
    ],
)
def test_smallest_fitting_profile(product: str, milli: int, want: str) -> None:
    assert smallest_profile(PRODUCTS[product], milli) == want


@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_balanced_layout_is_valid_on_every_product(product: str) -> None:
    g = PRODUCTS[product]
    layout = balanced_layout(g)
    assert not g.problems([(x["profile"], x["start"]) for x in layout])


def test_mig_nodes_are_chosen_the_same_in_every_mode(tiny_trace: tuple[Path, Path]) -> None:
    table = load_nodes(tiny_trace[0])
    picked = {mode: mig_nodes(table, 0.5, "H100-80GB", mode, seed=3)[1] for mode in MODES}
    assert picked["share"] == picked["static"] == picked["dynamic"] and len(picked["share"]) == 10  # half of 21
    static, names = mig_nodes(table, 0.5, "H100-80GB", "static", seed=3)
    one = next(n for n in static if n.name in names)
    assert all(d.mig is not None and d.mig.mode == "static" for d in one.devices)
    assert [c.existing.bit_count() for c in node_mig_cards(one)] == [4] * len(one.devices)


def test_three_modes_on_the_same_pods(tiny_trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(tiny_trace[0]), load_pods(tiny_trace[1])
    runs = {mode: run_mig_fill(nodes, pods, "FGD", 1, share=0.5, mode=mode) for mode in MODES}
    assert len({r.pods for r in runs.values()}) == 1  # the same arrivals
    assert runs["share"].on_mig == 0 and runs["dynamic"].on_mig > 0 and runs["static"].on_mig > 0
    for r in runs.values():
        assert 0 < r.alloc_end <= 130 and r.held_end >= r.alloc_end - 1e-9 and r.frag_end >= 0
    # an instance rounds a share up to its profile: MIG holds more than its pods ask
    assert runs["dynamic"].held_end > runs["dynamic"].alloc_end


def test_cli_table_and_json(tiny_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = map(str, tiny_trace)
    result = runner.invoke(sim_app, ["fill", "--nodes", nodes, "--pods", pods, "--mig", "0.5", "--seeds", "1",
                                     "-o", "json", "--out", str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["mode"] for r in data["results"]] == list(MODES)
    assert set(data["summary"]["FGD"]) == set(MODES)
    assert json.loads((tmp_path / "out" / "mig.json").read_text())["meta"]["share"] == 0.5
    table = runner.invoke(sim_app, ["fill", "--nodes", nodes, "--pods", pods, "--mig", "0.5", "--seeds", "1"])
    assert table.exit_code == 0 and "dynamic" in table.stdout and "static" in table.stdout
    bad = runner.invoke(sim_app, ["fill", "--nodes", nodes, "--pods", pods, "--mig", "0"])
    assert bad.exit_code == 2 and "--mig must be in (0, 1]" in bad.stderr


def test_partition_tables_in_the_simulator_node_model(tiny_trace: tuple[Path, Path]) -> None:
    from finesched.model.workload import Workload
    from finesched.sched.scheduler import Scheduler
    from finesched.sim.experiment import cluster_nodes
    from finesched.sim.trace import partition_table
    from finesched.state.cluster import ClusterState

    assert partition_table(4) == {
        "1": [{"minors": [m], "allocationScore": 1} for m in range(4)],
        "2": [{"minors": [0, 1], "allocationScore": 1}, {"minors": [2, 3], "allocationScore": 1}],
        "4": [{"minors": [0, 1, 2, 3], "allocationScore": 1}],
    }
    table = load_nodes(tiny_trace[0])
    nodes = cluster_nodes(table, "Honor")
    assert all(bool(n.gpu_partitions) == bool(n.devices) for n in nodes)
    assert all(n.partition_policy == "Honor" for n in nodes if n.devices)
    scheduler = Scheduler(ClusterState.from_nodes([n for n in nodes if len(n.devices) == 4][:1]))
    share = Workload.model_validate({"name": "s", "requests": {"gpu-core": 10, "gpu-memory-ratio": 10}})
    scheduler.schedule_one(share)  # on GPU 0 (least allocated, lowest minor)
    pair = scheduler.schedule_one(Workload.model_validate({"name": "p", "requests": {"nvidia.com/gpu": 2}}))
    assert pair.device_minors("gpu") == [2, 3]  # an aligned pair, not 1+2
    nodes_path, pods_path = map(str, tiny_trace)
    result = runner.invoke(sim_app, ["fill", "--nodes", nodes_path, "--pods", pods_path, "--seeds", "1",
                                     "--gpu-partitions", "Honor", "-o", "json"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    bad = runner.invoke(sim_app, ["fill", "--nodes", nodes_path, "--pods", pods_path, "--gpu-partitions", "Always"])
    assert bad.exit_code == 2 and "--gpu-partitions must be Honor or Prefer" in bad.stderr
