"""Durable job history in SQL (sqlmodel): SQLite by default, PostgreSQL by URL.

Every server replica mirrors the job records it sees in the state watch into SQL.
Writes are idempotent and ordered by store revision: a job row is upserted only when the
incoming revision is newer than the stored one (``INSERT .. ON CONFLICT DO UPDATE .. WHERE
revision < excluded.revision``), its attempts are written in the same transaction while
that row is locked, and events are keyed by deterministic ids and inserted with ``ON
CONFLICT DO NOTHING``. Replicas sharing one PostgreSQL database therefore write the same
history once, and an older revision never overwrites a newer one.

The schema is owned by Alembic (``server/history/migrations``); ``History`` upgrades the database
to head when it is created (under ``pg_advisory_xact_lock`` on PostgreSQL, a file lock
next to the database file on SQLite), so replicas can start at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import and_, case, delete, func, or_, text, tuple_, update
from sqlalchemy import select as sa_select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, DBAPIError, DisconnectionError, IntegrityError, InterfaceError, OperationalError
from sqlmodel import Session, col, create_engine, select

from server.history.models import AttemptRow, EventRow, JobRow, StreamPositionRow
from server.history.timeline import job_events
from server.history.writehealth import WriteHealth
from server.scheduling.queues import gpu_amount, preemption_loss
from wire.errors import DecodeError
from wire.messages import MAX_RECORD_BYTES, AttemptState, Job, JobState, decode
from wire.stopping import pause

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# The SQLite file a server keeps its history in, in its data directory, unless given a
# database URL (server.replica.Config.database_url).
DB_FILE = "history.db"
# The key of `stream_positions` under which a database keeps its own identity (History.database_id).
DATABASE_ID_KEY = "@database"
# pg_advisory_xact_lock key serialising schema upgrades ("muster" + 1); advisory locks
# are per database, so this only orders replicas that share one database.
_PG_MIGRATE_LOCK = 0x6D757374657201
FINISHED_STATES = tuple(s.value for s in JobState if s.terminal)  # TIMEOUT too (found by exploring)
# How often queued records are written. A job's first records (queued, placed, running)
# usually follow each other within a second: once a second writes most of them as one
# row, and took about a quarter less CPU than every 0.2 s (README, Benchmarks).
FLUSH_EVERY_S = 1.0
_WRITE_CHUNK = 200  # jobs per write transaction
_PRUNE_CHUNK = 1000  # jobs per prune transaction


# ---------------------------------------------------------------- migrations


def alembic_config(connection: Connection | None = None) -> Any:
    """An Alembic Config for the migration scripts shipped inside this package."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def upgrade_schema(engine: Engine) -> None:
    """`alembic upgrade head`, safe to run repeatedly and from several processes at once.
    A database a newer release has migrated already (its revision is not one of these
    scripts') is left as it is: migrations are additive, so this release's code reads and
    writes it (a rolling upgrade's replicas not yet upgraded keep their history; found by
    a review: they could not start, and a historian of theirs wrote nothing)."""
    if engine.dialect.name == "postgresql":
        # PostgreSQL DDL is transactional: the whole upgrade commits with the lock release,
        # and a replica waiting on the lock then finds the schema at head.
        with engine.begin() as conn:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATE_LOCK})")
            _upgrade(conn)
        return
    lock: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    db = engine.url.database
    if engine.dialect.name == "sqlite" and db and db != ":memory:" and not db.startswith("file:"):
        lock = _file_lock(os.path.abspath(db) + ".migrate-lock")
    with lock, engine.begin() as conn:
        _upgrade(conn)


def _upgrade(conn: Connection) -> None:
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = alembic_config(conn)
    known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
    newer = [r for r in MigrationContext.configure(conn).get_current_heads() if r not in known]
    if newer:
        log.warning("history database at revision %s, newer than this release's (%s): left as it is",
                    ", ".join(newer), ", ".join(sorted(known)[-1:]))
        return
    command.upgrade(cfg, "head")


# ---------------------------------------------------------------- queries

# sort name -> ordered (column name, descending) keys; the last key makes the order total.
JOB_SORTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "-submitted_at": (("submitted_at", True), ("id", True)),
    "submitted_at": (("submitted_at", False), ("id", False)),
    # highest priority first, oldest first among equals (the order the queue runs them)
    "-priority": (("priority", True), ("submitted_at", False), ("id", False)),
    "priority": (("priority", False), ("submitted_at", True), ("id", True)),
}
_JOB_KEY = {"submitted_at": lambda j: j.submitted_at, "priority": lambda j: j.spec.priority, "id": lambda j: j.id}


def job_row(job: Job, revision: int) -> dict[str, object]:
    """A job's row in the `jobs` table."""
    return dict(id=job.id, name=job.spec.name, user=job.spec.user, state=job.state.value,
                priority=job.spec.priority, gpus=job.spec.gpus, gpu_model=job.spec.gpu_model,
                queue=job.spec.queue, job_group=job.spec.group, submitted_at=job.submitted_at,
                updated_at=job.updated_at, revision=revision,
                doc=job.model_dump_json())


def attempt_rows(job: Job) -> list[dict[str, object]]:
    """A job's rows in the `attempts` table, with what each attempt held (accounting: a
    MIG instance as the part of its GPU's model it is, as its queue's quota counts it)."""
    return [dict(id=a.id, job_id=job.id, number=a.number, host_id=a.host_id, state=a.state.value,
                 term=a.term, exit_code=a.exit_code, placed_at=a.placed_at,
                 started_at=a.started_at, finished_at=a.finished_at, queue=job.spec.queue,
                 user=job.spec.user, gpus=gpu_amount(job.spec, a.gpu_model),
                 gpu_model=a.gpu_model or job.spec.gpu_model or "",
                 cpus=job.spec.cpus, memory_mb=float(job.spec.memory_mb),
                 lost_gpu_s=preemption_loss(job.spec, a) if a.state is AttemptState.PREEMPTED else 0.0,
                 gpu_util_pct=a.gpu_util_pct)
            for a in job.attempts]


def job_cursor(job: Job, sort: str = "-submitted_at") -> str:
    """Keyset cursor after `job` in `sort` order: pass it as `list_jobs(after=...)`."""
    return json.dumps([_JOB_KEY[c](job) for c, _ in JOB_SORTS[sort]])


# Failures of the database itself, not of what was written: never a reason to drop a row,
# and what a page that reads history says as the database being unavailable.
DATABASE_DOWN = (OperationalError, InterfaceError, DisconnectionError, TimeoutError, ConnectionError)
SCHEMA_RETRY_S = 2.0  # the least time between tries at a schema the database could not take
CONNECT_TIMEOUT_S = 10  # PostgreSQL's connect_timeout


def refuses_row(exc: BaseException) -> bool:
    """Whether an error writing rows is about what they hold (a value the database cannot
    take: SQLSTATE classes 22 and 23, or one the driver cannot send), not about the
    database (down, read-only, out of disk, permission: found by exploring, a standby's
    "read-only transaction" dropped every row written meanwhile, for good)."""
    if isinstance(exc, DATABASE_DOWN):
        return False
    if isinstance(exc, (DataError, IntegrityError)):
        return True
    if isinstance(exc, DBAPIError):
        code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        # (no SQLSTATE: the driver's own refusal of a value, as SQLite's binding errors)
        return not isinstance(code, str) or code[:2] in ("22", "23")
    return True  # not the database's refusal: a value the driver could not send (a NUL)


def down_text(exc: BaseException) -> str:
    """What the database said when it was down, on one line and short enough to show."""
    return " ".join(str(exc).split())[:300]
T = TypeVar("T")


def _same(row: dict[str, object]) -> dict[str, object]:
    return row


def without_nul(row: dict[str, object]) -> dict[str, object]:
    return {k: v.replace("\x00", "") if isinstance(v, str) else v for k, v in row.items()}


def write_isolating(write: Callable[[Sequence[T]], None], items: Sequence[T],
                    write_sanitized: Callable[[Sequence[T]], None], what: Callable[[Sequence[T]], str]) -> int:
    """Write `items` together; if the database refuses them for what they hold, write
    them one at a time, each refused one once more sanitized (`write_sanitized`), and
    drop what is still refused (logged). One bad row never holds up the rows behind it.
    A failure of the database itself (connection, timeout, read-only, disk full:
    `refuses_row`) propagates: nothing is dropped for it. Returns how many items were
    dropped."""
    try:
        write(items)
        return 0
    except Exception as exc:  # noqa: BLE001 - a row the database refuses, or the database
        if not refuses_row(exc):
            raise
        if len(items) == 1:
            try:
                write_sanitized(items)
                log.warning("history: %s written without the text the database refused (%s)", what(items), exc)
                return 0
            except Exception as exc2:  # noqa: BLE001
                if not refuses_row(exc2):
                    raise
                log.error("history: %s dropped, the database refuses it: %s", what(items), exc2)
                return 1
    return sum(write_isolating(write, items[i : i + 1], write_sanitized, what) for i in range(len(items)))


class History:
    """The job history store.

    Retention: with ``retention_days`` set, :meth:`prune` deletes jobs in a finished state
    (SUCCEEDED, FAILED, CANCELLED, TIMEOUT) whose ``updated_at`` is more than ``retention_days``
    before ``now``, together with their attempts and events, in transactions of at most
    1,000 jobs each (rows a concurrent writer holds are skipped and pruned next time);
    queued and running jobs are never pruned, however old. :meth:`prune_events` deletes the
    events older than that of no job in history (hosts', queues', alerts). :meth:`run`
    calls both about once a minute (first right after start). Every replica may prune; they skip each other's
    locked rows. A replica that still holds an older revision of a pruned job may write it
    back; it is finished and old, so the next prune removes it again.
    """

    def __init__(self, url: str, retention_days: float | None = None) -> None:
        if retention_days is not None and retention_days < 0:
            raise ValueError("retention_days must be >= 0")
        self.retention_days = retention_days
        kw: dict[str, object] = {"pool_pre_ping": True}
        if url.startswith("sqlite"):
            kw = {"connect_args": {"check_same_thread": False, "timeout": 30}}
        elif url.startswith("postgresql"):
            # A database host that does not answer must not hold a thread for the system's
            # TCP timeout (minutes): the replica's threads read history and check job ids.
            kw["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
        self._bytewise: bool | None = None  # whether text compares byte by byte (`_orders_bytewise`)
        self._engine = create_engine(url, **kw)
        self.dialect = self._engine.dialect.name
        if self.dialect == "sqlite":
            from sqlalchemy import event

            @event.listens_for(self._engine, "connect")
            def _pragmas(conn, _rec):
                cur = conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()

        # The schema brought up to date now, or, with the database down, at the first use
        # once it is back (found by exploring: a replica could not start while PostgreSQL
        # was down; history is not on the scheduling path).
        self._schema_lock = threading.Lock()
        self._schema_ok = False
        self._schema_tried = 0.0
        self._schema_error: BaseException | None = None
        try:
            self._upgrade_schema()
        except (*DATABASE_DOWN, OSError) as exc:
            log.warning("history database unreachable (%s): its schema is brought up to date once it answers",
                        down_text(exc))
        # job id -> (the job, or its record's bytes not decoded yet, revision)
        self._pending: dict[str, tuple[Job | bytes, int]] = {}
        self._lock = threading.Lock()
        self.dropped = 0  # records that did not decode at flush
        # The stream the queued revisions come from (its name and creation time), once
        # `follow` is called; the newest revision queued, and the newest stored as written.
        self._stream: tuple[str, str] | None = None
        self._seen = 0
        self._saved = 0

    # ------------------------------------------------------------ writing

    def record(self, job: Job, revision: int) -> None:
        """Queue a job record for the next flush (newest revision wins)."""
        self._queue(job.id, job, revision)

    def record_raw(self, job_id: str, value: bytes, revision: int) -> None:
        """Queue a job record as stored (its JSON), decoded only if it is still the newest
        revision of its job at the next flush: a job's records follow each other within
        milliseconds (placed, running), and all but the last are never decoded."""
        self._queue(job_id, value, revision)

    def _queue(self, job_id: str, job: Job | bytes, revision: int) -> None:
        with self._lock:
            if revision > self._seen:
                self._seen = revision
            cur = self._pending.get(job_id)
            if cur is None or cur[1] < revision:
                self._pending[job_id] = (job, revision)

    def _decoded(self, pending: list[tuple[str, tuple[Job | bytes, int]]]) -> list[tuple[Job, int]]:
        out: list[tuple[Job, int]] = []
        for job_id, (job, rev) in pending:
            if isinstance(job, bytes):
                try:
                    job = decode(Job, job, limit=MAX_RECORD_BYTES)
                except DecodeError as exc:
                    self.dropped += 1
                    log.warning("history: dropped job record %s: %s", job_id, exc)
                    continue
                if job.id != job_id:
                    self.dropped += 1
                    log.warning("history: dropped job record %s: it holds job %s", job_id, job.id)
                    continue
            out.append((job, rev))
        return out

    def follow(self, stream: str, origin: str, last_seq: int | None = None) -> int:
        """Keep this history's position in `stream`, the one created at `origin` (its last
        sequence now `last_seq`), whose records are queued in their order (a watch): each
        flush stores the newest revision queued before it once everything it took is
        written. Returns the position stored: every record up to it is written already, so a
        reader may start after it; 0 when none is stored.

        A stream that numbers anew (`renumbered`: created anew, or put back from a backup
        and so ending below the position stored) also gives 0, and its records must be
        able to replace rows written from the old numbering, whose revisions may be
        higher: the rows' revisions are set to 0 (those of a stream created anew; those
        past `last_seq` of one put back), in the transaction that stores the new origin
        at position 0 (found by exploring: history kept a job RUNNING for good after the
        stream was made anew, since only a higher revision replaces a row)."""
        with Session(self.engine) as s:
            row = s.get(StreamPositionRow, stream)
        seq = 0
        if row is not None:
            if row.origin != origin:
                self._renumbered(stream, origin, None)
            elif last_seq is not None and row.seq > last_seq:
                self._renumbered(stream, origin, last_seq)
            else:
                seq = row.seq
        with self._lock:
            self._stream = (stream, origin)
            self._saved = self._seen = seq
            return seq

    def _renumbered(self, stream: str, origin: str, last_seq: int | None) -> None:
        """`stream` numbers anew from `origin`: rows past `last_seq` (every row, when None)
        take revision 0, and the position is stored as 0 of `origin`, at once."""
        jobs_t = JobRow.__table__  # type: ignore[attr-defined]
        pos_t = StreamPositionRow.__table__  # type: ignore[attr-defined]
        stmt = self._insert(pos_t).values(stream=stream, origin=origin, seq=0)
        with self.engine.begin() as conn:
            reset = update(jobs_t).where(jobs_t.c.revision > (last_seq or 0)).values(revision=0)
            n = conn.execute(reset).rowcount
            conn.execute(stmt.on_conflict_do_update(index_elements=["stream"],
                                                    set_={"origin": stmt.excluded.origin, "seq": 0}))
        log.warning("history: stream %s numbers anew (%s): %d job rows take its records whatever their revision",
                    stream, "created anew" if last_seq is None else f"its last sequence {last_seq} below the "
                    "position stored", n)

    def _save_position(self, seq: int) -> None:
        if self._stream is None or seq <= self._saved:
            return
        t = StreamPositionRow.__table__  # type: ignore[attr-defined]
        stream, origin = self._stream
        stmt = self._insert(t).values(stream=stream, origin=origin, seq=seq)
        stmt = stmt.on_conflict_do_update(
            index_elements=["stream"], set_={"origin": stmt.excluded.origin, "seq": stmt.excluded.seq},
            # Never backwards: another replica's writer may have stored a later one.
            where=or_(t.c.seq < stmt.excluded.seq, t.c.origin != stmt.excluded.origin))
        with self.engine.begin() as conn:
            conn.execute(stmt)
        self._saved = seq

    def flush(self) -> int:
        """Write the queued records; on failure they are queued again (unless a newer
        revision arrived meanwhile) and the error is raised. Once all are written, the
        position followed (see `follow`) moves up to the newest revision queued."""
        with self._lock:
            pending = sorted(self._pending.items())
            self._pending.clear()
            seen = self._seen
        written = self._write_all(pending)
        self._save_position(seen)
        return written

    def _write_all(self, pending: list[tuple[str, tuple[Job | bytes, int]]]) -> int:
        """Write `pending` (sorted by id, so concurrent writers lock job rows in the same
        order) _WRITE_CHUNK jobs at a time, each chunk decoded only as it is written: a
        backlog stays bytes, a decoded job takes several times the memory of its record
        (found by exploring: a database outage's backlog grew sixfold in the historian when
        decoded at once, and was queued again decoded). On a failure, what was not written
        is queued again as it was (bytes, unless a newer revision came meanwhile)."""
        written = i = 0
        chunk: list[tuple[Job, int]] | None = None
        try:
            for i in range(0, len(pending), _WRITE_CHUNK):
                chunk = None
                chunk = self._decoded(pending[i : i + _WRITE_CHUNK])
                if chunk:
                    self.dropped += write_isolating(self._write, chunk, lambda b: self._write(b, sanitize=True),
                                                    what=lambda b: f"job {b[0][0].id}")
                written += len(chunk)
        except Exception:
            # (the records of the chunk that did not decode were dropped and counted already)
            undecodable = set() if chunk is None else (
                {job_id for job_id, _ in pending[i : i + _WRITE_CHUNK]} - {job.id for job, _ in chunk})
            for job_id, (job, rev) in pending[i:]:
                if job_id not in undecodable:
                    self._queue(job_id, job, rev)
            raise
        return written

    def database_id(self) -> str:
        """This database's own identity, drawn at random the first time it is asked and kept
        in it (a row of `stream_positions` under `DATABASE_ID_KEY`): what tells two SQLite
        files at the same path on two machines apart."""
        with Session(self.engine) as s:
            row = s.get(StreamPositionRow, DATABASE_ID_KEY)
        if row is not None:
            return row.origin
        t = StreamPositionRow.__table__  # type: ignore[attr-defined]
        stmt = self._insert(t).values(stream=DATABASE_ID_KEY, origin=uuid.uuid4().hex, seq=0)
        with self.engine.begin() as conn:
            conn.execute(stmt.on_conflict_do_nothing(index_elements=["stream"]))
        with Session(self.engine) as s:
            row = s.get(StreamPositionRow, DATABASE_ID_KEY)
        assert row is not None
        return row.origin

    def _insert(self, table: Any) -> Any:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        return insert(table)

    def _write(self, batch: Sequence[tuple[Job, int]], sanitize: bool = False) -> None:
        """Write jobs (their rows, attempts and events) in one transaction; with `sanitize`,
        text the database refuses (NUL characters) is removed from every row first."""
        jobs_t = JobRow.__table__  # type: ignore[attr-defined]
        clean = without_nul if sanitize else _same
        rows = [clean(job_row(job, rev)) for job, rev in batch]
        with self.engine.begin() as conn:
            # executemany: SQLAlchemy batches the rows into multi-row INSERTs ("insertmanyvalues"),
            # RETURNING included, and caches the compiled statement.
            stmt = self._insert(jobs_t)
            stmt = stmt.on_conflict_do_update(
                index_elements=["id"],
                set_={c: stmt.excluded[c] for c in rows[0] if c != "id"},
                where=jobs_t.c.revision < stmt.excluded.revision,
            ).returning(jobs_t.c.id)
            # Only the jobs whose row this revision replaced (and now holds locked) get
            # their attempts and events written: a newer revision already has them all.
            applied = set(conn.execute(stmt, rows).scalars())
            self._write_details(conn, [job for job, _rev in batch if job.id in applied], clean)

    def _write_details(self, conn: Connection, jobs: Sequence[Job],
                       clean: Callable[[dict[str, object]], dict[str, object]] = _same) -> None:
        """The attempts and events of `jobs`, whose rows this transaction has written."""
        attempts: dict[str, dict[str, object]] = {}
        events: dict[str, dict[str, object]] = {}
        for job in jobs:
            for row in attempt_rows(job):
                attempts[str(row["id"])] = clean(row)
            for e in job_events(job):
                events[str(e["id"])] = clean(e)
        if attempts:
            att_t = AttemptRow.__table__  # type: ignore[attr-defined]
            arows = list(attempts.values())
            stmt = self._insert(att_t)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=["id"], set_={c: stmt.excluded[c] for c in arows[0] if c != "id"}), arows)
        if events:
            stmt = self._insert(EventRow.__table__)  # type: ignore[attr-defined]
            conn.execute(stmt.on_conflict_do_nothing(index_elements=["id"]), list(events.values()))

    def unfinished_before(self, cutoff: float, after: tuple[float, str] | None = None,
                          limit: int = 500) -> list[tuple[Job, int]]:
        """Jobs history holds in a state not finished and last updated before `cutoff`, with
        their rows' revisions, oldest update first (then by id); `after`: past that
        (updated_at, id) (a keyset page). What reconciliation (server.history.reconcile)
        looks for in the state bucket."""
        updated, ident = col(JobRow.updated_at), col(JobRow.id)
        q = select(JobRow).where(col(JobRow.state).not_in(FINISHED_STATES), updated < cutoff)
        if after is not None:
            q = q.where(_past(updated, ident, after, False))
        with Session(self.engine) as s:
            rows = s.exec(q.order_by(updated, ident).limit(limit)).all()
            return [(Job.model_validate_json(r.doc), r.revision) for r in rows]

    def settle(self, ended: Sequence[tuple[Job, int]]) -> int:
        """Write jobs that reconciliation found ended (each with the revision its row was
        read at) over their rows, with their attempts and events: each only while its row
        still holds that revision and a state not finished, so a record written meanwhile
        wins. The revision stays: any later record of the job is newer. Returns how many
        rows were written."""
        jobs_t = JobRow.__table__  # type: ignore[attr-defined]
        written: list[Job] = []
        with self.engine.begin() as conn:
            for job, rev in sorted(ended, key=lambda e: e[0].id):  # in the order writers lock rows
                row = job_row(job, rev)
                res = conn.execute(
                    update(jobs_t)
                    .where(jobs_t.c.id == job.id, jobs_t.c.revision == rev,
                           jobs_t.c.state.not_in(FINISHED_STATES))
                    .values(state=row["state"], updated_at=row["updated_at"], doc=row["doc"]))
                if res.rowcount == 1:
                    written.append(job)
            self._write_details(conn, written)
        return len(written)

    def prune(self, now: float | None = None) -> int:
        """Delete finished jobs last updated more than `retention_days` before `now`, with
        their attempts and events; returns how many jobs went. No-op without retention."""
        if self.retention_days is None:
            return 0
        cutoff = (time.time() if now is None else now) - self.retention_days * 86400.0
        total = 0
        while True:
            with self.engine.begin() as conn:
                # Lock the job rows first (the order writers use), skipping rows a writer
                # or another replica's prune holds.
                q = (select(JobRow.id)
                     .where(col(JobRow.state).in_(FINISHED_STATES), col(JobRow.updated_at) < cutoff)
                     .order_by(col(JobRow.updated_at)).limit(_PRUNE_CHUNK)
                     .with_for_update(skip_locked=True))
                ids = list(conn.execute(q).scalars())
                if ids:
                    conn.execute(delete(EventRow).where(col(EventRow.job_id).in_(ids)))
                    conn.execute(delete(AttemptRow).where(col(AttemptRow.job_id).in_(ids)))
                    conn.execute(delete(JobRow).where(col(JobRow.id).in_(ids)))
            total += len(ids)
            if len(ids) < _PRUNE_CHUNK:
                return total

    def prune_events(self, now: float | None = None) -> int:
        """Delete the events and alerts older than `retention_days` before `now` that no
        job in history holds: those of no job (a host's, a queue's, most alerts), and those
        of a job history no longer has (pruned before the event was recorded), in
        transactions of at most 1,000 (found by exploring: `prune` went by jobs, and these
        were kept for ever). Returns how many went. No-op without retention."""
        if self.retention_days is None:
            return 0
        cutoff = (time.time() if now is None else now) - self.retention_days * 86400.0
        ev, jobs_t = EventRow.__table__, JobRow.__table__  # type: ignore[attr-defined]
        orphan = or_(ev.c.job_id.is_(None), ~sa_select(jobs_t.c.id).where(jobs_t.c.id == ev.c.job_id).exists())
        total = 0
        while True:
            with self.engine.begin() as conn:
                ids = list(conn.execute(sa_select(ev.c.id).where(ev.c.ts < cutoff, orphan)
                                        .order_by(ev.c.ts).limit(_PRUNE_CHUNK)).scalars())
                if ids:
                    conn.execute(delete(EventRow).where(col(EventRow.id).in_(ids)))
            total += len(ids)
            if len(ids) < _PRUNE_CHUNK:
                return total

    async def run(self, stop: asyncio.Event, every_s: float = FLUSH_EVERY_S, prune_every_s: float = 60.0,
                  health: WriteHealth | None = None) -> None:
        """Flush pending records until `stop`; a last flush on the way out. With retention
        set, prune about every `prune_every_s` seconds. `health` is told of each flush's
        failure or success."""
        next_prune = time.monotonic()
        while not stop.is_set():
            await pause(stop, every_s)
            try:
                await asyncio.to_thread(self.flush)
            except Exception as exc:  # noqa: BLE001 - the database may be restarting; keep going
                log.exception("history flush failed")
                if health is not None:
                    health.failed(time.time(), down_text(exc))
                await asyncio.sleep(1)
            else:
                if health is not None:
                    health.wrote()
            if self.retention_days is not None and time.monotonic() >= next_prune and not stop.is_set():
                next_prune = time.monotonic() + prune_every_s
                try:
                    n = await asyncio.to_thread(self.prune)
                    if n:
                        log.info("history: pruned %d finished jobs older than %g days", n, self.retention_days)
                    n = await asyncio.to_thread(self.prune_events)
                    if n:
                        log.info("history: pruned %d events of no job older than %g days", n, self.retention_days)
                except Exception:  # noqa: BLE001
                    log.exception("history prune failed")
        await asyncio.to_thread(self.flush)

    # ------------------------------------------------------------ reading

    def get_job(self, job_id: str) -> Job | None:
        with Session(self.engine) as s:
            row = s.get(JobRow, job_id)
            return Job.model_validate_json(row.doc) if row else None

    def get_jobs(self, ids: Sequence[str]) -> dict[str, Job]:
        """The recorded jobs of `ids` (those it has), by id, by the primary key, 500 at a time."""
        found: dict[str, Job] = {}
        ids = list(ids)
        with Session(self.engine) as s:
            for i in range(0, len(ids), 500):
                for row in s.exec(select(JobRow).where(col(JobRow.id).in_(ids[i:i + 500]))).all():
                    found[row.id] = Job.model_validate_json(row.doc)
        return found

    def job_states(self, ids: Sequence[str]) -> dict[str, str]:
        """Those of `ids` that history has a job of, with the state it holds for each (by
        the primary key, 500 at a time)."""
        found: dict[str, str] = {}
        ids = list(ids)
        with Session(self.engine) as s:
            for i in range(0, len(ids), 500):
                q = select(JobRow.id, JobRow.state).where(col(JobRow.id).in_(ids[i:i + 500]))
                found.update((str(j), str(st)) for j, st in s.exec(q).all())
        return found

    def count_by_state(self, states: Sequence[str]) -> dict[str, int]:
        """How many jobs history holds in each of `states`, in one query."""
        with Session(self.engine) as s:
            found = s.exec(select(JobRow.state, func.count()).where(col(JobRow.state).in_(list(states)))
                           .group_by(JobRow.state)).all()
        return {st: 0 for st in states} | {str(st): int(n) for st, n in found}

    def _name_prefix(self, prefix: str) -> Any:
        name = col(JobRow.name)
        if self.dialect == "sqlite":
            # SQLite's LIKE ignores case; a binary range is exact and uses the index.
            return and_(name >= prefix, name < prefix + "\U0010ffff")
        return name.startswith(prefix, autoescape=True)

    def list_jobs(
        self,
        *,
        state: str | Sequence[str] | None = None,
        user: str | None = None,
        name: str | None = None,
        priority: int | None = None,
        submitted_after: float | None = None,
        submitted_before: float | None = None,
        queue: str | None = None,
        group: str | None = None,
        sort: str = "-submitted_at",
        limit: int = 50,
        offset: int = 0,
        after: str | None = None,
        counted: bool = True,
    ) -> tuple[list[Job], int]:
        """Jobs matching every given filter, and how many match in all (0 without `counted`:
        the count not asked, for a read that continues a page).

        `state`: one state or several; `name`: a name prefix (case-sensitive); `group`: the
        job's group (`JobSpec.group`);
        `submitted_after` <= submitted_at < `submitted_before`. `sort` is one of
        ``-submitted_at`` (newest first, the default), ``submitted_at``, ``-priority``
        (highest first, then oldest first) and ``priority`` (the exact reverse). Page with
        `offset`, or with `after`: the `job_cursor(last_job, sort)` of the previous page
        (keyset paging, stable and fast however deep). `total` ignores `after`/`offset`.
        """
        if sort not in JOB_SORTS:
            raise ValueError(f"sort must be one of {sorted(JOB_SORTS)}")
        conds: list[Any] = []
        if state:
            states = [state] if isinstance(state, str) else list(state)
            conds.append(col(JobRow.state) == states[0] if len(states) == 1 else col(JobRow.state).in_(states))
        if user is not None:
            conds.append(JobRow.user == user)
        if name:
            conds.append(self._name_prefix(name))
        if priority is not None:
            conds.append(JobRow.priority == priority)
        if queue is not None:
            conds.append(JobRow.queue == queue)
        if group is not None:
            conds.append(JobRow.job_group == group)
        if submitted_after is not None:
            conds.append(JobRow.submitted_at >= submitted_after)
        if submitted_before is not None:
            conds.append(JobRow.submitted_at < submitted_before)
        keys = [(getattr(JobRow, c), desc) for c, desc in JOB_SORTS[sort]]
        q = select(JobRow).where(*conds)
        if after:
            values = json.loads(after)
            if not isinstance(values, list) or len(values) != len(keys):
                raise ValueError("bad cursor for this sort")
            q = q.where(_keyset_after(keys, values))
        q = q.order_by(*[c.desc() if desc else c.asc() for c, desc in keys]).offset(offset).limit(limit)
        cq = select(func.count()).select_from(JobRow).where(*conds)
        with Session(self.engine) as s:
            rows = s.exec(q).all()
            total = s.exec(cq).one() if counted else 0
            return [Job.model_validate_json(r.doc) for r in rows], int(total)

    @staticmethod
    def _event_filters(job_id: str | None, host_id: str | None, kind: str | None,
                       since: float | None) -> list[Any]:
        conds: list[Any] = []
        if job_id is not None:
            conds.append(EventRow.job_id == job_id)
        if host_id is not None:
            conds.append(EventRow.host_id == host_id)
        if kind is not None:
            conds.append(EventRow.kind == kind)
        if since is not None:
            conds.append(EventRow.ts >= since)
        return conds

    def list_events(
        self,
        job_id: str | None = None,
        host_id: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: tuple[float, str] | None = None,
    ) -> list[EventRow]:
        """Events matching every given filter (`since`: ts >= since), oldest first (by time,
        then id); `after`: only those past that (ts, id) in this order (a keyset page)."""
        q = select(EventRow).where(*self._event_filters(job_id, host_id, kind, since))
        ts, ident = col(EventRow.ts), col(EventRow.id)
        if after is not None:
            q = q.where(_past(ts, ident, after, newest_first))
        q = q.order_by(*((ts.desc(), ident.desc()) if newest_first else (ts, ident))).offset(offset).limit(limit)
        with Session(self.engine) as s:
            return list(s.exec(q).all())

    def count_events(self, job_id: str | None = None, host_id: str | None = None, kind: str | None = None,
                     since: float | None = None) -> int:
        return self._count(EventRow, self._event_filters(job_id, host_id, kind, since))

    @staticmethod
    def _attempt_filters(job_id: str | None, host_id: str | None) -> list[Any]:
        conds: list[Any] = []
        if job_id is not None:
            conds.append(AttemptRow.job_id == job_id)
        if host_id is not None:
            conds.append(AttemptRow.host_id == host_id)
        return conds

    def list_attempts(
        self,
        job_id: str | None = None,
        host_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: tuple[float, str] | None = None,
    ) -> list[AttemptRow]:
        """Attempts of a job and/or on a host, by placement time, then id (oldest first);
        `after`: only those past that (placed_at, id) in this order (a keyset page)."""
        q = select(AttemptRow).where(*self._attempt_filters(job_id, host_id))
        placed, ident = col(AttemptRow.placed_at), col(AttemptRow.id)
        if after is not None:
            q = q.where(_past(placed, ident, after, newest_first))
        q = (
            q.order_by(*((placed.desc(), ident.desc()) if newest_first else (placed, ident)))
            .offset(offset)
            .limit(limit)
        )
        with Session(self.engine) as s:
            return list(s.exec(q).all())

    def count_attempts(self, job_id: str | None = None, host_id: str | None = None) -> int:
        return self._count(AttemptRow, self._attempt_filters(job_id, host_id))

    def usage(self, *, queue: str | None = None, user: str | None = None, since: float | None = None,
              until: float | None = None, now: float | None = None) -> list[UsageRow]:
        """Resources used by attempts in [`since`, `until`) (the parts of their runs that
        fall in it; a running attempt counts up to `now`), summed per queue, user and GPU
        model: GPU-seconds, CPU-seconds, memory MB-seconds, how many attempts, the
        GPU-seconds of work lost by those that ended preempted within it, and how busy the
        GPUs were (`UsageRow.gpu_util_pct`)."""
        now = time.time() if now is None else now
        until = now if until is None else min(until, now)
        if since is not None and since >= until:
            return []  # a period ahead (or empty): nothing was used in it
        a = AttemptRow
        end = case((col(a.finished_at).is_(None), now), else_=col(a.finished_at))
        end = case((end > until, until), else_=end)
        start: Any = col(a.started_at)
        if since is not None:
            start = case((start < since, since), else_=start)
        seconds = case((end > start, end - start), else_=0.0)
        conds: list[Any] = [col(a.started_at).is_not(None), col(a.started_at) < until]
        if since is not None:
            conds.append(or_(col(a.finished_at).is_(None), col(a.finished_at) > since))
        if queue is not None:
            conds.append(a.queue == queue)
        if user is not None:
            conds.append(a.user == user)
        # Ended within the period as the attempts counted are: after `since`, by `until`
        # (found by a review: one that ended at a boundary of two adjacent periods had its
        # loss in neither, ending `>= since` while overlapping `> since`).
        ended_within = col(a.finished_at) <= until
        if since is not None:
            ended_within = and_(ended_within, col(a.finished_at) > since)
        lost = case((ended_within, col(a.lost_gpu_s)), else_=0.0)
        # GPU-seconds of the attempts whose agent reported how busy their GPUs were, and
        # those weighted by it: their ratio is the GPUs' utilisation over the period.
        reported = col(a.gpu_util_pct).is_not(None)
        measured = case((reported, seconds * col(a.gpus)), else_=0.0)
        busy = case((reported, seconds * col(a.gpus) * col(a.gpu_util_pct)), else_=0.0)
        keys = (col(a.queue), col(a.user), col(a.gpu_model))
        q = (sa_select(*keys, func.sum(seconds * col(a.gpus)), func.sum(seconds * col(a.cpus)),
                       func.sum(seconds * col(a.memory_mb)), func.count(), func.sum(lost), func.sum(measured),
                       func.sum(busy))
             .where(*conds).group_by(*keys).order_by(*keys))
        with self.engine.connect() as conn:
            return [UsageRow(str(r[0]), str(r[1]), str(r[2]), float(r[3] or 0), float(r[4] or 0), float(r[5] or 0),
                             int(r[6]), float(r[7] or 0),
                             round(float(r[9]) / float(r[8]), 1) if r[8] else None)
                    for r in conn.execute(q).all()]

    def list_alerts(self, kind: str | None = None, limit: int = 50, offset: int = 0,
                    after: tuple[float, str] | None = None) -> tuple[list[EventRow], int]:
        """Recorded alerts, newest first (by time, then id), and how many there are; `kind`
        like "host.lost"; `after`: only those older than that (ts, id) (a keyset page)."""
        with Session(self.engine) as s:
            kind_col = col(EventRow.kind)
            ts, ident = col(EventRow.ts), col(EventRow.id)
            cond = kind_col == f"alert.{kind}" if kind else kind_col.startswith("alert.")
            q = select(EventRow).where(cond)
            if after is not None:
                q = q.where(_past(ts, ident, after, True))
            rows = s.exec(q.order_by(ts.desc(), ident.desc()).offset(offset).limit(limit)).all()
            # The count as a range on `kind` (what LIKE 'alert.%' means where text compares
            # byte by byte), so that it can use the kind index instead of scanning every
            # event: 7 ms instead of 330 ms at 2.7 M events. Under a language's collation
            # (en_US, what the compose PostgreSQL makes) '.' and '/' are all but ignored and
            # the range matched nothing (found by exploring: totalCount 0 beside 5 alerts).
            bytewise = not kind and self._orders_bytewise(s)
            count_cond = (kind_col >= "alert.") & (kind_col < "alert/") if bytewise else cond
            total = s.exec(select(func.count()).select_from(EventRow).where(count_cond)).one()
            return list(rows), int(total)

    def _orders_bytewise(self, s: Session) -> bool:
        """Whether the database orders `kind`'s text so that every 'alert.<...>' lies between
        'alert.' and 'alert/' (SQLite; PostgreSQL with the C or POSIX collation, not a
        language's, which all but ignores punctuation), asked of it once."""
        if self._bytewise is None:
            if self.dialect != "postgresql":
                self._bytewise = True
            else:
                probe = text("SELECT 'alert.~~~' < 'alert/' AND 'alert.' < 'alert.-' AND 'alert-' < 'alert.'")
                self._bytewise = bool(s.connection().execute(probe).scalar_one())
        return self._bytewise

    def _count(self, table: Any, conds: list[Any]) -> int:
        with Session(self.engine) as s:
            return int(s.exec(select(func.count()).select_from(table).where(*conds)).one())

    def events_for_job(self, job_id: str) -> list[EventRow]:
        with Session(self.engine) as s:
            q = select(EventRow).where(EventRow.job_id == job_id).order_by(col(EventRow.ts), col(EventRow.id))
            return list(s.exec(q).all())

    def close(self) -> None:
        self._engine.dispose()

    @property
    def engine(self) -> Engine:
        """The database, its schema up to date: brought up to date first when it was not
        (raises the database's error while it cannot be, trying again at most every
        SCHEMA_RETRY_S)."""
        if not self._schema_ok:
            with self._schema_lock:
                if not self._schema_ok:
                    if self._schema_error is not None and time.monotonic() - self._schema_tried < SCHEMA_RETRY_S:
                        raise self._schema_error
                    self._upgrade_schema()
        return self._engine

    def _upgrade_schema(self) -> None:
        self._schema_tried = time.monotonic()
        try:
            upgrade_schema(self._engine)
        except (*DATABASE_DOWN, OSError) as exc:  # (OSError: SQLite's lock file where it cannot be made)
            # Said as the database being down, so that no write takes it for rows refused.
            self._schema_error = exc if isinstance(exc, DATABASE_DOWN) else OperationalError(
                "upgrading the history schema", None, exc)
            raise self._schema_error from None
        self._schema_ok, self._schema_error = True, None


def _past(first: Any, second: Any, key: tuple[float, str], descending: bool) -> Any:
    """Rows strictly past `key` in the order (first, second), ascending or descending: the
    condition of a keyset page (written out, not as a row value, for every database)."""
    a, b = key
    if descending:
        return or_(first < a, and_(first == a, second < b))
    return or_(first > a, and_(first == a, second > b))


@dataclass(frozen=True)
class UsageRow:
    """Usage of one queue, user and GPU model over a period (`History.usage`)."""

    queue: str
    user: str
    gpu_model: str
    gpu_seconds: float
    cpu_seconds: float
    memory_mb_seconds: float
    attempts: int
    # GPU-seconds of work lost by its attempts that ended preempted in the period.
    lost_gpu_seconds: float = 0.0
    # Its GPUs' mean utilisation over the period, weighted by GPU-seconds, from the
    # attempts whose agent reported it at their end (None: none did; a running attempt
    # has not yet).
    gpu_util_pct: float | None = None


def _keyset_after(keys: Sequence[tuple[Any, bool]], values: Sequence[Any]) -> Any:
    """Rows strictly after `values` in the order given by `keys` ((column, descending))."""
    if len({desc for _, desc in keys}) == 1:
        cols = tuple_(*[c for c, _ in keys])
        vals = tuple_(*values)
        return cols < vals if keys[0][1] else cols > vals
    clauses = []
    for i, (column, desc) in enumerate(keys):
        eq = [c == v for (c, _), v in zip(keys[:i], values[:i], strict=True)]
        clauses.append(and_(*eq, column < values[i] if desc else column > values[i]))
    return or_(*clauses)
