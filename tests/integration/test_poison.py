"""No single input stalls the cluster, against real components: a nats-server that takes
small messages only (so that records the budgets allow are refused by the store), a real
replica and scheduler, real agents running a noisy gang, SQLite and PostgreSQL history
with rows the database refuses."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import DataError

from server.broker.natsd import NatsProcess, start_nats
from server.history.database import History
from server.history.models import EventRow
from server.history.recorder import Recorder
from server.replica import Muster, ServerConfig
from server.state.streams import ensure_streams
from tests.conftest import eventually
from tests.integration.conftest import Api, Cluster
from tests.integration.postgres import postgres_server, postgres_url  # noqa: F401 - fixtures
from wire import subjects
from wire.budgets import encoded_len, text_limits
from wire.errors import ValidationError
from wire.kv import Store, connect
from wire.messages import (
    Attempt,
    AttemptState,
    Event,
    GpuInfo,
    Heartbeat,
    Job,
    JobSpec,
    JobState,
    decode,
    encode,
)
from wire.submit import submit_over_nats

SMALL = 16 * 1024  # the small server's max_payload


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[NatsProcess]:
    conf = tmp_path / "small.conf"
    conf.write_text(f"max_payload: {SMALL}\n")
    proc = start_nats(tmp_path / "nats-small", port=0, config=conf)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def replica(small_nats: NatsProcess, tmp_path: Path) -> AsyncIterator[Muster]:
    mu = Muster(ServerConfig(nats_url=small_nats.url, data_dir=tmp_path / "data", name="poison-test",
                             heartbeat_interval_s=5.0))
    await mu.start()
    try:
        yield mu
    finally:
        await mu.shutdown()


async def _hosts(mu: Muster, n: int) -> None:
    assert mu.store is not None
    for i in range(n):
        hb = Heartbeat(host_id=f"h{i}", boot_id="b", ts=time.time(), cpus=64, memory_mb=256_000,
                       gpus=[GpuInfo(index=g, model="H100", memory_mb=80_000) for g in range(8)])
        await mu.store.put(f"h{i}", encode(hb), bucket=subjects.HOSTS_BUCKET, ttl="60s")
    await eventually(lambda: len(mu.hosts.select(None, "id", time.time())) == n, what="hosts")


async def test_records_the_store_refuses_are_isolated_and_the_rest_is_scheduled(replica: Muster) -> None:
    mu = replica
    assert mu.store is not None
    # One host (8 GPUs): the two wide jobs below must share its assignment record,
    # whichever cycles they are placed in and whatever the placement policy prefers.
    await _hosts(mu, 1)
    alerts: list[Event] = []

    async def on_alert(msg) -> None:  # type: ignore[no-untyped-def]
        alerts.append(decode(Event, msg.data))

    await mu.store.nc.subscribe(f"{subjects.ALERTS_PREFIX}.{subjects.ALERT_INPUT_REJECTED}", cb=on_alert)
    rejected: list[Event] = []

    async def on_rejected(msg) -> None:  # type: ignore[no-untyped-def]
        rejected.append(decode(Event, msg.data))

    await mu.store.nc.subscribe(f"{subjects.EVENTS_PREFIX}.job.rejected", cb=on_rejected)

    # A job whose record cannot be stored at all is refused at once through GraphQL's path.
    env_fat = {"DATA": "x" * (SMALL + 1000)}
    with pytest.raises(Exception) as raised:
        await mu.submit({"name": "fat-direct", "command": ["true"], "env": env_fat}, "op")
    assert "NATS takes at most" in str(raised.value)

    # Through NATS: one submission holds a job whose record the store refuses; another
    # submission, in the same cycle, holds ordinary jobs.
    js = mu.store.js
    # (16,100 bytes of environment: the submission message, 16,239 bytes with its id
    # header, fits in 16 KB; the job record the leader makes of it, 16,271 bytes, with the
    # batch's headers and framing does not.)
    fat_ids = await submit_over_nats(js, [{"name": "fat", "command": ["true"], "env": {"DATA": "y" * 16100}}],
                                     user="poison", timeout=10)
    ok_ids = await submit_over_nats(js, [{"name": f"ok-{i}", "command": ["true"], "gpus": 1} for i in range(3)],
                                    user="batch", timeout=10)
    # Two jobs whose records fit, but whose tasks cannot share one host's assignment record
    # (9 KB of environment each: the record of a host with both is past 16 KB).
    wide = [await mu.submit({"name": f"wide-{i}", "command": ["true"], "gpus": 1, "env": {"W": "w" * 9000}}, "op")
            for i in range(2)]

    def state(job_id: str) -> str | None:
        j = mu.state.jobs.get(job_id)
        return j.state.value if j else None

    await eventually(lambda: all(state(i) == "PLACED" for i in ok_ids), timeout=60, what="ordinary jobs placed")
    await eventually(lambda: sorted(str(state(j.id)) for j in wide) == ["FAILED", "PLACED"], timeout=60,
                     what="one wide job placed, the other failed")
    failed = next(mu.state.jobs[j.id] for j in wide if state(j.id) == "FAILED")
    assert failed.end_reason.startswith("its records could not be written")
    assert fat_ids[0] not in mu.state.jobs
    await eventually(lambda: any(e.job_id == fat_ids[0] for e in rejected), what="the fat job rejected")
    await eventually(lambda: len(alerts) >= 2, what="alerts for the isolated input and job")
    assert mu.scheduler is not None and mu.scheduler.poisoned >= 2
    # ... and the cluster goes on scheduling.
    after = await mu.submit({"name": "after", "command": ["true"], "gpus": 1}, "op")
    await eventually(lambda: state(after.id) == "PLACED", timeout=30, what="a later job placed")


def test_a_gang_printing_control_characters_finishes_and_scheduling_goes_on(cluster: Cluster) -> None:
    """64 tasks, each printing 8 KB of control characters and failing: in JSON each tail
    kept whole (4 KB) would take 24 KB, and the job record 1.5 MB, past what NATS takes
    (the shape that once stalled scheduling for good); the tails are clipped to the job
    record's budget and the gang ends FAILED like any other."""
    srv = cluster.server("srv")
    for i in range(2):
        cluster.agent(f"noisy-{i}")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(2)
    noise = "import sys; sys.stdout.write('\\x01' * 8192); sys.stdout.flush(); sys.exit(3)"
    gang = api.submit(name="noisy", command=[sys.executable, "-c", noise], cpus=0.5, replicas=64, memoryMb=64)
    assert not gang["userErrors"], gang
    job = api.wait_job(gang["job"]["id"], {"FAILED", "SUCCEEDED"}, timeout=180)
    assert job["state"] == "FAILED" and len(job["attempts"]) == 64  # a failing try is not retried
    tail_limit, _ = text_limits(JobSpec(name="n", command=["x"], replicas=64))
    tails = [a["outputTail"] for a in job["attempts"] if a["outputTail"]]
    assert tails and all(encoded_len(t) <= tail_limit and set(t) == {"\x01"} for t in tails)
    after = api.submit(name="after", command=[sys.executable, "-c", "print('fine')"], memoryMb=64)
    assert api.wait_job(after["job"]["id"], {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "SUCCEEDED"


async def test_reasons_with_nul_are_refused_by_the_operations(replica: Muster) -> None:
    mu = replica
    await _hosts(mu, 1)
    job = await mu.submit({"name": "j", "command": ["true"]}, "op")
    for op in (mu.cancel(job.id, "op", "bad\x00reason"), mu.set_cordon("h0", True, "op", "nul\x00"),
               mu.drain("h0", "op", "\x1b[2J", 60)):
        with pytest.raises(ValidationError) as exc:
            await op
        assert exc.value.field == "reason" and exc.value.code == "INVALID"


# ---------------------------------------------------------------- history


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return str(request.getfixturevalue("postgres_url"))


def _job(jid: str, reason: str = "") -> Job:
    spec = JobSpec(name=jid, command=["x"])
    a = Attempt(id=f"{jid}.1", number=1, host_id="h1", state=AttemptState.FAILED, placed_at=10.0, started_at=11.0,
                finished_at=12.0, exit_code=1, reason=reason)
    return Job(id=jid, spec=spec, state=JobState.FAILED, submitted_at=9.0, updated_at=12.0, attempts=[a],
               cancel_reason=reason)


def test_a_row_the_database_refuses_never_blocks_the_rows_behind_it(db_url: str) -> None:
    h = History(db_url)
    real = h._write

    def write(batch, sanitize=False):  # type: ignore[no-untyped-def]
        if any(job.id == "always-refused" for job, _ in batch):
            raise DataError("INSERT", {}, Exception("refused by this test"))
        real(batch, sanitize=sanitize)

    try:
        h._write = write  # type: ignore[method-assign]
        for i, jid in enumerate(["a-before", "always-refused", "m-nul", "z-after"]):
            h.record(_job(jid, reason="stopped\x00by operator" if jid == "m-nul" else ""), i + 1)
        assert h.flush() == 4
        assert h.dropped == 1
        assert h.get_job("always-refused") is None
        # A NUL in what only an attempt's row holds (an agent's GPU model): written without
        # it too (found by a review: the attempts were not cleaned, and the job was dropped).
        odd = _job("g-nul")
        odd.attempts[0].gpu_model = "H1\x0000"
        h.record(odd, 5)
        assert h.flush() == 1 and h.dropped == 1
        for jid in ("a-before", "m-nul", "z-after", "g-nul"):
            assert h.get_job(jid) is not None, jid
        assert h.count_attempts(job_id="g-nul") == 1
        # SQLite stores a NUL; PostgreSQL refuses it, and the row is written without it.
        want = "stopped\x00by operator" if h.dialect == "sqlite" else "stoppedby operator"
        events = h.list_events(job_id="m-nul", limit=50)
        assert [e.message for e in events if e.kind == "job.failed"] == [want]
    finally:
        h.close()


def test_a_read_only_database_drops_no_row_and_takes_them_once_writable(postgres_url: str) -> None:  # noqa: F811
    """Found by exploring: a database that refuses writes without being down (a standby
    after a failover: "read-only transaction", SQLSTATE 25006; permission denied) had every
    row taken for a bad one and dropped, for good. Only what a row holds drops it; the
    rows wait for the database as they do through an outage."""
    from sqlalchemy.engine import make_url

    from tests.integration.postgres import _admin_execute

    name = make_url(postgres_url).database
    h = History(postgres_url)
    try:
        h.record(_job("ro-before"), 1)
        assert h.flush() == 1
        _admin_execute(postgres_url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        h.engine.dispose()  # new sessions: read-only
        h.record(_job("ro-during"), 2)
        with pytest.raises(Exception, match="read-only"):  # noqa: PT011 - the driver's error, as it comes
            h.flush()
        assert h.dropped == 0
        _admin_execute(postgres_url, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        h.engine.dispose()
        assert h.flush() == 1 and h.get_job("ro-during") is not None
    finally:
        h.close()


def test_alerts_are_counted_under_a_languages_collation(postgres_server: str) -> None:  # noqa: F811
    """Found by exploring: on a database made with an en_US collation (the compose
    PostgreSQL's), `alerts` counted 0 beside the alerts it listed: the count was a range
    on `kind` ('alert.' to 'alert/') that such a collation orders otherwise."""
    import uuid

    from sqlalchemy.engine import make_url

    from tests.integration.postgres import _admin_execute

    name = f"t_{uuid.uuid4().hex[:16]}"
    # (ICU's en-US with punctuation ignorable orders as glibc's en_US.UTF-8 does; no glibc
    # locale but C is installed here.)
    _admin_execute(postgres_server, f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE_PROVIDER icu "
                                    "ICU_LOCALE 'en-US-u-ka-shifted' LOCALE 'C.UTF-8'")
    h = History(make_url(postgres_server).set(database=name).render_as_string(hide_password=False))
    try:
        with h.engine.begin() as conn:
            for i, kind in enumerate(["alert.host.lost", "alert.queue.starved", "job.placed", "alertx"]):
                conn.execute(h._insert(EventRow).values(id=f"e{i}", ts=float(i), kind=kind))
        rows, total = h.list_alerts()
        assert [r.kind for r in rows] == ["alert.queue.starved", "alert.host.lost"] and total == 2
    finally:
        h.close()
        _admin_execute(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_an_event_with_nul_is_recorded_and_the_events_behind_it_too(nats_url: str, db_url: str) -> None:
    history = History(db_url)
    nc = await connect(nats_url, name="test-recorder-nul")
    try:
        store = Store(nc)
        await ensure_streams(store)
        subject = f"{subjects.EVENTS_PREFIX}.host.cordon"
        for i, msg in enumerate(["first", "cordon by op: flaky\x00NIC", "last"]):
            await store.js.publish(subject, encode(Event(kind="host.cordon", ts=1.0 + i, host_id="h1", message=msg)))
        rec = Recorder(store.js, history, db_url)
        stop = asyncio.Event()
        task = asyncio.create_task(rec.run(stop))
        await eventually(lambda: rec.recorded >= 3, timeout=30, what="the events recorded")
        stop.set()
        await asyncio.wait_for(task, timeout=15)
        rows = history.list_events(host_id="h1", limit=10)
        # SQLite stores a NUL; PostgreSQL refuses it, and the event is written without it.
        middle = "cordon by op: flaky\x00NIC" if history.dialect == "sqlite" else "cordon by op: flakyNIC"
        assert [r.message for r in rows] == ["first", middle, "last"]
        assert isinstance(rows[0], EventRow) and rec.dropped == 0
    finally:
        await nc.close()
        history.close()


async def test_a_full_input_stream_refuses_new_messages_and_keeps_what_it_took(nats_url: str) -> None:
    """STATUS, CMDS and SUBMIT are capped work queues that refuse new messages when full
    (the publisher gets an error and keeps its message) rather than dropping ones already
    acknowledged to their senders. Shown on a stream configured the same way, with a
    cap of three messages."""
    from nats.js import api as jsapi
    from nats.js import errors as jserrors

    from server.state.streams import INPUT_CAPS, log_stream, stream_configs

    configs = {c.name: c for c in stream_configs(1)}
    for name in (subjects.STATUS_STREAM, subjects.CMDS_STREAM, subjects.SUBMIT_STREAM):
        c = configs[name]
        assert (c.max_msgs, c.max_bytes) == INPUT_CAPS[name] and c.discard == jsapi.DiscardPolicy.NEW, c
        assert c.retention == jsapi.RetentionPolicy.WORK_QUEUE
    nc = await connect(nats_url, name="caps")
    try:
        store = Store(nc)
        small = log_stream(subjects.STATUS_STREAM, [f"{subjects.STATUS_PREFIX}.>"], 1, work_queue=True,
                           max_age_days=7, max_msgs=3)
        await store.js.add_stream(small)
        for i in range(3):
            await store.js.publish(subjects.status_subject("h1"), f"report {i}".encode(), timeout=5)
        with pytest.raises(jserrors.APIError, match="maximum messages exceeded"):
            await store.js.publish(subjects.status_subject("h1"), b"report 3", timeout=5)
        kept = [(await store.js.get_msg(subjects.STATUS_STREAM, seq)).data for seq in (1, 2, 3)]
        assert kept == [b"report 0", b"report 1", b"report 2"]
    finally:
        await nc.close()
