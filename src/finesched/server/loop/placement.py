"""Placing a group of workloads at once, outside the queue (offer accept, dataflow jobs).

The handler holds the loop's lock, asks the scheduler to place the whole group (`schedule_gang`:
all or none, assumed only), writes workloads and bindings in one transaction fenced by the lease
(`leader_write`), and commits the assumed bindings only after that transaction succeeded; if it
fails they are forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, insert

from finesched.model.binding import Binding
from finesched.model.workload import Workload
from finesched.server.loop.loop import SchedulerLoop
from finesched.server.store import schema as t
from finesched.server.store.store import BOUND, Event, Store, binding_row, now
from finesched.server.store.views import canonical


def insert_bound(
    conn: Connection, workloads: Sequence[Workload], bindings: Sequence[Binding], *, job: str | None, why: str
) -> list[Event]:
    """Insert `workloads` as Bound with their bindings (in the caller's transaction); the events to log."""
    stamp = now()
    by_key = {b.workload: b for b in bindings}
    events = []
    for workload in workloads:
        binding = by_key[workload.key]
        workload_id = conn.execute(
            insert(t.workloads).returning(t.workloads.c.id),
            {"namespace": workload.namespace, "name": workload.name, "tenant": workload.tenant,
             "spec": canonical(workload), "phase": BOUND, "reason": "", "node": binding.node, "job": job,
             "version": 1, "created": stamp, "updated": stamp},
        ).scalar_one()  # fmt: skip
        data = binding.model_dump(mode="json", by_alias=True)
        conn.execute(insert(t.bindings), binding_row(workload_id, workload.key, binding.node, data, stamp))
        events.append(Event("Workload", workload.key, "Bound", f"bound to {binding.node}{why}"))
    return events


def commit_after_write(loop: SchedulerLoop, bindings: Sequence[Binding], write: Callable[[], Any]) -> Any:
    """Run the durable `write`; commit the assumed `bindings` if it succeeded, forget them otherwise."""
    state = loop.scheduler.state if loop.scheduler is not None else None
    try:
        result = write()
    except BaseException:
        if state is not None:
            for binding in bindings:
                state.forget(binding.workload)
        raise
    if state is not None:
        for binding in bindings:
            state.commit(binding.workload)
    return result


@contextmanager
def leader_write(loop: SchedulerLoop) -> Iterator[Connection]:
    """A write transaction fenced by the scheduler lease, like the loop's own binding writes: it
    commits only while this replica still holds the lease, else raises LostLease (503 to a client).
    Opened with the loop's lock held (server/store/locking.py)."""
    with loop.store.write() as conn:
        loop.lease.fence(conn)
        yield conn


def log_own(loop: SchedulerLoop, conn: Connection, events: Sequence[Event]) -> None:
    loop.own(Store.log(conn, events))
