"""Object identity and restarts apart from backoff: every stored object gets a `uid`, events and
log grants name the uid they are about, and in-place restarts move from `not_before` to `restart_at`.

Existing rows get a fresh UUID each. An existing event gets the uid of the object of its kind and
name that exists now if it was written after that object was created (tenants, which record no
creation time: every event of the name); older events belonged to an earlier object of the name and
keep no uid, so they are not shown as the history of the current one.

A workload that holds its binding with a `not_before` set and a "back-off" reason was waiting to be
restarted in place, as was a job slot that is Pending with that reason: its time moves to
`restart_at`. Any other `not_before` was a placement backoff (after a rejection) and stays.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: Tables of objects stored by name, and the columns that name one of them in `events.object`.
OBJECTS = {
    "nodes": ("Node", ("name",)),
    "workloads": ("Workload", ("namespace", "name")),
    "tenants": ("Tenant", ("name",)),
    "jobs": ("Job", ("namespace", "name")),
    "priority_classes": ("PriorityClass", ("name",)),
}
HOLDING = ("Bound", "Running")


def upgrade() -> None:
    conn = op.get_bind()
    for table in OBJECTS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("uid", sa.String(length=36), nullable=True))
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("uid", sa.String(length=36), nullable=True))
    with op.batch_alter_table("log_grants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("uid", sa.String(length=36), nullable=True))
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("restart_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_workloads_restart_at", ["restart_at"], unique=False)

    stamp = sa.DateTime(timezone=True)
    events = sa.table("events", sa.column("uid"), sa.column("kind"), sa.column("object"), sa.column("time", stamp))
    for table, (kind, key_columns) in OBJECTS.items():
        has_created = table != "tenants"
        columns = [sa.column(c) for c in (*key_columns, "uid")] + ([sa.column("created", stamp)] if has_created else [])
        rows = sa.table(table, *columns)
        fills, tags = [], []
        for row in conn.execute(sa.select(*[rows.c[c.name] for c in columns if c.name != "uid"])):
            data = row._mapping
            uid = str(uuid.uuid4())
            fills.append({**{f"k_{c}": data[c] for c in key_columns}, "new_uid": uid})
            tags.append({"obj": "/".join(str(data[c]) for c in key_columns), "new_uid": uid,
                         "since": data["created"] if has_created else None})  # fmt: skip
        if fills:
            match = sa.and_(*[rows.c[c] == sa.bindparam(f"k_{c}") for c in key_columns])
            conn.execute(sa.update(rows).where(match).values(uid=sa.bindparam("new_uid")), fills)
            condition = [events.c.kind == kind, events.c.object == sa.bindparam("obj")]
            if has_created:
                condition.append(events.c.time >= sa.bindparam("since", type_=stamp))
            conn.execute(sa.update(events).where(*condition).values(uid=sa.bindparam("new_uid")), tags)
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column("uid", existing_type=sa.String(length=36), nullable=False)
            batch_op.create_index(f"ix_{table}_uid", ["uid"], unique=True)

    workloads = sa.table("workloads", sa.column("phase"), sa.column("reason"), sa.column("job"),
                         sa.column("not_before", stamp), sa.column("restart_at", stamp))  # fmt: skip
    backing_off = sa.and_(workloads.c.not_before.is_not(None), workloads.c.reason.like("back-off%"))
    restarting = sa.or_(workloads.c.phase.in_(HOLDING), sa.and_(workloads.c.phase == "Pending",
                                                                 workloads.c.job.is_not(None)))  # fmt: skip
    conn.execute(sa.update(workloads).where(backing_off, restarting).values(restart_at=workloads.c.not_before))
    conn.execute(sa.update(workloads).where(backing_off, workloads.c.phase.in_(HOLDING)).values(not_before=None))


def downgrade() -> None:
    workloads = sa.table("workloads", sa.column("not_before"), sa.column("restart_at"))
    op.get_bind().execute(
        sa.update(workloads).where(workloads.c.restart_at.is_not(None)).values(not_before=workloads.c.restart_at)
    )
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index("ix_workloads_restart_at")
        batch_op.drop_column("restart_at")
    with op.batch_alter_table("log_grants", schema=None) as batch_op:
        batch_op.drop_column("uid")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_column("uid")
    for table in reversed(OBJECTS):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(f"ix_{table}_uid")
            batch_op.drop_column("uid")
