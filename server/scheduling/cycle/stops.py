"""Work a cycle stops or moves: lost hosts' work replaced (within the eviction budget),
hosts drained or set aside for an advance reservation cleared, tries on faulted GPUs
and past their time limit stopped, operators' clears of GPU fault marks passed on. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from server.scheduling import advance, retry
from server.scheduling.capacity import Placer
from server.scheduling.cycle.reports import end_attempt
from server.scheduling.cycle.work import (
    GPU_FAULT,
    TIMEOUT,
    Work,
    attempt_of,
    gpu_fault,
    job_event,
    stop_attempt,
    stop_tasks,
)
from server.scheduling.deadlines import try_deadline
from server.scheduling.eviction import EvictionBudget, HostLoss, disrupted_domains, host_domains
from server.scheduling.queues import placement_spec
from server.scheduling.setasidework import others_work
from server.timefmt import duration_text
from wire.budgets import clip_start, text_limits
from wire.messages import AdvanceReservation, Attempt, AttemptState, Job, max_counts


def evict_lost(
    w: Work,
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
    losses = [HostLoss(e.host_id, dict(state.labels_of(e.host_id)), e.lost_at or 0.0) for e in absent]
    disrupted = disrupted_domains(losses, state.domain_sizes(), now, budget.config)
    w.plan.disrupted = disrupted
    # `feasible` is where evicted work could go: its own reservations, made as work is
    # evicted, so no more is evicted than the rest of the cluster can take.
    for host_id, lost_at in sorted(lost, key=lambda x: (x[1], x[0])):
        if host_id in w.frozen_hosts:
            continue  # an earlier cycle's commit is changing it: next cycle
        entry = state.hosts.get(host_id)
        domains = host_domains(state.labels_of(host_id)) if entry and entry.heartbeat else []
        # Its agent said it was leaving (a heartbeat, or a report of its shutdown) before it went.
        left = entry is not None and (entry.leaving_reported is not None
                                      or (entry.heartbeat is not None and entry.heartbeat.leaving))
        # As this cycle left them: a report it applied may have ended a task already.
        for task in list((w.plan.allocs.get(host_id) or state.allocs[host_id]).tasks):
            if w.plan.keys >= max_keys - 2:
                return
            if w.busy(task.job_id):
                continue
            job = w.plan.jobs.get(task.job_id) or state.jobs.get(task.job_id)
            a = attempt_of(job, task.attempt_id) if job else None
            if task.stop and job is not None and a is not None and not a.state.terminal and not job.state.terminal \
                    and job.spec.on_disconnect == "KEEP_RUNNING" and now - lost_at < job.spec.replace_after_s:
                # Marked to stop (a drain, a reservation, a preemption, a requeue) while, or
                # just before, its host was cut off: its agent, which keeps a KEEP_RUNNING task
                # running while cut off, may never have heard of it. Held as any such try
                # (found by exploring: the drain of a lost host replaced it at once, and the
                # job ran twice).
                w.plan.held_keep_running += 1
                continue
            if job is None or a is None or a.state.terminal or task.stop:
                # Nothing left to replace (finished, cancelled or unknown): free the slot.
                alloc = w.alloc(host_id)
                alloc.tasks = [t for t in alloc.tasks if t.attempt_id != task.attempt_id]
                if job is not None and a is not None and not a.state.terminal:
                    end_attempt(w, job.id, a.id, AttemptState.KILLED, "host lost while stopping", now,
                                lost_end(job, lost_at, now))
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
            if left and a.state is AttemptState.PLACED:
                # Placed before the leader read that the host was leaving, on an agent that
                # gave back what it got while shutting down (and started nothing): not a try
                # of the job's, requeued as its agent's shutdown stops are.
                copy = w.job(job.id)
                stopped = attempt_of(copy, a.id) if copy is not None else None
                if stopped is not None:
                    stopped.stop_kind, stopped.stop_at = retry.SHUTDOWN, now
                end_attempt(w, job.id, a.id, AttemptState.KILLED,
                            f"not started: host {host_id} left (its agent shut down)", now, lost_end(job, lost_at, now))
            else:
                end_attempt(w, job.id, a.id, AttemptState.LOST, f"host {host_id} lost", now,
                            lost_end(job, lost_at, now))
            w.plan.evicted += 1


def lost_end(job: Job, lost_at: float, now: float) -> float:
    """When a try on a lost host ended, as its record and the accounting keep it: when its
    host was lost (its key expired: `lost_at`; for a host unheard of, when the scheduler
    first saw it so), not when the cycle replaced it, which may be hours later when the
    cluster had no room for it meanwhile. A KEEP_RUNNING try may really have run on through
    its `replaceAfter` (its agent does not stop it when cut off, and the leader waits for
    it): it ends when it was due to be replaced, `lost_at + replaceAfter`. Never after
    `now`; an unknown loss time (0) is `now`. (`end_attempt` keeps it at or after the
    try's start.)"""
    if lost_at <= 0.0:
        return now
    if job.spec.on_disconnect == "KEEP_RUNNING":
        lost_at += job.spec.replace_after_s
    return min(lost_at, now)


def drain_due(w: Work, now: float, max_keys: int) -> None:
    """Stop what still runs on draining hosts whose deadline has passed. Each try stopped
    is marked a drain's (retry.DRAIN): it is not counted against its job's maxAttempts.
    A job whose record is in flight, or that would not fit this cycle's commit, is left
    for a later cycle (its host's other tasks are stopped now)."""
    for host_id, cfg in w.state.hostcfg.items():
        if not cfg.drain_due(now) or host_id in w.frozen_hosts:
            continue
        _stop_host_work(w, host_id, f"host {host_id} drained" + (f": {cfg.reason}" if cfg.reason else ""), now,
                        max_keys)


def stop_set_aside(w: Work, now: float, max_keys: int) -> None:
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


def _stop_others(w: Work, r: AdvanceReservation, host_id: str, now: float, max_keys: int) -> None:
    """Stop the work on `host_id` of the jobs reservation `r` does not admit, if any."""
    cur = w.state.allocs.get(host_id)
    if cur is None or host_id in w.frozen_hosts:
        return

    def other(job: Job | None) -> bool:
        return job is None or not advance.admits(r, job.spec.queue, job.spec.user)

    if others_work(r, cur, lambda job_id: w.plan.jobs.get(job_id) or w.state.jobs.get(job_id)):
        _stop_host_work(w, host_id, f"host {host_id} set aside for {advance.whom(r)} by advance reservation "
                                    f"{r.name}", now, max_keys, other)


def _stop_host_work(w: Work, host_id: str, why: str, now: float, max_keys: int,
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
        gang = [t for t in snap.current_tasks() if not t.state.terminal and not t.stop_kind]
        if w.busy(entry.job_id) or (entry.job_id not in w.plan.jobs and w.plan.keys + 1 + len(gang) > max_keys):
            later.add(entry.attempt_id)
            continue
        job = w.job(entry.job_id)
        assert job is not None
        # Every task of the try at once, as a GPU fault or a time limit stops a gang (found
        # by exploring: a gang's other tasks got their SIGTERM only once the drained one had
        # gone, a whole grace later, holding their GPUs for a try already over).
        for t in [t for t in job.current_tasks() if not t.state.terminal and not t.stop_kind]:
            stop_attempt(w, t, retry.DRAIN, clip_start(why if t.host_id == host_id else f"gang task on {host_id}: "
                                                       f"{why}", text_limits(job.spec)[1]), now)
        job.updated_at = now
    if later or only is not None:
        stop_tasks(w.alloc(host_id), picked - later, why)
    else:
        stop_tasks(w.alloc(host_id), None, why)


def pass_gpu_clears(w: Work) -> None:
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


def enforce_time_limits(w: Work, now: float, max_keys: int) -> None:
    """Stop the running tries that reached their time limit (SIGTERM, the grace of their
    task, SIGKILL); they end TIMEOUT once their agent reports them stopped. Run before the
    drains' and reservations' stops: a limit and a drain deadline both passed when a
    cycle comes (a new leader's first, a slow one) stop the try as the earlier of the two
    (found by exploring: the drain won, and a try past its limit was requeued uncounted);
    the same for an advance reservation that set its host aside, and for a gang task that
    ended (not SUCCEEDED) in this cycle: before its limit, the try keeps that end; after it
    (its report read late), the limit came first."""
    for job_id in w.state.due_deadlines(now):
        if w.plan.keys + 2 > max_keys:
            return
        if w.busy(job_id):
            continue
        job = w.job(job_id)
        if job is None or job.state.terminal:
            continue
        # As this cycle's reports and commands left it (its limit changed, a task ended).
        current = job.current_tasks()
        deadline = try_deadline(current, ended_end=False)
        tasks = [t for t in current if not t.state.terminal]
        if deadline is None or deadline > now or not tasks:
            continue
        ended = [t.finished_at or now for t in current if t.state.terminal and t.state is not AttemptState.SUCCEEDED]
        if ended and min(ended) < deadline:
            continue  # a task ended before the limit: the try keeps that end
        if _stopped_first(w, job, tasks, deadline, now):
            continue
        if w.plan.keys + 1 + len(tasks) > max_keys:
            return
        why = f"time limit of {duration_text(tasks[0].time_limit_s)} reached"
        for t in tasks:
            stop_attempt(w, t, TIMEOUT, why, now)
        job.updated_at = now
        w.plan.timed_out += 1
        w.plan.events.append(job_event("job.timing_out", job, tasks[0], now, why))


def _stopped_first(w: Work, job: Job, tasks: list[Attempt], deadline: float, now: float) -> bool:
    """Whether a drain's deadline or an advance reservation's start that sets a host of
    `tasks` aside from `job` came before its try's `deadline` (both past `now`): the try is
    stopped as theirs (requeued uncounted), not for its limit."""
    for t in tasks:
        cfg = w.state.hostcfg.get(t.host_id)
        if cfg is not None and cfg.drain_due(now) and cfg.drain_deadline < deadline:
            return True
    for r in w.state.advance.values():
        if r.starts < deadline and advance.active(r, now) and not advance.admits(r, job.spec.queue, job.spec.user) \
                and any(t.host_id in r.hosts for t in tasks):
            return True
    return False


def stop_on_faulted_gpus(w: Work, now: float, max_keys: int) -> None:
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
                stop_attempt(w, t, GPU_FAULT, clip_start(why if t.host_id == host_id else
                                                          f"gang task on {host_id}: {why}", text_limits(job.spec)[1]),
                              now)
            job.updated_at = now
            w.plan.gpu_fault_stops += 1
            w.plan.events.append(job_event("job.gpu_fault", job, tasks[0], now, why))
