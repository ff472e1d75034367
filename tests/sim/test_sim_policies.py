"""Each baseline's score on worked examples (FGD-PROTOCOL.md §4), and the policy profiles."""

from __future__ import annotations

import numpy as np
import pytest

from builders import make_node, make_workload
from finesched.sched.framework import NodeBatch
from finesched.sched.scheduler import Scheduler
from finesched.sim.policies import (
    BEST,
    POLICIES,
    RandomScore,
    best_fit_raw,
    dot_product_score,
    gpu_clustering_score,
    gpu_packing_score,
    min_max_normalize,
    policy_profile,
    resolve_policy,
    sim_registry,
    task_class,
)
from finesched.state.cluster import ClusterState


@pytest.mark.parametrize(
    ("cpu_free", "gpu_free", "cpu", "gpu", "want"),
    [
        # ½(64000/128000 · 32000/128000 + 4000/8000 · 1000/8000) = ½(0.125 + 0.0625) = 0.09375 -> ⌊90.6⌋
        pytest.param(64000, 4000, 32000, 1000, 90, id="worked-example"),
        # ½(1 · 1 + 1 · 1) = 1 -> 0: the biggest node for the biggest task scores lowest
        pytest.param(128000, 8000, 128000, 8000, 0, id="full-alignment"),
        pytest.param(1000, 8000, 2000, 1000, 0, id="cpu-short-scores-0"),
        # ½(96000/128000 · 12500/128000 + 0) = ½ · 0.75 · 0.0977 = 0.0366 -> ⌊96.3⌋
        pytest.param(96000, 0, 12500, 0, 96, id="cpu-only-task"),
    ],
)
def test_dot_product_score(cpu_free: int, gpu_free: int, cpu: int, gpu: int, want: int) -> None:
    assert dot_product_score(np.array([cpu_free]), np.array([gpu_free]), cpu, gpu).tolist() == [want]


@pytest.mark.parametrize(
    ("gpus", "k", "d", "want"),
    [
        pytest.param([1000] * 8, 1, 500, 25, id="idle 8-GPU node: max(33 - 8, 8)"),
        pytest.param([1000] * 2, 1, 1000, 31, id="idle 2-GPU node: max(33 - 2, 2)"),
        pytest.param([1000, 600, 200], 1, 500, 94, id="share on used GPU: 100 - 60 // 10"),
        pytest.param([1000, 200, 1000], 1, 500, 49, id="needs one free GPU of a used node: 50 - 1"),
        pytest.param([1000, 300, 1000, 1000], 2, 1000, 48, id="two free GPUs of a used node: 50 - 2"),
        pytest.param([1000, 300], 0, 0, 0, id="cpu-only"),
    ],
)
def test_gpu_packing_score(gpus: list[int], k: int, d: int, want: int) -> None:
    free = np.array([gpus])
    assert gpu_packing_score(free, np.array([len(gpus)]), k, d).tolist() == [want]


def test_gpu_clustering_score() -> None:
    # u = ⌊25 · (8000 − 4000) / 8000⌋ = 12 on every node (R = 4000); class 0 = share tasks, 1 = 1-GPU tasks
    classes = np.zeros((4, 17), dtype=np.int64)
    classes[0, 0] = 3  # only share tasks
    classes[1, [0, 1]] = 1  # share and 1-GPU tasks
    classes[3, 1] = 2  # only 1-GPU tasks
    idle = np.full(4, 4000)
    assert gpu_clustering_score(classes, idle, task_class(1, 500)).tolist() == [87, 62, 37, 12]
    assert gpu_clustering_score(classes, idle, task_class(1, 1000)).tolist() == [12, 62, 37, 87]
    assert gpu_clustering_score(classes, idle, task_class(0, 0)).tolist() == [0, 0, 0, 0]
    assert (task_class(1, 500), task_class(8, 1000), task_class(0, 0)) == (0, 8, -1)


def test_best_fit_raw_and_normalize() -> None:
    # leftover ½ · 64000/128000 + ½ · 2000/8000 = 0.375 -> ⌊62.5⌋ = 62; nothing left -> 100;
    # ½ · 32000/128000 + ½ · 6000/8000 = 0.5 -> 50
    raw = best_fit_raw(np.array([96000, 32000, 64000]), np.array([4000, 2000, 8000]), 32000, 2000)
    assert raw.tolist() == [62, 100, 50]
    # min-max over the feasible nodes: (s − 50) · 100 // (100 − 50) -> 24, 100, 0
    assert min_max_normalize(raw, np.array([True, True, True])).tolist() == [24, 100, 0]
    # without the middle node: (62 − 50) · 100 // 12 = 100; the infeasible node is clipped into range
    assert min_max_normalize(raw, np.array([True, False, True])).tolist() == [100, 100, 0]
    assert min_max_normalize(np.array([5, 5]), np.array([True, True])).tolist() == [0, 0]


def test_random_score_picks_one_feasible_node() -> None:
    state = ClusterState.from_nodes([make_node(f"n{i}").cpu("4").memory("8Gi").obj() for i in range(5)])
    plugin = RandomScore(seed=3)
    from finesched.sched.cycle_state import CycleState
    from finesched.sched.request import compile_request

    request = compile_request(make_workload("w").req(cpu="1").obj(), state)
    mask = np.array([False, True, False, True, False])
    picks = set()
    for _ in range(20):
        cycle = CycleState()
        batch = NodeBatch(state, mask)
        plugin.pre_score(cycle, request, batch)
        scores = plugin.score(cycle, request, batch)
        assert sorted(scores.tolist()) == [0, 0, 0, 0, 100]
        picks.add(int(np.argmax(scores)))
    assert picks == {1, 3}


def test_resolve_policy() -> None:
    assert resolve_policy("fgd") == "FGD" and resolve_policy("BESTFIT") == "BestFit"
    assert resolve_policy("best") == BEST
    with pytest.raises(ValueError, match="unknown policy 'nope'; valid: Random, DotProd"):
        resolve_policy("nope")


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_profile_builds_and_places(policy: str) -> None:
    nodes = [
        make_node(f"n{i}").cpu("16").memory("64Gi").gpus(4, memory="16Gi").label("gpu-model", "A").obj()
        for i in range(3)
    ]
    state = ClusterState.from_nodes(nodes)
    target = [{"cpu": 2000, "gpuCount": 1, "gpuMilli": 500, "models": [], "count": 3}, {"cpu": 1000, "count": 1}]
    scheduler = Scheduler(state, policy_profile(policy, 42, target), registry=sim_registry())
    share = scheduler.schedule_one(make_workload("s").req(cpu="2", gpu_core=50, gpu_memory_ratio=50).obj())
    whole = scheduler.schedule_one(make_workload("w").req(cpu="2").request("nvidia.com/gpu", 2).obj())
    assert len(share.device_minors("gpu")) == 1 and len(whole.device_minors("gpu")) == 2
