"""The fragmentation index's fast kernels and caches give exactly what the reference functions give.

The index (plugins/fragmentation/index.py) computes F·W and FGD's Δ with its own kernels, once per
distinct node state when many nodes changed, and the FGD plugin keeps its scores per shape; the
public functions (`fragment_terms`, `_share_deltas`, `fgd_score`) are the reference they must equal,
integer for integer, on any node states, targets and task shapes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from builders import make_node, make_workload
from finesched.plugins.fragmentation import (
    FGDScore,
    FragmentationIndex,
    TargetWorkload,
    fgd_score,
    fragment_terms,
    task_shape,
)
from finesched.plugins.fragmentation.index import (
    _after_placement,
    _distinct_states,
    _ShapeCache,
    _share_deltas,
    _Specs,
    fgd_scores,
)
from finesched.plugins.fragmentation.plugin import FGD_STATE
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import request_shape
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

REGISTRY = default_registry().with_plugins({"FGD": FGDScore.from_args})
MIN = np.iinfo(np.int64).min


@st.composite
def cases(draw: Any) -> tuple[Any, ...]:
    """(target, cpu_free [K], gpu_free [K, G], acc [K, M], shape): free milli per GPU anywhere in
    0..1000 (not only multiples of 10), some GPUs missing (0), specs of 0..2 whole or shared GPUs."""
    m = draw(st.integers(1, 6))
    specs = []
    for _ in range(m):
        k = draw(st.integers(0, 2))
        d = 0 if k == 0 else (1000 if k == 2 else draw(st.integers(1, 1000)))
        specs.append(
            {"cpu": draw(st.integers(0, 8000)), "gpuCount": k, "gpuMilli": d, "count": draw(st.integers(1, 9))}
        )
    target = TargetWorkload.from_specs(specs)
    k_nodes, g = draw(st.integers(1, 9)), draw(st.integers(1, 8))
    cpu_free = draw(hnp.arrays(np.int64, k_nodes, elements=st.integers(0, 16000)))
    gpu_free = draw(hnp.arrays(np.int64, (k_nodes, g), elements=st.integers(0, 1000)))
    acc = draw(hnp.arrays(np.bool_, (k_nodes, m)))
    kind = draw(st.sampled_from(["share", "whole", "cpu"]))
    cpu_task = draw(st.integers(0, 8000))
    shape = {"share": (cpu_task, 1, draw(st.integers(1, 999))), "whole": (cpu_task, draw(st.integers(1, 3)), 1000)}
    return target, cpu_free, gpu_free, acc, shape.get(kind, (cpu_task, 0, 0))


def reference(target: TargetWorkload, cpu_free: Any, gpu_free: Any, acc: Any, shape: Any, choice: str) -> tuple:
    """The index's Δ·W, GPU and fit as it computed them before its kernels (from the reference functions)."""
    base = fragment_terms(cpu_free, gpu_free, acc, target) @ target.counts
    _, k, d = shape
    if k == 1 and d < 1000:
        per_gpu = _share_deltas(cpu_free, gpu_free, acc, target, shape, base)
        valid = per_gpu != MIN
        if choice == "delta":
            key = np.where(valid, -per_gpu, MIN)
        else:
            key = np.where(valid, fgd_score(per_gpu / max(target.total, 1)), -1)
        best = np.argmax(key, axis=1)
        rows = np.arange(len(cpu_free))
        fits = valid[rows, best] & (cpu_free >= shape[0])
        return np.where(fits, per_gpu[rows, best], 0), np.where(fits, best, -1), fits
    cpu_after, gpu_after, fits = _after_placement(cpu_free, gpu_free.copy(), shape)
    after = fragment_terms(cpu_after, gpu_after, acc, target) @ target.counts
    return np.where(fits, after - base, 0), np.full(len(fits), -1), fits


class _Bare:
    """The attributes FragmentationIndex._evaluate and _compute read, without a cluster."""

    def __init__(self, target: TargetWorkload, cpu_free: Any, gpu_free: Any, acc: Any, choice: str):
        self.target, self._specs, self.gpu_choice = target, _Specs.of(target), choice
        self.state = type("S", (), {"free": cpu_free[None, :]})()
        self.view = type("V", (), {"free": gpu_free})()
        self._cpu_row, self._acc = 0, acc
        self._frag = fragment_terms(cpu_free, gpu_free, acc, target) @ target.counts
        self._model_id = acc.astype(np.int64) @ (1 << np.arange(acc.shape[1], dtype=np.int64))
        self._evaluate = lambda *a: FragmentationIndex._evaluate(self, *a)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), choice=st.sampled_from(["score", "delta"]))
def test_index_kernels_equal_the_reference(case: tuple[Any, ...], choice: str) -> None:
    target, cpu_free, gpu_free, acc, shape = case
    want = reference(target, cpu_free, gpu_free, acc, shape, choice)
    bare = _Bare(target, cpu_free, gpu_free, acc, choice)
    got = FragmentationIndex._evaluate(bare, shape, cpu_free, gpu_free, acc, bare._frag)  # type: ignore[arg-type]
    for a, b in zip(want, got, strict=True):
        assert a.tolist() == b.tolist()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), repeat=st.integers(16, 40), choice=st.sampled_from(["score", "delta"]))
def test_many_changed_nodes_in_few_states_give_each_node_its_own_result(
    case: tuple[Any, ...], repeat: int, choice: str
) -> None:
    """Above _DEDUP_MIN changed nodes, equal states are computed once: every node still gets the
    result of its own state, in its own position."""
    target, cpu_free, gpu_free, acc, shape = case
    order = np.random.default_rng(repeat).permutation(np.repeat(np.arange(len(cpu_free)), repeat))
    cpu_free, gpu_free, acc = cpu_free[order], gpu_free[order], acc[order]
    want = reference(target, cpu_free, gpu_free, acc, shape, choice)
    bare = _Bare(target, cpu_free, gpu_free, acc, choice)
    n = len(cpu_free)
    cache = _ShapeCache(np.full(n, -1), np.zeros(n, np.int64), np.full(n, -1), np.zeros(n, bool))
    FragmentationIndex._compute(bare, shape, np.arange(n), cache)  # type: ignore[arg-type]
    assert cache.delta.tolist() == want[0].tolist()
    assert cache.gpu.tolist() == want[1].tolist() and cache.fits.tolist() == want[2].tolist()


def test_distinct_states_tell_states_apart_by_cpu_model_and_every_gpu() -> None:
    cpu = np.array([1, 1, 1, 1, 2, 1, 1, 1])
    model = np.array([0, 0, 0, 0, 0, 1, 0, 0])
    gpu = np.array([[5, 6]] * 6 + [[6, 5], [5, 6]])
    first, inverse = _distinct_states(cpu, model, gpu)  # type: ignore[misc]
    groups = [first[inverse[i]] for i in range(len(cpu))]
    assert groups == [0, 0, 0, 0, 4, 5, 6, 0]
    assert _distinct_states(cpu[4:7], model[4:7], gpu[4:7]) is None  # all distinct: not worth it


def test_fgd_scores_equal_fgd_score() -> None:
    rng = np.random.default_rng(0)
    for scale in (1.0, 300.0, 1e5, 1e9):
        x = rng.normal(0.0, scale, 200_000)
        assert fgd_scores(x).tolist() == fgd_score(x).tolist()
    edges = np.array([0.0, -0.0, 1e-300, 700_000.0, -700_000.0, 7e5 + 1, 1e308, -1e308])
    assert fgd_scores(edges).tolist() == fgd_score(edges).tolist()


def test_plugin_scores_after_every_placement_equal_a_fresh_computation() -> None:
    """FGDScore rescores only the nodes that changed since it last scored a shape; its scores and Δ'
    are what the whole formula gives over all nodes, for plain and CPU-aware FGD."""
    target = TargetWorkload.from_specs(
        [
            {"cpu": 2000, "gpuCount": 1, "gpuMilli": 500, "count": 3},
            {"cpu": 1000, "gpuCount": 1, "gpuMilli": 250},
            {"cpu": 4000, "gpuCount": 2, "gpuMilli": 1000},
            {"cpu": 500},
        ]
    )
    nodes = [make_node(f"n{i}").cpu(str(8 + 4 * (i % 3))).memory("64Gi").gpus(4, memory="16Gi").obj() for i in range(7)]
    state = ClusterState.from_nodes(nodes)
    filters = [{"name": "NodeSelector"}, {"name": "ResourcesFit"}, {"name": "DeviceShare"}]
    fgd = {"name": "FGD", "args": {"target": target.to_specs(), "cpuAware": 0.7, "exact": 3}}
    scheduler = Scheduler(state, {"plugins": [*filters, fgd], "tieBreak": "random", "seed": 2}, registry=REGISTRY)
    plugin = next(p for p in scheduler.framework.plugins if isinstance(p, FGDScore))
    index = FragmentationIndex.shared(state, target)
    rng = np.random.default_rng(7)
    asks = [{"gpu_core": 30, "gpu_memory_ratio": 30}, {"gpu_core": 60, "gpu_memory_ratio": 60}, {}]
    for i in range(30):
        ask = asks[int(rng.integers(len(asks)))]
        workload = make_workload(f"w{i}").req(cpu=str(int(rng.integers(1, 4))), **ask).obj()
        with contextlib.suppress(FitError):
            scheduler.schedule_one(workload)
        for probe in (make_workload("p").req(cpu="1", **a).obj() for a in asks):
            request = scheduler._compiler.compile(probe, request_shape(probe))
            cycle = CycleState()
            plugin.pre_score(cycle, request, NodeBatch(state))
            kept = cycle.read(FGD_STATE)
            shape = task_shape(probe.requests)
            fresh = FragmentationIndex(state, target).deltas(shape)
            delta = fresh.delta / target.total + 0.7 * plugin._stranding_delta(index, shape, np.arange(state.n))
            assert kept.scores.tolist() == np.where(fresh.fits, fgd_score(delta), 0).tolist()
            assert kept.delta is not None and kept.delta.tolist() == delta.tolist()
