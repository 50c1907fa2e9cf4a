"""Queued jobs admitted and placed in fair-share order (preempting where a queue may),
hosts reserved for the jobs that wait longest, and the queues' decayed use brought up
to date. Pure."""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from collections.abc import Set as AbstractSet

from server.scheduling import advance, fairshare, groups, maintenance, userfair
from server.scheduling.backfill import Reservation, ends_by_host, kept_off, soonest_hosts
from server.scheduling.capacity import Placer
from server.scheduling.cycle.admission import Admission, LiveTally, at_least, refused_whole
from server.scheduling.cycle.victims import borrowed_from, foresee, paced, preempt_for, victims_live
from server.scheduling.cycle.work import QueuePolicy, Work, job_event
from server.scheduling.livecounts import queue_user
from server.scheduling.placement import Choice
from server.scheduling.queues import (
    EPS,
    QueueBook,
    Refusal,
    add_user,
    effective_time_limit,
    job_gpus,
    job_size,
    label_conflict,
    task_demand,
)
from wire.messages import RESERVED_HOSTS_KEPT, Attempt, AttemptState, Job, JobSpec, JobState, Queue, Reserved, Task

# Reservations: the hosts of the jobs whose time limit comes soonest are looked at as
# well as those with the most free room (scheduling.backfill).
RESERVE_SOONEST = 32
RESERVE_TRIES = 4  # jobs a cycle looks for hosts to reserve for, past those it reserves for


def _placed(placer: Placer, spec: JobSpec) -> list[Choice] | None:
    """Hosts for every task of `spec` (a gang's all at once), or None."""
    if spec.replicas > 1:
        return placer.place_gang(spec)
    choice = placer.place(spec)
    return [choice] if choice is not None else None


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


def place_queued(
    w: Work,
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
        live, hosts = victims_live(w, job)
        held[job.id] = hosts
        foresee(w, adm, job)
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
        foresee(w, adm, job)
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
        if floor is None or job.spec.models() is not None or not at_least(job_size(job.spec), floor[0]):
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
        return low is not None and at_least(low, floor)

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
            if (unconstrained and floor is not None and at_least(size, floor)) \
                    or book.would_borrow(qn, adm.demand(job)):
                deferred.setdefault(qn, []).append(job)
                if unconstrained and (floor is None or at_least(floor, size)):
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
                and borrowed_from(adm, job, q):
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
                            paced(budget, policy.preemptions_per_cycle), inflight)
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
    in_group = LiveTally(w, state.group_live)
    user_jobs = LiveTally(w, state.user_live)

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
        _start_try(w, placer, book, job, choices, q, term, now)
        let_go_of(job)
    w.plan.reservations = list(reservations.values())  # in the order they were made
    record_reservations(w, w.plan.reservations, complete, now, max_keys, skip)
    if budget > 0:
        preempt_blocked()  # for the jobs of the second pass (priority preemption, above all)


def _start_try(w: Work, placer: Placer, book: QueueBook, job: Job, choices: list[Choice], q: Queue, term: int,
               now: float) -> None:
    """Write a placement into the records: the job's next try (one attempt per task, the
    i-th task on the i-th host chosen, told the gang's size and hosts), each task on its
    host's allocation under this term, what it takes counted in its queue's book; the job
    PLACED, with its event."""
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
    w.plan.events.append(job_event("job.placed", job, attempt, now))


# A reservation's start written again into its job's record only once it moved this much.
RESERVED_START_SLACK_S = 30.0


def record_reservations(w: Work, reservations: Sequence[Reservation], complete: bool, now: float, max_keys: int,
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


def _record(w: Work, reservation: Reservation, now: float, writable: Callable[[str], Job | None]) -> None:
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


def _forget_preemption(w: Work, job: Job, now: float) -> None:
    """A job whose victims have stopped but that still cannot be placed (the room went
    elsewhere, or its quota changed) gives up its claim: it may preempt again."""
    copy = w.job(job.id)
    if copy is not None and copy.preempting:
        copy.preempting = []
        copy.updated_at = now


def update_usage(w: Work, now: float, policy: QueuePolicy) -> None:
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
