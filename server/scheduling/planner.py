"""One scheduling cycle's decisions, as a pure function of a snapshot, inputs and a clock.

`plan_cycle()` folds agent status reports and operator commands into the job and
allocation records, then places queued jobs, and returns the changed records and the
events to publish. The scheduler commits the result atomically; nothing here does I/O.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from server.health.rules import Health
from server.scheduling import advance, fairshare, groups, maintenance, preemption, retry, submitlimits, userfair
from server.scheduling.backfill import Reservation, ends_by_host, kept_off, soonest_hosts
from server.scheduling.capacity import Placer
from server.scheduling.dependencies import kind as dependency_kind
from server.scheduling.dependencies import waits
from server.scheduling.eviction import EvictionBudget, HostLoss, disrupted_domains, host_domains
from server.scheduling.livecounts import LiveCounts, queue_user
from server.scheduling.placement import Choice
from server.scheduling.placement import check as placement_check
from server.scheduling.queues import (
    COHORT_EXHAUSTED,
    CPU,
    EPS,
    MEMORY,
    OVER_QUOTA,
    QueueBook,
    Refusal,
    Resources,
    add,
    add_user,
    effective_time_limit,
    gpu_key,
    job_demand,
    job_gpus,
    job_size,
    job_usage,
    label_conflict,
    nominal,
    placement_spec,
    queue_label_refusal,
    task_demand,
)
from server.scheduling.setasidework import others_work
from server.scheduling.submitlimits import OpenJobs
from server.state.cluster import ClusterState
from wire import subjects
from wire.budgets import (
    CANCEL_REASON_MAX,
    HOLD_REASON_MAX,
    MAX_PREEMPTING,
    STOP_REASON_MAX,
    clip_end,
    clip_start,
    compact_older,
    text_limits,
    tries_bound,
)
from wire.messages import (
    JOB_ID_PATTERN,
    RESERVED_HOSTS_KEPT,
    AdvanceReservation,
    Attempt,
    AttemptState,
    Command,
    Event,
    HostAlloc,
    Job,
    JobSpec,
    JobState,
    Queue,
    QueueUsage,
    Reserved,
    StatusReport,
    SubmitRequest,
    Task,
    max_counts,
)
from wire.validation import validate_job

JOB_ID_RE = re.compile(JOB_ID_PATTERN)
# Attempt.stop_kind: what the control plane stopped a try for (_stop_attempt): to make room
# for another job, at its time limit, or because a GPU it holds faulted.
PREEMPT = "preempt"
TIMEOUT = "timeout"
GPU_FAULT = "gpu-fault"
# And the disruptions, which retry does not count: a drain, the agent's shutdown.
DRAIN, SHUTDOWN, REQUEUE, DISRUPTIONS = retry.DRAIN, retry.SHUTDOWN, retry.REQUEUE, retry.DISRUPTIONS


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


class _Work:
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
        # replaced, never changed (`_stop_tasks`).
        alloc = cur.model_copy(update={"tasks": list(cur.tasks)}) if cur else HostAlloc(host_id=host_id)
        self.plan.allocs[host_id] = alloc
        return alloc


def _stop_tasks(alloc: HostAlloc, attempt_ids: set[str] | None, reason: str = "",
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


def _stop_attempt(w: _Work, t: Attempt, kind: str, why: str, now: float, grace_s: float | None = None) -> None:
    """Mark a live task of a try stopping for `kind` (its agent's KILLED report then ends it
    as `_ended_as` says), with `why` as its reason, and tell its agent (SIGTERM, the grace,
    SIGKILL)."""
    t.stop_kind, t.stop_at, t.reason = kind, now, why
    _stop_tasks(w.alloc(t.host_id), {t.id}, why, grace_s)


def _ended_as(a: Attempt, ended: AttemptState) -> AttemptState:
    """How an attempt the control plane stopped ended: an attempt stopped (KILLED) or
    lost while being preempted ends PREEMPTED, at its time limit TIMEOUT."""
    if ended in (AttemptState.KILLED, AttemptState.LOST):
        if a.stop_kind == PREEMPT:
            return AttemptState.PREEMPTED
        if a.stop_kind == TIMEOUT:
            return AttemptState.TIMEOUT
    return ended


def _attempt(job: Job, attempt_id: str) -> Attempt | None:
    for a in job.attempts:
        if a.id == attempt_id:
            return a
    return None


def _event(kind: str, job: Job, attempt: Attempt | None, now: float, message: str = "") -> Event:
    return Event(
        kind=kind,
        ts=now,
        job_id=job.id,
        host_id=attempt.host_id if attempt else None,
        attempt_id=attempt.id if attempt else None,
        message=message,
        data={"state": job.state.value},
    )


def apply_report(w: _Work, r: StatusReport, now: float) -> None:
    job = w.plan.jobs.get(r.job_id) or w.state.jobs.get(r.job_id)
    if job is None:
        w.plan.ignored += 1
        return
    cur = _attempt(job, r.attempt_id)
    if cur is None or cur.host_id != r.host_id or cur.state.terminal:
        w.plan.ignored += 1
        return
    if r.state is AttemptState.RUNNING and cur.state is AttemptState.RUNNING:
        w.plan.ignored += 1
        return
    job = w.job(r.job_id)
    assert job is not None
    a = _attempt(job, r.attempt_id)
    assert a is not None
    if r.state is AttemptState.RUNNING:
        a.state = AttemptState.RUNNING
        a.started_at = r.ts
        if job.state is JobState.PLACED:
            job.state = JobState.RUNNING
        job.updated_at = now
        w.plan.events.append(_event("job.running", job, a, now))
        return
    if not r.state.terminal:
        w.plan.ignored += 1
        return
    if r.shutdown and r.state is AttemptState.KILLED and not a.stop_kind:
        a.stop_kind, a.stop_at = SHUTDOWN, now  # stopped by its agent's orderly shutdown
    ended = _ended_as(a, r.state)
    # A task that failed on a GPU that faulted under it (its agent saw the fault, or its
    # host's heartbeat shows it) failed through no fault of its own code: it ends KILLED,
    # which the retry policy counts as the infrastructure's failure.
    fault = (r.gpu_fault or gpu_fault(w.state, r.host_id, a.gpu_indices, a.mig)) \
        if ended is AttemptState.FAILED else ""
    if fault:
        ended = AttemptState.KILLED
        if r.gpu_fault:
            w.faulted.setdefault(r.host_id, set()).update(w.state.task_gpus(r.host_id, a.gpu_indices, a.mig))
    a.state = ended
    a.finished_at = r.ts
    a.exit_code = r.exit_code
    # Text from the job's own process, clipped to the share of the job record's budget
    # an attempt may take (bytes as encoded: wire.budgets).
    tail_limit, reason_limit = text_limits(job.spec)
    a.output_tail = clip_end(r.output_tail, tail_limit)
    if fault:
        a.reason = clip_start(f"{fault}; the task exited with code {r.exit_code}", reason_limit)
    elif not a.stop_kind or not a.reason:
        a.reason = clip_start(r.reason, reason_limit)
    if a.started_at is None:
        a.started_at = r.ts
    alloc = w.alloc(r.host_id)
    alloc.tasks = [t for t in alloc.tasks if t.attempt_id != r.attempt_id]
    job.updated_at = now
    if ended is AttemptState.FAILED:  # the agent's reason (spawn failed, oom-killed, ...) with the code
        why = f"exit code {r.exit_code}" + (f" ({a.reason})" if a.reason else "")
    else:
        why = a.reason or r.reason
    _after_attempt_end(w, job, a, ended, now, why)


def _after_attempt_end(w: _Work, job: Job, a: Attempt, ended: AttemptState, now: float, why: str) -> None:
    """Decide what an ended attempt means for its job. A gang finishes only when every
    task of the try succeeded; one failure stops the others, and the gang is retried
    (or failed) as one once none of its tasks is live any more."""
    if job.state.terminal:  # cancelled meanwhile: the attempt has now stopped
        w.plan.events.append(_event("attempt.stopped", job, a, now))
        return
    tasks = job.current_tasks() if a.number == job.tries else [a]
    live = [t for t in tasks if not t.state.terminal]
    if ended is AttemptState.SUCCEEDED:
        if not live and all(t.state is AttemptState.SUCCEEDED for t in tasks):
            job.state = JobState.SUCCEEDED
            w.plan.events.append(_event("job.succeeded", job, a, now))
        return
    if live and (ended in (AttemptState.PREEMPTED, AttemptState.TIMEOUT)
                 or ended is AttemptState.KILLED and a.stop_kind == GPU_FAULT):
        return  # the others were told to stop with it: the decision waits for them
    if live:
        # One gang task failed: stop the rest; the decision waits until they are gone.
        for t in live:
            t.reason = t.reason or f"gang task {a.task} ended {ended.value}"
            if a.stop_kind in DISRUPTIONS and not t.stop_kind:
                t.stop_kind, t.stop_at = a.stop_kind, now  # the gang's try ends by the same disruption
            _stop_tasks(w.alloc(t.host_id), {t.id}, t.reason)
        w.plan.events.append(_event("gang.stopping", job, a, now, f"task {a.task} {ended.value.lower()}"))
        return
    # The try is over. A gang retries only for infrastructure reasons if every task
    # that did not succeed ended that way; any FAILED task makes it a FAILED try.
    worst = AttemptState.FAILED if any(t.state is AttemptState.FAILED for t in tasks) else ended
    if any(t.state is AttemptState.TIMEOUT for t in tasks) and worst is not AttemptState.FAILED:
        worst = AttemptState.TIMEOUT
    elif worst is not AttemptState.FAILED and any(t.state is AttemptState.PREEMPTED for t in tasks):
        worst = AttemptState.PREEMPTED
    decision = retry.decide(job, worst, now)
    if worst is AttemptState.PREEMPTED or decision.retry:
        # It goes back to the queue: older tries keep less text, and a record that holds
        # no more tries (wire.budgets.tries_bound) ends the job rather than outgrow what
        # the store takes.
        compact_older(job)
        if job.tries >= tries_bound(job.spec):
            job.state = JobState.FAILED
            job.end_reason = (f"tried {job.tries} times (preempted, drained or requeued beyond its "
                              f"{job.spec.max_attempts} attempts): its record holds no more tries; submit it again")
            w.plan.events.append(_event("job.failed", job, a, now, job.end_reason))
            return
    if worst is AttemptState.TIMEOUT and not decision.retry:
        job.state = JobState.TIMEOUT
        job.end_reason = job.end_reason or f"time limit of {a.time_limit_s:g} s reached"
        w.plan.events.append(_event("job.timeout", job, a, now, job.end_reason))
        return
    if worst is AttemptState.PREEMPTED:
        job.state = JobState.QUEUED
        job.not_before = decision.not_before
        w.plan.events.append(_event("job.preempted", job, a, now, a.reason or "preempted"))
        return
    if decision.retry:
        job.state = JobState.QUEUED
        job.not_before = decision.not_before
        w.plan.events.append(_event("job.requeued", job, a, now, f"{why}; {decision.why}" if why else decision.why))
    else:
        job.state = JobState.FAILED
        if worst is not AttemptState.FAILED:
            said = decision.why
        elif job.spec.retry_failures:
            said = f"{why}; {decision.why}"  # how many of its retries it used
        else:
            said = why
        w.plan.events.append(_event("job.failed", job, a, now, said))


def apply_cancel(w: _Work, c: Command, now: float) -> None:
    job = w.plan.jobs.get(c.job_id) or w.state.jobs.get(c.job_id)
    if job is None or job.state.terminal:
        w.plan.ignored += 1
        return
    job = w.job(c.job_id)
    assert job is not None
    job.state = JobState.CANCELLED
    job.hold = ""  # a held job cancelled is no longer waiting for a release
    job.cancel_reason = clip_start(c.reason, CANCEL_REASON_MAX) or f"cancelled by {c.by or 'operator'}"
    job.updated_at = now
    a = job.current
    for live in [t for t in job.current_tasks() if not t.state.terminal]:
        # The task keeps its allocation, marked to stop, until the agent reports the
        # process gone (SIGTERM, grace, SIGKILL): freed capacity is really free.
        live.reason = clip_start(job.cancel_reason, text_limits(job.spec)[1])
        _stop_tasks(w.alloc(live.host_id), {live.id}, live.reason)
    w.plan.events.append(_event("job.cancelled", job, a, now, job.cancel_reason))


def apply_update(w: _Work, c: Command, now: float) -> None:
    """An operator's change to a job that has not ended: its priority (which moves it in
    its queue's order, and decides it as a preemption victim), and a hold or release. Only
    a QUEUED job that is not taking GPUs by preemption can be held; a release always
    applies. What cannot apply is left as it is."""
    job = w.plan.jobs.get(c.job_id) or w.state.jobs.get(c.job_id)
    if job is None or job.state.terminal:
        w.plan.ignored += 1
        return
    priority = c.priority if c.priority is not None and c.priority != job.spec.priority else None
    hold = c.hold is True and not job.hold and job.state is JobState.QUEUED and not job.preempting
    release = c.hold is False and bool(job.hold)
    if priority is None and not hold and not release:
        w.plan.ignored += 1
        return
    job = w.job(c.job_id)
    assert job is not None
    done: list[str] = []
    if priority is not None:
        done.append(f"priority {job.spec.priority} -> {priority}")
        job.spec = job.spec.model_copy(update={"priority": priority})  # the spec is shared: a new one
    if hold:
        job.hold = hold_text(c.by, c.reason)
        done.append(job.hold)
    if release:
        job.hold = ""
        done.append(f"released by {c.by or 'operator'}")
    job.updated_at = now
    w.plan.events.append(_event("job.updated", job, job.current, now, "; ".join(done)))


def apply_requeue(w: _Work, c: Command, now: float) -> None:
    """An operator's requeue: the live tasks of a placed or running job's try are stopped
    (SIGTERM, the grace, SIGKILL) as an orderly disruption (retry.REQUEUE: not counted
    against maxAttempts), and once they are gone the job is queued again at its old place,
    held if asked. A job already stopping, queued or ended is left as it is."""
    job = w.plan.jobs.get(c.job_id) or w.state.jobs.get(c.job_id)
    if job is None or job.state not in (JobState.PLACED, JobState.RUNNING):
        w.plan.ignored += 1
        return
    live = [t for t in job.current_tasks() if not t.state.terminal]
    if not live or any(t.stop_kind for t in live):
        w.plan.ignored += 1
        return
    job = w.job(c.job_id)
    assert job is not None
    why = f"requeued by {c.by or 'operator'}" + (f": {c.reason}" if c.reason else "")
    for t in [t for t in job.current_tasks() if not t.state.terminal]:
        _stop_attempt(w, t, REQUEUE, clip_start(why, text_limits(job.spec)[1]), now)
    if c.hold:
        job.hold = hold_text(c.by, c.reason)
    job.updated_at = now
    w.plan.events.append(_event("job.updated", job, job.current, now, why + ("; held" if c.hold else "")))


def _end_attempt(w: _Work, job_id: str, attempt_id: str, ended: AttemptState, reason: str, now: float) -> None:
    """An attempt ended without a report from its agent (host lost): record it, and
    requeue the job or fail it according to the retry policy."""
    job = w.job(job_id)
    if job is None:
        return
    a = _attempt(job, attempt_id)
    if a is None or a.state.terminal:
        return
    ended = _ended_as(a, ended)
    a.state = ended
    a.finished_at = now
    a.reason = a.reason if a.stop_kind and a.reason else reason
    job.updated_at = now
    _after_attempt_end(w, job, a, ended, now, reason)


def evict_lost(
    w: _Work,
    feasible: Placer,
    now: float,
    budget: EvictionBudget,
    max_keys: int,
    unheard_since: Mapping[str, float] | None = None,
    unheard_grace_s: float = 0.0,
    reports_read_to: float | None = None,
) -> None:
    """Replace work on hosts whose heartbeat key expired, within the pacing budgets,
    never evicting work that has nowhere to go.

    A host whose key expired after `reports_read_to` (the store's time up to which every
    status report has been handed to a cycle; None: not known, no wait) keeps its work
    until the reports have been read that far: a report its agent had stored before the
    key expired (a task that finished, or that its agent stopped when it fenced itself)
    says how the attempt ended, and replacing the work first would run a finished task
    again. That happens when the status stream or its consumer is re-electing a leader
    while the hosts stream already has one again.

    A host with work but no record in the hosts bucket at all (`unheard`: its key
    expired and its expiry marker is gone, or the bucket itself was lost, as when a
    whole NATS cluster restarts with the bucket in memory) is replaced only once it has
    been unheard for `unheard_grace_s` since `unheard_since[host]` (when the scheduler
    first saw it so): a live agent heartbeats again within an interval, and an agent
    that cannot has fenced itself well within that time."""
    state = w.state
    lost: list[tuple[str, float]] = []
    # Hosts whose key expired, and hosts with work but no record at all: sets kept as
    # records arrive, not a walk over every host.
    for host_id in state.absent:
        alloc = state.allocs.get(host_id)
        if alloc is None or not alloc.tasks:
            continue
        gone = state.hosts.get(host_id)
        lost_at = (gone.lost_at or 0.0) if gone is not None else 0.0
        if reports_read_to is not None and lost_at > reports_read_to:
            w.plan.held_for_reports += 1
            continue
        lost.append((host_id, lost_at))
    for host_id in state.unheard:
        alloc = state.allocs.get(host_id)
        if host_id in state.hosts or alloc is None or not alloc.tasks:
            continue
        since = (unheard_since or {}).get(host_id, now)
        if now - since < unheard_grace_s:
            w.plan.held_unheard += 1
            continue
        lost.append((host_id, since))
    if not lost:
        return
    absent = [state.hosts[h] for h in state.absent]
    losses = [HostLoss(e.host_id, dict(e.heartbeat.labels) if e.heartbeat else {}, e.lost_at or 0.0)
              for e in absent]
    disrupted = disrupted_domains(losses, state.domain_sizes(), now, budget.config)
    w.plan.disrupted = disrupted
    # `feasible` is where evicted work could go: its own reservations, made as work is
    # evicted, so no more is evicted than the rest of the cluster can take.
    for host_id, lost_at in sorted(lost, key=lambda x: (x[1], x[0])):
        if host_id in w.frozen_hosts:
            continue  # an earlier cycle's commit is changing it: next cycle
        entry = state.hosts.get(host_id)
        domains = host_domains(entry.heartbeat.labels) if entry and entry.heartbeat else []
        # As this cycle left them: a report it applied may have ended a task already.
        for task in list((w.plan.allocs.get(host_id) or state.allocs[host_id]).tasks):
            if w.plan.keys >= max_keys - 2:
                return
            if w.busy(task.job_id):
                continue
            job = w.plan.jobs.get(task.job_id) or state.jobs.get(task.job_id)
            a = _attempt(job, task.attempt_id) if job else None
            if job is None or a is None or a.state.terminal or task.stop:
                # Nothing left to replace (finished, cancelled or unknown): free the slot.
                alloc = w.alloc(host_id)
                alloc.tasks = [t for t in alloc.tasks if t.attempt_id != task.attempt_id]
                if job is not None and a is not None and not a.state.terminal:
                    _end_attempt(w, job.id, a.id, AttemptState.KILLED, "host lost while stopping", now)
                continue
            if job.spec.on_disconnect == "KEEP_RUNNING" and now - lost_at < job.spec.replace_after_s:
                w.plan.held_keep_running += 1
                continue
            spec = placement_spec(job.spec, state.queues.get(job.spec.queue))
            target = feasible.place(spec) if spec is not None else None  # None: its labels and its queue's conflict
            if spec is None or target is None:
                w.plan.held_no_capacity += 1
                continue
            if not budget.allow(domains, disrupted, now):
                w.plan.paced += 1
                continue
            feasible.reserve(target, spec)
            alloc = w.alloc(host_id)
            alloc.tasks = [t for t in alloc.tasks if t.attempt_id != task.attempt_id]
            _end_attempt(w, job.id, a.id, AttemptState.LOST, f"host {host_id} lost", now)
            w.plan.evicted += 1


def _placed(placer: Placer, spec: JobSpec) -> list[Choice] | None:
    """Hosts for every task of `spec` (a gang's all at once), or None."""
    if spec.replicas > 1:
        return placer.place_gang(spec)
    choice = placer.place(spec)
    return [choice] if choice is not None else None


def drain_due(w: _Work, now: float, max_keys: int) -> None:
    """Stop what still runs on draining hosts whose deadline has passed. Each try stopped
    is marked a drain's (retry.DRAIN): it is not counted against its job's maxAttempts.
    A job whose record is in flight, or that would not fit this cycle's commit, is left
    for a later cycle (its host's other tasks are stopped now)."""
    for host_id, cfg in w.state.hostcfg.items():
        if not cfg.draining or now < cfg.drain_deadline or host_id in w.frozen_hosts:
            continue
        _stop_host_work(w, host_id, f"host {host_id} drained" + (f": {cfg.reason}" if cfg.reason else ""), now,
                        max_keys)


def stop_set_aside(w: _Work, now: float, max_keys: int) -> None:
    """Stop others' work on hosts an advance reservation has set aside from its start
    (scheduling.advance): only work placed before the reservation was made can be there.
    As a drain's (retry.DRAIN), not counted against maxAttempts."""
    if not w.state.advance:
        return
    for r in w.state.advance.values():
        if not advance.active(r, now):
            continue
        # The hosts where others' work may run (the cluster state keeps them as records
        # arrive: scheduling.setasidework), each checked here.
        for host_id in sorted(w.state.set_aside_work.hosts(r.name)):
            _stop_others(w, r, host_id, now, max_keys)


def _stop_others(w: _Work, r: AdvanceReservation, host_id: str, now: float, max_keys: int) -> None:
    """Stop the work on `host_id` of the jobs reservation `r` does not admit, if any."""
    cur = w.state.allocs.get(host_id)
    if cur is None or host_id in w.frozen_hosts:
        return

    def other(job: Job | None) -> bool:
        return job is None or not advance.admits(r, job.spec.queue, job.spec.user)

    if others_work(r, cur, lambda job_id: w.plan.jobs.get(job_id) or w.state.jobs.get(job_id)):
        _stop_host_work(w, host_id, f"host {host_id} set aside for {advance.whom(r)} by advance reservation "
                                    f"{r.name}", now, max_keys, other)


def _stop_host_work(w: _Work, host_id: str, why: str, now: float, max_keys: int,
                    only: Callable[[Job | None], bool] | None = None) -> None:
    """Stop the tasks on a host (those of the jobs `only` picks: a job record, None for one
    not known), each try as a drain's. A job whose record is in flight, or that would not
    fit this cycle's commit, is left for a later cycle (the host's other tasks are stopped
    now)."""
    cur = w.state.allocs.get(host_id)
    if cur is None or all(t.stop for t in cur.tasks):
        return
    picked = {t.attempt_id for t in cur.tasks
              if only is None or only(w.plan.jobs.get(t.job_id) or w.state.jobs.get(t.job_id))}
    later: set[str] = set()
    for entry in cur.tasks:
        if entry.stop or entry.attempt_id not in picked:
            continue
        snap = w.plan.jobs.get(entry.job_id) or w.state.jobs.get(entry.job_id)
        if snap is None or snap.state.terminal:
            continue
        live = [t for t in snap.current_tasks() if t.id == entry.attempt_id and not t.state.terminal]
        if not live or live[0].stop_kind:
            continue
        if w.busy(entry.job_id) or (entry.job_id not in w.plan.jobs and w.plan.keys + 2 > max_keys):
            later.add(entry.attempt_id)
            continue
        job = w.job(entry.job_id)
        assert job is not None
        a = _attempt(job, entry.attempt_id)
        assert a is not None
        _stop_attempt(w, a, DRAIN, clip_start(why, text_limits(job.spec)[1]), now)
        job.updated_at = now
    if later or only is not None:
        _stop_tasks(w.alloc(host_id), picked - later, why)
    else:
        _stop_tasks(w.alloc(host_id), None, why)


def pass_gpu_clears(w: _Work) -> None:
    """Copy operators' clears of a host's GPU fault marks (`HostConfig.gpu_clears`, a
    count per GPU) into the host's assignment, where its agent reads them."""
    for host_id, cfg in w.state.hostcfg.items():
        if not cfg.gpu_clears or host_id in w.frozen_hosts:
            continue
        cur = w.state.allocs.get(host_id)
        have = cur.gpu_clears if cur is not None else {}
        merged = max_counts(have, cfg.gpu_clears)
        if merged != have:
            w.alloc(host_id).gpu_clears = merged


def apply_submission(w: _Work, req: SubmitRequest, known_models: set[str], now: float) -> None:
    """Jobs submitted over NATS become QUEUED job records in this cycle's commit (and may
    be placed in the same commit). A job id that exists already is a retried publish."""
    for data in req.jobs:
        job_id = data.get("id")
        if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
            w.plan.rejected.append((str(job_id)[:64], "id: 8-64 letters, digits, '_' or '-'"))
            continue
        if job_id in w.state.jobs or job_id in w.plan.jobs or subjects.job_key(job_id) in w.state.revisions:
            continue
        if job_id in w.frozen_jobs:
            raise KeyInFlight(subjects.job_key(job_id))  # plan_cycle holds such submissions back
        fields = {k: v for k, v in data.items() if k not in ("id", "user", "held")}
        fields["user"] = req.user
        spec, errors = validate_job(fields, known_models)
        if spec is None:
            w.plan.rejected.append((job_id, "; ".join(str(e) for e in errors)))
            continue
        refused = queue_label_refusal(spec, w.state.queues.get(spec.queue))
        if refused is not None:
            w.plan.rejected.append((job_id, str(refused)))
            continue
        submitted = req.ts if 0 < req.ts <= now else now
        hold = hold_text(req.user, at_submission=True) if data.get("held") is True else ""
        job = Job(id=job_id, spec=spec, submitted_at=submitted, updated_at=now, hold=hold, not_before=spec.begin_at)
        job.waiting_for, never = dependency_state(w, job, spec.depends_on)
        if never:
            w.plan.rejected.append((job_id, f"dependsOn: {never}"))
            continue
        limit = submission_refusal(w, spec)
        if limit:
            w.plan.rejected.append((job_id, f"{submitlimits.JOB_LIMIT}: {limit}"))
            w.plan.limited[spec.queue] = w.plan.limited.get(spec.queue, 0) + 1
            continue
        w.plan.jobs[job_id] = job
        w.plan.accepted += 1
        if w.open_changes is not None:
            w.open_changes.update(None, job)


def submission_refusal(w: _Work, spec: JobSpec) -> str:
    """Why the job's queue takes no more jobs of its user (scheduling.submitlimits),
    counting the jobs stored, what the commits in flight and this cycle change; "" if it
    takes it. A queue without a record (`default` as it comes, a queue not created yet)
    has no limits."""
    q = w.state.queues.get(spec.queue)
    if q is None or not submitlimits.limited(q):
        return ""
    if w.open_changes is None:
        w.open_changes = OpenJobs()
        for old, new in w.replaced():
            w.open_changes.update(old, new)
    return submitlimits.refusal(q, spec.user, (w.state.open_jobs, w.open_changes))


def dependency_state(w: _Work, job: Job, deps: Sequence[str]) -> tuple[list[str], str]:
    """Of `deps` (job ids `job` runs after), those it still waits for, and why it can never
    run ("" if it can): a dependency whose end its rule excludes (afterok: any but
    SUCCEEDED; afternotok: SUCCEEDED), or one no longer known (its record gone).
    dependencies.waits over this cycle's records."""
    left, never = waits(job.spec, deps, lambda d: w.plan.jobs.get(d) or w.state.jobs.get(d))
    if never is None:
        return left, ""
    dep, ended = never
    return left, f"dependency {dep} is not known" if ended is None else f"dependency {dep} ended {ended.value}"


def hold_text(by: str, reason: str = "", *, at_submission: bool = False) -> str:
    """A held job's `hold`: who held it (and when it was submitted held), and why."""
    text = f"held by {by or 'operator'}" + (" at submission" if at_submission else "")
    return clip_start(text + (f": {reason}" if reason else ""), HOLD_REASON_MAX)


def resolve_dependencies(w: _Work, now: float, room: int) -> None:
    """Jobs whose dependencies ended (or went): those all met go back to their queue (and
    may be placed in this cycle), those that can never be met (afterok, one ended
    otherwise; afternotok, one SUCCEEDED) end CANCELLED saying which, the rest wait for
    fewer."""
    for job_id in sorted(w.state.deps.due):
        if w.plan.keys + 2 > room:
            return
        if w.busy(job_id):
            continue
        job = w.plan.jobs.get(job_id) or w.state.jobs.get(job_id)
        if job is None or job.state is not JobState.QUEUED or not job.waiting_for:
            continue
        left, never = dependency_state(w, job, job.waiting_for)
        if not never and left == job.waiting_for:
            continue
        job = w.job(job_id)
        assert job is not None
        job.updated_at = now
        if never:
            job.state = JobState.CANCELLED
            job.hold = ""
            job.waiting_for = []
            job.cancel_reason = clip_start(f"{never}: it could never run ({dependency_kind(job.spec)})",
                                           CANCEL_REASON_MAX)
            w.plan.events.append(_event("job.cancelled", job, None, now, job.cancel_reason))
        else:
            job.waiting_for = left


def fail_unwritable(w: _Work, job_id: str, why: str, now: float) -> None:
    """End a job FAILED because the store refused one of its records (its placement, or
    a record it made grew past what NATS takes): the rest of the cluster's work goes on.
    Live tasks are stopped; nothing is retried."""
    job = w.job(job_id)
    if job is None or job.state.terminal:
        return
    for t in [t for t in job.current_tasks() if not t.state.terminal]:
        t.reason = t.reason or "the job's records could not be written"
        _stop_tasks(w.alloc(t.host_id), {t.id}, t.reason)
    job.state = JobState.FAILED
    job.end_reason = clip_start(why, CANCEL_REASON_MAX)
    job.updated_at = now
    w.plan.events.append(_event("job.failed", job, job.current, now, job.end_reason))


def _at_least(size: tuple[float, ...], floor: tuple[float, ...]) -> bool:
    """Whether `size` is at least `floor` in every respect (both `job_size` tuples)."""
    return all(x >= y for x, y in zip(size, floor, strict=True))


def queue_order(jobs: list[Job], q: Queue | None = None, state: ClusterState | None = None, now: float = 0.0,
                half_life_s: float = 0.0) -> Sequence[Job]:
    """One queue's jobs in its order: by priority, then submission order; in a queue `q`
    with fair share between its users, the users' order from what they hold in `state`
    and their past use decayed to `now` (scheduling.userfair). Across queues the planner
    interleaves them by fair share (scheduling.fairshare)."""
    ordered = fairshare.within_queue_order(jobs)
    if q is None or state is None or not q.fair_share_users:
        return ordered
    usage, live = state.user_usage.get(q.name, {}), state.user_live
    past_gpus, past_jobs = fairshare.past_users(state.queue_past.get(q.name), now, half_life_s)
    return userfair.interleaved(ordered, lambda user: (usage.get(user, 0.0) + past_gpus.get(user, 0.0),
                                                       live.get((q.name, user)) + past_jobs.get(user, 0.0)))


# Reservations: the hosts of the jobs whose time limit comes soonest are looked at as
# well as those with the most free room (scheduling.backfill).
RESERVE_SOONEST = 32
RESERVE_TRIES = 4  # jobs a cycle looks for hosts to reserve for, past those it reserves for


K = TypeVar("K")


class _LiveTally(Generic[K]):
    """A count of the state's jobs placed or running (scheduling.livecounts) as this cycle
    sees it: the records of commits in flight and of this cycle so far in place of the
    state's (gathered in one pass over them, when first asked), then what it places."""

    def __init__(self, w: _Work, counts: LiveCounts[K]) -> None:
        self.w = w
        self.counts = counts
        self._delta: LiveCounts[K] | None = None

    def _changes(self) -> LiveCounts[K]:
        if self._delta is None:
            self._delta = LiveCounts(self.counts.key)
            for old, new in self.w.replaced():
                self._delta.update(old, new)
        return self._delta

    def get(self, k: K) -> int:
        return self.counts.get(k) + self._changes().get(k)

    def add(self, k: K) -> None:
        """One more job of `k` placed (or preempting) this cycle."""
        self._changes().add(k, 1)


class Admission:
    """One cycle's queue accounting: the queue book (what each queue holds, this cycle's
    changes included), fair shares, and the preemptions under way."""

    def __init__(self, w: _Work, now: float, policy: QueuePolicy) -> None:
        state = w.state
        self.policy = policy
        usage = {q: dict(u) for q, u in state.queue_usage.items()}
        # The records of commits in flight (their placements, stops and ends) and this
        # cycle's reports, cancels and evictions in place of the state's.
        for old_queue, old_held, queue, held in w.held_changes():
            if old_queue is not None and old_held:
                add(usage.setdefault(old_queue, {}), old_held, -1.0)
            add(usage.setdefault(queue, {}), held)
        self.book = QueueBook(state.queues, usage)
        # The book as it will be once the preemptions under way are done (victims gone,
        # preemptors placed): what further preemptions are decided on, so that victims
        # stopping are not counted as borrowing twice.
        self.future = self.book.copy()
        past = {q: fairshare.past_allocation(rec, now, policy.half_life_s) for q, rec in state.queue_past.items()}
        self.shares = fairshare.Shares(self.book, state.capacity, past)
        self.models = sorted(state.index.models())
        self._demands: dict[str, tuple[JobSpec, dict[str, float]]] = {}
        self._any_model: dict[str, str] = {}  # per queue, the model a job naming none is counted as
        # Per queue, its running jobs that could be victims, cheapest first: built once a
        # cycle (server.scheduling.planner._running_by_cost), read by every search for victims.
        self.running: dict[str, _Ranked] = {}

    def queue(self, job: Job) -> Queue | None:
        return self.book.queue(job.spec.queue)

    def restrict(self, job: Job, seen: dict[str, float] | None = None) -> tuple[JobSpec | None, Refusal | None]:
        """The spec to place the job with (its GPU models narrowed to those its queue may
        take it on, and its queue's host labels added: placement_spec), or the queue's
        refusal; (None, None) when its own host labels and its queue's conflict (it is not
        placed). Each refusal met on the way lowers `seen` (resource -> the least demand of
        it refused) where it is lower."""
        qn = job.spec.queue
        q = self.book.queue(qn)
        assert q is not None
        labelled = placement_spec(job.spec, q)
        if labelled is None:
            return None, None
        spec = labelled
        models = self.models_of(qn, spec) if spec.wants_gpu() else None
        if models is None:
            refusal = self.book.admits(qn, job_demand(spec, None))
            if refusal is not None and seen is not None:
                _note(seen, refusal)
            return (spec, None) if refusal is None else (None, refusal)
        allowed: list[str] = []
        refusals: list[tuple[bool, Refusal]] = []
        for m in models:
            refusal = self.book.admits(qn, job_demand(spec, m))
            if refusal is None:
                allowed.append(m)
            else:
                if seen is not None:
                    _note(seen, refusal)
                # The refusal shown: one on a model the queue has a quota of, if any.
                refusals.append((nominal(q, "gpu:" + m) <= 0, refusal))
        if not allowed:
            return None, min(refusals, key=lambda x: x[0])[1] if refusals else Refusal(OVER_QUOTA, "gpu:", 0, 0, 0)
        if frozenset(allowed) == spec.models() or (spec.models() is None and len(allowed) == len(models)):
            return spec, None  # nothing narrowed: a job of any model stays one (placed without a model set)
        return spec.model_copy(update={"gpu_model": None, "gpu_models": allowed}), None

    def models_of(self, queue: str, spec: JobSpec | None) -> list[str] | None:
        """The GPU models `restrict` asks the queue's quota about for a job (`spec`; None:
        one naming no models), None when the queue meters no GPUs."""
        if not self.book.gpu_metered.get(queue, False):
            return None
        models = spec.models() if spec is not None else None
        return sorted(models) if models else self.models

    def borrows(self, queue: str, size: tuple[float, ...]) -> bool:
        """`QueueBook.would_borrow` for a job of `size` (`job_size`) naming no GPU model,
        its GPUs counted as `demand` counts them: worked out from the size alone, and
        true of every job at least as large in each respect."""
        q = self.book.queue(queue)
        if q is None:
            return False
        gpus, tasks, cpus, memory = size
        model = self._any_model.get(queue)
        if model is None:
            model = self._any_model[queue] = _counted_model(q, self.models)
        return self.book.would_borrow(queue, {CPU: cpus * tasks, MEMORY: memory * tasks,
                                              gpu_key(model): gpus * tasks})

    def demand(self, job: Job) -> dict[str, float]:
        """What the job would take (for preemption): its GPUs counted as the model its
        queue has most quota of among those it accepts."""
        hit = self._demands.get(job.id)
        if hit is not None and hit[0] is job.spec:
            return hit[1]
        d = self._demand(job)
        self._demands[job.id] = (job.spec, d)
        return d

    def _demand(self, job: Job) -> dict[str, float]:
        spec = job.spec
        q = self.book.queue(spec.queue)
        model = _counted_model(q, sorted(spec.models() or self.models)) if spec.wants_gpu() else None
        return job_demand(spec, model)


def _counted_model(q: Queue | None, models: list[str]) -> str:
    """The model a job that accepts any of `models` is counted as: the one its queue has
    most quota of (the first on a tie; "" when there are none)."""
    models = models or [""]
    return max(models, key=lambda m: (nominal(q, "gpu:" + m) if q else 0.0, -models.index(m)))


def _note(seen: dict[str, float], refusal: Refusal) -> None:
    if refusal.resource and refusal.wanted < seen.get(refusal.resource, math.inf):
        seen[refusal.resource] = refusal.wanted


def refused_whole(seen: Mapping[str, float], size: tuple[float, ...], models: Sequence[str] | None) -> bool:
    """Whether a job of `size` (`job_size`) is refused by its queue on every GPU model it
    may take (`models`; None: its GPUs are not metered), given `seen`, the least demand of
    each resource the queue's quota refused this cycle: it demands at least that much
    of one resource, for each model. Placements only take within a cycle, and a queue's
    quota refuses each resource on its own, more of it the more is asked
    (`QueueBook.admits`), so such a job is refused too."""
    gpus, tasks, cpus, memory = size
    if cpus * tasks >= seen.get(CPU, math.inf) or memory * tasks >= seen.get(MEMORY, math.inf):
        return True
    if models is None or not models or gpus <= 0:
        return False
    want = gpus * tasks
    return all(want >= seen.get(gpu_key(m), math.inf) for m in models)


def _model_of(placer: Placer, choice: Choice) -> str:
    cap = placer.touched.get(choice.host_id) or placer.index.caps.get(choice.host_id)
    if cap is None:
        return ""
    if choice.gpu_indices:
        return cap.gpu_models.get(choice.gpu_indices[0], "")
    if choice.mig:
        g = cap.mig.get(choice.mig[0])
        return cap.gpu_models.get(g[0], "") if g else ""
    return ""


def _victim_try(entry: str) -> tuple[str, int]:
    job_id, _, number = entry.rpartition(":")
    return job_id, int(number) if number.isdigit() else 0


def _victims_live(w: _Work, job: Job) -> tuple[bool, set[str]]:
    """Whether any victim this job waits for still runs, and the hosts they ran on."""
    live = False
    hosts: set[str] = set()
    for entry in job.preempting:
        vid, number = _victim_try(entry)
        victim = w.latest(vid)
        if victim is None:
            continue
        for a in victim.attempts:
            if a.number == number:
                hosts.add(a.host_id)
                if not a.state.terminal:
                    live = True
    return live, hosts


def _foresee(w: _Work, adm: Admission, job: Job) -> None:
    """Count a waiting preemptor in the future book: its victims still stopping gone, its
    demand taken."""
    for entry in job.preempting:
        vid, number = _victim_try(entry)
        victim = w.latest(vid)
        if victim is None:
            continue
        live = [a for a in victim.current_tasks() if a.number == number and not a.state.terminal]
        if live:
            gone: dict[str, float] = {}
            for a in live:
                add(gone, task_demand(victim.spec, a.gpu_model))
            adm.future.give(victim.spec.queue, gone)
    adm.future.take(job.spec.queue, adm.demand(job))


def enforce_time_limits(w: _Work, now: float, max_keys: int) -> None:
    """Stop the running tries that reached their time limit (SIGTERM, the grace of their
    task, SIGKILL); they end TIMEOUT once their agent reports them stopped."""
    for job_id in w.state.due_deadlines(now):
        if w.plan.keys + 2 > max_keys:
            return
        if w.busy(job_id):
            continue
        job = w.job(job_id)
        if job is None or job.state.terminal:
            continue
        tasks = [t for t in job.current_tasks() if not t.state.terminal]
        if not tasks or any(t.stop_kind for t in tasks):
            continue
        if w.plan.keys + 1 + len(tasks) > max_keys:
            return
        why = f"time limit of {tasks[0].time_limit_s:g} s reached"
        for t in tasks:
            _stop_attempt(w, t, TIMEOUT, why, now)
        job.updated_at = now
        w.plan.timed_out += 1
        w.plan.events.append(_event("job.timing_out", job, tasks[0], now, why))


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


def stop_on_faulted_gpus(w: _Work, now: float, max_keys: int) -> None:
    """Stop the tries that hold a GPU their host reports faulted (an Xid, an
    uncorrectable ECC error, a GPU fallen off the bus): SIGTERM, the task's grace,
    SIGKILL, every task of a gang's try with it. They end KILLED, which the retry policy
    counts as the infrastructure's failure, not the job's: the job is tried again, on
    other GPUs (a faulted one is never placed on), while it has tries left."""
    for host_id in sorted(w.state.faulted_work):
        if host_id in w.frozen_hosts:
            continue
        # As this cycle left them: its reports may have ended tasks already.
        cur = w.plan.allocs.get(host_id) or w.state.allocs.get(host_id)
        if cur is None:
            continue
        for entry in list(cur.tasks):
            if entry.stop:
                continue
            why = gpu_fault(w.state, host_id, entry.gpu_indices, entry.mig)
            if not why or w.busy(entry.job_id):
                continue
            snap = w.plan.jobs.get(entry.job_id) or w.state.jobs.get(entry.job_id)
            if snap is None or snap.state.terminal:
                continue
            live = [t for t in snap.current_tasks() if not t.state.terminal and not t.stop_kind]
            if not any(t.id == entry.attempt_id for t in live):
                continue
            if w.plan.keys + 1 + len(live) > max_keys:
                return
            job = w.job(entry.job_id)
            assert job is not None
            tasks = [t for t in job.current_tasks() if not t.state.terminal and not t.stop_kind]
            for t in tasks:
                _stop_attempt(w, t, GPU_FAULT, clip_start(why if t.host_id == host_id else
                                                          f"gang task on {host_id}: {why}", text_limits(job.spec)[1]),
                              now)
            job.updated_at = now
            w.plan.gpu_fault_stops += 1
            w.plan.events.append(_event("job.gpu_fault", job, tasks[0], now, why))


class _Ranked:
    """A queue's running jobs that could be stopped, cheapest first, read only as far as
    the searches go: a search for victims stops after a few, and a cycle's searches share
    one reading (what was read is kept in `done`)."""

    __slots__ = ("_rest", "done")

    def __init__(self, rest: Iterator[tuple[tuple[int, float, float, str], Job]]) -> None:
        self._rest = rest
        self.done: list[tuple[tuple[int, float, float, str], Job]] = []

    def __iter__(self) -> Iterator[tuple[tuple[int, float, float, str], Job]]:
        i = 0
        done = self.done
        while True:
            if i < len(done):
                yield done[i]
                i += 1
            else:
                item = next(self._rest, None)
                if item is None:
                    return
                done.append(item)


def _running_by_cost(w: _Work, adm: Admission, qn: str, now: float) -> _Ranked:
    """The running jobs of queue `qn` that could be stopped this cycle, cheapest first
    (preemption.Victim.cost), with what each holds: not frozen, every task started and
    none stopping, past the queue's minimum runtime. One reading a cycle, from the order
    the cluster state keeps (scheduling.victimindex); whatever the cycle changes (victims
    chosen, reports) is left out by the reader."""
    hit = adm.running.get(qn)
    if hit is not None:
        return hit
    vq = adm.book.queue(qn)
    ranked = adm.running[qn] = _Ranked(_unfrozen(w, w.state.victims.cheapest(qn, now, vq.min_runtime_s))
                                       if vq is not None else iter(()))
    return ranked


def _unfrozen(w: _Work, ranked: Iterator[tuple[tuple[int, float, float, str], str]]
              ) -> Iterator[tuple[tuple[int, float, float, str], Job]]:
    jobs, frozen = w.state.jobs, w.frozen_jobs
    for cost, job_id in ranked:
        if job_id not in frozen and (job := jobs.get(job_id)) is not None:
            yield cost, job


def _candidates(w: _Work, adm: Admission, req: preemption.Request, kind: str, now: float,
                limit: int = preemption.MAX_CANDIDATES) -> list[preemption.Victim]:
    """Running jobs that `kind` of preemption could stop for `req`, the cheapest first
    (at most `limit`): never one this cycle already changed, one already stopping, or
    one on a host a commit in flight writes."""
    book = adm.book
    me = book.queue(req.queue)
    if me is None:
        return []
    if kind == preemption.PRIORITY:
        queues = [req.queue]
    elif kind == preemption.RECLAIM:
        queues = _lenders(book, req.queue, me)
    else:
        queues = [q for q in book.queues if q != req.queue]
    wanted = {r for r, v in req.demand.items() if v > 0}
    pools = []
    for qn in queues:
        if book.queue(qn) is None:
            continue
        if kind != preemption.PRIORITY and not adm.future.over_nominal(qn, wanted):
            continue  # nothing of this queue may be taken: do not walk its jobs
        pools.append(_running_by_cost(w, adm, qn, now))
    out: list[preemption.Victim] = []
    for cost, job in heapq.merge(*pools, key=lambda x: x[0]):
        if kind == preemption.PRIORITY and cost[0] >= req.priority:
            break  # the rest are of the preemptor's priority or higher (the cost starts with it)
        v = _victim(w, job, wanted, now)
        if v is not None:
            out.append(v)
            if len(out) >= limit:
                break
    return out


def _paced(left: int, limit: int) -> int:
    """How many victims a preemption limit allows now: what is left of it, or, while none
    of it is used, up to one job's most: the limits pace preemptions rather than cap one,
    so a gang on hosts of small jobs that needs more victims than a limit is not starved."""
    return max(left, MAX_PREEMPTING) if 0 < limit <= left else left


def _lenders(book: QueueBook, name: str, q: Queue) -> list[str]:
    """The queues reclaim for queue `name` (`q`) may take from: the others of its cohort,
    and unmetered queues."""
    return [n for n, c in book.queues.items()
            if n != name and ((c.cohort is not None and c.cohort == q.cohort) or not c.quota)]


def _borrowed_from(adm: Admission, job: Job, q: Queue) -> bool:
    """Whether a queue that reclaim for `job` could take from holds more than its nominal
    quota of a resource the job wants (an unmetered one: any of it), in the book as it
    will be once the preemptions under way are done."""
    book = adm.future
    wanted = [r for r, v in adm.demand(job).items() if v > 0]
    return any(book.over_nominal(n, wanted) and any(book.used(n, r) > EPS for r in wanted)
               for n in _lenders(book, job.spec.queue, q))


def _victim(w: _Work, job: Job, wanted: AbstractSet[str], now: float) -> preemption.Victim | None:
    """A running job as a victim: None when this cycle changed it (a victim already, or a
    report), it holds none of `wanted` (when given), a task of it is on a host a commit in
    flight writes, or one is stopping already."""
    if job.id in w.plan.jobs:
        return None
    held = job_usage(job)
    if wanted and not any(r in wanted for r in held):
        return None
    tasks = [t for t in job.current_tasks() if not t.state.terminal]
    if any(t.host_id in w.frozen_hosts for t in tasks):
        return None
    where: list[tuple[str, Task]] = []
    allocs = w.state.allocs
    for t in tasks:
        alloc = allocs.get(t.host_id)
        task = next((x for x in alloc.tasks if x.attempt_id == t.id), None) if alloc else None
        if task is None or task.stop:
            return None
        where.append((t.host_id, task))
    since = min(t.started_at or now for t in tasks)
    return preemption.Victim(job.id, job.spec.queue, job.spec.priority, since, job.submitted_at, held, tuple(where))


class _HostVictims:
    """preemption.Hosts over this cycle: the jobs on a host that could be stopped, and
    whether one task of `spec` fits there once some are (on a copy of the host)."""

    def __init__(self, w: _Work, placer: Placer, spec: JobSpec, wanted: AbstractSet[str], now: float) -> None:
        self.w, self.placer, self.spec, self.wanted, self.now = w, placer, spec, wanted, now

    def victims_on(self, host_id: str) -> list[preemption.Victim]:
        state, frozen = self.w.state, self.w.frozen_jobs
        alloc = state.allocs.get(host_id)
        out: list[preemption.Victim] = []
        for job_id in dict.fromkeys(t.job_id for t in alloc.tasks) if alloc else ():
            job = state.jobs.get(job_id)
            if job is None or job_id in frozen or preemption.stoppable(job) is None:
                continue
            v = _victim(self.w, job, self.wanted, self.now)
            if v is not None:
                out.append(v)
        return out

    def room(self, host_id: str, victims: Sequence[preemption.Victim]) -> bool:
        placer = self.placer
        if host_id in placer.exclude or not placer.healthy(host_id):
            return False
        base = placer.view(host_id)
        if base is None:
            return False
        cap = base.copy()
        for v in victims:
            for h, t in v.tasks:
                if h == host_id:
                    cap.let_go(t)
        return placement_check(self.spec, cap)[0] is None


def _fits(placer: Placer, spec: JobSpec) -> Callable[[list[preemption.Victim]], bool]:
    def fits(victims: list[preemption.Victim]) -> bool:
        trial = placer.fork()
        for v in victims:
            for host_id, t in v.tasks:
                cap = trial.cap(host_id)
                if cap is not None:
                    cap.let_go(t)
        if spec.replicas > 1:
            return trial.place_gang(spec) is not None
        return trial.place(spec) is not None
    return fits


def preempt_for(w: _Work, adm: Admission, placer: Placer, job: Job, refusal: Refusal | None, now: float,
                max_keys: int, budget: int, inflight: dict[str, int]) -> int:
    """Try preemption for one waiting job; returns how many victims it stopped."""
    q = adm.queue(job)
    if q is None or job.preempting:
        return 0
    kinds: list[str] = []
    demand = adm.demand(job)
    if refusal is None:
        if q.preempt_within:
            kinds.append(preemption.PRIORITY)
        if q.reclaim and adm.future.within_nominal(job.spec.queue, demand):
            kinds.append(preemption.RECLAIM)
        if q.fair_share_preemption:
            kinds.append(preemption.FAIR_SHARE)
    elif refusal.reason == COHORT_EXHAUSTED:
        if q.reclaim:
            kinds.append(preemption.RECLAIM)
        if q.preempt_within:
            kinds.append(preemption.PRIORITY)
    elif refusal.reason == OVER_QUOTA:
        if q.preempt_within:
            kinds.append(preemption.PRIORITY)
        if q.fair_share_preemption and not refusal.hard:
            kinds.append(preemption.FAIR_SHARE)  # it would borrow, and the pool is drawn by others
    allowed = min(budget, _paced(q.max_preemptions - inflight.get(job.spec.queue, 0), q.max_preemptions),
                  MAX_PREEMPTING)
    if not kinds or allowed <= 0:
        return 0
    req = preemption.Request(job.id, job.spec.queue, job.spec.priority, demand, tuple(kinds))
    candidates: list[preemption.Victim] = []
    seen: set[str] = set()
    for kind in kinds:
        for v in _candidates(w, adm, req, kind, now):
            if v.job_id not in seen:
                seen.add(v.job_id)
                candidates.append(v)
    if not candidates:
        return 0
    # Victims must free room where the job may be placed: on the GPU models its queue's
    # quota admits it on now, when placement (not the quota) is what it waits for.
    spec = (adm.restrict(job)[0] if refusal is None else None) or placement_spec(job.spec, adm.queue(job))
    if spec is None:  # its labels and its queue's conflict: it is not placed, so nothing is stopped for it
        return 0
    wanted = {r for r, v in demand.items() if v > 0}
    found = preemption.choose(req, candidates, adm.future, adm.shares, now, _fits(placer, spec),
                              _HostVictims(w, placer, spec, wanted, now))
    if found is None or len(found.victims) > allowed:
        return 0
    hosts = {h for v in found.victims for h, _t in v.tasks}
    if w.plan.keys + 1 + len(found.victims) + len(hosts) > max_keys:
        return 0
    me = w.job(job.id)
    assert me is not None
    entries: list[str] = []
    for v in found.victims:
        victim = w.job(v.job_id)
        assert victim is not None
        vq = adm.book.queue(v.queue)
        grace = vq.preempt_grace_s if vq is not None else 0.0
        why = f"preempted ({found.kind}) by {job.id} of queue {job.spec.queue}"
        number = 0
        for t in victim.current_tasks():
            if t.state.terminal:
                continue
            number = t.number
            _stop_attempt(w, t, PREEMPT, why, now, grace)
        victim.updated_at = now
        entries.append(f"{victim.id}:{number}")
        w.plan.events.append(_event("job.preempting", victim, victim.current, now, why))
    me.preempting = entries
    me.updated_at = now
    for v in found.victims:
        adm.future.give(v.queue, v.usage)
    adm.future.take(job.spec.queue, demand)
    key = (found.kind, job.spec.queue)
    w.plan.preempted[key] = w.plan.preempted.get(key, 0) + len(found.victims)
    return len(found.victims)


def place_queued(
    w: _Work,
    placer: Placer,
    now: float,
    term: int,
    max_keys: int,
    placements: int | None = None,
    skip: Collection[str] = (),
    policy: QueuePolicy | None = None,
) -> None:
    policy = policy or QueuePolicy()
    adm = Admission(w, now, policy)
    book = adm.book
    # The queued jobs: each queue's in its order as the state keeps it (scheduling.backlog),
    # with this cycle's changes (jobs it requeued or took out of the queue).
    state, backlog, changed = w.state, w.state.backlog, w.plan.jobs
    jobs = state.jobs
    # A queue this cycle changed no job of is the state's list as it stands (kept by the
    # backlog between cycles; never changed here: jobs put back go to fresh lists).
    lists: dict[str, list[Job]] = {}
    changed_queues = {j.spec.queue for j in changed.values()}
    for qn in backlog.order:
        listed = backlog.jobs_of(qn, jobs)
        lists[qn] = [j for j in listed if j.id not in changed] if qn in changed_queues else listed
    preempting = [jobs[i] for i in backlog.preempting if i not in changed]
    added: dict[str, list[Job]] = {}  # queue -> jobs this cycle put back in it
    for j in changed.values():
        if j.state is JobState.QUEUED and not j.hold and not j.waiting_for:
            if j.preempting:
                preempting.append(j)
            else:
                bisect.insort(lists.setdefault(j.spec.queue, []), j, key=fairshare.order_key)
                added.setdefault(j.spec.queue, []).append(j)
    # (In queues with fair share between their users, the users' order: set below, once
    # the users' holdings are tallied.)
    by_queue: dict[str, Sequence[Job]] = {qn: jobs for qn, jobs in lists.items() if jobs}
    # Jobs that preempted others: wait while their victims stop; once all have, they
    # are placed before anything else, and the hosts the victims held are kept for them.
    ready: list[Job] = []
    held: dict[str, set[str]] = {}
    waiting: set[str] = set()  # hosts of victims still stopping
    inflight: dict[str, int] = {}
    for job in preempting:
        live, hosts = _victims_live(w, job)
        held[job.id] = hosts
        _foresee(w, adm, job)
        if live:
            waiting |= hosts
            inflight[job.spec.queue] = inflight.get(job.spec.queue, 0) + len(job.preempting)
            continue
        ready.append(job)
    # Preemptions the commits in flight start count as under way too (their victims and
    # hosts are frozen, so none is chosen twice): in the future book, the queues' limits
    # and the cohorts that lend nothing new meanwhile.
    starting = [j for j in w.pending.values()
                if j.state is JobState.QUEUED and j.preempting and j.id not in backlog.preempting]
    for job in starting:
        _foresee(w, adm, job)
        inflight[job.spec.queue] = inflight.get(job.spec.queue, 0) + len(job.preempting)
    # Per queue, the smallest size of any of its jobs in each respect (None when one of
    # them names GPU models): a refusal or a borrow at most that large covers them all.
    # The state's figure may count jobs this cycle took out of the queue: a floor no
    # higher than the true one, which only ever covers less.
    least: dict[str, tuple[float, ...] | None] = {}
    ready.sort(key=lambda j: (j.submitted_at, j.id))
    # Hosts kept for preemptors, counted once per preemptor keeping each: a host is let
    # go as soon as the last preemptor keeping it is placed or gives up, so that what its
    # victims freed beyond that preemptor's need goes to other jobs in the same cycle.
    keeping = Counter(h for hosts in held.values() for h in hosts)
    kept = set(keeping)
    keeps = dict(held)  # preemptors not yet placed nor given up

    def let_go_of(job: Job) -> None:
        for h in keeps.pop(job.id, ()):
            keeping[h] -= 1
            if not keeping[h]:
                kept.discard(h)

    def give_up(job: Job) -> None:
        """A preemptor that cannot be placed: its preemption is forgotten, its hosts let go."""
        _forget_preemption(w, job, now)
        let_go_of(job)

    reservations: dict[str, Reservation] = {}  # job id -> its reservation, this cycle's
    closing = maintenance.KeptOff(state.maintenance, now)  # by time limit: hosts a window keeps
    set_aside = advance.SetAside(state.advance, now)  # by queue and time limit: hosts set aside for others
    tried: set[str] = set()  # jobs this cycle worked a reservation out for, held or not
    reserving = RESERVE_TRIES + policy.reserve_jobs

    # The tasks on a host, each with when it is expected to have ended (this cycle's records).
    ends = ends_by_host(lambda h: w.plan.allocs.get(h) or state.allocs.get(h), w.latest, state.deadlines, now)

    def holders() -> list[tuple[Job, JobSpec]]:
        """The jobs whose records hold a reservation, with the specs to place them with,
        while they still wait for room only (queued, not placed nor preempting, admitted
        by their quota and their user's limit) and have waited long enough; longest held
        first."""
        out = []
        for job_id in state.reserved:
            job = w.latest(job_id)
            if job is None or job.state is not JobState.QUEUED or job.hold or job.waiting_for or job.preempting \
                    or job.id in w.frozen_jobs or job.id in skip or job.not_before > now \
                    or now - job.submitted_at < policy.reserve_after_s or job.id in tried:
                continue
            q = adm.queue(job)
            if q is None or over_user_limit(job, q) or waits_for_group(job):
                continue
            spec, _refusal = adm.restrict(job)
            if spec is not None:
                out.append((job, spec))
        return sorted(out, key=lambda js: (js[0].reserved.since if js[0].reserved else now, js[0].id))

    def reserve(job: Job, spec: JobSpec) -> None:
        """Hold hosts for `job` where it could start soonest, none of another
        reservation's nor of a maintenance window or an advance reservation for other
        queues its time limit would run into, if it may hold them. A gang that finds
        fewer hosts than it has tasks holds them only while other reservations hold the
        rest: where the hosts it may use are too few even without those, holding some
        would keep them idle for a start that cannot come."""
        tried.add(job.id)
        held = placer.exclude
        limit = effective_time_limit(job.spec, adm.queue(job))
        apart = held | closing(limit) | set_aside(job.spec.queue, job.spec.user, limit)
        placer.exclude = apart | {h for r in reservations.values() for h in r.hosts}
        soonest = soonest_hosts(state.deadlines, jobs.get, RESERVE_SOONEST)
        got = placer.reservation_for(job.id, spec, now, ends, soonest)
        if got.hosts and not spec.same_rack and len(got.hosts) < spec.replicas:
            placer.exclude = apart
            if len(placer.reservation_for(job.id, spec, now, ends, soonest).hosts) < spec.replicas:
                got = Reservation(job.id, frozenset(), got.start)
        placer.exclude = held
        waited = now - job.submitted_at
        if got.hosts and (got.known() or waited < policy.reserve_after_s + policy.reserve_max_s):
            reservations[job.id] = got

    def reserve_for(job: Job, spec: JobSpec) -> None:
        """Hold hosts for a job that found no room, once it has waited long enough."""
        nonlocal reserving
        waited = now - job.submitted_at
        if len(reservations) >= policy.reserve_jobs or not reserving or job.preempting \
                or waited < policy.reserve_after_s or job.id in tried:
            return
        # The first jobs a cycle that waited and found no room and that some hosts could
        # ever take; a few tries more, so that jobs no host can take do not cost more.
        # A job that holds a reservation keeps it while it still waits, and waits only for
        # room, even if other jobs that find no room now come first (jobs ahead of it
        # that fit are placed as ever: a reservation never reorders the queue): the
        # holders are served first, the oldest reservation first.
        reserving -= 1
        for keeper, keeper_spec in holders():
            if len(reservations) >= policy.reserve_jobs:
                return
            reserve(keeper, keeper_spec)
        if len(reservations) < policy.reserve_jobs and job.id not in tried:
            reserve(job, spec)
    blocked: list[tuple[Job, Refusal | None]] = []
    # Per queue, the size of a job its quota refused this cycle (for jobs of any model):
    # a job at least as large in every respect is refused too, and not looked at.
    refused: dict[str, tuple[tuple[float, ...], Refusal]] = {}
    # Per queue, the least demand of each resource its quota refused this cycle (any
    # job's, on any model): once the list for preemption is full, a job asking at least
    # that much of one resource on every model it may take is not looked at.
    seen: dict[str, dict[str, float]] = {}

    # Jobs within their queue's nominal quota go first; jobs that would borrow wait for a
    # second pass, and none is placed in a cohort where a job within its nominal quota
    # waits for victims to stop (what reclaim frees is not lent out again at once).
    deferred: dict[str, list[Job]] = {}
    starved: set[str | None] = set()  # cohorts with a preemption under way
    ready_ids = {r.id for r in ready}
    for job in [*preempting, *starting]:
        if job.id not in ready_ids:
            q = adm.queue(job)
            starved.add(q.cohort if q is not None else None)

    def below_a_refusal(job: Job) -> bool:
        """At least as large as a job its queue's quota refused this cycle (for jobs of any
        model): refused too, unlooked at (placements only take, so it stays refused); kept
        for preemption while the cycle may still look for victims."""
        qn = job.spec.queue
        floor = refused.get(qn)
        if floor is None or job.spec.models() is not None or not _at_least(job_size(job.spec), floor[0]):
            hit = seen.get(qn)
            return hit is not None and len(blocked) >= 2 * policy.preemptions_per_cycle and \
                refused_whole(hit, job_size(job.spec), adm.models_of(qn, job.spec))
        if len(blocked) < 2 * policy.preemptions_per_cycle and job.not_before <= now \
                and job.id not in w.frozen_jobs and job.id not in skip:
            blocked.append((job, floor[1]))
        return True

    # Per queue, the size of a job (of any model) that would borrow: one at least as large
    # would too, and waits for the second pass without its demand being worked out.
    borrows: dict[str, tuple[float, ...]] = {}

    def lowest(qn: str) -> tuple[float, ...] | None:
        """The smallest of queue `qn`'s jobs in each respect (None: one names GPU models)."""
        if qn not in least:
            low = backlog.least(qn) if by_queue.get(qn) else None
            more = added.get(qn, [])
            if low is not None and any(j.spec.models() is not None for j in more):
                low = None
            if low is not None and more:
                low = tuple(min(col) for col in zip(low, *(job_size(j.spec) for j in more), strict=True))
            least[qn] = low
        return least[qn]

    def covers(floor: tuple[float, ...] | None, qn: str) -> bool:
        """Whether every job of queue `qn` is at least as large as `floor`."""
        if floor is None:
            return False
        low = lowest(qn)
        return low is not None and _at_least(low, floor)

    def refused_rest(qn: str, i: int) -> bool:
        """Once the list for preemption is full, a queue whose every job is below a refusal
        is left at once: each of its jobs would be skipped."""
        if len(blocked) < 2 * policy.preemptions_per_cycle:
            return False
        hit = refused.get(qn)
        if hit is not None and covers(hit[0], qn):
            return True
        low = lowest(qn) if seen.get(qn) else None
        return low is not None and refused_whole(seen[qn], low, adm.models_of(qn, None))

    def first_rest(qn: str, i: int) -> bool:
        # Each would borrow (one at least as large as each did, or the smallest would):
        # all wait for the second pass.
        if covers(borrows.get(qn), qn) or ((low := lowest(qn)) is not None and adm.borrows(qn, low)):
            deferred.setdefault(qn, []).extend(by_queue[qn][i:])
            return True
        return False

    def first_pass() -> Iterator[Job]:
        yield from ready
        for job in fairshare.admission_order(by_queue, adm.shares.share, first_rest if policy.shortcuts else None):
            qn = job.spec.queue
            size = job_size(job.spec)
            floor = borrows.get(qn)
            unconstrained = job.spec.models() is None and policy.shortcuts
            if (unconstrained and floor is not None and _at_least(size, floor)) \
                    or book.would_borrow(qn, adm.demand(job)):
                deferred.setdefault(qn, []).append(job)
                if unconstrained and (floor is None or _at_least(floor, size)):
                    borrows[qn] = size  # the smallest known to borrow
            else:
                yield job

    def second_pass() -> Iterator[Job]:
        def lends(name: str) -> bool:
            q = book.queue(name)
            return q is None or not starved or (q.cohort not in starved and bool(q.quota))

        yield from fairshare.admission_order({n: js for n, js in deferred.items() if lends(n)}, adm.shares.share,
                                             refused_rest if policy.shortcuts else None)

    within = [True]  # in the first pass

    def order() -> Iterator[Job]:
        yield from first_pass()
        if budget > 0:
            preempt_blocked()
        within[0] = False
        yield from second_pass()

    def wait_for_reclaim(job: Job) -> None:
        """A job within its queue's nominal quota found no room: what borrowers would take
        now is what reclaim will take back, so the cohort lends nothing new this cycle;
        unless no queue reclaim takes from borrows what the job wants. Then room can come
        only from jobs ending, and what is free now (too little, or too scattered, for the
        job) is lent: a borrower placed now is what a later reclaim takes back."""
        q = adm.queue(job)
        if within[0] and q is not None and q.reclaim and q.cohort is not None and q.cohort not in starved \
                and _borrowed_from(adm, job, q):
            starved.add(q.cohort)

    budget = policy.preemptions_per_cycle
    tries = 2 * policy.preemptions_per_cycle  # jobs a cycle looks for victims for, found or not
    gave_up: set[str] = set()

    def exclusion(job: Job, q: Queue | None) -> AbstractSet[str]:
        """The hosts `job` may not take this cycle. Hosts kept for preemptors: a preemptor
        whose victims have stopped may use any but those still stopping for others; any
        other job none of them. Hosts reserved for another job, unless this one's time
        limit ends it by then (or, wanting no GPU, it leaves what the reserved job needs).
        And hosts a maintenance window will drain before its time limit would end it, or
        an advance reservation for other queues sets aside (open, or its limit running into
        it). A set shared with other jobs when one alone holds them all (a large maintenance
        window or reservation is not copied for every job)."""
        parts: list[AbstractSet[str]] = [frozenset((waiting - held[job.id]) if job.id in held else kept)]
        if reservations or state.maintenance or set_aside:
            limit = effective_time_limit(job.spec, q)
            parts.append(closing(limit))  # maintenance windows its time limit would run into
            parts.append(set_aside(job.spec.queue, job.spec.user, limit))
            for r in reservations.values():
                if r.job_id != job.id:
                    held_for = w.latest(r.job_id)
                    parts.append(kept_off(job.spec, limit, now, r, held_for.spec if held_for else None, placer.view))
        parts = [p for p in parts if p]
        if len(parts) <= 1:
            return parts[0] if parts else frozenset()
        return frozenset().union(*parts)

    def preempt_blocked() -> None:
        """Preemption, for the jobs that could not be placed, in admission order, within
        the cycle's and each queue's limits."""
        nonlocal budget, tries
        gave_up.update(j for j in held if j in w.plan.jobs and not w.plan.jobs[j].preempting)
        for job, refusal in blocked:
            if budget <= 0 or tries <= 0 or w.plan.keys + 4 > max_keys:
                break
            if job.id in w.frozen_jobs or job.id in skip or job.id in gave_up or w.busy(job.id) \
                    or job.not_before > now:
                continue
            current = w.plan.jobs.get(job.id, job)
            if current.state is not JobState.QUEUED or current.preempting:
                continue
            cq = adm.queue(current)
            if cq is not None and over_user_limit(current, cq) or waits_for_group(current):
                continue
            tries -= 1
            placer.exclude = exclusion(current, cq)  # its victims are looked for where it may go
            n = preempt_for(w, adm, placer, current, refusal, now, max_keys,
                            _paced(budget, policy.preemptions_per_cycle), inflight)
            if n:
                claim(current, cq)
                budget -= n
                inflight[job.spec.queue] = inflight.get(job.spec.queue, 0) + n
                q = adm.queue(job)
                starved.add(q.cohort if q is not None else None)
        blocked.clear()

    # Per queue with a per-user GPU limit: the GPUs each user's jobs hold, this cycle's
    # changes so far included (reports, cancels, replacements), plus what the user's
    # preemptors will take (their victims' GPUs are theirs) and what this cycle places.
    by_user: dict[str, dict[str, float]] = {}

    def tally(qn: str) -> dict[str, float]:
        if qn not in by_user:
            # The state's figures (kept as records arrive), with this cycle's changes and
            # the commits in flight in place of the records they replace.
            theirs = {qn: dict(state.user_usage.get(qn, {}))}
            for old, new in w.replaced():
                if old is not None and old.spec.queue == qn:
                    add_user(theirs, old, -1.0)
                if new.spec.queue == qn:
                    add_user(theirs, new, 1.0)
            users = theirs.get(qn, {})
            for j in (*preempting, *starting):
                if j.spec.queue == qn and j.spec.wants_gpu():
                    users[j.spec.user] = users.get(j.spec.user, 0.0) + job_gpus(j.spec)
            by_user[qn] = users
        return by_user[qn]

    # Jobs placed or running per user and job group, and per queue and user: the state's
    # counts with this cycle's changes and the commits in flight, then what it places.
    in_group = _LiveTally(w, state.group_live)
    user_jobs = _LiveTally(w, state.user_live)

    def over_user_limit(job: Job, q: Queue) -> bool:
        """The job would take its user past one of its queue's per-user limits, of GPUs or
        of jobs placed or running: it waits, and is not a reason to preempt anything
        (other users' jobs of the queue go on). A preemptor's own claim is counted already."""
        if q.max_running_jobs_per_user and user_jobs.get(queue_user(job)) - bool(job.preempting) \
                >= q.max_running_jobs_per_user:
            return True
        if not q.max_gpus_per_user or not job.spec.wants_gpu():
            return False
        own = job_gpus(job.spec) if job.preempting else 0.0
        return tally(job.spec.queue).get(job.spec.user, 0.0) - own + job_gpus(job.spec) > q.max_gpus_per_user + EPS

    def waits_for_group(job: Job) -> bool:
        """The job's group has its limit of jobs placed or running: it waits its turn, and
        is not a reason to preempt anything. A preemptor is counted in its group already."""
        k = groups.key(job)
        return k is not None and groups.waits(job, in_group.get(k) - bool(job.preempting))

    def claim(job: Job, q: Queue | None) -> None:
        """Count a job placed, or one whose preemption starts, against its user's limits and
        its group's."""
        if q is not None and q.max_gpus_per_user and job.spec.wants_gpu():
            users = tally(job.spec.queue)
            users[job.spec.user] = users.get(job.spec.user, 0.0) + job_gpus(job.spec)
        if q is not None and q.max_running_jobs_per_user:
            user_jobs.add(queue_user(job))
        k = groups.key(job)
        if k is not None:
            in_group.add(k)

    # Queues with fair share between their users: their jobs in the users' order, from
    # what each user holds as the cycle begins (scheduling.userfair).
    def user_load(qn: str) -> Callable[[str], userfair.Load]:
        past_gpus, past_jobs = fairshare.past_users(state.queue_past.get(qn), now, policy.half_life_s)
        return lambda user: (tally(qn).get(user, 0.0) + past_gpus.get(user, 0.0),
                             user_jobs.get((qn, user)) + past_jobs.get(user, 0.0))

    for qn, queued in by_queue.items():
        fq = book.queue(qn)
        if fq is not None and fq.fair_share_users:
            by_queue[qn] = userfair.interleaved(queued, user_load(qn))

    complete = True  # every queued job looked at (no break): a reservation not made is none
    for job in order():
        if w.plan.keys + 2 > max_keys or (placements is not None and w.plan.placed >= placements):
            complete = False
            break
        if job.id in w.frozen_jobs or job.id in skip:
            continue
        if w.plan.keys + 1 + job.spec.replicas > max_keys:
            continue  # a gang too large for what is left of this commit: next cycle
        if job.not_before > now:
            continue
        q = adm.queue(job)
        if q is None:
            continue  # its queue was deleted: it waits until one of that name exists
        if label_conflict(job.spec, q):  # the queue moved to hosts its own labels rule out
            if job.preempting:
                give_up(job)
            continue
        if over_user_limit(job, q) or waits_for_group(job):
            if job.preempting:
                give_up(job)  # its limit changed: what its victims freed goes to others
            continue
        if below_a_refusal(job):
            continue
        size = job_size(job.spec)
        placer.exclude = exclusion(job, q)
        spec, refusal = adm.restrict(job, seen.setdefault(job.spec.queue, {}) if policy.shortcuts else None)
        if spec is None:
            if job.spec.models() is None and refusal is not None and not job.preempting:
                refused.setdefault(job.spec.queue, (size, refusal))
            if job.preempting:
                give_up(job)
            blocked.append((job, refusal))
            if refusal is not None and refusal.within_nominal:
                wait_for_reclaim(job)
            continue
        # A job that open advance reservations admit (its queue or user) goes to their hosts first.
        own = set_aside.own(job.spec.queue, job.spec.user) if set_aside else frozenset()
        choices = placer.within(own, functools.partial(_placed, placer, spec)) if own else None
        if choices is None:
            choices = _placed(placer, spec)
        if choices is None:
            if job.preempting:
                give_up(job)
            blocked.append((job, None))
            wait_for_reclaim(job)
            reserve_for(job, spec)
            continue
        for c in choices:
            placer.reserve(c, spec)
        # Placed (on its reserved hosts, or where it found room first): what it left free
        # there is for the jobs after it, and its slot for another.
        reservations.pop(job.id, None)
        copy = w.job(job.id)
        assert copy is not None
        job = copy
        job.reserved = None
        if not job.preempting:  # a preemptor's GPUs were counted as its claim
            claim(job, q)
        job.preempting = []
        number = job.tries + 1
        gang = job.spec.replicas > 1
        gang_hosts = ",".join(c.host_id for c in choices)  # task i's host is the i-th
        limit = effective_time_limit(job.spec, q)
        attempt = None
        for i, choice in enumerate(choices):
            model = _model_of(placer, choice)
            book.take(job.spec.queue, task_demand(job.spec, model))
            attempt = Attempt(
                id=f"{job.id}.{number}.{i}" if gang else f"{job.id}.{number}",
                number=number,
                task=i,
                host_id=choice.host_id,
                gpu_indices=choice.gpu_indices,
                gpu_share=job.spec.gpu_share,
                mig=list(choice.mig),
                state=AttemptState.PLACED,
                term=term,
                placed_at=now,
                time_limit_s=limit,
                gpu_model=model,
            )
            job.attempts.append(attempt)
            alloc = w.alloc(choice.host_id)
            alloc.term = term
            alloc.tasks.append(
                Task(
                    attempt_id=attempt.id,
                    job_id=job.id,
                    number=number,
                    command=job.spec.command,
                    env=dict(job.spec.env, MUSTER_GANG_TASK=str(i), MUSTER_GANG_SIZE=str(len(choices)),
                             MUSTER_GANG_HOSTS=gang_hosts)
                    if gang else job.spec.env,
                    cwd=job.spec.cwd,
                    gpu_indices=choice.gpu_indices,
                    gpu_share=job.spec.gpu_share,
                    gpu_memory_mb=job.spec.gpu_memory_mb,
                    mig=list(choice.mig),
                    cpus=job.spec.cpus,
                    memory_mb=job.spec.memory_mb,
                    term=term,
                    keep_running=job.spec.on_disconnect == "KEEP_RUNNING",
                    grace_s=q.preempt_grace_s,
                )
            )
        job.state = JobState.PLACED
        job.updated_at = now
        assert attempt is not None
        w.plan.placed += 1
        w.plan.events.append(_event("job.placed", job, attempt, now))
        let_go_of(job)
    w.plan.reservations = list(reservations.values())  # in the order they were made
    record_reservations(w, w.plan.reservations, complete, now, max_keys, skip)
    if budget > 0:
        preempt_blocked()  # for the jobs of the second pass (priority preemption, above all)


# A reservation's start written again into its job's record only once it moved this much.
RESERVED_START_SLACK_S = 30.0


def record_reservations(w: _Work, reservations: Sequence[Reservation], complete: bool, now: float, max_keys: int,
                        skip: Collection[str]) -> None:
    """Keep `Job.reserved` in the records: each job this cycle reserved for gets it when
    it is new or has changed (hosts, or its start by more than RESERVED_START_SLACK_S);
    the other queued jobs that have one lose it, once a cycle has looked at every queued
    job or made a reservation (which looks at every job that holds one first; a cycle cut
    short before either says nothing of them). Records in flight or left alone (`skip`)
    wait for a later cycle."""
    def writable(job_id: str) -> Job | None:
        if job_id in w.frozen_jobs or job_id in skip:
            return None
        cur = w.latest(job_id)
        if cur is None or cur.state is not JobState.QUEUED:
            return None
        if job_id not in w.plan.jobs and w.plan.keys + 1 > max_keys:
            return None
        return w.job(job_id)

    kept = {r.job_id for r in reservations}
    if complete or reservations:
        for job_id in sorted(w.state.reserved - kept):
            job = writable(job_id)
            if job is not None:
                job.reserved = None
    for reservation in reservations:
        _record(w, reservation, now, writable)


def _record(w: _Work, reservation: Reservation, now: float, writable: Callable[[str], Job | None]) -> None:
    cur = w.latest(reservation.job_id)
    old = cur.reserved if cur is not None else None
    hosts = sorted(reservation.hosts)
    new = Reserved(hosts=hosts[:RESERVED_HOSTS_KEPT], host_count=len(hosts),
                   start=reservation.start if reservation.known() else None, since=old.since if old else now)
    if old is not None and (old.hosts, old.host_count) == (new.hosts, new.host_count) and (
            old.start == new.start if old.start is None or new.start is None
            else abs(new.start - old.start) <= RESERVED_START_SLACK_S):
        return
    job = writable(reservation.job_id)
    if job is not None:
        job.reserved = new


def _forget_preemption(w: _Work, job: Job, now: float) -> None:
    """A job whose victims have stopped but that still cannot be placed (the room went
    elsewhere, or its quota changed) gives up its claim: it may preempt again."""
    copy = w.job(job.id)
    if copy is not None and copy.preempting:
        copy.preempting = []
        copy.updated_at = now


def update_usage(w: _Work, now: float, policy: QueuePolicy) -> None:
    """Bring the queues' decayed past use up to date, every `usage_every_s`; in a queue
    with fair share between its users, each user's too."""
    state = w.state
    if policy.half_life_s <= 0:
        return
    names = set(state.queue_usage) | set(state.queue_past)
    live: dict[str, dict[str, float]] | None = None  # queue -> user -> jobs placed or running
    for name in sorted(names):
        old = state.queue_past.get(name)
        held = state.queue_usage.get(name, {})
        if old is not None and now - old.at < policy.usage_every_s and old.half_life_s == policy.half_life_s:
            continue
        if old is None and not held:
            continue
        users = None
        q = state.queues.get(name)
        if q is not None and q.fair_share_users:
            if live is None:
                live = {}
                for (qn, user), n in state.user_live.as_dict().items():
                    live.setdefault(qn, {})[user] = float(n)
            users = (state.user_usage.get(name, {}), live.get(name, {}))
        rec = fairshare.decay(old, held, now, policy.half_life_s, name, users)
        if old is not None and not rec.usage and not old.usage:
            continue
        w.plan.usage[name] = rec


def plan_cycle(
    state: ClusterState,
    *,
    reports: list[StatusReport],
    commands: list[Command],
    now: float,
    term: int,
    max_keys: int = 900,
    budget: EvictionBudget | None = None,
    submissions: list[SubmitRequest] = (),  # type: ignore[assignment]
    frozen_jobs: frozenset[str] | set[str] = frozenset(),
    frozen_hosts: frozenset[str] | set[str] = frozenset(),
    placements: int | None = None,
    evict: bool = True,
    fail: Mapping[str, str] | None = None,
    skip: Collection[str] = (),
    policy: str = "fgd",
    unheard_since: Mapping[str, float] | None = None,
    unheard_grace_s: float = 0.0,
    candidates: int = 16,
    queues: QueuePolicy | None = None,
    usage: bool = True,
    reports_read_to: float | None = None,
    report_stamps: Sequence[float] = (),
    pending: Mapping[str, Job] | None = None,
    pending_held: Mapping[str, Resources] | None = None,
) -> Plan:
    """Decide one cycle. `state` is read, never modified. Records in `frozen_jobs` and
    `frozen_hosts` (written by earlier cycles whose commits are in flight) are neither
    read for decisions nor written: inputs that would touch them wait (they and every
    input after them are left unused), and no job is placed on a frozen host.

    The scheduler narrows a cycle when it looks for an input the store refuses (see
    scheduling.scheduler, isolation): at most `placements` jobs placed, no eviction or
    drain unless `evict`; the jobs in `fail` end FAILED with their reason, and those in
    `skip` are left alone (their records cannot be written at all).

    `queues` holds the fair-share and preemption settings; with `usage` the queues'
    decayed past use is brought up to date when due (the scheduler passes False while a
    commit in flight writes it). `pending` holds the job records the commits in flight
    write (the `frozen_jobs`): their placements count against queue quotas and per-user
    limits, so that pipelined cycles do not each admit up to the same limit; `pending_held`
    what each of them holds (queues.job_usage), where the caller knows it already.

    `reports_read_to` is the store's time up to which every status report has been
    given to this cycle or an earlier one (None: not known), and `report_stamps` when the
    store stored each of `reports`: work on a host whose key expired later waits
    (`evict_lost`), and so does any whose expiry is newer than a report this cycle
    leaves for the next."""
    plan = Plan()
    w = _Work(state, plan, frozen_jobs, frozen_hosts, pending, pending_held)
    for job_id, why in (fail or {}).items():
        if job_id not in frozen_jobs and not w.busy(job_id):
            fail_unwritable(w, job_id, why, now)
    # Each input touches at most a job and a host's allocation (a gang's failure may
    # touch every host of the gang, at most 256): leave room for them and for placements.
    room = max(2, max_keys - 258)
    for i, r in enumerate(reports):
        if plan.keys + 2 > room:
            break
        plan.reports_used += 1
        if w.busy(r.job_id, (r.host_id,)):
            plan.deferred_reports.append(i)
            continue
        apply_report(w, r, now)
    for i, c in enumerate(commands):
        if plan.keys + 2 > room:
            break
        plan.commands_used += 1
        if w.busy(c.job_id):
            plan.deferred_commands.append(i)
            continue
        if c.kind == "cancel":
            apply_cancel(w, c, now)
        elif c.kind == "update":
            apply_update(w, c, now)
        elif c.kind == "requeue":
            apply_requeue(w, c, now)
    known = state.index.models()
    for i, req in enumerate(submissions):
        if plan.keys + len(req.jobs) > room:
            break
        plan.submissions_used += 1
        if frozen_jobs and any(isinstance(d.get("id"), str) and d["id"] in frozen_jobs for d in req.jobs):
            plan.deferred_submissions.append(i)  # a retried publish of jobs being committed
            continue
        apply_submission(w, req, known, now)
    resolve_dependencies(w, now, room)

    def healthy(host_id: str) -> bool:
        """Whether the host may take work: healthy, not being changed by a commit in flight,
        and not in a maintenance window that has begun."""
        return host_id not in frozen_hosts and state.health(host_id, now) is Health.HEALTHY \
            and not (state.maintenance and maintenance.started(state.maintenance.get(host_id), now))

    queues = queues or QueuePolicy()
    if evict:
        drain_due(w, now, room)
        stop_set_aside(w, now, room)
        pass_gpu_clears(w)
        enforce_time_limits(w, now, room)
        stop_on_faulted_gpus(w, now, room)
    frag = state.shapes.fragmentation()
    if evict and budget is not None:
        if reports_read_to is not None and plan.reports_used < min(len(reports), len(report_stamps)):
            reports_read_to = min(reports_read_to, report_stamps[plan.reports_used])
        evict_lost(w, Placer(state.index, healthy, policy=policy, fragmentation=frag, candidates=candidates), now,
                   budget, max_keys, unheard_since, unheard_grace_s, reports_read_to)
    placer = Placer(state.index, healthy, policy=policy, fragmentation=frag, candidates=candidates)
    # Capacity freed or taken by this cycle's reports, cancels and evictions.
    for host_id, alloc in plan.allocs.items():
        cap = placer.cap(host_id)
        if cap is None:
            continue
        cap.used_gpus.clear()
        cap.share_used.clear()
        cap.share_memory_used.clear()
        cap.used_mig.clear()
        cap.used_cpus = 0.0
        cap.used_memory_mb = 0
        cap.tasks = 0
        cap.record_bytes = 0
        for t in alloc.tasks:
            cap.hold(t)
            cap.record_bytes += len(t.compact_json()) + 1
    for host_id, bad in w.faulted.items():
        cap = placer.cap(host_id)
        if cap is not None:
            cap.unhealthy_gpus = cap.unhealthy_gpus | bad
    for alloc in plan.allocs.values():
        alloc.term = term or alloc.term
    if evict and usage and plan.keys + len(state.queue_usage) + len(state.queue_past) < room:
        update_usage(w, now, queues)
    if placements != 0:
        place_queued(w, placer, now, term, max_keys, placements=placements, skip=skip, policy=queues)
    return plan
