"""What every request handler needs: the store, the scheduling loop, metrics, tokens, limits, and
the stored objects admission checks a write against (`world`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from finesched.admission import World
from finesched.errors import ValidationError
from finesched.model.priority_class import PriorityClass
from finesched.model.tenant import Tenant
from finesched.model.topology import Topology
from finesched.sched.scheduler import Scheduler
from finesched.server.api.auth import TENANT, Identity, TokenCache, authenticate
from finesched.server.api.group_commit import GroupCommit
from finesched.server.loop.loop import SchedulerLoop
from finesched.server.metrics import Metrics
from finesched.server.store.cluster_view import tenant_from_row
from finesched.server.store.priority_store import class_from_row
from finesched.server.store.store import Store
from finesched.server.store.topology_store import topology_from_row
from finesched.state.devices import attach_device_accounts

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_ITEMS_PER_REQUEST = 1000
#: How long a replica that does not schedule trusts the device types it read from the stored nodes.
DEVICE_TYPES_TTL_S = 5.0


@dataclass
class ServerContext:
    store: Store
    loop: SchedulerLoop
    metrics: Metrics
    tokens: TokenCache
    max_body_bytes: int = MAX_BODY_BYTES
    _device_types: tuple[float, frozenset[str]] = (0.0, frozenset())
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _refreshing: threading.Lock = field(default_factory=threading.Lock)
    #: Parsed tenants by name, with the stored manifest they were parsed from (parsed again only when it changed).
    _tenants: dict[str, tuple[Any, Tenant | None]] = field(default_factory=dict)
    #: Parsed PriorityClasses by name, likewise.
    _classes: dict[str, tuple[Any, PriorityClass | None]] = field(default_factory=dict)
    #: Parsed Topologies by name, likewise.
    _topologies: dict[str, tuple[Any, Topology | None]] = field(default_factory=dict)
    #: Concurrent workload submissions written together (server/api/group_commit.py).
    submissions: GroupCommit[Any] = field(default_factory=GroupCommit)

    def scheduler(self) -> Scheduler:
        """The leader's scheduler, or 503 on a replica that does not hold the lease."""
        scheduler = self.loop.scheduler
        if scheduler is None:
            raise HTTPException(503, "this replica is not the scheduling leader; ask the leader or retry")
        return scheduler

    def world(self, *, devices: bool = True) -> World:
        """The stored objects admission needs: the tenants, PriorityClasses and Topologies (those that
        parse; one stored before today's rules is set aside, not trusted) and, with `devices`, the
        device types of the nodes."""
        tenant_rows, class_rows, topology_rows = self.store.admission_rows()
        with self._lock:
            self._tenants = {row["name"]: _parsed(self._tenants, row, tenant_from_row) for row in tenant_rows}
            self._classes = {row["name"]: _parsed(self._classes, row, class_from_row) for row in class_rows}
            self._topologies = {r["name"]: _parsed(self._topologies, r, topology_from_row) for r in topology_rows}
            tenants = {name: tenant for name, (_, tenant) in self._tenants.items() if tenant is not None}
            classes = {name: cls for name, (_, cls) in self._classes.items() if cls is not None}
            topologies = {name: topo for name, (_, topo) in self._topologies.items() if topo is not None}
        return World(tenants, self.device_types() if devices else frozenset(), classes, topologies=topologies)

    def device_types(self) -> frozenset[str]:
        """The device types of the cluster's nodes: the leader's state, else the stored nodes.

        A follower reads them from the store at most every DEVICE_TYPES_TTL_S, in one thread: the
        others go on with the types read last (stale by at most one refresh) instead of every
        concurrent request reading and decoding every node at once."""
        with self.loop.lock:
            scheduler = self.loop.scheduler
            if scheduler is not None:
                return frozenset(attach_device_accounts(scheduler.state).types)
        stamp, types = self._device_types
        if time.monotonic() - stamp < DEVICE_TYPES_TTL_S:
            return types
        if not self._refreshing.acquire(blocking=stamp == 0.0):  # being read; a first read is waited for
            return types
        try:
            stamp, types = self._device_types
            if time.monotonic() - stamp >= DEVICE_TYPES_TTL_S:
                types = frozenset(stored_device_types(self.store.list_nodes()))
                self._device_types = (time.monotonic(), types)
            return types
        finally:
            self._refreshing.release()

    def check_namespace(self, caller: Identity, namespace: str, world: World | None = None) -> None:
        """A tenant token acts only in the namespaces its tenant owns: 403 otherwise, the same answer
        whether or not anything of that name exists there. Admins act everywhere; agents are checked
        by the node their object is bound to."""
        if caller.role != TENANT:
            return
        owner = (world or self.world(devices=False)).owner(namespace)
        if owner != caller.tenant:
            raise HTTPException(403, f"namespace {namespace} does not belong to tenant {caller.tenant}")

    def namespaces_of(self, caller: Identity, world: World | None = None) -> tuple[str, ...] | None:
        """The namespaces `caller` may see (None: all of them)."""
        if caller.role != TENANT:
            return None
        world = world or self.world(devices=False)
        mine = world.tenant(caller.tenant or "")
        return tuple(n for n in mine.owned_namespaces if world.owner(n) == mine.name) if mine is not None else ()


def _parsed(cache: dict[str, tuple[Any, Any]], row: dict[str, Any], parse: Any) -> tuple[Any, Any]:
    """(stored spec, parsed object or None when invalid) of `row`: the cached one while the spec is unchanged."""
    cached = cache.get(row["name"])
    if cached is not None and cached[0] == row["spec"]:
        return cached
    try:
        return row["spec"], parse(row)
    except ValidationError:
        return row["spec"], None


async def get_context(request: Request) -> ServerContext:
    """The server's context (async: FastAPI runs a plain function dependency in a worker thread)."""
    return request.app.state.ctx  # type: ignore[no-any-return]


Ctx = Annotated[ServerContext, Depends(get_context)]
Caller = Annotated[Identity, Depends(authenticate)]


def stored_device_types(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The device types named by stored node manifests, read from the JSON as stored (admission
    validated them; a node set aside may add a type, which only widens what admission accepts)."""
    found: set[str] = set()
    for row in rows:
        devices = ((row.get("spec") or {}).get("spec") or {}).get("devices") or ()
        found.update(d["type"] for d in devices if isinstance(d, Mapping) and isinstance(d.get("type"), str))
    return found
