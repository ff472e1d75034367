"""The scheduling loop: the one thread that decides, over a ClusterState rebuilt from the store.

Cycle of the lease holder (DESIGN.md "State and concurrency rules"):
1. follow the change feed (`events`): every node, workload, tenant or topology another writer touched is
   reloaded from the store and reconciled with the in-memory state (idempotent: level-triggered);
2. decide a batch from the queue (`Scheduler.run(limit=...)`): bindings are *assumed*, not committed;
3. write the batch in one transaction, fenced by the lease; only then commit the assumed
   bindings. A workload that changed meanwhile (deleted, requeued) is a conflict: its binding is
   forgotten and the workload reconciled from the store again;
4. watch heartbeats: a node whose agent missed too many goes NotReady (nothing new lands there),
   and after a grace period (when configured) its workloads are requeued.

Only the lease holder runs the cycle; another replica waits and takes over when the lease
expires, rebuilding its state from the store first (S1.6). API handlers write to the store and
then `wake` the loop; submissions made through this process are handed over directly so the
feed does not have to reload them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from finesched.admission import sound_tenants
from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.names import key_problem
from finesched.model.tenant import Tenant
from finesched.model.topology import Topology
from finesched.model.workload import Workload
from finesched.sched.defrag import DefragPlan
from finesched.sched.diagnosis import FitError, InvalidRequest
from finesched.sched.framework import Preemption
from finesched.sched.scheduler import Scheduler
from finesched.server.loop import lifecycle
from finesched.server.loop.feed import FeedCursor, read_changes, read_workloads, touched
from finesched.server.loop.lease import Lease, LostLease
from finesched.server.loop.lifecycle import Backoff
from finesched.server.loop.memory import Trimmer
from finesched.server.loop.setaside import SetAside, Unusable
from finesched.server.loop.upkeep import EventPruner, HeartbeatMonitor, WaitingReasons
from finesched.server.metrics import Metrics, cluster_figures
from finesched.server.store import job_store, topology_store
from finesched.server.store.cluster_view import binding_from_row, node_from_row, tenant_from_row, workload_from_row
from finesched.server.store.locking import LoopLock
from finesched.server.store.move_store import PlanWrite
from finesched.server.store.store import HOLDING, PENDING, REJECTED, Event, NotFound, Store, now
from finesched.server.store.topology_store import topology_from_row
from finesched.state.cluster import ClusterState, StateError
from finesched.state.device_wire import EncodedUpdateError, apply_encoded_updates
from finesched.state.mig_slices import apply_mig_report

log = logging.getLogger("finesched.loop")


@dataclass
class LoopConfig:
    profile: str = "default"
    batch_size: int = 100
    lease_ttl_s: float = 10.0
    heartbeat_s: float = 5.0  # agents report this often
    missed_heartbeats: int = 3  # NotReady after this many missed reports
    requeue_after_s: float | None = 60.0  # requeue a NotReady node's workloads after this (None: never)
    idle_wait_s: float = 0.25
    holder: str | None = None
    #: Before a rejected workload is placed again and a failed one restarted (server/loop/lifecycle.py).
    backoff: Backoff = field(default_factory=Backoff)
    #: Events older than this are pruned by the leader (None: kept for ever); checked every `prune_every_s`.
    event_ttl_s: float | None = 3600.0
    prune_every_s: float = 60.0


@dataclass
class Queued:
    """A workload the scheduler holds in its queue: the store row id and version it was read at."""

    id: int
    version: int
    workload: Workload
    submitted: float = field(default_factory=time.time)


class SchedulerLoop:
    def __init__(self, store: Store, config: LoopConfig | None = None, metrics: Metrics | None = None):
        self.store = store
        self.config = config or LoopConfig()
        self.metrics = metrics or Metrics()
        self.lease = Lease(store, self.config.lease_ttl_s, self.config.holder)
        #: Guards `scheduler` (and its state) between the loop thread and API handlers that read it.
        #: Taken before the store's writer, never inside a write transaction (server/store/locking.py).
        self.lock = LoopLock()
        #: A leaf lock for `_own_events` alone: event ids are recorded inside write transactions.
        self._own_lock = threading.Lock()
        self.scheduler: Scheduler | None = None
        self.queued: dict[str, Queued] = {}
        #: (created, version) of the node rows the state reflects: a row seen again unchanged is skipped.
        self._node_rows: dict[str, tuple[Any, int]] = {}
        #: Pending workloads backing off (rejected, or a job slot to place again): key -> not before.
        self.deferred: dict[str, datetime] = {}
        self._feed = FeedCursor(0)
        self._own_events: set[int] = set()
        cfg = self.config
        self.heartbeats = HeartbeatMonitor(
            store, cfg.heartbeat_s, cfg.missed_heartbeats, cfg.requeue_after_s,
            on_requeue=lambda keys, why: lifecycle.slots_lost(self, keys, why),
        )  # fmt: skip
        self.waiting = WaitingReasons()
        self.pruner = EventPruner(store, cfg.event_ttl_s, cfg.prune_every_s)
        #: Gives what the process freed back to the system (server/loop/memory.py), leader or not.
        self.trimmer = Trimmer()
        self._last_upkeep = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Called with the new scheduler after a rebuild, before it decides (e.g. offers re-hold).
        self.restorers: list[Callable[[Scheduler], None]] = []
        #: Called about once a second on the leader (e.g. expiring offers).
        self.maintenance: list[Callable[[], None]] = []
        #: Objects left out because the loop cannot use them (poison isolation, server/loop/setaside.py).
        self.set_aside = SetAside(store, self.own)
        #: Workloads the scheduler raised on, set aside by the rebuild that follows.
        self._poisoned: dict[str, str] = {}
        #: Deleted workloads still in the scheduler's queue: dropped from it in one pass (`_drop_deleted`)
        #: before the next decision or submission, however many were deleted one by one meanwhile.
        self._deleted: set[str] = set()

    # Life cycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="finesched-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self.lease.release()
        except SQLAlchemyError:
            log.warning("could not release the scheduler lease on shutdown")

    def wake(self) -> None:
        self._wake.set()

    @property
    def is_leader(self) -> bool:
        return self.scheduler is not None

    def _run(self) -> None:
        next_lease = 0.0
        while not self._stop.is_set():
            busy = False
            try:
                if time.monotonic() >= next_lease:
                    self._keep_lease()
                    next_lease = time.monotonic() + self.config.lease_ttl_s / 3
                if self.scheduler is not None:
                    feed_started = time.thread_time()
                    self._follow_feed()
                    self.metrics.feed_seconds.observe(time.thread_time() - feed_started)
                    self._end_deferrals()
                    busy = self._schedule_batch()
                    self._upkeep()
                self.trimmer.check()  # a follower serves reads and watches too
            except LostLease:
                log.warning("lost the scheduler lease; following")
                self._drop()
            except SQLAlchemyError as exc:  # the database is unreachable: keep trying, decide nothing
                log.error("store error in the scheduling loop: %s", exc)
                self._drop()
                next_lease = 0.0
                self._stop.wait(1.0)
            except Exception:  # a bug must not stop scheduling for good: start again from the store
                log.exception("unexpected error in the scheduling loop; rebuilding from the store")
                self._drop()
                next_lease = 0.0
                self._stop.wait(1.0)
            if not busy:
                self._wake.wait(self.config.idle_wait_s)
                self._wake.clear()

    def _keep_lease(self) -> None:
        held = self.lease.try_acquire()
        if held and self.scheduler is None:
            self.rebuild()
            # A rebuild of a large cluster may outlast the lease: renew it at once, and give the
            # state up if another replica took the lease over meanwhile.
            held = self.lease.try_acquire()
            if not held:
                self._drop()
        elif not held and self.scheduler is not None:
            self._drop()
        self.metrics.leader.set(1 if held else 0)

    def _renew_while_busy(self, every_s: float) -> Callable[[], None]:
        """A callback for long work (the rebuild): renews the lease at most every `every_s` seconds."""
        last = time.monotonic()

        def renew() -> None:
            nonlocal last
            if time.monotonic() - last >= every_s:
                self.lease.try_acquire()
                last = time.monotonic()

        return renew

    def _drop(self) -> None:
        with self.lock:
            self.scheduler = None
            self.queued.clear()
            self.deferred.clear()
            self._deleted.clear()
            self.waiting.written.clear()

    # Rebuild (S1.6) --------------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Build the state from the store: nodes, then bindings, then the pending queue."""
        cursor = self.store.last_event_id()  # changes after this are replayed by the feed (idempotent)
        # What the process holds already (its modules, the server, a former state) is long-lived: out
        # of the collector's reach, the full collections the rebuild's allocations trigger, and the
        # one below, walk only the objects the rebuild makes (they walked the whole heap: on a
        # 1,000-node start, about 40 % of the rebuild's time, and they never found garbage there).
        gc.freeze()
        renew = self._renew_while_busy(self.config.lease_ttl_s / 3)
        state = ClusterState()
        node_rows: dict[str, tuple[Any, int]] = {}
        for row in self.store.list_nodes():
            renew()
            try:
                state.add_node(node_from_row(row))
                node_rows[row["name"]] = (row["created"], row["version"])
                self.set_aside.clear("Node", row["name"])
            except Exception as exc:  # one node that cannot be loaded is left out, not the cluster
                self.set_aside.node(row["name"], f"cannot be loaded: {exc}")
        scheduler = Scheduler(
            state, self.config.profile, self._sound_tenants(), auto_commit=False, topologies=self._stored_topologies()
        )
        for row in self.store.bindings():
            renew()
            refused = key_problem(row["workload"])
            if refused is not None:  # bound by an older version: no agent can run it safely
                self.set_aside.bound(row["workload"], f"its name breaks today's rules ({refused})")
                continue
            try:
                binding = binding_from_row(row)
                state.assume(binding)
                state.commit(binding.workload)
            except Exception as exc:  # its node is gone or changed: the workload is placed again
                self.store.release(row["workload"], PENDING, f"binding could not be restored: {exc}")
                continue
            remember_movable(scheduler, row)
        for restore in self.restorers:
            try:
                restore(scheduler)
            except Exception:
                log.exception("restoring after the rebuild failed; going on without it")
        queued: dict[str, Queued] = {}
        for row in self.store.pending():
            self._queue_row(scheduler, queued, row)
        with self.lock:
            self.scheduler = scheduler
            self.queued = queued
            self._deleted = set()  # of the scheduler this one replaces
            self._node_rows = node_rows
            self._feed = FeedCursor(cursor)
            with self._own_lock:
                self._own_events = set()
        log.info("scheduler state rebuilt: %d nodes, %d bindings, %d queued", state.n, len(state.bindings), len(queued))
        # The rebuilt state is millions of long-lived objects: keep the collector from walking them
        # on every full collection (a multi-second pause of every thread on a large cluster). The
        # collection first keeps garbage the rebuild made from being kept for good.
        gc.collect()
        gc.freeze()

    def _sound_tenants(self) -> list[Tenant]:
        """The stored tenants the scheduler can use; each other one is set aside with the reason."""
        parsed = []
        for row in self.store.list_tenants():
            try:
                parsed.append(tenant_from_row(row))
            except Exception as exc:
                self.set_aside.tenant(row["name"], f"the stored manifest is invalid: {exc}")
        good, refused = sound_tenants(parsed)
        for name, why in refused.items():
            self.set_aside.tenant(name, why)
        for tenant in good:
            self.set_aside.clear("Tenant", tenant.name)
        return good

    def _stored_topologies(self) -> list[Topology]:
        """The stored topologies that parse today; each other one is set aside with the reason (gangs
        that name it wait, as for a topology that does not exist)."""
        good = []
        for row in topology_store.list_topologies(self.store):
            try:
                good.append(topology_from_row(row))
            except ValidationError as exc:
                self.set_aside.note("Topology", row["name"], f"the stored manifest is invalid: {exc}")
                continue
            self.set_aside.clear("Topology", row["name"])
        return good

    def reconcile_topologies(self, name: str = "") -> None:
        """Give the scheduler every stored topology again (after any of them changed: they are few)."""
        topologies = self._stored_topologies()
        with self.lock:
            if self.scheduler is not None:
                self.scheduler.set_topologies(topologies)

    def _queue_row(self, scheduler: Scheduler, queued: dict[str, Queued], row: dict[str, Any]) -> None:
        key = f"{row['namespace']}/{row['name']}"
        if key in self._poisoned:
            self.set_aside.workload(key, self._poisoned.pop(key))
            return
        not_before = row.get("not_before")
        if not_before is not None and not_before > now():  # backing off: queued when the time comes
            self.deferred[key] = not_before
            return
        self.deferred.pop(key, None)
        try:
            workload = self._regang(workload_from_row(row), row)
            scheduler.submit([workload])
        except ValidationError as exc:
            self.store.set_phase(key, REJECTED, str(exc))
            return
        except Exception as exc:
            self.set_aside.workload(key, f"cannot be queued: {exc!r}")
            return
        queued[key] = Queued(row["id"], row["version"], workload, row["created"].timestamp())

    def _regang(self, workload: Workload, row: dict[str, Any]) -> Workload:
        """A job slot placed again (its node was lost, it was rejected, its region restarts) waits
        for the job's other slots that wait now, not for the whole job: the rest hold their bindings."""
        gang = workload.gang
        if not row.get("job") or gang is None or gang.min_member <= 1:
            return workload
        waiting = min(gang.min_member, max(1, job_store.waiting_slots(self.store, row["job"], now())))
        if waiting == gang.min_member:
            return workload
        return workload.model_copy(update={"gang": gang.model_copy(update={"min_member": waiting})})

    def _end_deferrals(self) -> None:
        """Queue the deferred workloads whose backoff is over (reloaded: they may have changed)."""
        if not self.deferred:
            return
        stamp = now()
        with self.lock:
            due = [key for key, at in self.deferred.items() if at <= stamp]
            for key in due:
                del self.deferred[key]
        rows = read_workloads(self.store, due) if due else {}  # one read for all of them (feed.py)
        for key in due:
            self._isolated("Workload", key, self._apply_workload, key, rows.get(key))

    def own(self, event_ids: Iterable[int]) -> None:
        """Events this process wrote and already applied: the feed skips them. Safe inside a write
        transaction (it takes only a leaf lock).

        Called after the commit (a submission, a bulk delete), the feed may have read an event
        already: it applied it again, which changes nothing, and will never meet it again, so
        an id it has passed is not kept (else it would stay in the set for good: a leak that grows
        with every flood). The position only grows, and `_follow_feed` matches ids under this
        lock, so an id read meanwhile is either matched there or not added here."""
        feed = self._feed
        with self._own_lock:
            position, missing = feed.position, feed.missing
            self._own_events.update(i for i in event_ids if i > position or i in missing)

    def submitted(self, rows: Iterable[tuple[int, Workload]], event_ids: Iterable[int]) -> None:
        """Workloads this process just stored as Pending (id, workload): queue them without a reload.
        (Only a leader owns the events: a follower has no feed to skip them in, and would keep them.)"""
        with self.lock:
            scheduler = self.scheduler
            if scheduler is not None:
                self.own(event_ids)
                self._drop_deleted(scheduler)
                for workload_id, workload in rows:
                    if workload.key in self.queued or workload.key in scheduler.state.bindings:
                        continue
                    scheduler.submit([workload])
                    self.queued[workload.key] = Queued(workload_id, 1, workload)
        self.wake()

    def deleted(self, keys: Collection[str], event_ids: Iterable[int]) -> None:
        """Workloads this process just deleted (a bulk delete): forgotten here at once, without reading
        them back one by one; their Deleted events are not applied again by the feed."""
        with self.lock:
            scheduler = self.scheduler
            if scheduler is not None:
                self.own(event_ids)
                released = False
                for key in keys:
                    self.queued.pop(key, None)
                    self.deferred.pop(key, None)
                    scheduler.movable.pop(key, None)
                    if key in scheduler.state.bindings:
                        scheduler.state.forget(key)
                        released = True
                self._deleted.update(keys)
                self._drop_deleted(scheduler)
                if released:
                    scheduler.queue.cluster_changed()
        self.wake()

    def compact(self) -> None:
        """Rebuild `queued` at its present size: a dict keeps the table it grew to as entries leave,
        so after a flood is deleted it would keep room for every deleted workload (4 MB a 100,000)."""
        with self.lock:
            self.queued = dict(self.queued)

    def _drop_deleted(self, scheduler: Scheduler) -> None:
        """Drop the deleted workloads from the scheduler's queue (called with the loop's lock held)."""
        if self._deleted:
            scheduler.queue.forget(self._deleted)
            self._deleted.clear()

    def changed(self, kind: str, obj: str) -> None:
        """This process just changed `obj` in the store: apply it now, so the next request sees it
        (the feed applies it again later, which changes nothing)."""
        reconcile = {"Node": self.reconcile_node, "Workload": self.reconcile_workload, "Tenant": self.reconcile_tenant,
                     "Topology": self.reconcile_topologies}  # fmt: skip
        if self.scheduler is not None:
            self._isolated(kind, obj, reconcile[kind], obj)
        self.wake()

    # Change feed -----------------------------------------------------------------------------------
    def _follow_feed(self) -> None:
        """Apply what other writers changed: the objects of one poll are read together (feed.py)."""
        events = self._feed.read(self.store, limit=5000)
        if not events:
            return
        with self._own_lock:
            objects = touched(events, self._own_events)
            if not self._own_events:  # drained: a fresh set, not the table a flood's events grew
                self._own_events = set()
        changes = read_changes(self.store, objects)
        capacity_changed = False
        for name, row in changes.nodes.items():
            capacity_changed |= bool(self._isolated("Node", name, self._apply_node, name, row))
        if capacity_changed:
            with self.lock:
                if self.scheduler is not None:
                    self.scheduler.queue.cluster_changed()
        for key, row in changes.workloads.items():
            self._isolated("Workload", key, self._apply_workload, key, row)
        for name, row in changes.tenants.items():
            self._isolated("Tenant", name, self._apply_tenant, name, row)
        if "Topology" in objects:  # all of them read again: a cluster has a handful
            self.reconcile_topologies()

    def _isolated(self, kind: str, obj: str, apply: Callable[..., Any], *args: Any) -> Any:
        """`apply(*args)`: one object's change; if that raises, set the object aside and go on with the others."""
        try:
            return apply(*args)
        except SQLAlchemyError:
            raise  # the store, not the object: the loop's own handling
        except Exception as exc:
            why = str(exc) if isinstance(exc, Unusable) else f"the scheduler cannot apply it: {exc!r}"
            if kind == "Workload":
                with self.lock:
                    self.queued.pop(obj, None)
                self.set_aside.workload(obj, why)
            elif kind == "Node":
                self.set_aside.node(obj, why)
            else:
                self.set_aside.note(kind, obj, why)
            return None

    def reconcile_node(self, name: str) -> None:
        if self._apply_node(name, self.store.find_node(name)):
            with self.lock:
                if self.scheduler is not None:
                    self.scheduler.queue.cluster_changed()

    def _apply_node(self, name: str, row: dict[str, Any] | None) -> bool:
        """Bring node `name` in line with its store row (None: deleted); True when it may have room now."""
        with self.lock:
            scheduler = self.scheduler
            if scheduler is None:
                return False
            state = scheduler.state
            if row is None:
                self._node_rows.pop(name, None)
                if name in state.index:
                    for binding in state.remove_node(name, force=True):  # the store requeued them
                        self.queued.pop(binding.workload, None)
                return False
            seen = (row["created"], row["version"])
            if name in state.index and self._node_rows.get(name) == seen:
                return False  # applied already (by the API handler that made the change, or an earlier poll)
            try:
                node = node_from_row(row)
                if name in state.index:
                    for binding, why in state.update_node_releasing(node):
                        self._requeue_unfit(binding.workload, name, why)
                else:
                    state.add_node(node)
                devices = (row.get("report") or {}).get("devices")
                if devices:
                    encoded = {kind: {dim: (v["k"], v["count"], v["bits"]) for dim, v in dims.items()}
                               for kind, dims in devices.items()}  # fmt: skip
                    apply_encoded_updates(state, {name: encoded})
                mig = (row.get("report") or {}).get("mig")
                if mig:
                    apply_mig_report(state, name, mig.get("instances") or {})
            except (ValidationError, StateError, EncodedUpdateError) as exc:
                log.warning("node %s: change not applied: %s", name, exc)
                self.own(self.store.note([Event("Node", name, "UpdateRefused", str(exc))]))
                if name not in state.index:  # nothing of it is in the state: left out until it loads
                    raise Unusable(f"cannot be loaded: {exc}") from None
                return False
            self._node_rows[name] = seen
        self.set_aside.clear("Node", name)
        return True

    def _requeue_unfit(self, key: str, node: str, why: str) -> None:
        """A binding the changed node no longer holds (forgotten by the state already): requeue it,
        so its agent stops the process and the scheduler places it again where it fits."""
        reason = f"node {node} changed and no longer holds its binding: {why}"
        log.warning("%s: %s", key, reason)
        self.queued.pop(key, None)
        with contextlib.suppress(NotFound):  # released or deleted meanwhile by another writer
            self.store.release(key, PENDING, reason)

    def reconcile_workload(self, key: str) -> None:
        self._apply_workload(key, self.store.find_workload(*key.split("/", 1)))

    def _apply_workload(self, key: str, row: dict[str, Any] | None) -> None:
        """Bring workload `key` in line with its store row (None: deleted)."""
        with self.lock:
            scheduler = self.scheduler
            if scheduler is None:
                return
            state = scheduler.state
            bound_here = key in state.bindings
            if row is None or row["phase"] not in HOLDING:
                if bound_here:  # released, requeued or deleted by another writer
                    scheduler.release(key)
                if row is None or row["phase"] != PENDING:
                    self.queued.pop(key, None)
                    self.deferred.pop(key, None)
                    if scheduler.queue.holds(key):  # gone (or finished) while queued: out of the queue too
                        self._deleted.add(key)
                    return
                entry = self.queued.get(key)
                if entry is not None and entry.id == row["id"]:
                    entry.version = row["version"]
                    return
                self._drop_deleted(scheduler)
                if scheduler.queue.holds(key):  # a stale entry of an earlier submission: bound later and dropped
                    self.queued.pop(key, None)
                    return
                self._queue_row(scheduler, self.queued, row)
                return
            self.queued.pop(key, None)
            binding_row = row.get("binding")
            if not bound_here and binding_row is not None:
                binding = binding_from_row(binding_row)
                try:
                    state.assume(binding)
                    state.commit(binding.workload)
                except StateError as exc:
                    log.error("binding %s from the store does not fit: %s", key, exc)
                    return
                remember_movable(scheduler, row)

    def reconcile_tenant(self, name: str) -> None:
        try:
            row: dict[str, Any] | None = self.store.get_tenant(name)
        except NotFound:
            row = None
        self._apply_tenant(name, row)

    def _apply_tenant(self, name: str, row: dict[str, Any] | None) -> None:
        if row is None:
            self.set_aside.clear("Tenant", name)
            return
        try:
            tenant = tenant_from_row(row)
        except ValidationError as exc:
            raise Unusable(f"the stored manifest is invalid: {exc}") from None
        with self.lock:
            if self.scheduler is None:
                return
            try:
                self.scheduler.queue.set_tenant(tenant)  # refuses a parent it does not know, or a cycle
            except ValidationError as exc:
                raise Unusable(f"the scheduler cannot use it: {exc}") from None
        self.set_aside.clear("Tenant", name)

    # Deciding --------------------------------------------------------------------------------------
    def _schedule_batch(self) -> bool:
        """Decide up to one batch and make it durable; True when the queue may hold more right now."""
        started = time.perf_counter()
        with self.lock:
            scheduler = self.scheduler
            if scheduler is None:
                return False
            self._drop_deleted(scheduler)
            if not self.queued:
                return False
            decide_started = time.thread_time()
            try:
                results = scheduler.run(self.config.batch_size, report_waiting=False, flush_backoff=False)
            except Exception as exc:
                self._poison_in_flight(scheduler, exc)
                raise
            self.metrics.decide_seconds.observe(time.thread_time() - decide_started)
            # Units left in the lines (a full batch was decided, placed or not): decide on at once. A
            # batch of units that fit nowhere places nothing, and waiting `idle_wait_s` after each
            # such batch held a flood's later work behind it for minutes.
            more = scheduler.queue.has_ready()
            decisions, rejected, stale = [], [], []
            for result in results:
                if isinstance(result, InvalidRequest):
                    rejected.append(result)
                    continue
                if isinstance(result, FitError):
                    continue
                entry = self.queued.get(result.workload)
                if entry is None:  # deleted while queued
                    stale.append(result)
                    continue
                decisions.append((entry, result))
            preemptions = {p.preemptor: p for p in scheduler.take_preemptions()}
            plans = {p.workload: p for p in scheduler.take_defragmentations()}
            for binding in reversed(stale):
                self._undo(scheduler, binding, preemptions, plans)
        if not decisions and not rejected:
            return more
        self._write(decisions, preemptions, plans)
        for result in rejected:
            with self.lock:
                self.queued.pop(result.workload, None)
            self.store.set_phase(result.workload, REJECTED, result.message)
            self.metrics.decisions.labels("rejected").inc()
        self.metrics.cycle_latency.observe(time.perf_counter() - started)
        return more or len(results) >= self.config.batch_size

    def _write(
        self, decisions: list[tuple[Queued, Binding]], preemptions: dict[str, Preemption],
        plans: dict[str, DefragPlan] | None = None,
    ) -> None:  # fmt: skip
        """Make a batch durable (with the evictions its preemptions need and the moves its
        defragmentation plans need), then commit it in memory."""
        plans = plans or {}
        payload = [
            (entry.id, entry.version, b.workload, b.node, b.model_dump(mode="json", by_alias=True))
            for entry, b in decisions
        ]
        evictions = {
            entry.id: [(v.workload, p.reasons.get(v.workload, "")) for v in p.victims]
            for entry, b in decisions
            if (p := preemptions.get(b.workload)) is not None
        }
        moves = {entry.id: PlanWrite(p) for entry, b in decisions if (p := plans.get(b.workload)) is not None}
        write_started = time.thread_time()
        try:
            conflicts, event_ids = self.store.bind(payload, fence=self.lease.fence, evictions=evictions, moves=moves)
        except BaseException:
            self._unwrite(decisions, preemptions, plans)
            raise
        self.metrics.bind_write_seconds.observe(time.thread_time() - write_started)
        conflicted = set(conflicts)
        self.own(event_ids)
        bound, victims, dropped = self._commit_written(decisions, preemptions, conflicted, plans)
        self.metrics.decisions.labels("bound").inc(bound)
        if victims:
            self.metrics.decisions.labels("preempted").inc(len(victims))
        moved = [m.workload for entry, b in decisions if entry.id not in conflicted and b.workload in plans
                 for m in plans[b.workload].moves]  # fmt: skip
        if moved:
            self.metrics.moves.inc(len(moved))
        for key in victims:  # requeued by the same transaction: queue them again here
            self.reconcile_workload(key)
        for binding in dropped:  # written, but the state let it go meanwhile: the store follows the state
            with contextlib.suppress(NotFound):
                self.store.release(binding.workload, PENDING, f"node {binding.node} changed while it was being bound")
            self.reconcile_workload(binding.workload)
        if conflicted:
            self.metrics.write_conflicts.inc(len(conflicted))
            for entry, binding in decisions:
                if entry.id in conflicted:
                    with self.lock:
                        self.queued.pop(binding.workload, None)
                    self.reconcile_workload(binding.workload)
                    plan = plans.get(binding.workload)
                    for mover in plan.mover_keys if plan is not None else ():  # back on its source:
                        self.reconcile_workload(mover)  # unless the store let it go meanwhile

    def _unwrite(
        self, decisions: list[tuple[Queued, Binding]], preemptions: dict[str, Preemption],
        plans: dict[str, DefragPlan],
    ) -> None:  # fmt: skip
        """Nothing of a batch was written: undo its decisions (the last first: a later plan may have
        moved what an earlier one had placed) and queue its workloads again."""
        with self.lock:
            if self.scheduler is not None:
                for entry, binding in reversed(decisions):
                    self._undo(self.scheduler, binding, preemptions, plans)
                    self.scheduler.submit([entry.workload])

    def _commit_written(
        self, decisions: list[tuple[Queued, Binding]], preemptions: dict[str, Preemption], conflicted: set[int],
        plans: dict[str, DefragPlan],
    ) -> tuple[int, list[str], list[Binding]]:  # fmt: skip
        """Commit in memory what the store now holds: how many were bound, the victims their
        preemptions evicted, and the bindings the state let go of while they were written. A
        conflicted plan is undone whole (the store wrote none of its moves), the last first."""
        stamp = time.time()
        bound, victims, dropped = 0, [], []
        with self.lock:
            scheduler = self.scheduler
            if scheduler is not None:
                for entry, binding in reversed(decisions):
                    if entry.id in conflicted:
                        self._undo(scheduler, binding, preemptions, plans)
            for entry, binding in decisions:
                key = binding.workload
                if entry.id in conflicted:
                    continue
                if scheduler is not None and key in plans:
                    scheduler.confirm_defragmentation(plans[key])  # the movers on their targets, durable
                if scheduler is not None and key not in scheduler.state.bindings:
                    dropped.append(binding)  # forgotten while written: its node changed, or it was deleted
                    self.queued.pop(key, None)
                    continue
                if scheduler is not None:
                    if key in preemptions:
                        scheduler.confirm_preemption(key)
                        victims += preemptions[key].victim_keys
                    else:
                        scheduler.state.commit(key)
                self.queued.pop(key, None)
                bound += 1
                self.metrics.bind_latency.observe(max(0.0, stamp - entry.submitted))
        return bound, victims, dropped

    def _poison_in_flight(self, scheduler: Scheduler, exc: Exception) -> None:
        """The scheduler raised while deciding: the unit it was deciding is the one it popped and
        neither placed nor parked (still held, yet waiting nowhere). The rebuild that follows this
        error sets it aside instead of queueing it again (`_queue_row`), so it is met once."""
        waiting = {w.key for unit, _ in scheduler.queue.waiting() for w in unit.workloads}
        in_flight = [k for k in self.queued if scheduler.queue.holds(k) and k not in waiting]
        if not in_flight:
            log.error("the scheduler raised and no workload was being decided: %r", exc)
        for key in in_flight:
            self._poisoned[key] = f"the scheduler raised on it: {exc!r}"

    @staticmethod
    def _undo(
        scheduler: Scheduler, binding: Binding, preemptions: dict[str, Preemption],
        plans: dict[str, DefragPlan] | None = None,
    ) -> None:  # fmt: skip
        """Forget an assumed binding; a preemptor's victims are re-admitted exactly as they were,
        and a defragmentation's movers put back on their sources."""
        preemption = preemptions.get(binding.workload)
        plan = (plans or {}).get(binding.workload)
        if preemption is not None:
            scheduler.undo_preemption(preemption)
        elif plan is not None:
            scheduler.undo_defragmentation(plan)
        else:
            scheduler.state.forget(binding.workload)

    # Heartbeats ------------------------------------------------------------------------------------
    def _upkeep(self) -> None:
        """Once a second: maintenance hooks, agents' heartbeats, why queued work waits."""
        if time.monotonic() - self._last_upkeep < 1.0:
            return
        self._last_upkeep = time.monotonic()
        restarts = lambda: lifecycle.start_due_restarts(self.store)  # noqa: E731
        prune = lambda: self.pruner.check(self._feed.position)  # noqa: E731
        for task in [*self.maintenance, restarts, self.heartbeats.check, prune]:
            try:
                task()
            except SQLAlchemyError:
                raise
            except Exception:  # one chore's failure (an offer, a node, a job) must not stop the cycle
                log.exception("upkeep task %s failed", getattr(task, "__qualname__", task))
        with self.lock:
            changed = self.waiting.changes(self.scheduler.queue, self.queued) if self.scheduler is not None else {}
        if changed:
            self.own(self.store.explain_waiting(changed))

    # Views for the API -----------------------------------------------------------------------------
    def reasons(self, keys: Iterable[str], *, wait: bool = True) -> dict[str, str]:
        """Why each of these Pending workloads waits now, from where it is in the scheduler's queue
        (O(priorities) each: sched/queue.py `reason`); keys the queue does not hold are left out (a
        follower holds none). `wait=False` gives none rather than wait for a decision in progress
        (a submission's answer: it must not queue behind the decisions it has just woken)."""
        if not self.lock.acquire(blocking=wait):
            return {}
        try:
            scheduler = self.scheduler
            if scheduler is None:
                return {}
            queue = scheduler.queue
            return {key: reason for key in keys if (reason := queue.reason(key)) is not None}
        finally:
            self.lock.release()

    def figures(self) -> dict[str, Any] | None:
        """Queue depth, allocation per resource and per-device usage (None when not the leader)."""
        with self.lock:
            if self.scheduler is None:
                return None
            return cluster_figures(self.scheduler.state, len(self.queued))


def remember_movable(scheduler: Scheduler, row: dict[str, Any]) -> None:
    """Tell the scheduler about a restored bound workload that allows moves (`spec.migration`);
    only such a manifest is parsed (a rebuild reads every binding)."""
    manifest = row.get("spec")
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    if not isinstance(spec, dict) or not spec.get("migration"):
        return
    namespace, _, name = str(row.get("workload") or f"{row.get('namespace')}/{row.get('name')}").partition("/")
    try:
        scheduler.remember_movable(workload_from_row({**row, "namespace": namespace, "name": name}))
    except (ValidationError, ValueError) as exc:  # it is not moved: the state keeps its binding
        log.warning("workload %s/%s: its migration setting is not read: %s", namespace, name, exc)
