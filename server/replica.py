"""A control-plane replica: wires the store, watches, leadership, scheduler, history and
the operations the API and console call. `Muster.start()` / `Muster.shutdown()`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from server import memory, metrics
from server.api.auth import bootstrap_token
from server.health.ingest import HeartbeatIngest, IngestConfig
from server.health.monitor import HealthMonitor
from server.health.rules import Health
from server.history.database import DB_FILE as HISTORY_DB_FILE
from server.history.database import History
from server.history.historian import HistorianConfig, HistorianProcess
from server.history.recorder import Recorder
from server.scheduling import advance, submitlimits
from server.scheduling.capacity import POLICIES
from server.scheduling.cycle.reports import hold_text
from server.scheduling.dependencies import kind as dependency_kind
from server.scheduling.dependencies import waits
from server.scheduling.eviction import EvictionConfig
from server.scheduling.planner import QueuePolicy
from server.scheduling.queues import queue_label_refusal
from server.scheduling.queuewatch import QueueWatch
from server.scheduling.scheduler import Scheduler, SchedulerConfig
from server.scheduling.submitlimits import OpenJobs
from server.state.cluster import ClusterState, HostConfig
from server.state.lease import LeaseConfig, ThreadedLeadership
from server.state.streams import ensure_streams
from server.timefmt import iso_utc
from server.views.hosts import HostTable
from server.views.jobs import JobView, matches
from server.views.queues import rows as queue_rows
from wire import subjects
from wire.errors import (
    ConfigError,
    ConflictError,
    FencedError,
    Forbidden,
    InvalidInput,
    NotFound,
    RejectedError,
    StoreError,
    ValidationError,
)
from wire.kv import Store, Watch, Write, connect
from wire.messages import (
    DEFAULT_QUEUE,
    MAX_MESSAGE_BYTES,
    AdvanceReservation,
    Command,
    Event,
    Job,
    JobSpec,
    JobState,
    OutputReply,
    OutputRequest,
    Queue,
    decode,
    encode,
    implicit_default_queue,
    new_id,
)
from wire.records import Record
from wire.retrying import SUBMIT_RETRY_S
from wire.stopping import pause
from wire.validation import validate_advance_reservation, validate_job, validate_queue, validate_reason

log = logging.getLogger(__name__)

# A submission NATS cannot take is tried again for SUBMIT_RETRY_S (wire.kv.Store.create,
# Store.commit), so a client waits at most that plus one store timeout (5 s) for its answer.


@contextlib.contextmanager
def _maybe_stored(what: str) -> Iterator[None]:
    """A new record's write whose outcome stayed unknown past SUBMIT_RETRY_S: say which,
    and that it may have been stored. A definite refusal (taken, fenced, too large) passes."""
    try:
        yield
    except (ConflictError, FencedError, RejectedError):
        raise
    except StoreError as exc:
        raise StoreError(f"{what} not stored ({exc}); it may have been: look it up before submitting "
                         "again") from exc


@dataclass
class ServerConfig:
    nats_url: str = field(default_factory=lambda: os.environ.get("MUSTER_NATS_URL", "nats://127.0.0.1:4222"))
    http_host: str = field(default_factory=lambda: os.environ.get("MUSTER_HTTP_HOST", "127.0.0.1"))
    http_port: int = field(default_factory=lambda: int(os.environ.get("MUSTER_HTTP_PORT", "8080")))
    data_dir: Path = field(default_factory=lambda: Path(os.environ.get("MUSTER_DATA_DIR", ".muster")))
    db_url: str | None = field(default_factory=lambda: os.environ.get("MUSTER_DB_URL"))
    heartbeat_interval_s: float = field(default_factory=lambda: float(os.environ.get("MUSTER_HEARTBEAT_INTERVAL", "5")))
    lease_ttl_s: int = field(default_factory=lambda: int(os.environ.get("MUSTER_LEASE_TTL", "5")))
    replicas: int = field(default_factory=lambda: int(os.environ.get("MUSTER_REPLICAS", "1")))
    name: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    production: bool = field(default_factory=lambda: os.environ.get("MUSTER_ENV", "") == "production")
    history_retention_days: float | None = field(
        default_factory=lambda: float(os.environ["MUSTER_HISTORY_RETENTION_DAYS"])
        if os.environ.get("MUSTER_HISTORY_RETENTION_DAYS") else None)
    finished_job_ttl_s: int = field(default_factory=lambda: int(os.environ.get("MUSTER_FINISHED_JOB_TTL", "3600")))
    # Write history from a separate process (what `muster server` does); in-process
    # when False (embedded use and tests).
    history_process: bool = field(default_factory=lambda: os.environ.get("MUSTER_HISTORY_PROCESS", "0") == "1")
    # Read heartbeats in a process of its own (server.health.ingest; what `muster server` does);
    # on a connection of this process when False.
    heartbeat_process: bool = field(
        default_factory=lambda: os.environ.get("MUSTER_HEARTBEAT_PROCESS", "0") == "1")
    # While this replica follows, its heartbeat ingest reads every host's last heartbeat
    # this often, and nothing between (0: as they are stored, as the leader does); it
    # reads them as they are stored from the moment the replica leads.
    follower_heartbeats_every_s: float = field(
        default_factory=lambda: float(os.environ.get("MUSTER_FOLLOWER_HEARTBEATS_EVERY", "0")))
    # NATS credentials (an nkey seed file, see server.broker.natsauth) and client TLS.
    nats_creds: str | None = field(default_factory=lambda: os.environ.get("MUSTER_NATS_CREDS") or None)
    nats_ca: str | None = field(default_factory=lambda: os.environ.get("MUSTER_NATS_CA") or None)
    nats_cert: str | None = field(default_factory=lambda: os.environ.get("MUSTER_NATS_CERT") or None)
    nats_key: str | None = field(default_factory=lambda: os.environ.get("MUSTER_NATS_KEY") or None)
    # HTTPS for the API and console (uvicorn ssl_certfile / ssl_keyfile).
    tls_cert: str | None = field(default_factory=lambda: os.environ.get("MUSTER_TLS_CERT") or None)
    tls_key: str | None = field(default_factory=lambda: os.environ.get("MUSTER_TLS_KEY") or None)
    # The placement policy (server.scheduling.capacity.POLICIES): fgd or binpack.
    placement_policy: str = field(default_factory=lambda: os.environ.get("MUSTER_PLACEMENT_POLICY") or "fgd")
    placement_candidates: int = field(
        default_factory=lambda: int(os.environ.get("MUSTER_PLACEMENT_CANDIDATES", "16")))
    # After a cycle that placed nothing, the most of the event loop's time the leader's
    # planning may take (scheduling.cadence).
    plan_share: float = field(default_factory=lambda: float(os.environ.get("MUSTER_PLAN_SHARE", "0.5")))
    # Addresses (or networks) of TLS-terminating proxies whose X-Forwarded-Proto and
    # X-Forwarded-For are believed ("" none, "*" any).
    trusted_proxies: str = field(default_factory=lambda: os.environ.get("MUSTER_TRUSTED_PROXIES", "127.0.0.1,::1"))
    # How long a console session lasts (seconds).
    session_ttl_s: float = field(default_factory=lambda: float(os.environ.get("MUSTER_SESSION_TTL", "28800")))
    # Fair share: the half-life of queues' past use (0: only current use counts), and how
    # many jobs one scheduling cycle may preempt, all queues together.
    fair_share_half_life_s: float = field(
        default_factory=lambda: float(os.environ.get("MUSTER_FAIR_SHARE_HALF_LIFE", "3600")))
    preemptions_per_cycle: int = field(
        default_factory=lambda: int(os.environ.get("MUSTER_PREEMPTIONS_PER_CYCLE", "16")))
    # Reservations (scheduling.backfill): a job that has waited this long without room
    # holds the hosts where it could start soonest; one whose start there is unknown (no
    # time limits) holds them only until it has waited this plus `reserve_max_s`. At most
    # `reserve_jobs` jobs hold reservations at once (0: none).
    reserve_after_s: float = field(default_factory=lambda: float(os.environ.get("MUSTER_RESERVE_AFTER", "10")))
    reserve_max_s: float = field(default_factory=lambda: float(os.environ.get("MUSTER_RESERVE_MAX", "600")))
    reserve_jobs: int = field(default_factory=lambda: int(os.environ.get("MUSTER_RESERVE_JOBS", "4")))
    # Alerts: this many preemptions within a minute is a storm; a queue below its entitled
    # share with jobs waiting and none placed for this long is starved.
    preemption_storm: int = field(default_factory=lambda: int(os.environ.get("MUSTER_PREEMPTION_STORM", "50")))
    queue_starved_after_s: float = field(
        default_factory=lambda: float(os.environ.get("MUSTER_QUEUE_STARVED_AFTER", "600")))
    # The pacing of work moved off lost hosts and the partition threshold
    # (scheduling.eviction), from MUSTER_EVICTION_* and MUSTER_PARTITION_*.
    eviction: EvictionConfig = field(default_factory=lambda: eviction_from_env(os.environ))

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.data_dir / HISTORY_DB_FILE}"


# Settings of scheduling.eviction.EvictionConfig: variable -> (field, type, least value).
EVICTION_SETTINGS: dict[str, tuple[str, type, float]] = {
    "MUSTER_EVICTION_RATE": ("global_rate_per_s", float, 0.01),
    "MUSTER_EVICTION_BURST": ("global_burst", float, 1.0),
    "MUSTER_DOMAIN_EVICTION_RATE": ("domain_rate_per_s", float, 0.01),
    "MUSTER_DOMAIN_EVICTION_BURST": ("domain_burst", float, 1.0),
    "MUSTER_PARTITION_SHARE": ("domain_share", float, 0.01),
    "MUSTER_PARTITION_WINDOW": ("domain_window_s", float, 1.0),
    "MUSTER_PARTITION_MIN_HOSTS": ("domain_min_hosts", int, 1),
}


def eviction_from_env(env: Mapping[str, str]) -> EvictionConfig:
    """The eviction pacing and partition threshold, each from its variable when set.
    Raises ConfigError for a value that is not a number, or out of range."""
    values: dict[str, Any] = {}
    for var, (name, kind, least) in EVICTION_SETTINGS.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"{var}={raw!r}: not {'a whole number' if kind is int else 'a number'}") from None
        if not value >= least or (name == "domain_share" and value > 1):
            most = " and at most 1" if name == "domain_share" else ""
            raise ConfigError(f"{var}={raw!r}: must be at least {least:g}{most}")
        values[name] = value
    return EvictionConfig(**values)


# Agents one request (a GraphQL query, a console page) asks for running attempts' output
# (Muster.live_output): a page of running jobs, or a large gang's page polled every two
# seconds, cannot become a request to every agent of the cluster.
MAX_LIVE_OUTPUTS = 32

# Jobs one cancelJobs request may cancel (run it again for more), the live jobs looked at
# between two yields of the event loop, and the cancel commands published at once.
MAX_CANCEL_MATCHING = 100_000
CANCEL_SCAN_CHUNK = 20_000
CANCEL_PUBLISH_CHUNK = 256

# How far ahead a drain may be scheduled (a maintenance window is announced days ahead,
# not months).
MAX_DRAIN_AHEAD_S = 90 * 86400
# How far ahead an advance reservation may start, and how long it may last; its record
# expires this long after it ends.
MAX_RESERVATION_AHEAD_S = 365 * 86400
MAX_RESERVATION_S = 90 * 86400
RESERVATION_KEPT_S = 86400


class Muster:
    def __init__(self, config: ServerConfig) -> None:
        if config.placement_policy not in POLICIES:
            raise ConfigError(f"unknown placement policy {config.placement_policy!r} (MUSTER_PLACEMENT_POLICY): "
                              f"one of {', '.join(POLICIES)}")
        self.config = config
        self.state = ClusterState(heartbeat_interval_s=config.heartbeat_interval_s)
        # Until it leads, a replica builds a host's placement entry only when something
        # reads it, not at every allocation it follows (ClusterState.defer_index).
        self.state.defer_index = True
        # The read models the API and the console show (server.views).
        self.hosts: HostTable = self.state.host_table
        self.jobs = JobView(self.state, None, half_life_s=config.fair_share_half_life_s)
        self.nc: NATS | None = None
        self.hb_nc: NATS | None = None
        self.historian: HistorianProcess | None = None
        self.ingest: HeartbeatIngest | None = None
        self.store: Store | None = None
        self.history: History | None = None
        self.leadership: ThreadedLeadership | None = None
        self.scheduler: Scheduler | None = None
        self.new_token: str | None = None
        self.started_at = time.time()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: list[Watch] = []
        self._closed = False
        self._gauge_labels: dict[int, set[tuple[str, ...]]] = {}
        # Jobs this replica's requests are storing now: counted against submission limits.
        self._storing = OpenJobs()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.config
        metrics.watch_gc()
        cfg.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # the token file, SQLite history
        self.history = History(cfg.database_url, retention_days=cfg.history_retention_days)
        self.jobs.history = self.history
        self.nc = await connect(cfg.nats_url, name=f"muster-server-{cfg.name}", creds=cfg.nats_creds,
                                tls_ca=cfg.nats_ca, tls_cert=cfg.nats_cert, tls_key=cfg.nats_key)
        self.store = Store(self.nc, replicas=cfg.replicas)
        await ensure_streams(self.store)
        self.state.listeners.append(self._on_state)
        self._watches.append(await self.store.watch(">", self.state.apply_state_record))
        if cfg.heartbeat_process:
            # Heartbeats (the bulk of the traffic) are read by a process of their own,
            # which hands this one batches (server.health.ingest).
            self.ingest = HeartbeatIngest(IngestConfig(
                nats_url=cfg.nats_url, nats_creds=cfg.nats_creds, nats_ca=cfg.nats_ca, nats_cert=cfg.nats_cert,
                nats_key=cfg.nats_key, every_s=cfg.follower_heartbeats_every_s), self.state.apply_heartbeat,
                self._read_to)
            self.ingest.start()
        else:
            # ... or arrive on a connection of their own, so lease renewals and commits
            # never queue behind them.
            self.hb_nc = await connect(cfg.nats_url, name=f"muster-server-{cfg.name}-heartbeats",
                                       creds=cfg.nats_creds, tls_ca=cfg.nats_ca, tls_cert=cfg.nats_cert,
                                       tls_key=cfg.nats_key)
            self._watches.append(
                await Store(self.hb_nc).watch(">", self._on_heartbeat, bucket=subjects.HOSTS_BUCKET)
            )
        loading: list[Watch | HeartbeatIngest] = [*self._watches, *([self.ingest] if self.ingest else [])]
        for w in loading:
            await self._wait_synced(w)
        memory.freeze_survivors()  # the loaded state: out of the collector's sight
        self.new_token = await bootstrap_token(self.store, self.state, cfg.data_dir)
        lease_cfg = LeaseConfig(ttl_s=cfg.lease_ttl_s, renew_every_s=cfg.lease_ttl_s / 3.5,
                                shared=os.environ.get("MUSTER_TEST_SHARED_SCHEDULING") == "1",
                                trust_local_clock=os.environ.get("MUSTER_TEST_IGNORE_LEASE_CLOCK") != "1")

        def lease_connection():
            return connect(cfg.nats_url, name=f"muster-server-{cfg.name}-lease", creds=cfg.nats_creds,
                           tls_ca=cfg.nats_ca, tls_cert=cfg.nats_cert, tls_key=cfg.nats_key)

        # The lease is kept by a thread of its own (see ThreadedLeadership).
        self.leadership = ThreadedLeadership(lease_connection, cfg.name, lease_cfg,
                                             on_change=self._on_leadership, replicas=cfg.replicas)
        self.scheduler = Scheduler(self.store, self.state, self.leadership,
                                   SchedulerConfig(finished_job_ttl_s=cfg.finished_job_ttl_s,
                                                   placement_policy=cfg.placement_policy,
                                                   placement_candidates=max(1, cfg.placement_candidates),
                                                   plan_share=cfg.plan_share,
                                                   eviction=cfg.eviction,
                                                   queues=QueuePolicy(half_life_s=cfg.fair_share_half_life_s,
                                                                      preemptions_per_cycle=cfg.preemptions_per_cycle,
                                                                      reserve_after_s=cfg.reserve_after_s,
                                                                      reserve_max_s=cfg.reserve_max_s,
                                                                      reserve_jobs=max(0, cfg.reserve_jobs)),
                                                   watch=QueueWatch(storm_count=cfg.preemption_storm,
                                                                    starved_after_s=cfg.queue_starved_after_s)),
                                   caught_up=self._watches[0].caught_up)
        self.monitor = HealthMonitor(self.nc, self.state, self.leadership)
        self._tasks = [asyncio.create_task(self.monitor.run(self._stop), name="monitor")]
        if cfg.history_process:
            self.historian = HistorianProcess(HistorianConfig(
                nats_url=cfg.nats_url, database_url=cfg.database_url, retention_days=cfg.history_retention_days,
                nats_creds=cfg.nats_creds, nats_ca=cfg.nats_ca, nats_cert=cfg.nats_cert, nats_key=cfg.nats_key))
            self.historian.start()
        else:
            self.recorder = Recorder(self.store.js, self.history, cfg.database_url)
            self._tasks += [
                asyncio.create_task(self.recorder.run(self._stop), name="recorder"),
                asyncio.create_task(self.history.run(self._stop), name="history"),
            ]
        if self.historian is not None:
            self._tasks.append(asyncio.create_task(self.historian.run(self._stop), name="historian"))
        if self.ingest is not None:
            self._tasks.append(asyncio.create_task(self.ingest.run(self._stop), name="heartbeat-ingest"))
        self._tasks += [
            asyncio.create_task(memory.keep_frozen(self._stop), name="gc-freeze"),
            asyncio.create_task(metrics.watch_loop_lag(self._stop), name="loop-lag"),
            asyncio.create_task(self.leadership.run(self._stop), name="lease"),
            asyncio.create_task(self.scheduler.run(self._stop), name="scheduler"),
            asyncio.create_task(self._gauges(), name="gauges"),
        ]

    @staticmethod
    async def _wait_synced(w: Watch | HeartbeatIngest, stall_s: float = 30.0, every_s: float = 10.0) -> None:
        """Wait until a watch has replayed its bucket. A large state (500,000 live jobs
        take about a minute) is waited for as long as records keep arriving; only a watch
        that makes no progress for `stall_s` is given up on (with a warning)."""
        started = time.monotonic()
        last, last_progress = -1, time.monotonic()
        while not w.synced.is_set():
            try:
                await asyncio.wait_for(w.synced.wait(), timeout=every_s)
            except TimeoutError:
                pass
            if w.synced.is_set():
                break
            now = time.monotonic()
            if w.received != last:
                last, last_progress = w.received, now
                log.info("loading %s: %d records in %.0f s", w.bucket, w.received, now - started)
            elif now - last_progress >= stall_s:
                log.warning("watch of %s made no progress for %.0f s (%d records); continuing unsynced",
                            w.bucket, stall_s, w.received)
                return
        took = time.monotonic() - started
        metrics.STATE_LOAD_SECONDS.labels(w.bucket).set(round(took, 1))
        metrics.STATE_LOAD_RECORDS.labels(w.bucket).set(w.received)
        if took > every_s:
            log.info("loaded %s: %d records in %.0f s", w.bucket, w.received, took)

    async def shutdown(self) -> None:
        """Stop taking work, finish the current cycle, resign, flush history, drain NATS.
        Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=10)
            for t in pending:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._watches:
            await w.stop()
        if self.historian is not None:
            await asyncio.to_thread(self.historian.stop)
        if self.ingest is not None:
            await asyncio.to_thread(self.ingest.stop)
        for nc in (self.hb_nc, self.nc):
            if nc is not None and not nc.is_closed:
                try:
                    await asyncio.wait_for(nc.drain(), timeout=5)
                except Exception:  # noqa: BLE001
                    await nc.close()
        if self.history is not None:
            self.history.close()

    def _on_heartbeat(self, rec: Record) -> None:
        metrics.HEARTBEATS.inc()
        self.state.apply_host_record(rec)  # moves the read clock itself
        self._count_read(rec.behind, rec.skipped)

    def _read_to(self, position: float, behind: int, local_now: float, skipped: int, live: bool = True) -> None:
        """The heartbeat ingest process has sent everything stored before `position`
        (`live` False: a follower's reading, after which it reads nothing until the next,
        so what it left unread is not a backlog)."""
        self.state.clock.advance(position, behind, local_now, skipped, live)
        self._count_read(behind if live else 0, skipped)

    @staticmethod
    def _count_read(behind: int, skipped: int) -> None:
        metrics.HEARTBEATS_PENDING.set(behind)
        if skipped:
            metrics.HEARTBEATS_SKIPPED.inc(skipped)

    def _on_state(self, kind: str, obj: object) -> None:
        if kind == "job" and self.history is not None and self.historian is None:
            job = obj
            assert isinstance(job, Job)
            self.history.record(job, self.state.revisions.get(subjects.job_key(job.id), 0))

    def _on_leadership(self, leading: bool, term: int) -> None:
        metrics.LEADER.set(1 if leading else 0)
        self.state.defer_index = not leading
        if leading and self.ingest is not None:
            self.ingest.go_live()  # a follower reading heartbeats now and then reads them all
        if term:
            metrics.TERM.set(term)

    async def _gauges(self) -> None:
        while not self._stop.is_set():
            counts = self.hosts.counts(time.time())
            for h in Health:
                metrics.HOSTS.labels(h.value).set(counts.health[h.value])
            for st in JobState:
                metrics.JOBS.labels(st.value).set(self.state.job_state_counts.get(st.value, 0))
            metrics.TERM.set(self.state.term)
            self._queue_gauges()
            await pause(self._stop, 2)

    def _queue_gauges(self) -> None:
        """Per queue: allocated, nominal and borrowed per resource, pending jobs, fair share (the rank,
        the dominant share and the entitled share)."""
        seen: set[tuple[str, ...]] = set()
        for row in queue_rows(self.state, time.time(), self.config.fair_share_half_life_s):
            name = row.queue.name
            metrics.QUEUE_PENDING.labels(name).set(row.pending)
            metrics.QUEUE_FAIR_SHARE.labels(name).set(row.share)
            metrics.QUEUE_DOMINANT_SHARE.labels(name).set(row.dominant)
            metrics.QUEUE_ENTITLED_SHARE.labels(name).set(row.entitled)
            seen.add((name,))
            for r in row.resources:
                metrics.QUEUE_ALLOCATED.labels(name, r.resource).set(r.used)
                metrics.QUEUE_BORROWED.labels(name, r.resource).set(r.borrowed)
                if r.nominal is not None:
                    metrics.QUEUE_NOMINAL.labels(name, r.resource).set(r.nominal)
                seen.add((name, r.resource))
        for gauge in (metrics.QUEUE_PENDING, metrics.QUEUE_FAIR_SHARE, metrics.QUEUE_DOMINANT_SHARE,
                      metrics.QUEUE_ENTITLED_SHARE, metrics.QUEUE_ALLOCATED,
                      metrics.QUEUE_BORROWED, metrics.QUEUE_NOMINAL):
            for labels in list(self._gauge_labels.get(id(gauge), set())):
                if labels not in seen:
                    try:
                        gauge.remove(*labels)
                    except KeyError:
                        pass
            self._gauge_labels[id(gauge)] = {x for x in seen if len(x) == len(gauge._labelnames)}

    @property
    def ready(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    @property
    def role(self) -> str:
        return "leader" if self.leadership and self.leadership.leading else "follower"

    @property
    def term(self) -> int:
        """The term shown (API, console): the one this replica holds when it leads (the
        store may already show a newer one it has not noticed yet, and the two must not
        read as one), otherwise the newest it has seen in the store."""
        if self.leadership is not None and self.leadership.leading:
            return self.leadership.term
        return self.state.term

    # ------------------------------------------------------------ operations

    def known_gpu_models(self) -> set[str]:
        return self.state.gpu_models()

    def queue(self, name: str) -> Queue | None:
        """A queue's record; the `default` queue always exists."""
        q = self.state.queues.get(name)
        if q is None and name == DEFAULT_QUEUE:
            return implicit_default_queue()
        return q

    def queues(self) -> list[Queue]:
        out = dict(self.state.queues)
        out.setdefault(DEFAULT_QUEUE, implicit_default_queue())
        return [out[n] for n in sorted(out)]

    def _check_queue(self, spec: JobSpec, allowed: list[str] | None) -> JobSpec:
        """A job may go to an existing queue its token is bound to, within the queue's
        maximum time limit, and with host labels that do not conflict with the queue's
        (which apply when it is placed: scheduling.queues.placement_spec); returns its spec.
        Raises Forbidden or ValidationError."""
        if allowed is not None and spec.queue not in allowed:
            raise Forbidden(f"this token may not submit to queue {spec.queue!r} (only to {', '.join(allowed)})")
        q = self.queue(spec.queue)
        if q is None:
            raise ValidationError("queue", f"no queue named {spec.queue!r}", "UNKNOWN_QUEUE")
        if q.max_time_limit_s and spec.time_limit_s > q.max_time_limit_s:
            raise ValidationError("timeLimitSeconds", f"queue {q.name!r} allows at most {q.max_time_limit_s:g} s",
                                  "OUT_OF_RANGE")
        refused = queue_label_refusal(spec, q)
        if refused is not None:
            raise refused
        return spec

    @contextlib.contextmanager
    def _storing_now(self, jobs: Sequence[Job]) -> Iterator[None]:
        """While `jobs` are being stored, concurrent requests count them against the
        submission limits (`_check_limits`)."""
        for j in jobs:
            self._storing.update(None, j)
        try:
            yield
        finally:
            for j in jobs:
                self._storing.update(j, None)

    def _check_limits(self, spec: JobSpec, batch: OpenJobs | None = None) -> None:
        """The job's queue takes one more job of its user: its submission limits count the
        jobs this replica has seen not ended, those it is storing now, and `batch` (the
        request's jobs accepted before this one). Raises ValidationError (JOB_LIMIT)."""
        q = self.queue(spec.queue)
        if q is None or not submitlimits.limited(q):
            return
        tallies = [self.state.open_jobs, self._storing] + ([batch] if batch is not None else [])
        why = submitlimits.refusal(q, spec.user, tallies)
        if why:
            metrics.SUBMISSIONS_REFUSED.labels(spec.queue).inc()
            raise ValidationError("queue", why, submitlimits.JOB_LIMIT)

    def _waits_for(self, spec: JobSpec) -> list[str]:
        """Of the jobs `spec` runs after, those it must wait for (not ended yet, as this
        replica sees them: the leader takes out each as it ends). Raises ValidationError
        for one that does not exist, or one whose end its rule excludes (afterok: any but
        SUCCEEDED; afternotok: SUCCEEDED): the job could never run."""
        left, never = waits(spec, spec.depends_on, self.jobs.get)
        if never is not None:
            dep, ended = never
            if ended is None:
                raise ValidationError("dependsOn", f"no job {dep}", "UNKNOWN_DEPENDENCY")
            raise ValidationError("dependsOn", f"job {dep} ended {ended.value}: this job could never run "
                                               f"({dependency_kind(spec)}; use AFTER_ANY to run after it whatever its "
                                               "end)", "DEPENDENCY_FAILED")
        return left

    @staticmethod
    def default_queue(allowed: list[str] | None) -> str:
        """The queue of a job that names none: `default`, or the first queue of a token
        bound to queues that leave `default` out (a team's token submits to its team's
        queue without saying so)."""
        return allowed[0] if allowed and DEFAULT_QUEUE not in allowed else DEFAULT_QUEUE

    @classmethod
    def _job_input(cls, data: dict[str, Any], user: str, allowed: list[str] | None) -> tuple[dict[str, Any], str]:
        """A job's input with its user, and its queue when it names none; and its hold
        (`held` in the input: it is submitted held, as sbatch -H), or ""."""
        data = dict(data)
        data.setdefault("user", user)
        if not data.get("queue"):
            data["queue"] = cls.default_queue(allowed)
        hold = hold_text(user, at_submission=True) if data.pop("held", False) else ""
        return data, hold

    async def submit(self, data: dict[str, Any], user: str, queues: list[str] | None = None) -> Job:
        """Validate and store a job (QUEUED). Raises InvalidInput (nothing stored) when
        it is rejected; Forbidden when `queues` (the caller's token's) leave its queue out."""
        data, hold = self._job_input(data, user, queues)
        spec, errors = validate_job(data, self.known_gpu_models())
        if spec is None:
            raise InvalidInput(errors)
        spec = self._check_queue(spec, queues)
        self._check_limits(spec)
        waits = self._waits_for(spec)
        now = time.time()
        job = Job(id=new_id("j"), spec=spec, submitted_at=now, updated_at=now, hold=hold, waiting_for=waits,
                  not_before=spec.begin_at)
        assert self.store is not None
        with self._storing_now([job]), _maybe_stored(f"job {job.id}"):
            # Tried again while NATS cannot take it; a try that was stored is found, not repeated.
            rev = await self.store.create(subjects.job_key(job.id), encode(job), within_s=SUBMIT_RETRY_S)
        self.state.apply_job(job, rev)
        metrics.SUBMISSIONS.inc()
        return job

    async def submit_many(self, items: list[dict[str, Any]], user: str,
                          queues: list[str] | None = None) -> list[Job | InvalidInput | Forbidden]:
        """Validate every job, then store the valid ones in one atomic batch per 1,000;
        each item's result is its job or why it was rejected."""
        known = self.known_gpu_models()
        now = time.time()
        results: list[Job | InvalidInput | Forbidden] = []
        batch = OpenJobs()
        for data in items:
            data, hold = self._job_input(data, user, queues)
            spec, errors = validate_job(data, known)
            waits: list[str] = []
            if spec is not None:
                try:
                    spec = self._check_queue(spec, queues)
                    self._check_limits(spec, batch)
                    waits = self._waits_for(spec)
                except ValidationError as exc:
                    spec, errors = None, [exc]
                except Forbidden as exc:
                    results.append(exc)
                    continue
            if spec is None:
                results.append(InvalidInput(errors))
                continue
            job = Job(id=new_id("j"), spec=spec, submitted_at=now, updated_at=now, hold=hold, waiting_for=waits,
                      not_before=spec.begin_at)
            batch.update(None, job)
            results.append(job)
        assert self.store is not None
        jobs = [j for j in results if isinstance(j, Job)]
        # Each key must not exist yet (a fresh id), and a retry after a lost reply is
        # refused as a duplicate.
        for i in range(0, len(jobs), 1000):
            chunk = jobs[i : i + 1000]
            with self._storing_now(chunk), _maybe_stored(f"{len(chunk)} jobs (the first {chunk[0].id})"):
                res = await self.store.commit([Write(subjects.job_key(j.id), encode(j), expected=0) for j in chunk],
                                              within_s=SUBMIT_RETRY_S)
            if not res.duplicate:
                for j in chunk:
                    self.state.apply_job(j, res.revisions[subjects.job_key(j.id)])
        metrics.SUBMISSIONS.inc(len(jobs))
        return results

    # ------------------------------------------------------------ queues

    async def create_queue(self, data: dict[str, Any], by: str) -> Queue:
        """Store a new queue. Raises ValidationError (bad input, or the name is taken)."""
        now = time.time()
        q = validate_queue({**data, "created_at": now, "updated_at": now, "by": by})
        if q.name in self.state.queues:
            raise ValidationError("name", f"a queue named {q.name!r} exists", "EXISTS")
        await self._put_queue(q, 0)
        return q

    async def update_queue(self, name: str, changes: dict[str, Any], by: str) -> Queue:
        """Change the given fields of a queue (the `default` queue gets a record of its own
        on its first change). Raises NotFound or ValidationError."""
        for _ in range(5):
            cur = self.queue(name)
            if cur is None:
                raise NotFound(f"no queue named {name!r}")
            q = validate_queue({**cur.model_dump(), **changes, "name": name, "updated_at": time.time(), "by": by})
            try:
                await self._put_queue(q, self.state.revisions.get(subjects.queue_key(name), 0))
                return q
            except ConflictError:
                assert self.store is not None
                self.state.apply_state_record(await self.store.get(subjects.queue_key(name)))
        raise ConflictError("the queue changed concurrently; try again", field="name")

    async def delete_queue(self, name: str, by: str) -> None:
        """Delete a queue that holds no work and that no advance reservation names. Raises
        NotFound, or ValidationError (QUEUE_IN_USE with the counts or the reservations; the
        default queue cannot be deleted)."""
        if name == DEFAULT_QUEUE:
            raise ValidationError("name", "the default queue always exists (change it with updateQueue)",
                                  "PROTECTED")
        if name not in self.state.queues:
            raise NotFound(f"no queue named {name!r}")
        queued = self.state.backlog.count(name) + self.state.backlog.held_in(name)
        live = len(self.state.queue_live.get(name, ()))
        if queued or live:
            raise ValidationError("name", f"queue {name!r} has {queued} queued and {live} placed or running jobs: "
                                          "cancel them or wait for them to end first", "QUEUE_IN_USE")
        now = time.time()
        naming = sorted(r.name for r in self.state.advance.values() if name in r.queues and not advance.over(r, now))
        if naming:
            raise ValidationError("name", f"queue {name!r} is named by advance reservation {', '.join(naming)}: delete "
                                          "it first, or wait for it to end", "QUEUE_IN_USE")
        assert self.store is not None
        key = subjects.queue_key(name)
        rev = await self.store.delete(key, expected=self.state.revisions.get(key, 0))
        self.state.apply_state_record(Record(key, rev, None))
        await self._queue_event("deleted", name, by)

    async def create_advance_reservation(self, data: dict[str, Any], by: str) -> AdvanceReservation:
        """Set hosts aside for some queues' and users' jobs over a time window
        (scheduling.advance). A start already past (or none) is now. Raises
        ValidationError: bad input, a name taken, an unknown host or queue, a window too far
        ahead or too long, a record too large, or a host set aside by another reservation
        over an overlapping window (OVERLAPS)."""
        now = time.time()
        r, body = self._checked_reservation({**data, "created_at": now, "by": by}, now)
        if r.name in self.state.advance:
            raise ValidationError("name", f"an advance reservation named {r.name!r} exists", "EXISTS")
        assert self.store is not None
        key = subjects.advres_key(r.name)
        ttl = f"{int(r.ends - now + RESERVATION_KEPT_S)}s"
        try:
            rev = await self.store.put(key, body, expected=self.state.revisions.get(key, 0), ttl=ttl)
        except ConflictError:  # the key as stored (deleted, expired, or made meanwhile)
            cur = await self.store.get(key)
            if cur.value is not None:
                self.state.apply_state_record(cur)
                raise ValidationError("name", f"an advance reservation named {r.name!r} exists", "EXISTS") from None
            rev = await self.store.put(key, body, expected=cur.revision, ttl=ttl)
        self.state.apply_state_record(Record(key, rev, body))
        await self._reservation_event("created", r, by)
        return r

    async def update_advance_reservation(self, name: str, changes: dict[str, Any], by: str) -> AdvanceReservation:
        """Change the given fields of an advance reservation (its end, start, hosts, queues,
        users, description), checked as a new one is. Raises NotFound or ValidationError."""
        assert self.store is not None
        key = subjects.advres_key(name)
        for _ in range(5):
            cur = self.state.advance.get(name)
            if cur is None:
                raise NotFound(f"no advance reservation named {name!r}")
            now = time.time()
            given = {k: v for k, v in changes.items() if v is not None}
            # A start given is no earlier than now; one kept is kept (an open reservation stays
            # the window it is: no alert that it ended and opened again).
            r, body = self._checked_reservation({**cur.model_dump(), **given, "name": name, "by": by}, now,
                                                clamp_start="starts" in given)
            try:
                rev = await self.store.put(key, body, expected=self.state.revisions.get(key, 0),
                                           ttl=f"{int(r.ends - now + RESERVATION_KEPT_S)}s")
            except ConflictError:
                self.state.apply_state_record(await self.store.get(key))
                continue
            self.state.apply_state_record(Record(key, rev, body))
            await self._reservation_event("updated", r, by)
            return r
        raise ConflictError("the advance reservation changed concurrently; try again", field="name")

    def _checked_reservation(self, data: dict[str, Any], now: float,
                             clamp_start: bool = True) -> tuple[AdvanceReservation, bytes]:
        """An advance reservation's record from `data` (its start no earlier than `now` when
        `clamp_start`), with every check but its name's being free; and its bytes."""
        if clamp_start:
            data = {**data, "starts": max(now, float(data.get("starts") or now))}
        r = validate_advance_reservation(data)
        if r.ends > now + MAX_RESERVATION_AHEAD_S or r.starts > now + MAX_RESERVATION_AHEAD_S:
            raise ValidationError("endsAt", f"must be at most {MAX_RESERVATION_AHEAD_S // 86400} days ahead",
                                  "OUT_OF_RANGE")
        if r.ends - r.starts > MAX_RESERVATION_S:
            raise ValidationError("endsAt", f"a reservation lasts at most {MAX_RESERVATION_S // 86400} days",
                                  "OUT_OF_RANGE")
        body = encode(r)
        size = len(body)
        if size > MAX_MESSAGE_BYTES:
            raise ValidationError("hosts", f"{len(r.hosts)} hosts of these names make a record of {size:,} bytes, more "
                                           f"than the {MAX_MESSAGE_BYTES:,} one may hold: set them aside in several "
                                           "reservations", "TOO_LARGE")
        unknown = [h for h in r.hosts if h not in self.state.hosts]
        if unknown:
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            raise ValidationError("hosts", f"no host {', '.join(unknown[:3])}{more}", "NOT_FOUND")
        for name in r.queues:
            if self.queue(name) is None:
                raise ValidationError("queues", f"no queue named {name!r}", "NOT_FOUND")
        other = advance.clash(r, self.state.advance.values(), now)
        if other is not None:
            shared = sorted(set(r.hosts) & set(other.hosts))
            raise ValidationError("hosts", f"host {shared[0]} is set aside by advance reservation {other.name} from "
                                           f"{iso_utc(other.starts)} to {iso_utc(other.ends)}", "OVERLAPS")
        return r, body

    async def _reservation_event(self, action: str, r: AdvanceReservation, by: str) -> None:
        await self._publish_event(f"advres.{action}", Event(
            kind=f"advres.{action}", message=f"advance reservation {r.name} {action} by {by}: {len(r.hosts)} host(s) "
            f"for {advance.whom(r)} from {iso_utc(r.starts)} to {iso_utc(r.ends)}",
            data={"name": r.name, "by": by, "hosts": len(r.hosts), "queues": r.queues, "users": r.users,
                  "starts": r.starts, "ends": r.ends}))

    async def delete_advance_reservation(self, name: str, by: str) -> None:
        """Give the hosts of an advance reservation back to every queue. Raises NotFound."""
        if name not in self.state.advance:
            raise NotFound(f"no advance reservation named {name!r}")
        assert self.store is not None
        key = subjects.advres_key(name)
        rev = await self.store.delete(key, expected=self.state.revisions.get(key, 0))
        self.state.apply_state_record(Record(key, rev, None))
        await self._publish_event("advres.deleted", Event(
            kind="advres.deleted", message=f"advance reservation {name} deleted by {by}",
            data={"name": name, "by": by}))

    async def _publish_event(self, subject: str, ev: Event) -> None:
        assert self.store is not None
        try:
            await self.store.nc.publish(f"{subjects.EVENTS_PREFIX}.{subject}", encode(ev))
        except Exception:  # noqa: BLE001 - the record is stored; the event is best effort
            log.warning("%s event not published", subject)

    async def _put_queue(self, q: Queue, expected: int) -> None:
        assert self.store is not None
        key = subjects.queue_key(q.name)
        body = encode(q)
        rev = await self.store.put(key, body, expected=expected)
        self.state.apply_state_record(Record(key, rev, body))
        await self._queue_event("created" if expected == 0 else "updated", q.name, q.by)

    async def _queue_event(self, action: str, name: str, by: str) -> None:
        await self._publish_event(f"queue.{action}", Event(kind=f"queue.{action}", message=f"queue {name} {action} "
                                                           f"by {by}", data={"queue": name, "by": by}))

    def _live_job_for(self, job_id: str, queues: list[str] | None) -> Job:
        """A job an operator acts on: it exists, `queues` (the caller's token's) allow its
        queue, and it has not ended. Raises NotFound, Forbidden or ValidationError
        (ALREADY_FINISHED)."""
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        if queues is not None and job.spec.queue not in queues:
            raise Forbidden(f"this token acts only on jobs of its queues ({', '.join(queues)}); "
                            f"job {job_id} is in queue {job.spec.queue!r}")
        if job.state.terminal:
            raise ValidationError("id", f"job is already {job.state.value}", "ALREADY_FINISHED")
        return job

    async def _command(self, cmd: Command) -> None:
        assert self.store is not None
        try:
            await self.store.js.publish(f"{subjects.CMDS_PREFIX}.{cmd.kind}", encode(cmd))
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"{cmd.kind}: {exc}") from exc

    async def cancel(self, job_id: str, by: str, reason: str = "", queues: list[str] | None = None) -> None:
        """Ask the leader to cancel a job. Raises NotFound, Forbidden when `queues` (the
        caller's token's) leave the job's queue out, or ValidationError (ALREADY_FINISHED)
        for a job that has ended."""
        reason = validate_reason(reason)
        self._live_job_for(job_id, queues)
        await self._command(Command(kind="cancel", job_id=job_id, by=by, reason=reason))

    async def update_job(self, job_id: str, by: str, *, priority: int | None = None, hold: bool | None = None,
                         reason: str = "", queues: list[str] | None = None) -> None:
        """Ask the leader to change a job that has not ended: its priority (-1000 to 1000),
        and hold it (True: a QUEUED job stays queued but is not placed; `reason` says why)
        or release it (False). Raises NotFound, Forbidden (`queues`, as cancel),
        ValidationError (nothing to change, a priority out of range, holding a job that is
        not QUEUED or is taking GPUs by preemption; ALREADY_FINISHED)."""
        reason = validate_reason(reason)
        if priority is None and hold is None:
            raise ValidationError("input", "give a priority, or hold or release the job", "REQUIRED")
        if priority is not None and not -1000 <= priority <= 1000:
            raise ValidationError("priority", "must be from -1000 to 1000", "OUT_OF_RANGE")
        job = self._live_job_for(job_id, queues)
        if hold and (job.state is not JobState.QUEUED or job.preempting):
            why = "it is taking GPUs by preemption" if job.preempting else f"it is {job.state.value}"
            raise ValidationError("hold", f"only a queued job can be held; {why} (cancel it instead)", "NOT_QUEUED")
        await self._command(Command(kind="update", job_id=job_id, by=by, reason=reason, priority=priority, hold=hold))

    async def cancel_matching(self, by: str, reason: str = "", queues: list[str] | None = None,
                              limit: int = MAX_CANCEL_MATCHING, **filters: Any) -> list[str]:
        """Ask the leader to cancel every job that has not ended and matches `filters` (those
        of views.jobs.matches: state, user, name, priority, submitted_after,
        submitted_before, queue, group; at least one given), of the queues `queues` (the caller's
        token's) allow: at most `limit`, the oldest first. Returns their ids. Raises
        ValidationError (no filter, a limit out of range), Forbidden (a queue the token
        may not act on), StoreError (NATS did not take a command: run it again)."""
        reason = validate_reason(reason)
        if not any(v not in (None, "", [], ()) for v in filters.values()):
            raise ValidationError("filter", "give at least one filter (a name prefix, user, queue, state ...)",
                                  "REQUIRED")
        if not 1 <= limit <= MAX_CANCEL_MATCHING:
            raise ValidationError("limit", f"must be from 1 to {MAX_CANCEL_MATCHING}", "OUT_OF_RANGE")
        queue = filters.get("queue")
        if queues is not None and queue is not None and queue not in queues:
            raise Forbidden(f"this token acts only on jobs of its queues ({', '.join(queues)}); not of {queue!r}")
        live = list(self.state.jobs.values())
        found: list[Job] = []
        for start in range(0, len(live), CANCEL_SCAN_CHUNK):
            if start:
                await asyncio.sleep(0)  # half a million live jobs: let the scheduler and the API run
            found.extend(j for j in live[start:start + CANCEL_SCAN_CHUNK]
                         if not j.state.terminal and (queues is None or j.spec.queue in queues)
                         and matches(j, **filters))
        found.sort(key=lambda j: (j.submitted_at, j.id))
        ids = [j.id for j in found[:limit]]
        assert self.store is not None
        js = self.store.js
        for start in range(0, len(ids), CANCEL_PUBLISH_CHUNK):
            cmds = [encode(Command(kind="cancel", job_id=i, by=by, reason=reason))
                    for i in ids[start:start + CANCEL_PUBLISH_CHUNK]]
            try:
                await asyncio.gather(*(js.publish(f"{subjects.CMDS_PREFIX}.cancel", c) for c in cmds))
            except Exception as exc:  # noqa: BLE001
                raise StoreError(f"cancel: {exc} (the first {start} were asked for; run it again)") from exc
        return ids

    async def requeue(self, job_id: str, by: str, reason: str = "", hold: bool = False,
                      queues: list[str] | None = None) -> None:
        """Ask the leader to stop a placed or running job's try and queue the job again
        (the try is not counted against its attempts), held when `hold`. Raises NotFound,
        Forbidden (`queues`, as cancel), ValidationError (NOT_RUNNING; ALREADY_FINISHED)."""
        reason = validate_reason(reason)
        job = self._live_job_for(job_id, queues)
        if job.state not in (JobState.PLACED, JobState.RUNNING):
            raise ValidationError("id", f"job {job_id} is {job.state.value}: only a placed or running job is "
                                        "requeued", "NOT_RUNNING")
        await self._command(Command(kind="requeue", job_id=job_id, by=by, reason=reason, hold=hold))

    async def live_output(self, host_id: str, attempt_id: str, timeout_s: float = 2.0) -> str | None:
        """A running attempt's output so far, asked of its host's agent; None when the agent
        does not answer in time (gone, cut off, or an agent from before this request) or
        runs no such attempt. A caller asks at most MAX_LIVE_OUTPUTS agents per request."""
        reply = await self.live_output_reply(host_id, attempt_id, timeout_s)
        return reply.output_tail if reply is not None else None

    async def live_output_reply(self, host_id: str, attempt_id: str, timeout_s: float = 2.0) -> OutputReply | None:
        """The agent's answer for a running attempt (its output's tail, and how many bytes it
        wrote in all), or None (as `live_output`)."""
        assert self.store is not None
        try:
            msg = await self.store.nc.request(subjects.output_subject(host_id),
                                              encode(OutputRequest(attempt_id=attempt_id)), timeout=timeout_s)
            reply = decode(OutputReply, msg.data)
        except Exception as exc:  # noqa: BLE001 - no responders, a timeout, a reply that does not decode
            log.info("no output from %s for %s: %s", host_id, attempt_id, exc)
            return None
        return reply if reply.attempt_id == attempt_id and reply.running else None

    async def set_cordon(self, host_id: str, cordoned: bool, by: str, reason: str) -> None:
        """Cordon (no new placements) or uncordon (also ends a drain) a host."""
        reason = validate_reason(reason, required=cordoned)
        await self._set_hostcfg(host_id, lambda cur: HostConfig(cordoned=cordoned, reason=reason, by=by,
                                                                ts=time.time(), gpu_clears=cur.gpu_clears))

    async def drain(self, host_id: str, by: str, reason: str, deadline_s: float, at: float | None = None) -> None:
        """Drain a host: no new placements; what still runs after `deadline_s` is stopped
        and requeued elsewhere. With `at` (a time ahead): the drain begins then, and until
        then the host takes only jobs whose time limit ends them by its deadline
        (scheduling.maintenance)."""
        reason = validate_reason(reason, required=True)
        if not 0 <= deadline_s <= 7 * 24 * 3600:
            raise ValidationError("deadline", "must be from 0 to 604800 seconds", "OUT_OF_RANGE")
        now = time.time()
        if at is not None and not at <= now + MAX_DRAIN_AHEAD_S:
            raise ValidationError("at", f"must be at most {MAX_DRAIN_AHEAD_S // 86400:.0f} days ahead", "OUT_OF_RANGE")
        start = at if at is not None and at > now else 0.0  # a time already past: at once
        await self._set_hostcfg(host_id, lambda cur: HostConfig(
            cordoned=not start, draining=True, drain_at=start, drain_deadline=(start or now) + deadline_s,
            reason=reason, by=by, ts=now, gpu_clears=cur.gpu_clears))

    async def clear_gpu_faults(self, host_id: str, by: str, reason: str, gpus: list[int] | None = None) -> list[int]:
        """Clear GPU fault marks of a host (after those GPUs were reset or replaced): the
        GPUs in `gpus`, or every GPU its heartbeat reports faulted. The leader passes the
        clear to the host's agent, whose GPUs then report healthy until a new fault. A
        cordon or drain stays as it is. Returns the GPUs cleared."""
        reason = validate_reason(reason, required=True)
        entry = self.state.hosts.get(host_id)
        if entry is None or entry.heartbeat is None:
            raise NotFound(f"no host {host_id}")
        have = {g.index for g in entry.heartbeat.gpus}
        if gpus is None:
            targets = sorted(self.state.faulted_gpus.get(host_id, ()))
            if not targets:
                raise ValidationError("gpus", f"host {host_id} reports no faulted GPU", "NOTHING_TO_CLEAR")
        else:
            targets = sorted(set(gpus))
            if not targets or not set(targets) <= have:
                raise ValidationError("gpus", f"host {host_id} has GPUs {sorted(have)}; not {targets}", "INVALID")

        def change(cur: HostConfig) -> HostConfig:
            counts = dict(cur.gpu_clears)
            for i in targets:
                counts[i] = counts.get(i, 0) + 1
            return cur.model_copy(update={"gpu_clears": counts})

        await self._set_hostcfg(host_id, change, action="gpu_faults_cleared", by=by,
                                reason=f"{reason} (GPUs {', '.join(map(str, targets))})")
        return targets

    async def _set_hostcfg(self, host_id: str, change: Callable[[HostConfig], HostConfig], action: str = "",
                           by: str = "", reason: str = "") -> None:
        """Store a host's settings as `change` makes them from the stored ones (read
        again after a concurrent change). `action` names the event (by default what the
        settings say: drain, cordon or uncordon), `by` and `reason` its author and why
        (by default the settings')."""
        if host_id not in self.state.hosts:
            raise NotFound(f"no host {host_id}")
        assert self.store is not None
        key = subjects.hostcfg_key(host_id)
        for _ in range(5):
            cfg = change(self.state.hostcfg.get(host_id) or HostConfig())
            try:
                rev = await self.store.put(key, cfg.model_dump_json().encode(),
                                           expected=self.state.revisions.get(key, 0))
                self.state.apply_state_record(Record(key, rev, cfg.model_dump_json().encode()))
                what = action or ("drain" if cfg.draining else ("cordon" if cfg.cordoned else "uncordon"))
                who, why = by or cfg.by, reason or cfg.reason
                ahead = f" from {iso_utc(cfg.drain_at)}" if cfg.draining and cfg.drain_at else ""
                ev = Event(kind=f"host.{what}", host_id=host_id, message=f"{what}{ahead} by {who}: {why}",
                           data={"by": who, "reason": why, "deadline": cfg.drain_deadline,
                                 **({"at": cfg.drain_at} if ahead else {})})
                try:
                    await self.store.nc.publish(f"{subjects.EVENTS_PREFIX}.host.{what}", encode(ev))
                except Exception:  # noqa: BLE001 - the setting is stored; the record is best effort
                    log.warning("host %s event not published", what)
                return
            except ConflictError:
                self.state.apply_state_record(await self.store.get(key))
        raise ConflictError("host settings changed concurrently; try again", field="id")
