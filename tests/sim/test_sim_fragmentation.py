"""The fragmentation measure f_n(m), F_n(M), FGD's Δ and score, the cached index, and the FGD plugin."""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import pytest

from builders import make_node, make_workload
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.resources import ResourceVector
from finesched.plugins.fragmentation import (
    FGDScore,
    FragmentationIndex,
    GpuView,
    OnlineTarget,
    TargetWorkload,
    accessible,
    fgd_score,
    fragment_terms,
    node_fragmentation,
    stranded_milli,
    task_shape,
)
from finesched.sched.diagnosis import FitError
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from finesched.state.device_types import fill_gpu_amounts

GIB = 2**30
REGISTRY = default_registry().with_plugins({"FGD": FGDScore.from_args})


def spec(cpu: int = 0, k: int = 0, d: int = 0, models: tuple[str, ...] = (), count: int = 1) -> dict[str, object]:
    return {"cpu": cpu, "gpuCount": k, "gpuMilli": d, "models": list(models), "count": count}


# One node: 4 CPUs free, GPUs at 1000 / 300 / 0 milli free (R = 1300), model A.
CPU_FREE = np.array([4000])
GPU_FREE = np.array([[1000, 300, 0]])


@pytest.mark.parametrize(
    ("task", "want"),
    [
        pytest.param(spec(cpu=1000), 1300, id="cpu-only-task: all idle GPU is fragment"),
        pytest.param(spec(cpu=1000, k=1, d=200, models=("B",)), 1300, id="model-not-allowed: R"),
        pytest.param(spec(cpu=8000, k=1, d=100), 1300, id="lacks-cpu (8 > 4 CPUs): R"),
        pytest.param(spec(cpu=1000, k=2, d=1000), 1300, id="lacks-gpus (1 GPU >= 1000, needs 2): R"),
        pytest.param(spec(cpu=1000, k=1, d=500), 300, id="fits: GPUs below 500 count (300 + 0)"),
        pytest.param(spec(cpu=1000, k=1, d=200, models=("A",)), 0, id="fits: only the empty GPU is below 200"),
        pytest.param(spec(cpu=4000, k=1, d=1000), 300, id="fits with exactly the free CPU: 300 < 1000"),
    ],
)
def test_fragment_terms_each_case(task: dict[str, object], want: int) -> None:
    target = TargetWorkload.from_specs([task])
    acc = accessible(["A"], target)
    assert fragment_terms(CPU_FREE, GPU_FREE, acc, target).tolist() == [[want]]


def test_node_fragmentation_worked_example() -> None:
    # A: 2 CPUs x 500 m (p 0.5) -> 300; B: 8 CPUs x 100 m (p 0.25) -> 1300; C: CPU-only (p 0.25) -> 1300.
    # F = 0.5·300 + 0.25·1300 + 0.25·1300 = 800
    target = TargetWorkload.from_specs([spec(2000, 1, 500, count=2), spec(8000, 1, 100), spec(0)])
    assert node_fragmentation(CPU_FREE, GPU_FREE, accessible(["A"], target), target).tolist() == [800.0]


@pytest.mark.parametrize(
    ("delta", "want"),
    [
        pytest.param(0.0, 50, id="no change: σ(0) = 0.5"),
        pytest.param(-1000.0, 73, id="σ(1) = 0.731"),
        pytest.param(1000.0, 26, id="σ(-1) = 0.269"),
        pytest.param(-300.0, 57, id="σ(0.3) = 0.574"),
        pytest.param(1e9, 0, id="huge increase"),
    ],
)
def test_fgd_score(delta: float, want: int) -> None:
    assert fgd_score(np.array([delta])).tolist() == [want]


def test_stranded_milli_example() -> None:
    # ρ = 10.9 CPU milli per GPU milli: 21,800 m of CPU feed 2000 GPU milli of R = 4000 -> 2000 stranded.
    assert stranded_milli(np.array([4000.0, 1000.0]), np.array([21800.0, 21800.0]), 10.9).tolist() == [2000.0, 0.0]
    assert stranded_milli(np.array([4000.0]), np.array([0.0]), 0.0).tolist() == [0.0]


@pytest.mark.parametrize(
    ("requests", "want"),
    [
        pytest.param({"cpu": 3000, "gpu-core": 46, "gpu-memory-ratio": 46}, (3000, 1, 460), id="share"),
        pytest.param({"cpu": 8000, "nvidia.com/gpu": 2}, (8000, 2, 1000), id="whole"),
        pytest.param({"cpu": 1000, "gpu-core": 200}, (1000, 2, 1000), id="core-200-is-two-gpus"),
        pytest.param({"cpu": 500}, (500, 0, 0), id="cpu-only"),
    ],
)
def test_task_shape(requests: dict[str, int], want: tuple[int, int, int]) -> None:
    assert task_shape(requests) == want


def test_target_from_pods_keeps_top_specs_by_coverage() -> None:
    # counts 5, 3, 1, 1 of 10: coverage 95 % needs all four (9 < 9.5); 80 % stops after two (8 >= 8).
    cpu = [1000] * 5 + [2000] * 3 + [3000, 4000]
    k = [1] * 5 + [0] * 3 + [1, 1]
    d = [500] * 5 + [0] * 3 + [1000, 1000]
    spec_text = [""] * 9 + ["A|B"]
    full = TargetWorkload.from_pods(cpu, k, d, spec_text, 0.95)
    assert full.counts.tolist() == [5, 3, 1, 1] and full.total == 10
    # equal counts: (cpu, d, k, constraint) descending, as the artifact's sort.Reverse
    assert full.cpu.tolist() == [1000, 2000, 4000, 3000] and full.models[2] == ("A", "B")
    top = TargetWorkload.from_pods(cpu, k, d, spec_text, 0.8)
    assert top.counts.tolist() == [5, 3]
    assert TargetWorkload.from_specs(top.to_specs()).key() == top.key()


def test_online_target_follows_a_sliding_window() -> None:
    online = OnlineTarget(window=4, refresh=1, coverage=1.0)
    for shape in [(1, 500, 1, ""), (1, 500, 1, ""), (2, 0, 0, ""), (3, 1000, 1, "")]:
        online.observe(shape)
    assert online.target is not None and sorted(online.target.counts.tolist()) == [1, 1, 2]
    for shape in [(3, 1000, 1, ""), (3, 1000, 1, "")]:
        online.observe(shape)  # the two (1, 500) observations leave the window of 4
    assert online.target is not None
    assert Counter(dict(zip(online.target.cpu.tolist(), online.target.counts.tolist(), strict=True))) == {3: 3, 2: 1}


# Through a ClusterState and the Scheduler -------------------------------------------------------------------
def node(name: str, gpus: int = 3, cpu: str = "16") -> object:
    return make_node(name).cpu(cpu).memory("64Gi").gpus(gpus, memory="16Gi").label("gpu-model", "A").obj()


def share(pct: int, minor: int) -> DeviceGrant:
    return DeviceGrant(minor=minor, resources=fill_gpu_amounts({"gpu-core": pct, "gpu-memory-ratio": pct}, 16 * GIB))


def busy_node_state() -> ClusterState:
    """Node n1: 4 CPUs free, GPUs 1000 / 300 / 0 free; node n2: idle (16 CPUs, 3 GPUs)."""
    held = Binding(
        workload="t/held",
        node="n1",
        requests=ResourceVector({"cpu": 12000}),
        devices={"gpu": [share(70, 1), share(100, 2)]},
    )
    return ClusterState.from_nodes([node("n1"), node("n2")], [held])


def fgd_profile(target: list[dict[str, object]], seed: int) -> dict[str, object]:
    filters = [{"name": "NodeSelector"}, {"name": "ResourcesFit"}, {"name": "DeviceShare"}]
    return {"plugins": [*filters, {"name": "FGD", "args": {"target": target}}], "tieBreak": "random", "seed": seed}


def test_gpu_view_mirrors_bindings_and_classes() -> None:
    state = busy_node_state()
    view = state.attach(GpuView())
    assert view.free[:2].tolist() == [[1000, 300, 0], [1000, 1000, 1000]]
    assert view.count[:2].tolist() == [3, 3]
    assert view.classes[0, 2] == 1  # one task holding two GPUs
    state.forget("t/held")
    assert view.free[0].tolist() == [1000, 1000, 1000] and view.classes[0].sum() == 0


def test_fgd_picks_the_gpu_of_least_increase() -> None:
    # Docstring example, a 1 CPU x 300 m task. n1 (4 CPUs, GPUs 1000/300/0, F = 800): on its 300 m GPU
    # Δ = −300 -> 57, on its 1000 m GPU Δ = −150 -> 53. Idle n2 (16 CPUs, 3 x 1000, F = 0.25·3000 = 750):
    # any GPU leaves 700 m, A and B still fit, F' = 0.25·2700 = 675, Δ = −75 -> 51. n1 and GPU 1 win.
    profile = fgd_profile([spec(2000, 1, 500, count=2), spec(8000, 1, 100), spec(0)], seed=1)
    state = busy_node_state()
    scheduler = Scheduler(state, profile, registry=REGISTRY)
    binding = scheduler.schedule_one(make_workload("w").req(cpu="1", gpu_core=30, gpu_memory_ratio=30).obj())
    assert binding.node == "n1" and binding.device_minors("gpu") == [1]
    assert binding.score == 57


def test_index_matches_a_fresh_computation_after_every_placement() -> None:
    target = TargetWorkload.from_specs(
        [spec(2000, 1, 500, count=3), spec(1000, 1, 250), spec(4000, 2, 1000), spec(500)]
    )
    state = ClusterState.from_nodes([node(f"n{i}", gpus=4, cpu="12") for i in range(6)])
    scheduler = Scheduler(state, fgd_profile(target.to_specs(), seed=3), registry=REGISTRY)
    index = FragmentationIndex.shared(state, target)
    shapes = [(1, 50), (2, 0), (1, 25), (1, 100), (0, 0)]
    rng = np.random.default_rng(5)
    for i in range(40):
        cpu, (k, pct) = int(rng.integers(1, 4)), shapes[int(rng.integers(len(shapes)))]
        builder = make_workload(f"w{i}").req(cpu=str(cpu))
        if k == 2:
            builder = builder.request("nvidia.com/gpu", 2)
        elif k == 1:
            builder = builder.req(gpu_core=pct, gpu_memory_ratio=pct)
        with contextlib.suppress(FitError):  # a full cluster: the index must still agree
            scheduler.schedule_one(builder.obj())
        fresh = FragmentationIndex(state, target)
        assert np.allclose(index.node_frag(), fresh.node_frag())
        for shape in [(2000, 1, 500), (1000, 2, 1000), (500, 0, 0)]:
            cached, recomputed = index.deltas(shape), fresh.deltas(shape)
            assert cached.delta.tolist() == recomputed.delta.tolist()
            assert cached.gpu.tolist() == recomputed.gpu.tolist()
    assert index is FragmentationIndex.shared(state, TargetWorkload.from_specs(target.to_specs()))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({}, "target", id="no-target"),
        pytest.param({"target": "online", "bogus": 1}, "unknown args", id="unknown-arg"),
        pytest.param({"target": [spec(1000)], "gpuChoice": "first"}, "score or delta", id="bad-choice"),
        pytest.param({"target": [spec(1000)], "cpuAware": -1}, ">= 0", id="negative-lambda"),
        pytest.param({"target": [{"cpu": "x"}]}, "integer", id="bad-spec"),
    ],
)
def test_fgd_args_are_validated(args: dict[str, object], message: str) -> None:
    from finesched.errors import ValidationError

    with pytest.raises(ValidationError, match=message):
        FGDScore.from_args(args)
