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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from prometheus_client import Gauge

from server import memory, metrics
from server.api.auth import bootstrap_token
from server.health.ingest import HeartbeatIngest, IngestConfig
from server.health.monitor import HealthMonitor
from server.health.rules import Health
from server.history.database import DB_FILE as HISTORY_DB_FILE
from server.history.database import History
from server.history.historian import HistorianConfig, HistorianProcess, watch_writes
from server.history.reconcile import run as reconcile_history
from server.history.recorder import Recorder
from server.history.writehealth import WriteHealth
from server.operations.base import ORDER_CATCH_UP_S
from server.operations.hosts import HostOperations
from server.operations.jobs import JobOperations
from server.operations.queues import QueueOperations
from server.operations.reservations import ReservationOperations
from server.operations.submissions import Submissions
from server.scheduling.capacity import POLICIES
from server.scheduling.eviction import EvictionConfig
from server.scheduling.hostlabels import LabelTrust, parse_keys
from server.scheduling.planner import QueuePolicy
from server.scheduling.queuewatch import QueueWatch
from server.scheduling.scheduler import Scheduler, SchedulerConfig
from server.scheduling.submitlimits import OpenJobs
from server.state.cluster import ClusterState
from server.state.lease import LeaseConfig, ThreadedLeadership
from server.state.streams import ensure_streams
from server.views.hosts import HostTable
from server.views.jobs import JobView
from server.views.queues import fairness as queue_fairness
from server.views.queues import rows as queue_rows
from wire import subjects
from wire.errors import (
    ConfigError,
    ConflictError,
)
from wire.kv import Store, Watch, connect
from wire.messages import (
    Job,
    JobState,
)
from wire.owndir import own_dir
from wire.records import Record
from wire.stopping import pause
from wire.validation import LABEL_KEY_RE

log = logging.getLogger(__name__)
# A shutdown waits this long for its tasks to end after the stop, then cancels them, and
# waits this long again for them to take the cancellation.
SHUTDOWN_TASKS_S = 10.0
SHUTDOWN_CANCEL_S = 5.0

READY_PROBE_S = 2.0  # how long /readyz trusts its last look at the state stream (Muster.store_ready)
READY_PROBE_TIMEOUT_S = 2.0  # the most that look waits for an answer

# A submission NATS cannot take is tried again for SUBMIT_RETRY_S (wire.kv.Store.create,
# Store.commit), so a client waits at most that plus one store timeout (5 s) for its answer.




def private_dir(path: Path) -> None:
    """Make the server's data directory (the admin token, the SQLite history with every
    job's `env`), or take it, only as this user's alone (wire.owndir): one made before the
    server by hand or a package, kept open, put the history before every user of the host
    (found by exploring); one another user made first took the admin token into that
    user's file through a link (found by exploring). ConfigError otherwise."""
    try:
        own_dir(path, "data directory")
    except OSError as exc:
        raise ConfigError(str(exc)) from exc


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
    # Label keys only operators set (scheduling.hostlabels): placement and failure domains
    # ignore what agents report of them (keys beginning `muster.` always).
    operator_label_keys: frozenset[str] = field(default_factory=lambda: operator_label_keys_from_env(os.environ))

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


def operator_label_keys_from_env(env: Mapping[str, str]) -> frozenset[str]:
    """MUSTER_OPERATOR_LABEL_KEYS: comma-separated label keys (`team,rack,zone`); none when
    unset. Raises ConfigError for one that is not a label key."""
    raw = env.get("MUSTER_OPERATOR_LABEL_KEYS", "")
    keys = parse_keys(raw)
    bad = sorted(k for k in keys if not LABEL_KEY_RE.fullmatch(k))
    if bad:
        raise ConfigError(f"MUSTER_OPERATOR_LABEL_KEYS={raw!r}: {bad[0][:64]!r} is not a label key (lower-case "
                          "letters, digits, '_', '.', '-', starting with a letter)")
    return keys


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






class Muster(Submissions, QueueOperations, ReservationOperations, JobOperations, HostOperations):
    """A control-plane replica: its lifecycle here, its operations from server.operations."""

    def __init__(self, config: ServerConfig) -> None:
        if config.placement_policy not in POLICIES:
            raise ConfigError(f"unknown placement policy {config.placement_policy!r} (MUSTER_PLACEMENT_POLICY): "
                              f"one of {', '.join(POLICIES)}")
        self.config = config
        self.state = ClusterState(heartbeat_interval_s=config.heartbeat_interval_s,
                                  label_trust=LabelTrust(config.operator_label_keys))
        # The read models the API and the console show (server.views).
        self.hosts: HostTable = self.state.host_table
        self.jobs = JobView(self.state, None, half_life_s=config.fair_share_half_life_s)
        self.nc: NATS | None = None
        self.hb_nc: NATS | None = None
        self.historian: HistorianProcess | None = None
        # Whether the history written in this process (no historian process) gets written.
        self.history_health: WriteHealth | None = None
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
        self._ready_probe: tuple[float, str] = (float("-inf"), "")  # (when, why not ready) of store_ready
        self._ready_lock = asyncio.Lock()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.config
        metrics.watch_gc()
        private_dir(cfg.data_dir)  # the token file, SQLite history
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
                self._read_to, self.state.hosts_renumbered, self.state.rolled_up)
            self.ingest.start()
        else:
            # ... or arrive on a connection of their own, so lease renewals and commits
            # never queue behind them.
            self.hb_nc = await connect(cfg.nats_url, name=f"muster-server-{cfg.name}-heartbeats",
                                       creds=cfg.nats_creds, tls_ca=cfg.nats_ca, tls_cert=cfg.nats_cert,
                                       tls_key=cfg.nats_key)
            self._watches.append(
                await Store(self.hb_nc).watch(">", self._on_heartbeat, bucket=subjects.HOSTS_BUCKET,
                                              on_reset=self.state.hosts_renumbered)
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
                                   caught_up=self._watches[0].caught_up,
                                   recorded_jobs=lambda ids: asyncio.to_thread(self._history_states, ids))
        self.monitor = HealthMonitor(self.nc, self.state, self.leadership)
        self._tasks = [asyncio.create_task(self.monitor.run(self._stop), name="monitor")]
        if cfg.history_process:
            self.historian = HistorianProcess(HistorianConfig(
                nats_url=cfg.nats_url, database_url=cfg.database_url, retention_days=cfg.history_retention_days,
                finished_job_ttl_s=cfg.finished_job_ttl_s, nats_creds=cfg.nats_creds, nats_ca=cfg.nats_ca,
                nats_cert=cfg.nats_cert, nats_key=cfg.nats_key))
            self.historian.start()
        else:
            self.recorder = Recorder(self.store.js, self.history, cfg.database_url)
            self.history_health = WriteHealth()
            self._tasks += [
                asyncio.create_task(self.recorder.run(self._stop), name="recorder"),
                asyncio.create_task(self.history.run(self._stop, health=self.history_health), name="history"),
                asyncio.create_task(watch_writes(self.nc, self.history_health, self._stop), name="history-write-watch"),
                asyncio.create_task(reconcile_history(self.store, self.history, cfg.finished_job_ttl_s, self._stop),
                                    name="history-reconcile"),
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

    async def view_caught_up(self) -> None:
        if not self._watches:
            return
        try:
            await asyncio.wait_for(self._watches[0].caught_up(), ORDER_CATCH_UP_S)
        except TimeoutError:
            raise ConflictError("this server's view is behind the store; try again", field="name") from None

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
            done, pending = await asyncio.wait(self._tasks, timeout=SHUTDOWN_TASKS_S)
            for t in pending:
                log.warning("shutdown: task %s did not end within %g s of the stop; cancelled", t.get_name(),
                            SHUTDOWN_TASKS_S)
                t.cancel()
            # Bounded as well: a shutdown that cannot end is worse than one that leaves a
            # task behind (named in the log), in a process about to exit.
            if pending:
                ended, stuck = await asyncio.wait(pending, timeout=SHUTDOWN_CANCEL_S)
                for t in stuck:
                    log.error("shutdown: task %s ignored its cancellation; left behind", t.get_name())
                done |= ended
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    log.error("shutdown: task %s had failed: %r", t.get_name(), t.exception())
        for w in self._watches:
            try:
                await asyncio.wait_for(w.stop(), timeout=5)
            except Exception as exc:  # noqa: BLE001 - a timeout or a failure: said, and the shutdown goes on
                log.warning("shutdown: the watch of %s did not stop cleanly: %r", w.bucket, exc)
        if self.historian is not None:
            await asyncio.to_thread(self.historian.stop)
        if self.ingest is not None:
            await asyncio.to_thread(self.ingest.stop)
        for nc in (self.hb_nc, self.nc):
            if nc is not None and not nc.is_closed:
                try:
                    await asyncio.wait_for(nc.drain(), timeout=5)
                except Exception:  # noqa: BLE001
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(nc.close(), timeout=5)
        if self.history is not None:
            self.history.close()

    def _on_heartbeat(self, rec: Record) -> None:
        metrics.HEARTBEATS.inc()
        self.state.apply_host_record(rec)  # moves the read clock itself
        self._count_read(rec.behind, rec.skipped)

    def _read_to(self, position: float, behind: int, local_now: float, skipped: int, live: bool = True,
                 whole: bool = True) -> None:
        """The heartbeat ingest process has sent everything stored before `position`
        (`live` False: a follower's reading, after which it reads nothing until the next,
        so what it left unread is not a backlog; `whole` False: it is reading each key's
        latest and has not sent them all yet)."""
        self.state.clock.advance(position, behind, local_now, skipped, live, whole)
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

    def _history_states(self, ids: list[str]) -> dict[str, JobState]:
        """Of `ids`, those history has a job of, with its state there (the scheduler refuses
        them as submissions' own ids, and judges them as their dependencies)."""
        if self.history is None:
            return {}
        return {i: JobState(s) for i, s in self.history.job_states(ids).items()}

    def _on_leadership(self, leading: bool, term: int) -> None:
        metrics.LEADER.set(1 if leading else 0)
        if not leading:
            metrics.leader_gauges_cleared()
        if leading and self.ingest is not None:
            self.ingest.go_live()  # a follower reading heartbeats now and then reads them all
        if term:
            metrics.TERM.set(term)

    async def _gauges(self) -> None:
        """The gauges, every 2 s until shutdown. A failure is logged and the loop goes on
        (found by a review: one exception ended it unseen, the gauges frozen)."""
        while not self._stop.is_set():
            try:
                self._set_gauges()
            except Exception:  # noqa: BLE001 - a bug: said, and the next round tried
                log.exception("gauges not updated")
            await pause(self._stop, 2)

    def _set_gauges(self) -> None:
        counts = self.hosts.counts(time.time())
        for h in Health:
            metrics.HOSTS.labels(h.value).set(counts.health[h.value])
        for st in JobState:
            metrics.JOBS.labels(st.value).set(self.state.job_state_counts.get(st.value, 0))
        metrics.TERM.set(self.state.term)
        if self.historian is not None:
            metrics.HISTORY_UNWRITTEN.set(self.historian.unwritten_s())
        elif self.history_health is not None:
            metrics.HISTORY_UNWRITTEN.set(self.history_health.unwritten_s(time.time()))
        # From the view, on every replica (found by exploring: the leader's cycles set them,
        # and a replica that never led said 0, one that had led what it last saw).
        metrics.QUEUE_DEPTH.set(len(self.state.backlog))
        metrics.JOBS_PARKED.labels("held").set(len(self.state.backlog.held))
        metrics.JOBS_PARKED.labels("dependencies").set(len(self.state.backlog.waiting))
        self._queue_gauges()
        index, waiting = queue_fairness(self.state, time.time())
        metrics.FAIRNESS.set(index)
        metrics.QUEUES_WAITING.set(waiting)

    def _queue_gauges(self) -> None:
        """Per queue: allocated, nominal and borrowed per resource, pending jobs, fair share (the rank,
        the dominant share and the entitled share)."""
        # Per gauge, the label sets set now: any other set before is removed (found by
        # exploring: a GPU quota removed while its GPUs were in use kept its nominal series).
        seen: dict[int, set[tuple[str, ...]]] = {}

        def put(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
            gauge.labels(*labels).set(value)
            seen.setdefault(id(gauge), set()).add(labels)

        for row in queue_rows(self.state, time.time(), self.config.fair_share_half_life_s):
            name = row.queue.name
            put(metrics.QUEUE_PENDING, (name,), row.pending)
            put(metrics.QUEUE_FAIR_SHARE, (name,), row.share)
            put(metrics.QUEUE_DOMINANT_SHARE, (name,), row.dominant)
            put(metrics.QUEUE_ENTITLED_SHARE, (name,), row.entitled)
            for r in row.resources:
                put(metrics.QUEUE_ALLOCATED, (name, r.resource), r.used)
                put(metrics.QUEUE_BORROWED, (name, r.resource), r.borrowed)
                if r.nominal is not None:
                    put(metrics.QUEUE_NOMINAL, (name, r.resource), r.nominal)
        for gauge in (metrics.QUEUE_PENDING, metrics.QUEUE_FAIR_SHARE, metrics.QUEUE_DOMINANT_SHARE,
                      metrics.QUEUE_ENTITLED_SHARE, metrics.QUEUE_ALLOCATED,
                      metrics.QUEUE_BORROWED, metrics.QUEUE_NOMINAL):
            now_set = seen.get(id(gauge), set())
            for labels in self._gauge_labels.get(id(gauge), set()) - now_set:
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass
            self._gauge_labels[id(gauge)] = now_set

    @property
    def ready(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def store_ready(self) -> str:
        """Whether the state stream answers this replica and has a leader: "" when it does,
        else why not. A replica connected to a NATS node that lost its
        cluster's quorum, or is cut off from the rest, has a live connection and can store
        nothing. Asked at most every READY_PROBE_S; health checks meanwhile get the last
        answer."""
        at, why = self._ready_probe
        if time.monotonic() - at < READY_PROBE_S:
            return why
        async with self._ready_lock:
            at, why = self._ready_probe
            if time.monotonic() - at < READY_PROBE_S:
                return why
            if self.store is None:
                why = "not started"
            else:
                try:
                    info = await asyncio.wait_for(self.store.js.stream_info(f"KV_{subjects.STATE_BUCKET}"),
                                                  timeout=READY_PROBE_TIMEOUT_S)
                    # A node that lost its quorum answers from its own replica after a few
                    # seconds, naming no leader (found by a clean clone's run: ready again).
                    leaderless = info.cluster is not None and not info.cluster.leader
                    why = "the state stream has no leader (its NATS cluster lost its quorum)" if leaderless else ""
                except Exception as exc:  # noqa: BLE001 - any failure is the answer
                    why = f"the state stream does not answer ({exc or type(exc).__name__})"
            self._ready_probe = (time.monotonic(), why)
            return why

    @property
    def role(self) -> str:
        return "leader" if self.leadership and self.leadership.leading else "follower"

    @property
    def leader(self) -> str:
        """The replica named as holding the leader lease (API, console): this one while it
        leads; otherwise the lease key's holder, or "" once the key has not been renewed
        within the lease's TTL and a second (it expired, or this replica cannot hear the
        store: either way no leader is known; it named the last holder for as long)."""
        return self.leader_at(time.monotonic())

    def leader_at(self, now: float) -> str:
        """`leader` as at `now` (time.monotonic())."""
        if self.leadership is not None and self.leadership.leading:
            return self.config.name
        if self.state.leader and now - self.state.lease_seen_at > self.config.lease_ttl_s + 1.0:
            return ""
        return self.state.leader

    @property
    def term(self) -> int:
        """The term shown (API, console): the one this replica holds when it leads (the
        store may already show a newer one it has not noticed yet, and the two must not
        read as one), otherwise the newest it has seen in the store."""
        if self.leadership is not None and self.leadership.leading:
            return self.leadership.term
        return self.state.term
