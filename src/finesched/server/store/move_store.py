"""Defragmentation made durable: a plan's moves written in the transaction that binds the waiting workload.

A plan (sched/defrag.py) is all or nothing: the waiting workload is bound only with every move it
needs, and no move is written without that binding. `Store.bind` checks, with the rows locked,
that the waiting workload is still Pending at the version the scheduler read and that every mover
is still bound exactly where the plan found it (`movers_in_place`); then each mover's binding row
is replaced by its target (unacknowledged, its version bumped: the node agent stops the process and
starts it on the target, as for a new placement), its workload row follows (Bound on the target's
node, a "Moved" event with the reason), and the waiting workload gets a "Defragmented" event that
lists the moves. A plan whose check fails writes nothing; the waiting workload is a conflict.

Each tenant sees its own workloads' names only (as for preemption, issue 25): a mover's event does
not name a waiting workload of another tenant, and the waiting workload's event does not name
movers of another tenant ("a workload of another tenant").

A move is not a failure: the mover's restart count, backoff and restart policy are untouched (no
"Restarting" or exit is recorded for it; a restart it was waiting for is superseded by the move).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from finesched.model.binding import Binding
from finesched.sched.defrag import DefragPlan, Move
from finesched.sched.records import ANOTHER_TENANT, plan_reason
from finesched.server.store import schema as t
from finesched.server.store.store import BOUND, HOLDING, Event


@dataclass(frozen=True)
class PlanWrite:
    """A defragmentation plan as `Store.bind` takes it per waiting workload: it checks `in_place`,
    then `write`s (the store cannot import this module: it only knows the protocol)."""

    plan: DefragPlan

    def in_place(self, conn: Connection) -> bool:
        return movers_in_place(conn, self.plan)

    def write(self, conn: Connection, waiting: str, stamp: datetime) -> list[Event]:
        return write_moves(conn, waiting, self.plan, stamp)


def where(binding: Binding) -> str:
    """A binding's node and devices, short: ``n1 gpu 0,1`` (``n1`` without devices)."""
    devices = " ".join(f"{kind} {','.join(str(m) for m in binding.device_minors(kind))}" for kind in binding.devices)
    return f"{binding.node} {devices}".strip()


def summary(move: Move, seen_by: str) -> str:
    """``ns/name: n1 gpu 0 -> n1 gpu 1`` (what the waiting workload's event lists), the name hidden
    from another tenant `seen_by`."""
    who = move.workload if move.tenant == seen_by else ANOTHER_TENANT
    return f"{who}: {where(move.source)} -> {where(move.target)}"


def movers_in_place(conn: Connection, plan: DefragPlan) -> bool:
    """Every mover still bound exactly as the plan found it (rows locked for this transaction)."""
    keys = [m.workload for m in plan.moves]
    query = (
        select(t.bindings.c.workload, t.bindings.c.data, t.workloads.c.phase)
        .join(t.workloads, t.workloads.c.id == t.bindings.c.workload_id)
        .where(t.bindings.c.workload.in_(keys))
        .order_by(t.bindings.c.workload_id)
        .with_for_update()
    )
    found = {key: (data, phase) for key, data, phase in conn.execute(query)}
    for move in plan.moves:
        data, phase = found.get(move.workload, (None, None))
        if data is None or phase not in HOLDING or not _same(data, move.source):
            return False
    return True


def _same(data: Any, binding: Binding) -> bool:
    try:
        return Binding.model_validate(data) == binding
    except ValueError:
        return False


def write_moves(conn: Connection, waiting: str, plan: DefragPlan, stamp: datetime) -> list[Event]:
    """Replace each mover's binding by its target (checked with `movers_in_place` first); the events."""
    tenant = plan.binding.tenant
    events = []
    for move in plan.moves:
        reason = move.reason if move.tenant == tenant else move.reason.replace(waiting, ANOTHER_TENANT)
        target = move.target
        data = target.model_dump(mode="json", by_alias=True)
        workload_id = conn.execute(
            update(t.bindings)
            .where(t.bindings.c.workload == move.workload)
            .values(node=target.node, data=data, acked=False, version=t.bindings.c.version + 1, created=stamp)
            .returning(t.bindings.c.workload_id)
        ).scalar_one()
        conn.execute(
            update(t.workloads)
            .where(t.workloads.c.id == workload_id)
            .values(phase=BOUND, node=target.node, reason=reason, info=None, restart_at=None,
                    version=t.workloads.c.version + 1, updated=stamp)
        )  # fmt: skip
        events.append(Event("Workload", move.workload, "Moved", reason))
    why = plan_reason(plan, lambda _key, mover_tenant: mover_tenant == tenant)
    listed = "; ".join(summary(m, tenant) for m in plan.moves)
    count = f"{len(plan.moves)} move{'s' if len(plan.moves) != 1 else ''}"
    events.append(Event("Workload", waiting, "Defragmented", f"{why} ({count}: {listed})"))
    return events
