"""Topology objects (issue 28): the network trees, as node labels, that gangs may name.

A table like `priority_classes`: cluster-scoped objects by name, each with its manifest, version,
creation time and uid (as every object stored by name has since 0004).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "topologies",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("topologies", schema=None) as batch_op:
        batch_op.create_index("ix_topologies_uid", ["uid"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("topologies", schema=None) as batch_op:
        batch_op.drop_index("ix_topologies_uid")
    op.drop_table("topologies")
