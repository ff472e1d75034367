"""Per-tenant object quotas: how many workloads, jobs and Pending workloads a tenant may hold
(`Tenant.spec.limits`, Kubernetes' ResourceQuota ``count/*``).

A write that would take its tenant over a limit is refused whole (HTTP 403, Kubernetes' message:
``exceeded quota: tenant team-a, requested: workloads=5, used: workloads=98, limited:
workloads=100``) and stores nothing. What is counted:

* `workloads`: every workload row of the tenant, whatever its phase; a Job's slots are workloads
  and count here too (they are what the scheduler holds), as Kubernetes counts a Job's pods;
* `pending`: the tenant's workloads in phase Pending;
* `jobs`: the tenant's Job rows.

The check runs inside the write transaction that inserts, after the tenant's row is locked (`SELECT
... FOR UPDATE` on PostgreSQL; SQLite's writer is exclusive anyway): two concurrent submissions of
one tenant are counted one after the other, so they cannot both pass a limit that only one fits in.
On PostgreSQL (READ COMMITTED) the count that follows the lock is a new snapshot and sees what the
transaction that held the lock committed. Like a ResourceQuota, a limit is checked when objects are
created: a workload requeued to Pending later (its node lost) is not refused, and lowering a limit
under the current count removes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from sqlalchemy import Connection, func, select

from finesched.model.tenant import ObjectLimits
from finesched.server.store import schema as t
from finesched.server.store.store import PENDING


class QuotaExceeded(Exception):
    """The write would take a tenant over one of its object limits (HTTP 403)."""


@dataclass(frozen=True)
class Charge:
    """What a write adds to its tenant's counts."""

    workloads: int = 0
    pending: int = 0
    jobs: int = 0


def limits_of(spec: Any) -> ObjectLimits | None:
    """The object limits of a stored Tenant manifest (None: none, or a manifest they cannot be read from)."""
    inner = spec.get("spec") if isinstance(spec, Mapping) else None
    raw = inner.get("limits") if isinstance(inner, Mapping) else None
    if raw is None:
        return None
    try:
        return ObjectLimits.model_validate(raw)
    except pydantic.ValidationError:
        return None


def charge_all(conn: Connection, adding: Mapping[str, Charge]) -> None:
    """`charge` each tenant, in name order (so two writers lock tenant rows in the same order). The
    tenants' manifests are read in one query first: those without limits (the common case) are
    passed without a query (nor a lock) each."""
    names = sorted(adding)
    if len(names) > 1:
        query = select(t.tenants.c.name, t.tenants.c.spec).where(t.tenants.c.name.in_(names))
        specs = {name: spec for name, spec in conn.execute(query)}
        names = [name for name in names if name in specs and limits_of(specs[name]) is not None]
    for tenant in names:
        charge(conn, tenant, adding[tenant])


def charge(conn: Connection, tenant: str, adding: Charge) -> None:
    """Refuse (QuotaExceeded) if `adding` takes `tenant` over a limit; call it in the write
    transaction that inserts, before the insert. Locks the tenant's row until that transaction ends."""
    query = select(t.tenants.c.spec).where(t.tenants.c.name == tenant)
    row = conn.execute(query).first()
    if row is None or limits_of(row.spec) is None:  # the common case: no limits, no lock
        return
    row = conn.execute(query.with_for_update()).first()  # read again under the lock: the limits may have changed
    limits = limits_of(row.spec) if row is not None else None
    if limits is None:
        return
    asked = {"jobs": adding.jobs, "pending": adding.pending, "workloads": adding.workloads}
    limited = {name: getattr(limits, name) for name, n in asked.items() if n and getattr(limits, name) is not None}
    if not limited:
        return
    used = {name: 0 for name in limited}
    if "workloads" in limited or "pending" in limited:
        counts = select(func.count(), func.count().filter(t.workloads.c.phase == PENDING)).where(
            t.workloads.c.tenant == tenant
        )
        total, pending = conn.execute(counts).one()
        used.update({k: int(v) for k, v in (("workloads", total), ("pending", pending)) if k in limited})
    if "jobs" in limited:
        used["jobs"] = int(conn.execute(select(func.count()).where(t.jobs.c.tenant == tenant)).scalar_one())
    over = sorted(name for name, limit in limited.items() if used[name] + asked[name] > limit)
    if over:

        def listed(values: Mapping[str, int]) -> str:
            return ",".join(f"{name}={values[name]}" for name in over)

        raise QuotaExceeded(
            f"exceeded quota: tenant {tenant}, requested: {listed(asked)}, used: {listed(used)}, "
            f"limited: {listed(limited)}"
        )
