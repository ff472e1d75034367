"""The `priority_classes` table: PriorityClass objects, each change one transaction with its event.

Admission (`admission.admit_priority_class`) refuses a second global default with the field's
path; `put_priority_class` checks it again inside its transaction, so two replicas writing two
defaults at once cannot both succeed (PostgreSQL: the table is locked for the check, SQLite has
one writer anyway). Events are of kind ``PriorityClass`` (Created, Updated, Deleted), as other
objects' changes are logged; only admins see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, delete, insert, select, text, update

from finesched.model.manifest import parse_manifest
from finesched.model.priority_class import PriorityClass
from finesched.server.store import schema as t
from finesched.server.store.store import Conflict, Event, NotFound, Store, as_dict, check_uid, now

KIND = "PriorityClass"


def class_from_row(row: Mapping[str, Any]) -> PriorityClass:
    """The PriorityClass of a stored row (ValidationError if the stored manifest is invalid today)."""
    cls = parse_manifest(row["spec"], where=f"priorityclass {row['name']}")
    assert isinstance(cls, PriorityClass)
    return cls


def describe(cls: PriorityClass) -> str:
    """What an event says of a class: its value, policy and whether it is the default."""
    default = ", global default" if cls.global_default else ""
    return f"value {cls.value}, {cls.preemption_policy}{default}"


def put_priority_class(
    store: Store, cls: PriorityClass, spec: Mapping[str, Any], *, create_only: bool, uid: str | None = None
) -> bool:
    """Create or replace a class; True when created. Conflict when the name is taken (`create_only`),
    another class became the global default meanwhile, or `uid` (the manifest's) is not the stored
    class's (`check_uid`)."""
    with store.write() as conn:
        if cls.global_default:
            _lock(conn)
            table = t.priority_classes
            others = conn.execute(select(table.c.name, table.c.spec).where(table.c.name != cls.name))
            taken = sorted(name for name, doc in others if ((doc or {}).get("spec") or {}).get("globalDefault") is True)
            if taken:
                raise Conflict(f"PriorityClass {taken[0]} is already the global default; at most one class may be")
        before = conn.execute(
            select(t.priority_classes.c.value, t.priority_classes.c.uid).where(t.priority_classes.c.name == cls.name)
        ).first()  # fmt: skip
        if before is not None and create_only:
            raise Conflict(f"PriorityClass {cls.name} already exists")
        if before is not None:
            check_uid(KIND, cls.name, before.uid, uid)
        if before is None:
            conn.execute(insert(t.priority_classes), {"name": cls.name, "value": cls.value, "spec": dict(spec),
                                                      "version": 1, "created": now()})  # fmt: skip
            Store.log(conn, [Event(KIND, cls.name, "Created", describe(cls))])
            return True
        conn.execute(
            update(t.priority_classes)
            .where(t.priority_classes.c.name == cls.name)
            .values(value=cls.value, spec=dict(spec), version=t.priority_classes.c.version + 1)
        )
        message = describe(cls)
        if before.value != cls.value:
            message += f" (was {before.value}; workloads admitted before keep their priority)"
        Store.log(conn, [Event(KIND, cls.name, "Updated", message)])
        return False


def _lock(conn: Connection) -> None:
    """Serialize writers of a global default (PostgreSQL; SQLite's writer is exclusive already)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("LOCK TABLE priority_classes IN SHARE ROW EXCLUSIVE MODE"))


def find_priority_class(store: Store, name: str) -> dict[str, Any] | None:
    with store.read() as conn:
        return as_dict(conn.execute(select(t.priority_classes).where(t.priority_classes.c.name == name)).first())


def list_priority_classes(store: Store) -> list[dict[str, Any]]:
    """Every class, by name."""
    with store.read() as conn:
        query = select(t.priority_classes).order_by(t.priority_classes.c.name)
        return [as_dict(r) for r in conn.execute(query)]  # type: ignore[misc]


def delete_priority_class(store: Store, name: str) -> None:
    """Delete a class (NotFound when absent). Workloads admitted under it keep their priority, and a
    tenant that lists it keeps the name (a class created again under it is usable again)."""
    with store.write() as conn:
        table = t.priority_classes
        uid = conn.execute(delete(table).where(table.c.name == name).returning(table.c.uid)).scalar()
        if uid is None:
            raise NotFound(f"PriorityClass {name} not found")
        Store.log(conn, [Event(KIND, name, "Deleted", uid=uid)])
