"""Initial history schema: jobs, attempts, events and their query indexes.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01 00:00:00

A database created by the pre-Alembic ``SQLModel.metadata.create_all`` (same tables and
columns, single-column indexes) is adopted in place: the tables are kept and the old
indexes are replaced by the ones below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# name -> (table, columns, dialect options)
INDEXES: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "ix_jobs_state_submitted_at": ("jobs", ["state", "submitted_at"], {}),
    "ix_jobs_user_submitted_at": ("jobs", ["user", "submitted_at"], {}),
    # text_pattern_ops: LIKE 'prefix%' can use the index whatever the database collation.
    "ix_jobs_name": ("jobs", ["name"], {"postgresql_ops": {"name": "text_pattern_ops"}}),
    "ix_jobs_priority_submitted_at": ("jobs", ["priority", "submitted_at"], {}),
    "ix_jobs_submitted_at": ("jobs", ["submitted_at"], {}),
    "ix_jobs_state_updated_at": ("jobs", ["state", "updated_at"], {}),
    "ix_attempts_job_id": ("attempts", ["job_id"], {}),
    "ix_attempts_host_id_placed_at": ("attempts", ["host_id", "placed_at"], {}),
    "ix_events_job_id_ts": ("events", ["job_id", "ts"], {}),
    "ix_events_host_id_ts": ("events", ["host_id", "ts"], {}),
    "ix_events_kind_ts": ("events", ["kind", "ts"], {}),
    "ix_events_ts": ("events", ["ts"], {}),
}

# Indexes made by the pre-Alembic create_all (`Field(index=True)`).
LEGACY_INDEXES = {
    "jobs": ["ix_jobs_name", "ix_jobs_user", "ix_jobs_state", "ix_jobs_priority", "ix_jobs_submitted_at"],
    "attempts": ["ix_attempts_job_id", "ix_attempts_host_id", "ix_attempts_state"],
    "events": ["ix_events_ts", "ix_events_kind", "ix_events_job_id", "ix_events_host_id"],
}


def upgrade() -> None:
    insp = sa.inspect(op.get_bind())
    existing = set(insp.get_table_names())
    if "jobs" not in existing:
        op.create_table(
            "jobs",
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("name", sa.String(), nullable=False),
            sa.Column("user", sa.String(), nullable=False),
            sa.Column("state", sa.String(), nullable=False),
            sa.Column("priority", sa.Integer(), nullable=False),
            sa.Column("gpus", sa.Integer(), nullable=False),
            sa.Column("gpu_model", sa.String(), nullable=True),
            sa.Column("submitted_at", sa.Float(), nullable=False),
            sa.Column("updated_at", sa.Float(), nullable=False),
            sa.Column("revision", sa.Integer(), nullable=False),
            sa.Column("doc", sa.Text(), nullable=False),
            sa.PrimaryKeyConstraint("id"),
        )
    if "attempts" not in existing:
        op.create_table(
            "attempts",
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("job_id", sa.String(), nullable=False),
            sa.Column("number", sa.Integer(), nullable=False),
            sa.Column("host_id", sa.String(), nullable=False),
            sa.Column("state", sa.String(), nullable=False),
            sa.Column("term", sa.Integer(), nullable=False),
            sa.Column("exit_code", sa.Integer(), nullable=True),
            sa.Column("placed_at", sa.Float(), nullable=False),
            sa.Column("started_at", sa.Float(), nullable=True),
            sa.Column("finished_at", sa.Float(), nullable=True),
            sa.PrimaryKeyConstraint("id"),
        )
    if "events" not in existing:
        op.create_table(
            "events",
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("ts", sa.Float(), nullable=False),
            sa.Column("kind", sa.String(), nullable=False),
            sa.Column("job_id", sa.String(), nullable=True),
            sa.Column("host_id", sa.String(), nullable=True),
            sa.Column("message", sa.String(), nullable=False),
            sa.PrimaryKeyConstraint("id"),
        )
    for table, names in LEGACY_INDEXES.items():
        if table in existing:
            have = {ix["name"] for ix in insp.get_indexes(table)}
            for name in names:
                if name in have:
                    op.drop_index(name, table_name=table)
    for name, (table, cols, opts) in INDEXES.items():
        op.create_index(name, table, cols, unique=False, **opts)


def downgrade() -> None:
    for name, (table, _cols, _opts) in INDEXES.items():
        op.drop_index(name, table_name=table)
    op.drop_table("events")
    op.drop_table("attempts")
    op.drop_table("jobs")
