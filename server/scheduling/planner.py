"""One scheduling cycle's decisions, as a pure function of a snapshot, inputs and a clock.

`plan_cycle()` folds agent status reports and operator commands into the job and
allocation records, then places queued jobs, and returns the changed records and the
events to publish. The scheduler commits the result atomically; nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from server.health.rules import Health
from server.scheduling import retry
from server.scheduling.capacity import Placer
from server.scheduling.eviction import EvictionBudget, HostLoss, disrupted_domains, host_domains
from server.state.cluster import ClusterState
from wire import subjects
from wire.budgets import CANCEL_REASON_MAX, clip_end, clip_start, text_limits
from wire.messages import (
    JOB_ID_PATTERN,
    Attempt,
    AttemptState,
    Command,
    Event,
    HostAlloc,
    Job,
    JobState,
    StatusReport,
    SubmitRequest,
    Task,
)
from wire.validation import validate_job

JOB_ID_RE = re.compile(JOB_ID_PATTERN)


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
    disrupted: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def keys(self) -> int:
        return len(self.jobs) + len(self.allocs)


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
                 frozen_hosts: frozenset[str] | set[str] = frozenset()) -> None:
        self.state = state
        self.plan = plan
        self.frozen_jobs = frozen_jobs
        self.frozen_hosts = frozen_hosts

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


def _stop_tasks(alloc: HostAlloc, attempt_ids: set[str] | None) -> None:
    """Mark tasks (all when `attempt_ids` is None) to be stopped by their agent."""
    alloc.tasks = [t.model_copy(update={"stop": True}) if not t.stop and (attempt_ids is None or t.attempt_id
                                                                          in attempt_ids) else t
                   for t in alloc.tasks]


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
    a.state = r.state
    a.finished_at = r.ts
    a.exit_code = r.exit_code
    # Text from the job's own process, clipped to the share of the job record's budget
    # an attempt may take (bytes as encoded: wire.budgets).
    tail_limit, reason_limit = text_limits(job.spec)
    a.output_tail = clip_end(r.output_tail, tail_limit)
    a.reason = clip_start(r.reason, reason_limit)
    if a.started_at is None:
        a.started_at = r.ts
    alloc = w.alloc(r.host_id)
    alloc.tasks = [t for t in alloc.tasks if t.attempt_id != r.attempt_id]
    job.updated_at = now
    why = r.reason
    if r.state is AttemptState.FAILED:  # the agent's reason (spawn failed, oom-killed, ...) with the code
        why = f"exit code {r.exit_code}" + (f" ({a.reason})" if a.reason else "")
    _after_attempt_end(w, job, a, r.state, now, why)


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
    if live:
        # One gang task failed: stop the rest; the decision waits until they are gone.
        for t in live:
            _stop_tasks(w.alloc(t.host_id), {t.id})
            t.reason = t.reason or f"gang task {a.task} ended {ended.value}"
        w.plan.events.append(_event("gang.stopping", job, a, now, f"task {a.task} {ended.value.lower()}"))
        return
    # The try is over. A gang retries only for infrastructure reasons if every task
    # that did not succeed ended that way; any FAILED task makes it a FAILED try.
    worst = AttemptState.FAILED if any(t.state is AttemptState.FAILED for t in tasks) else ended
    decision = retry.decide(job, worst, now)
    if decision.retry:
        job.state = JobState.QUEUED
        job.not_before = decision.not_before
        w.plan.events.append(_event("job.requeued", job, a, now, f"{why}; {decision.why}" if why else decision.why))
    else:
        job.state = JobState.FAILED
        w.plan.events.append(_event("job.failed", job, a, now, why if worst is AttemptState.FAILED else decision.why))


def apply_cancel(w: _Work, c: Command, now: float) -> None:
    job = w.plan.jobs.get(c.job_id) or w.state.jobs.get(c.job_id)
    if job is None or job.state.terminal:
        w.plan.ignored += 1
        return
    job = w.job(c.job_id)
    assert job is not None
    job.state = JobState.CANCELLED
    job.cancel_reason = clip_start(c.reason, CANCEL_REASON_MAX) or f"cancelled by {c.by or 'operator'}"
    job.updated_at = now
    a = job.current
    for live in [t for t in job.current_tasks() if not t.state.terminal]:
        # The task keeps its allocation, marked to stop, until the agent reports the
        # process gone (SIGTERM, grace, SIGKILL): freed capacity is really free.
        _stop_tasks(w.alloc(live.host_id), {live.id})
        live.reason = clip_start(job.cancel_reason, text_limits(job.spec)[1])
    w.plan.events.append(_event("job.cancelled", job, a, now, job.cancel_reason))


def _end_attempt(w: _Work, job_id: str, attempt_id: str, ended: AttemptState, reason: str, now: float) -> None:
    """An attempt ended without a report from its agent (host lost): record it, and
    requeue the job or fail it according to the retry policy."""
    job = w.job(job_id)
    if job is None:
        return
    a = _attempt(job, attempt_id)
    if a is None or a.state.terminal:
        return
    a.state = ended
    a.finished_at = now
    a.reason = reason
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
) -> None:
    """Replace work on hosts whose heartbeat key expired, within the pacing budgets,
    never evicting work that has nowhere to go.

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
        lost.append((host_id, (gone.lost_at or 0.0) if gone is not None else 0.0))
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
        for task in list(state.allocs[host_id].tasks):
            if w.plan.keys >= max_keys - 2:
                return
            if w.busy(task.job_id):
                continue
            job = state.jobs.get(task.job_id)
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
            target = feasible.place(job.spec)
            if target is None:
                w.plan.held_no_capacity += 1
                continue
            if not budget.allow(domains, disrupted, now):
                w.plan.paced += 1
                continue
            feasible.reserve(target, job.spec)
            alloc = w.alloc(host_id)
            alloc.tasks = [t for t in alloc.tasks if t.attempt_id != task.attempt_id]
            _end_attempt(w, job.id, a.id, AttemptState.LOST, f"host {host_id} lost", now)
            w.plan.evicted += 1


def drain_due(w: _Work, now: float) -> None:
    """Stop what still runs on draining hosts whose deadline has passed."""
    for host_id, cfg in w.state.hostcfg.items():
        if not cfg.draining or now < cfg.drain_deadline or host_id in w.frozen_hosts:
            continue
        cur = w.state.allocs.get(host_id)
        if cur is None or all(t.stop for t in cur.tasks):
            continue
        _stop_tasks(w.alloc(host_id), None)


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
        fields = {k: v for k, v in data.items() if k not in ("id", "user")}
        fields["user"] = req.user
        spec, errors = validate_job(fields, known_models)
        if spec is None:
            w.plan.rejected.append((job_id, "; ".join(str(e) for e in errors)))
            continue
        submitted = req.ts if 0 < req.ts <= now else now
        w.plan.jobs[job_id] = Job(id=job_id, spec=spec, submitted_at=submitted, updated_at=now)
        w.plan.accepted += 1


def fail_unwritable(w: _Work, job_id: str, why: str, now: float) -> None:
    """End a job FAILED because the store refused one of its records (its placement, or
    a record it made grew past what NATS takes): the rest of the cluster's work goes on.
    Live tasks are stopped; nothing is retried."""
    job = w.job(job_id)
    if job is None or job.state.terminal:
        return
    for t in [t for t in job.current_tasks() if not t.state.terminal]:
        _stop_tasks(w.alloc(t.host_id), {t.id})
        t.reason = t.reason or "the job's records could not be written"
    job.state = JobState.FAILED
    job.end_reason = clip_start(why, CANCEL_REASON_MAX)
    job.updated_at = now
    w.plan.events.append(_event("job.failed", job, job.current, now, job.end_reason))


def queue_order(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: (-j.spec.priority, j.submitted_at, j.id))


GANG_RESERVE_AFTER_S = 10.0
GANG_RESERVE_MAX_S = 600.0


def place_queued(
    w: _Work,
    placer: Placer,
    now: float,
    term: int,
    max_keys: int,
    gang_reserve_after_s: float | None = None,
    gang_reserve_max_s: float | None = None,
    placements: int | None = None,
    skip: Collection[str] = (),
) -> None:
    if gang_reserve_after_s is None:
        gang_reserve_after_s = GANG_RESERVE_AFTER_S
    if gang_reserve_max_s is None:
        gang_reserve_max_s = GANG_RESERVE_MAX_S
    candidates = {j.id: j for j in w.state.queued()}
    for jid, j in w.plan.jobs.items():
        if j.state is JobState.QUEUED:
            candidates[jid] = j
        else:
            candidates.pop(jid, None)
    reservation: set[str] | None = None
    for job in queue_order(list(candidates.values())):
        if w.plan.keys + 2 > max_keys or (placements is not None and w.plan.placed >= placements):
            break
        if job.id in w.frozen_jobs or job.id in skip:
            continue
        if w.plan.keys + 1 + job.spec.replicas > max_keys:
            continue  # a gang too large for what is left of this commit: next cycle
        if job.not_before > now:
            continue
        if job.spec.replicas > 1:
            choices = placer.place_gang(job.spec)
            if choices is None:
                if reservation is None and now - job.submitted_at >= gang_reserve_after_s \
                        and now - job.submitted_at < gang_reserve_after_s + gang_reserve_max_s:
                    # Hold back hosts for this gang, for a bounded time, so that a stream
                    # of small jobs cannot keep it waiting for ever.
                    reservation = placer.reservation_for(job.spec)
                    placer.exclude = reservation
                continue
        else:
            choice = placer.place(job.spec)
            if choice is None:
                continue
            choices = [choice]
        for c in choices:
            placer.reserve(c, job.spec)
        copy = w.job(job.id)
        assert copy is not None
        job = copy
        number = job.tries + 1
        gang = job.spec.replicas > 1
        gang_hosts = ",".join(c.host_id for c in choices)  # task i's host is the i-th
        attempt = None
        for i, choice in enumerate(choices):
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
                )
            )
        job.state = JobState.PLACED
        job.updated_at = now
        assert attempt is not None
        w.plan.placed += 1
        w.plan.events.append(_event("job.placed", job, attempt, now))


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
) -> Plan:
    """Decide one cycle. `state` is read, never modified. Records in `frozen_jobs` and
    `frozen_hosts` (written by earlier cycles whose commits are in flight) are neither
    read for decisions nor written: inputs that would touch them wait (they and every
    input after them are left unused), and no job is placed on a frozen host.

    The scheduler narrows a cycle when it looks for an input the store refuses (see
    scheduling.scheduler, isolation): at most `placements` jobs placed, no eviction or
    drain unless `evict`; the jobs in `fail` end FAILED with their reason, and those in
    `skip` are left alone (their records cannot be written at all)."""
    plan = Plan()
    w = _Work(state, plan, frozen_jobs, frozen_hosts)
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
        if c.kind == "cancel" and w.busy(c.job_id):
            plan.commands_used += 1
            plan.deferred_commands.append(i)
            continue
        if c.kind == "cancel":
            apply_cancel(w, c, now)
        plan.commands_used += 1
    known = state.index.models()
    for i, req in enumerate(submissions):
        if plan.keys + len(req.jobs) > room:
            break
        plan.submissions_used += 1
        if frozen_jobs and any(isinstance(d.get("id"), str) and d["id"] in frozen_jobs for d in req.jobs):
            plan.deferred_submissions.append(i)  # a retried publish of jobs being committed
            continue
        apply_submission(w, req, known, now)
    def healthy(host_id: str) -> bool:
        return host_id not in frozen_hosts and state.health(host_id, now) is Health.HEALTHY

    if evict:
        drain_due(w, now)
    frag = state.shapes.fragmentation()
    if evict and budget is not None:
        evict_lost(w, Placer(state.index, healthy, policy=policy, fragmentation=frag, candidates=candidates), now,
                   budget, max_keys, unheard_since, unheard_grace_s)
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
    for alloc in plan.allocs.values():
        alloc.term = term or alloc.term
    if placements != 0:
        place_queued(w, placer, now, term, max_keys, placements=placements, skip=skip)
    return plan
