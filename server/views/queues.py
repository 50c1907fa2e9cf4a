"""The queue read model, the same for GraphQL, the console and /metrics: each queue's
quota beside what it holds, borrows and lends, its pending and running jobs and its fair
share; and the queue-level reasons a queued job waits (why pending).

Built from the cluster view's figures (kept as job records arrive: ClusterState
queue_usage, queue_live, and the backlog's counts), never by a pass over every job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from server.scheduling import advance, dependencies, fairshare, groups, maintenance
from server.scheduling.backfill import leave_s
from server.scheduling.queues import (
    COHORT_EXHAUSTED,
    DEPENDENCY,
    FAIR_SHARE,
    GANG_WHOLE,
    GROUP_LIMIT,
    HELD,
    LABEL_CONFLICT,
    MAINTENANCE,
    NOT_YET,
    OVER_QUOTA,
    PREEMPTION_GRACE,
    PRIORITY_WAIT,
    RECLAIM_WAIT,
    RESERVED,
    RESERVED_FOR_OTHER,
    SET_ASIDE,
    UNKNOWN_QUEUE,
    USER_LIMIT,
    QueueBook,
    borrowing_limit,
    effective_time_limit,
    job_demand,
    job_gpus,
    label_conflict,
    meters,
    nominal,
    queue_named,
    reclaims_from,
    task_demand,
)
from server.timefmt import duration_text
from wire.messages import DEFAULT_QUEUE, Job, JobState, Queue, implicit_default_queue

if TYPE_CHECKING:
    from server.state.cluster import ClusterState


@dataclass(frozen=True)
class ResourceRow:
    resource: str
    nominal: float | None  # None: not metered
    borrowing_limit: float | None  # None: no limit
    lending_limit: float | None
    used: float
    borrowed: float
    lent: float


@dataclass(frozen=True)
class QueueRow:
    queue: Queue
    resources: list[ResourceRow]
    pending: int
    running: int
    parked: int  # queued but not for placement: held, or waiting for the jobs they run after
    share: float  # weighted dominant share (current and decayed past use)
    dominant: float  # unweighted dominant share
    entitled: float  # the part of the cluster its weight entitles it to among active queues
    open_jobs: int = 0  # jobs not ended (what its submission limits count)
    open_by_user: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueUser:
    """One user of a queue: what the user's jobs of it hold now, their decayed past use
    (kept while the queue has fair share between its users), and the jobs not ended."""

    user: str
    gpus: float
    jobs: int
    past_gpus: float
    past_jobs: float
    open_jobs: int


def queue_users(state: ClusterState, name: str, now: float, half_life_s: float) -> list[QueueUser]:
    """The queue's users in the users' fair order (scheduling.userfair: least held, past
    use counted, first), whoever holds, has used or has jobs not ended in it."""
    gpus = state.user_usage.get(name, {})
    live = {user: n for (q, user), n in state.user_live.as_dict().items() if q == name}
    past_gpus, past_jobs = fairshare.past_users(state.queue_past.get(name), now, half_life_s)
    opened = state.open_jobs.users(name)
    out = [QueueUser(user=u, gpus=gpus.get(u, 0.0), jobs=live.get(u, 0), past_gpus=past_gpus.get(u, 0.0),
                     past_jobs=past_jobs.get(u, 0.0), open_jobs=opened.get(u, 0))
           for u in set(gpus) | set(live) | set(past_gpus) | set(past_jobs) | set(opened)]
    return sorted(out, key=lambda x: (x.gpus + x.past_gpus, x.jobs + x.past_jobs, x.user))


@dataclass(frozen=True)
class QueueReason:
    reason: str
    detail: str


def queues(state: ClusterState) -> dict[str, Queue]:
    out = dict(state.queues)
    out.setdefault(DEFAULT_QUEUE, implicit_default_queue())
    return out


def book(state: ClusterState) -> QueueBook:
    return QueueBook(queues(state), state.queue_usage)


def shares(state: ClusterState, b: QueueBook, now: float, half_life_s: float) -> fairshare.Shares:
    past = {q: fairshare.past_allocation(rec, now, half_life_s) for q, rec in state.queue_past.items()}
    return fairshare.Shares(b, state.capacity_at(now), past)


def active(state: ClusterState) -> list[str]:
    """Queues holding something or with jobs waiting."""
    return sorted(set(state.backlog.counts())
                  | {q for q, live in state.queue_live.items() if live})


def fairness(state: ClusterState, now: float) -> tuple[float, int]:
    """How fairly the queues with jobs waiting for placement (not held, not waiting for
    others, not before a begin time or a back-off still ahead at `now`) hold the cluster
    now (scheduling.fairshare.fairness), and how many they are."""
    waiting = sorted(q for q, n in state.backlog.eligible_counts(now).items() if n > 0)
    return fairshare.fairness(book(state), state.capacity_at(now), waiting), len(waiting)


def rows(state: ClusterState, now: float, half_life_s: float) -> list[QueueRow]:
    b = book(state)
    s = shares(state, b, now, half_life_s)
    act = active(state)
    # Jobs not to be placed before a begin time or a back-off still ahead are parked, not
    # pending (found by exploring: a job to begin in 2 h counted as its queue's pending).
    eligible = state.backlog.eligible_counts(now)
    out = []
    for name, q in sorted(b.queues.items()):
        used = b.usage.get(name, {})
        borrowed = b.borrowed(name)
        lent = b.lent(name)
        names = sorted(set(q.quota) | set(used))
        res = []
        for r in names:
            rq = q.quota.get(r)
            metered = meters(q, r)
            limit = borrowing_limit(q, r) if metered else None
            res.append(ResourceRow(
                resource=r, nominal=nominal(q, r) if metered else None,
                borrowing_limit=None if limit is None or limit == float("inf") else limit,
                lending_limit=rq.lending_limit if rq is not None else None,
                used=used.get(r, 0.0), borrowed=borrowed.get(r, 0.0), lent=lent.get(r, 0.0)))
        pending = eligible.get(name, 0)
        out.append(QueueRow(queue=q, resources=res, pending=pending,
                            running=len(state.queue_live.get(name, ())),
                            parked=state.backlog.held_in(name) + state.backlog.count(name) - pending,
                            share=s.share(name),
                            dominant=s.dominant(name), entitled=s.entitled(name, act),
                            open_jobs=state.open_jobs.total(name), open_by_user=state.open_jobs.users(name)))
    return out


def _models(state: ClusterState, job: Job) -> list[str | None]:
    """The GPU models a job's demand is counted as, one at a time ([None]: it wants no GPU;
    empty: no model is known)."""
    if not job.spec.wants_gpu():
        return [None]
    return list(sorted(job.spec.models() or state.index.models()))


def admitted(state: ClusterState, job: Job, b: QueueBook | None = None) -> bool:
    """Whether the job's queue (its quota, its cohort) admits it now on a GPU model it may
    take: the one case where whether a host has room says anything more. `b`: the queue
    book, when the caller has made one (`book`)."""
    b = b or book(state)
    if b.queue(job.spec.queue) is None:
        return False
    return any(b.admits(job.spec.queue, job_demand(job.spec, m)) is None for m in _models(state, job) or [None])


def own_limits(state: ClusterState, job: Job, q: Queue | None) -> list[QueueReason]:
    """What holds a queued job back by its own limits, not the cluster's: its user's in its
    queue `q` (jobs placed or running, GPUs held; None: a queue with no record, without
    such limits) and its group's (an array's throttle, a singleton). It waits its turn:
    nothing is blocked, and its queue is not starved for it (found by exploring:
    `queue.starved` was alerted for an array waiting on its `%K`)."""
    name = job.spec.queue
    out: list[QueueReason] = []
    if q is not None and q.max_running_jobs_per_user:
        running = state.user_live.get((name, job.spec.user)) - bool(job.preempting)
        if running >= q.max_running_jobs_per_user:
            out.append(QueueReason(USER_LIMIT, f"{job.spec.user} has {running} jobs of queue {name} placed or "
                                               f"running, its per-user limit {q.max_running_jobs_per_user}"))
    if q is not None and q.max_gpus_per_user and job.spec.wants_gpu():
        holds = state.user_usage.get(name, {}).get(job.spec.user, 0.0)
        if holds + job_gpus(job.spec) > q.max_gpus_per_user + 1e-6:
            out.append(QueueReason(USER_LIMIT, f"{job.spec.user} holds {holds:g} GPUs of queue {name} + "
                                               f"{job_gpus(job.spec):g} wanted > its per-user limit "
                                               f"{q.max_gpus_per_user:g}"))
    k = groups.key(job)
    running = groups.running(job, state.group_live.get(k), state.named_live.get((job.spec.user, job.spec.name))) \
        if k is not None else 0
    if groups.waits(job, running):
        out.append(QueueReason(GROUP_LIMIT, groups.wait_text(job, running)))
    return out


def reasons(state: ClusterState, job: Job, now: float, half_life_s: float,
            gang_fits_whole: bool | None = None, fits_now: bool | None = None,
            reserved_for: Sequence[Job] = (), b: QueueBook | None = None,
            closing: Sequence[str] = ()) -> list[QueueReason]:
    """Why a queued job waits, at queue level: it is held, waits for the jobs it runs
    after, or may not be placed yet (its begin time, a retry backoff), each said, and
    nothing else; its queue is missing; it waits for the
    victims it preempted to stop; its queue is over quota or its cohort exhausted; a gang
    that fits task by task but not whole (`gang_fits_whole` False, computed by the
    caller); its quota admits it but no host has room (`fits_now` False, computed by the
    caller) and the preemption that could make room waits (reclaim or priority: off, or
    the victims younger than their minimum runtime); it holds a reservation, or the only
    hosts with room are reserved for the jobs `reserved_for` (worked out by the caller), or are
    the hosts `closing` for maintenance before its time limit would end it; or it waits its
    turn by fair share (with the queue's figures)."""
    if job.state is not JobState.QUEUED:
        return []
    # Held, waiting for other jobs, not to be placed before a time: each says so (a held
    # job's begin time too), and nothing else is looked at.
    parked: list[QueueReason] = []
    if job.hold:
        parked.append(QueueReason(HELD, f"{job.hold}; not considered for placement until released"))
    if job.waiting_for:
        end = dependencies.needs(job.spec)
        parked.append(QueueReason(DEPENDENCY, f"{', '.join(job.waiting_for)} {end} (of the "
                                              f"{len(job.spec.depends_on)} it runs after); not considered for "
                                              "placement until then"))
    if job.not_before > now:
        parked.append(QueueReason(NOT_YET, not_yet_text(job, now)))
    if parked:
        return parked
    b = b or book(state)
    name = job.spec.queue
    q = b.queue(name)
    if q is None:
        return [QueueReason(UNKNOWN_QUEUE, f"no queue named {name!r}: the job waits until one is created")]
    conflict = label_conflict(job.spec, q)
    if conflict:
        return [QueueReason(LABEL_CONFLICT, f"{conflict}: it waits until the queue's or its own labels change")]
    out = own_limits(state, job, q)
    if job.preempting:
        stopping = 0
        future = b.copy()  # the book once its victims have stopped, as the planner decides on it
        for entry in job.preempting:
            vid, _, number = entry.rpartition(":")
            v = state.jobs.get(vid)
            live = [a for a in v.attempts if str(a.number) == number and not a.state.terminal] if v else []
            if v is not None and live:
                stopping += 1
                for a in live:
                    future.give(v.spec.queue, task_demand(v.spec, a.gpu_model))
        if stopping:
            out.append(QueueReason(PREEMPTION_GRACE, f"{stopping} preempted job(s) stopping (grace up to "
                                                     f"{_grace(state, job):g} s)"))
            b = future  # (found by exploring: the victims stopping were counted as refusing it)
    models = _models(state, job)
    refusals = [b.admits(name, job_demand(job.spec, m)) for m in models or [None]]
    if all(r is not None for r in refusals):
        # The refusal shown: on a model the queue has a quota of first (as the planner's
        # `restrict` tells it; found by exploring: a job of an H100 queue was told of A100,
        # which it has no quota of), a drained cohort before an own limit.
        ranked = sorted(zip(models or [None], refusals, strict=True),
                        key=lambda mr: (mr[0] is not None and nominal(q, "gpu:" + mr[0]) <= 0,
                                        mr[1] is None or mr[1].reason != COHORT_EXHAUSTED))
        r = ranked[0][1]
        assert r is not None
        label = COHORT_EXHAUSTED if r.reason == COHORT_EXHAUSTED else (
            OVER_QUOTA if r.reason == OVER_QUOTA else r.reason)
        out.append(QueueReason(label, r.detail()))
        if r.reason == COHORT_EXHAUSTED and not job.preempting:
            out.extend(_reclaim_waits(state, b, q, r.resource, now))
        if not job.preempting:
            out.extend(_priority_waits(state, q, job, now))
    elif fits_now is False and not job.preempting:
        # Its quota admits it but no host has room: what preemption could free, and why
        # it has not yet (reclaim for a queue within its nominal quota, priority within it).
        # A gang that does not fit whole says so first: it is why no host has room.
        if gang_fits_whole is False:
            out.append(_gang_whole(job))
        for m in models:
            demand = job_demand(job.spec, m)
            if b.admits(name, demand) is None and b.within_nominal(name, demand):
                for res in sorted(x for x in demand if demand[x] > 0 and b.meters(name, x)):
                    out.extend(w for w in _reclaim_waits(state, b, q, res, now) if w not in out)
        out.extend(_priority_waits(state, q, job, now))
    if job.reserved is not None and job.id in state.reserved:
        out.append(QueueReason(RESERVED, reservation_text(job, now)))
    holders = [j for j in reserved_for if j.reserved is not None]
    if holders:
        limit = effective_time_limit(job.spec, q)
        why = (f"its time limit of {duration_text(limit)} runs past that (allowing {maintenance.START_ALLOWANCE_S:g} s "
               f"to start and its grace of {leave_s(q.preempt_grace_s):g} s to leave)") if limit > 0 \
            else "it has no time limit"
        starts = {j.id: j.reserved.start for j in holders if j.reserved is not None}
        if len(holders) == 1:
            start = starts[holders[0].id]
            when = f"which could start there in about {max(0.0, start - now):.0f} s" if start is not None else \
                "until it starts there (when is unknown: a task there has no time limit)"
            held = f"job {holders[0].id}, {when}"
        else:
            held = "jobs " + ", ".join(
                f"{i} (could start in about {max(0.0, s - now):.0f} s)" if s is not None
                else f"{i} (start unknown: a task there has no time limit)" for i, s in starts.items())
        out.append(QueueReason(RESERVED_FOR_OTHER, f"the hosts with room for it are held for {held}; {why}, so it "
                                                   "may not use them meanwhile"))
    drained = [h for h in closing if h in state.maintenance]
    if drained:
        out.append(QueueReason(MAINTENANCE, maintenance_text(state, job, q, drained, now)))
    aside = [h for h in closing if h not in state.maintenance]
    if aside:
        out.append(QueueReason(SET_ASIDE, set_aside_text(state, job, q, aside, now)))
    if gang_fits_whole is False and _gang_whole(job) not in out:
        out.append(_gang_whole(job))
    act = active(state)
    s = shares(state, b, now, half_life_s)
    # Only the waiting queues that admission order puts before this one (a lower share per
    # weight, ties by name) keep it waiting for fair share (found by exploring: a queue at
    # none of its share, first in that order, was told it waited for fair share).
    mine = (s.share(name), name)
    ahead = [a for a in act if a != name and state.backlog.count(a) > 0 and (s.share(a), a) < mine]
    if ahead and not out:
        out.append(QueueReason(FAIR_SHARE, f"queue {name} share {s.share(name):.3f} (dominant {s.dominant(name):.3f}"
                                           f", entitled {s.entitled(name, act):.3f}); {len(ahead)} waiting queue(s) "
                                           "come first by fair share"))
    return out


def not_yet_text(job: Job, now: float) -> str:
    """When a job that may not be placed yet will be: its begin time, or its next try
    after a backoff."""
    wait = f"in about {job.not_before - now:.0f} s"
    if job.spec.begin_at and job.not_before == job.spec.begin_at:
        return f"not placed before its begin time ({wait}); not considered for placement until then"
    if any(t.stop_kind == "host" for t in job.current_tasks()):  # (retry.HOST: its host could not start it)
        return (f"its host could not start try {job.tries} (not counted): placed again {wait}, once that host's "
                "heartbeat saying so has been read")
    return f"its next try waits out the retry backoff ({wait}) after try {job.tries} ended"


def maintenance_text(state: ClusterState, job: Job, q: Queue, closing: Sequence[str], now: float) -> str:
    """Why the hosts with room for `job` are not its: drains scheduled ahead (or begun)
    that its time limit would run into (scheduling.maintenance)."""
    windows = sorted((state.maintenance[h].starts, state.maintenance[h].stops, h)
                     for h in closing if h in state.maintenance)
    if not windows:
        return "the hosts with room for it are being drained"
    starts, stops, _ = windows[0]
    hosts = ", ".join(h for _, _, h in windows[:3]) + (f" and {len(windows) - 3} more" if len(windows) > 3 else "")
    limit = effective_time_limit(job.spec, q)
    if now >= starts:
        return f"the hosts with room for it ({hosts}) are being drained for maintenance"
    why = (f"its time limit of {duration_text(limit)} runs past that (allowing {maintenance.START_ALLOWANCE_S:g} s "
           "to start)" if limit > 0 else "it has no time limit")
    return (f"the hosts with room for it ({hosts}) are drained for maintenance in about {starts - now:.0f} s, what "
            f"still runs there stopped in about {stops - now:.0f} s; {why}, so it may not start there now")


def set_aside_text(state: ClusterState, job: Job, q: Queue, hosts: Sequence[str], now: float) -> str:
    """Why the hosts with room for `job` are not its: advance reservations for other queues
    and users (scheduling.advance), open or that its time limit would run into."""
    limit = effective_time_limit(job.spec, q)
    kept = advance.SetAside(state.advance, now)
    found = {r.name: r for h in hosts for r in kept.keeping(h, job.spec.queue, job.spec.user, limit)}
    if not found:
        return "the hosts with room for it are set aside for others"
    parts = []
    for r in sorted(found.values(), key=lambda r: (r.starts, r.name))[:3]:
        queues = advance.whom(r)
        if advance.active(r, now):
            parts.append(f"advance reservation {r.name} sets {len(r.hosts)} host(s) aside for {queues} for about "
                         f"{r.ends - now:.0f} s more")
        else:
            why = (f"its time limit of {duration_text(limit)} runs past that (allowing "
                   f"{maintenance.START_ALLOWANCE_S:g} s to start)" if limit > 0 else "it has no time limit")
            parts.append(f"advance reservation {r.name} will set {len(r.hosts)} host(s) aside for {queues} in about "
                         f"{r.starts - now:.0f} s, and {why}")
    return f"the hosts with room for it are set aside: {'; '.join(parts)}"


def reservation_text(job: Job, now: float) -> str:
    """A job's reservation in words: its hosts, and when it could start there."""
    r = job.reserved
    assert r is not None
    more = f" and {r.host_count - len(r.hosts)} more" if r.host_count > len(r.hosts) else ""
    when = f"could start there in about {max(0.0, r.start - now):.0f} s, as the tasks there reach their time " \
        "limits" if r.start is not None else "could start there once a task with no time limit ends (held at " \
        "most until the reservation time runs out)"
    return f"{r.host_count} host(s) held for it ({', '.join(r.hosts)}{more}) since {max(0.0, now - r.since):.0f} s " \
        f"ago; it {when}"


def _reclaim_waits(state: ClusterState, b: QueueBook, q: Queue, resource: str, now: float) -> list[QueueReason]:
    """Why reclaim has not taken back what a job within its queue's nominal quota needs:
    reclaim is off for its queue, or the borrowers' running jobs (queues reclaim takes
    from, `reclaims_from`, above their nominal quota; unmetered queues, whose every GPU
    counts as borrowed) are all younger than their queue's minimum runtime (with when the
    first may be stopped)."""
    borrowers = [m for m in sorted(b.queues) if m != q.name and reclaims_from(q, b.queues[m])
                 and resource in b.borrowed(m)]
    if not borrowers:
        return []
    if not q.reclaim:
        return [QueueReason(RECLAIM_WAIT, f"reclaim is off for queue {q.name}: what {', '.join(borrowers)} "
                                          "borrowed comes back only as their jobs end")]
    out: list[QueueReason] = []
    for m in borrowers:
        mq = b.queue(m)
        assert mq is not None
        young = _too_young(state, mq, now)
        if young is not None:
            out.append(QueueReason(RECLAIM_WAIT, f"queue {m} borrows {resource}, but its {young}"))
    return out


def _gang_whole(job: Job) -> QueueReason:
    return QueueReason(GANG_WHOLE, f"{job.spec.replicas} tasks must be placed at once; hosts take some, not all")


def _priority_waits(state: ClusterState, q: Queue, job: Job, now: float) -> list[QueueReason]:
    """Why no lower-priority job of its own queue was stopped for a job its queue's quota
    refuses: priority preemption is off for the queue, or they are all younger than its
    minimum runtime (with when the first may be stopped)."""
    p = job.spec.priority
    lower = state.victims.below(q.name, p)
    if not lower:
        return []
    if not q.preempt_within:
        return [QueueReason(PRIORITY_WAIT, f"priority preemption is off for queue {q.name}: its {lower} "
                                           "lower-priority running job(s) are not stopped for this one")]
    young = _too_young(state, q, now, below=p)
    return [QueueReason(PRIORITY_WAIT, f"its queue's {young}")] if young is not None else []


def _too_young(state: ClusterState, q: Queue, now: float, below: int | None = None) -> str | None:
    """When every stoppable job of queue `q` (of a priority lower than `below`, when given)
    is younger than the queue's minimum runtime, and there is one: how many, and when the
    first may be stopped, in words; else None (one may be stopped now, or none runs)."""
    old = next(state.victims.cheapest(q.name, now, q.min_runtime_s), None)
    if old is not None and (below is None or old[0][0] < below):
        return None  # one may be stopped now: the next cycle looks for victims
    young, first = state.victims.young(q.name, now, q.min_runtime_s, below=below)
    if not young or first is None:
        return None
    kind = "lower-priority " if below is not None else ""
    return (f"{young} {kind}running job(s) have run less than its minimum runtime ({q.min_runtime_s:g} s): "
            f"the first may be stopped in {math.ceil(first):g} s")


def _grace(state: ClusterState, job: Job) -> float:
    """The longest grace `job`'s victims were given: each the one its tasks were told
    (their queue's when placed), or their queue's now where that is not known."""
    best = 0.0
    for entry in job.preempting:
        v = state.jobs.get(entry.rpartition(":")[0])
        if v is None:
            continue
        told = [t.grace_s for a in v.current_tasks() if (alloc := state.allocs.get(a.host_id)) is not None
                for t in alloc.tasks if t.attempt_id == a.id and t.grace_s > 0]
        if told:
            best = max(best, *told)
        else:
            vq = queue_named(state.queues, v.spec.queue)
            best = max(best, vq.preempt_grace_s if vq is not None else 0.0)
    return best
