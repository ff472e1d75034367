"""Tenant isolation: token expiry, revocation and description; PriorityClass objects; the indexes
that event pruning (by time) and per-tenant object quotas (jobs by tenant) read by.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("revoked", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("description", sa.String(length=253), nullable=False, server_default=""))
    op.create_table(
        "priority_classes",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_time", ["time"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_tenant", ["tenant"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_tenant")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_time")
    op.drop_table("priority_classes")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_column("description")
        batch_op.drop_column("revoked")
        batch_op.drop_column("expires")
