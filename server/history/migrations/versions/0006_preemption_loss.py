"""What each preempted attempt lost: `attempts.lost_gpu_s`, the GPU-seconds of work a try
that ended PREEMPTED lost (all it ran, or from its stop to its exit for a job that
checkpoints: server.scheduling.queues.preemption_loss), so that usage per queue and user
sums the cost of preemption in SQL.

Revision ID: 0006_preemption_loss
Revises: 0005_stream_positions
Create Date: 2026-12-06 00:00:00

Rows written before this revision count no loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_preemption_loss"
down_revision: str | None = "0005_stream_positions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    insp = sa.inspect(op.get_bind())
    # A database made by create_all from the current models has it already.
    if "lost_gpu_s" not in {c["name"] for c in insp.get_columns("attempts")}:
        with op.batch_alter_table("attempts") as b:
            b.add_column(sa.Column("lost_gpu_s", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.drop_column("lost_gpu_s")
