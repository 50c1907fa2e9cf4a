"""History on SQLite (a file per test): Alembic migrations, idempotent mirroring,
concurrent replicas, filters and sorting, retention, 5,000 jobs. The tests that take a
`db_url` run on PostgreSQL too, from tests/integration/test_history.py."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import func, inspect, text
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, SQLModel, select

import server.history.database as history_mod
from server.history.database import History, alembic_config, job_cursor
from server.history.models import AttemptRow, EventRow, JobRow
from tests.factories import job, job_spec
from wire.messages import Attempt, AttemptState, Job, JobState, encode

DAY = 86400.0


@pytest.fixture(params=["sqlite"])
def db_url(tmp_path: Path) -> str:
    """A history database in a file: SQLite here; tests/integration/test_history.py runs
    the same tests on PostgreSQL."""
    return f"sqlite:///{tmp_path / 'history.db'}"


@pytest.fixture
def hist(db_url: str):  # type: ignore[no-untyped-def]
    h = History(db_url)
    yield h
    h.close()


TRAIN = ["python", "train.py"]  # what every job of these tests runs


def lifecycle(jid: str, t0: float = 1000.0, *, name: str = "train", user: str = "alice",
              priority: int = 0, final: JobState = JobState.SUCCEEDED) -> list[Job]:
    """The successive records of a job: QUEUED, PLACED, RUNNING, then `final`."""
    s = job_spec(name, command=TRAIN, user=user, priority=priority, gpus=1)
    a_id = f"{jid}-a1"
    queued = job(jid, spec=s, submitted_at=t0)
    placed = job(jid, spec=s, state=JobState.PLACED, submitted_at=t0, updated_at=t0 + 1,
                 attempts=[Attempt(id=a_id, number=1, host_id="h1", gpu_indices=[0], placed_at=t0 + 1)])
    running = job(jid, spec=s, state=JobState.RUNNING, submitted_at=t0, updated_at=t0 + 2,
                  attempts=[Attempt(id=a_id, number=1, host_id="h1", gpu_indices=[0], state=AttemptState.RUNNING,
                                    placed_at=t0 + 1, started_at=t0 + 2)])
    astate = {JobState.SUCCEEDED: AttemptState.SUCCEEDED, JobState.FAILED: AttemptState.FAILED,
              JobState.CANCELLED: AttemptState.KILLED, JobState.TIMEOUT: AttemptState.TIMEOUT}[final]
    done = job(jid, spec=s, state=final, submitted_at=t0, updated_at=t0 + 10,
               attempts=[Attempt(id=a_id, number=1, host_id="h1", gpu_indices=[0], state=astate,
                                 placed_at=t0 + 1, started_at=t0 + 2, finished_at=t0 + 10,
                                 exit_code=0 if final == JobState.SUCCEEDED else 1)])
    return [queued, placed, running, done]


def job_in_state(jid: str, t: float, *, state: JobState = JobState.QUEUED, name: str = "train", user: str = "alice",
                 priority: int = 0, updated: float | None = None) -> Job:
    """A job submitted at `t` and now in `state`: a record of its `lifecycle` (finished
    ones carry one finished attempt), last updated at `updated` if given."""
    if state == JobState.QUEUED:
        return job(jid, spec=job_spec(name, command=TRAIN, user=user, priority=priority, gpus=1), submitted_at=t,
                   updated_at=updated or t)
    final = state if state.terminal else JobState.SUCCEEDED
    j = lifecycle(jid, t, name=name, user=user, priority=priority, final=final)
    j = j[{JobState.PLACED: 1, JobState.RUNNING: 2}.get(state, 3)]
    if updated is not None:
        j.updated_at = updated
    return j


def counts(h: History) -> tuple[int, int, int]:
    with Session(h.engine) as s:
        return tuple(int(s.exec(select(func.count()).select_from(t)).one())  # type: ignore[return-value]
                     for t in (JobRow, AttemptRow, EventRow))


# ---------------------------------------------------------------- migrations


def _schema_diff(h: History) -> list[object]:
    with h.engine.connect() as conn:
        mc = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(mc, SQLModel.metadata))


def test_migrations_apply_and_match_models(db_url: str) -> None:
    h = History(db_url)
    h2 = History(db_url)  # a second upgrade is a no-op
    try:
        assert _schema_diff(h) == []
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        with h.engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == head
        names = {ix["name"] for t in ("jobs", "attempts", "events") for ix in inspect(h.engine).get_indexes(t)}
        assert {"ix_jobs_state_submitted_at", "ix_jobs_user_submitted_at", "ix_jobs_name",
                "ix_jobs_priority_order", "ix_jobs_submitted_at", "ix_attempts_job_id",
                "ix_attempts_host_id_placed_at", "ix_events_job_id_ts", "ix_events_host_id_ts",
                "ix_events_kind_ts", "ix_events_ts"} <= names
        if h.dialect == "postgresql":  # compare_metadata does not look at operator classes
            with h.engine.connect() as conn:
                ddl = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_jobs_name'")).scalar()
            assert "text_pattern_ops" in str(ddl)
    finally:
        h.close()
        h2.close()


def test_a_database_a_newer_release_migrated_is_used_as_it_is(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A rolling upgrade: a newer replica migrated the database past this release's head.
    This release's replicas still open it, as it is, and write to it (found by a review:
    they could not start, Alembic not knowing the revision)."""
    h = History(db_url)
    with h.engine.begin() as conn:  # what a newer release's migration 0008 leaves
        conn.execute(text("UPDATE alembic_version SET version_num = '0008_newer_release'"))
    h.close()
    h = History(db_url)
    try:
        with h.engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == "0008_newer_release"
        assert "newer than this release's" in caplog.text
        h.record(lifecycle("j1")[-1], 4)
        h.flush()
        assert h.get_job("j1") is not None
    finally:
        h.close()


def test_adopts_pre_alembic_database(db_url: str) -> None:
    """A database made by the old create_all (no alembic_version, single-column indexes)."""
    h = History(db_url)
    with h.engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
        for name in _initial_indexes():
            conn.execute(text(f"DROP INDEX IF EXISTS {name}"))  # 0003 dropped one of them
        for table, names in _legacy_indexes().items():
            for name in names:
                col = name.removeprefix(f"ix_{table}_")
                conn.execute(text(f'CREATE INDEX {name} ON {table} ("{col}")'))
    h.record(lifecycle("j1")[-1], 4)
    h.flush()
    h.close()
    h = History(db_url)
    try:
        assert _schema_diff(h) == []
        assert h.get_job("j1") is not None
    finally:
        h.close()


def test_the_group_column_is_filled_from_the_documents_of_rows_written_before_it(db_url: str) -> None:
    """Migration 0004 on a database at 0003 with rows: each row's group from its job
    document, so the group filter finds the jobs written before the column was there."""
    from alembic import command

    h = History(db_url)
    grouped = job_in_state("g1", 1000.0, state=JobState.SUCCEEDED)
    grouped = grouped.model_copy(update={"spec": grouped.spec.model_copy(update={"group": "sweep#ab"})})
    h.record(grouped, 3)
    h.record(job_in_state("g2", 1001.0), 1)
    h.flush()
    with h.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0003_job_order")
    assert "job_group" not in {c["name"] for c in inspect(h.engine).get_columns("jobs")}
    h.close()
    h = History(db_url)  # upgraded to head again
    try:
        assert _schema_diff(h) == []
        assert [j.id for j in h.list_jobs(group="sweep#ab")[0]] == ["g1"]
        assert [j.id for j in h.list_jobs(group="")[0]] == ["g2"]
    finally:
        h.close()


def _initial_indexes() -> dict[str, tuple[str, list[str], dict[str, object]]]:
    return _initial_module().INDEXES  # type: ignore[no-any-return]


def _legacy_indexes() -> dict[str, list[str]]:
    return _initial_module().LEGACY_INDEXES  # type: ignore[no-any-return]


def _initial_module():  # type: ignore[no-untyped-def]
    import importlib.util

    path = history_mod.MIGRATIONS_DIR / "versions" / "0001_initial.py"
    spec_ = importlib.util.spec_from_file_location("muster_migration_0001", path)
    assert spec_ and spec_.loader
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- writing


def test_a_history_whose_database_is_down_at_start_comes_up_when_it_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: a replica could not start while PostgreSQL was down (its schema
    upgrade raised at start), though history is not on the scheduling path. It starts; what
    reads or writes the history meanwhile gets the database's error; once the database
    answers, the schema is brought up to date and the queued records written."""
    monkeypatch.setattr(history_mod, "SCHEMA_RETRY_S", 0.0)
    later = tmp_path / "not-yet"
    hist = History(f"sqlite:///{later}/history.db")  # (its directory missing: the database cannot be opened)
    try:
        with pytest.raises(OperationalError):
            hist.get_job("j1")
        for rev, j in enumerate(lifecycle("j1"), start=1):
            hist.record(j, rev)
        with pytest.raises(OperationalError):
            hist.flush()  # (kept for the next flush)
        later.mkdir()
        hist.flush()
        got = hist.get_job("j1")
        assert got is not None and got.state == JobState.SUCCEEDED and counts(hist) == (1, 1, 5)
    finally:
        hist.close()


@pytest.mark.parametrize("flush_each", [False, True])
def test_lifecycle_one_row_and_full_timeline(hist: History, flush_each: bool) -> None:
    for rev, j in enumerate(lifecycle("j1"), start=1):
        hist.record(j, rev)
        if flush_each:
            hist.flush()
    hist.flush()
    assert counts(hist) == (1, 1, 5)
    got = hist.get_job("j1")
    assert got is not None and got.state == JobState.SUCCEEDED
    kinds = [e.kind for e in hist.events_for_job("j1")]
    assert kinds == ["job.submitted", "attempt.placed", "attempt.started", "attempt.succeeded", "job.succeeded"]
    (att,) = hist.list_attempts(job_id="j1")
    assert (att.state, att.host_id, att.started_at, att.finished_at, att.exit_code) == ("SUCCEEDED", "h1", 1002.0,
                                                                                         1010.0, 0)
    with Session(hist.engine) as s:
        row = s.get(JobRow, "j1")
        assert row is not None and (row.revision, row.state, row.updated_at) == (4, "SUCCEEDED", 1010.0)


def test_jobs_are_read_many_at_once_by_id(hist: History) -> None:
    """History.get_jobs: the jobs it has of the ids asked (past one query's 500), as
    get_job reads each; those it has not left out."""
    for i in range(0, 600, 100):
        hist.record(lifecycle(f"many-{i:04d}")[-1], 1)
    hist.flush()
    ids = [f"many-{i:04d}" for i in range(600)]
    got = hist.get_jobs(ids)
    assert sorted(got) == [f"many-{i:04d}" for i in range(0, 600, 100)]
    assert got["many-0500"] == hist.get_job("many-0500") and hist.get_jobs([]) == {}


def test_raw_records_decoded_only_when_newest(hist: History) -> None:
    """The historian queues job records as stored; only the newest revision of each job
    is decoded at flush, so a superseded one is never looked at, and a newest one that
    does not decode (or names another job) is dropped and counted, not written."""
    revs = lifecycle("j1")
    hist.record_raw("j1", b"{not json", 1)  # superseded before the flush: never decoded
    hist.record_raw("j1", encode(revs[3]), 4)
    hist.record_raw("j1", encode(revs[1]), 2)  # older than what is queued: ignored
    hist.record_raw("j2", b"{not json", 7)
    hist.record_raw("j3", encode(lifecycle("other")[0]), 1)  # the record of another job
    assert hist.flush() == 1
    assert hist.dropped == 2
    assert counts(hist) == (1, 1, 5)
    got = hist.get_job("j1")
    assert got is not None and got.state == JobState.SUCCEEDED
    assert hist.get_job("j2") is None and hist.get_job("j3") is None and hist.get_job("other") is None
    with Session(hist.engine) as s:
        row = s.get(JobRow, "j1")
        assert row is not None and row.revision == 4


def test_retry_keeps_every_attempt(hist: History) -> None:
    revs = lifecycle("j1")
    lost = revs[2].model_copy(deep=True)
    lost.attempts[0].state, lost.attempts[0].finished_at, lost.state = AttemptState.LOST, 1005.0, JobState.QUEUED
    retry = revs[3].model_copy(deep=True)
    retry.attempts = [lost.attempts[0], Attempt(id="j1-a2", number=2, host_id="h2", state=AttemptState.SUCCEEDED,
                                                placed_at=1006.0, started_at=1007.0, finished_at=1010.0, exit_code=0)]
    for rev, j in enumerate([*revs[:3], lost, retry], start=1):
        hist.record(j, rev)
    hist.flush()
    assert [a.id for a in hist.list_attempts(job_id="j1")] == ["j1-a1", "j1-a2"]
    assert [a.id for a in hist.list_attempts(host_id="h2")] == ["j1-a2"]
    kinds = [e.kind for e in hist.events_for_job("j1")]
    assert kinds == ["job.submitted", "attempt.placed", "attempt.started", "attempt.lost",
                     "attempt.placed", "attempt.started", "attempt.succeeded", "job.succeeded"]


def test_older_revision_never_overwrites_newer(db_url: str) -> None:
    a, b = History(db_url), History(db_url)
    try:
        revs = lifecycle("j1")
        a.record(revs[3], 4)
        a.flush()
        b.record(revs[1], 2)  # a replica late with an old record
        b.flush()
        a.record(revs[2], 3)
        a.flush()
        got = b.get_job("j1")
        assert got is not None and got.state == JobState.SUCCEEDED
        (att,) = b.list_attempts(job_id="j1")
        assert att.state == "SUCCEEDED" and att.finished_at == 1010.0
        with Session(a.engine) as s:
            assert s.get(JobRow, "j1").revision == 4  # type: ignore[union-attr]
        assert counts(a) == (1, 1, 5)
    finally:
        a.close()
        b.close()


def test_replicas_write_concurrently_once(db_url: str) -> None:
    """Two replicas see the same job revisions (in different orders and batches) at once."""
    n_jobs = 60
    revisions = [(rev, j) for i in range(n_jobs) for rev, j in
                 enumerate(lifecycle(f"j{i:03d}", 1000.0 + i, user=f"u{i % 3}"), start=1)]
    replicas = [History(db_url) for _ in range(2)]
    errors: list[BaseException] = []

    def replica(h: History, seed: int) -> None:
        try:
            items = list(revisions)
            random.Random(seed).shuffle(items)
            for k, (rev, j) in enumerate(items):
                h.record(j, rev)
                if k % 7 == 0:
                    for _ in range(5):  # a PostgreSQL deadlock/serialisation error is retried
                        try:
                            h.flush()
                            break
                        except Exception:  # noqa: BLE001
                            pass
            h.flush()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(h, seed)) for seed, h in enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not errors, errors
        assert counts(replicas[0]) == (n_jobs, n_jobs, 5 * n_jobs)
        jobs, total = replicas[1].list_jobs(limit=1000)
        assert total == n_jobs and all(j.state == JobState.SUCCEEDED for j in jobs)
        with Session(replicas[0].engine) as s:
            assert set(s.exec(select(JobRow.revision)).all()) == {4}
            assert set(s.exec(select(AttemptRow.state)).all()) == {"SUCCEEDED"}
        for i in range(0, n_jobs, 7):
            assert len(replicas[0].events_for_job(f"j{i:03d}")) == 5
    finally:
        for h in replicas:
            h.close()


def test_failed_flush_requeues(tmp_path: Path) -> None:
    h = History(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        h.record(lifecycle("j1")[0], 1)
        real = h._write

        def boom(batch, sanitize=False):  # type: ignore[no-untyped-def]
            raise OperationalError("INSERT", {}, Exception("database restarting"))

        h._write = boom  # type: ignore[method-assign]
        with pytest.raises(OperationalError):  # the database is down: nothing dropped, all requeued
            h.flush()
        h._write = real  # type: ignore[method-assign]
        assert h.flush() == 1
        assert h.get_job("j1") is not None
    finally:
        h.close()


def test_a_failed_flush_keeps_its_records_as_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: a flush decoded the whole backlog at once and, when the database
    was down, queued it again decoded: the historian's memory grew about sixfold during
    an outage. Records are decoded a chunk at a time as they are written; what a failed
    flush did not write is queued again as the bytes it came as."""
    monkeypatch.setattr(history_mod, "_WRITE_CHUNK", 2)
    h = History(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        for i in range(7):
            h.record_raw(f"j{i}", encode(lifecycle(f"j{i}")[2]), i + 1)
        h.record_raw("j9", b"{not json", 9)  # dropped once, at its chunk's decoding
        real = h._write
        calls = []

        def second_fails(batch, sanitize=False):  # type: ignore[no-untyped-def]
            calls.append([j.id for j, _ in batch])
            if len(calls) == 2:
                raise OperationalError("INSERT", {}, Exception("database restarting"))
            real(batch, sanitize)

        h._write = second_fails  # type: ignore[method-assign]
        with pytest.raises(OperationalError):
            h.flush()
        assert calls == [["j0", "j1"], ["j2", "j3"]]  # decoded a chunk at a time
        assert h.get_job("j1") is not None and h.get_job("j2") is None
        assert sorted(h._pending) == ["j2", "j3", "j4", "j5", "j6", "j9"]
        assert all(isinstance(raw, bytes) for raw, _rev in h._pending.values())
        assert h.dropped == 0
        h._write = real  # type: ignore[method-assign]
        assert h.flush() == 5 and h.dropped == 1
        assert all(h.get_job(f"j{i}").state is JobState.RUNNING for i in range(7))  # type: ignore[union-attr]
    finally:
        h.close()


def test_the_stream_position_moves_only_once_what_came_before_it_is_written(db_url: str) -> None:
    """`follow`: each flush stores the newest revision queued before it, after its writes
    and not on their failure; never backwards (two writers); a stream of another origin
    starts at 0. Revisions past 2**31 (a busy cluster's state stream) fit."""
    a, b = History(db_url), History(db_url)
    big = 2**31 + 5
    try:
        assert a.follow("KV_state", "t0") == 0
        a.record_raw("j1", encode(lifecycle("j1")[0]), big)
        real = a._write

        def boom(batch, sanitize=False):  # type: ignore[no-untyped-def]
            raise OperationalError("INSERT", {}, Exception("database restarting"))

        a._write = boom  # type: ignore[method-assign]
        with pytest.raises(OperationalError):
            a.flush()
        assert b.follow("KV_state", "t0") == 0  # not written: the position stays
        a._write = real  # type: ignore[method-assign]
        assert a.flush() == 1
        assert b.follow("KV_state", "t0") == big
        with Session(a.engine) as s:
            assert s.get(JobRow, "j1").revision == big  # type: ignore[union-attr]
        a.record_raw("j2", encode(lifecycle("j2")[0]), big + 10)
        a.flush()
        b.record_raw("j1", encode(lifecycle("j1")[1]), big + 3)  # a writer behind the other
        b.flush()
        assert b.follow("KV_state", "t0") == big + 10
        assert a.follow("KV_state", "t1") == 0  # a stream made anew
        a.record_raw("j3", encode(lifecycle("j3")[0]), 7)
        a.flush()
        assert b.follow("KV_state", "t1") == 7
    finally:
        a.close()
        b.close()


def test_records_of_a_stream_numbered_anew_replace_rows_of_the_old_numbering(db_url: str) -> None:
    """Found by exploring: rows are replaced only by a higher revision, so once the state
    stream numbered anew (created anew; or put back from a backup, with its creation time
    and fewer records than the position stored) history never took a job's records again.
    `follow` finding the stream numbered anew lets its records replace the rows of the old
    numbering (all of them for a stream created anew; those past its last sequence for one
    put back), and stores position 0 of it."""
    h = History(db_url)
    try:
        revs = lifecycle("j1")
        assert h.follow("KV_state", "t0", last_seq=0) == 0
        h.record(revs[2], 500)  # RUNNING at 500
        h.record(lifecycle("j2")[2], 90)
        h.flush()
        assert h.follow("KV_state", "t0", last_seq=500) == 500
        # Put back from a backup: the same creation time, 100 records.
        assert h.follow("KV_state", "t0", last_seq=100) == 0
        h.record(revs[1], 120)  # the backup's later record of j1 (older in the job's life)
        h.record(lifecycle("j2")[1], 60)  # below j2's row, which the backup holds too: stays
        h.flush()
        assert h.get_job("j1").state is JobState.PLACED  # type: ignore[union-attr]
        assert h.get_job("j2").state is JobState.RUNNING  # type: ignore[union-attr]
        assert h.follow("KV_state", "t0", last_seq=130) == 120  # from then on, as usual
        # Created anew: numbering from 1, every row takes its records.
        assert h.follow("KV_state", "t1", last_seq=3) == 0
        h.record(revs[3], 2)
        h.record(lifecycle("j2")[3], 3)
        h.flush()
        assert h.get_job("j1").state is JobState.SUCCEEDED  # type: ignore[union-attr]
        assert h.get_job("j2").state is JobState.SUCCEEDED  # type: ignore[union-attr]
        assert h.follow("KV_state", "t1", last_seq=3) == 3
        h.record(revs[2], 1)  # older than the row now: ignored as ever
        h.flush()
        assert h.get_job("j1").state is JobState.SUCCEEDED  # type: ignore[union-attr]
    finally:
        h.close()


# ---------------------------------------------------------------- reading


def _fixture_jobs() -> list[Job]:
    out = []
    states = [JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
    names = ["train-a", "train-b", "Train-c", "eval_1", "evalx1", "sweep%1"]
    for i in range(30):
        out.append(job_in_state(f"j{i:02d}", 1000.0 + (i * 7) % 30, state=states[i % 5], name=names[i % 6],
                                user=["alice", "bob", "carol"][i % 3], priority=[0, 5, -1, 10][i % 4]))
    return out


SORT_KEYS = {
    "-submitted_at": (lambda j: (j.submitted_at, j.id), True),
    "submitted_at": (lambda j: (j.submitted_at, j.id), False),
    "-priority": (lambda j: (-j.spec.priority, j.submitted_at, j.id), False),
    "priority": (lambda j: (-j.spec.priority, j.submitted_at, j.id), True),
}


def test_filters_and_sorting(hist: History) -> None:
    jobs = [j.model_copy(update={"spec": j.spec.model_copy(update={"group": "sweep#1"})}) if i % 4 == 1 else j
            for i, j in enumerate(_fixture_jobs())]
    for j in jobs:
        hist.record(j, 1)
    hist.flush()

    def expect(pred, sort: str = "-submitted_at") -> list[str]:  # type: ignore[no-untyped-def]
        key, rev = SORT_KEYS[sort]
        return [j.id for j in sorted((j for j in jobs if pred(j)), key=key, reverse=rev)]

    def ids(sort: str = "-submitted_at", **kw: object) -> list[str]:
        got, total = hist.list_jobs(sort=sort, limit=1000, **kw)  # type: ignore[arg-type]
        assert total == len(got)
        return [j.id for j in got]

    assert ids() == expect(lambda j: True)
    assert ids(state="RUNNING") == expect(lambda j: j.state == JobState.RUNNING)
    assert ids(state=["FAILED", "CANCELLED"]) == expect(lambda j: j.state in (JobState.FAILED, JobState.CANCELLED))
    assert ids(user="bob") == expect(lambda j: j.spec.user == "bob")
    assert ids(name="train") == expect(lambda j: j.spec.name.startswith("train"))  # case-sensitive
    assert ids(name="eval_") == expect(lambda j: j.spec.name.startswith("eval_"))  # _ is not a wildcard
    assert ids(name="sweep%") == expect(lambda j: j.spec.name.startswith("sweep%"))
    assert ids(name="nope") == []
    assert ids(priority=5) == expect(lambda j: j.spec.priority == 5)
    assert ids(group="sweep#1") == expect(lambda j: j.spec.group == "sweep#1") and len(ids(group="sweep#1")) == 8
    assert ids(group="sweep#1", user="bob") == expect(lambda j: j.spec.group == "sweep#1" and j.spec.user == "bob")
    assert ids(group="") == expect(lambda j: j.spec.group == "")
    assert ids(submitted_after=1010.0, submitted_before=1020.0) == expect(lambda j: 1010 <= j.submitted_at < 1020)
    assert ids(state="SUCCEEDED", user="alice", priority=10) == expect(
        lambda j: j.state == JobState.SUCCEEDED and j.spec.user == "alice" and j.spec.priority == 10)
    for sort in SORT_KEYS:
        want = expect(lambda j: True, sort)
        assert ids(sort) == want
        # offset paging
        pages = [hist.list_jobs(sort=sort, limit=7, offset=o) for o in range(0, 35, 7)]
        assert [j.id for p, _ in pages for j in p] == want and {t for _, t in pages} == {30}
        # keyset paging, unfiltered and filtered
        for kw, pred in (({}, lambda j: True), ({"state": ["QUEUED", "FAILED"]},
                                                lambda j: j.state in (JobState.QUEUED, JobState.FAILED))):
            seen: list[str] = []
            after = None
            while True:
                page, total = hist.list_jobs(sort=sort, limit=4, after=after, **kw)  # type: ignore[arg-type]
                assert total == len(expect(pred))
                if not page:
                    break
                seen += [j.id for j in page]
                after = job_cursor(page[-1], sort)
            assert seen == expect(pred, sort)
    page, total = hist.list_jobs(user="alice", sort="-priority", limit=3)
    assert [j.id for j in page] == expect(lambda j: j.spec.user == "alice", "-priority")[:3] and total == 10
    rest, _ = hist.list_jobs(user="alice", sort="-priority", limit=100, after=job_cursor(page[-1], "-priority"))
    assert [j.id for j in page + rest] == expect(lambda j: j.spec.user == "alice", "-priority")
    with pytest.raises(ValueError):
        hist.list_jobs(sort="name")


def test_list_events_and_attempts(hist: History) -> None:
    for i in range(4):
        for rev, j in enumerate(lifecycle(f"j{i}", 1000.0 + 100 * i), start=1):
            hist.record(j, rev)
    hist.flush()
    evs = hist.list_events(limit=1000)
    assert len(evs) == 20 and [e.ts for e in evs] == sorted(e.ts for e in evs)
    assert {e.kind for e in hist.list_events(job_id="j2")} == {
        "job.submitted", "attempt.placed", "attempt.started", "attempt.succeeded", "job.succeeded"}
    assert [e.job_id for e in hist.list_events(kind="job.succeeded")] == ["j0", "j1", "j2", "j3"]
    assert [e.id for e in hist.list_events(kind="job.succeeded", since=1110.0)] == ["j1:succeeded", "j2:succeeded",
                                                                                     "j3:succeeded"]
    host_evs = hist.list_events(host_id="h1", limit=1000)
    assert len(host_evs) == 16 and all(e.host_id == "h1" for e in host_evs)  # job.submitted has no host
    assert [e.id for e in hist.list_events(kind="job.succeeded", limit=2, offset=1)] == ["j1:succeeded",
                                                                                         "j2:succeeded"]
    assert hist.list_events(kind="job.succeeded", newest_first=True)[0].job_id == "j3"
    atts = hist.list_attempts(host_id="h1")
    assert [a.job_id for a in atts] == ["j0", "j1", "j2", "j3"]
    assert [a.job_id for a in hist.list_attempts(host_id="h1", limit=2, offset=1)] == ["j1", "j2"]
    assert [a.job_id for a in hist.list_attempts(host_id="h1", newest_first=True)] == ["j3", "j2", "j1", "j0"]
    assert hist.list_attempts(host_id="h9") == []


def test_keyset_pages_neither_repeat_nor_skip_while_rows_are_added(hist: History) -> None:
    """Paged by offset, a walk newest first repeated items whenever newer ones were written
    meanwhile (found by exploring the API); a page past a (time, id) key does not, and ties
    in time are ordered by id."""
    def add(ident: str, at: float, kind: str = "alert.host.lost") -> None:
        with Session(hist.engine) as s:
            s.add(EventRow(id=ident, ts=at, kind=kind, host_id="h1", message=ident))
            s.commit()

    for i in range(6):
        add(f"a{i}", 100.0 + i // 2)  # pairs at the same time
    add("e0", 100.5, kind="job.submitted")  # not an alert
    seen: list[str] = []
    key = None
    for page in range(10):
        rows, total = hist.list_alerts(limit=2, after=key)
        if not rows:
            break
        seen += [r.id for r in rows]
        key = (rows[-1].ts, rows[-1].id)
        add(f"new{page}", 200.0 + page)  # newer than every page: it must not shift the walk
    assert seen == ["a5", "a4", "a3", "a2", "a1", "a0"] and total == 6 + page
    events = [r.id for r in hist.list_events(since=100.0, limit=3)]
    assert events == ["a0", "a1", "e0"]
    assert [r.id for r in hist.list_events(limit=3, after=(100.5, "e0"))] == ["a2", "a3", "a4"]
    assert [r.id for r in hist.list_events(limit=2, newest_first=True, after=(101.0, "a2"))] == ["e0", "a1"]


# ---------------------------------------------------------------- retention


def test_retention_prunes_only_old_finished_jobs(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_mod, "_PRUNE_CHUNK", 3)  # several chunks
    now = 100 * DAY
    h = History(db_url, retention_days=7)
    try:
        old, keep = [], []
        for i, st in enumerate([JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT] * 3):
            j = job_in_state(f"old{i}", now - 30 * DAY, state=st, updated=now - 8 * DAY - i)
            old.append(j)
        keep.append(job_in_state("oldq", now - 30 * DAY, state=JobState.QUEUED, updated=now - 20 * DAY))
        keep.append(job_in_state("oldr", now - 30 * DAY, state=JobState.RUNNING, updated=now - 20 * DAY))
        keep.append(job_in_state("recent", now - 30 * DAY, state=JobState.SUCCEEDED, updated=now - 6 * DAY))
        for j in old + keep:
            h.record(j, 1)
        h.flush()
        assert h.prune(now) == len(old)
        _, total = h.list_jobs(limit=100)
        assert total == 3 and {j.id for j in h.list_jobs(limit=100)[0]} == {"oldq", "oldr", "recent"}
        for j in old:
            assert h.events_for_job(j.id) == [] and h.list_attempts(job_id=j.id) == []
        assert len(h.events_for_job("recent")) == 5 and len(h.list_attempts(job_id="oldr")) == 1
        assert h.prune(now) == 0
        assert History(db_url).prune(now + 365 * DAY) == 0  # no retention: nothing goes
    finally:
        h.close()


def test_a_job_settled_as_ended_is_charged_no_longer(db_url: str) -> None:
    """Found by exploring: a job whose final record left the state bucket before history
    read it stayed RUNNING in history, and its attempt was charged up to whenever `usage`
    was asked, without bound. Settled (server.history.reconcile), it is FAILED with its
    outcome unknown, its attempt LOST at its last known time, and the charge stops there;
    a settlement read before a newer record was written changes nothing."""
    from server.history.reconcile import UNKNOWN_END, ended_unknown

    h = History(db_url)
    try:
        t0 = 10 * DAY
        stuck = lifecycle("stuck", t0)[2]  # RUNNING since t0 + 2
        stuck.updated_at = t0 + 500  # its last record history read
        other = lifecycle("other", t0)[2]
        h.record(stuck, 5)
        h.record(other, 6)
        h.flush()
        now = t0 + 30 * DAY
        assert [u.gpu_seconds for u in h.usage(now=now)] == [2 * (now - t0 - 2)]  # growing without bound
        found = h.unfinished_before(t0 + DAY)
        assert [(j.id, rev) for j, rev in found] == [("other", 6), ("stuck", 5)]
        assert h.unfinished_before(t0 + DAY, after=(found[0][0].updated_at, "other"))[0][0].id == "stuck"
        # `other` got a newer record after it was read: its settlement is not written.
        h.record(lifecycle("other", t0)[3], 7)
        h.flush()
        assert h.settle([(ended_unknown(j), rev) for j, rev in found]) == 1
        got = h.get_job("stuck")
        assert got is not None and got.state is JobState.FAILED and got.end_reason == UNKNOWN_END
        assert got.updated_at == t0 + 500
        [att] = h.list_attempts(job_id="stuck")
        assert att.state == "LOST" and att.finished_at == t0 + 500
        assert h.get_job("other").state is JobState.SUCCEEDED  # type: ignore[union-attr]
        assert h.events_for_job("stuck")[-1].kind == "job.failed"
        assert h.unfinished_before(now) == []
        used = {u.user: u.gpu_seconds for u in h.usage(now=now)}
        assert used == {"alice": (t0 + 500 - (t0 + 2)) + 8.0}  # stuck up to its last known time; other's run
        assert h.settle([(ended_unknown(stuck), 5)]) == 0  # ended already: once
    finally:
        h.close()


def _events(h: History, rows: list[tuple[str, float, str, str | None]]) -> None:
    """Recorded events as the recorder writes them: (id, ts, kind, job id)."""
    with h.engine.begin() as conn:
        conn.execute(EventRow.__table__.insert(),  # type: ignore[attr-defined]
                     [dict(id=i, ts=ts, kind=kind, job_id=jid, host_id=None if jid else "h1", message="")
                      for i, ts, kind, jid in rows])


def test_retention_prunes_old_events_of_no_job(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: retention went by jobs only, so host and queue events and alerts
    (no job id) were kept for ever. `prune_events` deletes those older than the retention
    and those of a job history no longer has; a job's that history still has stay with
    it."""
    monkeypatch.setattr(history_mod, "_PRUNE_CHUNK", 3)  # several chunks
    now = 100 * DAY
    h = History(db_url, retention_days=7)
    try:
        h.record(job_in_state("oldq", now - 30 * DAY, state=JobState.QUEUED, updated=now - 20 * DAY), 1)
        h.flush()
        old = [(f"EVENTS:{i}:1", now - 8 * DAY - i, "host.lost", None) for i in range(5)]
        old += [(f"ALERTS:{i}:1", now - 9 * DAY, "alert.host.lost", None) for i in range(4)]
        old += [("EVENTS:90:1", now - 9 * DAY, "job.updated", "pruned-long-ago")]
        keep = [("EVENTS:50:1", now - 6 * DAY, "host.lost", None), ("ALERTS:50:1", now - DAY, "alert.host.lost", None),
                ("EVENTS:91:1", now - 9 * DAY, "job.updated", "oldq")]
        _events(h, old + keep)
        assert h.prune_events(now) == len(old)
        left = {e.id for e in h.list_events(limit=1000)}
        assert {i for i, *_ in keep} <= left and not left & {i for i, *_ in old}
        assert h.prune_events(now) == 0
        assert History(db_url).prune_events(now + 365 * DAY) == 0  # no retention: nothing goes
    finally:
        h.close()


async def test_run_prunes_with_retention(tmp_path: Path) -> None:
    import time

    h = History(f"sqlite:///{tmp_path / 'h.db'}", retention_days=1)
    try:
        h.record(job_in_state("old", time.time() - 10 * DAY, state=JobState.SUCCEEDED,
                              updated=time.time() - 5 * DAY), 1)
        h.record(job_in_state("new", time.time(), state=JobState.SUCCEEDED, updated=time.time()), 1)
        h.flush()
        _events(h, [("ALERTS:1:1", time.time() - 5 * DAY, "alert.host.lost", None),
                    ("ALERTS:2:1", time.time(), "alert.host.lost", None)])
        stop = asyncio.Event()
        task = asyncio.create_task(h.run(stop, every_s=0.05))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if h.get_job("old") is None and h.list_alerts()[1] == 1:
                break
        stop.set()
        await asyncio.wait_for(task, 10)
        assert h.get_job("old") is None and h.get_job("new") is not None
        assert [a.id for a in h.list_alerts()[0]] == ["ALERTS:2:1"]  # an old alert goes too
    finally:
        h.close()


# ---------------------------------------------------------------- volume


def test_five_thousand_jobs(hist: History) -> None:
    rng = random.Random(7)
    states = list(JobState)
    jobs = [job_in_state(f"j{i:05d}", 1_000_000.0 + i, state=rng.choice(states), user=f"u{rng.randrange(20)}",
                         name=rng.choice(["train", "eval", "sweep"]) + f"-{i % 50}", priority=rng.randrange(-3, 4))
            for i in range(5000)]
    for j in jobs:
        hist.record(j, 1)
    assert hist.flush() == 5000
    assert counts(hist)[0] == 5000
    want = sorted((j for j in jobs if j.state == JobState.RUNNING and j.spec.user == "u3"),
                  key=lambda j: (-j.spec.priority, j.submitted_at, j.id))
    got, total = hist.list_jobs(state="RUNNING", user="u3", sort="-priority", limit=1000)
    assert total == len(want) > 0 and [j.id for j in got] == [j.id for j in want]
    want = [j for j in jobs if j.spec.name.startswith("eval-1") and 1_001_000 <= j.submitted_at < 1_004_000]
    got, total = hist.list_jobs(name="eval-1", submitted_after=1_001_000, submitted_before=1_004_000,
                                sort="submitted_at", limit=5000)
    assert total == len(want) and [j.id for j in got] == [j.id for j in want]


def test_usage_sums_attempts_per_queue_user_and_model(hist: History) -> None:
    """Accounting: GPU-, CPU- and memory-seconds are the sums over the recorded attempts
    (the parts of their runs inside the period; a running one counts up to now); the
    GPU-seconds lost to preemption, over the attempts that ended PREEMPTED in the period:
    all each ran, or from its stop to its exit for a job that checkpoints."""
    rng = random.Random(7)
    jobs = []
    for i in range(40):
        queue, user = rng.choice(["a", "b"]), rng.choice(["ann", "bob"])
        spec = job_spec(f"u{i}", gpus=rng.randint(1, 4), cpus=float(rng.randint(1, 8)), memory_mb=1024,
                        queue=queue, user=user, checkpoints=i % 3 == 0)
        start = 1000.0 + rng.randint(0, 500)
        end = None if i % 7 == 0 else start + rng.randint(3, 300)
        model = rng.choice(["H100", "A100"])
        ended = AttemptState.PREEMPTED if i % 2 else AttemptState.SUCCEEDED
        # How busy its GPUs were, as its agent reported at its end (some never report).
        util = None if end is None or i % 5 == 0 else round(rng.uniform(0, 100), 1)
        attempts = [Attempt(id=f"u{i}.1", number=1, host_id="h", gpu_indices=list(range(spec.gpus)),
                            state=AttemptState.RUNNING if end is None else ended,
                            placed_at=start, started_at=start, finished_at=end, gpu_model=model,
                            stop_at=end - 2 if end is not None and ended is AttemptState.PREEMPTED else None,
                            gpu_util_pct=util)]
        jobs.append(job(f"u{i}", spec=spec, state=JobState.RUNNING if end is None else JobState.SUCCEEDED,
                        attempts=attempts, submitted_at=start))
        hist.record(jobs[-1], 1)
    hist.flush()
    now, since, until = 2000.0, 1200.0, 1600.0
    expected: dict[tuple[str, str, str], list[float]] = {}
    for j in jobs:
        a = j.attempts[0]
        lo = max(a.started_at or 0.0, since)
        hi = min(a.finished_at if a.finished_at is not None else now, until)
        if hi <= lo and not (a.started_at < until and (a.finished_at is None or a.finished_at > since)):
            continue
        secs = max(0.0, hi - lo)
        e = expected.setdefault((j.spec.queue, j.spec.user, a.gpu_model), [0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0])
        e[0] += secs * j.spec.gpus
        if a.gpu_util_pct is not None:
            e[5] += secs * j.spec.gpus
            e[6] += secs * j.spec.gpus * a.gpu_util_pct
        e[1] += secs * j.spec.cpus
        e[2] += secs * j.spec.memory_mb
        e[3] += 1
        if a.state is AttemptState.PREEMPTED and since < a.finished_at <= until:
            e[4] += (a.finished_at - (a.stop_at if j.spec.checkpoints else a.started_at)) * j.spec.gpus
    rows = hist.usage(since=since, until=until, now=now)
    got = {(r.queue, r.user, r.gpu_model): [r.gpu_seconds, r.cpu_seconds, r.memory_mb_seconds, r.attempts,
                                            r.lost_gpu_seconds]
           for r in rows}
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v[:5]), k
    # The GPUs' utilisation: weighted by the GPU-seconds of the attempts that reported one.
    utils = {(r.queue, r.user, r.gpu_model): r.gpu_util_pct for r in rows}
    for k, v in expected.items():
        assert utils[k] == (None if not v[5] else pytest.approx(round(v[6] / v[5], 1))), k
    assert any(u is not None for u in utils.values())
    assert sum(v[4] for v in expected.values()) > 0  # some lost, some of it by jobs that checkpoint
    assert hist.usage(since=now + 3600, now=now) == []  # a period ahead: nothing (running attempts counted once)
    only = hist.usage(queue="a", user="ann", now=now)
    assert {(r.queue, r.user) for r in only} <= {("a", "ann")}
    total = sum(r.gpu_seconds for r in hist.usage(now=now))
    assert total == pytest.approx(sum(((a.finished_at or now) - a.started_at) * j.spec.gpus
                                      for j in jobs for a in j.attempts))
    assert {r.spec.queue for r in hist.list_jobs(queue="b", limit=100)[0]} == {"b"}


def test_usage_of_adjacent_periods_adds_up_to_the_whole(hist: History) -> None:
    """A preempted attempt that ended exactly where one period ends and the next begins:
    its GPU-seconds and its loss are in the first and not in the second, and the two add up
    to the whole (found by a review: its loss was in neither)."""
    spec = job_spec("p", gpus=2, queue="q", user="ann")
    a = Attempt(id="p.1", number=1, host_id="h", gpu_indices=[0, 1], state=AttemptState.PREEMPTED,
                placed_at=1000.0, started_at=1000.0, finished_at=2000.0, stop_at=1990.0)
    hist.record(job("p", spec=spec, state=JobState.QUEUED, attempts=[a], submitted_at=1000.0, updated_at=2000.0), 1)
    hist.flush()

    def figures(since: float, until: float) -> tuple[float, float, int]:
        rows = hist.usage(since=since, until=until, now=5000.0)
        return (sum(r.gpu_seconds for r in rows), sum(r.lost_gpu_seconds for r in rows), sum(r.attempts for r in rows))

    assert figures(0.0, 2000.0) == figures(0.0, 4000.0) == (2000.0, 2000.0, 1)
    assert figures(2000.0, 4000.0) == (0.0, 0.0, 0)


def test_a_task_groups_error_is_told_as_its_tasks_errors() -> None:
    from server.history.historian import why

    group = ExceptionGroup("unhandled errors in a TaskGroup", [
        OperationalError("INSERT", {}, Exception("server closed the connection")),
        ExceptionGroup("inner", [TimeoutError("nats: timeout")])])
    told = why(group)
    assert "TaskGroup" not in told and "inner" not in told
    assert told.startswith("OperationalError: ") and "server closed the connection" in told
    assert told.endswith("; TimeoutError: nats: timeout")
