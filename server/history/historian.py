"""The historian: writes job history, host events and alerts into SQL from a process of
its own, so database work never competes with scheduling for the server's interpreter.

`muster server` starts it beside the API/scheduler process; it watches the job records
in the `state` bucket and follows the EVENTS and ALERTS streams (server.history.recorder),
settles the jobs whose end it never read (server.history.reconcile), and stops cleanly
on SIGTERM after a last flush. Writes are idempotent, so a restart never duplicates
anything. Of the replicas sharing one PostgreSQL database, one historian
writes at a time (server.history.writerlease); the others wait to take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from server import metrics
from server.childproc import HelperProcess
from server.history import writehealth
from server.history.database import History
from server.history.writehealth import WriteHealth
from server.history.writerlease import WriterLease, lease_key, shared_database
from wire import subjects
from wire.errors import StoreError
from wire.kv import Store
from wire.messages import encode
from wire.stopping import pause

log = logging.getLogger(__name__)

HISTORIAN_NICE = 10  # added to the historian process's nice value
RESTART_EVERY_S = 2.0  # after writing could not start or stopped on an error
WATCH_EVERY_S = 5.0  # how often whether history is written is looked at (alerts, the gauge)

# Told how long history has gone unwritten (seconds), every WATCH_EVERY_S while writing.
Report = Callable[[float], None]


@dataclass(frozen=True)
class HistorianConfig:
    nats_url: str
    database_url: str
    retention_days: float | None = None
    # How long a finished job's last record stays in the state bucket (ServerConfig's):
    # older jobs history holds as not ended are looked for there (server.history.reconcile).
    finished_job_ttl_s: float = 3600.0
    nats_creds: str | None = None
    nats_ca: str | None = None
    nats_cert: str | None = None
    nats_key: str | None = None


async def run(cfg: HistorianConfig, stop: asyncio.Event, report: Report | None = None) -> None:
    """Write history until `stop`. A database of its own (SQLite) is written at once; a
    shared one (PostgreSQL, which every replica's historian is given) only while this
    historian holds the writer lease (server.history.writerlease). While it writes, it
    alerts when history goes unwritten (`watch_writes`) and tells `report` for how long."""
    from wire.kv import Store, connect

    nc = await connect(cfg.nats_url, name="muster-historian", creds=cfg.nats_creds, tls_ca=cfg.nats_ca,
                       tls_cert=cfg.nats_cert, tls_key=cfg.nats_key)
    store = Store(nc)
    try:
        if shared_database(cfg.database_url):
            await _write_while_leased(cfg, store, stop, report)
        else:
            await _write_until(cfg, store, stop, report)
    finally:
        try:
            await asyncio.wait_for(nc.drain(), timeout=5)
        except Exception:  # noqa: BLE001
            await nc.close()


async def _write_while_leased(cfg: HistorianConfig, store: Store, stop: asyncio.Event,
                              report: Report | None = None) -> None:
    lease = WriterLease(store, lease_key(cfg.database_url),
                        holder=f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}")
    while not stop.is_set():
        try:
            held = await lease.acquire()
        except StoreError as exc:
            log.warning("history writer lease: %s", exc)
            held = False
        if not held:
            await pause(stop, lease.retry_every_s)
            continue
        log.info("this historian writes the shared history database")
        lost = asyncio.Event()  # set when the lease is lost, or on stop
        keeper = asyncio.create_task(_keep(lease, stop, lost), name="history-writer-lease")
        try:
            await _write_until(cfg, store, lost, report)
        finally:
            lost.set()
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        if stop.is_set():
            await lease.release()  # given up by the keeper already, unless it was cancelled first


async def _keep(lease: WriterLease, stop: asyncio.Event, lost: asyncio.Event) -> None:
    """Renew the lease until `stop`, or until it is lost; then set `lost`. On `stop` the
    lease is given up first, before this writer's last flush: that flush may take long
    (a niced process on a busy machine, a slow database), and a NATS node lost meanwhile
    would make a later release fail and leave history to the key's TTL. The next writer
    may start while this one flushes; the writes are idempotent."""
    while not await pause(stop, lease.renew_every_s):
        if not await lease.renew():
            log.warning("history writer lease lost: another historian writes the shared database")
            break
    else:
        await lease.release()
    lost.set()


async def _write_until(cfg: HistorianConfig, store: Store, stop: asyncio.Event,
                       report: Report | None = None) -> None:
    """Write until `stop`. Writing may fail to start, or end, when the database or NATS is
    down (a schema check needs the database, a watch needs the stream's leader): it is
    started again every RESTART_EVERY_S, never given up, since no other process would
    write this history instead. Whether it gets written is watched meanwhile
    (`watch_writes`)."""
    health = WriteHealth(behind_after_s=writehealth.BEHIND_AFTER_S)
    watcher = asyncio.create_task(watch_writes(store.nc, health, stop, report, every_s=WATCH_EVERY_S),
                                  name="history-write-watch")
    try:
        while not stop.is_set():
            try:
                await _write(cfg, store, stop, health)
            except Exception as exc:  # noqa: BLE001 - database or NATS down: try again
                health.failed(time.time(), why(exc))
                log.warning("history writing stopped (%s); starting again in %.0f s", why(exc), RESTART_EVERY_S)
                await pause(stop, RESTART_EVERY_S)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if report is not None:
            report(0.0)  # (no longer writing: not this replica's to say)


async def watch_writes(nc: Any, health: WriteHealth, stop: asyncio.Event, report: Report | None = None,
                       every_s: float = WATCH_EVERY_S) -> None:
    """Every `every_s` until `stop`: publish the alert `health` calls for (history.behind,
    history.recovered; best effort, as every alert) and tell `report` how long history has
    gone unwritten."""
    while True:
        now = time.time()
        if report is not None:
            report(health.unwritten_s(now))
        ev = health.alert(now)
        if ev is not None:
            log.warning("alert %s: %s", ev.kind, ev.message)
            try:
                await nc.publish(f"{subjects.ALERTS_PREFIX}.{ev.kind}", encode(ev))
            except Exception as exc:  # noqa: BLE001 - alerts are best effort; the log keeps them
                log.warning("alert %s not published: %s", ev.kind, exc)
        if await pause(stop, every_s):
            return


def why(exc: BaseException) -> str:
    """An error as one line; a task group's, as the errors of its tasks (not "unhandled
    errors in a TaskGroup")."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(why(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


async def _write(cfg: HistorianConfig, store: Store, stop: asyncio.Event, health: WriteHealth) -> None:
    from server.history import reconcile
    from server.history.recorder import Recorder
    from wire.records import Record

    history = History(cfg.database_url, retention_days=cfg.retention_days)
    job_prefix = subjects.job_key("")

    def on_job(rec: Record) -> None:
        if rec.value is not None:
            # Decoded at the next flush, and only if no newer revision came first.
            history.record_raw(rec.key.removeprefix(job_prefix), rec.value, rec.revision)

    try:
        watch = await store.watch("job.>", on_job, bucket=subjects.STATE_BUCKET,
                                  after_seq=await _resume_point(store, history))
        try:
            recorder = Recorder(store.js, history, cfg.database_url)
            async with asyncio.TaskGroup() as group:  # one failing stops the other
                group.create_task(history.run(stop, health=health), name="history-flush")
                group.create_task(recorder.run(stop), name="history-recorder")
                group.create_task(reconcile.run(store, history, cfg.finished_job_ttl_s, stop),
                                  name="history-reconcile")
        finally:
            await watch.stop()
    finally:
        history.close()


async def _resume_point(store: Store, history: History) -> int:
    """Where to start reading the job records: after the position the history database
    holds for the state stream (every record up to it is written), or from the start when
    it holds none for this stream. A writer that takes over, or starts again, then reads
    the records of the last seconds, not every job in the bucket (500,000 records took
    minutes on a saturated machine, behind which new ones waited)."""
    info = await store.js.stream_info(subjects.STATE_STREAM)
    origin = info.created.isoformat() if info.created is not None else ""
    # (0 for a stream numbered anew: created anew, or put back from a backup with the
    # same creation time and fewer records than the position stored)
    start = await asyncio.to_thread(history.follow, subjects.STATE_STREAM, origin, info.state.last_seq)
    if start:
        log.info("history: reading job records after state sequence %d", start)
    return start


def main(config: dict[str, object], unwritten: Any = None) -> None:
    """Process entry point (multiprocessing, spawn). History has no deadline and catches
    up from durable consumers, so on a busy machine the scheduler and the heartbeat
    ingest go first (nice +10). `unwritten`: a shared double the server reads for
    `muster_history_unwritten_seconds`."""
    from server.childproc import run_helper

    logging.getLogger("alembic").setLevel(logging.WARNING)
    cfg = HistorianConfig(**config)  # type: ignore[arg-type]

    def report(seconds: float) -> None:
        unwritten.value = seconds

    run_helper("muster-history", lambda stop: run(cfg, stop, report if unwritten is not None else None),
               nice=HISTORIAN_NICE)


class HistorianProcess(HelperProcess):
    """Starts the historian beside this process, again when it has died (run), and stops it."""

    label = "historian"

    def __init__(self, cfg: HistorianConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self._ctx = multiprocessing.get_context("spawn")
        # How long the history it writes has gone unwritten, as it last said (watch_writes).
        self._unwritten = self._ctx.Value("d", 0.0, lock=False)

    def unwritten_s(self) -> float:
        return float(self._unwritten.value)

    def start(self) -> None:
        self._unwritten.value = 0.0
        self.proc = self._ctx.Process(target=main, args=(asdict(self.cfg), self._unwritten), name="muster-historian",
                                      daemon=True)
        self.proc.start()

    def restarted(self) -> None:
        metrics.HISTORIAN_RESTARTS.inc()

    def stop(self, timeout: float = 15) -> None:
        super().stop(timeout)  # SIGTERM: last flush, then exit
