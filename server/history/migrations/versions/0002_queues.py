"""Queues and accounting: each job's queue, and what each attempt held (its queue, user,
GPUs and their model, CPUs, memory), so usage per queue and per user is summed in SQL.

Revision ID: 0002_queues
Revises: 0001_initial
Create Date: 2025-02-01 00:00:00

Rows written before this revision get the `default` queue and zero resources.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_queues"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


COLUMNS: dict[str, list[sa.Column[object]]] = {
    "jobs": [sa.Column("queue", sa.String(), nullable=False, server_default="default")],
    "attempts": [
        sa.Column("queue", sa.String(), nullable=False, server_default="default"),
        sa.Column("user", sa.String(), nullable=False, server_default=""),
        sa.Column("gpus", sa.Float(), nullable=False, server_default="0"),
        sa.Column("gpu_model", sa.String(), nullable=False, server_default=""),
        sa.Column("cpus", sa.Float(), nullable=False, server_default="0"),
        sa.Column("memory_mb", sa.Float(), nullable=False, server_default="0"),
    ],
}
INDEXES: dict[str, tuple[str, list[str]]] = {
    "ix_jobs_queue_submitted_at": ("jobs", ["queue", "submitted_at"]),
    "ix_attempts_queue_started_at": ("attempts", ["queue", "started_at"]),
    "ix_attempts_started_at": ("attempts", ["started_at"]),
}


def upgrade() -> None:
    # What a database made by create_all from the current models already has is kept
    # (0001 adopts such databases).
    insp = sa.inspect(op.get_bind())
    for table, columns in COLUMNS.items():
        have = {c["name"] for c in insp.get_columns(table)}
        missing = [c for c in columns if c.name not in have]
        if missing:
            with op.batch_alter_table(table) as b:
                for c in missing:
                    b.add_column(c)
    for name, (table, cols) in INDEXES.items():
        if name not in {ix["name"] for ix in insp.get_indexes(table)}:
            op.create_index(name, table, cols, unique=False)


def downgrade() -> None:
    op.drop_index("ix_attempts_started_at", table_name="attempts")
    op.drop_index("ix_attempts_queue_started_at", table_name="attempts")
    op.drop_index("ix_jobs_queue_submitted_at", table_name="jobs")
    with op.batch_alter_table("attempts") as b:
        for c in ("memory_mb", "cpus", "gpu_model", "gpus", "user", "queue"):
            b.drop_column(c)
    with op.batch_alter_table("jobs") as b:
        b.drop_column("queue")
