"""What the scheduling leader looks after once a second besides deciding: agents' heartbeats
(NotReady, then requeue after a grace period), why each queued workload still waits, and the
events table's retention (old events pruned)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta

from finesched.sched.queue import SchedulingQueue, gang_reason
from finesched.server.store.store import Store, now

log = logging.getLogger("finesched.loop")

#: Above this many queued workloads, why each waits is not written (it would cost a query each).
MAX_EXPLAINED = 2000


@dataclass
class HeartbeatMonitor:
    """A node whose agent missed `missed` reports (`heartbeat_s` apart) goes NotReady; after
    `requeue_after_s` more seconds (None: never) its workloads are requeued, once per silence,
    and handed to `on_requeue` with the reason (a job slot among them fails its region).
    Nodes registered by hand never reported and are never marked."""

    store: Store
    heartbeat_s: float
    missed: int
    requeue_after_s: float | None
    requeued: set[str] = field(default_factory=set)
    on_requeue: Callable[[list[str], str], None] | None = None

    def check(self) -> None:
        not_ready_after = timedelta(seconds=self.heartbeat_s * self.missed)
        stamp = now()
        silent = {name: (ready, beat) for name, ready, beat in self.store.silent_nodes(stamp - not_ready_after)}
        self.requeued &= set(silent)  # a node that reported again may be requeued again later
        for name, (ready, beat) in silent.items():
            quiet = stamp - beat
            if ready:
                message = f"no heartbeat for {quiet.total_seconds():.0f}s ({self.missed} missed)"
                self.store.set_node_flags(name, "NotReady", message, ready=False)
                continue
            if self.requeue_after_s is None or name in self.requeued:
                continue
            if quiet > not_ready_after + timedelta(seconds=self.requeue_after_s):
                why = f"node {name} not ready for {quiet.total_seconds():.0f}s"
                keys = self.store.requeue_node(name, why)
                self.requeued.add(name)
                log.warning("node %s not ready: requeued %d workloads", name, len(keys))
                if keys and self.on_requeue is not None:
                    self.on_requeue(keys, why)


@dataclass
class WaitingReasons:
    """Why queued workloads wait (no node fits, a reached quota, an incomplete gang), remembered so
    that only changes are written."""

    written: dict[str, str] = field(default_factory=dict)

    def changes(self, queue: SchedulingQueue, queued: Collection[str]) -> dict[str, str]:
        """Reasons that differ from the last written ones. Units in their tenant's line (not decided
        yet) get none written: where they stand changes with every decision, and the API reads it
        from the queue when asked (`SchedulerLoop.reasons`), as it does above MAX_EXPLAINED."""
        if not queued or len(queued) > MAX_EXPLAINED:
            if self.written:  # what was written of workloads no longer queued (deleted, bound) goes
                self.written = {k: v for k, v in self.written.items() if k in queued}
            return {}
        changed: dict[str, str] = {}
        for unit, why in queue.waiting():
            reason = ""
            if why == "unschedulable" and unit.last_error is not None:
                reason = unit.last_error.message
            elif why == "quota":
                reason = queue.unit_reason(unit)
            elif why == "gang":
                reason = gang_reason(unit.workloads)
            for workload in unit.workloads:
                key = workload.key
                if reason and key in queued and self.written.get(key) != reason:
                    changed[key] = reason
        self.written = {k: v for k, v in self.written.items() if k in queued}
        self.written.update(changed)
        return changed


@dataclass
class EventPruner:
    """Events older than `ttl_s` (Kubernetes keeps them an hour) are deleted every `every_s`, in
    chunks (the `ix_events_time` index finds them), but never one a reader of this process has not
    read yet: the scheduling loop's change feed (`feed_position`) and the `readers` (the SSE watch
    feed's position, None while it is not running). None: events are kept for ever."""

    store: Store
    ttl_s: float | None
    every_s: float = 60.0
    readers: list[Callable[[], int | None]] = field(default_factory=list)
    last: float = field(default_factory=time.monotonic)  # the first pruning waits a period after start
    pruned: int = 0

    def check(self, feed_position: int) -> int:
        """Prune if a period has passed; how many events were deleted."""
        if self.ttl_s is None or time.monotonic() - self.last < self.every_s:
            return 0
        self.last = time.monotonic()
        positions = [feed_position, *(p for read in self.readers if (p := read()) is not None)]
        removed = self.store.prune_events(now() - timedelta(seconds=self.ttl_s), min(positions))
        if removed:
            self.pruned += removed
            log.info("pruned %d events older than %.0fs", removed, self.ttl_s)
        return removed
