"""Member counts (`Framework.run_count`, the `Count` extension point): hand-worked cases per plugin.

Each case gives one node and a request; the count is checked against the worked number in the
case and against placing copies one by one (tests/member_counts.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from builders import make_node
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import NO_LIMIT, NodeBatch
from finesched.sched.profile import Profile
from finesched.sched.request import compile_request
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from member_counts import copy_of, counts, placed_one_by_one

GPU4 = make_node("g4").cpu("16").memory("64Gi").gpus(4, memory="80Gi").obj()


def scheduler(node: Node, profile: Any = "default") -> Scheduler:
    return Scheduler(ClusterState.from_nodes([node]), profile)


def check(node: Node, requests: dict[str, Any], want: int, profile: Any = "default", **extra: Any) -> None:
    data = {"name": "m", "requests": requests, **extra}
    got = counts(scheduler(node, profile), Workload.model_validate(data))
    assert got.tolist() == [want]
    assert placed_one_by_one(lambda: scheduler(node, profile), data) == want


@pytest.mark.parametrize(
    ("requests", "want"),
    [
        pytest.param({"cpu": "1"}, 16, id="cpu-16-of-16"),
        pytest.param({"cpu": "3", "memory": "10Gi"}, 5, id="cpu-binds-before-memory"),
        pytest.param({"cpu": "1", "memory": "20Gi"}, 3, id="memory-binds"),
        pytest.param({"cpu": "100m"}, 110, id="pods-cap-110"),
        pytest.param({"cpu": "1", "example.com/fish": 1}, 0, id="unknown-resource"),
    ],
)
def test_scalar_resources(requests: dict[str, Any], want: int) -> None:
    check(make_node("n").cpu("16").memory("64Gi").pods(110).obj(), requests, want)


@pytest.mark.parametrize(
    ("requests", "want"),
    [
        # 4 cards x floor(100 / 30) = 12 on the cards; cpu allows 16
        pytest.param({"cpu": "1", "koordinator.sh/gpu": 30}, 12, id="share-30-percent"),
        # gpu-core 10 -> 10 per card; 30Gi of 80Gi -> 2 per card: memory binds, 8
        pytest.param({"cpu": "1", "gpu-core": 10, "gpu-memory": "30Gi"}, 8, id="share-bytes"),
        pytest.param({"cpu": "1", "gpu-core": 30, "gpu-memory-ratio": 60}, 4, id="ratio-binds"),
        pytest.param({"cpu": "1", "nvidia.com/gpu": 1}, 4, id="whole-1"),
        pytest.param({"cpu": "1", "nvidia.com/gpu": 3}, 1, id="whole-3-of-4"),
        pytest.param({"cpu": "1", "nvidia.com/gpu": 8}, 0, id="whole-more-than-node"),
        # 3 cards of 40% each: 2 per card; t=2: 4*2 = 8 >= 6, t=3: 8 < 9
        pytest.param({"cpu": "100m", "gpu.shared": 3, "gpu": 120}, 2, id="multi-card-shares"),
        # 200% = two whole cards per copy
        pytest.param({"cpu": "1", "koordinator.sh/gpu": 200}, 2, id="two-cards-per-copy"),
    ],
)
def test_gpu_shares(requests: dict[str, Any], want: int) -> None:
    check(GPU4, requests, want)


def test_gpu_shares_on_partly_used_cards() -> None:
    """Cards 0 and 1 half used, card 2 unhealthy: 60% fits on card 3 only, 40% on cards 0, 1 (1 each)
    and card 3 (2): the count is per card, not from the node's summed free share."""
    node = make_node("n").cpu("16").memory("64Gi").gpus(2, memory="80Gi").gpus(1, healthy=False).gpus(1).obj()
    busy = {"cpu": "1", "koordinator.sh/gpu": 50}
    for requests, want in (({"cpu": "1", "koordinator.sh/gpu": 60}, 1), ({"cpu": "1", "koordinator.sh/gpu": 40}, 4)):

        def make() -> Scheduler:
            s = scheduler(node)
            for k in range(2):
                s.schedule_one(copy_of({"name": "busy", "requests": busy}, k))
            return s

        data = {"name": "m", "requests": requests}
        assert counts(make(), Workload.model_validate(data)).tolist() == [want]
        assert placed_one_by_one(make, data) == want


def test_scalar_share_of_a_node_hides_gpu_fragmentation() -> None:
    """Four cards at 70% used: 120% free in total, yet not one 50% share fits."""
    s = scheduler(GPU4)
    for k in range(4):
        s.schedule_one(copy_of({"name": "busy", "requests": {"cpu": "1", "koordinator.sh/gpu": 70}}, k))
    assert counts(s, Workload.model_validate({"name": "m", "requests": {"koordinator.sh/gpu": 50}})).tolist() == [0]
    assert counts(s, Workload.model_validate({"name": "m", "requests": {"koordinator.sh/gpu": 30}})).tolist() == [4]


def test_infeasible_nodes_count_zero_and_subset_batches() -> None:
    nodes = [
        make_node("a").cpu("8").memory("16Gi").obj(),
        make_node("b").cpu("2").memory("16Gi").label("zone", "x").obj(),
        make_node("c").cpu("1").memory("16Gi").obj(),
    ]
    s = Scheduler(ClusterState.from_nodes(nodes))
    w = Workload.model_validate({"name": "m", "requests": {"cpu": "2"}})
    assert counts(s, w).tolist() == [4, 1, 0]
    request = compile_request(w, s.state, s.framework.owns)
    cycle = CycleState()
    batch = NodeBatch(s.state, index=np.array([1, 2]))
    skipped = s.framework.run_pre_filter(cycle, request, batch)
    feasible, _ = s.framework.run_filter(cycle, request, batch, skipped)
    assert s.framework.run_count(cycle, request, batch, feasible, skipped).tolist() == [1, 0]


def test_no_counting_plugin_puts_no_limit() -> None:
    profile = Profile.model_validate({"name": "p", "plugins": [{"name": "NodeSelector"}]})
    s = scheduler(make_node("n").cpu("1").obj(), profile)
    assert counts(s, Workload.model_validate({"name": "m", "requests": {"cpu": "8"}})).tolist() == [NO_LIMIT]
