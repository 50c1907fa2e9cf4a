"""The jobs' list orders as indexes. Every order the API and the console page jobs by ends
with the job id (the tie-break that makes keyset and offset pages stable), and the
indexes did not: each page sorted the rows of equal times again, and a deep offset page
read every row before it (0.4 s at row 250,000 of 500,000 in SQLite). The id now ends
each of them, and the priority order, `priority DESC, submitted_at, id` (highest first,
oldest first among equals, the order a queue runs them), has an index of its own: the
one on `priority, submitted_at` matched neither it nor its reverse.

Revision ID: 0003_job_order
Revises: 0002_queues
Create Date: 2026-12-04 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_job_order"
down_revision: str | None = "0002_queues"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# name -> columns as they are now, and as they were.
ORDERS: dict[str, tuple[list[str], list[str]]] = {
    "ix_jobs_submitted_at": (["submitted_at", "id"], ["submitted_at"]),
    "ix_jobs_state_submitted_at": (["state", "submitted_at", "id"], ["state", "submitted_at"]),
    "ix_jobs_user_submitted_at": (["user", "submitted_at", "id"], ["user", "submitted_at"]),
    "ix_jobs_queue_submitted_at": (["queue", "submitted_at", "id"], ["queue", "submitted_at"]),
}
OLD_PRIORITY = "ix_jobs_priority_submitted_at"
PRIORITY = "ix_jobs_priority_order"


def upgrade() -> None:
    have = {ix["name"]: ix["column_names"] for ix in sa.inspect(op.get_bind()).get_indexes("jobs")}
    for name, (cols, _) in ORDERS.items():
        if have.get(name) != cols:
            if name in have:
                op.drop_index(name, table_name="jobs")
            op.create_index(name, "jobs", cols, unique=False)
    if PRIORITY not in have:
        op.create_index(PRIORITY, "jobs", [sa.text("priority DESC"), "submitted_at", "id"], unique=False)
    if OLD_PRIORITY in have:
        op.drop_index(OLD_PRIORITY, table_name="jobs")


def downgrade() -> None:
    op.create_index(OLD_PRIORITY, "jobs", ["priority", "submitted_at"], unique=False)
    op.drop_index(PRIORITY, table_name="jobs")
    for name, (_, old) in ORDERS.items():
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", old, unique=False)
