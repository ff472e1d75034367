"""The durable store: nodes, workloads, bindings, tenants and events, one transaction per change.

The store is the truth; the scheduler's `ClusterState` is rebuilt from it (S1.6). Each method
is one transaction that also appends the events describing the change (the change feed a
scheduling replica follows, and what `GET /v1/events` shows). Conflicts are explicit:
`Conflict` when a row changed under the writer (version check) or a name is taken, `NotFound`
when the object is gone. Rows come back as plain dicts (no ORM objects leak out).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import pydantic_core
from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    false,
    func,
    insert,
    literal_column,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError

from finesched.server.store import schema as t
from finesched.server.store.correlator import correlator_for
from finesched.server.store.db import Engines, open_engines
from finesched.server.store.locking import writing

PENDING, BOUND, RUNNING, SUCCEEDED, FAILED, REJECTED = "Pending", "Bound", "Running", "Succeeded", "Failed", "Rejected"
PHASES = (PENDING, BOUND, RUNNING, SUCCEEDED, FAILED, REJECTED)
HOLDING = (BOUND, RUNNING)  # phases that hold a binding
TERMINAL = (SUCCEEDED, FAILED, REJECTED)
CHUNK = 1000  # rows per statement when a batch is read or written with IN (...) lists
T = TypeVar("T")


#: One submission of a group commit (`Store.submit_group`): its (namespace, name, tenant, manifest)
#: items and the new objects' uids, one each.
Submission = tuple[Sequence[tuple[str, str, str, Mapping[str, Any]]], Sequence[str]]
#: The check of a group commit: refuses, by raising, the submissions at these indexes taken together.
GroupCheck = Callable[[Connection, Sequence[int]], None]


def _split(
    requests: Sequence[Submission], ids: Sequence[int], events: Sequence[int]
) -> Iterator[tuple[list[int], list[int]]]:
    """The ids and event ids of one write of all `requests`, each request's own (one event a row)."""
    start = 0
    for items, _ in requests:
        end = start + len(items)
        yield list(ids[start:end]), list(events[start:end])
        start = end


class Conflict(Exception):
    """The object changed under the writer, or its name is taken (HTTP 409)."""


class NotFound(Exception):
    """No such object (HTTP 404)."""


def now() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every time in the store is UTC."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


@dataclass(frozen=True)
class Event:
    """One event about an object; `uid` is the object's (filled in by `Store.log` when not given,
    from the object of that kind and name that exists in the writer's transaction)."""

    kind: str
    object: str
    reason: str
    message: str = ""
    uid: str | None = None


#: The tables of the objects events are about, by kind, and how an event names one of them.
UID_TABLES: dict[str, tuple[Table, tuple[str, ...]]] = {
    "Node": (t.nodes, ("name",)),
    "Workload": (t.workloads, ("namespace", "name")),
    "Tenant": (t.tenants, ("name",)),
    "Job": (t.jobs, ("namespace", "name")),
    "PriorityClass": (t.priority_classes, ("name",)),
    "Topology": (t.topologies, ("name",)),
}


def uids_of(conn: Connection, kind: str, names: Collection[str]) -> dict[str, str]:
    """Name (``namespace/name`` or name) -> uid of the objects of `kind` among `names` that exist."""
    table, columns = UID_TABLES[kind]
    found: dict[str, str] = {}
    wanted = sorted(set(names))
    for part in chunks(wanted):
        if len(columns) == 1:
            query = select(table.c.name, table.c.uid).where(table.c.name.in_(part))
            found.update((name, uid) for name, uid in conn.execute(query))
            continue
        pairs = [key.split("/", 1) for key in part if "/" in key]
        query = select(table.c.namespace, table.c.name, table.c.uid).where(
            table.c.namespace.in_({p[0] for p in pairs}), table.c.name.in_({p[1] for p in pairs})
        )
        keys = set(part)
        found.update((f"{ns}/{n}", uid) for ns, n, uid in conn.execute(query) if f"{ns}/{n}" in keys)
    return found


def with_uids(conn: Connection, events: Sequence[Event]) -> list[Event]:
    """`events`, each without a uid given the uid of its object as it exists in `conn` (one query
    per kind; an object that does not exist, or a kind without uids, leaves it None)."""
    missing: dict[str, set[str]] = {}
    for e in events:
        if e.uid is None and e.kind in UID_TABLES:
            missing.setdefault(e.kind, set()).add(e.object)
    if not missing:
        return list(events)
    found = {kind: uids_of(conn, kind, names) for kind, names in missing.items()}
    return [
        Event(e.kind, e.object, e.reason, e.message, found[e.kind].get(e.object)) if e.uid is None and e.kind in found
        else e
        for e in events
    ]  # fmt: skip


def check_uid(kind: str, name: str, stored: str, given: str | None) -> None:
    """Refuse to replace object `name` when the manifest names another object (its `metadata.uid`
    is not the stored one's): it was deleted and created again since the manifest was read. As
    Kubernetes answers such an update: Conflict (409). No uid given: nothing to check."""
    if given is not None and given != stored:
        raise Conflict(
            f"{kind} {name} is another object than the manifest's: its uid is {stored}, the manifest's "
            f"metadata.uid is {given} (deleted and created again since it was read); leave metadata.uid "
            "out to replace whatever object has the name"
        )


def as_dict(row: Row[Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row._mapping)
    for key, value in out.items():
        if isinstance(value, datetime):
            out[key] = aware(value)
    return out


def decode_json(text: str) -> Any:
    """The value of JSON text, as `json.loads` gives it (the JSON columns' own decoder): by
    pydantic-core's parser, about twice as fast on a node's CPU list, or by `json.loads` for what
    that parser refuses (an escaped lone surrogate, which json.loads keeps)."""
    try:
        return pydantic_core.from_json(text)
    except ValueError:
        return json.loads(text)


def binding_row(workload_id: int, key: str, node: str, data: Mapping[str, Any], stamp: datetime) -> dict[str, Any]:
    """A new, unacknowledged `bindings` row."""
    return {"workload_id": workload_id, "workload": key, "node": node, "data": dict(data), "acked": False,
            "version": 1, "created": stamp}  # fmt: skip


def preempted_reason(victim: Mapping[str, Any], preemptor: str, binding: Mapping[str, Any], why: str) -> str:
    """What a preempted workload's event and reason say. The victim's tenant sees them, so another
    tenant's preemptor is not named (issue 25: "preempted by a higher-priority workload"); one of
    its own tenant is. `victim` and `binding` are the two bindings' stored data."""
    node = binding.get("node", "")
    if victim.get("tenant") == binding.get("tenant"):
        return f"preempted by {preemptor} on {node}: {why}"
    higher = int(binding.get("priority") or 0) > int(victim.get("priority") or 0)
    who = "a higher-priority workload" if higher else "a workload of another tenant"
    return f"preempted by {who} on {node}: {why}"


class PlannedMoves(Protocol):
    """A defragmentation plan as `Store.bind` writes it (server/store/move_store.py's PlanWrite)."""

    def in_place(self, conn: Connection) -> bool:
        """Whether every mover is still bound as the plan found it (its rows locked)."""
        ...

    def write(self, conn: Connection, waiting: str, stamp: datetime) -> list[Event]:
        """Replace the movers' bindings by their targets; the events."""
        ...


@dataclass(frozen=True)
class Page:
    """One keyset page of a list: its rows, and how many more rows match after the last one."""

    rows: list[dict[str, Any]]
    remaining: int


@dataclass(frozen=True)
class EventScope:
    """The events a non-admin caller may see: a tenant's (its own Tenant events and the Workload
    events of its namespaces) or an agent's (its node's)."""

    namespaces: tuple[str, ...] = ()
    tenant: str | None = None
    node: str | None = None

    def condition(self) -> ColumnElement[bool]:
        """The scope as SQL (a namespace prefix is a range on the (kind, object) index)."""
        parts: list[ColumnElement[bool]] = [
            and_(t.events.c.kind == "Workload", t.events.c.object >= f"{ns}/", t.events.c.object < f"{ns}0")
            for ns in self.namespaces
        ]  # "0" is the character after "/"
        if self.tenant is not None:
            parts.append(and_(t.events.c.kind == "Tenant", t.events.c.object == self.tenant))
        if self.node is not None:
            parts.append(and_(t.events.c.kind == "Node", t.events.c.object == self.node))
        return or_(*parts) if parts else false()

    def allows(self, row: Mapping[str, Any]) -> bool:
        """The same rule in Python, for events already read (the SSE watch's shared feed)."""
        kind, obj = row["kind"], row["object"]
        if kind == "Workload":
            return obj.split("/", 1)[0] in self.namespaces
        if kind == "Tenant":
            return self.tenant is not None and obj == self.tenant
        return kind == "Node" and self.node is not None and obj == self.node


def keyset_page(
    conn: Connection, query: Select[Any], table: Table, key: str, conditions: Sequence[ColumnElement[bool]],
    after: Any, limit: int | None,
) -> Page:  # fmt: skip
    """At most `limit` rows of `query` (None: all) matching `conditions`, with `key` > `after`, by
    `key`; and how many more match (counted only when there are more)."""
    column = table.c[key]
    where = [*conditions, column > after] if after is not None else list(conditions)
    ordered = query.where(*where).order_by(column)
    if limit is not None:
        ordered = ordered.limit(limit + 1)
    rows: list[dict[str, Any]] = [as_dict(r) for r in conn.execute(ordered)]  # type: ignore[misc]
    if limit is None or len(rows) <= limit:
        return Page(rows, 0)
    rows = rows[:limit]
    more = select(func.count()).select_from(table).where(*conditions, column > rows[-1][key])
    return Page(rows, int(conn.execute(more).scalar_one()))


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    """`items` in slices of at most `size` (keeps every statement under the drivers' parameter limits)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Store:
    """All reads and writes of the control plane's tables."""

    def __init__(self, engines: Engines):
        self.engines = engines

    @classmethod
    def open(cls, url: str) -> Store:
        return cls(open_engines(url))

    def close(self) -> None:
        self.engines.dispose()

    # Transactions ------------------------------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction: committed when the block ends, rolled back if it raises. Inside it
        the loop's lock may not be taken (server/store/locking.py: the loop's lock first, then the writer).
        Writers get their turn in arrival order (db.py `WriterGate`)."""
        with writing(), self.engines.write_turn(), self.engines.writer.begin() as conn:
            yield conn

    def read(self) -> Any:
        return self.engines.reader.connect()

    @staticmethod
    def log(conn: Connection, events: Iterable[Event]) -> list[int]:
        """Append events in the caller's transaction; their ids (the change-feed positions). An
        event identical to a recent one is counted on one row (server/store/correlator.py)."""
        events = list(events)
        if not events:
            return []
        return correlator_for(conn.engine).write(conn, with_uids(conn, events), now())

    # Nodes -----------------------------------------------------------------------------------------
    def put_node(
        self, name: str, spec: Mapping[str, Any], *, create_only: bool, uid: str | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Create the node, or replace its spec (unless `create_only`; Conflict when `uid`, the
        manifest's, is not the stored node's: `check_uid`); (row, created)."""
        with self.write() as conn:
            existing = conn.execute(select(t.nodes).where(t.nodes.c.name == name)).first()
            if existing is not None and create_only:
                raise Conflict(f"node {name} already exists")
            if existing is not None:
                check_uid("Node", name, existing.uid, uid)
            stamp = now()
            if existing is None:
                values = {"name": name, "spec": dict(spec), "cordoned": False, "ready": True,
                          "heartbeat": None, "report": None, "version": 1, "created": stamp,
                          "uid": t.new_uid()}  # fmt: skip
                conn.execute(insert(t.nodes), values)
                self.log(conn, [Event("Node", name, "Registered")])
                return values, True
            conn.execute(
                update(t.nodes).where(t.nodes.c.name == name).values(spec=dict(spec), version=t.nodes.c.version + 1)
            )
            self.log(conn, [Event("Node", name, "Updated")])
            row = as_dict(conn.execute(select(t.nodes).where(t.nodes.c.name == name)).first())
            assert row is not None
            return row, False

    def find_node(self, name: str) -> dict[str, Any] | None:
        with self.read() as conn:
            return as_dict(conn.execute(select(t.nodes).where(t.nodes.c.name == name)).first())

    def get_node(self, name: str) -> dict[str, Any]:
        row = self.find_node(name)
        if row is None:
            raise NotFound(f"node {name} not found")
        return row

    def list_nodes(self) -> list[dict[str, Any]]:
        # The spec is read as its stored text and decoded by `decode_json`: its CPU list made the
        # JSON column's json.loads a sixth of a state rebuild.
        spec = cast(t.nodes.c.spec, Text).label("spec")
        query = select(*(spec if c.name == "spec" else c for c in t.nodes.c)).order_by(t.nodes.c.name)
        with self.read() as conn:
            rows: list[dict[str, Any]] = [as_dict(r) for r in conn.execute(query)]  # type: ignore[misc]
        for row in rows:
            row["spec"] = decode_json(row["spec"])
        return rows

    def node_page(self, after: str | None, limit: int | None) -> Page:
        """Nodes by name after `after` (a page of `GET /v1/nodes`)."""
        with self.read() as conn:
            return keyset_page(conn, select(t.nodes), t.nodes, "name", (), after, limit)

    def node_summary(self, limit: int = 100) -> tuple[int, int, int, list[tuple[str, bool, bool]]]:
        """(nodes, Ready, cordoned, the first `limit` NotReady or cordoned nodes by name as (name,
        ready, cordoned)): counted by the database, for the console's overview."""
        counts = select(func.count(), func.count().filter(t.nodes.c.ready), func.count().filter(t.nodes.c.cordoned))
        flagged = select(t.nodes.c.name, t.nodes.c.ready, t.nodes.c.cordoned).where(
            or_(t.nodes.c.cordoned, t.nodes.c.ready.is_(False))
        )
        with self.read() as conn:
            total, ready, cordoned = conn.execute(counts.select_from(t.nodes)).one()
            rows = conn.execute(flagged.order_by(t.nodes.c.name).limit(limit))
            return int(total), int(ready), int(cordoned), [(n, bool(r), bool(c)) for n, r, c in rows]

    def node_flags(self) -> list[tuple[str, bool, bool, datetime | None]]:
        """(name, ready, cordoned, last heartbeat) of every node, by name: the spec-less read the console needs."""
        query = select(t.nodes.c.name, t.nodes.c.ready, t.nodes.c.cordoned, t.nodes.c.heartbeat)
        with self.read() as conn:
            return [(n, bool(r), bool(c), aware(h)) for n, r, c, h in conn.execute(query.order_by(t.nodes.c.name))]

    def set_node_flags(self, name: str, reason: str, message: str = "", **flags: Any) -> dict[str, Any]:
        """Set cordoned / ready / heartbeat / report on a node (one event, `reason`)."""
        with self.write() as conn:
            result = conn.execute(
                update(t.nodes).where(t.nodes.c.name == name).values(**flags, version=t.nodes.c.version + 1)
            )
            if result.rowcount == 0:
                raise NotFound(f"node {name} not found")
            if reason:
                self.log(conn, [Event("Node", name, reason, message)])
            row = as_dict(conn.execute(select(t.nodes).where(t.nodes.c.name == name)).first())
            assert row is not None
            return row

    def heartbeat(self, name: str, report: Mapping[str, Any] | None) -> bool:
        """Record an accepted report; True when the scheduler must look at the node again (it was
        NotReady, or what it reports changed), in which case an event says so."""
        with self.write() as conn:
            row = conn.execute(select(t.nodes.c.ready, t.nodes.c.report).where(t.nodes.c.name == name)).first()
            if row is None:
                raise NotFound(f"node {name} not found")
            values: dict[str, Any] = {"heartbeat": now(), "ready": True}
            changed = report is not None and report != row.report
            if changed:
                values["report"] = dict(report or {})
            if changed or not row.ready:
                values["version"] = t.nodes.c.version + 1
            conn.execute(update(t.nodes).where(t.nodes.c.name == name).values(**values))
            events = [Event("Node", name, "Ready", "heartbeats resumed")] if not row.ready else []
            if changed:
                events.append(Event("Node", name, "Reported", "device state or health changed"))
            self.log(conn, events)
            return bool(events)

    def delete_node(self, name: str) -> list[str]:
        """Delete a node; its workloads go back to Pending (requeued). Their keys."""
        with self.write() as conn:
            uid = conn.execute(delete(t.nodes).where(t.nodes.c.name == name).returning(t.nodes.c.uid)).scalar()
            if uid is None:
                raise NotFound(f"node {name} not found")
            keys = self._requeue_node(conn, name, f"node {name} was deleted")
            self.log(conn, [Event("Node", name, "Deleted", uid=uid)])
            return keys

    def requeue_node(self, name: str, reason: str) -> list[str]:
        """Release every binding on `name` and requeue its workloads (a node lost for good)."""
        with self.write() as conn:
            return self._requeue_node(conn, name, reason)

    def _requeue_node(self, conn: Connection, name: str, reason: str) -> list[str]:
        held = conn.execute(select(t.bindings.c.workload_id, t.bindings.c.workload).where(t.bindings.c.node == name))
        ids, keys = [], []
        for workload_id, key in held:
            ids.append(workload_id)
            keys.append(key)
        if ids:
            conn.execute(delete(t.bindings).where(t.bindings.c.workload_id.in_(ids)))
            conn.execute(
                update(t.workloads)
                .where(t.workloads.c.id.in_(ids))
                .values(phase=PENDING, reason=reason, node=None, version=t.workloads.c.version + 1, updated=now())
            )
            self.log(conn, [Event("Workload", k, "Requeued", reason) for k in keys])
        return keys

    # Workloads ---------------------------------------------------------------------------------------
    def submit(
        self, items: Sequence[tuple[str, str, str, Mapping[str, Any]]], job: str | None = None,
        check: Callable[[Connection], None] | None = None, uids: Sequence[str] | None = None,
    ) -> tuple[list[int], list[int]]:  # fmt: skip
        """Insert workloads (namespace, name, tenant, manifest) as Pending, all or none; their ids and
        the ids of the events announcing them. `check(conn)` runs first in the same transaction and
        may refuse the whole write by raising (the tenants' object quotas, server/api/quota.py). `uids`:
        the new objects' uids, one per item (None: new ones).

        Raises Conflict naming the first key that already exists."""
        try:
            with self.write() as conn:
                if check is not None:
                    check(conn)
                return self.insert_pending(conn, items, job, uids)
        except IntegrityError:
            raise self._taken(items) from None

    def submit_group(
        self, requests: Sequence[Submission], check: GroupCheck | None = None,
        refusals: tuple[type[Exception], ...] = (),
    ) -> list[tuple[list[int], list[int]] | Exception]:  # fmt: skip
        """Independent submissions (a group commit of concurrent requests) in one transaction: per
        submission, what `submit` returns or the exception it would raise, as if each had been
        written alone in this order. `check(conn, indexes)` refuses the submissions at `indexes`
        taken together by raising one of `refusals` (the tenants' object quotas); a refused one
        writes nothing and leaves the others as they are; the rest commit together, and nothing is
        returned before that commit. Any other error (the database's) fails the whole group.

        All of them are first written at once, in a transaction of their own (one check, one insert,
        one event write, no savepoint); only when that is refused (a key taken, also by another of
        the group, or a quota reached) is each written again alone in its own savepoint, in order."""
        try:
            with self.write() as conn:
                if check is not None:
                    check(conn, list(range(len(requests))))
                items = [item for request in requests for item in request[0]]
                uids = [uid for request in requests for uid in request[1]]
                ids, events = self.insert_pending(conn, items, None, uids)
            return list(_split(requests, ids, events))
        except IntegrityError:
            if len(requests) == 1:  # what `submit` answers
                return [self._taken(requests[0][0])]
        except refusals as exc:
            if len(requests) == 1:
                return [exc]
        with self.write() as conn:
            results: list[tuple[list[int], list[int]] | Exception] = []
            for i, (items, uids) in enumerate(requests):
                try:
                    with conn.begin_nested():
                        if check is not None:
                            check(conn, [i])
                        results.append(self.insert_pending(conn, items, None, uids))
                except IntegrityError:
                    results.append(self._taken(items, conn))  # this transaction's rows count too
                except refusals as exc:
                    results.append(exc)
        return results

    def _taken(
        self, items: Sequence[tuple[str, str, str, Mapping[str, Any]]], conn: Connection | None = None
    ) -> Conflict:
        """The Conflict of a refused insert of `items`: the first of their keys already stored
        (read in `conn`'s transaction when given), else the first key."""
        keys = [f"{ns}/{name}" for ns, name, _, _ in items]
        taken = self.existing_workloads(keys, conn)
        return Conflict(f"workload {taken[0] if taken else keys[0]} already exists")

    @classmethod
    def insert_pending(
        cls, conn: Connection, items: Sequence[tuple[str, str, str, Mapping[str, Any]]], job: str | None = None,
        uids: Sequence[str] | None = None,
    ) -> tuple[list[int], list[int]]:  # fmt: skip
        """`submit` in the caller's transaction (IntegrityError when a key is taken)."""
        stamp = now()
        uids = uids if uids is not None else [t.new_uid() for _ in items]
        rows = [
            {"namespace": ns, "name": name, "tenant": tenant, "spec": dict(spec), "phase": PENDING, "reason": "",
             "job": job, "version": 1, "created": stamp, "updated": stamp, "uid": uid}
            for (ns, name, tenant, spec), uid in zip(items, uids, strict=True)
        ]  # fmt: skip
        inserted = insert(t.workloads).returning(t.workloads.c.id, sort_by_parameter_order=True)
        result = conn.execute(inserted, rows)
        ids = [r[0] for r in result]
        events = cls.log(conn, [Event("Workload", f"{r['namespace']}/{r['name']}", "Submitted", uid=r["uid"])
                                for r in rows])  # fmt: skip
        return ids, events

    def existing_workloads(self, keys: Sequence[str], conn: Connection | None = None) -> list[str]:
        """The keys of `keys` stored already (read in `conn`'s transaction when given)."""
        pairs = [tuple(k.split("/", 1)) for k in keys]
        columns = t.workloads.c
        query = select(columns.namespace, columns.name).where(
            columns.namespace.in_({p[0] for p in pairs}), columns.name.in_({p[1] for p in pairs})
        )
        if conn is not None:
            found = {f"{ns}/{n}" for ns, n in conn.execute(query)}
        else:
            with self.read() as reader:
                found = {f"{ns}/{n}" for ns, n in reader.execute(query)}
        return [k for k in keys if k in found]

    def find_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The workload row with its binding row under "binding" (None when unbound), or None."""
        with self.read() as conn:
            query = select(t.workloads).where(t.workloads.c.namespace == namespace, t.workloads.c.name == name)
            row = as_dict(conn.execute(query).first())
            if row is not None:
                binding = conn.execute(select(t.bindings).where(t.bindings.c.workload_id == row["id"])).first()
                row["binding"] = as_dict(binding)
        return row

    def get_workload(self, namespace: str, name: str) -> dict[str, Any]:
        row = self.find_workload(namespace, name)
        if row is None:
            raise NotFound(f"workload {namespace}/{name} not found")
        return row

    def list_workloads(self, **filters: str | None) -> list[dict[str, Any]]:
        """Workloads (with bindings) matching namespace / tenant / phase / node / job, in submission order.
        A job without a namespace (``clicks``) is that job name in whichever namespaces the other
        filters allow."""
        return self.workload_page(None, None, **filters).rows

    def workload_page(
        self, after: int | None, limit: int | None, namespaces: Collection[str] | None = None, **filters: str | None
    ) -> Page:
        """Workloads (with bindings) matching the filters of `list_workloads`, in `namespaces` (None:
        any), by id after `after`: one query whatever the number of namespaces."""
        conditions = self._workload_filters(filters)
        if namespaces is not None:
            conditions.append(t.workloads.c.namespace.in_(sorted(namespaces)) if namespaces else false())
        query = select(t.workloads, t.bindings.c.data.label("binding_data")).outerjoin(
            t.bindings, t.bindings.c.workload_id == t.workloads.c.id
        )
        with self.read() as conn:
            return keyset_page(conn, query, t.workloads, "id", conditions, after, limit)

    @staticmethod
    def _workload_filters(filters: Mapping[str, str | None]) -> list[ColumnElement[bool]]:
        conditions: list[ColumnElement[bool]] = []
        for column, value in filters.items():
            if column == "job" and value and "/" not in value:
                conditions.append(t.workloads.c.job.endswith(f"/{value}", autoescape=True))
            elif value:
                conditions.append(getattr(t.workloads.c, column) == value)
        return conditions

    def has_workloads(self, namespace: str) -> bool:
        with self.read() as conn:
            query = select(t.workloads.c.id).where(t.workloads.c.namespace == namespace).limit(1)
            return conn.execute(query).first() is not None

    def delete_workloads(
        self, namespace: str | None, matches: Callable[[Mapping[str, str]], bool] | None = None, chunk: int = CHUNK
    ) -> Iterator[tuple[list[str], list[str], list[int]]]:
        """Delete the workloads of `namespace` (None: every namespace) whose labels `matches` (None:
        all of them), `chunk` at a time, each chunk one transaction that releases their bindings and
        writes one Deleted event per workload (the change feed). Yields, per chunk, the keys deleted,
        those of them that were bound, and the event ids. A job's slots are not deleted here: a job
        goes with all its slots at once (job_store.delete_job)."""
        after = 0
        while True:
            with self.write() as conn:
                columns = [t.workloads.c.id, t.workloads.c.namespace, t.workloads.c.name, t.workloads.c.uid,
                           t.bindings.c.workload_id.label("bound")]  # fmt: skip
                if matches is not None:
                    columns.append(t.workloads.c.spec)
                conditions = [t.workloads.c.id > after, t.workloads.c.job.is_(None)]
                if namespace is not None:
                    conditions.append(t.workloads.c.namespace == namespace)
                query = (
                    select(*columns)
                    .outerjoin(t.bindings, t.bindings.c.workload_id == t.workloads.c.id)
                    .where(*conditions)
                    .order_by(t.workloads.c.id)
                    .limit(chunk)
                )
                rows = conn.execute(query).all()
                if not rows:
                    return
                after = rows[-1].id
                if matches is not None:
                    rows = [r for r in rows if matches(_labels(r.spec))]
                if not rows:
                    continue
                ids = [r.id for r in rows]
                keys = [f"{r.namespace}/{r.name}" for r in rows]
                bound = [f"{r.namespace}/{r.name}" for r in rows if r.bound is not None]
                conn.execute(delete(t.bindings).where(t.bindings.c.workload_id.in_(ids)))
                conn.execute(delete(t.workloads).where(t.workloads.c.id.in_(ids)))
                gone = [
                    Event("Workload", k, "Deleted", "deleted with others", r.uid)
                    for k, r in zip(keys, rows, strict=True)
                ]
                event_ids = self.log(conn, gone)
            yield keys, bound, event_ids

    def pending(self, after_id: int = 0) -> list[dict[str, Any]]:
        """Pending workloads with id > `after_id`, oldest first (what the scheduler must queue)."""
        with self.read() as conn:
            query = select(t.workloads).where(t.workloads.c.phase == PENDING, t.workloads.c.id > after_id)
            return [as_dict(r) for r in conn.execute(query.order_by(t.workloads.c.id))]  # type: ignore[misc]

    def delete_workload(self, namespace: str, name: str, tenant: str | None = None) -> dict[str, Any]:
        """Delete a workload and release its binding; refuses another tenant's workload (NotFound)."""
        with self.write() as conn:
            query = select(t.workloads).where(t.workloads.c.namespace == namespace, t.workloads.c.name == name)
            row = as_dict(conn.execute(query).first())
            if row is None or (tenant is not None and row["tenant"] != tenant):
                raise NotFound(f"workload {namespace}/{name} not found")
            conn.execute(delete(t.bindings).where(t.bindings.c.workload_id == row["id"]))
            conn.execute(delete(t.workloads).where(t.workloads.c.id == row["id"]))
            self.log(conn, [Event("Workload", f"{namespace}/{name}", "Deleted", "released", row["uid"])])
            return row

    # Bindings ----------------------------------------------------------------------------------------
    def bind(
        self,
        decisions: Sequence[tuple[int, int, str, str, Mapping[str, Any]]],
        fence: Any = None,
        evictions: Mapping[int, Sequence[tuple[str, str]]] | None = None,
        moves: Mapping[int, PlannedMoves] | None = None,
    ) -> tuple[list[int], list[int]]:
        """Write bindings (workload id, version seen, key, node, binding data) in one transaction.

        A workload is bound only if it is still Pending at the version the scheduler saw; the ids
        that were not (deleted or changed meanwhile) are returned as conflicts and not bound, with
        the ids of the events written. `evictions[id]` are the (victim key, reason) pairs a
        preemptor needs gone: they are released and requeued in the same transaction, and only if
        that preemptor is bound. `moves[id]` is the defragmentation plan a waiting workload's
        binding needs (server/store/move_store.py): written with that binding or not at all; a
        mover no longer bound as planned makes the waiting workload a conflict. `fence(conn)` runs
        first and must raise when this writer may no longer schedule."""
        evictions, moves = evictions or {}, moves or {}
        with self.write() as conn:
            if fence is not None:
                fence(conn)
            stamp = now()
            bindable = self._still_pending(conn, {d[0]: d[1] for d in decisions})
            events: list[Event] = []
            for workload_id, _, key, _, _ in decisions:  # in order: a later plan sees an earlier one's moves
                plan = moves.get(workload_id)
                if plan is not None and workload_id in bindable:
                    if plan.in_place(conn):
                        events += plan.write(conn, key, stamp)
                    else:
                        del bindable[workload_id]
            chosen = [d for d in decisions if d[0] in bindable]
            for part in chunks(chosen):  # a few statements per batch, not one per workload
                nodes = case({workload_id: node for workload_id, _, _, node, _ in part}, value=t.workloads.c.id)
                conn.execute(
                    update(t.workloads)
                    .where(t.workloads.c.id.in_([d[0] for d in part]))
                    .values(
                        phase=BOUND,
                        node=nodes,
                        reason="",
                        restart_at=None,
                        version=t.workloads.c.version + 1,
                        updated=stamp,
                    )  # a job slot placed again after its region's restart: done
                )
            rows = []
            for workload_id, _, key, node, data in chosen:
                for victim, reason in evictions.get(workload_id, ()):
                    events += self._evict(conn, victim, key, data, reason)
                rows.append(binding_row(workload_id, key, node, data, stamp))
                events.append(Event("Workload", key, "Bound", f"bound to {node}", bindable[workload_id]))
            if rows:
                conn.execute(insert(t.bindings), rows)
            return [d[0] for d in decisions if d[0] not in bindable], self.log(conn, events)

    @staticmethod
    def _still_pending(conn: Connection, seen: Mapping[int, int]) -> dict[int, str | None]:
        """The ids of `seen` (id -> version the scheduler read) still Pending at that version, with their
        uids (for the Bound events: no second query for them), their rows locked for this transaction
        (PostgreSQL; SQLite's writer is exclusive anyway) in id order."""
        found: dict[int, str | None] = {}
        for part in chunks(sorted(seen)):
            query = (
                select(t.workloads.c.id, t.workloads.c.version, t.workloads.c.uid)
                .where(t.workloads.c.id.in_(part), t.workloads.c.phase == PENDING)
                .order_by(t.workloads.c.id)
                .with_for_update()
            )
            found.update((i, uid) for i, version, uid in conn.execute(query) if seen[i] == version)
        return found

    def _evict(self, conn: Connection, key: str, preemptor: str, binding: Mapping[str, Any], why: str) -> list[Event]:
        """Release a preemption victim's binding and requeue it (its agent stops its process)."""
        query = select(t.bindings.c.workload_id, t.bindings.c.data).where(t.bindings.c.workload == key)
        row = conn.execute(query).first()
        if row is None:
            return []
        reason = preempted_reason(row[1], preemptor, binding, why)
        conn.execute(delete(t.bindings).where(t.bindings.c.workload_id == row[0]))
        conn.execute(
            update(t.workloads)
            .where(t.workloads.c.id == row[0])
            .values(phase=PENDING, reason=reason, node=None, version=t.workloads.c.version + 1, updated=now())
        )
        return [Event("Workload", key, "Preempted", reason)]

    def bindings(self, node: str | None = None) -> list[dict[str, Any]]:
        return self.binding_page(node, None, None).rows

    def binding_page(self, node: str | None, after: int | None, limit: int | None) -> Page:
        """Bindings (with their workload's spec, phase and tenant), optionally of one node, by workload id."""
        w = t.workloads.c
        query = select(t.bindings, w.spec, w.phase, w.tenant, w.uid).join(t.workloads, w.id == t.bindings.c.workload_id)
        conditions = [t.bindings.c.node == node] if node is not None else []
        with self.read() as conn:
            return keyset_page(conn, query, t.bindings, "workload_id", conditions, after, limit)

    def ack(self, key: str) -> None:
        with self.write() as conn:
            result = conn.execute(
                update(t.bindings)
                .where(t.bindings.c.workload == key)
                .values(acked=True, version=t.bindings.c.version + 1)
            )
            if result.rowcount == 0:
                raise NotFound(f"workload {key} is not bound")
            self.log(conn, [Event("Workload", key, "Acknowledged", "the node agent accepted the binding")])

    def release(self, key: str, phase: str, reason: str, info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Drop `key`'s binding and move it to `phase` (Pending = requeue, or a terminal phase)."""
        with self.write() as conn:
            return self.release_in(conn, key, phase, reason, info)

    @classmethod
    def release_in(
        cls, conn: Connection, key: str, phase: str, reason: str, info: Mapping[str, Any] | None = None,
        message: str | None = None, **columns: Any,
    ) -> dict[str, Any]:  # fmt: skip
        """`release` in the caller's transaction; `columns` are other workload columns to set, and
        `message` the event's when it is not the reason (a repeated event is counted when equal)."""
        row = as_dict(conn.execute(select(t.bindings).where(t.bindings.c.workload == key)).first())
        if row is None:
            raise NotFound(f"workload {key} is not bound")
        conn.execute(delete(t.bindings).where(t.bindings.c.workload_id == row["workload_id"]))
        values: dict[str, Any] = {"phase": phase, "reason": reason, "version": t.workloads.c.version + 1,
                                  "updated": now(), **columns}  # fmt: skip
        if phase == PENDING:
            values["node"] = None
        if info is not None:
            values["info"] = dict(info)
        conn.execute(update(t.workloads).where(t.workloads.c.id == row["workload_id"]).values(**values))
        event = "Requeued" if phase == PENDING else phase
        cls.log(conn, [Event("Workload", key, event, reason if message is None else message)])
        return row

    def set_phase(self, key: str, phase: str, reason: str, info: Mapping[str, Any] | None = None) -> None:
        """Record a phase that keeps the binding (Running) or needs none (Rejected by the scheduler)."""
        namespace, name = key.split("/", 1)
        with self.write() as conn:
            values: dict[str, Any] = {"phase": phase, "reason": reason, "version": t.workloads.c.version + 1,
                                      "updated": now()}  # fmt: skip
            if info is not None:
                values["info"] = dict(info)
            result = conn.execute(
                update(t.workloads)
                .where(t.workloads.c.namespace == namespace, t.workloads.c.name == name)
                .values(**values)
            )
            if result.rowcount == 0:
                raise NotFound(f"workload {key} not found")
            self.log(conn, [Event("Workload", key, phase, reason)])

    def explain_waiting(self, reasons: Mapping[str, str]) -> list[int]:
        """Record why Pending workloads still wait (`key -> reason`); informative only, so the
        version is not bumped (a concurrent bind still succeeds). Ids of the events written.
        The loop writes this while it decides nothing (up to MAX_EXPLAINED reasons a second under a
        flood): the Pending rows are found (and locked, on PostgreSQL) per namespace with a few
        queries, and all reasons written by one executemany, not one statement per workload."""
        by_namespace: dict[str, list[str]] = {}
        for key in reasons:
            namespace, name = key.split("/", 1)
            by_namespace.setdefault(namespace, []).append(name)
        with self.write() as conn:
            uids: dict[str, tuple[int, str]] = {}
            for namespace, names in by_namespace.items():
                for part in chunks(names):
                    query = (
                        select(t.workloads.c.id, t.workloads.c.name, t.workloads.c.uid)
                        .where(t.workloads.c.namespace == namespace, t.workloads.c.name.in_(part),
                               t.workloads.c.phase == PENDING)
                        .order_by(t.workloads.c.id)
                        .with_for_update()
                    )  # fmt: skip
                    uids.update((f"{namespace}/{name}", (wid, uid)) for wid, name, uid in conn.execute(query))
            found = [(key, reason) for key, reason in reasons.items() if key in uids]  # in the caller's order
            if found:
                conn.execute(
                    update(t.workloads)
                    .where(t.workloads.c.id == bindparam("wid"), t.workloads.c.phase == PENDING)
                    .values(reason=bindparam("why")),
                    [{"wid": uids[key][0], "why": reason} for key, reason in found],
                )
            events = [Event("Workload", key, "Waiting", reason, uids[key][1]) for key, reason in found]
            return self.log(conn, events)

    def note(self, events: Iterable[Event]) -> list[int]:
        """Record events that change nothing else (e.g. why a change was refused); their ids."""
        with self.write() as conn:
            return self.log(conn, events)

    # Events ------------------------------------------------------------------------------------------
    def last_event_id(self) -> int:
        with self.read() as conn:
            return int(conn.execute(select(func.coalesce(func.max(t.events.c.id), 0))).scalar_one())

    def events(
        self, after: int = 0, *, also: Iterable[int] = (), kind: str | None = None, obj: str | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Events with id > `after` (plus the ids in `also`), oldest first, optionally for one object."""
        also = list(also)
        condition = t.events.c.id > after
        if also:
            condition = or_(condition, t.events.c.id.in_(also))
        query = select(t.events).where(condition)
        if kind:
            query = query.where(t.events.c.kind == kind)
        if obj:
            query = query.where(t.events.c.object == obj)
        with self.read() as conn:
            return [as_dict(r) for r in conn.execute(query.order_by(t.events.c.id).limit(limit))]  # type: ignore[misc]

    def event_page(
        self, after: int, limit: int | None, kind: str | None = None, obj: str | None = None,
        scope: EventScope | None = None, up_to: int | None = None, uid: str | None = None,
    ) -> Page:  # fmt: skip
        """Events by id after `after` (and up to `up_to`), of one kind / object / object uid, within
        `scope` (None: all of them)."""
        conditions = [t.events.c.id <= up_to] if up_to is not None else []
        if kind:
            conditions.append(t.events.c.kind == kind)
        if obj:
            conditions.append(t.events.c.object == obj)
        if uid:
            conditions.append(t.events.c.uid == uid)
        if scope is not None:
            conditions.append(scope.condition())
        with self.read() as conn:
            return keyset_page(conn, select(t.events), t.events, "id", conditions, after, limit)

    def prune_events(self, before: datetime, up_to: int, chunk: int = CHUNK) -> int:
        """Delete events older than `before` with ids up to `up_to` (what every reader of this process
        has read), `chunk` per transaction so that writers wait at most one chunk; how many."""
        removed = 0
        while True:
            with self.write() as conn:
                ids = [r[0] for r in conn.execute(
                    select(t.events.c.id).where(t.events.c.time < before, t.events.c.id <= up_to)
                    .order_by(t.events.c.id).limit(chunk)
                )]  # fmt: skip
                if ids:
                    conn.execute(delete(t.events).where(t.events.c.id.in_(ids)))
            removed += len(ids)
            if len(ids) < chunk:
                return removed

    def first_event_id(self) -> int:
        """The oldest event id kept (0 when there are none)."""
        with self.read() as conn:
            return int(conn.execute(select(func.coalesce(func.min(t.events.c.id), 0))).scalar_one())

    def silent_nodes(self, cutoff: datetime) -> list[tuple[str, bool, datetime]]:
        """(name, ready, last heartbeat) of nodes with an agent that has not reported since `cutoff`
        (nodes registered by hand never reported and are left out)."""
        query = select(t.nodes.c.name, t.nodes.c.ready, t.nodes.c.heartbeat).where(
            t.nodes.c.heartbeat.is_not(None), t.nodes.c.heartbeat < cutoff
        )
        with self.read() as conn:
            return [(name, bool(ready), aware(beat)) for name, ready, beat in conn.execute(query)]  # type: ignore[misc]

    # Tenants -----------------------------------------------------------------------------------------
    def put_tenant(
        self, name: str, weight: float, spec: Mapping[str, Any], *, create_only: bool, uid: str | None = None
    ) -> bool:
        """Create or replace a tenant; True when created (Conflict when `uid`, the manifest's, is
        not the stored tenant's: `check_uid`)."""
        with self.write() as conn:
            stored = conn.execute(select(t.tenants.c.uid).where(t.tenants.c.name == name)).scalar()
            exists = stored is not None
            if exists and create_only:
                raise Conflict(f"tenant {name} already exists")
            if exists:
                check_uid("Tenant", name, stored, uid)
            if exists:
                conn.execute(
                    update(t.tenants)
                    .where(t.tenants.c.name == name)
                    .values(weight=weight, spec=dict(spec), version=t.tenants.c.version + 1)
                )
            else:
                conn.execute(insert(t.tenants), {"name": name, "weight": weight, "spec": dict(spec), "version": 1})
            self.log(conn, [Event("Tenant", name, "Updated" if exists else "Created")])
            return not exists

    def get_tenant(self, name: str) -> dict[str, Any]:
        with self.read() as conn:
            row = as_dict(conn.execute(select(t.tenants).where(t.tenants.c.name == name)).first())
        if row is None:
            raise NotFound(f"tenant {name} not found")
        return row

    def run_as(self, names: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """Tenant name -> its stored ``spec.runAs`` (None: it has none), for the tenants `names`
        that exist: what a node agent runs their workloads as (one query for a whole binding list)."""
        wanted = sorted(set(names))
        out: dict[str, dict[str, Any] | None] = {}
        if not wanted:
            return out
        with self.read() as conn:
            for start in range(0, len(wanted), 500):  # bounded IN lists (SQLite's variable limit)
                chunk = wanted[start : start + 500]
                query = select(t.tenants.c.name, t.tenants.c.spec).where(t.tenants.c.name.in_(chunk))
                for name, spec in conn.execute(query):
                    out[name] = ((spec or {}).get("spec") or {}).get("runAs")
        return out

    def list_tenants(self) -> list[dict[str, Any]]:
        with self.read() as conn:
            return [as_dict(r) for r in conn.execute(select(t.tenants).order_by(t.tenants.c.name))]  # type: ignore[misc]

    def admission_rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """The name and spec of every tenant, PriorityClass and Topology (each by name), what admission
        checks a write against, in one query: one round trip on PostgreSQL instead of three, for every
        group of submissions (server/api/context.py `world`)."""
        tables = (t.tenants, t.priority_classes, t.topologies)
        parts = [select(literal_column(str(i)).label("kind"), tb.c.name, tb.c.spec) for i, tb in enumerate(tables)]
        rows: tuple[list[dict[str, Any]], ...] = ([], [], [])
        with self.read() as conn:
            for kind, name, spec in conn.execute(union_all(*parts).order_by("kind", "name")):
                rows[kind].append({"name": name, "spec": spec})
        return rows  # type: ignore[return-value]


def _labels(spec: Any) -> Mapping[str, str]:
    """The labels of a stored manifest (none when it has none, or they are not a mapping)."""
    metadata = spec.get("metadata") if isinstance(spec, Mapping) else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}
