"""What happens after a workload's process ends, or its node agent refuses it: restarts, backoff, region failover.

* A workload's process **exits**. Succeeded releases its binding. Failed releases it too under
  ``restartPolicy: Never`` (the default); under ``OnFailure`` the binding is kept and, after a
  backoff, the process is started again in place, up to ``backoffLimit`` restarts (then Failed).
* A **job slot fails**: the slots of its failover region (`finesched.dataflow.failover`) restart
  after a backoff (Flink's region failover); the job's other regions keep running. Slots of the
  region that still hold their binding restart in place; those that had already ended are placed
  again. Each region restart counts against the job's ``backoffLimit``; the next failure after the
  limit, or any failure under ``restartPolicy: Never``, fails the job: every slot is stopped.
  A slot lost with its node (requeued after the grace period) counts as a failure of its region.
* A node agent **rejects** a binding: the workload is requeued and not placed again before a
  backoff, so a node that refuses it is not asked every second.

Restarting in place, in the store: the workload keeps its binding, is Bound with ``restart_at`` set;
when that time comes (`start_due_restarts`, on the leader, once a second) the binding is marked
unacknowledged, and the node agent, which runs an acked binding as it is, stops what it ran for it
and starts it afresh. Every decision is one transaction; nothing is remembered in memory, so a
killed server carries on where it stopped.

Two times, never one for both: ``not_before`` only delays placing a Pending workload (after a
rejection, or a region restart of a slot that had ended), ``restart_at`` marks a restart after a
failure. A workload rejected, then placed again, is never taken for one to restart (no
"Restarting" event for a workload that never ran, whatever its restart policy).

Backoff (`Backoff`): ``initial × 2^(n-1)`` seconds for the n-th attempt, at most ``maximum``.

These are functions the scheduling loop (and the agents' routes) call with what they need: the
store, the backoff and the loop's `changed` (`Loop`, which `SchedulerLoop` is). This module
does not import the loop: the loop imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, select, update

from finesched.model.workload import DEFAULT_BACKOFF_LIMIT
from finesched.server.store import job_store
from finesched.server.store import schema as t
from finesched.server.store.store import BOUND, FAILED, HOLDING, PENDING, SUCCEEDED, Event, Store, as_dict, now

log = logging.getLogger("finesched.lifecycle")


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    maximum_s: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (1 = the first retry)."""
        return min(self.maximum_s, self.initial_s * 2 ** min(max(attempt, 1) - 1, 30))


class _Config(Protocol):
    @property
    def backoff(self) -> Backoff: ...


class Loop(Protocol):
    """What these functions need of the scheduling loop (`SchedulerLoop` is one): its store, its
    backoff (``config.backoff``) and `changed`, which hands it the keys whose binding went away."""

    @property
    def store(self) -> Store: ...

    @property
    def config(self) -> _Config: ...

    def changed(self, kind: str, obj: str) -> None: ...


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 10 else f"{value:.0f}s"


def _workload_row(conn: Connection, key: str) -> dict[str, Any] | None:
    namespace, _, name = key.partition("/")
    query = select(t.workloads).where(t.workloads.c.namespace == namespace, t.workloads.c.name == name)
    return as_dict(conn.execute(query.with_for_update()).first())


def _bound(conn: Connection, workload_id: int) -> bool:
    return (
        conn.execute(select(t.bindings.c.workload_id).where(t.bindings.c.workload_id == workload_id)).first()
        is not None
    )


def _set(conn: Connection, workload_id: int, **values: Any) -> None:
    conn.execute(
        update(t.workloads)
        .where(t.workloads.c.id == workload_id)
        .values(**values, version=t.workloads.c.version + 1, updated=now())
    )


# Process ends ------------------------------------------------------------------------------------
def exited(loop: Loop, key: str, phase: str, reason: str, info: Mapping[str, Any]) -> str:
    """The node agent says `key`'s process ended (Succeeded or Failed); what became of it: its phase,
    or "Restarting". Keys whose binding went away are handed to the loop."""
    released: list[str] = []
    with loop.store.write() as conn:
        row = _workload_row(conn, key)
        if row is None or not _bound(conn, row["id"]):
            return row["phase"] if row is not None else "gone"
        if row["job"]:
            outcome = _slot_exited(loop, conn, row, phase, reason, info, released)
        else:
            outcome = _workload_exited(loop, conn, row, phase, reason, info, released)
    for released_key in released:
        loop.changed("Workload", released_key)
    return outcome


def _workload_exited(
    loop: Loop, conn: Connection, row: dict[str, Any], phase: str, reason: str, info: Mapping[str, Any],
    released: list[str],
) -> str:  # fmt: skip
    key = f"{row['namespace']}/{row['name']}"
    spec = (row["spec"] or {}).get("spec") or {}
    policy = spec.get("restartPolicy", "Never")
    limit = int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
    if phase == FAILED and policy == "OnFailure":
        if row["restarts"] < limit:
            attempt = row["restarts"] + 1
            delay = loop.config.backoff.delay(attempt)
            why = f"back-off {_seconds(delay)} restarting failed process (restart {attempt} of {limit}): {reason}"
            _set(conn, row["id"], phase=BOUND, reason=why, info=dict(info), restarts=attempt,
                 restart_at=now() + timedelta(seconds=delay))  # fmt: skip
            Store.log(conn, [Event("Workload", key, "BackOff", f"back-off restarting failed process: {reason}")])
            return "Restarting"
        reason = f"{reason} (backoff limit {limit} reached)"
    Store.release_in(conn, key, phase, reason, info)
    released.append(key)
    return phase


def _slot_exited(
    loop: Loop, conn: Connection, row: dict[str, Any], phase: str, reason: str, info: Mapping[str, Any],
    released: list[str],
) -> str:  # fmt: skip
    key = f"{row['namespace']}/{row['name']}"
    job = job_store.job_for_update(conn, row["job"])
    if job is None or job["phase"] != job_store.ACTIVE:
        Store.release_in(conn, key, phase, reason, info)
        released.append(key)
        return phase
    if row["restart_at"] is not None:  # its region restarts anyway: keep the slot for that
        _set(conn, row["id"], info=dict(info))
        return "Restarting"
    if phase == SUCCEEDED:
        Store.release_in(conn, key, phase, reason, info)
        released.append(key)
        slots = job_store.slots_of(conn, row["job"])
        if all(s["phase"] == SUCCEEDED for s in slots):
            job_store.set_job(conn, job["id"], phase=job_store.SUCCEEDED, reason=f"all {len(slots)} slots succeeded")
            Store.log(conn, [Event("Job", row["job"], job_store.SUCCEEDED, f"all {len(slots)} slots succeeded")])
        return phase
    _set(conn, row["id"], info=dict(info))
    return fail_slot(loop, conn, job, row, f"slot {key} failed: {reason}", released)


def fail_slot(
    loop: Loop, conn: Connection, job: dict[str, Any], slot: dict[str, Any], why: str, released: list[str]
) -> str:
    """Slot `slot` of `job` failed (its binding may be gone): restart its failover region after a
    backoff, or fail the job when its policy or limit says so. "Restarting" or "Failed"."""
    spec = (job["spec"] or {}).get("spec") or {}
    policy = spec.get("restartPolicy", "OnFailure")
    limit = int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
    regions: list[dict[str, Any]] = [dict(r) for r in job["regions"]]
    index = _region_of(job, slot["name"])
    if policy == "Never" or job["failures"] >= limit or index is None:
        rule = "restartPolicy Never" if policy == "Never" else f"backoff limit {limit} reached"
        _fail_job(conn, job, f"{why} ({rule})", released)
        return FAILED
    failures = job["failures"] + 1
    regions[index]["restarts"] = int(regions[index].get("restarts", 0)) + 1
    delay = loop.config.backoff.delay(failures)
    members = set(regions[index]["slots"])
    reason = f"back-off {_seconds(delay)}, then region {index} restarts (restart {failures} of {limit}): {why}"
    at = now() + timedelta(seconds=delay)
    job_key = f"{job['namespace']}/{job['name']}"
    for other in job_store.slots_of(conn, job_key):
        if other["name"] not in members:
            continue
        other_key = f"{other['namespace']}/{other['name']}"
        if other["bound"]:
            _set(conn, other["id"], phase=BOUND, reason=reason, restart_at=at)
        elif other["phase"] != PENDING:  # it had ended: it is placed again, not before its restart
            _set(conn, other["id"], phase=PENDING, node=None, reason=reason, not_before=at, restart_at=at)
            released.append(other_key)
    job_store.set_job(conn, job["id"], failures=failures, regions=regions)
    Store.log(conn, [Event("Job", job_key, "RegionRestart", reason)])
    log.info("job %s: %s", job_key, reason)
    return "Restarting"


def _region_of(job: Mapping[str, Any], slot_name: str) -> int | None:
    """The failover region of the job that holds slot `slot_name`."""
    return next((k for k, region in enumerate(job["regions"]) if slot_name in region["slots"]), None)


def _fail_job(conn: Connection, job: dict[str, Any], reason: str, released: list[str]) -> None:
    """The job failed: every slot stops (bindings released) and is Failed."""
    job_key = f"{job['namespace']}/{job['name']}"
    job_store.set_job(conn, job["id"], phase=job_store.FAILED, reason=reason)
    for slot in job_store.slots_of(conn, job_key):
        key = f"{slot['namespace']}/{slot['name']}"
        if slot["bound"]:
            Store.release_in(conn, key, FAILED, f"job failed: {reason}", not_before=None, restart_at=None)
        elif slot["phase"] == PENDING:
            _set(conn, slot["id"], phase=FAILED, reason=f"job failed: {reason}", not_before=None, restart_at=None)
        else:
            continue
        released.append(key)
    Store.log(conn, [Event("Job", job_key, "Failed", reason)])
    log.warning("job %s failed: %s", job_key, reason)


def slots_lost(loop: Loop, keys: list[str], why: str) -> None:
    """Workloads requeued because their node was lost: a job slot among them fails its region
    (once, however many of its slots the node held)."""
    released: list[str] = []
    failed: set[tuple[str, int]] = set()  # (job, region) already failed here
    with loop.store.write() as conn:
        for key in keys:
            row = _workload_row(conn, key)
            if row is None or not row["job"] or row["phase"] != PENDING:
                continue
            job = job_store.job_for_update(conn, row["job"])
            region = _region_of(job, row["name"]) if job is not None else None
            if job is None or job["phase"] != job_store.ACTIVE or region is None or (row["job"], region) in failed:
                continue
            failed.add((row["job"], region))
            fail_slot(loop, conn, job, row, f"slot {key} lost: {why}", released)
    for key in released:
        loop.changed("Workload", key)


# Rejections --------------------------------------------------------------------------------------
def rejected(loop: Loop, key: str, reason: str) -> None:
    """A node agent cannot run `key`'s binding: requeue it, placed again only after a backoff that
    doubles with every rejection in a row (reset once it runs)."""
    with loop.store.write() as conn:
        row = _workload_row(conn, key)
        attempt = (row["rejections"] if row is not None else 0) + 1
        delay = loop.config.backoff.delay(attempt)
        why = f"rejected by the node agent ({attempt} in a row; placed again in {_seconds(delay)}): {reason}"
        Store.release_in(conn, key, PENDING, why, message=f"rejected by the node agent: {reason}",
                         rejections=attempt, not_before=now() + timedelta(seconds=delay))  # fmt: skip
    loop.changed("Workload", key)


def running(store: Store, row: Mapping[str, Any]) -> None:
    """The workload runs: rejections no longer count toward its backoff."""
    if row.get("rejections"):
        with store.write() as conn:
            conn.execute(update(t.workloads).where(t.workloads.c.id == row["id"]).values(rejections=0))


# Restarts in place -------------------------------------------------------------------------------
def start_due_restarts(store: Store) -> list[str]:
    """Restarts whose backoff is over: their bindings become unacknowledged, so their node agents
    start them afresh (module docstring). The keys restarted."""
    stamp = now()
    query = (
        select(t.workloads.c.id, t.workloads.c.namespace, t.workloads.c.name)
        .join(t.bindings, t.bindings.c.workload_id == t.workloads.c.id)
        .where(t.workloads.c.restart_at.is_not(None), t.workloads.c.restart_at <= stamp,
               t.workloads.c.phase.in_(HOLDING))
    )  # fmt: skip
    with store.read() as conn:  # most seconds nothing is due: no write lock for that
        if conn.execute(query.limit(1)).first() is None:
            return []
    with store.write() as conn:
        due = list(conn.execute(query))
        if not due:
            return []
        ids = [r.id for r in due]
        conn.execute(update(t.bindings).where(t.bindings.c.workload_id.in_(ids))
                     .values(acked=False, version=t.bindings.c.version + 1))  # fmt: skip
        conn.execute(
            update(t.workloads)
            .where(t.workloads.c.id.in_(ids))
            .values(restart_at=None, reason="restarting", version=t.workloads.c.version + 1, updated=stamp)
        )
        keys = [f"{r.namespace}/{r.name}" for r in due]
        Store.log(conn, [Event("Workload", key, "Restarting", "the node agent starts it again") for key in keys])
    return keys
