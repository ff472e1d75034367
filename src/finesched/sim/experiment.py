"""Experiments that drive the real Scheduler with a trace: the FGD fill protocol (the timed replay: sim/replay.py).

**Fill** (FGD-PROTOCOL.md §2, "workload inflation"). With a seeded generator: shuffle the original
pods (sorted by name first), then append clones drawn uniformly with replacement while the total
GPU request stays within ``inflation`` x capacity (the check adds the clone's per-GPU milli d and
the total grows by k·d, the artifact's quirk; the first draw that would exceed stops). Pods arrive
one at a time and never leave; a pod no node takes is dropped and the run goes on. After every
arrival: allocation rate, arrived demand, fragmentation amount and ratio.

Deviation: the generator is numpy's PCG64 (`numpy.random.default_rng(seed)`), not Go's
math/rand, so seed 42 here is a different shuffle, clone set and tie order than seed 42 in the
paper's artifact; results agree in distribution, not bit for bit.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.node import Node
from finesched.plugins.fragmentation import FragmentationIndex, TargetWorkload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.sim import metrics
from finesched.sim.policies import policy_profile, resolve_policy, sim_registry
from finesched.sim.trace import NodeTable, PodTable, WorkloadFactory, to_nodes
from finesched.state.cluster import ClusterState

FloatArray = npt.NDArray[np.float64]
Progress = Callable[[int, int], None]

_NODE_CACHE: dict[tuple[int, str | None], list[Node]] = {}


def cluster_nodes(table: NodeTable, gpu_partitions: str | None = None) -> list[Node]:
    """The Node objects of a node table (built once per table and partition policy per process;
    Nodes are immutable)."""
    key = (id(table), gpu_partitions or None)
    nodes = _NODE_CACHE.get(key)
    if nodes is None:
        nodes = _NODE_CACHE[key] = to_nodes(table, gpu_partitions)
    return nodes


# Inflation ------------------------------------------------------------------------------------------------
def inflate(pods: PodTable, ratio: float, capacity_milli: int, rng: np.random.Generator) -> PodTable:
    """The arrival list: shuffled originals, then clones up to `ratio` x capacity (see the module doc).

    With ratio below the original demand, random pods are removed instead (the artifact's tune-down).
    Worked example: capacity 10 GPUs (10,000 m), ratio 1.3 -> target 13,000 m; originals ask 9,000 m.
    Clones of 1 x 1000 m are accepted while 9,000 + 1000·i + 1000 <= 13,000: 4 clones, 13 pods.
    """
    order = np.argsort(np.asarray(pods.names, dtype=object), kind="stable")
    order = order[rng.permutation(len(order))]
    total = int(pods.gpu_request_milli.sum())
    target = ratio * capacity_milli
    request = pods.gpu_request_milli
    if total > target:
        keep = list(order.tolist())
        while total > target and keep:
            drop = int(rng.integers(len(keep)))
            total -= int(request[keep.pop(drop)])
        return pods.take(keep)
    clones: list[int] = []
    while True:
        pick = int(rng.integers(len(pods)))
        if total + int(pods.gpu_milli[pick]) > target:
            break
        total += int(request[pick])
        clones.append(pick)
    names = [pods.names[i] for i in order.tolist()] + [f"{pods.names[c]}-tuned-{j}" for j, c in enumerate(clones)]
    return pods.take(np.concatenate([order, np.asarray(clones, dtype=np.intp)]), names)


# Fill ----------------------------------------------------------------------------------------------------
@dataclass
class FillRun:
    """One policy x seed run of the fill protocol, with samples after every arrival (percent)."""

    policy: str
    seed: int
    inflation: float
    arrived: FloatArray
    alloc: FloatArray
    frag_amount: FloatArray
    frag_ratio: FloatArray
    failed: int
    wall_s: float
    trace: str = ""
    #: Why the failed pods fit nowhere, as the scheduler's reason counts: each failed pod is counted
    #: once under every reason its nodes gave (`reasons_of`), so a reason's count is the pods it held back.
    failed_reasons: dict[str, int] = field(default_factory=dict)
    #: With a priority mix (`run_fill(priorities=...)`): evictions by the victims' priority class,
    #: and the final GPU allocation (% of capacity) held by each class.
    evicted: dict[int, int] | None = None
    alloc_by_priority: dict[int, float] | None = None

    @property
    def pods(self) -> int:
        return len(self.arrived)

    def record(self, points: tuple[int, ...] = metrics.REPORT_POINTS) -> dict[str, Any]:
        """The `-o json` result row (percent values at the report points)."""
        alloc = metrics.bin_at(self.arrived, self.alloc, points)
        frag = metrics.bin_at(self.arrived, self.frag_amount, points)
        ratio = metrics.bin_at(self.arrived, self.frag_ratio, points)
        last = max(points)
        return {
            "policy": self.policy,
            "seed": self.seed,
            "trace": self.trace,
            "pods": self.pods,
            "alloc": {str(x): _round(v) for x, v in alloc.items()},
            "unallocated_130": _round(100.0 - alloc[last]) if last == 130 else None,
            "frag_amount": {str(x): _round(v) for x, v in frag.items()},
            "frag_ratio": {str(x): _round(v) for x, v in ratio.items()},
            "failed": self.failed,
            "failed_reasons": dict(sorted(self.failed_reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            "wall_s": round(self.wall_s, 3),
            **self._priority_fields(),
        }

    def _priority_fields(self) -> dict[str, Any]:
        if self.evicted is None or self.alloc_by_priority is None:
            return {}  # runs without a priority mix keep the original row shape
        return {
            "evictions": sum(self.evicted.values()),
            "evicted_by_priority": {str(p): n for p, n in sorted(self.evicted.items())},
            "alloc_by_priority": {str(p): round(v, 4) for p, v in sorted(self.alloc_by_priority.items())},
        }


def _round(value: float) -> float | None:
    return None if value != value else round(value, 4)


def reasons_of(error: FitError) -> list[str]:
    """The reasons a FitError counts nodes under ("insufficient cpu", "node(s) didn't match node
    affinity", ...), or its message when it counts none (e.g. a gang that could not be placed)."""
    return list(error.reasons) or [error.message]


def make_scheduler(
    nodes: NodeTable, policy: str, seed: int, target: TargetWorkload, *, preemption: bool = False,
    gpu_partitions: str | None = None, **overrides: Any,
) -> tuple[Scheduler, ClusterState]:  # fmt: skip
    """A fresh cluster of `nodes` (with partition tables under `gpu_partitions`, trace.py) and a
    Scheduler running `policy`'s profile with tie seed `seed` (plus DefaultPreemption with `preemption`)."""
    state = ClusterState.from_nodes(cluster_nodes(nodes, gpu_partitions))
    profile = policy_profile(policy, seed, target.to_specs())
    if preemption:
        profile["plugins"] = [*profile["plugins"], {"name": "DefaultPreemption"}]
    profile.update(overrides)
    return Scheduler(state, profile, registry=sim_registry()), state


@contextmanager
def _cluster_out_of_gc() -> Iterator[None]:
    """While a run places its arrivals, the objects that exist at its start (the cluster state, the
    plugins, the trace) are out of the cyclic collector's reach: each full collection would walk
    them all again (~5 % of an FGD run of the default experiment). Unfrozen at the end, so whatever
    of them becomes garbage is collected as usual. A caller that froze objects itself (a server's
    rebuilt state) keeps its own arrangement: nothing is frozen or unfrozen then."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_fill(
    nodes: NodeTable,
    pods: PodTable,
    policy: str,
    seed: int,
    inflation: float = 1.3,
    *,
    target: TargetWorkload | None = None,
    progress: Progress | None = None,
    preemption: bool = False,
    priorities: tuple[float, ...] = (),
    gpu_partitions: str | None = None,
) -> FillRun:
    """Run the fill protocol for one policy and seed through the real Scheduler.

    `priorities` (weights of classes 0, 1, ...) gives each arrival a seeded priority class; with
    `preemption` an arrival that fits nowhere may evict lower-priority pods (DefaultPreemption):
    the evicted pods' GPU demand leaves the allocation, and the run counts evictions per class.
    """
    policy = resolve_policy(policy)
    capacity = nodes.gpu_capacity_milli
    target = target or metrics.target_workload(pods)
    arrivals = inflate(pods, inflation, capacity, np.random.default_rng(seed))
    started = time.perf_counter()
    scheduler, state = make_scheduler(nodes, policy, seed, target, preemption=preemption, gpu_partitions=gpu_partitions)
    classes = priority_classes(len(arrivals), priorities, seed)
    ledger = _FillLedger({p: 0 for p in range(len(priorities))})
    index = FragmentationIndex.shared(state, target)
    factory = WorkloadFactory()
    n = len(arrivals)
    arrived, used = np.zeros(n), np.zeros(n)
    frag, ratio = np.zeros(n), np.zeros(n)
    request = arrivals.gpu_request_milli.tolist()
    total_arrived = 0
    with _cluster_out_of_gc():
        for i in range(n):
            total_arrived += request[i]
            workload = _arrival(factory, arrivals, i, classes)
            ledger.place(scheduler, workload, request[i], preemption=preemption)
            arrived[i], used[i] = total_arrived, ledger.used
            frag[i], idle = index.totals()
            ratio[i] = 100.0 * frag[i] / idle if idle else 0.0
            if progress is not None and (i % 256 == 255 or i == n - 1):
                progress(i + 1, n)
    _check_accounting(index, state, ledger.used)
    classed = classes is not None
    return FillRun(
        policy=policy,
        seed=seed,
        inflation=inflation,
        arrived=metrics.percent(arrived, capacity),
        alloc=metrics.percent(used, capacity),
        frag_amount=metrics.percent(frag, capacity),
        frag_ratio=ratio,
        failed=ledger.failed,
        wall_s=time.perf_counter() - started,
        trace=pods.source,
        failed_reasons=dict(ledger.failed_reasons),
        evicted=ledger.evicted if classed else None,
        alloc_by_priority=_alloc_by_priority(state, ledger.held_by, len(priorities), capacity) if classed else None,
    )


@dataclass
class _FillLedger:
    """What a fill run's placements hold: GPU milli per placed workload and in all, evictions per
    priority class, and the arrivals that failed with why."""

    evicted: dict[int, int]
    held_by: dict[str, int] = field(default_factory=dict)
    used: int = 0
    failed: int = 0
    failed_reasons: Counter[str] = field(default_factory=Counter)
    #: Failures an arrival of the same shape may reuse while the cluster is unchanged.
    _failures: _Failures = field(default_factory=lambda: _Failures())

    def place(self, scheduler: Scheduler, workload: Any, request: int, *, preemption: bool) -> None:
        """Place one arrival holding `request` GPU milli; one that fits nowhere may evict lower-priority
        pods (with `preemption`), else it fails."""
        key = None if preemption else self._failures.key(scheduler, workload)
        if key is not None and workload.key not in scheduler.state.bindings:  # else the scheduler refuses it
            reasons = self._failures.get(key)
            if reasons is not None:
                self.failed += 1
                self.failed_reasons.update(reasons)
                return
        try:
            scheduler.schedule_one(workload)
        except FitError as exc:
            p, _ = scheduler.find_preemption(workload) if preemption else (None, "")
            if p is None:
                self.failed += 1
                reasons = reasons_of(exc)
                self.failed_reasons.update(reasons)
                if key is not None and exc.no_node_passed:
                    self._failures.put(key, reasons)
                return
            scheduler.apply_preemption(p)
            for victim in p.victims:
                self.used -= self.held_by.pop(victim.workload)
                self.evicted[victim.priority] = self.evicted.get(victim.priority, 0) + 1
        self.used += request
        self.held_by[workload.key] = request


_FailureKey = tuple[Hashable, tuple[int, ...]]


class _Failures:
    """The reasons of the last failure per request shape, with the cluster's version then.

    An arrival whose shape already failed on the cluster as it is now (`ClusterState.version`
    unchanged: no binding, release or node change since) fails again with the same reasons: the
    filters read only the request shape and the nodes (the Scheduler's memo keys its verdicts the
    same way, `Framework.node_local`). Near the end of a fill run about a quarter of the failing
    arrivals are such repeats; each would compile, pre-filter and filter every node again, then have
    every filter explain its rejections to word the reasons (`diagnose`). Only failures raised while filtering
    (`FitError.no_node_passed`) are kept: a later one (every reserve failed) has run score and reserve
    plugins, some of which draw from a seeded generator, and skipping those draws would change
    later decisions.
    """

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[tuple[int, ...], list[str]]] = {}

    @staticmethod
    def key(scheduler: Scheduler, workload: Any) -> _FailureKey | None:
        """The workload's shape and the cluster's version; None when a plugin reads more than the
        shape and the node (`node_local` false), so a failure says nothing about another workload."""
        shape = scheduler.decision_shape(workload)
        return None if shape is None else (shape, scheduler.state.version)

    def get(self, key: _FailureKey) -> list[str] | None:
        last = self._last.get(key[0])
        return last[1] if last is not None and last[0] == key[1] else None

    def put(self, key: _FailureKey, reasons: list[str]) -> None:
        self._last[key[0]] = (key[1], reasons)


def _arrival(factory: WorkloadFactory, arrivals: PodTable, i: int, classes: npt.NDArray[np.int64] | None) -> Any:
    """Arrival `i` as a workload, in its priority class when the run has classes."""
    workload = factory.make(arrivals, i)
    if classes is not None:
        workload = workload.model_copy(update={"priority": int(classes[i])})
    return workload


def _check_accounting(index: FragmentationIndex, state: ClusterState, used: int) -> None:
    """The GPU milli the bindings hold is what the placements add up to (a bug in the run otherwise)."""
    held = int((index.view.count[: state.n] * 1000).sum() - index.view.free[: state.n].sum())
    if held != used:
        raise AssertionError(f"GPU accounting mismatch: bindings hold {held} milli, placements sum to {used}")


def priority_classes(n: int, weights: tuple[float, ...], seed: int) -> npt.NDArray[np.int64] | None:
    """A seeded priority class per arrival (None without a mix); its own stream, so the arrival
    order of the run is the one without priorities."""
    if not weights:
        return None
    p = np.asarray(weights, dtype=np.float64)
    rng = np.random.default_rng([seed, 14])
    return rng.choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def _alloc_by_priority(state: ClusterState, held_by: dict[str, int], classes: int, capacity: int) -> dict[int, float]:
    """Final GPU allocation per priority class, % of GPU capacity."""
    out = {p: 0 for p in range(classes)}
    for key, milli in held_by.items():
        out[state.bindings[key].priority] += milli
    return {p: 100.0 * v / capacity if capacity else 0.0 for p, v in out.items()}
