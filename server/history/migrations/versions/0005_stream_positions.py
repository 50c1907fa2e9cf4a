"""Where the history has read the state stream up to, and 64-bit job revisions.

`stream_positions` holds, per stream, the sequence up to which every record is written
(and the stream's creation time, so a stream made anew is read from its start): a
historian that takes over, or starts again, reads only the records after it instead of
every job record in the bucket. `jobs.revision` is the state stream's sequence, which a
busy cluster takes past 2**31 (PostgreSQL's INTEGER) within days (50,000 hosts at 500
jobs/s write about 2,800 job and allocation revisions a second: under 9 days); it
becomes BIGINT. SQLite's INTEGER holds 64 bits already, so SQLite keeps it.

Revision ID: 0005_stream_positions
Revises: 0004_job_group
Create Date: 2026-12-06 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_stream_positions"
down_revision: str | None = "0004_job_group"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SEQUENCE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    bind = op.get_bind()
    insp = sa.inspect(bind)
    # A database made by create_all from the current models has it all already.
    if "stream_positions" not in insp.get_table_names():
        op.create_table(
            "stream_positions",
            sa.Column("stream", sa.String(), nullable=False),
            sa.Column("origin", sa.String(), nullable=False),
            sa.Column("seq", SEQUENCE, nullable=False),
            sa.PrimaryKeyConstraint("stream"),
        )
    if bind.dialect.name == "postgresql":
        # Rewrites the table under an exclusive lock: history waits while it runs.
        op.alter_column("jobs", "revision", type_=sa.BigInteger(), existing_type=sa.Integer(),
                        existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("jobs", "revision", type_=sa.Integer(), existing_type=sa.BigInteger(),
                        existing_nullable=False)
    op.drop_table("stream_positions")
