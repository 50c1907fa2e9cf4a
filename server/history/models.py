"""The history database's tables (SQLModel). The schema itself is owned by the Alembic
scripts in migrations/; these models must match them (tests/test_history.py checks)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, Text
from sqlmodel import Field, SQLModel

# A state stream sequence: past 2**31 on a busy cluster (migration 0005). SQLite's INTEGER
# holds 64 bits already.
SEQUENCE = BigInteger().with_variant(Integer(), "sqlite")


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        # The list orders end with the id, their tie-break (migration 0003).
        Index("ix_jobs_state_submitted_at", "state", "submitted_at", "id"),
        Index("ix_jobs_user_submitted_at", "user", "submitted_at", "id"),
        Index("ix_jobs_name", "name", postgresql_ops={"name": "text_pattern_ops"}),
        Index("ix_jobs_submitted_at", "submitted_at", "id"),
        Index("ix_jobs_state_updated_at", "state", "updated_at"),
        Index("ix_jobs_queue_submitted_at", "queue", "submitted_at", "id"),
        Index("ix_jobs_job_group_submitted_at", "job_group", "submitted_at", "id"),  # migration 0004
    )
    id: str = Field(primary_key=True)
    name: str
    user: str
    state: str
    priority: int = 0
    gpus: int = 0
    gpu_model: str | None = None
    queue: str = Field(default="default", sa_column_kwargs={"server_default": "default"})
    job_group: str = Field(default="", sa_column_kwargs={"server_default": ""})  # JobSpec.group
    submitted_at: float
    updated_at: float = 0.0
    revision: int = Field(default=0, sa_column=Column(SEQUENCE, nullable=False))  # the state stream's sequence
    doc: str = Field(sa_column=Column(Text, nullable=False))


# priority DESC, submitted_at, id: the PRIORITY_DESC sort and its reverse (migration 0003).
Index("ix_jobs_priority_order", JobRow.__table__.c.priority.desc(),  # type: ignore[attr-defined]
      JobRow.__table__.c.submitted_at, JobRow.__table__.c.id)  # type: ignore[attr-defined]


class AttemptRow(SQLModel, table=True):
    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_job_id", "job_id"),
        Index("ix_attempts_host_id_placed_at", "host_id", "placed_at"),
        Index("ix_attempts_queue_started_at", "queue", "started_at"),
        Index("ix_attempts_started_at", "started_at"),
    )
    id: str = Field(primary_key=True)
    job_id: str
    number: int = 0
    host_id: str
    state: str
    term: int = 0
    exit_code: int | None = None
    placed_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    # What the attempt held (one task), for accounting per queue and user.
    queue: str = Field(default="default", sa_column_kwargs={"server_default": "default"})
    user: str = Field(default="", sa_column_kwargs={"server_default": ""})
    gpus: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    gpu_model: str = Field(default="", sa_column_kwargs={"server_default": ""})
    cpus: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    memory_mb: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    # GPU-seconds of work it lost when it ended PREEMPTED (scheduling.queues.preemption_loss).
    lost_gpu_s: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    # Its GPUs' mean utilisation over its run, in percent, as its agent reported it at its
    # end (None: not reported; wire.messages.Attempt.gpu_util_pct).
    gpu_util_pct: float | None = None


class EventRow(SQLModel, table=True):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_job_id_ts", "job_id", "ts"),
        Index("ix_events_host_id_ts", "host_id", "ts"),
        Index("ix_events_kind_ts", "kind", "ts"),
        Index("ix_events_ts", "ts"),
    )
    id: str = Field(primary_key=True)
    ts: float
    kind: str
    job_id: str | None = None
    host_id: str | None = None
    message: str = ""


class StreamPositionRow(SQLModel, table=True):
    """How far the history has read a stream: every record up to `seq` of the stream
    created at `origin` is written (migration 0005)."""

    __tablename__ = "stream_positions"
    stream: str = Field(primary_key=True)
    origin: str
    seq: int = Field(default=0, sa_column=Column(SEQUENCE, nullable=False))
