"""Copies host/domain events and alerts from their streams into the history database.

One durable consumer per history database (its name is derived from the database
URL, and for SQLite from the identity kept in the file as well): replicas sharing one
PostgreSQL share the consumer, so each event is written once; a replica with its own
SQLite file has its own consumer and gets every event, wherever the file lies.
Event ids are `<stream>:<sequence>:<stored at, µs>`: a redelivered message is not written
twice, and after the streams were recreated (a NATS store wiped, sequences starting at 1
again) new events do not collide with the ones already recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence

from nats.js import api as jsapi
from nats.js.client import JetStreamContext

from server.history.database import History, without_nul, write_isolating
from server.history.models import EventRow
from wire import subjects
from wire.errors import DecodeError
from wire.messages import Event, decode

log = logging.getLogger(__name__)

# A durable consumer no historian has fetched from for this long is deleted by NATS: that
# of a replica gone for good, or of a SQLite file removed, no longer weighs on the server
# (on a replicated stream each consumer is a Raft group of its own) for ever. A historian
# away for longer creates it again and records what the streams still hold once more
# (event ids are deterministic: nothing is written twice).
INACTIVE_S = 86400.0


def consumer_name(db_url: str, database_id: str = "") -> str:
    """The durable consumer of a history database: by its URL, and by the identity kept in
    it when given (for a SQLite file: found by a review, two replicas whose files had the
    same path, the default data directory, shared one consumer and each recorded half the
    events)."""
    key = f"{db_url}#{database_id}" if database_id else db_url
    return "history-" + hashlib.sha256(key.encode()).hexdigest()[:12]


class Recorder:
    def __init__(self, js, history: History, db_url: str) -> None:
        self.js = js
        self.history = history
        self.durable = consumer_name(db_url, history.database_id() if history.dialect == "sqlite" else "")
        self.recorded = 0
        self.dropped = 0  # events the database refused even without their NUL characters

    def _rows(self, stream: str, msgs: list) -> list[dict[str, object]]:
        rows = []
        for m in msgs:
            try:
                ev = decode(Event, m.data)
            except DecodeError:
                log.warning("dropped malformed event on %s", m.subject)
                continue
            kind = ev.kind if stream == subjects.EVENTS_STREAM else "alert." + m.subject.split(".", 1)[1]
            meta = m.metadata
            stored_us = round(meta.timestamp.timestamp() * 1e6)
            rows.append(dict(id=f"{stream}:{meta.sequence.stream}:{stored_us}", ts=ev.ts, kind=kind[:64],
                             job_id=ev.job_id, host_id=ev.host_id, message=ev.message[:2000]))
        return rows

    def _write(self, rows: Sequence[dict[str, object]]) -> None:
        engine = self.history.engine
        if engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        table = EventRow.__table__  # type: ignore[attr-defined]
        with engine.begin() as conn:
            conn.execute(insert(table).on_conflict_do_nothing(index_elements=["id"]), list(rows))

    def _config(self, subject: str) -> jsapi.ConsumerConfig:
        return jsapi.ConsumerConfig(durable_name=self.durable, name=self.durable, filter_subject=subject,
                                    ack_wait=30, max_ack_pending=20_000, deliver_policy=jsapi.DeliverPolicy.ALL,
                                    inactive_threshold=INACTIVE_S)

    async def _subscribe(self, stream: str, subject: str) -> JetStreamContext.PullSubscription:
        """The durable consumer's pull subscription, the consumer created, or brought to this
        release's settings (`INACTIVE_S`: one an older release created has none) first."""
        try:
            await self.js.add_consumer(stream, config=self._config(subject))  # creates or updates
        except Exception as exc:  # noqa: BLE001 - a setting this server cannot change: subscribe as it is
            log.debug("recorder %s: consumer not updated: %s", stream, exc)
        return await self.js.pull_subscribe(subject, durable=self.durable, stream=stream, config=self._config(subject))

    async def _follow(self, stream: str, stop: asyncio.Event) -> None:
        sub = None
        while not stop.is_set():
            try:
                if sub is None:
                    subject = (
                        f"{subjects.EVENTS_PREFIX}.>"
                        if stream == subjects.EVENTS_STREAM
                        else f"{subjects.ALERTS_PREFIX}.>"
                    )
                    sub = await self._subscribe(stream, subject)
                msgs = await sub.fetch(batch=500, timeout=1)
            except TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - NATS restarting; try again
                log.debug("recorder %s: %s", stream, exc)
                sub = None
                await asyncio.sleep(1)
                continue
            rows = self._rows(stream, msgs)
            try:
                if rows:
                    self.dropped += await asyncio.to_thread(
                        write_isolating, self._write, rows, lambda r: self._write([without_nul(x) for x in r]),
                        lambda r: f"event {r[0]['id']}")
            except Exception:  # noqa: BLE001 - database down: leave unacked, retried later
                log.exception("recording %d events failed", len(rows))
                await asyncio.sleep(1)
                continue
            for m in msgs:
                try:
                    await m.ack()
                except Exception:  # noqa: BLE001
                    pass
            self.recorded += len(rows)
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001
                pass

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            self._follow(subjects.EVENTS_STREAM, stop),
            self._follow(subjects.ALERTS_STREAM, stop),
        )
