"""FGD-CPU-Exact: the FGD plugin's ``exact: K`` select (least exact Δ' among the first K nodes of the
score order), on a hand-worked cluster, against FGD-CPU, with bad args, as a property, and in the simulator."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_traces import NODE_HEADER, NODES, POD_HEADER, pod_rows, write
from test_sim_fragmentation import REGISTRY, node, share, spec
from typer.testing import CliRunner

from builders import make_workload
from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.resources import ResourceVector
from finesched.model.workload import Workload
from finesched.plugins.fragmentation import (
    MAX_EXACT,
    FGDExact,
    FGDScore,
    FragmentationIndex,
    TargetWorkload,
    exact_order,
    first_k,
    stranded_milli,
    task_shape,
)
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.sim.experiment import run_fill
from finesched.sim.policies import EXACT_CANDIDATES, policy_profile, resolve_policy
from finesched.sim.trace import load_nodes, load_pods
from finesched.state.cluster import ClusterState

LAMBDA = 1.0


def profile(target: list[dict[str, object]], seed: int, exact: int | None = None) -> dict[str, object]:
    """FGD-CPU (λ = 1) behind the simulator's filters; with `exact`, FGD-CPU-Exact with K = `exact`."""
    args: dict[str, object] = {"target": target, "cpuAware": LAMBDA}
    if exact is not None:
        args["exact"] = exact
    filters = [{"name": "NodeSelector"}, {"name": "ResourcesFit"}, {"name": "DeviceShare"}]
    return {"plugins": [*filters, {"name": "FGD", "args": args}], "tieBreak": "random", "seed": seed}


def task(name: str, cpu: int, k: int = 0, pct: int = 0) -> Workload:
    """A task of `cpu` CPUs and k whole GPUs (pct 0) or one GPU share of `pct` percent."""
    builder = make_workload(name).req(cpu=str(cpu))
    if k >= 1 and pct == 0:
        builder = builder.request("nvidia.com/gpu", k)
    elif k == 1:
        builder = builder.req(gpu_core=pct, gpu_memory_ratio=pct)
    return builder.obj()


# Hand-worked ----------------------------------------------------------------------------------------------------
# M = {1 CPU x 500 m}: ρ = 2 CPU milli per GPU milli, so 16 CPUs feed far more than 2 GPUs (no stranding).
# "idle": GPUs 1000 / 1000 (F = 0). "frag": GPU 0 at 30 m (97 % held), GPU 1 at 1000 (F = 30: the 30 m GPU
# is too small for M). A 1 CPU x 30 m task: on "idle" any GPU leaves 970 m, F' = 0, Δ' = 0, score
# ⌊100·σ(0)⌋ = 50; on "frag" GPU 0 becomes 0 m, F' = 0, Δ' = −30, score ⌊100·σ(0.03)⌋ = ⌊50.7⌋ = 50
# (GPU 1 would give Δ' = 0, also 50: the lowest minor, GPU 0, is FGD's pick). The scores tie, so FGD-CPU
# follows the tie order; the exact Δ' prefers "frag" and its GPU 0.
TARGET = [spec(1000, 1, 500)]
HELD = Binding(workload="t/held", node="frag", requests=ResourceVector({"cpu": 1000}), devices={"gpu": [share(97, 0)]})


def tied_cluster(idle_first: bool) -> ClusterState:
    names = ["idle", "frag"] if idle_first else ["frag", "idle"]
    return ClusterState.from_nodes([node(n, gpus=2) for n in names], [HELD])


def idle_wins_ties() -> bool:
    """The node order under which seed 0's tie order puts "idle" first (so FGD-CPU takes it)."""
    state = tied_cluster(True)
    ranks = Scheduler(state, profile(TARGET, seed=0), registry=REGISTRY)._tie_ranks()
    return bool(ranks[state.index["idle"]] < ranks[state.index["frag"]])


def test_exact_delta_breaks_the_integer_tie_fgd_cpu_leaves_to_the_tie_order() -> None:
    order = idle_wins_ties()
    fgd_cpu = Scheduler(tied_cluster(order), profile(TARGET, seed=0), registry=REGISTRY)
    assert fgd_cpu.evaluate(task("w", 1, 1, 3)) == {"idle": 50, "frag": 50}
    plain = fgd_cpu.schedule_one(task("w", 1, 1, 3))
    assert plain.node == "idle"  # the tie order's pick
    exact = Scheduler(tied_cluster(order), profile(TARGET, seed=0, exact=24), registry=REGISTRY)
    binding = exact.schedule_one(task("w", 1, 1, 3))
    assert (binding.node, binding.device_minors("gpu"), binding.score) == ("frag", [0], 50)
    one = Scheduler(tied_cluster(order), profile(TARGET, seed=0, exact=1), registry=REGISTRY)
    assert one.schedule_one(task("w", 1, 1, 3)).node == "idle"  # K = 1: only FGD-CPU's own pick


def test_exact_order_yields_the_chosen_node_then_the_score_order() -> None:
    # keys (higher first): node 3 (9), nodes 0 and 4 (7, 0 before 4), node 1 (5); node 2 infeasible.
    key = np.array([7, 5, -1, 9, 7], dtype=np.int64)
    delta = np.array([-3.0, -9.0, -99.0, 1.0, -3.0])
    feasible = np.array([0, 1, 3, 4])
    assert first_k(feasible, key, 3).tolist() == [3, 0, 4]
    assert first_k(feasible, key, 2).tolist() == [3, 0]  # the tie at the cut keeps the lower index
    assert list(exact_order(feasible, key, delta, 3)) == [0, 3, 4, 1]  # −3 twice: the earlier, node 0
    assert list(exact_order(feasible, key, delta, 4)) == [1, 3, 0, 4]
    assert list(exact_order(feasible, key, delta, 1)) == [3, 0, 4, 1]
    assert list(exact_order(np.array([], dtype=np.intp), key, delta, 3)) == []


# Args ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, MAX_EXACT + 1, "24", 2.5, True, [24]])
def test_bad_exact_args_are_refused_with_their_field_path(bad: object) -> None:
    with pytest.raises(ValidationError) as caught:
        FGDScore.from_args({"target": TARGET, "exact": bad})
    (error,) = caught.value.errors
    assert error.path == "plugins.FGD.args.exact"
    assert f"1..{MAX_EXACT}" in error.message


def test_bad_exact_in_a_profile_names_the_plugin_entry() -> None:
    with pytest.raises(ValidationError, match=r"plugins\[3\]\.plugins\.FGD\.args\.exact: 0 must be an integer in 1"):
        Scheduler(tied_cluster(True), profile(TARGET, seed=0, exact=0), registry=REGISTRY)


def test_exact_arg_makes_a_select_plugin_and_plain_fgd_is_not_one() -> None:
    plain = FGDScore.from_args({"target": TARGET})
    exact = FGDScore.from_args({"target": TARGET, "exact": 7})
    assert type(plain) is FGDScore and not hasattr(plain, "select")
    assert isinstance(exact, FGDExact) and exact.exact == 7
    scheduler = Scheduler(tied_cluster(True), profile(TARGET, seed=0, exact=7), registry=REGISTRY)
    assert scheduler.framework.select() is not None
    assert scheduler.framework.node_local  # the per-shape memo stays on (see the property below)


# Properties ---------------------------------------------------------------------------------------------------
PROPERTY_TARGET = TargetWorkload.from_specs(
    [spec(2000, 1, 500, count=3), spec(1000, 1, 250), spec(4000, 2, 1000), spec(500), spec(3000, 1, 700, count=2)]
)
node_specs = st.lists(st.tuples(st.sampled_from(["4", "8", "12", "24"]), st.integers(1, 4)), min_size=2, max_size=9)
tasks = st.lists(
    st.tuples(
        st.integers(1, 6), st.sampled_from([(0, 0), (1, 10), (1, 25), (1, 30), (1, 50), (1, 70), (1, 0), (2, 0)])
    ),
    min_size=1,
    max_size=30,
)


def exact_deltas(state: ClusterState, shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Δ' = Δ/W + λ·Δ_stranded per node from a fresh index (+inf where the task does not fit), and its GPU."""
    index = FragmentationIndex(state, PROPERTY_TARGET)
    cache = index.deltas(shape)
    cpu_task, k, d = shape
    idle = index.idle().astype(np.float64)
    cpu = state.free[state.res_index["cpu"], : state.n].astype(np.float64)
    rho = PROPERTY_TARGET.cpu_per_gpu_milli
    stranded = stranded_milli(idle - k * d, cpu - cpu_task, rho) - stranded_milli(idle, cpu, rho)
    delta = cache.delta / PROPERTY_TARGET.total + LAMBDA * stranded
    return np.where(cache.fits, delta, np.inf), cache.gpu.copy()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=node_specs, stream=tasks, k=st.integers(1, 6), seed=st.integers(0, 3))
def test_chosen_node_is_feasible_among_the_first_k_and_has_the_least_exact_delta(
    nodes: list[tuple[str, int]], stream: list[tuple[int, tuple[int, int]]], k: int, seed: int
) -> None:
    def cluster() -> ClusterState:
        return ClusterState.from_nodes([node(f"n{i}", gpus=g, cpu=c) for i, (c, g) in enumerate(nodes)])

    specs = PROPERTY_TARGET.to_specs()
    state = cluster()
    scheduler = Scheduler(state, profile(specs, seed, exact=k), registry=REGISTRY)  # memoized
    unmemoized = Scheduler(cluster(), profile(specs, seed, exact=k), registry=REGISTRY, memoize=False)
    ranks = scheduler._tie_ranks()
    for i, (cpu, (count, pct)) in enumerate(stream):
        workload = task(f"w{i}", cpu, count, pct)
        try:
            scores = scheduler.evaluate(workload)  # feasible nodes' FGD-CPU scores (no tie-break)
        except FitError:
            with pytest.raises(FitError):
                scheduler.schedule_one(workload)
            with pytest.raises(FitError):
                unmemoized.schedule_one(workload)
            continue
        order = sorted(scores, key=lambda name: (-scores[name], ranks[state.index[name]]))[:k]
        shape = task_shape(workload.requests)
        delta, gpu = exact_deltas(state, shape)
        first = [float(delta[state.index[name]]) for name in order]
        want = order[first.index(min(first))]  # the least Δ', the earlier in the order among equals
        binding = scheduler.schedule_one(workload)
        assert binding.node in scores and binding.node in order
        assert binding.node == want
        if shape[1] == 1 and shape[2] < 1000:  # a share: the GPU Δ' was computed for
            assert binding.device_minors("gpu") == [int(gpu[state.index[want]])]
        other = unmemoized.schedule_one(workload)
        assert (other.node, other.devices) == (binding.node, binding.devices)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=node_specs, stream=tasks, seed=st.integers(0, 3))
def test_k_of_one_decides_as_fgd_cpu(
    nodes: list[tuple[str, int]], stream: list[tuple[int, tuple[int, int]]], seed: int
) -> None:
    def scheduler(exact: int | None) -> Scheduler:
        state = ClusterState.from_nodes([node(f"n{i}", gpus=g, cpu=c) for i, (c, g) in enumerate(nodes)])
        return Scheduler(state, profile(PROPERTY_TARGET.to_specs(), seed, exact), registry=REGISTRY)

    fgd_cpu, exact_one = scheduler(None), scheduler(1)
    for i, (cpu, (count, pct)) in enumerate(stream):
        workload = task(f"w{i}", cpu, count, pct)
        results = []
        for s in (fgd_cpu, exact_one):
            with contextlib.suppress(FitError):
                results.append(s.schedule_one(workload))
        assert len(results) in (0, 2)
        if results:
            assert results[0] == results[1]


# The simulator ----------------------------------------------------------------------------------------------------
def test_policy_name_and_profile() -> None:
    assert resolve_policy("fgd-cpu-exact") == "FGD-CPU-Exact"
    plugins = policy_profile("FGD-CPU-Exact", 42, TARGET)["plugins"]
    fgd = next(p for p in plugins if p["name"] == "FGD")
    assert fgd["args"] == {"target": TARGET, "cpuAware": LAMBDA, "exact": EXACT_CANDIDATES} and EXACT_CANDIDATES == 24
    assert (
        "exact" not in next(p for p in policy_profile("FGD-CPU", 42, TARGET)["plugins"] if p["name"] == "FGD")["args"]
    )


def test_small_fill_run(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path / "nodes.csv", NODE_HEADER, NODES))
    pods = load_pods(write(tmp_path / "pods.csv", POD_HEADER, pod_rows(150)))
    run = run_fill(nodes, pods, "fgd-cpu-exact", 42)  # also checks the GPU accounting of every placement
    assert run.policy == "FGD-CPU-Exact" and run.pods >= 150
    assert 0 < run.alloc[-1] <= 100 and 0 <= run.failed < run.pods
    assert np.all(np.diff(run.alloc) >= 0)  # nothing leaves in the fill protocol
    record = run.record()
    assert record["policy"] == "FGD-CPU-Exact" and not math.isnan(record["alloc"]["130"])


def test_fill_command_accepts_the_policy(tiny_trace: tuple[Path, Path]) -> None:
    from finesched.commands.sim import sim_app

    nodes, pods = map(str, tiny_trace)
    args = ["fill", "--nodes", nodes, "--pods", pods, "--policy", "FGD-CPU,fgd-cpu-exact", "--seeds", "1", "-o", "json"]
    result = CliRunner().invoke(sim_app, args)
    assert result.exit_code == 0, result.stderr
    assert [r["policy"] for r in json.loads(result.stdout)["results"]] == ["FGD-CPU", "FGD-CPU-Exact"]
