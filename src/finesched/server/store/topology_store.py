"""The `topologies` table: Topology objects (model/topology.py), each change one transaction with
its event.

Events are of kind ``Topology`` (Created, Updated, Deleted), as other objects' changes are logged;
the scheduling loop follows them to give every replica's scheduler the stored topologies
(`Scheduler.set_topologies`). A topology may be deleted while gangs name it: they wait, and the
scheduler says why; admission refuses new ones that name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, insert, select, update

from finesched.model.manifest import parse_manifest
from finesched.model.topology import Topology
from finesched.server.store import schema as t
from finesched.server.store.store import Conflict, Event, NotFound, Store, as_dict, check_uid, now

KIND = "Topology"


def topology_from_row(row: Mapping[str, Any]) -> Topology:
    """The Topology of a stored row (ValidationError if the stored manifest is invalid today)."""
    topology = parse_manifest(row["spec"], where=f"topology {row['name']}")
    assert isinstance(topology, Topology)
    return topology


def describe(topology: Topology) -> str:
    """What an event says of a topology: its levels, coarse to fine."""
    return "levels " + " > ".join(topology.labels)


def put_topology(
    store: Store, topology: Topology, spec: Mapping[str, Any], *, create_only: bool, uid: str | None = None
) -> bool:
    """Create or replace a topology; True when created. Conflict when the name is taken
    (`create_only`) or `uid` (the manifest's) is not the stored topology's (`check_uid`)."""
    table = t.topologies
    with store.write() as conn:
        before = conn.execute(select(table.c.uid).where(table.c.name == topology.name)).first()
        if before is not None and create_only:
            raise Conflict(f"Topology {topology.name} already exists")
        if before is None:
            conn.execute(insert(table), {"name": topology.name, "spec": dict(spec), "version": 1, "created": now()})
            Store.log(conn, [Event(KIND, topology.name, "Created", describe(topology))])
            return True
        check_uid(KIND, topology.name, before.uid, uid)
        conn.execute(
            update(table).where(table.c.name == topology.name).values(spec=dict(spec), version=table.c.version + 1)
        )
        Store.log(conn, [Event(KIND, topology.name, "Updated", describe(topology))])
        return False


def find_topology(store: Store, name: str) -> dict[str, Any] | None:
    with store.read() as conn:
        return as_dict(conn.execute(select(t.topologies).where(t.topologies.c.name == name)).first())


def list_topologies(store: Store) -> list[dict[str, Any]]:
    """Every topology row, by name."""
    with store.read() as conn:
        return [as_dict(r) for r in conn.execute(select(t.topologies).order_by(t.topologies.c.name))]  # type: ignore[misc]


def delete_topology(store: Store, name: str) -> None:
    """Delete a topology (NotFound when absent). Gangs that name it wait until one of the name exists."""
    with store.write() as conn:
        table = t.topologies
        uid = conn.execute(delete(table).where(table.c.name == name).returning(table.c.uid)).scalar()
        if uid is None:
            raise NotFound(f"Topology {name} not found")
        Store.log(conn, [Event(KIND, name, "Deleted", uid=uid)])
