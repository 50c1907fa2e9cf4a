"""How busy each attempt kept its GPUs: `attempts.gpu_util_pct`, their mean utilisation
over its run as its agent sampled it at each heartbeat and reported at its end (null: not
reported, on a MIG instance, or without GPUs), so that usage per queue and user tells
the GPU-seconds held and how much of them was used.

Revision ID: 0007_gpu_util
Revises: 0006_preemption_loss
Create Date: 2026-12-06 00:00:00

Rows written before this revision have none.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_gpu_util"
down_revision: str | None = "0006_preemption_loss"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    insp = sa.inspect(op.get_bind())
    # A database made by create_all from the current models has it already.
    if "gpu_util_pct" not in {c["name"] for c in insp.get_columns("attempts")}:
        with op.batch_alter_table("attempts") as b:
            b.add_column(sa.Column("gpu_util_pct", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.drop_column("gpu_util_pct")
