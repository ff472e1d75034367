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

With `defragmentation` (the profile's settings, sched/profile.py Defragmentation) the Scheduler's
defragmenter is on: a pod that fits nowhere may have running pods moved to make room for it. The
trace has no opt-in (`spec.migration`), so every pod is movable. The defragmenter's budget and
cool-down follow the replay's clock (trace time after `time_scale`). A moved pod restarts on its
target as an evicted pod restarts (its departure is pushed back to now + its whole duration: the
work done is lost); the report counts moves, moved pods and the GPU-seconds of work restarted.
"""

from __future__ import annotations

import heapq
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.workload import Migration, Workload
from finesched.plugins.fragmentation import TargetWorkload
from finesched.sched.defrag import DefragPlan
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
    #: Per placed pod (aligned with `delays`): its GPU request in GPUs (k x d / 1000) and whether it
    #: needs at least one whole GPU (d = 1000), for the waiting figures of `waiting_record`.
    gpus: FloatArray = field(default_factory=lambda: np.zeros(0))
    whole: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: With the defragmenter: its settings, and what it did (`DefragLedger.record`).
    defragmentation: dict[str, Any] | None = None
    moves: dict[str, Any] | None = None

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
            **self.waiting_record(),
        }
        if self.defragmentation is not None:
            row["defragmentation"] = self.defragmentation
            row["moves"] = self.moves or {}
        if self.evicted is None or self.by_priority is None:
            return row  # runs without a priority mix keep the original row shape
        return {
            **row,
            "evictions": sum(self.evicted.values()),
            "evicted_by_priority": {str(p): n for p, n in sorted(self.evicted.items())},
            "by_priority": {str(p): v for p, v in sorted(self.by_priority.items())},
        }

    def waiting_record(self) -> dict[str, Any]:
        """What waiting cost: the pods that waited and their GPU-seconds of waiting (GPUs x delay),
        and the waiting time of the pods needing at least one whole GPU (mean, p99, max)."""
        waited = self.delays > 0
        whole = self.delays[self.whole] if len(self.whole) == len(self.delays) else np.zeros(0)
        return {
            "waited_gpu_s": round(float((self.gpus[waited] * self.delays[waited]).sum()), 3)
            if len(self.gpus) == len(self.delays)
            else 0.0,
            "whole_gpu": {
                "placed": int(whole.size),
                "waited": int((whole > 0).sum()),
                "delay_mean_s": round(float(whole.mean()), 3) if whole.size else 0.0,
                "delay_p99_s": round(float(np.percentile(whole, 99)), 3) if whole.size else 0.0,
                "delay_max_s": round(float(whole.max()), 3) if whole.size else 0.0,
            },
        }


class DefragLedger:
    """What the defragmenter did in one replay: moves, moved pods, work restarted, and what the
    planner answered each time it was asked (its `why`, with names and numbers blanked, counted)."""

    def __init__(self, pods: int):
        self.pods = pods
        self.moves = 0
        self.plans = 0
        self.moved: Counter[str] = Counter()
        self.restarted_gpu_s = 0.0
        self.answers: Counter[str] = Counter()

    def asked(self, plan: DefragPlan | None, why: str) -> None:
        self.answers["plan found" if plan is not None else _blank(why)] += 1

    def record(self) -> dict[str, Any]:
        return {
            "plans": self.plans,
            "moves": self.moves,
            "moves_pct_of_pods": round(100.0 * self.moves / max(self.pods, 1), 4),
            "moved_pods": len(self.moved),
            "moves_per_moved_pod_max": max(self.moved.values(), default=0),
            "restarted_gpu_s": round(self.restarted_gpu_s, 3),
            "planner_answers": dict(self.answers.most_common(12)),
        }


def _blank(why: str) -> str:
    """A planner answer with workload names and numbers blanked, so equal reasons count together."""
    return re.sub(r"\d+(\.\d+)?", "N", re.sub(r"trace/\S+", "<pod>", why))[:200]


class _Replay:
    """The event loop's bookkeeping: what runs, since when, and what each class lost."""

    def __init__(
        self, scheduler: Scheduler, pods: PodTable, classes: npt.NDArray[np.int64] | None, movable: bool = False
    ):
        self.scheduler, self.pods, self.classes = scheduler, pods, classes
        #: Every pod opts in to being moved (the trace has no `spec.migration` of its own).
        self.movable = movable
        self.ledger = DefragLedger(len(pods))
        self.now = 0.0  # the replay's clock (the Scheduler's, for the defragmenter's budget)
        self.factory = WorkloadFactory()
        self.request = pods.gpu_request_milli.tolist()
        self.duration = np.maximum(pods.deletion - pods.creation, 0).astype(np.float64)
        self.keys = {self.factory.make(pods, 0).namespace + "/" + name: i for i, name in enumerate(pods.names)}
        #: (leaves at, pod, key, start number): an entry is stale once its pod was evicted.
        self.departures: list[tuple[float, int, str, int]] = []
        self.started: dict[str, int] = {}  # running pod -> its start number
        self.since: dict[str, float] = {}  # running pod -> when it (re)started
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
        if self.movable:
            workload = workload.model_copy(update={"migration": _MOVABLE})
        return workload

    def start(self, i: int, key: str, now: float) -> None:
        """Pod `i` starts (or starts again) now and leaves after its whole trace duration."""
        self.starts += 1
        self.started[key] = self.starts
        self.since[key] = now
        heapq.heappush(self.departures, (now + self.duration[i], i, key, self.starts))

    def stop(self, key: str, now: float) -> float:
        """Pod `key` stops before its end (evicted or moved): its pending departure becomes stale.
        The seconds it had run, whose work is lost."""
        self.started.pop(key, None)
        return now - self.since.pop(key, now)

    def leave_until(self, now: float) -> bool:
        """Release the pods whose run ends by `now`; whether any left."""
        released = False
        while self.departures and self.departures[0][0] <= now:
            _, i, key, start = heapq.heappop(self.departures)
            if self.started.get(key) != start:
                continue  # evicted (and maybe placed again) since: not this run's end
            del self.started[key]
            self.since.pop(key, None)
            self.scheduler.release(key)
            self.used -= self.request[i]
            self.done[i] = released = True
        return released

    def run(self, now: float, arrival: FloatArray) -> None:
        """One `Scheduler.run` at `now`: place, restart the moved pods on their targets, account
        evictions, submit the victims again."""
        self.now = now
        for result in self.scheduler.run():
            if isinstance(result, FitError):
                self.last_error[result.workload] = result
            if isinstance(result, Binding):
                self.last_error.pop(result.workload, None)
                i = self.keys[result.workload]
                if np.isnan(self.delays[i]):
                    self.delays[i] = now - arrival[i]
                self.used += self.request[i]
                self.start(i, result.workload, now)
        for plan in self.scheduler.take_defragmentations():
            self.moved(plan, now)
        again = []
        for p in self.scheduler.take_preemptions():
            for victim in p.victims:
                i = self.keys[victim.workload]
                self.stop(victim.workload, now)
                self.used -= self.request[i]
                self.evicted[i] += 1
                again.append(self.workload(i))
        if again:
            self.scheduler.submit(again)

    def moved(self, plan: DefragPlan, now: float) -> None:
        """Each mover of an applied plan restarts on its target: the work it had done is lost."""
        self.ledger.plans += 1
        for move in plan.moves:
            i = self.keys[move.workload]
            ran = self.stop(move.workload, now)
            self.ledger.restarted_gpu_s += self.request[i] / 1000.0 * ran
            self.ledger.moves += 1
            self.ledger.moved[move.workload] += 1
            self.start(i, move.workload, now)

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
    defragmentation: Mapping[str, Any] | None = None,
) -> ReplayRun:
    """Replay `pods` by their timestamps through the Scheduler's queue (see the module docstring).

    `defragmentation`: the profile's `defragmentation` settings (camelCase or snake_case keys; {}
    for the defaults): the defragmenter is on and every pod is movable."""
    if not pods.has_times:
        raise ValueError(f"{pods.source or 'pod list'} has no creation/deletion times; replay needs them")
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")
    policy = resolve_policy(policy)
    capacity = nodes.gpu_capacity_milli
    target = target or metrics.target_workload(pods)
    started = time.perf_counter()
    overrides = {} if defragmentation is None else {"defragmentation": dict(defragmentation)}
    scheduler, _ = make_scheduler(nodes, policy, seed, target, preemption=preemption, **overrides)
    loop = _Replay(scheduler, pods, priority_classes(len(pods), priorities, seed), defragmentation is not None)
    if defragmentation is not None:
        _watch_defragmenter(scheduler, loop)
    arrival = pods.creation / time_scale
    times, alloc, queued = _step_through(loop, scheduler, arrival, capacity, progress)
    placed = ~np.isnan(loop.delays)
    gpus = pods.gpu_request_milli[placed] / 1000.0
    whole = (pods.gpu_milli[placed] >= 1000) & (pods.num_gpu[placed] >= 1)
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
        gpus=gpus.astype(np.float64),
        whole=whole,
        defragmentation=_settings(scheduler),
        moves=None if scheduler.defragmenter is None else loop.ledger.record(),
    )


def _settings(scheduler: Scheduler) -> dict[str, Any] | None:
    """The defragmenter's settings as the profile spells them (None: it was off)."""
    config = scheduler.profile.defragmentation
    return None if config is None else config.model_dump(by_alias=True)


#: Every trace pod's migration opt-in under `--defragment`.
_MOVABLE = Migration(allowed=True)


def _watch_defragmenter(scheduler: Scheduler, loop: _Replay) -> None:
    """The Scheduler's clock is the replay's, and each planner answer is counted (its why)."""
    scheduler.clock = lambda: loop.now
    plan_for = scheduler.find_defragmentation

    def counted(workload: Workload, *args: Any, **kwargs: Any) -> tuple[DefragPlan | None, str]:
        plan, why = plan_for(workload, *args, **kwargs)
        loop.ledger.asked(plan, why)
        return plan, why

    scheduler.find_defragmentation = counted  # type: ignore[method-assign]


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
