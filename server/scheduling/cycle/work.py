"""What one scheduling cycle works on and hands back: the snapshot seen copy on write
(`Work`), the plan it fills (`Plan`), the cluster-wide queue settings (`QueuePolicy`),
and the few moves every part of a cycle makes on a try: mark it stopping, tell how a
stopped try ended, write its event. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from server.scheduling.backfill import Reservation
from server.scheduling.deadlines import limit_at
from server.scheduling.queues import Resources, job_usage
from server.scheduling.submitlimits import OpenJobs
from server.state.cluster import ClusterState
from wire import subjects
from wire.budgets import STOP_REASON_MAX, clip_start, text_limits
from wire.messages import Attempt, AttemptState, Event, HostAlloc, Job, QueueUsage

# Attempt.stop_kind: what the control plane stopped a try for (stop_attempt): to make room
# for another job, at its time limit, because a GPU it holds faulted, or its job was
# cancelled (also one being stopped for another of these: it ends KILLED, as cancelled).
PREEMPT = "preempt"
TIMEOUT = "timeout"
GPU_FAULT = "gpu-fault"
CANCEL = "cancel"


@dataclass
class Plan:
    jobs: dict[str, Job] = field(default_factory=dict)
    allocs: dict[str, HostAlloc] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    placed: int = 0
    # Reports that carried nothing new (already applied, unknown attempt, stale).
    ignored: int = 0
    # Work on lost hosts: replaced now / waiting for the pacing budget / kept because
    # nothing else could take it / kept because the job asked to wait (KEEP_RUNNING).
    evicted: int = 0
    paced: int = 0
    # How many of the given reports and commands this cycle used (the rest wait: one
    # commit holds at most `max_keys` records).
    reports_used: int = 0
    commands_used: int = 0
    submissions_used: int = 0
    # Positions, within the used ones, of inputs held back because they touch records an
    # earlier cycle's commit (still in flight) writes: they wait for a later cycle.
    deferred_reports: list[int] = field(default_factory=list)
    deferred_commands: list[int] = field(default_factory=list)
    deferred_submissions: list[int] = field(default_factory=list)
    accepted: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (job id, why)
    held_no_capacity: int = 0
    held_keep_running: int = 0
    # Hosts with work but no record in the hosts bucket, still in their grace period.
    held_unheard: int = 0
    # Hosts whose key expired after the last status report read: their work waits until
    # the status stream has been read up to the expiry (`evict_lost`).
    held_for_reports: int = 0
    disrupted: dict[tuple[str, str], int] = field(default_factory=dict)
    # Queues' decayed past use brought up to date (written every USAGE_EVERY_S).
    usage: dict[str, QueueUsage] = field(default_factory=dict)
    # Victims this cycle stopped, by kind of preemption and preempting queue; attempts
    # stopped at their time limit.
    preempted: dict[tuple[str, str], int] = field(default_factory=dict)
    # GPU-seconds of work lost by the tries that ended preempted, by the victim's queue
    # and whether its job checkpoints (queues.preemption_loss).
    preemption_lost: dict[tuple[str, bool], float] = field(default_factory=dict)
    # What the stops this cycle started will cost, by the victims' cost (preemption.Victim.cost:
    # runtime x GPUs, the grace for a job that checkpoints), GPU-seconds.
    preemption_cost: float = 0.0
    timed_out: int = 0
    gpu_fault_stops: int = 0  # tries stopped because a GPU they hold faulted
    limited: dict[str, int] = field(default_factory=dict)  # per queue, submissions its limits refused
    # The hosts this cycle held for waiting jobs (disjoint sets), and when each could
    # start there, first made first.
    reservations: list[Reservation] = field(default_factory=list)

    @property
    def keys(self) -> int:
        return len(self.jobs) + len(self.allocs) + len(self.usage)


@dataclass(frozen=True)
class QueuePolicy:
    """Cluster-wide settings of queue admission (server.scheduling.fairshare, preemption)."""

    half_life_s: float = 3600.0  # of the decay of queues' past use; 0: only current use counts
    usage_every_s: float = 10.0  # how often the leader writes the decayed use
    preemptions_per_cycle: int = 16  # victim jobs one cycle may stop, all queues together
    # The shortcuts over a long queue (a borrow floor, queues left once each of their
    # jobs is known refused) change how much a cycle looks at, never what it decides;
    # off, it looks at every job (tests/unit/test_planner_backlog.py compares the two).
    shortcuts: bool = True
    # Reservations (scheduling.backfill): a job that has waited this long without finding
    # room holds the hosts where it could start soonest (up to `reserve_jobs` jobs, the
    # first in admission order that found none, on disjoint hosts); a job whose time limit
    # ends it before the start of every reservation whose hosts it would use may still use
    # them (backfill). A reservation whose start is unknown (a task there has no time
    # limit) is made only until the job has waited reserve_after_s + reserve_max_s, so
    # that it does not keep hosts idle for ever.
    reserve_after_s: float = 10.0
    reserve_max_s: float = 600.0
    reserve_jobs: int = 4


class KeyInFlight(Exception):
    """A cycle tried to change a record that an earlier, still uncommitted cycle writes.
    The checks below keep this from happening; if it does, the scheduler waits for the
    commits in flight and plans again."""


class Work:
    """Copy-on-write access to the snapshot for one cycle.

    `frozen_jobs` and `frozen_hosts` are the job and allocation records that earlier
    cycles, not yet committed, write: this cycle leaves them alone (their revisions and
    contents are not known yet), so pipelined commits never touch the same key."""

    def __init__(self, state: ClusterState, plan: Plan, frozen_jobs: frozenset[str] | set[str] = frozenset(),
                 frozen_hosts: frozenset[str] | set[str] = frozenset(),
                 pending: Mapping[str, Job] | None = None,
                 pending_held: Mapping[str, Resources] | None = None) -> None:
        self.state = state
        self.plan = plan
        self.frozen_jobs = frozen_jobs
        self.frozen_hosts = frozen_hosts
        # The job records those cycles write (the latest of each): what they place counts
        # against queue quotas and per-user limits now, before it is stored.
        self.pending: Mapping[str, Job] = pending or {}
        # What each of those records holds (queues.job_usage), where known.
        self.pending_held: Mapping[str, Resources] = pending_held or {}
        # GPUs this cycle's reports say faulted under a task (the host's heartbeat may not
        # say so yet): none of this cycle's placements uses them.
        self.faulted: dict[str, set[int]] = {}
        # What the commits in flight and this cycle change in the jobs not ended, worked
        # out when a submission to a queue with submission limits first needs it.
        self.open_changes: OpenJobs | None = None

    def replaced(self) -> Iterator[tuple[Job | None, Job]]:
        """Each job a commit in flight or this cycle (so far) changes: the state's record
        (None: a job it creates) and the record in its place, this cycle's over the
        commit's. What the state's tallies (kept as records arrive) are corrected by."""
        for job_id in {*self.pending, *self.plan.jobs}:
            yield self.state.jobs.get(job_id), self.plan.jobs.get(job_id) or self.pending[job_id]

    def held_changes(self) -> Iterator[tuple[str | None, Resources, str, Resources]]:
        """`replaced` as what each record holds (queues.job_usage): the state's record's
        queue and holding (None, {}: none), and the new one's. The state's are kept as
        records arrive, the commits' in flight worked out once a commit."""
        held = self.state.held
        for old, new in self.replaced():
            known = None if new.id in self.plan.jobs else self.pending_held.get(new.id)
            yield ((None if old is None else old.spec.queue), held.get(new.id, {}), new.spec.queue,
                   job_usage(new) if known is None else known)

    def busy(self, job_id: str, host_ids: tuple[str, ...] = ()) -> bool:
        """Would work on this job (and these hosts) touch a record in flight? Counts
        every host of the job's current try (a gang task's end touches the others)."""
        if job_id in self.frozen_jobs:
            return True
        frozen = self.frozen_hosts
        if not frozen:
            return False
        if any(h in frozen for h in host_ids):
            return True
        job = self.plan.jobs.get(job_id) or self.state.jobs.get(job_id)
        return job is not None and any(t.host_id in frozen for t in job.current_tasks())

    def job(self, job_id: str) -> Job | None:
        if job_id in self.plan.jobs:
            return self.plan.jobs[job_id]
        if job_id in self.frozen_jobs:
            raise KeyInFlight(subjects.job_key(job_id))
        job = self.state.jobs.get(job_id)
        if job is None:
            return None
        # Copy what a cycle changes (the job and its attempts); the spec is never
        # modified here and stays shared. Much cheaper than a deep copy.
        job = job.model_copy(update={"attempts": [a.model_copy() for a in job.attempts]})
        self.plan.jobs[job_id] = job
        return job

    def latest(self, job_id: str) -> Job | None:
        """A job's newest record, read only: this cycle's, else the one a commit in flight
        writes, else the stored one."""
        return self.plan.jobs.get(job_id) or self.pending.get(job_id) or self.state.jobs.get(job_id)

    def alloc(self, host_id: str) -> HostAlloc:
        if host_id in self.plan.allocs:
            return self.plan.allocs[host_id]
        if host_id in self.frozen_hosts:
            raise KeyInFlight(subjects.alloc_key(host_id))
        cur = self.state.allocs.get(host_id)
        # The task list is this cycle's own; the tasks are shared with the snapshot and
        # replaced, never changed (`stop_tasks`).
        alloc = cur.model_copy(update={"tasks": list(cur.tasks)}) if cur else HostAlloc(host_id=host_id)
        self.plan.allocs[host_id] = alloc
        return alloc


def stop_tasks(alloc: HostAlloc, attempt_ids: set[str] | None, reason: str = "",
                grace_s: float | None = None) -> None:
    """Mark tasks (all when `attempt_ids` is None) to be stopped by their agent, with a
    reason and (when given) the grace between SIGTERM and SIGKILL."""
    update: dict[str, object] = {"stop": True}
    if reason:
        update["stop_reason"] = clip_start(reason, STOP_REASON_MAX)
    if grace_s is not None:
        update["grace_s"] = grace_s
    alloc.tasks = [t.model_copy(update=update) if not t.stop and (attempt_ids is None or t.attempt_id
                                                                  in attempt_ids) else t
                   for t in alloc.tasks]


def stop_attempt(w: Work, t: Attempt, kind: str, why: str, now: float, grace_s: float | None = None) -> None:
    """Mark a live task of a try stopping for `kind` (its agent's KILLED report then ends it
    as `ended_as` says), with `why` as its reason, and tell its agent (SIGTERM, the grace,
    SIGKILL)."""
    t.stop_kind, t.stop_at, t.reason = kind, now, why
    stop_tasks(w.alloc(t.host_id), {t.id}, why, grace_s)


def limit_came_first(job: Job, a: Attempt, at: float) -> None:
    """A task of a try being preempted that ends at `at`, its try's time limit past by
    then, was still running at its limit: its limit ended it, not the preemption (which
    would requeue it to run again with a fresh limit). It is marked stopped for its time
    limit (`TIMEOUT`), its reason saying so, so that it ends TIMEOUT (`ended_as`)."""
    if a.stop_kind != PREEMPT:
        return
    limit = limit_at([t for t in job.attempts if t.number == a.number])
    if limit is not None and at >= limit:
        a.stop_kind = TIMEOUT
        a.reason = clip_start(f"time limit of {a.time_limit_s:g} s reached while being stopped: {a.reason}",
                              text_limits(job.spec)[1])


def ended_as(a: Attempt, ended: AttemptState) -> AttemptState:
    """How an attempt the control plane stopped ended: an attempt stopped (KILLED) or
    lost while being preempted ends PREEMPTED, at its time limit TIMEOUT."""
    if ended in (AttemptState.KILLED, AttemptState.LOST):
        if a.stop_kind == PREEMPT:
            return AttemptState.PREEMPTED
        if a.stop_kind == TIMEOUT:
            return AttemptState.TIMEOUT
    return ended


def attempt_of(job: Job, attempt_id: str) -> Attempt | None:
    for a in job.attempts:
        if a.id == attempt_id:
            return a
    return None


def job_event(kind: str, job: Job, attempt: Attempt | None, now: float, message: str = "") -> Event:
    return Event(
        kind=kind,
        ts=now,
        job_id=job.id,
        host_id=attempt.host_id if attempt else None,
        attempt_id=attempt.id if attempt else None,
        message=message,
        data={"state": job.state.value},
    )


def gpu_fault(state: ClusterState, host_id: str, gpu_indices: Sequence[int], mig: Sequence[str]) -> str:
    """What faulted among the GPUs a task holds on `host_id`, as its host's heartbeat
    says; "" when none did."""
    bad = state.faulted_gpus.get(host_id)
    if not bad:
        return ""
    entry = state.hosts.get(host_id)
    hb = entry.heartbeat if entry is not None else None
    hit = sorted(state.task_gpus(host_id, gpu_indices, mig) & bad)
    if not hit:
        return ""
    faults = {u.index: u.fault for u in hb.gpu_usage} if hb is not None else {}
    return "; ".join(f"GPU {i} faulted ({faults.get(i) or 'unhealthy'})" for i in hit)
