"""Reading the event table in order without losing late events (the change feed and the SSE watch),
and reading what the feed says changed, in batches.

Event ids come from a sequence. On PostgreSQL a transaction that took id 7 may commit after one
that took id 8, so a reader that saw 8 and moved on would never see 7. A `FeedCursor` remembers
the ids it skipped over and asks for them again, for `window_s` seconds (longer than any of our
transactions; an id still missing then belonged to a transaction that rolled back).

The scheduling leader learns of changes other writers made (nodes registered through the API or
an agent, workloads submitted through another replica, releases, deletions) from the feed. It
reads the changed objects of one poll together: one query for all the nodes, two for all the
workloads (rows and bindings), one for all the tenants, in slices of `CHUNK` names, never one
query per event. A round trip to PostgreSQL costs far more than one to SQLite, so this is what
keeps a burst arriving through a follower, or right after many nodes registered, as fast there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, select, tuple_

from finesched.server.store import schema as t
from finesched.server.store.store import Store, as_dict, chunks

GAP_WINDOW_S = 30.0

#: Event reasons that change nothing the scheduler holds: the feed does not reload their objects.
INFORMATIONAL = frozenset({"Waiting", "Acknowledged", "ReportRefused", "UpdateRefused"})

Row = dict[str, Any]


class FeedCursor:
    def __init__(self, position: int, window_s: float = GAP_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.position = position  # every id up to here was seen or is remembered as missing
        self.missing: dict[int, float] = {}  # id -> when it was first found missing
        self.window_s = window_s
        self.clock = clock

    def read(self, store: Store, limit: int = 1000) -> list[dict[str, Any]]:
        """New events (and late ones that filled a gap), oldest first."""
        rows = store.events(self.position, also=self.missing, limit=limit)
        stamp = self.clock()
        expected = self.position + 1
        for row in rows:
            event_id = row["id"]
            self.missing.pop(event_id, None)
            if event_id >= expected:
                for skipped in range(expected, event_id):
                    self.missing[skipped] = stamp
                expected = event_id + 1
        self.position = max(self.position, expected - 1)
        self.missing = {i: t for i, t in self.missing.items() if stamp - t < self.window_s}
        return rows


@dataclass
class Changes:
    """The objects a poll of the feed named, as they are now in the store (None: gone), by kind."""

    nodes: dict[str, Row | None] = field(default_factory=dict)
    workloads: dict[str, Row | None] = field(default_factory=dict)
    tenants: dict[str, Row | None] = field(default_factory=dict)


def touched(events: Iterable[dict[str, Any]], applied: set[int]) -> dict[str, list[str]]:
    """Kind -> the objects `events` changed, in first-seen order, leaving out the events already
    `applied` by this process (their ids are removed from the set as they are met) and those that
    change nothing the scheduler holds."""
    out: dict[str, dict[str, None]] = {}
    for event in events:
        if event["id"] in applied:
            applied.discard(event["id"])
            continue
        if event["reason"] in INFORMATIONAL:
            continue
        out.setdefault(event["kind"], {})[event["object"]] = None
    return {kind: list(objects) for kind, objects in out.items()}


def read_changes(store: Store, objects: dict[str, list[str]]) -> Changes:
    """The current rows of every node, workload and tenant in `objects` (other kinds are ignored)."""
    nodes, workloads, tenants = objects.get("Node", []), objects.get("Workload", []), objects.get("Tenant", [])
    found_nodes = read_nodes(store, nodes) if nodes else {}
    found_workloads = read_workloads(store, workloads) if workloads else {}
    found_tenants = read_tenants(store, tenants) if tenants else {}
    return Changes(
        {n: found_nodes.get(n) for n in nodes},
        {k: found_workloads.get(k) for k in workloads},
        {n: found_tenants.get(n) for n in tenants},
    )


def read_nodes(store: Store, names: Collection[str]) -> dict[str, Row]:
    """The rows of the nodes in `names` that exist, by name."""
    return _read_named(store, t.nodes, names)


def read_workloads(store: Store, keys: Collection[str]) -> dict[str, Row]:
    """The rows of the workloads in `keys` (namespace/name) that exist, each with its binding row under
    "binding" (None when unbound), as `Store.find_workload` gives one."""
    out: dict[str, Row] = {}
    key = tuple_(t.workloads.c.namespace, t.workloads.c.name)
    with store.read() as conn:
        for part in chunks(sorted(keys)):
            pairs = [tuple(k.split("/", 1)) for k in part]
            rows: dict[int, Row] = {r.id: as_dict(r) for r in conn.execute(select(t.workloads).where(key.in_(pairs)))}
            if not rows:
                continue
            bound = conn.execute(select(t.bindings).where(t.bindings.c.workload_id.in_(list(rows))))
            bindings = {b.workload_id: as_dict(b) for b in bound}
            for workload_id, row in rows.items():
                row["binding"] = bindings.get(workload_id)
                out[f"{row['namespace']}/{row['name']}"] = row
    return out


def read_tenants(store: Store, names: Collection[str]) -> dict[str, Row]:
    """The rows of the tenants in `names` that exist, by name."""
    return _read_named(store, t.tenants, names)


def _read_named(store: Store, table: Table, names: Collection[str]) -> dict[str, Row]:
    out: dict[str, Row] = {}
    with store.read() as conn:
        for part in chunks(sorted(names)):
            out.update((r.name, as_dict(r)) for r in conn.execute(select(table).where(table.c.name.in_(part))))
    return out
