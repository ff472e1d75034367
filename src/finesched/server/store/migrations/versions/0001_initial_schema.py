"""Initial schema: nodes, workloads, bindings, tenants, tokens, events (the change feed), offers, leases.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("object", sa.String(length=510), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_object", ["kind", "object"], unique=False)

    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("heartbeat", sa.DateTime(timezone=True), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "offers",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("demand", sa.JSON(), nullable=False),
        sa.Column("remaining", sa.JSON(), nullable=False),
        sa.Column("hold", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("expires", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=True),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("info", sa.JSON(), nullable=True),
        sa.Column("job", sa.String(length=510), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("namespace", "name", name="uq_workload_key"),
    )
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.create_index("ix_workloads_phase", ["phase"], unique=False)
        batch_op.create_index("ix_workloads_tenant", ["tenant"], unique=False)

    op.create_table(
        "bindings",
        sa.Column("workload_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("workload", sa.String(length=510), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("acked", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("workload_id"),
        sa.UniqueConstraint("workload"),
    )
    with op.batch_alter_table("bindings", schema=None) as batch_op:
        batch_op.create_index("ix_bindings_node", ["node"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("bindings", schema=None) as batch_op:
        batch_op.drop_index("ix_bindings_node")

    op.drop_table("bindings")
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index("ix_workloads_tenant")
        batch_op.drop_index("ix_workloads_phase")

    op.drop_table("workloads")
    op.drop_table("tokens")
    op.drop_table("tenants")
    op.drop_table("offers")
    op.drop_table("nodes")
    op.drop_table("leases")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_object")

    op.drop_table("events")
