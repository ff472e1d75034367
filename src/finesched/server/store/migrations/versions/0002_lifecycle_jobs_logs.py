"""Workload lifecycle (restarts, rejections, backoff), event counts, jobs, one-time log grants.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

IdColumn = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("rejections", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_workloads_job", ["job"], unique=False)
        batch_op.create_index("ix_workloads_not_before", ["not_before"], unique=False)
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("count", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("first_time", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "jobs",
        sa.Column("id", IdColumn, autoincrement=True, nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("regions", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("namespace", "name", name="uq_job_key"),
    )
    op.create_table(
        "log_grants",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=510), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("tail", sa.Integer(), nullable=True),
        sa.Column("follow", sa.Boolean(), nullable=False),
        sa.Column("expires", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )


def downgrade() -> None:
    op.drop_table("log_grants")
    op.drop_table("jobs")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_column("first_time")
        batch_op.drop_column("count")
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index("ix_workloads_not_before")
        batch_op.drop_index("ix_workloads_job")
        batch_op.drop_column("not_before")
        batch_op.drop_column("rejections")
        batch_op.drop_column("restarts")
