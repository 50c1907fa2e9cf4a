"""Durable job history in SQL (sqlmodel): SQLite by default, PostgreSQL by URL.

Every server replica mirrors the job records it sees in the state watch into SQL.
Writes are idempotent (a row is only replaced by a newer store revision, events are
keyed by the record revision that produced them), so replicas sharing one
PostgreSQL database write the same history once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

from sqlalchemy import Column, Text, func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, create_engine, select

from server.messages import Job

log = logging.getLogger(__name__)


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    id: str = Field(primary_key=True)
    name: str = Field(index=True)
    user: str = Field(index=True)
    state: str = Field(index=True)
    priority: int = Field(default=0, index=True)
    gpus: int = 0
    gpu_model: str | None = None
    submitted_at: float = Field(index=True)
    updated_at: float = 0.0
    revision: int = 0
    doc: str = Field(sa_column=Column(Text, nullable=False))


class AttemptRow(SQLModel, table=True):
    __tablename__ = "attempts"
    id: str = Field(primary_key=True)
    job_id: str = Field(index=True)
    number: int = 0
    host_id: str = Field(index=True)
    state: str = Field(index=True)
    term: int = 0
    exit_code: int | None = None
    placed_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None


class EventRow(SQLModel, table=True):
    __tablename__ = "events"
    id: str = Field(primary_key=True)
    ts: float = Field(index=True)
    kind: str = Field(index=True)
    job_id: str | None = Field(default=None, index=True)
    host_id: str | None = Field(default=None, index=True)
    message: str = ""


def job_events(job: Job) -> list[dict[str, object]]:
    """The timeline of a job, derived from its record: ids are deterministic, so the
    same event is written once however often (and by however many replicas) it is seen."""
    out: list[dict[str, object]] = [dict(id=f"{job.id}:submitted", ts=job.submitted_at, kind="job.submitted",
                                         job_id=job.id, host_id=None, message=job.spec.name)]
    for a in job.attempts:
        out.append(dict(id=f"{a.id}:placed", ts=a.placed_at, kind="attempt.placed", job_id=job.id,
                        host_id=a.host_id, message=f"attempt {a.number} on {a.host_id} GPUs {a.gpu_indices}"))
        if a.started_at is not None:
            out.append(dict(id=f"{a.id}:started", ts=a.started_at, kind="attempt.started", job_id=job.id,
                            host_id=a.host_id, message=f"attempt {a.number} running"))
        if a.state.terminal and a.finished_at is not None:
            detail = f"exit code {a.exit_code}" if a.exit_code is not None else ""
            out.append(dict(id=f"{a.id}:{a.state.value.lower()}", ts=a.finished_at,
                            kind=f"attempt.{a.state.value.lower()}", job_id=job.id, host_id=a.host_id,
                            message="; ".join(x for x in (detail, a.reason) if x)))
    if job.state.terminal:
        out.append(dict(id=f"{job.id}:{job.state.value.lower()}", ts=job.updated_at,
                        kind=f"job.{job.state.value.lower()}", job_id=job.id,
                        host_id=job.current.host_id if job.current else None, message=job.cancel_reason))
    return out


class History:
    def __init__(self, url: str) -> None:
        kw: dict[str, object] = {}
        if url.startswith("sqlite"):
            kw["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine = create_engine(url, **kw)
        if url.startswith("sqlite"):
            from sqlalchemy import event

            @event.listens_for(self.engine, "connect")
            def _pragmas(conn, _rec):  # type: ignore[no-untyped-def]
                cur = conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()

        SQLModel.metadata.create_all(self.engine)
        self._pending: dict[str, tuple[Job, int]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ writing

    def record(self, job: Job, revision: int) -> None:
        """Queue a job record for the next flush (newest revision wins)."""
        with self._lock:
            cur = self._pending.get(job.id)
            if cur is None or cur[1] < revision:
                self._pending[job.id] = (job, revision)

    def flush(self) -> int:
        with self._lock:
            batch = list(self._pending.values())
            self._pending.clear()
        if not batch:
            return 0
        try:
            self._write(batch)
        except IntegrityError:
            # A replica sharing the database wrote some rows first: go one by one.
            for item in batch:
                try:
                    self._write([item])
                except IntegrityError:
                    pass
        return len(batch)

    def _write(self, batch: Sequence[tuple[Job, int]]) -> None:
        events: list[dict[str, object]] = []
        with Session(self.engine) as s:
            ids = [j.id for j, _ in batch]
            existing = {r.id: r for r in s.exec(select(JobRow).where(JobRow.id.in_(ids)))}  # type: ignore[attr-defined]
            for job, rev in batch:
                row = existing.get(job.id)
                if row is not None and row.revision >= rev:
                    continue
                doc = job.model_dump_json()
                if row is None:
                    row = JobRow(
                        id=job.id, name=job.spec.name, user=job.spec.user, state=job.state.value,
                        priority=job.spec.priority, gpus=job.spec.gpus, gpu_model=job.spec.gpu_model,
                        submitted_at=job.submitted_at, updated_at=job.updated_at, revision=rev, doc=doc,
                    )
                else:
                    row.state = job.state.value
                    row.updated_at = job.updated_at
                    row.revision = rev
                    row.doc = doc
                s.add(row)
                for a in job.attempts:
                    s.merge(AttemptRow(
                        id=a.id, job_id=job.id, number=a.number, host_id=a.host_id, state=a.state.value,
                        term=a.term, exit_code=a.exit_code, placed_at=a.placed_at,
                        started_at=a.started_at, finished_at=a.finished_at,
                    ))
                events.extend(job_events(job))
            s.flush()
            self._insert_events(s, events)
            s.commit()

    def _insert_events(self, s: Session, events: list[dict[str, object]]) -> None:
        """Insert events, skipping ids already there (every replica derives the same ids)."""
        if not events:
            return
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        for i in range(0, len(events), 500):
            chunk = events[i : i + 500]
            s.execute(insert(EventRow).values(chunk).on_conflict_do_nothing(index_elements=["id"]))

    async def run(self, stop: asyncio.Event, every_s: float = 0.2) -> None:
        """Flush pending records until `stop`; a last flush on the way out."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=every_s)
            except asyncio.TimeoutError:
                pass
            try:
                await asyncio.to_thread(self.flush)
            except Exception:  # noqa: BLE001 - the database may be restarting; keep going
                log.exception("history flush failed")
                await asyncio.sleep(1)
        await asyncio.to_thread(self.flush)

    # ------------------------------------------------------------ reading

    def get_job(self, job_id: str) -> Job | None:
        with Session(self.engine) as s:
            row = s.get(JobRow, job_id)
            return Job.model_validate_json(row.doc) if row else None

    def list_jobs(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> tuple[list[Job], int]:
        with Session(self.engine) as s:
            q = select(JobRow)
            cq = select(func.count()).select_from(JobRow)
            if state:
                q = q.where(JobRow.state == state)
                cq = cq.where(JobRow.state == state)
            q = q.order_by(JobRow.submitted_at.desc(), JobRow.id.desc()).offset(offset).limit(limit)  # type: ignore[attr-defined]
            rows = s.exec(q).all()
            total = s.exec(cq).one()
            return [Job.model_validate_json(r.doc) for r in rows], int(total)

    def events_for_job(self, job_id: str) -> list[EventRow]:
        with Session(self.engine) as s:
            q = select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.ts)  # type: ignore[arg-type]
            return list(s.exec(q).all())

    def close(self) -> None:
        self.engine.dispose()
