"""The recorder copies events from the EVENTS stream into history against a real
nats-server: each event once, even when redelivered, and none lost when the streams are
recreated (a wiped NATS store numbers its messages from 1 again)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlmodel import Session, select

from server.history.database import History
from server.history.models import EventRow
from server.history.recorder import Recorder
from server.state.streams import ensure_streams
from wire import subjects
from wire.kv import Store, connect
from wire.messages import Event, encode


def rows(history: History) -> list[EventRow]:
    with Session(history.engine) as s:
        return list(s.exec(select(EventRow).order_by(EventRow.ts)).all())  # type: ignore[arg-type]


async def record_all(rec: Recorder, js) -> None:  # type: ignore[no-untyped-def]
    """Run the recorder until its EVENTS consumer has been delivered the whole stream and
    has acknowledged it (acks follow the database write), then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(rec.run(stop))
    try:
        last = (await js.stream_info(subjects.EVENTS_STREAM)).state.last_seq
        for _ in range(600):
            try:
                ci = await js.consumer_info(subjects.EVENTS_STREAM, rec.durable)
                if ci.delivered.stream_seq >= last and ci.num_ack_pending == 0:
                    break
            except Exception:  # noqa: BLE001 - not created yet
                pass
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the recorder did not acknowledge the stream")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


async def test_events_survive_recreated_streams_and_redelivery(nats_url: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'history.db'}"
    history = History(db)
    nc = await connect(nats_url, name="test-recorder")
    try:
        store = Store(nc)
        await ensure_streams(store)
        subject = f"{subjects.EVENTS_PREFIX}.host.suspect"
        await store.js.publish(subject, encode(Event(kind="host.suspect", ts=1.0, host_id="h1")))
        await record_all(Recorder(store.js, history, db), store.js)
        assert [(r.kind, r.host_id) for r in rows(history)] == [("host.suspect", "h1")]

        # The same message delivered again (a consumer replaying the stream) adds nothing.
        await store.js.delete_consumer(subjects.EVENTS_STREAM, Recorder(store.js, history, db).durable)
        await record_all(Recorder(store.js, history, db), store.js)
        assert len(rows(history)) == 1

        # The store is wiped: the stream is recreated and its first message is sequence 1
        # again. The new event is recorded beside the old one, not taken for it.
        await store.js.delete_stream(subjects.EVENTS_STREAM)
        await ensure_streams(store)
        ack = await store.js.publish(subject, encode(Event(kind="host.suspect", ts=2.0, host_id="h1")))
        assert ack.seq == 1
        await record_all(Recorder(store.js, history, db), store.js)
        assert [(r.kind, r.host_id, r.ts) for r in rows(history)] == [
            ("host.suspect", "h1", 1.0), ("host.suspect", "h1", 2.0)]
    finally:
        await nc.close()
        history.close()


async def test_two_sqlite_files_at_the_same_path_each_record_every_event(nats_url: str, tmp_path: Path) -> None:
    """Two replicas on two machines, each with its own SQLite file at the same path (the
    default data directory: one URL): each file gets every event (found by a review: they
    shared one consumer, and each recorded about half). Replicas sharing one database (one
    file here) share its consumer, as they do one PostgreSQL."""
    url = "sqlite:///.muster/history.db"  # what both replicas are given
    a, b = History(f"sqlite:///{tmp_path / 'a.db'}"), History(f"sqlite:///{tmp_path / 'b.db'}")
    shared = History(f"sqlite:///{tmp_path / 'a.db'}")  # a second replica on machine A's file
    nc = await connect(nats_url, name="t")
    try:
        store = Store(nc)
        await ensure_streams(store)
        for i in range(50):
            await store.js.publish(f"{subjects.EVENTS_PREFIX}.host.suspect",
                                   encode(Event(kind="host.suspect", ts=float(i), host_id=f"h{i}")))
        ra, rb = Recorder(store.js, a, url), Recorder(store.js, b, url)
        assert ra.durable != rb.durable and Recorder(store.js, shared, url).durable == ra.durable
        await asyncio.gather(record_all(ra, store.js), record_all(rb, store.js))
        assert len(rows(a)) == len(rows(b)) == 50
    finally:
        await nc.close()
        for h in (a, b, shared):
            h.close()


async def test_the_recorders_consumers_go_once_nobody_fetches_from_them(nats_url: str, tmp_path: Path) -> None:
    """Found by exploring: the durable consumers had no inactivity threshold, so those of a
    replica gone for good stayed on the NATS server for ever. Each now has one
    (recorder.INACTIVE_S), also one an older release created without it."""
    from nats.js import api as jsapi

    from server.history import recorder as recorder_module

    db = f"sqlite:///{tmp_path / 'history.db'}"
    history = History(db)
    nc = await connect(nats_url, name="test-recorder")
    try:
        store = Store(nc)
        await ensure_streams(store)
        rec = Recorder(store.js, history, db)
        # An older release's consumer of the ALERTS stream: no threshold.
        await store.js.add_consumer(subjects.ALERTS_STREAM, config=jsapi.ConsumerConfig(
            durable_name=rec.durable, filter_subject=f"{subjects.ALERTS_PREFIX}.>", ack_wait=30,
            max_ack_pending=20_000, deliver_policy=jsapi.DeliverPolicy.ALL))
        await store.js.publish(f"{subjects.EVENTS_PREFIX}.host.suspect",
                               encode(Event(kind="host.suspect", ts=1.0, host_id="h1")))
        await record_all(rec, store.js)
        for stream in (subjects.EVENTS_STREAM, subjects.ALERTS_STREAM):
            info = await store.js.consumer_info(stream, rec.durable)
            assert info.config.inactive_threshold, (stream, info.config)
            assert info.config.inactive_threshold == recorder_module.INACTIVE_S
    finally:
        await nc.close()
        history.close()
