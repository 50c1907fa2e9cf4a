"""Queued jobs admitted and placed in fair-share order (`Placing`: preempting where a
queue may, within the users' and groups' limits of `limits`, holding hosts for the jobs
that wait longest through `reserving`), a placement written into the records, and the
queues' decayed use brought up to date. Pure."""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from server.scheduling import advance, fairshare, maintenance, userfair
from server.scheduling.backfill import comes_before, ends_by_host, kept_off
from server.scheduling.capacity import Placer, as_hard, placement_size
from server.scheduling.cycle.admission import Admission, at_least, refused_whole
from server.scheduling.cycle.limits import UserLimits
from server.scheduling.cycle.reserving import Reserving, record_reservations
from server.scheduling.cycle.victims import (
    borrowed_from,
    foresee,
    paced,
    preempt_for,
    takes_from_others,
    victims_live,
)
from server.scheduling.cycle.work import QueuePolicy, Work, job_event
from server.scheduling.placement import Choice
from server.scheduling.queues import (
    QueueBook,
    Refusal,
    effective_time_limit,
    gpu_amount,
    job_size,
    label_conflict,
    task_demand,
)
from wire.messages import IMMEDIATE_GRACE_S, Attempt, AttemptState, Job, JobSpec, JobState, Queue, Task


def _placed(placer: Placer, spec: JobSpec) -> list[Choice] | None:
    """Hosts for every task of `spec` (a gang's all at once), or None."""
    if spec.replicas > 1:
        return placer.place_gang(spec)
    choice = placer.place(spec)
    return [choice] if choice is not None else None


def _asks(spec: JobSpec) -> tuple[bool, ...]:
    """Which resources a job's quota is asked for (GPUs, CPUs, memory): the victims and
    lenders a job within its nominal quota waits for are looked for among them."""
    return gpu_amount(spec) > 0, spec.cpus > 0, spec.memory_mb > 0


def _no_shorter(limit_s: float, than_s: float) -> bool:
    """Whether a time limit (0: none) lets a job run at least as long as `than_s` does."""
    return limit_s <= 0 or 0 < than_s <= limit_s


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


class Placing:
    """One cycle's placement of the queued jobs: the preemptors whose victims have stopped
    first, then every queue's jobs in fair-share order, those within their queue's nominal
    quota in a first pass and those that would borrow in a second; preemption for the jobs
    that found no room, within the cycle's and each queue's limits; reservations for those
    that waited longest (`reserving`)."""

    def __init__(self, w: Work, placer: Placer, now: float, term: int, max_keys: int, placements: int | None,
                 skip: Collection[str], policy: QueuePolicy) -> None:
        self.w, self.placer, self.now, self.term, self.max_keys = w, placer, now, term, max_keys
        self.placements, self.skip, self.policy = placements, skip, policy
        adm = self.adm = Admission(w, now, policy)
        self.book = adm.book
        state = self.state = w.state
        self._queued()
        self._preemptors()
        # Hosts kept for preemptors, counted once per preemptor keeping each: a host is let
        # go as soon as the last preemptor keeping it is placed or gives up, so that what its
        # victims freed beyond that preemptor's need goes to other jobs in the same cycle.
        self.keeping = Counter(h for hosts in self.held.values() for h in hosts)
        self.kept = set(self.keeping)
        self.keeps = dict(self.held)  # preemptors not yet placed nor given up
        self.closing = maintenance.KeptOff(state.maintenance, now)  # by time limit: hosts a window keeps
        self.set_aside = advance.SetAside(state.advance, now)  # by queue and time limit: hosts set aside for others
        self.limits = UserLimits(w, (*self.preempting, *self.starting), now, policy)
        # The tasks on a host, each with when it is expected to have ended (this cycle's records).
        ends = ends_by_host(lambda h: w.plan.allocs.get(h) or state.allocs.get(h), w.latest, state.deadlines, now)
        self.reserving = Reserving(w, adm, placer, self.limits, policy, now, skip, self.closing, self.set_aside,
                                   ends)
        # Jobs that found no room, with why their quota refused them (None: no host had
        # room), for preemption (preemptors that gave up are not): victims are looked for
        # for the first on the list, one try each, as many as the cycle has tries. So once
        # it holds that many, a job that would only join it may be passed over unlooked at.
        self.blocked: list[tuple[Job, Refusal | None]] = []
        # Per queue, the size of a job its quota refused this cycle (for jobs of any model):
        # a job at least as large in every respect is refused too, and not looked at.
        self.refused: dict[str, tuple[tuple[float, ...], Refusal]] = {}
        # Per queue, the least demand of each resource its quota refused this cycle (any
        # job's, on any model): once the list for preemption is full, a job asking at least
        # that much of one resource on every model it may take is not looked at.
        self.seen: dict[str, dict[str, float]] = {}
        # Jobs within their queue's nominal quota go first; jobs that would borrow wait for a
        # second pass, and none is placed in a cohort where a job within its nominal quota
        # waits for victims to stop (what reclaim frees is not lent out again at once).
        # A preemption within one queue (by priority) frees nothing another queue lent: it
        # holds back no borrower.
        self.deferred: dict[str, list[Job]] = {}
        # The cohorts that lend nothing new this cycle (`starved`): those where a preemption
        # under way waits for other queues' victims to stop, and those where jobs within
        # their nominal quota found no room and wait for a reclaim this cycle
        # (`wait_for_reclaim`; per cohort, those jobs): once the reclaim for each of them has
        # found no victims, the cohort lends again (what is free would otherwise stay idle
        # for nothing).
        self.preempted_in: set[str | None] = set()
        self.reclaim_for: dict[str, set[str]] = {}
        ready_ids = {r.id for r in self.ready}
        for job in [*self.preempting, *self.starting]:
            if job.id not in ready_ids and takes_from_others(w, job):
                q = adm.queue(job)
                self.preempted_in.add(q.cohort if q is not None else None)
        # Per queue, the size of a job (of any model) that would borrow: one at least as large
        # would too, and waits for the second pass without its demand being worked out.
        self.borrows: dict[str, tuple[float, ...]] = {}
        # Per queue, in one pass: the task size (`placement_size`), time limit and the
        # resources asked (`_asks`) of a job of any model wanting GPUs that found no host,
        # with no hosts of its own (not a preemptor's, no reservation of its own, no
        # advance reservation's). A later job of the queue as hard to place, running no
        # shorter and asking the same resources finds none either: every host held back
        # from the first is held back from it (hosts kept for preemptors, reserved for
        # others, kept off by maintenance windows by time limit), placements only take,
        # and whether its cohort waits for reclaim is decided on the same resources.
        # Forgotten whenever a job is placed (a reserved job placed gives up the hosts of
        # its reservation), a preemptor's hosts are let go, and between the passes.
        self.no_room: dict[str, tuple[tuple[Any, ...], float, tuple[bool, ...]]] = {}
        self.within = True  # in the first pass
        self.budget = policy.preemptions_per_cycle
        self.tries = 2 * policy.preemptions_per_cycle  # jobs a cycle looks for victims for, found or not
        self.gave_up: set[str] = set()
        # Queues with fair share between their users: their jobs in the users' order, from
        # what each user holds as the cycle begins (scheduling.userfair).
        for qn, queued in self.by_queue.items():
            fq = self.book.queue(qn)
            if fq is not None and fq.fair_share_users:
                self.by_queue[qn] = userfair.interleaved(queued, self.limits.user_load(qn))

    def _queued(self) -> None:
        """The queued jobs: each queue's in its order as the state keeps it (scheduling.backlog),
        with this cycle's changes (jobs it requeued or took out of the queue)."""
        w = self.w
        backlog, changed, jobs = w.state.backlog, w.plan.jobs, w.state.jobs
        # A queue this cycle changed no job of is the state's list as it stands (kept by the
        # backlog between cycles; never changed here: jobs put back go to fresh lists).
        lists: dict[str, list[Job]] = {}
        changed_queues = {j.spec.queue for j in changed.values()}
        for qn in backlog.order:
            listed = backlog.jobs_of(qn, jobs)
            lists[qn] = [j for j in listed if j.id not in changed] if qn in changed_queues else listed
        # (Not one a commit in flight places or ends: its record there counts, as any
        # other job's, in the queues' books and the users' limits.)
        pending = w.pending
        self.preempting = [jobs[i] for i in backlog.preempting
                           if i not in changed and (i not in pending or _still_preempting(pending[i]))]
        self.added: dict[str, list[Job]] = {}  # queue -> jobs this cycle put back in it
        for j in changed.values():
            if j.state is JobState.QUEUED and not j.hold and not j.waiting_for:
                if j.preempting:
                    self.preempting.append(j)
                else:
                    bisect.insort(lists.setdefault(j.spec.queue, []), j, key=fairshare.order_key)
                    self.added.setdefault(j.spec.queue, []).append(j)
        # (In queues with fair share between their users, the users' order: set once the
        # users' holdings are tallied.)
        self.by_queue: dict[str, Sequence[Job]] = {qn: js for qn, js in lists.items() if js}
        # Per queue, the smallest size of any of its jobs in each respect (None when one of
        # them names GPU models): a refusal or a borrow at most that large covers them all.
        # The state's figure may count jobs this cycle took out of the queue: a floor no
        # higher than the true one, which only ever covers less.
        self.least: dict[str, tuple[float, ...] | None] = {}

    def _preemptors(self) -> None:
        """Jobs that preempted others: wait while their victims stop; once all have, they
        are placed before anything else, and the hosts the victims held are kept for them."""
        w, adm = self.w, self.adm
        self.ready: list[Job] = []
        self.held: dict[str, set[str]] = {}
        self.waiting: set[str] = set()  # hosts of victims still stopping
        self.inflight: dict[str, int] = {}
        for job in self.preempting:
            live, hosts = victims_live(w, job)
            self.held[job.id] = hosts
            foresee(w, adm, job)
            if live:
                self.waiting |= hosts
                self.inflight[job.spec.queue] = self.inflight.get(job.spec.queue, 0) + len(job.preempting)
                continue
            self.ready.append(job)
        # Preemptions the commits in flight start count as under way too (their victims and
        # hosts are frozen, so none is chosen twice): in the future book, the queues' limits
        # and the cohorts that lend nothing new meanwhile.
        self.starting = [j for j in w.pending.values()
                         if _still_preempting(j) and j.id not in w.state.backlog.preempting]
        for job in self.starting:
            foresee(w, adm, job)
            self.inflight[job.spec.queue] = self.inflight.get(job.spec.queue, 0) + len(job.preempting)
        self.ready.sort(key=lambda j: (j.submitted_at, j.id))

    # ------------------------------------------------------------ preemptors' hosts

    def let_go_of(self, job: Job) -> None:
        self.no_room.clear()
        for h in self.keeps.pop(job.id, ()):
            self.keeping[h] -= 1
            if not self.keeping[h]:
                self.kept.discard(h)

    def give_up(self, job: Job) -> None:
        """A preemptor that cannot be placed: its preemption is forgotten, its hosts let go."""
        _forget_preemption(self.w, job, self.now)
        self.let_go_of(job)

    # ------------------------------------------------------------ shortcuts

    def below_a_refusal(self, job: Job) -> bool:
        """At least as large as a job its queue's quota refused this cycle (for jobs of any
        model): refused too, unlooked at (placements only take, so it stays refused); kept
        for preemption while the cycle may still look for victims."""
        if job.preempting:
            return False  # a preemptor is looked at: it gives up if it cannot be placed
        qn = job.spec.queue
        floor = self.refused.get(qn)
        if floor is None or job.spec.models() is not None or not at_least(job_size(job.spec), floor[0]):
            hit = self.seen.get(qn)
            return hit is not None and self.list_full() and \
                refused_whole(hit, job_size(job.spec), self.adm.models_of(qn, job.spec))
        if not self.list_full() and job.not_before <= self.now \
                and job.id not in self.w.frozen_jobs and job.id not in self.skip:
            self.blocked.append((job, floor[1]))
        return True

    def list_full(self) -> bool:
        """Whether the list for preemption holds as many jobs as a cycle has tries: a job
        that would only join it gets none (`blocked`)."""
        return len(self.blocked) >= 2 * self.policy.preemptions_per_cycle

    def passing_over(self) -> bool:
        """Whether jobs that would find no host may be passed over unlooked at: the list for
        preemption is full and no more reservations can be made this cycle (such a job
        would change neither)."""
        return self.list_full() and not self.reserving.open()

    def holds_own(self, job: Job) -> bool:
        """Whether some hosts are the job's own this cycle: a preemptor's (its victims'), or
        those of its reservation."""
        return bool(job.preempting) or job.id in self.held or job.id in self.reserving.made

    def below_no_room(self, job: Job, q: Queue) -> bool:
        """Once the list for preemption is full and no more reservations can be made this
        cycle: a job at least as hard to place as one of its queue that found no host in
        this pass (`no_room`), no shorter, asking the same resources, with no hosts of its
        own. It would find none, and change nothing more by it: not looked at (its hosts
        held back and its quota not worked out)."""
        floor = self.no_room.get(job.spec.queue) if self.no_room else None
        if floor is None or not self.passing_over() or self.holds_own(job):
            return False
        size, limit, asks = floor
        mine = effective_time_limit(job.spec, q)
        return _no_shorter(mine, limit) and _asks(job.spec) == asks \
            and as_hard(placement_size(job.spec, job.spec.models()), size)

    def found_no_room(self, job: Job, spec: JobSpec, q: Queue) -> None:
        """`job` (placed as `spec`) found no host: once jobs are passed over for it, its
        queue's `no_room` if nothing of its hosts was its own, its queue narrowed none of
        its models, and it says more than the queue's `no_room` so far (no larger, running
        no longer, asking as much)."""
        if self.set_aside or not self.passing_over() or self.holds_own(job) or spec.replicas != 1 \
                or spec.models() is not None or job.spec.models() is not None or not spec.wants_gpu():
            return
        size, limit, asks = placement_size(job.spec, None), effective_time_limit(job.spec, q), _asks(job.spec)
        old = self.no_room.get(job.spec.queue)
        if old is None or (old[2] == asks and as_hard(old[0], size) and _no_shorter(old[1], limit)):
            self.no_room[job.spec.queue] = (size, limit, asks)

    def lowest(self, qn: str) -> tuple[float, ...] | None:
        """The smallest of queue `qn`'s jobs in each respect (None: one names GPU models)."""
        if qn not in self.least:
            low = self.state.backlog.least(qn) if self.by_queue.get(qn) else None
            more = self.added.get(qn, [])
            if low is not None and any(j.spec.models() is not None for j in more):
                low = None
            if low is not None and more:
                low = tuple(min(col) for col in zip(low, *(job_size(j.spec) for j in more), strict=True))
            self.least[qn] = low
        return self.least[qn]

    def covers(self, floor: tuple[float, ...] | None, qn: str) -> bool:
        """Whether every job of queue `qn` is at least as large as `floor`."""
        if floor is None:
            return False
        low = self.lowest(qn)
        return low is not None and at_least(low, floor)

    def refused_rest(self, qn: str, i: int) -> bool:
        """Once the list for preemption is full, a queue whose every job is below a refusal
        is left at once: each of its jobs would be skipped."""
        if not self.list_full():
            return False
        hit = self.refused.get(qn)
        if hit is not None and self.covers(hit[0], qn):
            return True
        seen = self.seen.get(qn)
        low = self.lowest(qn) if seen else None
        return seen is not None and low is not None and refused_whole(seen, low, self.adm.models_of(qn, None))

    def first_rest(self, qn: str, i: int) -> bool:
        """Each of the queue's jobs from the i-th on would borrow (one at least as large as
        each did, or the smallest would): all wait for the second pass."""
        if self.covers(self.borrows.get(qn), qn) or ((low := self.lowest(qn)) is not None
                                                     and self.adm.borrows(qn, low)):
            self.deferred.setdefault(qn, []).extend(self.by_queue[qn][i:])
            return True
        return False

    # ------------------------------------------------------------ the order

    def first_pass(self) -> Iterator[Job]:
        yield from self.ready
        shortcuts = self.policy.shortcuts
        for job in fairshare.admission_order(self.by_queue, self.adm.shares.share,
                                             self.first_rest if shortcuts else None):
            qn = job.spec.queue
            size = job_size(job.spec)
            floor = self.borrows.get(qn)
            unconstrained = job.spec.models() is None and shortcuts
            if (unconstrained and floor is not None and at_least(size, floor)) \
                    or self.book.would_borrow(qn, self.adm.demand(job)):
                self.deferred.setdefault(qn, []).append(job)
                if unconstrained and (floor is None or at_least(floor, size)):
                    self.borrows[qn] = size  # the smallest known to borrow
            else:
                yield job

    def starved(self) -> set[str | None]:
        """The cohorts waiting for other queues' victims to stop: a preemption under way, or
        a job within its nominal quota waiting for a reclaim that has not (yet) been found
        to have no victims."""
        return self.preempted_in | {c for c, jobs in self.reclaim_for.items() if jobs}

    def second_pass(self) -> Iterator[Job]:
        book, starved = self.book, self.starved()

        def lends(name: str) -> bool:
            q = book.queue(name)
            return q is None or not starved or (q.cohort not in starved and bool(q.quota))

        yield from fairshare.admission_order({n: js for n, js in self.deferred.items() if lends(n)},
                                             self.adm.shares.share,
                                             self.refused_rest if self.policy.shortcuts else None)

    def order(self) -> Iterator[Job]:
        yield from self.first_pass()
        if self.budget > 0:
            self.preempt_blocked()
        self.within = False
        self.no_room.clear()
        yield from self.second_pass()

    def wait_for_reclaim(self, job: Job) -> None:
        """A job within its queue's nominal quota found no room: what borrowers would take
        now is what reclaim will take back, so the cohort lends nothing new this cycle;
        unless no queue reclaim takes from borrows what the job wants. Then room can come
        only from jobs ending, and what is free now (too little, or too scattered, for the
        job) is lent: a borrower placed now is what a later reclaim takes back."""
        q = self.adm.queue(job)
        if self.within and q is not None and q.reclaim and q.cohort is not None \
                and (q.cohort in self.reclaim_for or q.cohort not in self.preempted_in) \
                and borrowed_from(self.adm, job, q):
            self.reclaim_for.setdefault(q.cohort, set()).add(job.id)

    # ------------------------------------------------------------ where a job may go

    def exclusion(self, job: Job, q: Queue | None) -> AbstractSet[str]:
        """The hosts `job` may not take this cycle. Hosts kept for preemptors: a preemptor
        whose victims have stopped may use any but those still stopping for others; any
        other job none of them. Hosts reserved for another job, unless this one's time
        limit ends it by then (or, wanting no GPU, it leaves what the reserved job needs).
        And hosts a maintenance window will drain before its time limit would end it, or
        an advance reservation for other queues sets aside (open, or its limit running into
        it). A set shared with other jobs when one alone holds them all (a large maintenance
        window or reservation is not copied for every job)."""
        held = self.held
        parts: list[AbstractSet[str]] = [frozenset((self.waiting - held[job.id]) if job.id in held else self.kept)]
        reservations = self.reserving.made
        if reservations or self.state.maintenance or self.set_aside:
            limit = effective_time_limit(job.spec, q)
            parts.append(self.closing(limit))  # maintenance windows its time limit would run into
            parts.append(self.set_aside(job.spec.queue, job.spec.user, limit))
            for r in reservations.values():
                if r.job_id != job.id:
                    held_for = self.w.latest(r.job_id)
                    if held_for is not None and comes_before(job, held_for, self.adm.shares.share):
                        continue  # a reservation holds only against the jobs after its own
                    parts.append(kept_off(job.spec, limit, self.now, r, held_for.spec if held_for else None,
                                          self.placer.view, q.preempt_grace_s if q is not None else 0.0))
        parts = [p for p in parts if p]
        if len(parts) <= 1:
            return parts[0] if parts else frozenset()
        return frozenset().union(*parts)

    # ------------------------------------------------------------ preemption

    def preempt_blocked(self) -> None:
        """Preemption, for the jobs that could not be placed, in admission order, within
        the cycle's and each queue's limits."""
        w, adm, policy = self.w, self.adm, self.policy
        self.gave_up.update(j for j in self.held if j in w.plan.jobs and not w.plan.jobs[j].preempting)
        for job, refusal in self.blocked:
            if self.budget <= 0 or self.tries <= 0 or w.plan.keys + 4 > self.max_keys:
                break
            if job.id in w.frozen_jobs or job.id in self.skip or job.id in self.gave_up or w.busy(job.id) \
                    or job.not_before > self.now:
                continue
            current = w.plan.jobs.get(job.id, job)
            if current.state is not JobState.QUEUED or current.preempting:
                continue
            cq = adm.queue(current)
            self.tries -= 1  # a try, even if the job's limits hold it back by now: the first on the list get them
            if self.limits.waits(current, cq):
                continue
            self.placer.exclude = self.exclusion(current, cq)  # its victims are looked for where it may go
            n = preempt_for(w, adm, self.placer, current, refusal, self.now, self.max_keys,
                            paced(self.budget, policy.preemptions_per_cycle), self.inflight)
            cohort = cq.cohort if cq is not None else None
            if n:
                self.limits.claim(current, cq)
                self.budget -= n
                self.inflight[job.spec.queue] = self.inflight.get(job.spec.queue, 0) + n
                preemptor = w.latest(job.id)
                if preemptor is not None and takes_from_others(w, preemptor):
                    self.preempted_in.add(cohort)
            elif cohort is not None and job.id in self.reclaim_for.get(cohort, ()):
                # No victims make room for it (the borrowers hold too little, or where it
                # cannot go): its cohort need not keep what is free from borrowers for it
                # (found by a benchmark: GPUs stood idle, outside any grace, for a reclaim
                # that could not come).
                self.reclaim_for[cohort].discard(job.id)
        self.blocked.clear()

    # ------------------------------------------------------------ the cycle's placements

    def run(self) -> None:
        w, placer, now, max_keys, limits = self.w, self.placer, self.now, self.max_keys, self.limits
        reserving = self.reserving
        # Read once: the loop below runs for every queued job a cycle looks at.
        plan, frozen, skip, placements = w.plan, w.frozen_jobs, self.skip, self.placements
        queue_of, restrict, waits = self.adm.queue, self.adm.restrict, limits.waits
        below_a_refusal, exclusion, blocked = self.below_a_refusal, self.exclusion, self.blocked
        seen, refused, shortcuts = self.seen, self.refused, self.policy.shortcuts
        complete = True  # every queued job looked at (no break): a reservation not made is none
        for job in self.order():
            if plan.keys + 2 > max_keys or (placements is not None and plan.placed >= placements):
                complete = False
                break
            if job.id in frozen or job.id in skip:
                continue
            if plan.keys + 1 + job.spec.replicas > max_keys:
                continue  # a gang too large for what is left of this commit: next cycle
            if job.not_before > now:
                continue
            q = queue_of(job)
            if q is None:
                continue  # its queue was deleted: it waits until one of that name exists
            if label_conflict(job.spec, q):  # the queue moved to hosts its own labels rule out
                if job.preempting:
                    self.give_up(job)
                continue
            if waits(job, q):
                if job.preempting:
                    self.give_up(job)  # its limit changed: what its victims freed goes to others
                continue
            if (shortcuts and self.below_no_room(job, q)) or below_a_refusal(job):
                continue
            size = job_size(job.spec)
            placer.exclude = exclusion(job, q)
            spec, refusal = restrict(job, seen.setdefault(job.spec.queue, {}) if shortcuts else None)
            if spec is None:
                if job.spec.models() is None and refusal is not None and not job.preempting:
                    refused.setdefault(job.spec.queue, (size, refusal))
                if job.preempting:
                    self.give_up(job)  # (off the list for preemption: those that gave up are passed by there)
                else:
                    blocked.append((job, refusal))
                if refusal is not None and refusal.within_nominal:
                    self.wait_for_reclaim(job)
                continue
            # A job that open advance reservations admit (its queue or user) goes to their hosts first.
            own = self.set_aside.own(job.spec.queue, job.spec.user) if self.set_aside else frozenset()
            choices = placer.within(own, functools.partial(_placed, placer, spec)) if own else None
            if choices is None:
                choices = _placed(placer, spec)
            if choices is None:
                if job.preempting and self.held.get(job.id, set()) & w.frozen_hosts:
                    # A commit in flight writes a host its victims freed (a victim's end): the
                    # room is not this cycle's to see yet. It waits a cycle, keeping its hosts
                    # (found by exploring: given up, it let a victim be placed again on the
                    # freed host and preempted a third job).
                    continue
                if job.preempting:
                    self.give_up(job)
                else:
                    blocked.append((job, None))
                self.wait_for_reclaim(job)
                reserving.reserve_for(job, spec)
                if shortcuts:
                    self.found_no_room(job, spec, q)
                continue
            for c in choices:
                placer.reserve(c, spec)
            # Placed (on its reserved hosts, or where it found room first): what it left free
            # there is for the jobs after it, and its slot for another.
            reserving.made.pop(job.id, None)
            copy = w.job(job.id)
            assert copy is not None
            job = copy
            job.reserved = None
            # A preemptor's GPUs were counted as its claim, and its demand in the future book
            # (victims.foresee); another job's are counted now, in both: further preemptions
            # this cycle are decided on the future book, which must hold what the cycle placed.
            future = None if job.preempting else self.adm.future
            if not job.preempting:
                limits.claim(job, q)
            job.preempting = []
            _start_try(w, placer, self.book, job, choices, q, self.term, now, future)
            self.let_go_of(job)  # (and what no job found room for is forgotten)
        w.plan.reservations = list(reserving.made.values())  # in the order they were made
        record_reservations(w, w.plan.reservations, complete, now, max_keys, self.skip)
        if self.budget > 0:
            self.preempt_blocked()  # for the jobs of the second pass (priority preemption, above all)


def _still_preempting(job: Job) -> bool:
    """A record (a commit's in flight) of a preemptor still waiting for its victims."""
    return job.state is JobState.QUEUED and bool(job.preempting)


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
    """Place this cycle's queued jobs (`Placing`)."""
    Placing(w, placer, now, term, max_keys, placements, skip, policy or QueuePolicy()).run()


def _start_try(w: Work, placer: Placer, book: QueueBook, job: Job, choices: list[Choice], q: Queue, term: int,
               now: float, future: QueueBook | None = None) -> None:
    """Write a placement into the records: the job's next try (one attempt per task, the
    i-th task on the i-th host chosen, told the gang's size and hosts), each task on its
    host's allocation under this term, what it takes counted in its queue's book (and in
    `future`, the book preemptions are decided on, when given); the job PLACED, with its
    event."""
    number = job.tries + 1
    gang = job.spec.replicas > 1
    gang_hosts = ",".join(c.host_id for c in choices)  # task i's host is the i-th
    limit = effective_time_limit(job.spec, q)
    attempt = None
    for i, choice in enumerate(choices):
        model = _model_of(placer, choice)
        taken = task_demand(job.spec, model)
        book.take(job.spec.queue, taken)
        if future is not None:
            future.take(job.spec.queue, taken)
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
                grace_s=q.preempt_grace_s or IMMEDIATE_GRACE_S,
                uid_key=job.uid_key,
            )
        )
    job.state = JobState.PLACED
    job.updated_at = now
    assert attempt is not None
    w.plan.placed += 1
    w.plan.events.append(job_event("job.placed", job, attempt, now))


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
