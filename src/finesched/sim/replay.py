"""The timed replay: pods arrive by their trace timestamps, run for their trace duration and leave.

Pods arrive at their creation time (divided by ``time_scale`` to raise the load) and, once placed,
run for their trace duration (deletion − creation) and leave. Pods that do not fit wait in the
Scheduler's queue (priority, then DRF between tenants = the trace's QoS classes, FIFO within a
tenant) and are retried whenever a pod leaves. Reported: GPU allocation over time, queue length
over time and queueing delay (first placement − arrival).

With a priority mix (`priorities`: weights of classes 0, 1, ...) every pod gets a seeded class,
drawn as in the fill protocol (sim/experiment.py). With `preemption` the profile gets
DefaultPreemption, so a queued pod that fits nowhere may evict lower-priority running pods
(`Scheduler.run` decides and applies it). An evicted pod is submitted again, as its controller
would recreate it: it waits in the queue and, placed again, runs its whole trace duration again
(the work done before the eviction is lost). The report counts evictions by the victims' class,
and queueing delay and unplaced pods per class.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.workload import Workload
from finesched.plugins.fragmentation import TargetWorkload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.sim import metrics
from finesched.sim.experiment import Progress, make_scheduler, priority_classes, reasons_of
from finesched.sim.policies import resolve_policy
from finesched.sim.trace import NodeTable, PodTable, WorkloadFactory

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


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
    #: With a priority mix: evictions by the victims' class, and per class the queueing delay
    #: (first placements) and the pods never placed or evicted and never placed again.
    evicted: dict[int, int] | None = None
    by_priority: dict[int, dict[str, Any]] | None = None
    #: Why the pods never placed still waited at the end: their last FitError's `reasons_of`, counted
    #: like `FillRun.failed_reasons` (each pod once under every reason).
    unplaced_reasons: dict[str, int] = field(default_factory=dict)

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
        row = {
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
            "unplaced_reasons": dict(sorted(self.unplaced_reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            "wall_s": round(self.wall_s, 3),
        }
        if self.evicted is None or self.by_priority is None:
            return row  # runs without a priority mix keep the original row shape
        return {
            **row,
            "evictions": sum(self.evicted.values()),
            "evicted_by_priority": {str(p): n for p, n in sorted(self.evicted.items())},
            "by_priority": {str(p): v for p, v in sorted(self.by_priority.items())},
        }


class _Replay:
    """The event loop's bookkeeping: what runs, since when, and what each class lost."""

    def __init__(self, scheduler: Scheduler, pods: PodTable, classes: npt.NDArray[np.int64] | None):
        self.scheduler, self.pods, self.classes = scheduler, pods, classes
        self.factory = WorkloadFactory()
        self.request = pods.gpu_request_milli.tolist()
        self.duration = np.maximum(pods.deletion - pods.creation, 0).astype(np.float64)
        self.keys = {self.factory.make(pods, 0).namespace + "/" + name: i for i, name in enumerate(pods.names)}
        #: (leaves at, pod, key, start number): an entry is stale once its pod was evicted.
        self.departures: list[tuple[float, int, str, int]] = []
        self.started: dict[str, int] = {}  # running pod -> its start number
        self.starts = 0
        self.used = 0
        self.delays = np.full(len(pods), np.nan)
        self.evicted = np.zeros(len(pods), dtype=np.int64)  # times each pod was evicted
        self.done = np.zeros(len(pods), dtype=bool)  # ran to its end
        self.last_error: dict[str, FitError] = {}  # waiting pod -> why it did not fit last time

    def workload(self, i: int) -> Workload:
        workload = self.factory.make(self.pods, i)
        if self.classes is not None:
            workload = workload.model_copy(update={"priority": int(self.classes[i])})
        return workload

    def leave_until(self, now: float) -> bool:
        """Release the pods whose run ends by `now`; whether any left."""
        released = False
        while self.departures and self.departures[0][0] <= now:
            _, i, key, start = heapq.heappop(self.departures)
            if self.started.get(key) != start:
                continue  # evicted (and maybe placed again) since: not this run's end
            del self.started[key]
            self.scheduler.release(key)
            self.used -= self.request[i]
            self.done[i] = released = True
        return released

    def run(self, now: float, arrival: FloatArray) -> None:
        """One `Scheduler.run` at `now`: place, account evictions, submit the victims again."""
        for result in self.scheduler.run():
            if isinstance(result, FitError):
                self.last_error[result.workload] = result
            if isinstance(result, Binding):
                self.last_error.pop(result.workload, None)
                i = self.keys[result.workload]
                if np.isnan(self.delays[i]):
                    self.delays[i] = now - arrival[i]
                self.used += self.request[i]
                self.starts += 1
                self.started[result.workload] = self.starts
                heapq.heappush(self.departures, (now + self.duration[i], i, result.workload, self.starts))
        again = []
        for p in self.scheduler.take_preemptions():
            for victim in p.victims:
                i = self.keys[victim.workload]
                self.started.pop(victim.workload, None)
                self.used -= self.request[i]
                self.evicted[i] += 1
                again.append(self.workload(i))
        if again:
            self.scheduler.submit(again)

    def by_priority(self, placed: BoolArray, count: int) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
        """Evictions by the victims' class, and per class (0 .. count-1) the queueing delay of first
        placements, the pods never placed, and the evicted pods that never ran to their end."""
        assert self.classes is not None
        evicted, out = {}, {}
        lost = (self.evicted > 0) & ~self.done
        for c in range(count):
            mine = self.classes == c
            evicted[c] = int(self.evicted[mine].sum())
            delays = metrics.queueing_stats(self.delays[placed & mine])
            out[c] = {
                "pods": int(mine.sum()),
                "delay_s": {k: round(v, 3) for k, v in delays.items()},
                "unplaced": int((~placed & mine).sum()),
                "evicted_unfinished": int((lost & mine).sum()),
            }
        return evicted, out


def run_replay(
    nodes: NodeTable,
    pods: PodTable,
    policy: str,
    seed: int,
    time_scale: float = 1.0,
    *,
    target: TargetWorkload | None = None,
    progress: Progress | None = None,
    preemption: bool = False,
    priorities: tuple[float, ...] = (),
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
    scheduler, _ = make_scheduler(nodes, policy, seed, target, preemption=preemption)
    loop = _Replay(scheduler, pods, priority_classes(len(pods), priorities, seed))
    arrival = pods.creation / time_scale
    times, alloc, queued = _step_through(loop, scheduler, arrival, capacity, progress)
    placed = ~np.isnan(loop.delays)
    by_tenant = _delays_by_tenant(pods, loop.delays, placed)
    evicted, by_priority = loop.by_priority(placed, len(priorities)) if loop.classes is not None else (None, None)
    return ReplayRun(
        policy=policy,
        seed=seed,
        time_scale=time_scale,
        times=np.asarray(times),
        alloc=np.asarray(alloc),
        queued=np.asarray(queued, dtype=np.int64),
        delays=loop.delays[placed],
        unplaced=int((~placed).sum()),
        wall_s=time.perf_counter() - started,
        trace=pods.source,
        by_tenant=by_tenant,
        last_arrival=float(arrival.max()),
        evicted=evicted,
        by_priority=by_priority,
        unplaced_reasons=dict(Counter(reason for e in loop.last_error.values() for reason in reasons_of(e))),
    )


def _step_through(
    loop: _Replay, scheduler: Scheduler, arrival: npt.NDArray[np.float64], capacity: float, progress: Progress | None
) -> tuple[list[float], list[float], list[int]]:
    """Go from event to event (the next arrival or departure) until every pod has arrived and left:
    the times, and the GPU allocation (percent of `capacity`) and queue length at each."""
    order = np.argsort(arrival, kind="stable").tolist()
    times: list[float] = []
    alloc: list[float] = []
    queued: list[int] = []
    next_arrival = 0
    while next_arrival < len(order) or loop.departures:
        now = min(
            arrival[order[next_arrival]] if next_arrival < len(order) else np.inf,
            loop.departures[0][0] if loop.departures else np.inf,
        )
        released = loop.leave_until(now)
        batch = []
        while next_arrival < len(order) and arrival[order[next_arrival]] <= now:
            batch.append(loop.workload(order[next_arrival]))
            next_arrival += 1
        scheduler.submit(batch)
        if released:
            scheduler.queue.flush_backoff()  # offline: retry parked pods now, not after wall-clock backoff
        loop.run(now, arrival)
        times.append(float(now))
        alloc.append(100.0 * loop.used / capacity)
        queued.append(len(scheduler.queue))
        if progress is not None and batch:
            progress(next_arrival, len(order))
    return times, alloc, queued


def _delays_by_tenant(
    pods: PodTable, delays: npt.NDArray[np.float64], placed: BoolArray
) -> dict[str, dict[str, float]]:
    """Queueing delay statistics of the placed pods per tenant (the trace's QoS class)."""
    qos = np.asarray(pods.qos, dtype=object)
    return {
        tenant: {k: round(v, 3) for k, v in metrics.queueing_stats(delays[placed & (qos == tenant)]).items()}
        for tenant in sorted(set(pods.qos))
    }
