"""Each job's group (`JobSpec.group`: an array's, or one its user named) as a column, so
the jobs' list and `cancelJobs` filter by it in SQL; an index on it in the list's newest
first order. Rows written before take the group from their job document.

Revision ID: 0004_job_group
Revises: 0003_job_order
Create Date: 2026-12-05 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_job_group"
down_revision: str | None = "0003_job_order"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_jobs_job_group_submitted_at"
# The group in a row's job document (JSON text), by dialect.
FROM_DOC = {
    "sqlite": "COALESCE(json_extract(doc, '$.spec.group'), '')",
    "postgresql": "COALESCE(CAST(doc AS json) -> 'spec' ->> 'group', '')",
}


def upgrade() -> None:
    bind = op.get_bind()
    insp = sa.inspect(bind)
    # A database made by create_all from the current models has it all already.
    if "job_group" not in {c["name"] for c in insp.get_columns("jobs")}:
        with op.batch_alter_table("jobs") as b:
            b.add_column(sa.Column("job_group", sa.String(), nullable=False, server_default=""))
        op.execute(f"UPDATE jobs SET job_group = {FROM_DOC[bind.dialect.name]}")
    if INDEX not in {ix["name"] for ix in insp.get_indexes("jobs")}:
        op.create_index(INDEX, "jobs", ["job_group", "submitted_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="jobs")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("job_group")
