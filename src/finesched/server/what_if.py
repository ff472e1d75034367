"""What-if planning: where would these workloads go now? A dry run on a private copy of the leader's state.

The copy (the *fork*) is a `ClusterState` of this module's own, brought to the live state by
`ClusterState.restore(live.snapshot())` for every dry run: the snapshot is taken under the loop's
lock (copies of the arrays and the per-node accounts: 60–140 ms at 10,000 nodes with 20,000
bindings, BENCHMARKS.md) and reused while the live state has not changed since; the restore and
the scheduling run outside the lock, so the scheduling loop waits only for the snapshot. A fresh
`Scheduler` with the leader's profile and tenants then submits the workloads and runs its queue,
preempting exactly as the loop would (`auto_commit`: the fork is thrown away). The fork and the
last snapshot stay in memory between dry runs (about one more copy of the state). Nothing reaches the store or the live
state, and the workloads already waiting in the live queue are not part of the dry run (the answer
says how many there are).

With `defragment`, the fork's Scheduler also moves running workloads that allow it
(`spec.migration`) when a planned workload fits nowhere, as the control plane's defragmenter would
(sched/defrag.py): it gets a copy of the live Scheduler's `movable` workloads and of its
defragmenter (budget and cool-downs so far), or, when the profile does not defragment, a fresh one
with the default settings, so that a dry run answers which moves WOULD let the workloads fit even
where the control plane does not move anything. The answer says which settings applied.

One dry run at a time (the route makes callers queue in the event loop; here a second caller waits
up to `busy_timeout_s`, then `Busy`): the fork's memory is bounded, and many plans at once slow down
only the plans, never the loop.
"""

from __future__ import annotations

import copy
import gc
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from finesched.model.workload import Workload
from finesched.sched.defrag import Defragmenter
from finesched.sched.profile import Defragmentation, Profile
from finesched.sched.records import VictimFilter, decision_records
from finesched.sched.scheduler import Scheduler
from finesched.server.loop.loop import SchedulerLoop
from finesched.state.cluster import ClusterState, Snapshot


class NotLeader(Exception):
    """This replica does not hold the scheduling lease: it has no live state to plan on."""


class Busy(Exception):
    """Another dry run held the fork for longer than the caller may wait."""


@dataclass(frozen=True)
class PlanAnswer:
    """The plain-data answer (`finesched.sched.records` shape) and the figures of the copy it ran on."""

    doc: dict[str, Any]
    nodes: int
    pending: int


class WhatIf:
    """Dry runs on a fork of `loop`'s live state (see the module docstring)."""

    def __init__(self, loop: SchedulerLoop, busy_timeout_s: float = 30.0):
        self.loop = loop
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._fork: ClusterState | None = None
        self._fork_profile: Profile | None = None
        self._last: tuple[tuple[int, tuple[int, ...]], Snapshot] | None = None

    def plan(
        self, workloads: Sequence[Workload], visible: VictimFilter | None = None, *, defragment: bool = False
    ) -> PlanAnswer:
        """Place `workloads` (through a fresh queue: priority, DRF, gangs, preemption, and with
        `defragment` moves of movable workloads) on a copy of the live state; victims and movers
        `visible` refuses are answered without their names."""
        if not self._lock.acquire(timeout=self.busy_timeout_s):
            raise Busy(f"another dry run has been running for over {self.busy_timeout_s:g}s; retry")
        try:
            with self.loop.lock:
                live = self.loop.scheduler
                if live is None:
                    raise NotLeader("this replica is not the scheduling leader; ask the leader or retry")
                snapshot = self._snapshot(live.state)
                profile, preemption = live.profile, live.preemption
                tenants = list(live.queue.quotas.tenants.values())
                topologies = list(live.topologies.values())
                pending = len(self.loop.queued)
                movable = dict(live.movable) if defragment else {}
                defragmenter = _defragmenter(live.defragmenter) if defragment else None
                from_profile = live.defragmenter is not None
            fork = self._fork_for(profile)
            with _collector_paused():  # the restore allocates per-node accounts by the thousand
                fork.restore(snapshot)
                scheduler = Scheduler(fork, profile, tenants, preemption=preemption, topologies=topologies)
                scheduler.movable, scheduler.defragmenter = movable, defragmenter
                scheduler.submit(workloads)
                results = scheduler.run(report_waiting=False)
                results += scheduler.run()
            tenant_of = {w.key: w.tenant for w in workloads}
            preemptions, plans = scheduler.take_preemptions(), scheduler.take_defragmentations()
            doc = decision_records(results, preemptions, tenant_of, scheduler.preemption_misses, visible, plans)
            if defragmenter is not None:
                doc["defragmentation"] = settings_record(defragmenter, from_profile)
            return PlanAnswer(doc, fork.n, pending)
        finally:
            self._lock.release()

    def _snapshot(self, state: ClusterState) -> Snapshot:
        """The live state's snapshot (the caller holds the loop's lock): the last one again while the
        state has not changed since (`ClusterState.version`), else a new one, taken with the garbage
        collector paused so that a collection of the whole heap never runs while the loop waits."""
        key = (id(state), state.version)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        with _collector_paused():
            snapshot = state.snapshot()
        self._last = (key, snapshot)
        return snapshot

    def _fork_for(self, profile: Profile) -> ClusterState:
        """The fork, made once per profile: an empty state with the profile's plugins' extras attached
        (a Scheduler attaches them), which `restore` then fills from each live snapshot."""
        if self._fork is None or self._fork_profile != profile:
            fork = ClusterState()
            Scheduler(fork, profile)
            self._fork, self._fork_profile = fork, profile
        return self._fork


def _defragmenter(live: Defragmenter | None) -> Defragmenter:
    """The dry run's defragmenter: a copy of the live one (its budget used and cool-downs so far,
    which the dry run's moves must not spend), or one with the default settings."""
    return copy.deepcopy(live) if live is not None else Defragmenter(Defragmentation())


def settings_record(defragmenter: Defragmenter, from_profile: bool) -> dict[str, Any]:
    """Which defragmentation settings the dry run planned with, and where they came from."""
    settings = defragmenter.config.model_dump(mode="json", by_alias=True)
    return {"settings": settings, "source": "profile" if from_profile else "defaults"}


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a short, bounded burst of allocations.

    A large control plane holds millions of long-lived objects; copying a 10,000-node state
    allocates enough to trigger full collections that walk all of them (seconds, measured). What
    the burst leaves behind is collected as usual once the collector runs again."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
