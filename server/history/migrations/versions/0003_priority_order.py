"""The jobs' priority order as an index: `jobs(sort: PRIORITY_DESC)` and its reverse read
`priority DESC, submitted_at, id` (highest first, oldest first among equals, the order a
queue runs them). An index on `priority, submitted_at` matched neither direction, so every
page sorted every row.

Revision ID: 0003_priority_order
Revises: 0002_queues
Create Date: 2026-12-04 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_priority_order"
down_revision: str | None = "0002_queues"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "ix_jobs_priority_submitted_at"
NEW = "ix_jobs_priority_order"


def upgrade() -> None:
    have = {ix["name"] for ix in sa.inspect(op.get_bind()).get_indexes("jobs")}
    if NEW not in have:
        op.create_index(NEW, "jobs", [sa.text("priority DESC"), "submitted_at", "id"], unique=False)
    if OLD in have:
        op.drop_index(OLD, table_name="jobs")


def downgrade() -> None:
    op.create_index(OLD, "jobs", ["priority", "submitted_at"], unique=False)
    op.drop_index(NEW, table_name="jobs")
