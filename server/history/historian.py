"""The historian: writes job history, host events and alerts into SQL from a process of
its own, so database work never competes with scheduling for the server's interpreter.

`muster server` starts it beside the API/scheduler process; it watches the job records
in the `state` bucket and follows the EVENTS and ALERTS streams (server.history.recorder), and
stops cleanly on SIGTERM after a last flush. Writes are idempotent, so a restart (or a
second replica writing to the same PostgreSQL database) never duplicates anything.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from dataclasses import asdict, dataclass

from server.childproc import stop_helper

log = logging.getLogger(__name__)

HISTORIAN_NICE = 10  # added to the historian process's nice value


@dataclass(frozen=True)
class HistorianConfig:
    nats_url: str
    database_url: str
    retention_days: float | None = None
    nats_creds: str | None = None
    nats_ca: str | None = None
    nats_cert: str | None = None
    nats_key: str | None = None


async def run(cfg: HistorianConfig, stop: asyncio.Event) -> None:
    from server.history.database import History
    from server.history.recorder import Recorder
    from wire import subjects
    from wire.kv import Store, connect
    from wire.records import Record

    history = History(cfg.database_url, retention_days=cfg.retention_days)
    nc = await connect(cfg.nats_url, name="muster-historian", creds=cfg.nats_creds, tls_ca=cfg.nats_ca,
                       tls_cert=cfg.nats_cert, tls_key=cfg.nats_key)
    store = Store(nc)
    job_prefix = subjects.job_key("")

    def on_job(rec: Record) -> None:
        if rec.value is not None:
            # Decoded at the next flush, and only if no newer revision came first.
            history.record_raw(rec.key.removeprefix(job_prefix), rec.value, rec.revision)

    watch = await store.watch("job.>", on_job, bucket=subjects.STATE_BUCKET)
    recorder = Recorder(store.js, history, cfg.database_url)
    try:
        await asyncio.gather(history.run(stop), recorder.run(stop))
    finally:
        await watch.stop()
        try:
            await asyncio.wait_for(nc.drain(), timeout=5)
        except Exception:  # noqa: BLE001
            await nc.close()
        history.close()


def main(config: dict[str, object]) -> None:
    """Process entry point (multiprocessing, spawn). History has no deadline and catches
    up from durable consumers, so on a busy machine the scheduler and the heartbeat
    ingest go first (nice +10)."""
    from server.childproc import run_helper

    logging.getLogger("alembic").setLevel(logging.WARNING)
    cfg = HistorianConfig(**config)  # type: ignore[arg-type]
    run_helper("muster-history", lambda stop: run(cfg, stop), nice=HISTORIAN_NICE)


class HistorianProcess:
    """Starts and stops the historian beside this process."""

    def __init__(self, cfg: HistorianConfig) -> None:
        self.cfg = cfg
        self.proc: multiprocessing.process.BaseProcess | None = None

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(target=main, args=(asdict(self.cfg),), name="muster-historian", daemon=True)
        self.proc.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def stop(self, timeout: float = 15) -> None:
        stop_helper(self.proc, timeout)  # SIGTERM: last flush, then exit
        self.proc = None
