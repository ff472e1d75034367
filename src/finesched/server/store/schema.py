"""The control plane's tables (SQLAlchemy Core): the durable truth the scheduler is rebuilt from.

Every row that can be changed by two writers carries a `version` column; writers update with
``WHERE version = :seen`` and treat "no row changed" as a conflict (optimistic concurrency).
`events` doubles as the change feed: each state change writes an event naming the object it
touched, in the same transaction, so a scheduling replica that did not make the change itself
reloads that object from here.

Every object stored by name (nodes, workloads, tenants, jobs, priority classes, topologies) also
has a `uid`, a UUID the server gives it when it is created (as Kubernetes' ``metadata.uid``): a
new object of an old name is another object. Events name the uid of the object they are about, so what a
deleted object went through is never shown as the history of a new one of its name.
"""

from __future__ import annotations

import uuid

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()


def new_uid() -> str:
    """A new object's uid: a random UUID in its canonical text form (36 characters)."""
    return str(uuid.uuid4())


def UidColumn() -> Column[str]:
    """The `uid` of a stored object: set once on insert, never changed, unique."""
    return Column("uid", String(36), nullable=False, default=new_uid, index=True, unique=True)


#: An integer primary key that autoincrements on SQLite (INTEGER) and PostgreSQL (BIGSERIAL).
IdColumn = BigInteger().with_variant(Integer(), "sqlite")

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("spec", JSON, nullable=False),  # the Node manifest as submitted
    Column("cordoned", Boolean, nullable=False, default=False),
    Column("ready", Boolean, nullable=False, default=True),
    Column("heartbeat", DateTime(timezone=True), nullable=True),
    Column("report", JSON, nullable=True),  # the last accepted agent report
    Column("version", Integer, nullable=False, default=1),
    Column("created", DateTime(timezone=True), nullable=False),
    UidColumn(),
)

workloads = Table(
    "workloads",
    metadata,
    Column("id", IdColumn, primary_key=True, autoincrement=True),  # submission order (FIFO)
    Column("namespace", String(253), nullable=False),
    Column("name", String(253), nullable=False),
    Column("tenant", String(253), nullable=False),
    Column("spec", JSON, nullable=False),  # the Workload manifest as submitted
    Column("phase", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("node", String(253), nullable=True),
    Column("info", JSON, nullable=True),  # what the node agent reported (exit code, cgroup, ...)
    Column("job", String(510), nullable=True),  # the dataflow job this slot belongs to
    Column("version", Integer, nullable=False, default=1),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("updated", DateTime(timezone=True), nullable=False),
    # Lifecycle (server/loop/lifecycle.py): restarts after failures so far, node agents' rejections in a
    # row, `not_before`: a Pending workload is not placed before it (the backoff after a rejection
    # or a failure), and `restart_at`: the workload's process failed and is started again then (in
    # place when it holds its binding; a job slot that had ended is placed again). Two fields, so a
    # placement backoff is never mistaken for a restart.
    Column("restarts", Integer, nullable=False, default=0, server_default="0"),
    Column("rejections", Integer, nullable=False, default=0, server_default="0"),
    Column("not_before", DateTime(timezone=True), nullable=True),
    Column("restart_at", DateTime(timezone=True), nullable=True),
    UidColumn(),
    UniqueConstraint("namespace", "name", name="uq_workload_key"),
    Index("ix_workloads_phase", "phase"),
    Index("ix_workloads_tenant", "tenant"),
    Index("ix_workloads_job", "job"),
    Index("ix_workloads_not_before", "not_before"),
    Index("ix_workloads_restart_at", "restart_at"),  # the leader looks for due restarts every second
)

bindings = Table(
    "bindings",
    metadata,
    Column("workload_id", IdColumn, ForeignKey("workloads.id", ondelete="CASCADE"), primary_key=True),
    Column("workload", String(510), nullable=False, unique=True),  # namespace/name
    Column("node", String(253), nullable=False),
    Column("data", JSON, nullable=False),  # the whole Binding (scalars, cpuset, devices, numa)
    Column("acked", Boolean, nullable=False, default=False),
    Column("version", Integer, nullable=False, default=1),
    Column("created", DateTime(timezone=True), nullable=False),
    Index("ix_bindings_node", "node"),
)

tenants = Table(
    "tenants",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("weight", Float, nullable=False, default=1.0),
    Column("spec", JSON, nullable=False),  # the Tenant manifest
    Column("version", Integer, nullable=False, default=1),
    UidColumn(),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", IdColumn, primary_key=True, autoincrement=True),
    Column("digest", String(64), nullable=False, unique=True),  # sha256 of the token; never the token
    Column("role", String(16), nullable=False),
    Column("tenant", String(253), nullable=True),
    Column("node", String(253), nullable=True),
    Column("created", DateTime(timezone=True), nullable=False),
    # A token is refused from `expires` on (None: never), and from `revoked` on (`token revoke`).
    Column("expires", DateTime(timezone=True), nullable=True),
    Column("revoked", DateTime(timezone=True), nullable=True),
    Column("description", String(253), nullable=False, default="", server_default=""),
)

priority_classes = Table(
    "priority_classes",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("value", Integer, nullable=False),
    Column("spec", JSON, nullable=False),  # the PriorityClass manifest
    Column("version", Integer, nullable=False, default=1),
    Column("created", DateTime(timezone=True), nullable=False),
    UidColumn(),
)

topologies = Table(
    "topologies",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("spec", JSON, nullable=False),  # the Topology manifest
    Column("version", Integer, nullable=False, default=1),
    Column("created", DateTime(timezone=True), nullable=False),
    UidColumn(),
)

events = Table(
    "events",
    metadata,
    Column("id", IdColumn, primary_key=True, autoincrement=True),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("kind", String(16), nullable=False),  # Node | Workload | Tenant | Offer | Job
    Column("object", String(510), nullable=False),  # node name, namespace/name, tenant, offer id
    Column("reason", String(64), nullable=False),  # Submitted, Bound, Released, Rejected, ...
    Column("message", Text, nullable=False, default=""),
    # An identical event repeated is counted on one row (Kubernetes' event aggregation): how many
    # times it happened and when first; `time` is the last time.
    Column("count", Integer, nullable=False, default=1, server_default="1"),
    Column("first_time", DateTime(timezone=True), nullable=True),
    # The uid of the object the event is about (null: an object without one, such as an offer, or
    # an event older than uids whose object could not be told).
    Column("uid", String(36), nullable=True),
    Index("ix_events_object", "kind", "object"),
    Index("ix_events_time", "time"),  # events older than the retention time are pruned by it
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", IdColumn, primary_key=True, autoincrement=True),
    Column("namespace", String(253), nullable=False),
    Column("name", String(253), nullable=False),
    Column("tenant", String(253), nullable=False),
    Column("spec", JSON, nullable=False),  # the Job manifest as submitted
    Column("phase", String(16), nullable=False),  # Active | Succeeded | Failed (Active: see its slots)
    Column("reason", Text, nullable=False, default=""),
    Column("failures", Integer, nullable=False, default=0),  # region restarts so far (backoffLimit counts them)
    Column("regions", JSON, nullable=False),  # failover region index -> restarts of that region
    Column("version", Integer, nullable=False, default=1),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("updated", DateTime(timezone=True), nullable=False),
    UidColumn(),
    UniqueConstraint("namespace", "name", name="uq_job_key"),
    Index("ix_jobs_tenant", "tenant"),  # a tenant's object quota counts its jobs
)

log_grants = Table(
    "log_grants",
    metadata,
    Column("digest", String(64), primary_key=True),  # sha256 of the one-time grant; never the grant
    Column("workload", String(510), nullable=False),
    Column("uid", String(36), nullable=True),  # the workload's: its node agent serves that object's log only
    Column("node", String(253), nullable=False),
    Column("tail", Integer, nullable=True),
    Column("follow", Boolean, nullable=False, default=False),
    Column("expires", DateTime(timezone=True), nullable=False),
)

offers = Table(
    "offers",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant", String(253), nullable=False),
    Column("node", String(253), nullable=False),
    Column("demand", JSON, nullable=False),
    Column("remaining", JSON, nullable=False),
    Column("hold", JSON, nullable=False),  # the binding that holds the offered resources while it is open
    Column("state", String(16), nullable=False),  # Open | Accepted | Declined | Expired
    Column("expires", DateTime(timezone=True), nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
)

leases = Table(
    "leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(128), nullable=False),
    Column("expires", DateTime(timezone=True), nullable=False),
    Column("version", Integer, nullable=False, default=1),  # fencing token: bumped on every takeover
)
