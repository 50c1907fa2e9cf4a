"""The historian with a database several replicas share: two historians against one
NATS and one PostgreSQL; one writes at a time, and when it stops the other takes over
and writes what came after. With SQLite (a file of each replica's own) both write. A
historian that takes over while PostgreSQL is down keeps trying, and writes once it is
back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from server.history.database import History
from server.history.historian import HistorianConfig, run
from server.history.writerlease import WriterLease, lease_key
from server.state.streams import ensure_streams
from tests.conftest import eventually, frozen
from tests.integration.postgres import (  # noqa: F401 - fixtures
    PostgresServer,
    crash_postgres,
    find_pg_bin,
    postgres_server,
    postgres_url,
    restart_postgres,
    start_postgres,
    stop_postgres,
)
from wire import subjects
from wire.kv import Store, connect
from wire.messages import Attempt, AttemptState, Job, JobSpec, JobState, encode

WRITES = "this historian writes the shared history database"
RESTARTS = "history writing stopped"


async def _put_job(store: Store, jid: str) -> None:
    job = Job(id=jid, spec=JobSpec(name=jid, command=["x"]), state=JobState.QUEUED, submitted_at=1.0,
              updated_at=1.0)
    await store.put(subjects.job_key(jid), encode(job))


@contextlib.asynccontextmanager
async def _own_postgres(nats_url: str) -> AsyncIterator[tuple[PostgresServer, Store]]:
    """A PostgreSQL server of the test's own (to crash or freeze), and a store on NATS with
    the streams created; both gone afterwards."""
    bindir = find_pg_bin()
    assert bindir is not None, "PostgreSQL binaries not found (CI installs them)"
    pg = start_postgres(bindir)
    try:
        nc = await connect(nats_url, name="test")
        try:
            store = Store(nc)
            await ensure_streams(store)
            yield pg, store
        finally:
            await nc.close()
    finally:
        stop_postgres(pg)


async def _until(check, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    """`eventually` at a slower poll: each check queries the database synchronously."""
    await eventually(check, timeout=timeout, what="history", interval=0.2)


async def test_one_historian_writes_a_shared_database_and_the_other_takes_over(
        nats_url: str, postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.INFO, logger="server.history.historian")
    nc = await connect(nats_url, name="test")
    store = Store(nc)
    await ensure_streams(store)
    history = History(postgres_url)
    cfg = HistorianConfig(nats_url=nats_url, database_url=postgres_url)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    a = asyncio.create_task(run(cfg, stop_a))
    await _until(lambda: caplog.text.count(WRITES) == 1)
    b = asyncio.create_task(run(cfg, stop_b))
    try:
        await _put_job(store, "j1")
        await _until(lambda: history.get_job("j1") is not None)
        await asyncio.sleep(3 * 2.0)  # the second has tried to take the lease, more than once
        assert caplog.text.count(WRITES) == 1
        assert (await store.get(lease_key(postgres_url))).value
        stop_a.set()
        await a
        # Given up at stop: the other takes it at its next try, and writes what came after.
        await _until(lambda: caplog.text.count(WRITES) == 2, timeout=30)
        await _put_job(store, "j2")
        await _until(lambda: history.get_job("j2") is not None)
        assert history.get_job("j1") is not None
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(a, b)
        history.close()
        await nc.close()
    assert caplog.text.count(WRITES) == 2


async def test_historians_of_their_own_sqlite_files_both_write(nats_url: str, tmp_path,  # type: ignore[no-untyped-def]
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="server.history.historian")
    nc = await connect(nats_url, name="test")
    store = Store(nc)
    await ensure_streams(store)
    urls = [f"sqlite:///{tmp_path / f'h{i}.db'}" for i in range(2)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(run(HistorianConfig(nats_url=nats_url, database_url=u), stop)) for u in urls]
    histories = [History(u) for u in urls]
    try:
        await _put_job(store, "j1")
        await _until(lambda: all(h.get_job("j1") is not None for h in histories))
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for h in histories:
            h.close()
        await nc.close()
    assert WRITES not in caplog.text


async def test_a_historian_that_starts_while_postgresql_is_down_writes_once_it_is_back(
        nats_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # The takeover in test_topology: the writer's replica is killed, and PostgreSQL is down
    # when the other historian takes the lease and checks the schema.
    caplog.set_level(logging.INFO, logger="server.history.historian")
    async with _own_postgres(nats_url) as (pg, store):
        stop = asyncio.Event()
        task: asyncio.Task[None] | None = None
        try:
            crash_postgres(pg)
            task = asyncio.create_task(run(HistorianConfig(nats_url=nats_url, database_url=pg.url), stop))
            await _until(lambda: caplog.text.count(RESTARTS) >= 2)  # tried, and tried again
            assert not task.done()
            await _put_job(store, "j1")
            await asyncio.to_thread(restart_postgres, pg)
            history = History(pg.url)
            try:
                await _until(lambda: history.get_job("j1") is not None)
            finally:
                history.close()
            assert caplog.text.count(WRITES) == 1  # the lease was kept throughout
        finally:
            stop.set()
            if task is not None:
                await task


async def test_a_stopping_writer_gives_the_lease_up_before_its_last_flush(nats_url: str) -> None:
    """PostgreSQL frozen (SIGSTOP on every one of its processes): the writer's last flush
    hangs, yet the lease is already free for the next writer; once PostgreSQL runs again
    the flush ends and the stopped writer's last job is in the database."""
    import psutil

    async with _own_postgres(nats_url) as (pg, store):
        stop = asyncio.Event()
        task = asyncio.create_task(run(HistorianConfig(nats_url=nats_url, database_url=pg.url), stop))
        history = History(pg.url)
        try:
            await _put_job(store, "j1")
            await _until(lambda: history.get_job("j1") is not None)
            assert (await store.get(lease_key(pg.url))).value
            pid = pg.postmaster_pid()
            assert pid is not None
            postmaster = psutil.Process(pid)
            with frozen(postmaster.pid, *(p.pid for p in postmaster.children(recursive=True))):
                await _put_job(store, "j2")
                stop.set()

                async def released() -> bool:  # given up (an empty value), not expired (no value)
                    return (await store.get(lease_key(pg.url))).value == b""

                await eventually(released, timeout=60, what="the lease given up")
                assert not task.done()  # still in its last flush, held by the frozen database
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=120)
            try:
                assert history.get_job("j2") is not None
            finally:
                history.close()


@pytest.mark.timeout(360)
async def test_a_killed_historian_process_is_started_again_and_writes(nats_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal

    from server.history.historian import HistorianProcess

    nc = await connect(nats_url, name="test")
    store = Store(nc)
    await ensure_streams(store)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    historian = HistorianProcess(HistorianConfig(nats_url=nats_url, database_url=url))
    stop = asyncio.Event()
    historian.start()
    supervisor = asyncio.create_task(historian.run(stop))
    history = History(url)
    try:
        await _put_job(store, "j1")
        await _until(lambda: history.get_job("j1") is not None)
        assert historian.proc is not None and historian.proc.pid is not None
        os.kill(historian.proc.pid, signal.SIGKILL)
        await _until(lambda: historian.restarts == 1)
        await _put_job(store, "j2")
        # The restarted historian is a fresh interpreter at nice +10: on a machine busy with
        # other tests it can take a minute to import and start writing (CI timed out at 60 s).
        await _until(lambda: history.get_job("j2") is not None, timeout=180)
        assert historian.alive
    finally:
        stop.set()
        await asyncio.wait_for(supervisor, timeout=10)
        proc = historian.proc
        # A generous wait before SIGKILL: the historian runs at nice +10, and on a machine
        # busy with other tests its exit can take many seconds; this checks how it stops.
        await asyncio.to_thread(historian.stop, 120)
        history.close()
        await nc.close()
    assert proc is not None and proc.exitcode == 0  # the restarted one stopped cleanly on SIGTERM
    assert historian.restarts == 1 and historian.proc is None


async def test_a_historian_started_again_reads_only_the_job_records_after_its_stored_position(
        nats_url: str, tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """The database keeps how far the state stream's job records are written; a historian
    that starts again reads only those after it (a row deleted meanwhile stays deleted:
    one that read them all would write it back), and a state stream made anew (a new
    NATS cluster, its sequences starting again) from its start."""
    caplog.set_level(logging.INFO, logger="server.history.historian")
    nc = await connect(nats_url, name="test")
    store = Store(nc)
    await ensure_streams(store)
    url = f"sqlite:///{tmp_path / 'history.db'}"
    history = History(url)

    async def write_until(jid: str) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run(HistorianConfig(nats_url=nats_url, database_url=url), stop))
        try:
            await _until(lambda: history.get_job(jid) is not None)
        finally:
            stop.set()
            await task

    def delete_row(jid: str) -> None:
        with history.engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": jid})

    try:
        await _put_job(store, "j1")
        await write_until("j1")
        delete_row("j1")
        await _put_job(store, "j2")
        await write_until("j2")
        assert history.get_job("j1") is None
        assert "reading job records after state sequence" in caplog.text

        with history.engine.connect() as conn:
            stored = conn.execute(text("SELECT seq FROM stream_positions WHERE stream = :s"),
                                  {"s": subjects.STATE_STREAM}).scalar_one()
        assert stored >= 2
        await store.js.delete_stream(subjects.STATE_STREAM)
        await ensure_streams(store)
        jids = [f"k{i}" for i in range(stored + 2)]
        for jid in jids:  # more records than the position stored, so only its origin tells
            await _put_job(store, jid)
        await write_until(jids[-1])
        assert all(history.get_job(jid) is not None for jid in jids)
    finally:
        history.close()
        await nc.close()


async def test_a_job_put_back_on_a_state_stream_made_anew_is_written_at_its_lower_revision(
        nats_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Found by exploring: after the state stream was made anew (its sequences starting at
    1 again), a job history held at a higher revision of the old stream was never updated
    again, since only a higher revision replaces a row. A historian that finds the stream
    numbering anew lets its records replace every row."""
    nc = await connect(nats_url, name="test")
    store = Store(nc)
    await ensure_streams(store)
    url = f"sqlite:///{tmp_path / 'history.db'}"
    history = History(url)

    async def put(jid: str, state: JobState) -> int:
        job = Job(id=jid, spec=JobSpec(name=jid, command=["x"]), state=state, submitted_at=1.0, updated_at=2.0)
        return await store.put(subjects.job_key(jid), encode(job))

    async def write_until(check) -> None:  # type: ignore[no-untyped-def]
        stop = asyncio.Event()
        task = asyncio.create_task(run(HistorianConfig(nats_url=nats_url, database_url=url), stop))
        try:
            await _until(check)
        finally:
            stop.set()
            await task

    try:
        for i in range(20):  # the cluster before the loss: many revisions
            await put(f"pad{i}", JobState.QUEUED)
        high = await put("jX", JobState.RUNNING)
        await write_until(lambda: history.get_job("jX") is not None)
        await store.js.delete_stream(subjects.STATE_STREAM)
        await ensure_streams(store)
        assert await put("jX", JobState.SUCCEEDED) < high
        await put("marker", JobState.QUEUED)
        await write_until(lambda: history.get_job("marker") is not None)
        await write_until(lambda: history.get_job("jX").state is JobState.SUCCEEDED)  # type: ignore[union-attr]
        # Written from the new stream from now on: a later record, at a revision higher
        # than the first of the new stream's, replaces it as usual.
        await put("jX", JobState.FAILED)
        await write_until(lambda: history.get_job("jX").state is JobState.FAILED)  # type: ignore[union-attr]
        assert history.get_job("pad3") is not None  # the old stream's jobs stay in history
    finally:
        history.close()
        await nc.close()


async def test_a_job_whose_end_expired_unread_is_settled_when_a_historian_starts(
        nats_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Found by exploring: a job whose final record expired from the state bucket while no
    historian wrote (the database down longer than MUSTER_FINISHED_JOB_TTL, the writer
    restarted meanwhile) stayed RUNNING in history, charged without bound. The writing
    historian settles such jobs when it starts (server.history.reconcile): FAILED, the
    outcome unknown; a job whose record is still in the bucket is left as it is."""
    from server.history.reconcile import UNKNOWN_END

    nc = await connect(nats_url, name="test")
    store = Store(nc)
    await ensure_streams(store)
    url = f"sqlite:///{tmp_path / 'history.db'}"
    history = History(url)

    def running(jid: str, state: JobState = JobState.RUNNING) -> bytes:
        attempt = Attempt(id=f"{jid}.1", number=1, host_id="h1", gpu_indices=[0], placed_at=1.0, started_at=1.0,
                          state=AttemptState.RUNNING if state is JobState.RUNNING else AttemptState.SUCCEEDED,
                          finished_at=None if state is JobState.RUNNING else 50.0)
        return encode(Job(id=jid, spec=JobSpec(name=jid, command=["x"], gpus=1), state=state, submitted_at=1.0,
                          updated_at=2.0 if state is JobState.RUNNING else 50.0, attempts=[attempt]))

    async def write_until(check) -> None:  # type: ignore[no-untyped-def]
        stop = asyncio.Event()
        task = asyncio.create_task(run(HistorianConfig(nats_url=nats_url, database_url=url), stop))
        try:
            await _until(check)
        finally:
            stop.set()
            await task

    try:
        for jid in ("gone", "kept"):
            await store.put(subjects.job_key(jid), running(jid))
        await write_until(lambda: all(history.get_job(j) is not None for j in ("gone", "kept")))
        # While no historian writes, "gone" ends, and its last record expires unread.
        await store.put(subjects.job_key("gone"), running("gone", JobState.SUCCEEDED), ttl="1s")

        async def expired() -> bool:
            return (await store.get(subjects.job_key("gone"))).value is None

        await eventually(expired, timeout=30, what="the job record's expiry")
        await write_until(lambda: history.get_job("gone").state is JobState.FAILED)  # type: ignore[union-attr]
        gone = history.get_job("gone")
        assert gone is not None and gone.end_reason == UNKNOWN_END
        assert [(a.state, a.finished_at) for a in history.list_attempts(job_id="gone")] == [("LOST", 2.0)]
        assert history.get_job("kept").state is JobState.RUNNING  # type: ignore[union-attr]
    finally:
        history.close()
        await nc.close()


async def test_history_that_cannot_be_written_is_alerted_and_so_is_its_return(
        nats_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Found by exploring: while the database took no writes, nothing but the historian's
    log said so. The writing historian alerts history.behind once history has gone
    unwritten for a while (writehealth.BEHIND_AFTER_S), history.recovered once it is
    written again, and reports how long it has been (muster_history_unwritten_seconds)."""
    import json

    from server.history import historian as historian_module
    from server.history import writehealth

    monkeypatch.setattr(writehealth, "BEHIND_AFTER_S", 1.0)
    monkeypatch.setattr(historian_module, "WATCH_EVERY_S", 0.2)
    missing = tmp_path / "not-yet"  # a database that cannot be opened until it exists
    nc = await connect(nats_url, name="test")
    reports: list[float] = []
    stop = asyncio.Event()
    try:
        await ensure_streams(Store(nc))
        sub = await nc.subscribe(f"{subjects.ALERTS_PREFIX}.history.>")
        task = asyncio.create_task(run(HistorianConfig(nats_url=nats_url, database_url=f"sqlite:///{missing}/h.db"),
                                       stop, reports.append))
        try:
            behind = await sub.next_msg(timeout=30)
            assert behind.subject == f"{subjects.ALERTS_PREFIX}.{subjects.ALERT_HISTORY_BEHIND}"
            assert "history not written for" in json.loads(behind.data)["message"]
            assert max(reports) > 0
            missing.mkdir()
            back = await sub.next_msg(timeout=30)
            assert back.subject == f"{subjects.ALERTS_PREFIX}.{subjects.ALERT_HISTORY_RECOVERED}"
        finally:
            stop.set()
            await task
        assert reports[-1] == 0.0
    finally:
        await nc.close()


async def test_the_historian_process_tells_the_server_how_long_history_has_gone_unwritten(
        nats_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the server exports as muster_history_unwritten_seconds comes from the historian
    process (HistorianProcess.unwritten_s), 0 again once it stopped."""
    from server.history.historian import HistorianProcess

    nc = await connect(nats_url, name="test")
    await ensure_streams(Store(nc))
    await nc.close()
    historian = HistorianProcess(HistorianConfig(nats_url=nats_url,
                                                 database_url=f"sqlite:///{tmp_path / 'missing' / 'h.db'}"))
    historian.start()
    try:
        await eventually(lambda: historian.unwritten_s() > 0, timeout=120, what="the historian's report")
    finally:
        await asyncio.to_thread(historian.stop, 120)
    assert historian.unwritten_s() == 0.0


async def test_a_writer_whose_lease_expired_takes_it_again(nats_url: str) -> None:
    """A writer whose renewals did not land within the TTL (a saturated machine) finds
    the key expired, not held by another, at its next renewal: it takes the key again
    and stays the writer. Against the real bucket: the expiry marker is the last
    revision and counts as no value; a second writer is refused once it is taken."""
    nc = await connect(nats_url, name="test")
    try:
        store = Store(nc)
        await ensure_streams(store)
        mine = WriterLease(store, "history.writer.expiry", "a", ttl_s=1)
        other = WriterLease(store, "history.writer.expiry", "b", ttl_s=1)
        assert await mine.acquire()
        held = mine.revision

        async def expired() -> bool:
            rec = await store.get(mine.key)
            return rec.value is None and rec.revision > held

        await eventually(expired, timeout=30, what="the lease key's expiry")
        assert await mine.renew()
        rec = await store.get(mine.key)
        assert rec.value == b"a" and rec.revision == mine.revision > held
        assert not await other.acquire()
    finally:
        await nc.close()
