"""ClusterState: every server's in-memory view of the cluster, fed by KV watches.

It holds the latest heartbeat of each host, every job record, every host
allocation, operator host settings and the token hashes, each with its store
revision. Records older than what is held are ignored, so the leader can apply
its own commits at once and let the watch catch up later.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from server.health.index import HealthIndex
from server.health.readclock import ReadClock
from server.health.rules import EXPIRY_TICK_S, Health, host_health
from server.scheduling import groups
from server.scheduling.backlog import Backlog
from server.scheduling.capacity import CapacityIndex
from server.scheduling.deadlines import Deadlines, try_deadline
from server.scheduling.dependencies import Dependencies
from server.scheduling.eviction import host_domains
from server.scheduling.fairshare import host_capacity
from server.scheduling.fragmentation import RecentShapes, Shape
from server.scheduling.hostlabels import Dispute, LabelTrust, disputes, effective_labels
from server.scheduling.livecounts import LiveCounts, queue_user
from server.scheduling.maintenance import Window, started
from server.scheduling.placement import HostCapacity
from server.scheduling.queues import add as add_resources
from server.scheduling.queues import add_user, job_usage
from server.scheduling.setasidework import SetAsideWork
from server.scheduling.submitlimits import OpenJobs
from server.scheduling.victimindex import VictimIndex
from server.views.hosts import HostTable
from wire import subjects
from wire.errors import DecodeError
from wire.messages import (
    MAX_MESSAGE_BYTES,
    MAX_RECORD_BYTES,
    SHAPE_HEADER,
    AdvanceReservation,
    AttemptState,
    Heartbeat,
    HostAlloc,
    Job,
    JobState,
    Queue,
    QueueUsage,
    decode,
    host_gpus_held,
    shape_digest,
)
from wire.records import Record, rolls_up_all, stored_ttl_s

log = logging.getLogger(__name__)

# How long the revision of a deleted key is kept (ClusterState._forget_deleted).
DELETED_KEEP_S = 600.0


class HostConfig(BaseModel):
    """Operator settings of a host (`hostcfg.<host>`). A draining host is also cordoned;
    at `drain_deadline` its remaining attempts are stopped and requeued elsewhere. A drain
    scheduled ahead (`drain_at` after the time it was set) begins then: until then the host
    takes only jobs that its deadline would not stop (scheduling.maintenance).
    `gpu_clears` counts the operator's clears of each GPU's fault mark, by GPU index (the
    leader copies them into the host's assignment, where the agent reads them). `labels`
    are the operator's labels of the host (`muster host label`): they override its
    agent's, and are the only source of the keys only operators set
    (scheduling.hostlabels). A cordon or drain keeps both."""

    cordoned: bool = False
    draining: bool = False
    drain_deadline: float = 0.0
    drain_at: float = 0.0  # when a scheduled drain begins (0: when it was set)
    reason: str = ""
    by: str = ""
    ts: float = 0.0
    gpu_clears: dict[int, int] = {}
    labels: dict[str, str] = {}

    def window(self) -> Window | None:
        """The drain scheduled ahead, if one is (from `drain_at` to `drain_deadline`)."""
        return Window(self.drain_at, self.drain_deadline) if self.draining and self.drain_at else None

    def drain_due(self, now: float) -> bool:
        """Whether the drain's deadline has come: what still runs there is stopped."""
        return self.draining and now >= self.drain_deadline

    def drain_begun(self, now: float) -> bool:
        """Whether the host is draining at `now` (a drain scheduled ahead: from its start)."""
        return self.draining and now >= self.drain_at

    def cordoned_at(self, now: float) -> bool:
        """Whether nothing new may be placed on the host at `now`: cordoned, or draining."""
        return self.cordoned or self.drain_begun(now)


class TokenInfo(BaseModel):
    name: str
    role: str = "operator"
    created_at: float = 0.0
    # The queues this token may submit to (None: any; admin tokens: any).
    queues: list[str] | None = None
    # When it stops working (0: never); its key expires then too (Nats-TTL).
    expires_at: float = 0.0

    def expired(self, now: float | None = None) -> bool:
        return bool(self.expires_at) and (time.time() if now is None else now) >= self.expires_at

    @property
    def submit_queues(self) -> list[str] | None:
        """The queues whose jobs this token may submit and cancel (None: any)."""
        return None if self.role == "admin" else self.queues

    @property
    def cluster_wide(self) -> bool:
        """Whether this token may act on the cluster itself (cordon, drain, clear GPU
        faults): an admin's, or one bound to no queue. A token bound to queues is a team's:
        it acts only on its queues' jobs."""
        return self.submit_queues is None

    def may_manage(self, queue: str) -> bool:
        """Whether this token may act on, and see the environment of, a job of `queue`."""
        allowed = self.submit_queues
        return allowed is None or queue in allowed


class SessionInfo(BaseModel):
    """A console session (`auth.session.<sha256 of its id>`): the token it was opened
    with (its hash) and when it ends; the key also expires then (Nats-TTL)."""

    token: str
    created_at: float = 0.0
    expires_at: float = 0.0


@dataclass
class HostEntry:
    """A host as last heard of. `heartbeat` is the last decoded heartbeat; heartbeats
    whose shape header was unchanged are kept raw (`raw`) and decoded only when read."""

    host_id: str
    heartbeat: Heartbeat | None
    revision: int
    seen_at: float
    present: bool = True
    lost_at: float | None = None
    shape: str | None = None
    raw: bytes | None = None
    # When (its agent's clock) a status report of its said the agent is shutting down,
    # before a heartbeat saying so was read: nothing is placed here from then.
    leaving_reported: float | None = None
    # A report came from an agent process its last decoded heartbeat is not from
    # (`heard_from`): (that process, when by its clock). Nothing is placed here until a
    # heartbeat of that process, or one sent since, is read.
    unheard_agent: tuple[str, float] | None = None
    # The TTL its last heartbeat was stored with (`Nats-TTL`; None: none, the store keeps
    # it until it is replaced).
    ttl_s: float | None = None
    # Taken as expired by its age, its key having gone without an expiry marker
    # (`ClusterState._expire_overdue`), rather than by the marker.
    lost_unmarked: bool = False

    def latest(self) -> Heartbeat | None:
        """The newest heartbeat, decoding a raw one on demand."""
        if self.raw is not None:
            try:
                hb = decode(Heartbeat, self.raw)
                if hb.host_id == self.host_id:
                    self.heartbeat = hb
            except DecodeError:
                pass
            self.raw = None
        return self.heartbeat


M = TypeVar("M", bound=BaseModel)

_NO_LABELS: dict[str, str] = {}

# A host's heartbeat key lives this many intervals (the agents' default `--ttl-intervals`):
# a host not heard again that long after the bucket was renumbered is taken as expired.
UNCONFIRMED_TTL_INTERVALS = 3


def _keep(into: dict[str, M], name: str, value: bytes | None, cls: type[M]) -> None:
    """A record's decoded value under `name`, or nothing once the record is deleted."""
    if value is None:
        into.pop(name, None)
    else:
        into[name] = decode(cls, value)


@dataclass
class ClusterState:
    heartbeat_interval_s: float = 5.0
    hosts: dict[str, HostEntry] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    allocs: dict[str, HostAlloc] = field(default_factory=dict)
    # Bytes of each host's allocation record as stored (what placement adds to).
    alloc_bytes: dict[str, int] = field(default_factory=dict)
    # The shapes of recently submitted tasks, for fragmentation-aware placement.
    shapes: RecentShapes = field(default_factory=lambda: RecentShapes())
    # Per host: its last decoded heartbeat and what placement reads of it (_index_host).
    _host_shapes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    hostcfg: dict[str, HostConfig] = field(default_factory=dict)
    # The label keys only operators set (scheduling.hostlabels; MUSTER_OPERATOR_LABEL_KEYS):
    # change them with `set_label_trust`.
    label_trust: LabelTrust = field(default_factory=LabelTrust)
    # Per host, the labels placement and failure domains read (`labels_of`), and the
    # trusted keys its agent reports otherwise than the operator set them (`disputes`):
    # kept as its last decoded heartbeat's labels and its settings change (`_relabel`).
    host_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    label_disputes: dict[str, tuple[Dispute, ...]] = field(default_factory=dict)
    # Hosts with a drain scheduled ahead, and its window (scheduling.maintenance): kept as
    # host settings arrive.
    maintenance: dict[str, Window] = field(default_factory=dict)
    # Advance reservations (`advres.<name>`): hosts set aside for queues over a time window
    # (scheduling.advance).
    advance: dict[str, AdvanceReservation] = field(default_factory=dict)
    # Per reservation, its hosts where others' work runs (scheduling.setasidework): what
    # the planner stops once it is open, kept as records arrive.
    set_aside_work: SetAsideWork = field(default_factory=SetAsideWork)
    tokens: dict[str, TokenInfo] = field(default_factory=dict)
    sessions: dict[str, SessionInfo] = field(default_factory=dict)
    revisions: dict[str, int] = field(default_factory=dict)
    # The job keys deleted (expired), oldest first: (when, key, the deletion's revision);
    # their revisions are forgotten DELETED_KEEP_S later (`_forget_deleted`). Only jobs'
    # (the keys without bound; their expiry markers go after a minute): a queue deleted
    # keeps its marker, and a create expecting revision 0 would have been refused.
    deleted: deque[tuple[float, str, int]] = field(default_factory=deque)
    term: int = 0
    leader: str = ""
    lease_seen_at: float = 0.0  # time.monotonic() when the lease key last changed here
    dropped: Counter[str] = field(default_factory=Counter)
    listeners: list[Callable[[str, object], None]] = field(default_factory=list)
    index: CapacityIndex = field(default_factory=CapacityIndex)
    # Jobs placed whose every task has not been reported running yet (scheduling.delivery).
    placed_ids: set[str] = field(default_factory=set)
    job_state_counts: Counter[str] = field(default_factory=Counter)
    # Records this process is committing (key -> encoded value, object): when the watch
    # brings the same bytes back, the object is used instead of decoding them again.
    written: dict[str, tuple[bytes, object]] = field(default_factory=dict)
    # Hosts whose heartbeat key expired (entry.present False), kept as heartbeats arrive
    # so the planner need not walk every host each cycle.
    absent: set[str] = field(default_factory=set)
    # Hosts present when the hosts bucket was last renumbered (hosts_renumbered) and not
    # heard since, and when that was (on the read clock: health_time).
    _unconfirmed: set[str] = field(default_factory=set)
    _renumbered_at: float | None = None
    # Hosts whose last decoded heartbeat names attempts with idle GPUs (Heartbeat.gpu_idle).
    idle_gpu_hosts: set[str] = field(default_factory=set)
    # Hosts with an alloc record but no record in the hosts bucket at all (their key
    # expired and was removed before this process started), kept the same way.
    unheard: set[str] = field(default_factory=set)
    _domain_sizes: dict[tuple[str, str], int] | None = None
    # Every host's health as of its last refresh (HealthMonitor, summaries), kept from
    # the heartbeats and expiries applied here instead of a pass over every host.
    health_index: HealthIndex = field(default_factory=HealthIndex)
    # How far the heartbeats have been read, on the store's clock: health is judged at
    # its time, not the wall clock's (server.health.readclock).
    clock: ReadClock = field(default_factory=ReadClock)
    # GPUs of present hosts, and those of them allocated to tasks (counted per host in
    # `_held`): kept as records arrive. A lost host's allocated GPUs count for nothing, as
    # its GPUs do (found by exploring: `cluster.gpus` said 8 of 4 allocated).
    gpus_present: int = 0
    gpus_allocated: int = 0
    _held: dict[str, int] = field(default_factory=dict)
    # Queues (`queue.<name>`), their decayed past use (`qusage.<name>`), and per queue
    # what its jobs hold now and its jobs holding something: kept as job records arrive
    # (server.scheduling.queues; its queued jobs are the backlog's, below).
    queues: dict[str, Queue] = field(default_factory=dict)
    queue_past: dict[str, QueueUsage] = field(default_factory=dict)
    queue_usage: dict[str, dict[str, float]] = field(default_factory=dict)
    # job id -> what its record holds (queues.job_usage; only jobs that hold something):
    # taken back from queue_usage when the record is replaced, read by the planner.
    held: dict[str, dict[str, float]] = field(default_factory=dict)
    queue_live: dict[str, set[str]] = field(default_factory=dict)
    # Per queue, the GPUs each user's live jobs hold (scheduling.queues.held_gpus): what
    # per-user limits are checked against, kept as records arrive.
    user_usage: dict[str, dict[str, float]] = field(default_factory=dict)
    # Per queue and per user of it, the jobs not ended: what submission limits count
    # (scheduling.submitlimits), kept as records arrive.
    open_jobs: OpenJobs = field(default_factory=OpenJobs)
    # Jobs placed or running (scheduling.livecounts), kept as records arrive: per user and
    # job group with a limit (scheduling.groups), and per queue and user (what a queue's
    # per-user running-jobs limit is checked against).
    group_live: LiveCounts[groups.GroupKey] = field(default_factory=groups.counts)
    named_live: LiveCounts[groups.Key] = field(default_factory=groups.named_counts)
    user_live: LiveCounts[tuple[str, str]] = field(default_factory=lambda: LiveCounts(queue_user))
    # The cluster's capacity for fair share (fairshare.host_capacity, summed): the GPUs
    # (per model, but faulty ones), CPUs and memory of hosts that take new work, and what
    # tasks hold on the others; `capacity_at` takes out the free part of hosts in a
    # maintenance window begun. Per host, its part; per window, its hosts' free part.
    capacity: dict[str, float] = field(default_factory=dict)
    _host_resources: dict[str, dict[str, float]] = field(default_factory=dict)
    _host_window_free: dict[str, tuple[Window, dict[str, float]]] = field(default_factory=dict)
    _window_free: dict[Window, dict[str, float]] = field(default_factory=dict)
    # Hosts whose heartbeat reports faulted GPUs, and their indices; and those of them where
    # a task not yet told to stop holds one (both kept by _index_host): the planner stops
    # that work without a pass over every host, or over every task of a faulted host.
    faulted_gpus: dict[str, frozenset[int]] = field(default_factory=dict)
    faulted_work: set[str] = field(default_factory=set)
    # Running tries with a time limit: job id -> when it is reached.
    deadlines: Deadlines = field(default_factory=Deadlines)
    # Queued jobs whose record names a reservation (`Job.reserved`, scheduling.backfill):
    # one, or for a moment two while the leader moves it.
    reserved: set[str] = field(default_factory=set)
    # Running jobs that could be stopped for another (scheduling.preemption.stoppable), per
    # queue in an order the searches for victims read cheapest first (scheduling.victimindex).
    victims: VictimIndex = field(default_factory=VictimIndex)
    # The queued jobs of each queue in their order, and each queue's smallest job
    # (scheduling.backlog): what the planner would otherwise sort and measure each cycle.
    backlog: Backlog = field(default_factory=Backlog)
    # Jobs waiting for others, by the jobs they wait for, and those whose wait the planner
    # must look at (scheduling.dependencies).
    deps: Dependencies = field(default_factory=Dependencies)

    def __post_init__(self) -> None:
        self.clock.settle_s = self.heartbeat_interval_s
        # The host read model (GraphQL and the console), told of every change below.
        self.host_table = HostTable(self)

    def _count_held(self, host_id: str) -> None:
        """Count again the GPUs allocated on `host_id` into `gpus_allocated` (its
        allocation or its heartbeat changed, or it was lost)."""
        self.gpus_allocated -= self._held.pop(host_id, 0)
        alloc = self.allocs.get(host_id)
        entry = self.hosts.get(host_id)
        if alloc is not None and alloc.tasks and entry is not None and entry.present:
            n = self._held[host_id] = len(host_gpus_held(alloc, entry.heartbeat))
            self.gpus_allocated += n

    def _set_alloc(self, host_id: str, alloc: HostAlloc | None, size: int = 0) -> None:
        self.allocs.pop(host_id, None)
        self.alloc_bytes.pop(host_id, None)
        if alloc is not None:
            self.allocs[host_id] = alloc
            self.alloc_bytes[host_id] = size
        self._count_held(host_id)
        if alloc is not None:
            if host_id not in self.hosts:
                self.unheard.add(host_id)
        else:
            self.unheard.discard(host_id)
        self.set_aside_work.alloc(host_id, alloc, self.jobs)

    def _drop_job(self, job_id: str) -> None:
        old = self.jobs.pop(job_id, None)
        if old is not None:
            self.job_state_counts[old.state.value] -= 1
            self._queue_account(old, -1)
            add_user(self.user_usage, old, -1.0)
            self.open_jobs.update(old, None)
            self.group_live.update(old, None)
            self.named_live.update(old, None)
            self.user_live.update(old, None)
            self.backlog.update(old, None)
            self.deps.changed(self.jobs, job_id)
        self.placed_ids.discard(job_id)
        self.deadlines.drop(job_id)
        self.victims.drop(job_id)
        self.reserved.discard(job_id)

    def _set_job(self, job: Job) -> None:
        old = self.jobs.get(job.id)
        if old is None and job.state is JobState.QUEUED:
            self.shapes.saw(Shape.of(job.spec))
        if old is not None:
            self.job_state_counts[old.state.value] -= 1
            self._queue_account(old, -1)
            add_user(self.user_usage, old, -1.0)
        self.job_state_counts[job.state.value] += 1
        self.jobs[job.id] = job
        if old is None:
            self.set_aside_work.job_seen(job, self.allocs, self.jobs)
        self._queue_account(job, 1)
        add_user(self.user_usage, job, 1.0)
        self.open_jobs.update(old, job)
        self.group_live.update(old, job)
        self.named_live.update(old, job)
        self.user_live.update(old, job)
        self.backlog.update(old, job)
        self.deps.changed(self.jobs, job.id)
        if job.state is JobState.PLACED or (job.state is JobState.RUNNING and job.spec.replicas > 1 and any(
                a.state is AttemptState.PLACED for a in job.current_tasks())):  # a gang runs from its first task
            self.placed_ids.add(job.id)
        else:
            self.placed_ids.discard(job.id)
        self._deadline(job)
        self.victims.update(job)
        if job.reserved is not None and job.state is JobState.QUEUED:
            self.reserved.add(job.id)
        else:
            self.reserved.discard(job.id)

    def _queue_account(self, job: Job, sign: int) -> None:
        """Add (`sign` 1) or remove (-1) what a job record holds to its queue's figures
        (removed: the record added last for its job)."""
        q = job.spec.queue
        held: dict[str, float] | None
        if sign > 0:
            held = job_usage(job)
            if not held:
                return
            self.held[job.id] = held
        else:
            held = self.held.pop(job.id, None)
            if held is None:
                return
        add_resources(self.queue_usage.setdefault(q, {}), held, float(sign))
        live = self.queue_live.setdefault(q, set())
        if sign > 0:
            live.add(job.id)
        else:
            live.discard(job.id)

    def _deadline(self, job: Job) -> None:
        """Keep the time a running try reaches its time limit (`try_deadline`)."""
        tasks = job.current_tasks() if job.state in (JobState.RUNNING, JobState.PLACED) else []
        at = try_deadline(tasks)
        if at is not None:
            self.deadlines.set(job.id, at)
        else:
            self.deadlines.drop(job.id)

    def _host_capacity(self, host_id: str, cap: HostCapacity | None) -> None:
        """Keep the cluster's capacity totals as a host's entry changes (None: gone from
        the index)."""
        old = self._host_resources.pop(host_id, None)
        if old:
            add_resources(self.capacity, old, -1.0)
        was = self._host_window_free.pop(host_id, None)
        if was is not None:
            window_free = self._window_free[was[0]]
            add_resources(window_free, was[1], -1.0)
            if not window_free:
                del self._window_free[was[0]]
        if cap is None:
            return
        res, free = host_capacity(cap)
        if res:
            self._host_resources[host_id] = res
            add_resources(self.capacity, res)
        window = self.maintenance.get(host_id)
        if window is not None and free:
            self._host_window_free[host_id] = (window, free)
            add_resources(self._window_free.setdefault(window, {}), free)

    def capacity_at(self, now: float) -> dict[str, float]:
        """The cluster's capacity for fair share at `now`: `capacity` less the free part
        of hosts whose maintenance window has begun (nothing new is placed there)."""
        begun = [free for window, free in self._window_free.items() if started(window, now)]
        if not begun:
            return self.capacity
        out = dict(self.capacity)
        for free in begun:
            add_resources(out, free, -1.0)
        return out

    def _index_host(self, host_id: str) -> None:
        """Rebuild one host's entry in the capacity index from heartbeat, alloc, settings,
        and tell the host read model. The one place a HostCapacity is built: schedulable
        means the heartbeat key is live; a draining host is cordoned."""
        self.host_table.changed(host_id)
        entry = self.hosts.get(host_id)
        if entry is None or entry.heartbeat is None:
            self.index.remove(host_id)
            self._host_shapes.pop(host_id, None)
            self.faulted_gpus.pop(host_id, None)
            self.faulted_work.discard(host_id)
            self._host_capacity(host_id, None)
            return
        hb = entry.heartbeat
        cfg = self.hostcfg.get(host_id)
        shape = self._host_shapes.get(host_id)
        if shape is None or shape[0] is not hb:
            # What a heartbeat says of the host's GPUs, derived once per decoded heartbeat
            # (allocations change far more often than heartbeat shapes).
            mig = {m.uuid: (g.index, m.profile, m.memory_mb) for g in hb.gpus for m in g.mig}
            shape = self._host_shapes[host_id] = (
                hb, {g.index: g.model for g in hb.gpus}, {g.index: g.memory_mb for g in hb.gpus}, mig,
                frozenset(g.index for g in hb.gpus if g.in_mig_mode()),
                frozenset(u.index for u in hb.gpu_usage if not u.healthy))
        _hb, models, memory, mig, mig_gpus, unhealthy = shape
        if unhealthy:
            self.faulted_gpus[host_id] = unhealthy
        else:
            self.faulted_gpus.pop(host_id, None)
        cap = HostCapacity(
            id=host_id,
            # An agent shutting down starts nothing: its heartbeat says so, or a report did first.
            schedulable=entry.present and not hb.leaving and entry.leaving_reported is None
            and entry.unheard_agent is None,
            # A drain scheduled ahead is placement's to keep (`maintenance`), by the clock.
            cordoned=bool(cfg and (cfg.cordoned or (cfg.draining and not cfg.drain_at))),
            pressure=bool(hb.pressure),
            gpu_models=models,
            unhealthy_gpus=unhealthy,
            cpus=float(hb.cpus),
            memory_mb=hb.memory_mb,
            labels=self.host_labels.get(host_id, {}),
            gpu_memory=memory,
            mig=mig,
            mig_gpus=mig_gpus,
        )
        alloc = self.allocs.get(host_id)
        if alloc:
            for t in alloc.tasks:
                cap.hold(t)
            cap.record_bytes = self.alloc_bytes.get(host_id, 0)
        if unhealthy and alloc and any(
                not t.stop and not unhealthy.isdisjoint(self.task_gpus(host_id, t.gpu_indices, t.mig))
                for t in alloc.tasks):
            self.faulted_work.add(host_id)
        else:
            self.faulted_work.discard(host_id)
        self.index.put(cap)
        self._host_capacity(host_id, cap)

    def task_gpus(self, host_id: str, gpu_indices: Iterable[int], mig: Iterable[str]) -> set[int]:
        """The GPUs a task holds on a host: whole, shared, or the GPU its MIG instance is on
        (as the host's last decoded heartbeat says)."""
        held = set(gpu_indices)
        shape = self._host_shapes.get(host_id) if mig else None
        if shape is not None:
            parents = shape[3]  # MIG instance uuid -> (GPU index, profile, memory)
            held.update(parents[u][0] for u in mig if u in parents)
        return held

    @staticmethod
    def _shape(hb: Heartbeat | None) -> tuple[object, ...] | None:
        if hb is None:
            return None
        # Everything placement reads of a heartbeat (`_index_host`): a change of a GPU's
        # memory or MIG layout alone must reach it too.
        return (tuple((g.index, g.model, g.memory_mb, g.in_mig_mode(), tuple((m.uuid, m.profile, m.memory_mb)
                                                                              for m in g.mig))
                      for g in hb.gpus),
                tuple(u.index for u in hb.gpu_usage if not u.healthy), hb.cpus, hb.memory_mb,
                tuple(sorted(hb.labels.items())), hb.leaving, hb.pressure)

    # ------------------------------------------------------------ feeding

    def _notify(self, kind: str, obj: object) -> None:
        for fn in self.listeners:
            try:
                fn(kind, obj)
            except Exception:  # noqa: BLE001
                log.exception("listener failed on %s", kind)

    def hosts_renumbered(self) -> None:
        """The `hosts` bucket was emptied and numbers its records afresh (every NATS node
        restarted with it in memory): the revisions read before are forgotten, so that the
        heartbeats stored from now on, at lower revisions, are applied (found by exploring:
        every one was taken for an older record and dropped, and every host stayed SUSPECT,
        scheduling nothing, for as long as the bucket had been in use)."""
        self._unconfirmed = {key for key, entry in self.hosts.items() if entry.present}
        if self._unconfirmed:
            log.warning("the hosts bucket is read anew (it numbers its records afresh, or its reader started "
                        "again): the revisions read before are forgotten")
        # Counted on the store's clock from the first record read after it, as heartbeats'
        # ages are judged (a review: from the read clock as it stood, a follower's last
        # reading or a reader behind, hosts not read yet were taken as expired at once).
        self._renumbered_at = None
        for entry in self.hosts.values():
            entry.revision = 0

    def _expire_unconfirmed(self, now: float) -> None:
        """Hosts present before the bucket was renumbered and not heard since, a heartbeat
        TTL and an interval later: as if their keys expired (their markers went with the
        bucket; found by a review: such a host stayed SUSPECT for good, its work never
        replaced)."""
        window = (UNCONFIRMED_TTL_INTERVALS + 1) * self.heartbeat_interval_s
        if self._renumbered_at is None:
            # No record read since. While the reader is caught up (its clock runs on with
            # the local one) the wait counts from now: with every agent gone no record
            # comes at all, and the hosts stayed SUSPECT for good (a review). A reader that
            # is behind, or reads now and then (a follower), waits for its next record.
            if self.clock.caught_up:
                self._renumbered_at = self.health_time(now)
            return
        if self.health_time(now) - self._renumbered_at <= window:
            return
        gone, self._unconfirmed = self._unconfirmed, set()
        for key in gone:
            entry = self.hosts.get(key)
            if entry is not None and entry.present:
                log.warning("host %s not heard since the hosts bucket was renumbered: taken as expired", key)
                entry.revision = -1  # (the marker applies; the host's next heartbeat, at any revision, too)
                self.apply_heartbeat(key, 0, None, None, now)

    def _expire_overdue(self, key: str, heard_to: float) -> None:
        """A host whose heartbeat key should have expired (its last heartbeat older, at
        `heard_to`, than the TTL it was stored with and an interval: rules.key_overdue)
        and whose expiry marker never came: the key was removed without one (the bucket
        purged, as a heartbeat published with `Nats-Rollup: all` does; found by exploring:
        a dead host stayed SUSPECT for good and its work was never replaced). Taken as
        expired, when its key would have: as if its marker had come."""
        entry = self.hosts.get(key)
        if entry is None or not entry.present or entry.ttl_s is None:
            return
        log.warning("host %s: no heartbeat read for %.0f s, past the %.0f s TTL of its key, and no expiry marker (the "
                    "hosts bucket was purged?): taken as expired", key, heard_to - entry.seen_at, entry.ttl_s)
        entry.lost_unmarked = True
        self._lose(key, entry, entry.seen_at + entry.ttl_s)

    def rolled_up(self, key: str, stamp: float) -> None:
        """Host `key`'s heartbeat was published with `Nats-Rollup: all`, stored at
        `stamp`: the store removed every other host's heartbeat as it stored it (no agent
        sends that header: its credentials were used by something else). Hosts alive
        heartbeat again within an interval; those that are not are taken as expired a
        TTL and an interval after their last heartbeat (`_expire_overdue`)."""
        log.error("host %s's heartbeat was published with Nats-Rollup: all, which removed every other host's heartbeat "
                  "from the hosts bucket: that host's NATS credentials are being misused", key)
        self._notify("host_rollup", (key, stamp))

    def apply_host_record(self, rec: Record, now: float | None = None) -> None:
        """A record of the `hosts` bucket: a heartbeat, or (value None) its expiry. A
        watched record is stamped with the store's time and moves the read clock."""
        local = time.time() if now is None else now
        headers = rec.headers or {}
        self.apply_heartbeat(rec.key, rec.revision, rec.value, headers.get(SHAPE_HEADER), rec.stamp or local,
                             stored_ttl_s(headers) if rec.value is not None else None)
        if rec.value is not None and rolls_up_all(headers):
            self.rolled_up(rec.key, rec.stamp or local)
        if rec.stamp:
            self.clock.advance(rec.stamp, rec.behind, local, rec.skipped)

    def _heard_undecoded(self, key: str, entry: HostEntry | None, revision: int, now: float,
                         ttl_s: float | None) -> None:
        """A heartbeat the store holds for a present host, which this server could not use
        (it does not decode: an agent newer than this server sending a value it refuses; or
        it names another host): its key is alive all the same, so the host is not taken as
        expired by its age (`_expire_overdue`; found by a review: such a host was declared
        LOST while its agent, unfenced, ran its tries on). What it reported last stays."""
        if entry is None or not entry.present or entry.heartbeat is None:
            return
        self.health_index.seen(key, entry.seen_at, now)
        entry.revision = revision
        entry.seen_at = now
        entry.ttl_s = ttl_s

    def apply_heartbeat(self, key: str, revision: int, value: bytes | None, shape: str | None,
                        now: float, ttl_s: float | None = None) -> None:
        """One host's heartbeat (`value`, with its `Muster-Shape` header `shape`, stored
        with a TTL of `ttl_s`, None: none) or its expiry marker (`value` None), stored at
        `revision` and at time `now` (the store's time when known, else when it was
        received)."""
        entry = self.hosts.get(key)
        if entry is not None and revision <= entry.revision:
            return
        if self._unconfirmed:
            self._unconfirmed.discard(key)
            if self._renumbered_at is None:
                self._renumbered_at = now
        if value is None:
            self.absent.add(key)
            self.idle_gpu_hosts.discard(key)
            if entry is None:
                self.hosts[key] = HostEntry(key, None, revision, now, False, now)
                self.unheard.discard(key)
            else:
                entry.revision = revision
                self._lose(key, entry, now)
            return
        if (entry is not None and entry.present and entry.heartbeat is not None and shape
                and shape == entry.shape and len(value) <= MAX_MESSAGE_BYTES and entry.leaving_reported is None
                and entry.unheard_agent is None):
            # Same shape as the last decoded heartbeat: liveness only; decode when read.
            self.health_index.seen(key, entry.seen_at, now)
            entry.revision = revision
            entry.seen_at = now
            entry.ttl_s = ttl_s
            entry.raw = value
            return
        try:
            hb = decode(Heartbeat, value)
        except DecodeError as exc:
            self.dropped["heartbeat"] += 1
            log.warning("dropped heartbeat for %s: %s", key, exc)
            self._heard_undecoded(key, entry, revision, now, ttl_s)
            return
        if hb.host_id != key:
            self.dropped["heartbeat"] += 1
            log.warning("dropped heartbeat: key %s carries host %s", key, hb.host_id)
            self._heard_undecoded(key, entry, revision, now, ttl_s)
            return
        was_present = entry.present if entry else False
        before = {u.index for u in entry.heartbeat.gpu_usage if not u.healthy} if entry and entry.heartbeat else set()
        # A shutdown a report told of holds until a heartbeat says the agent is not leaving
        # and was sent after it, or comes from another agent (instance or boot) or after the
        # key expired: the agent was started again. (Not by the clock alone: found by
        # exploring, a report stamped by an agent clock a day fast kept the host from work
        # across restarts, a reboot and a LOST until its clock passed the stamp.)
        reported = entry.leaving_reported if entry is not None else None
        last = entry.heartbeat if entry is not None else None
        if reported is not None and not hb.leaving and (
                hb.ts > reported or last is None or not entry.present  # type: ignore[union-attr]
                or hb.instance != last.instance or hb.boot_id != last.boot_id):
            reported = None
        # A report of an agent not heard from yet holds until a heartbeat sent since is read.
        unheard = entry.unheard_agent if entry is not None else None
        if unheard is not None and (hb.instance == unheard[0] or hb.ts >= unheard[1]):
            unheard = None
        self.hosts[key] = HostEntry(key, hb, revision, now, True, None,
                                    shape if shape == shape_digest(hb) else None, leaving_reported=reported,
                                    unheard_agent=unheard, ttl_s=ttl_s)
        self.unheard.discard(key)
        self.health_index.seen(key, entry.seen_at if entry is not None and entry.present else None, now)
        if was_present and entry is not None and entry.heartbeat is not None:
            self.gpus_present -= len(entry.heartbeat.gpus)
        self.gpus_present += len(hb.gpus)
        self._count_held(key)
        self.absent.discard(key)
        if entry is None or entry.heartbeat is None or entry.heartbeat.labels != hb.labels:
            self._relabel(key)
        cleared = entry is not None and ((entry.leaving_reported is not None and reported is None)
                                         or (entry.unheard_agent is not None and unheard is None))
        if not was_present or cleared or self._shape(entry.heartbeat if entry else None) != self._shape(hb):
            self._index_host(key)
        if not was_present:
            self._notify("host_up", self.hosts[key])
        if entry is not None and entry.heartbeat is not None and hb.fences > entry.heartbeat.fences:
            self._notify("host_fenced", (key, hb, entry.heartbeat))
        for u in hb.gpu_usage:
            if not u.healthy and u.index not in before:
                self._notify("gpu_unhealthy", (key, u))
        if hb.pressure and (entry is None or entry.heartbeat is None or entry.heartbeat.pressure != hb.pressure):
            self._notify("host_pressure", (key, hb))
        if hb.gpu_idle:
            self.idle_gpu_hosts.add(key)
        else:
            self.idle_gpu_hosts.discard(key)

    def _lose(self, key: str, entry: HostEntry, at: float) -> None:
        """A present host's heartbeat key expired at `at` (the store's time)."""
        self.absent.add(key)
        self.idle_gpu_hosts.discard(key)
        if not entry.present:
            return
        entry.present = False
        entry.lost_at = at
        if entry.heartbeat is not None:
            self.gpus_present -= len(entry.heartbeat.gpus)
        self._count_held(key)
        self.health_index.expired(key, entry.seen_at)
        self._index_host(key)
        self._notify("host_lost", entry)

    def apply_state_record(self, rec: Record) -> None:
        key = rec.key
        if rec.revision <= self.revisions.get(key, 0):
            return
        self.revisions[key] = rec.revision
        if rec.value is None and key.startswith("job."):
            self.deleted.append((time.monotonic(), key, rec.revision))
        if self.deleted:
            self._forget_deleted(time.monotonic())
        kind, _, name = key.partition(".")
        try:
            if kind == "job":
                if rec.value is None:
                    self._drop_job(name)
                    return
                own = self.written.pop(key, None)
                job = own[1] if own is not None and own[0] == rec.value and isinstance(own[1], Job) \
                    else decode(Job, rec.value, limit=MAX_RECORD_BYTES)
                self._set_job(job)
                self._notify("job", job)
            elif kind == "alloc":
                if rec.value is None:
                    self._set_alloc(name, None)
                else:
                    own = self.written.pop(key, None)
                    self._set_alloc(name, own[1] if (own is not None and own[0] == rec.value
                                                     and isinstance(own[1], HostAlloc))
                                    else decode(HostAlloc, rec.value, limit=MAX_RECORD_BYTES), len(rec.value))
                self._index_host(name)
            elif kind == "hostcfg":
                _keep(self.hostcfg, name, rec.value, HostConfig)
                cfg = self.hostcfg.get(name)
                window = cfg.window() if cfg is not None else None
                if window is not None:
                    self.maintenance[name] = window
                else:
                    self.maintenance.pop(name, None)
                self._relabel(name)
                self._index_host(name)
                self._notify("hostcfg", name)
            elif kind == "queue":
                _keep(self.queues, name, rec.value, Queue)
                self._notify("queue", name)
            elif kind == "qusage":
                _keep(self.queue_past, name, rec.value, QueueUsage)
            elif kind == "advres":
                _keep(self.advance, name, rec.value, AdvanceReservation)
                self.set_aside_work.reservation(name, self.advance.get(name), self.allocs, self.jobs)
                self._notify("advres", name)
            elif kind == "auth" and name.startswith("token."):
                _keep(self.tokens, name[len("token.") :], rec.value, TokenInfo)
            elif kind == "auth" and name.startswith("session."):
                _keep(self.sessions, name[len("session.") :], rec.value, SessionInfo)
            elif key == "term":
                self.term = rec.revision
            elif key == "lease":
                self.leader = (rec.value or b"").decode(errors="replace")
                self.lease_seen_at = time.monotonic()
        except DecodeError as exc:
            self.dropped[kind] += 1
            log.warning("dropped state record %s: %s", key, exc)

    def expect(self, key: str, value: bytes, obj: object) -> None:
        """This process is committing `obj` (encoded as `value`) to `key`: when the watch
        brings those bytes back, take the object instead of decoding them again."""
        self.written[key] = (value, obj)

    def unexpect(self, key: str) -> None:
        """The commit of `key` did not happen (or its outcome is unknown)."""
        self.written.pop(key, None)

    def _forget_deleted(self, now: float) -> None:
        """Forget the revisions of keys deleted DELETED_KEEP_S ago and not written since.
        Found by exploring: every job ever seen kept its key's revision, a leak of the
        order of 100 bytes a job (GBs a day at 500 jobs/s). What a deletion's revision
        guards against, an older record of the key applied after it, comes within moments
        (a commit's own records), not minutes; a NATS submission naming a forgotten job's id
        is refused from history (scheduler._screen_submission)."""
        while self.deleted and self.deleted[0][0] <= now - DELETED_KEEP_S:
            _, key, revision = self.deleted.popleft()
            if self.revisions.get(key) == revision:
                del self.revisions[key]

    def apply_job(self, job: Job, revision: int) -> None:
        self.written.pop(subjects.job_key(job.id), None)
        if revision <= self.revisions.get(subjects.job_key(job.id), 0):
            return
        self.revisions[subjects.job_key(job.id)] = revision
        self._set_job(job)
        self._notify("job", job)

    def apply_alloc(self, alloc: HostAlloc, revision: int) -> None:
        key = subjects.alloc_key(alloc.host_id)
        self.written.pop(key, None)
        if revision <= self.revisions.get(key, 0):
            return
        self.revisions[key] = revision
        self._set_alloc(alloc.host_id, alloc, len(alloc.to_json()))
        self._index_host(alloc.host_id)

    # ------------------------------------------------------------ views

    def health_time(self, now: float | None = None) -> float:
        """The time to judge heartbeats' age at, for the local time `now`: how far they
        have been read (server.health.readclock), the local time until any were."""
        return self.clock.now(time.time() if now is None else now)

    def health(self, host_id: str, now: float | None = None) -> Health:
        entry = self.hosts.get(host_id)
        if entry is None:
            return Health.LOST
        now = self.health_time(now)
        return host_health(
            present=entry.present,
            last_seen=entry.seen_at,
            now=now,
            interval_s=self.heartbeat_interval_s,
        )

    def capacities(self, now: float | None = None) -> dict[str, HostCapacity]:
        """A working copy of every indexed host's capacity as placement sees it at `now`:
        the index's entry (`_index_host`), not schedulable unless the host is HEALTHY then
        (the planner asks the same through its `healthy` check)."""
        now = time.time() if now is None else now
        out: dict[str, HostCapacity] = {}
        for host_id, cap in self.index.caps.items():
            c = cap.copy()
            c.schedulable = cap.schedulable and self.health(host_id, now) is Health.HEALTHY
            out[host_id] = c
        return out

    def refresh_health(self, now: float) -> HealthIndex:
        """The health index brought up to `now` (see server.health.index)."""
        if self._unconfirmed:
            self._expire_unconfirmed(now)
        self.health_index.refresh(self.hosts, self.health_time(now), self.heartbeat_interval_s)
        heard_to = self.clock.heard_to()
        if heard_to is not None:
            overdue = self.health_index.overdue(self.hosts, heard_to, self.heartbeat_interval_s + EXPIRY_TICK_S)
            for key in overdue:
                if key not in self._unconfirmed:  # (those wait for their own window: _expire_unconfirmed)
                    self._expire_overdue(key, heard_to)
            if overdue:
                self.health_index.refresh(self.hosts, self.health_time(now), self.heartbeat_interval_s)
        return self.health_index

    def domain_sizes(self) -> dict[tuple[str, str], int]:
        """Hosts per failure domain (server.scheduling.eviction.host_domains of their labels), every
        host ever heard of counted; recomputed only after a host's labels changed."""
        if self._domain_sizes is None:
            sizes: dict[tuple[str, str], int] = {}
            for e in self.hosts.values():
                if e.heartbeat:
                    for d in host_domains(self.labels_of(e.host_id)):
                        sizes[d] = sizes.get(d, 0) + 1
            self._domain_sizes = sizes
        return self._domain_sizes

    def labels_of(self, host_id: str) -> dict[str, str]:
        """The host's labels as placement and failure domains read them: its agent's of the
        keys it may set, and the operator's (scheduling.hostlabels). Not to be changed."""
        return self.host_labels.get(host_id, _NO_LABELS)

    def _relabel(self, host_id: str) -> None:
        """Make the host's labels again from its last decoded heartbeat's and its settings'
        (either changed), and note a new dispute over a trusted key (its agent reporting
        another value than the operator's): logged here, alerted by the leader
        (`host_labels_disputed`), once each time the disputes change."""
        entry = self.hosts.get(host_id)
        reported = entry.heartbeat.labels if entry is not None and entry.heartbeat is not None else _NO_LABELS
        cfg = self.hostcfg.get(host_id)
        operator = cfg.labels if cfg is not None else _NO_LABELS
        labels = effective_labels(reported, operator, self.label_trust)
        if labels != self.host_labels.get(host_id, _NO_LABELS):
            self._domain_sizes = None
        if labels:
            self.host_labels[host_id] = labels
        else:
            self.host_labels.pop(host_id, None)
        found = disputes(reported, operator, self.label_trust)
        if found == self.label_disputes.get(host_id, ()):
            return
        if not found:
            del self.label_disputes[host_id]
            return
        self.label_disputes[host_id] = found
        log.warning("host %s: its agent reports %s: label keys only operators set; ignored", host_id,
                    ", ".join(d.text() for d in found))
        self._notify("host_labels_disputed", (host_id, found))

    def set_label_trust(self, trust: LabelTrust) -> None:
        """Take `trust` as the label keys only operators set, every host's labels made again."""
        self.label_trust = trust
        for host_id in set(self.hosts) | set(self.hostcfg):
            before = self.host_labels.get(host_id)
            self._relabel(host_id)
            if self.host_labels.get(host_id) != before:
                self._index_host(host_id)

    def job_counts(self) -> Counter[str]:
        return Counter({k: v for k, v in self.job_state_counts.items() if v})

    def queued(self) -> list[Job]:
        return [self.jobs[i] for i in self.backlog.ids()]

    def mark_leaving(self, host_id: str, ts: float) -> None:
        """A status report said the host's agent is shutting down (`StatusReport.shutdown`,
        sent at `ts` by its clock): nothing more is placed there, even before the heartbeat
        saying so is read (the reports' stream is read sooner than the heartbeats' pipe, and
        each try placed there meanwhile would only come back unstarted)."""
        entry = self.hosts.get(host_id)
        if entry is None or not entry.present or entry.heartbeat is None:
            return
        if entry.leaving_reported is None or ts > entry.leaving_reported:
            entry.leaving_reported = ts
            self._index_host(host_id)

    def heard_from(self, host_id: str, instance: str, ts: float) -> None:
        """A status report sent at `ts` (its agent's clock) by agent process `instance`: one
        the host's last decoded heartbeat is not from, and sent after it, is an agent started
        again whose heartbeats have not been read yet (they come through the ingest, reports
        at once). Nothing is placed there until one is: the host may now have other labels,
        GPUs or MIG instances (found by exploring: a job requiring a label was placed on a
        host its agent had just restarted without it)."""
        entry = self.hosts.get(host_id)
        if (not instance or entry is None or not entry.present or entry.heartbeat is None
                or entry.heartbeat.instance == instance):
            return  # (the common case, read without decoding the newest heartbeat)
        last = entry.latest()
        if last is None or not last.instance or last.instance == instance or ts <= last.ts:
            return
        if entry.unheard_agent is None:
            entry.unheard_agent = (instance, ts)
            self._index_host(host_id)

    def idle_gpus(self) -> dict[str, tuple[str, float]]:
        """Running attempts whose agent says their GPUs have all been idle for its
        `--gpu-idle-after`: attempt id -> (host, since when, by the agent's clock). A
        change of the set changes the heartbeat's shape, so the last decoded heartbeat
        has it."""
        out: dict[str, tuple[str, float]] = {}
        for host_id in self.idle_gpu_hosts:
            entry = self.hosts.get(host_id)
            if entry is not None and entry.present and entry.heartbeat is not None:
                for attempt_id, since in entry.heartbeat.gpu_idle.items():
                    out[attempt_id] = (host_id, since)
        return out

    def gpu_idle_since(self, host_id: str, attempt_id: str) -> float | None:
        """Since when the attempt's GPUs have all been idle, as its host's agent says (None:
        they are not, or not for the agent's `--gpu-idle-after` yet)."""
        entry = self.hosts.get(host_id) if host_id in self.idle_gpu_hosts else None
        return entry.heartbeat.gpu_idle.get(attempt_id) if entry is not None and entry.heartbeat else None

    def due_deadlines(self, now: float) -> list[str]:
        """Jobs whose running try reached its time limit by `now`, earliest first."""
        return self.deadlines.due(now)

    def apply_queue_usage(self, rec: QueueUsage, revision: int) -> None:
        key = subjects.qusage_key(rec.name)
        self.written.pop(key, None)
        if revision <= self.revisions.get(key, 0):
            return
        self.revisions[key] = revision
        self.queue_past[rec.name] = rec
