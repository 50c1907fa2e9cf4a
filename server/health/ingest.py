"""Heartbeat ingest: reads the `hosts` bucket in a process of its own and hands the
server compact batches, so that reading 10,000 heartbeats/s (50,000 hosts) does not
compete with scheduling for the server's interpreter.

The child process runs the same watch of `KV_hosts` an in-process server runs (an
ordered consumer: every host's last heartbeat, then each new one and each TTL expiry
marker) and sends its parent, every `flush_s` and at most `batch_max` records at a time,
one `HeartbeatBatch` over a pipe. The parent applies it to its ClusterState
(`ClusterState.apply_heartbeat`) on its event loop: a few microseconds per heartbeat,
instead of the NATS client's per-message work. Every record keeps its stream revision
and the time the store stored it; each batch also says how far the stream has been
sent, which moves the server's read clock
(server.health.readclock: hosts are judged on what has been read, not on the wall clock).

`muster server` runs it unless `--heartbeats-in-process`. The parent restarts a child
that dies (`muster_heartbeat_ingest_restarts_total`); the new child replays every
host's last heartbeat, and older revisions are ignored.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import NamedTuple

from nats.errors import Error as NatsError

from server import metrics
from server.childproc import HelperProcess
from wire import subjects
from wire.stopping import pause

log = logging.getLogger(__name__)


# Records a second a follower's reading of the bucket hands its server (IngestConfig.every_s),
# and how soon it reads again while hosts are joining.
READING_RATE = 5000.0
JOINING_EVERY_S = 1.0


@dataclass(frozen=True)
class IngestConfig:
    nats_url: str
    nats_creds: str | None = None
    nats_ca: str | None = None
    nats_cert: str | None = None
    nats_key: str | None = None
    flush_s: float = 0.2
    batch_max: int = 2000
    # While the server follows (not live): read the bucket every this many seconds, each
    # host's last heartbeat once, and nothing between (0: always read it as it changes).
    every_s: float = 0.0


class HeartbeatBatch(NamedTuple):
    received_at: float  # when the child received the first of these records
    synced: bool  # the child's watch has replayed the whole bucket
    keys: list[str]
    revisions: list[int]
    values: list[bytes | None]  # None: the key's TTL expiry marker
    shapes: list[str | None]  # the Muster-Shape header
    stamps: list[float]  # when the store stored each record (its clock; 0.0 unknown)
    # Every record the store held before this time (its clock) has now been sent (0.0:
    # unknown), and `behind` records were still unsent (in the stream or in the child).
    position: float = 0.0
    behind: int = 0
    skipped: int = 0  # records the watch never saw (removed from the stream first) since the last batch
    # The child goes on reading as records are stored (False: a sparse follower's reading
    # of the bucket, after which it reads nothing until the next; the server's read clock
    # then stands at `position` rather than run on).
    live: bool = True
    # The bucket was emptied and numbers its records afresh (every NATS node restarted with
    # it in memory): the server forgets the revisions it read before applying these.
    reset: bool = False
    # The TTL each heartbeat was stored with (`Nats-TTL`, seconds; 0.0 none, and for an
    # expiry), in the order of `keys`.
    ttls: list[float] | None = None
    # Hosts whose heartbeat was published with `Nats-Rollup: all` (every other host's was
    # removed from the bucket as it was stored), and when it was stored.
    rollups: list[tuple[str, float]] | None = None
    # Every record of each key's latest that the child's current watch began with has been
    # sent (it is not in the middle of reading the bucket: ReadClock.whole).
    whole: bool = False


# ---------------------------------------------------------------- child


class Pending:
    """Records waiting to be sent, at most one heartbeat and one expiry per host, so what
    waits is bounded by the number of hosts however long the server does not read (it
    may be stopped). A newer heartbeat replaces an older one (the server keeps only the
    newest); an expiry replaces the heartbeats before it and stays when the host comes
    back, and expiries are sent first, so the server still sees the loss.

    Each record keeps the time the store stored it (`stamp`) and the stamp of the first
    record of its host that has waited since (`first`): a host keeps its place, so the
    first waiting entry holds the oldest unsent record. A batch says how far the stream
    has been sent (`position`): every record stored before it has reached the server
    (or was replaced by a newer one that has). That is the oldest unsent stamp while
    records wait, and the newest read when none do. `first_at` is when the oldest
    waiting record was received here (a batch carries it as `received_at`)."""

    def __init__(self) -> None:
        # key -> (revision, value, shape, stamp, first stamp, first received here, TTL)
        self.beats: dict[str, tuple[int, bytes, str | None, float, float, float, float]] = {}
        # key -> (revision, stamp, first stamp, first received here)
        self.expired: dict[str, tuple[int, float, float, float]] = {}
        self.first_at = 0.0
        self.read_to: tuple[float, int] = (0.0, 0)  # newest stamp read, pending in the stream after it
        self.skipped = 0
        # Hosts whose heartbeat was published with Nats-Rollup: all, and when the first since
        # the last batch was stored (one a host, however often it is sent).
        self.rollups: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.beats) + len(self.expired)

    def clear(self) -> None:
        """Forget what waits (read from a stream since emptied)."""
        self.beats.clear()
        self.expired.clear()
        self.read_to = (0.0, 0)

    def add(self, key: str, revision: int, value: bytes | None, shape: str | None, now: float,
            stamp: float = 0.0, behind: int = 0, skipped: int = 0, ttl: float = 0.0, rollup: bool = False) -> None:
        if not self:
            self.first_at = now
        self.skipped += skipped
        if rollup:
            self.rollups.setdefault(key, stamp)
        if value is None:
            old = self.beats.pop(key, None)
            gone = self.expired.get(key)
            first = min(x for x in (stamp, old and old[4], gone and gone[2]) if x is not None)
            since = min(x for x in (now, old and old[5], gone and gone[3]) if x is not None)
            self.expired[key] = (revision, stamp, first, since)
        else:
            old_beat = self.beats.get(key)
            self.beats[key] = (revision, value, shape, stamp, old_beat[4] if old_beat else stamp,
                               old_beat[5] if old_beat else now, ttl)
        if stamp >= self.read_to[0]:
            self.read_to = (stamp, behind)

    @staticmethod
    def _first(waiting: dict, n: int) -> list[tuple]:
        """Remove and return the first `n` entries of `waiting` (in the order they came)."""
        if n <= 0 or not waiting:
            return []
        if len(waiting) <= n:
            out = list(waiting.items())
            waiting.clear()
            return out
        out = list(itertools.islice(waiting.items(), n))
        for key, _ in out:
            del waiting[key]
        return out

    def take(self, n: int, synced: bool, live: bool = True) -> HeartbeatBatch:
        """Up to `n` records, expiries first, removed from what waits. The batch says
        `synced` only if the watch is (`synced`) and nothing is left waiting."""
        gone = self._first(self.expired, n)
        beats = self._first(self.beats, n - len(gone))
        keys = [k for k, _ in gone] + [k for k, _ in beats]
        revs = [e[0] for _, e in gone] + [e[0] for _, e in beats]
        values: list[bytes | None] = [None] * len(gone) + [e[1] for _, e in beats]
        shapes: list[str | None] = [None] * len(gone) + [e[2] for _, e in beats]
        stamps = [e[1] for _, e in gone] + [e[3] for _, e in beats]
        ttls = [0.0] * len(gone) + [e[6] for _, e in beats]
        rollups, self.rollups = list(self.rollups.items()), {}
        received_at = self.first_at
        if self:
            # Heartbeats wait in the order their hosts started waiting; an expiry may
            # carry the older stamp of the heartbeat it replaced, and expiries are few.
            firsts = [(e[2], e[3]) for e in self.expired.values()]
            firsts += [(e[4], e[5]) for e in (next(iter(self.beats.values()), None),) if e is not None]
            # Stamps are nanoseconds from the store: stop just short of the oldest unsent.
            position, behind = max(0.0, min(f[0] for f in firsts) - 1e-6), self.read_to[1] + len(self)
            self.first_at = min(f[1] for f in firsts)
        else:
            position, behind = self.read_to
        # Every batch until the child has drained says whether records were skipped
        # since it last did, so the server cannot release its clock half-way through.
        skipped = self.skipped
        if not self:
            self.skipped = 0
        return HeartbeatBatch(received_at, synced and not self, keys, revs, values, shapes, stamps,
                              position, behind, skipped, live, ttls=ttls, rollups=rollups or None)


class LiveSwitch:
    """The child's end of the pipe on which the parent says, once, that its server leads:
    set from the first message on (a pipe, not a multiprocessing Event, whose semaphore
    the resource tracker reports as leaked when the server stops)."""

    def __init__(self, conn: Connection | None) -> None:
        self.conn = conn
        self.on = False

    def is_set(self) -> bool:
        if not self.on and self.conn is not None:
            try:
                if self.conn.poll():
                    self.on = bool(self.conn.recv())
            except (EOFError, OSError):
                self.conn = None  # the parent is gone: `run_helper` stops the child
        return self.on


async def run(cfg: IngestConfig, out: Connection, stop: asyncio.Event, live: LiveSwitch | None = None) -> None:
    """Watch `KV_hosts` and send batches on `out` until `stop` (or the parent is gone).
    With `cfg.every_s` and until `live` is set (its server leads): read every host's last
    heartbeat, send it, stop reading, and again every `every_s`; once `live`, read on as
    records are stored."""
    from wire import subjects
    from wire.kv import Store, connect
    from wire.messages import SHAPE_HEADER
    from wire.records import Record, rolls_up_all, stored_ttl_s

    pending = Pending()
    known: set[str] = set()  # the hosts read so far
    joined = 0  # hosts first read in the current reading
    high = 0  # the highest stream sequence read (a reading that finds the stream below it: a reset)
    # A reset not yet told to the server. A child's first batch says so whatever it finds:
    # it reads each key's latest, and one started after the bucket was renumbered (the one
    # before it died meanwhile: found by a review) would not know the stream went below what
    # its server had read.
    reset = True
    # Every record the current watch began with (each key's latest) has been sent: set
    # once its watch has replayed and a batch left nothing waiting (HeartbeatBatch.whole).
    whole = False

    def on_reset() -> None:
        nonlocal reset, high, whole
        pending.clear()  # records of the stream before: their revisions would hide the new ones
        reset, high, whole = True, 0, False

    def on_record(rec: Record) -> None:
        nonlocal joined
        if rec.key not in known:
            known.add(rec.key)
            joined += 1
        headers = rec.headers or {}
        beat = rec.value is not None
        pending.add(rec.key, rec.revision, rec.value, headers.get(SHAPE_HEADER), time.time(),
                    rec.stamp, rec.behind, rec.skipped, ttl=(stored_ttl_s(headers) or 0.0) if beat else 0.0,
                    rollup=beat and rolls_up_all(headers))

    def reading_on() -> bool:
        return cfg.every_s <= 0 or (live is not None and live.is_set())

    nc = await connect(cfg.nats_url, name="muster-heartbeat-ingest", creds=cfg.nats_creds, tls_ca=cfg.nats_ca,
                       tls_cert=cfg.nats_cert, tls_key=cfg.nats_key)
    if not reading_on():
        log.info("heartbeat ingest: reading every host's last heartbeat every %.0f s while this server follows",
                 cfg.every_s)
    loop = asyncio.get_running_loop()
    try:
        while not stop.is_set():
            began, joined = time.monotonic(), 0
            store = Store(nc)
            try:
                if high:  # emptied since the last reading (a follower's)? Looked at before reading anew.
                    last = (await store.js.stream_info(f"KV_{subjects.HOSTS_BUCKET}")).state.last_seq
                    if last < high:
                        log.warning("heartbeat ingest: the hosts bucket's last record is %d, below the %d read: it "
                                    "was emptied and numbers its records afresh", last, high)
                        on_reset()
                watch = await store.watch(">", on_record, bucket=subjects.HOSTS_BUCKET, on_reset=on_reset)
                whole = False
            except (NatsError, TimeoutError) as exc:
                # NATS away, or its stream not restored yet (found by exploring: the process
                # died with a traceback and was started again): read again in a second.
                log.warning("heartbeat ingest: cannot read the hosts bucket yet: %s", str(exc) or type(exc).__name__)
                await pause(stop, 1.0)
                continue
            sent_synced = sent_whole = False
            try:
                while not stop.is_set():
                    await pause(stop, cfg.flush_s)
                    on = reading_on()
                    done = False
                    while not stop.is_set():
                        # A reading now and then ends once the records stored before it began
                        # have come (on a busy machine it might never catch up with those
                        # stored since): the watch stops, and what came is sent.
                        done = not on and watch.replayed
                        if done:
                            await watch.stop()
                        synced = watch.synced.is_set() if on else done
                        replayed = watch.replayed
                        if not pending and synced == sent_synced and not reset and (whole or not replayed) \
                                and whole == sent_whole:
                            break
                        batch = pending.take(cfg.batch_max, synced, on)
                        # (No record comes between the look and the take: both on this loop.)
                        whole = whole or (replayed and not pending)
                        batch = batch._replace(whole=whole)
                        if reset:
                            batch, reset = batch._replace(reset=True), False
                        try:
                            # Pickling and writing happen off the loop, which keeps reading.
                            await loop.run_in_executor(None, out.send, batch)
                        except (BrokenPipeError, EOFError, OSError):
                            log.warning("heartbeat ingest: server process gone; stopping")
                            stop.set()
                            break
                        sent_synced, sent_whole = batch.synced, batch.whole
                        if not on and batch.keys:
                            # A follower's reading is handed over at a measured pace: the first
                            # reading after many hosts joined is one decode each, which at once
                            # would take the server's loop (and a core) for seconds.
                            await pause(stop, len(batch.keys) / READING_RATE)
                    if done:
                        log.debug("heartbeat ingest: read every host's last heartbeat (%d records, %d hosts new) "
                                  "in %.1f s", watch.received, joined, time.monotonic() - began)
                        break  # a follower's reading of the bucket is done: sent, not live
            finally:
                high = max(high, watch.last_seq)
                await watch.stop()
            # Until the next reading, or until the server leads. While hosts are joining (a
            # reading found hosts the ones before had not, or none at all) it comes a second
            # later: the server's view is complete soon after they are, and then costs little
            # to keep (a host's first heartbeat is decoded, later ones of the same shape are not).
            rest = time.monotonic() + (cfg.every_s if known and not joined else min(JOINING_EVERY_S, cfg.every_s))
            while not stop.is_set() and not reading_on() and time.monotonic() < rest:
                await pause(stop, min(cfg.flush_s, max(0.0, rest - time.monotonic())))
    finally:
        try:
            await asyncio.wait_for(nc.close(), timeout=5)
        except Exception:  # noqa: BLE001
            pass
        out.close()


def main(config: dict[str, object], out: Connection, control: Connection | None = None) -> None:
    """Process entry point (multiprocessing, spawn)."""
    from server.childproc import run_helper

    cfg = IngestConfig(**config)  # type: ignore[arg-type]
    run_helper("muster-ingest", lambda stop: run(cfg, out, stop, LiveSwitch(control)))


# ---------------------------------------------------------------- parent


class HeartbeatIngest(HelperProcess):
    """Starts the ingest process, applies its batches on the event loop, restarts it when
    it dies. Looks like a Watch to `Muster._wait_synced` (`bucket`, `synced`, `received`)."""

    bucket = subjects.HOSTS_BUCKET
    label = "heartbeat ingest"

    def __init__(self, cfg: IngestConfig,
                 apply: Callable[[str, int, bytes | None, str | None, float, float | None], None],
                 on_position: Callable[[float, int, float, int, bool, bool], None] | None = None,
                 on_reset: Callable[[], None] | None = None,
                 on_rollup: Callable[[str, float], None] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        # Told each record: (key, revision, value or None, shape, when stored, its TTL or None).
        self.apply = apply
        self.on_reset = on_reset  # the bucket numbers its records afresh: before a batch that says so
        # Told (stream time sent up to, records still unsent, local time, records the
        # watch skipped, whether the child reads on, whether it has read every key's
        # latest) after each batch: ReadClock.advance.
        self.on_position = on_position
        self.on_rollup = on_rollup  # a heartbeat published with Nats-Rollup: all (its key, when stored)
        # Set once the server leads: a child reading the bucket every `cfg.every_s` reads
        # it as it changes from then on (told over `_control`; a restarted child is
        # started live).
        self.live = False
        self._control: Connection | None = None
        self.synced = asyncio.Event()
        self.received = 0
        self.lag_s = 0.0  # age of the newest batch's first record when it was applied
        self.batches_read = 0  # batches taken from the pipe (one at a time: see _read)
        self._reader: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        recv, send = ctx.Pipe(duplex=False)
        control, self._control = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=main, args=(asdict(self.cfg), send, control), name="muster-heartbeat-ingest",
                                daemon=True)
        self.proc.start()
        send.close()  # the child holds the only writer: its exit is our EOF
        control.close()
        if self.live:
            self._control.send(True)  # a child restarted after its server took the lease reads live
        self._reader = threading.Thread(target=self._read, args=(recv,), name="heartbeat-ingest-reader",
                                        daemon=True)
        self._reader.start()

    def _read(self, conn: Connection) -> None:
        """Hand the loop one batch at a time: the next is read from the pipe only once the
        last one was applied. Handing over every batch as it came once queued tens of
        them on the loop while 50,000 hosts registered, and the loop ran them back to
        back for 25 s (no timer ran, not even the collector policy's). Holding back
        instead fills the pipe, and the ingest process keeps one record per host."""
        loop = self._loop
        assert loop is not None
        try:
            while True:
                try:
                    batch = conn.recv()
                except (EOFError, OSError):
                    return
                self.batches_read += 1
                applied = threading.Event()

                def apply_one(b: HeartbeatBatch = batch, done: threading.Event = applied) -> None:
                    try:
                        self._on_batch(b)
                    finally:
                        done.set()

                try:
                    loop.call_soon_threadsafe(apply_one)
                except RuntimeError:  # the loop is closed
                    return
                while not applied.wait(0.5):
                    if loop.is_closed() or self._stopping:
                        return
        finally:
            conn.close()

    def _on_batch(self, batch: HeartbeatBatch) -> None:
        if batch.reset and self.on_reset is not None:
            self.on_reset()
        apply, at = self.apply, batch.received_at
        ttls = batch.ttls or [0.0] * len(batch.keys)
        for key, rev, value, shape, stamp, ttl in zip(batch.keys, batch.revisions, batch.values, batch.shapes,
                                                      batch.stamps, ttls, strict=True):
            try:
                apply(key, rev, value, shape, stamp or at, ttl or None)
            except Exception:  # noqa: BLE001 - one bad record must not stop the rest
                log.exception("heartbeat ingest: applying %s failed", key)
        if batch.rollups and self.on_rollup is not None:
            for key, stamp in batch.rollups:
                self.on_rollup(key, stamp or at)
        if batch.position and self.on_position is not None:
            self.on_position(batch.position, batch.behind, time.time(), batch.skipped, batch.live, batch.whole)
        n = len(batch.keys)
        self.received += n
        metrics.HEARTBEATS.inc(n)
        if n:
            self.lag_s = max(0.0, time.time() - at)
            metrics.HEARTBEAT_INGEST_LAG.set(round(self.lag_s, 3))
        if batch.synced:
            self.synced.set()

    def go_live(self) -> None:
        """Read heartbeats as they are stored from now on (the server leads): a child
        reading the bucket every `cfg.every_s` starts at once, with every host's last."""
        self.live = True
        if self._control is not None:
            try:
                self._control.send(True)
            except OSError:
                pass  # the child is gone; the next one is started live

    def restarted(self) -> None:
        metrics.HEARTBEAT_INGEST_RESTARTS.inc()

    def _join(self) -> None:
        super()._join()
        if self._reader is not None:
            self._reader.join(5)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the child, wait for it and for the reader thread (blocking)."""
        super().stop(timeout)
        if self._reader is not None:
            self._reader.join(5)
        self._reader = None
        if self._control is not None:
            self._control.close()
            self._control = None
