"""Agents' status reports and operators' commands (cancel, update, requeue) folded into
one cycle's job and allocation records: a try's end, its job's retry or end. Pure."""

from __future__ import annotations

import math

from server.scheduling import retry
from server.scheduling.cycle.work import (
    CANCEL,
    GPU_FAULT,
    Work,
    attempt_of,
    ended_as,
    gpu_fault,
    job_event,
    limit_came_first,
    stop_attempt,
    stop_tasks,
)
from server.scheduling.queues import preemption_loss
from server.timefmt import duration_text
from wire.budgets import (
    CANCEL_REASON_MAX,
    HOLD_REASON_MAX,
    clip_end,
    clip_start,
    compact_older,
    text_limits,
    tries_bound,
)
from wire.messages import Attempt, AttemptState, Command, Job, JobState, StatusReport

# How long before the store stored a report its time may be (a report whose agent's clock
# says earlier is taken as of this long before it was stored): room for what delivery
# takes when NATS is briefly out of reach (a stream's leader election, a reconnect, an
# agent's resend of a report not applied, 30 s after the first). A report held longer by
# its agent (cut off from NATS for minutes, its tries KEEP_RUNNING) is charged up to a
# minute before it was stored.
REPORT_DELAY_S = 60.0


def report_time(ts: float, placed_at: float, now: float, stored: float = math.inf) -> float:
    """A report's time (`ts`, its agent's clock) as the leader takes it: by its agent's
    clock, but not after the store stored it (`stored`; inf: not known) nor `now`, not more
    than REPORT_DELAY_S before it was stored, and not before the try was placed. Found by
    exploring: an agent whose clock was an hour behind had its 2-hour try charged an hour
    (its end read an hour early). An agent whose clock is ahead is bounded by the stored
    time rather than by when the leader reads the report, which may be later."""
    if stored != math.inf:
        ts = min(max(ts, stored - REPORT_DELAY_S), stored)
    return max(min(ts, now), placed_at)


def apply_report(w: Work, r: StatusReport, now: float, stored: float = math.inf) -> None:
    """Fold an agent's status report, stored by the status stream at `stored` (inf: not
    known), into its job's and its host's records."""
    job = w.plan.jobs.get(r.job_id) or w.state.jobs.get(r.job_id)
    if job is None:
        w.plan.ignored += 1
        return
    cur = attempt_of(job, r.attempt_id)
    if cur is None or cur.host_id != r.host_id or cur.state.terminal:
        w.plan.ignored += 1
        return
    if r.state is AttemptState.RUNNING and cur.state is AttemptState.RUNNING:
        w.plan.ignored += 1
        return
    job = w.job(r.job_id)
    assert job is not None
    a = attempt_of(job, r.attempt_id)
    assert a is not None
    # The agent's clock, kept within what the leader knows (found by exploring: a report
    # dated a day ahead made a finished attempt count GPU-hours in `usage` for a day).
    ts = report_time(r.ts, a.placed_at or 0.0, now, stored)
    if r.state is AttemptState.RUNNING:
        a.state = AttemptState.RUNNING
        a.started_at = ts
        if job.state is JobState.PLACED:
            job.state = JobState.RUNNING
        job.updated_at = now
        w.plan.events.append(job_event("job.running", job, a, now))
        return
    if not r.state.terminal:
        w.plan.ignored += 1
        return
    if r.shutdown and r.state is AttemptState.KILLED and not a.stop_kind:
        a.stop_kind, a.stop_at = retry.SHUTDOWN, now  # stopped by its agent's orderly shutdown
    if r.host_trouble and r.state is AttemptState.KILLED and not a.stop_kind:
        a.stop_kind, a.stop_at = retry.HOST, now  # its host could not start it: not the job's failure
    if r.state in (AttemptState.KILLED, AttemptState.LOST):
        limit_came_first(job, a, max(ts, a.started_at or 0.0))
    ended = ended_as(a, r.state)
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
    a.finished_at = max(ts, a.started_at or 0.0)
    a.exit_code = r.exit_code
    a.gpu_util_pct = None if a.mig else r.gpu_util_pct  # NVML tells none per MIG instance
    # Text from the job's own process, clipped to the share of the job record's budget
    # an attempt may take (bytes as encoded: wire.budgets).
    tail_limit, reason_limit = text_limits(job.spec)
    a.output_tail = clip_end(r.output_tail, tail_limit)
    if fault:
        a.reason = clip_start(f"{fault}; the task exited with code {r.exit_code}", reason_limit)
    elif not a.stop_kind or not a.reason:
        a.reason = clip_start(r.reason, reason_limit)
    if a.started_at is None:
        a.started_at = ts
    alloc = w.alloc(r.host_id)
    alloc.tasks = [t for t in alloc.tasks if t.attempt_id != r.attempt_id]
    job.updated_at = now
    if ended is AttemptState.FAILED:  # the agent's reason (spawn failed, oom-killed, ...) with the code
        why = _failed_why(r.exit_code, a.reason)
    else:
        why = a.reason or r.reason
    _after_attempt_end(w, job, a, ended, now, why)


def _failed_why(exit_code: int | None, reason: str) -> str:
    """A FAILED try's reason: its exit code, with the agent's reason when it gave one."""
    return f"exit code {exit_code}" + (f" ({reason})" if reason else "")


def _after_attempt_end(w: Work, job: Job, a: Attempt, ended: AttemptState, now: float, why: str) -> None:
    """Decide what an ended attempt means for its job. A gang finishes only when every
    task of the try succeeded; one failure stops the others, and the gang is retried
    (or failed) as one once none of its tasks is live any more."""
    if ended is AttemptState.PREEMPTED:
        key = (job.spec.queue, job.spec.checkpoints)
        w.plan.preemption_lost[key] = w.plan.preemption_lost.get(key, 0.0) + preemption_loss(job.spec, a)
    if job.state.terminal:  # cancelled meanwhile: the attempt has now stopped
        w.plan.events.append(job_event("attempt.stopped", job, a, now))
        return
    tasks = job.current_tasks() if a.number == job.tries else [a]
    live = [t for t in tasks if not t.state.terminal]
    if ended is AttemptState.SUCCEEDED:
        if not live and all(t.state is AttemptState.SUCCEEDED for t in tasks):
            job.state = JobState.SUCCEEDED
            w.plan.events.append(job_event("job.succeeded", job, a, now))
        return
    if live and (ended in (AttemptState.PREEMPTED, AttemptState.TIMEOUT)
                 or ended is AttemptState.KILLED and a.stop_kind == GPU_FAULT):
        return  # the others were told to stop with it: the decision waits for them
    if live:
        # One gang task failed: stop the rest; the decision waits until they are gone.
        for t in live:
            t.reason = t.reason or f"gang task {a.task} ended {ended.value}"
            if a.stop_kind in retry.DISRUPTIONS and not t.stop_kind:
                t.stop_kind, t.stop_at = a.stop_kind, now  # the gang's try ends by the same disruption
            stop_tasks(w.alloc(t.host_id), {t.id}, t.reason)
        w.plan.events.append(job_event("gang.stopping", job, a, now, f"task {a.task} {ended.value.lower()}"))
        return
    # The try is over. A gang retries only for infrastructure reasons if every task
    # that did not succeed ended that way; any FAILED task makes it a FAILED try.
    worst = AttemptState.FAILED if any(t.state is AttemptState.FAILED for t in tasks) else ended
    if worst is AttemptState.FAILED and a.state is not AttemptState.FAILED:
        # A gang's try decided when its last task stopped: it is the task that failed
        # that the job's end names, with its exit code (found by exploring: `job.failed`
        # named the task stopped with it, "gang task 1 ended FAILED", no exit code).
        # (`a`, the task the job's end and events name from here on, is that one.)
        a = min((t for t in tasks if t.state is AttemptState.FAILED), key=lambda t: (t.finished_at or 0.0, t.task))
        why = _failed_why(a.exit_code, a.reason) + f" (gang task {a.task})"
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
            w.plan.events.append(job_event("job.failed", job, a, now, job.end_reason))
            return
    if worst is AttemptState.TIMEOUT and not decision.retry:
        job.state = JobState.TIMEOUT
        job.end_reason = job.end_reason or f"time limit of {duration_text(a.time_limit_s)} reached"
        w.plan.events.append(job_event("job.timeout", job, a, now, job.end_reason))
        return
    if worst is AttemptState.PREEMPTED:
        job.state = JobState.QUEUED
        job.not_before = decision.not_before
        w.plan.events.append(job_event("job.preempted", job, a, now, a.reason or "preempted"))
        return
    if decision.retry:
        job.state = JobState.QUEUED
        job.not_before = decision.not_before
        w.plan.events.append(job_event("job.requeued", job, a, now, f"{why}; {decision.why}" if why else decision.why))
    else:
        job.state = JobState.FAILED
        if worst is not AttemptState.FAILED:
            said = decision.why
        elif job.spec.retry_failures:
            said = f"{why}; {decision.why}"  # how many of its retries it used
        else:
            said = why
        w.plan.events.append(job_event("job.failed", job, a, now, said))


def apply_cancel(w: Work, c: Command, now: float) -> None:
    job = w.plan.jobs.get(c.job_id) or w.state.jobs.get(c.job_id)
    if job is None or job.state.terminal:
        w.plan.ignored += 1
        return
    job = w.job(c.job_id)
    assert job is not None
    job.state = JobState.CANCELLED
    job.hold = ""  # a held job cancelled is no longer waiting for a release
    job.waiting_for = []  # nor for the jobs it was to run after
    job.cancel_reason = clip_start(c.reason, CANCEL_REASON_MAX) or f"cancelled by {c.by or 'operator'}"
    job.updated_at = now
    a = job.current
    for live in [t for t in job.current_tasks() if not t.state.terminal]:
        # The task keeps its allocation, marked to stop, until the agent reports the
        # process gone (SIGTERM, grace, SIGKILL): freed capacity is really free.
        live.reason = clip_start(job.cancel_reason, text_limits(job.spec)[1])
        # Whatever it was being stopped for before: a victim cancelled in its grace ended
        # PREEMPTED with the cancel's reason, its run charged to preemption (found by
        # exploring).
        live.stop_kind, live.stop_at = CANCEL, now
        stop_tasks(w.alloc(live.host_id), {live.id}, live.reason)
    w.plan.events.append(job_event("job.cancelled", job, a, now, job.cancel_reason))


def apply_update(w: Work, c: Command, now: float) -> None:
    """An operator's change to a job that has not ended: its priority (which moves it in
    its queue's order, and decides it as a preemption victim), a hold or release, and its
    time limit (the job's, and its running try's unless that try is being stopped: one
    that has run longer is stopped as its limit is next enforced). Only a QUEUED job that
    is not taking GPUs by preemption can be held; a release always applies. What cannot
    apply is left as it is."""
    job = w.plan.jobs.get(c.job_id) or w.state.jobs.get(c.job_id)
    if job is None or job.state.terminal:
        w.plan.ignored += 1
        return
    priority = c.priority if c.priority is not None and c.priority != job.spec.priority else None
    hold = c.hold is True and not job.hold and job.state is JobState.QUEUED and not job.preempting
    release = c.hold is False and bool(job.hold)
    live = [t for t in job.current_tasks() if not t.state.terminal]
    limit = c.time_limit_s if c.time_limit_s is not None and not any(t.stop_kind for t in live) else None
    if limit is not None and limit == job.spec.time_limit_s and c.time_limit_exempt == job.spec.time_limit_exempt \
            and all(t.time_limit_s == limit for t in live):
        limit = None
    if priority is None and not hold and not release and limit is None:
        w.plan.ignored += 1
        return
    job = w.job(c.job_id)
    assert job is not None
    done: list[str] = []
    if priority is not None:
        done.append(f"priority {job.spec.priority} -> {priority}")
        job.spec = job.spec.model_copy(update={"priority": priority})  # the spec is shared: a new one
    if limit is not None:
        was = next((t.time_limit_s for t in job.current_tasks() if not t.state.terminal), job.spec.time_limit_s)
        done.append(f"time limit {duration_text(was) if was else 'none'} -> "
                    f"{duration_text(limit) if limit else 'none'}")
        job.spec = job.spec.model_copy(update={"time_limit_s": limit, "time_limit_exempt": c.time_limit_exempt})
        for t in job.current_tasks():
            if not t.state.terminal:
                t.time_limit_s = limit
    if hold:
        job.hold = hold_text(c.by, c.reason)
        done.append(job.hold)
    if release:
        job.hold = ""
        job.freed_at = now
        done.append(f"released by {c.by or 'operator'}")
    job.updated_at = now
    w.plan.events.append(job_event("job.updated", job, job.current, now, "; ".join(done)))


def apply_requeue(w: Work, c: Command, now: float) -> None:
    """An operator's requeue: the live tasks of a placed or running job's try are stopped
    (SIGTERM, the grace, SIGKILL) as an orderly disruption (retry.REQUEUE: not counted
    against maxAttempts), and once they are gone the job is queued again at its old place,
    held if asked. A job queued or ended is left as it is; one whose try is being stopped
    already (preempted, drained, at its time limit) keeps that stop and its end, and is
    held if asked (found by exploring: a requeue held of a job in its preemption grace was
    taken and dropped, and the job placed again as soon as it was queued)."""
    job = w.plan.jobs.get(c.job_id) or w.state.jobs.get(c.job_id)
    if job is None or job.state not in (JobState.PLACED, JobState.RUNNING):
        w.plan.ignored += 1
        return
    live = [t for t in job.current_tasks() if not t.state.terminal]
    stopping = next((t.stop_kind for t in live if t.stop_kind), "")
    if not live or (stopping and (not c.hold or job.hold)):
        w.plan.ignored += 1
        return
    job = w.job(c.job_id)
    assert job is not None
    if stopping:
        job.hold = hold_text(c.by, c.reason)
        job.updated_at = now
        w.plan.events.append(job_event("job.updated", job, job.current, now,
                                       f"held by {c.by or 'operator'} (its try already stopping: {stopping})"))
        return
    why = f"requeued by {c.by or 'operator'}" + (f": {c.reason}" if c.reason else "")
    for t in [t for t in job.current_tasks() if not t.state.terminal]:
        stop_attempt(w, t, retry.REQUEUE, clip_start(why, text_limits(job.spec)[1]), now)
    if c.hold:
        job.hold = hold_text(c.by, c.reason)
    job.updated_at = now
    w.plan.events.append(job_event("job.updated", job, job.current, now, why + ("; held" if c.hold else "")))


def end_attempt(w: Work, job_id: str, attempt_id: str, ended: AttemptState, reason: str, now: float,
                ended_at: float | None = None) -> None:
    """An attempt ended without a report from its agent (host lost): record it, ended at
    `ended_at` (default `now`; never before the try started, or was placed), and requeue
    the job or fail it according to the retry policy."""
    job = w.job(job_id)
    if job is None:
        return
    a = attempt_of(job, attempt_id)
    if a is None or a.state.terminal:
        return
    finished = max(now if ended_at is None else ended_at, a.started_at or a.placed_at or 0.0)
    if ended in (AttemptState.KILLED, AttemptState.LOST):
        limit_came_first(job, a, finished)
    ended = ended_as(a, ended)
    a.state = ended
    a.finished_at = finished
    a.reason = a.reason if a.stop_kind and a.reason else reason
    job.updated_at = now
    _after_attempt_end(w, job, a, ended, now, reason)


def hold_text(by: str, reason: str = "", *, at_submission: bool = False) -> str:
    """A held job's `hold`: who held it (and when it was submitted held), and why."""
    text = f"held by {by or 'operator'}" + (" at submission" if at_submission else "")
    return clip_start(text + (f": {reason}" if reason else ""), HOLD_REASON_MAX)


def fail_unwritable(w: Work, job_id: str, why: str, now: float) -> None:
    """End a job FAILED because the store refused one of its records (its placement, or
    a record it made grew past what NATS takes): the rest of the cluster's work goes on.
    Live tasks are stopped; nothing is retried."""
    job = w.job(job_id)
    if job is None or job.state.terminal:
        return
    for t in [t for t in job.current_tasks() if not t.state.terminal]:
        t.reason = t.reason or "the job's records could not be written"
        stop_tasks(w.alloc(t.host_id), {t.id}, t.reason)
    job.state = JobState.FAILED
    job.end_reason = clip_start(why, CANCEL_REASON_MAX)
    job.updated_at = now
    w.plan.events.append(job_event("job.failed", job, job.current, now, job.end_reason))
