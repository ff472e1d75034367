"""The `jobs` table: a dataflow Job as submitted, its terminal phase, failures and failover regions.

A job's slots are ordinary workloads whose `job` column names it (``namespace/name``); what the job
is doing is read from them (server/store/job_status.py). The job row keeps what no slot can: the
manifest, how many region restarts it has used (`failures`, against its `backoffLimit`), each
failover region's tasks, slots and restarts, and a terminal phase once the job has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, false, func, insert, or_, select, update

from finesched.server.store import schema as t
from finesched.server.store.store import PENDING, Event, NotFound, Page, Store, as_dict, keyset_page, now

ACTIVE, SUCCEEDED, FAILED = "Active", "Succeeded", "Failed"


def insert_job(
    conn: Connection, namespace: str, name: str, tenant: str, spec: Mapping[str, Any], regions: list[dict]
) -> int:
    """A new Active job row (IntegrityError when the name is taken); its id. `tenant`: the owner of
    the namespace, as admission charged the job's slots."""
    stamp = now()
    values = {"namespace": namespace, "name": name, "tenant": tenant, "spec": dict(spec), "phase": ACTIVE,
              "reason": "", "failures": 0, "regions": regions, "version": 1, "created": stamp,
              "updated": stamp}  # fmt: skip
    return int(conn.execute(insert(t.jobs).returning(t.jobs.c.id), values).scalar_one())


def find_job(store: Store, namespace: str, name: str) -> dict[str, Any] | None:
    with store.read() as conn:
        return as_dict(conn.execute(_job_query(namespace, name)).first())


def job_for_update(conn: Connection, key: str) -> dict[str, Any] | None:
    """The job row, locked until the caller's transaction ends (serialises its failovers)."""
    namespace, _, name = key.partition("/")
    return as_dict(conn.execute(_job_query(namespace, name).with_for_update()).first())


def _job_query(namespace: str, name: str) -> Any:
    return select(t.jobs).where(t.jobs.c.namespace == namespace, t.jobs.c.name == name)


def list_jobs(store: Store, namespace: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
    query = select(t.jobs)
    if namespace:
        query = query.where(t.jobs.c.namespace == namespace)
    if tenant:
        query = query.where(t.jobs.c.tenant == tenant)
    with store.read() as conn:
        return [as_dict(r) for r in conn.execute(query.order_by(t.jobs.c.id))]  # type: ignore[misc]


def job_page(store: Store, after: int | None, limit: int | None, namespaces: Sequence[str] | None = None) -> Page:
    """Jobs by id after `after`, in `namespaces` (None: any), in one query (a page of `GET /v1/jobs`)."""
    conditions = [] if namespaces is None else [t.jobs.c.namespace.in_(sorted(namespaces)) if namespaces else false()]
    with store.read() as conn:
        return keyset_page(conn, select(t.jobs), t.jobs, "id", conditions, after, limit)


def _slot_query() -> Any:
    return select(t.workloads, t.bindings.c.workload_id.label("bound_id"), t.bindings.c.acked.label("acked")).outerjoin(
        t.bindings, t.bindings.c.workload_id == t.workloads.c.id
    )


def slots_of(conn: Connection, key: str) -> list[dict[str, Any]]:
    """The job's slot workloads, each with `bound` (holds a binding) and `acked`."""
    rows = conn.execute(_slot_query().where(t.workloads.c.job == key).order_by(t.workloads.c.id))
    return [_slot(r) for r in rows]


def slots_by_job(store: Store, keys: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Slots of several jobs in one query."""
    out: dict[str, list[dict[str, Any]]] = {key: [] for key in keys}
    if not keys:
        return out
    with store.read() as conn:
        rows = conn.execute(_slot_query().where(t.workloads.c.job.in_(list(keys))).order_by(t.workloads.c.id))
        for row in rows:
            slot = _slot(row)
            out[slot["job"]].append(slot)
    return out


def _slot(row: Any) -> dict[str, Any]:
    slot = as_dict(row)
    assert slot is not None
    slot["bound"] = slot.pop("bound_id") is not None
    slot["acked"] = bool(slot.get("acked"))
    return slot


def waiting_slots(store: Store, key: str, at: datetime) -> int:
    """How many of the job's slots are Pending and not backing off at `at` (placed together)."""
    query = select(func.count()).where(
        t.workloads.c.job == key,
        t.workloads.c.phase == PENDING,
        or_(t.workloads.c.not_before.is_(None), t.workloads.c.not_before <= at),
    )
    with store.read() as conn:
        return int(conn.execute(query).scalar_one())


def set_job(conn: Connection, job_id: int, **values: Any) -> None:
    conn.execute(
        update(t.jobs).where(t.jobs.c.id == job_id).values(**values, version=t.jobs.c.version + 1, updated=now())
    )


def delete_job(store: Store, namespace: str, name: str, tenant: str | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Delete the job and every slot in one transaction (the gang goes at once); the job row and
    the deleted slots. A tenant's call for another tenant's job is NotFound."""
    key = f"{namespace}/{name}"
    with store.write() as conn:
        job = as_dict(conn.execute(_job_query(namespace, name)).first())
        if job is None or (tenant is not None and job["tenant"] != tenant):
            raise NotFound(f"job {key} not found")
        slots = slots_of(conn, key)
        ids = [slot["id"] for slot in slots]
        if ids:
            conn.execute(delete(t.bindings).where(t.bindings.c.workload_id.in_(ids)))
            conn.execute(delete(t.workloads).where(t.workloads.c.id.in_(ids)))
        conn.execute(delete(t.jobs).where(t.jobs.c.id == job["id"]))
        released = sum(1 for slot in slots if slot["bound"])
        events = [Event("Workload", f"{s['namespace']}/{s['name']}", "Deleted", f"job {key} deleted", s["uid"])
                  for s in slots]  # fmt: skip
        events.append(Event("Job", key, "Deleted", f"{len(slots)} slot(s) deleted, {released} released", job["uid"]))
        Store.log(conn, events)
        return job, slots


def events_of(
    store: Store, job_key: str, slot_keys: Sequence[str], limit: int, uids: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The latest `limit` events of the job and its slots, oldest first; with `uids` (the job's and
    its slots'), only those of these objects, not of earlier ones of their names."""
    condition = or_(
        and_(t.events.c.kind == "Job", t.events.c.object == job_key),
        and_(t.events.c.kind == "Workload", t.events.c.object.in_(list(slot_keys))),
    )
    if uids is not None:
        condition = and_(condition, t.events.c.uid.in_(list(uids)))
    query = select(t.events).where(condition).order_by(t.events.c.id.desc()).limit(limit)
    with store.read() as conn:
        rows = [as_dict(r) for r in conn.execute(query)]
    return list(reversed(rows))  # type: ignore[arg-type]
