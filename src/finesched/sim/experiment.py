"""Experiments that drive the real Scheduler with a trace: the FGD fill protocol and a timed replay.

**Fill** (FGD-PROTOCOL.md §2, "workload inflation"). With a seeded generator: shuffle the original
pods (sorted by name first), then append clones drawn uniformly with replacement while the total
GPU request stays within ``inflation`` x capacity (the check adds the clone's per-GPU milli d and
the total grows by k·d, the artifact's quirk; the first draw that would exceed stops). Pods arrive
one at a time and never leave; a pod no node takes is dropped and the run goes on. After every
arrival: allocation rate, arrived demand, fragmentation amount and ratio.

Deviation: the generator is numpy's PCG64 (`numpy.random.default_rng(seed)`), not Go's
math/rand, so seed 42 here is a different shuffle, clone set and tie order than seed 42 in the
paper's artifact; results agree in distribution, not bit for bit.

**Replay**. Pods arrive at their creation time (divided by ``time_scale`` to raise the load) and,
once placed, run for their trace duration (deletion − creation) and leave. Pods that do not fit
wait in the Scheduler's queue (priority, then DRF between tenants = the trace's QoS classes, FIFO
within a tenant) and are retried whenever a pod leaves. Reported: GPU allocation over time,
queue length over time and queueing delay (placement − arrival).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
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
    classes = _priority_classes(len(arrivals), priorities, seed)
    evicted: dict[int, int] = {p: 0 for p in range(len(priorities))}
    held_by: dict[str, int] = {}
    index = FragmentationIndex.shared(state, target)
    factory = WorkloadFactory()
    n = len(arrivals)
    arrived, used = np.zeros(n), np.zeros(n)
    frag, ratio = np.zeros(n), np.zeros(n)
    request = arrivals.gpu_request_milli.tolist()
    total_arrived = total_used = failed = 0
    for i in range(n):
        total_arrived += request[i]
        workload = factory.make(arrivals, i)
        if classes is not None:
            workload = workload.model_copy(update={"priority": int(classes[i])})
        try:
            scheduler.schedule_one(workload)
            total_used += request[i]
            held_by[workload.key] = request[i]
        except FitError:
            p, _ = scheduler.find_preemption(workload) if preemption else (None, "")
            if p is None:
                failed += 1
            else:
                scheduler.apply_preemption(p)
                for victim in p.victims:
                    total_used -= held_by.pop(victim.workload)
                    evicted[victim.priority] = evicted.get(victim.priority, 0) + 1
                total_used += request[i]
                held_by[workload.key] = request[i]
        arrived[i], used[i] = total_arrived, total_used
        frag[i], idle = index.totals()
        ratio[i] = 100.0 * frag[i] / idle if idle else 0.0
        if progress is not None and (i % 256 == 255 or i == n - 1):
            progress(i + 1, n)
    held = int((index.view.count[: state.n] * 1000).sum() - index.view.free[: state.n].sum())
    if held != total_used:
        raise AssertionError(f"GPU accounting mismatch: bindings hold {held} milli, placements sum to {total_used}")
    return FillRun(
        policy=policy,
        seed=seed,
        inflation=inflation,
        arrived=metrics.percent(arrived, capacity),
        alloc=metrics.percent(used, capacity),
        frag_amount=metrics.percent(frag, capacity),
        frag_ratio=ratio,
        failed=failed,
        wall_s=time.perf_counter() - started,
        trace=pods.source,
        evicted=evicted if classes is not None else None,
        alloc_by_priority=_alloc_by_priority(state, held_by, len(priorities), capacity)
        if classes is not None
        else None,
    )


def _priority_classes(n: int, weights: tuple[float, ...], seed: int) -> npt.NDArray[np.int64] | None:
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


# Replay --------------------------------------------------------------------------------------------------
@dataclass
class ReplayRun:
    """One policy x seed replay: time series (trace seconds) and per-pod queueing delays."""

    policy: str
    seed: int
    time_scale: float
    times: FloatArray
    alloc: FloatArray
    queued: npt.NDArray[np.int64]
    delays: FloatArray
    unplaced: int
    wall_s: float
    trace: str = ""
    by_tenant: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Time of the last arrival: utilization is averaged over the arrival window, since the
    #: trace's long-running pods keep a few GPUs busy long after the last arrival.
    last_arrival: float = 0.0

    def mean_alloc(self, start: float, end: float) -> float:
        """Time-weighted mean GPU allocation (%) over [start, end] (the step function of `alloc`)."""
        if len(self.times) == 0:
            return 0.0
        if end <= start:
            return float(self.alloc[0])
        edges = np.clip(np.append(self.times, np.inf), start, end)
        return float((self.alloc * np.diff(edges)).sum() / (end - start))

    def record(self) -> dict[str, Any]:
        mean_alloc = self.mean_alloc(self.times[0] if len(self.times) else 0.0, self.last_arrival)
        return {
            "policy": self.policy,
            "seed": self.seed,
            "trace": self.trace,
            "time_scale": self.time_scale,
            "alloc_mean": round(mean_alloc, 4),
            "alloc_peak": round(float(self.alloc.max()), 4) if len(self.alloc) else 0.0,
            "queue_peak": int(self.queued.max()) if len(self.queued) else 0,
            "delay_s": {k: round(v, 3) for k, v in metrics.queueing_stats(self.delays).items()},
            "delay_by_tenant_s": self.by_tenant,
            "placed": len(self.delays),
            "waited": int((self.delays > 0).sum()),
            "unplaced": self.unplaced,
            "wall_s": round(self.wall_s, 3),
        }


def run_replay(
    nodes: NodeTable,
    pods: PodTable,
    policy: str,
    seed: int,
    time_scale: float = 1.0,
    *,
    target: TargetWorkload | None = None,
    progress: Progress | None = None,
) -> ReplayRun:
    """Replay `pods` by their timestamps through the Scheduler's queue (see the module docstring)."""
    if not pods.has_times:
        raise ValueError(f"{pods.source or 'pod list'} has no creation/deletion times; replay needs them")
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")
    policy = resolve_policy(policy)
    capacity = nodes.gpu_capacity_milli
    target = target or metrics.target_workload(pods)
    started = time.perf_counter()
    scheduler, _ = make_scheduler(nodes, policy, seed, target)
    factory = WorkloadFactory()
    arrival = pods.creation / time_scale
    duration = np.maximum(pods.deletion - pods.creation, 0).astype(np.float64)
    order = np.argsort(arrival, kind="stable").tolist()
    keys = {factory.make(pods, 0).namespace + "/" + name: i for i, name in enumerate(pods.names)}
    request = pods.gpu_request_milli.tolist()
    departures: list[tuple[float, int, str]] = []
    times: list[float] = []
    alloc: list[float] = []
    queued: list[int] = []
    delays = np.full(len(pods), np.nan)
    used = 0
    next_arrival = 0
    handled = 0
    while next_arrival < len(order) or departures:
        now = min(
            arrival[order[next_arrival]] if next_arrival < len(order) else np.inf,
            departures[0][0] if departures else np.inf,
        )
        released = False
        while departures and departures[0][0] <= now:
            _, i, key = heapq.heappop(departures)
            scheduler.release(key)
            used -= request[i]
            released = True
        batch = []
        while next_arrival < len(order) and arrival[order[next_arrival]] <= now:
            batch.append(factory.make(pods, order[next_arrival]))
            next_arrival += 1
        scheduler.submit(batch)
        if released:
            scheduler.queue.flush_backoff()  # offline: retry parked pods now, not after wall-clock backoff
        for result in scheduler.run():
            if isinstance(result, Binding):
                i = keys[result.workload]
                delays[i] = now - arrival[i]
                used += request[i]
                heapq.heappush(departures, (now + duration[i], i, result.workload))
        times.append(float(now))
        alloc.append(100.0 * used / capacity)
        queued.append(len(scheduler.queue))
        handled += len(batch)
        if progress is not None and batch:
            progress(handled, len(pods))
    placed = ~np.isnan(delays)
    by_tenant = {
        tenant: {k: round(v, 3) for k, v in metrics.queueing_stats(delays[placed & (qos == tenant)]).items()}
        for tenant in sorted(set(pods.qos))
        for qos in [np.asarray(pods.qos, dtype=object)]
    }
    return ReplayRun(
        policy=policy,
        seed=seed,
        time_scale=time_scale,
        times=np.asarray(times),
        alloc=np.asarray(alloc),
        queued=np.asarray(queued, dtype=np.int64),
        delays=delays[placed],
        unplaced=int((~placed).sum()),
        wall_s=time.perf_counter() - started,
        trace=pods.source,
        by_tenant=by_tenant,
        last_arrival=float(arrival.max()),
    )
