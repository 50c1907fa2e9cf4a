"""Preemption within a cycle: the running jobs a waiting job may stop (by kind: priority,
reclaim, fair share), found cheapest first and paced, and the stops started
(server.scheduling.preemption chooses among them). Pure."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet

from server.scheduling import advance, preemption
from server.scheduling.capacity import Placer
from server.scheduling.cycle.admission import Admission, Ranked
from server.scheduling.cycle.work import PREEMPT, TIMEOUT, Work, job_event, stop_attempt
from server.scheduling.placement import check as placement_check
from server.scheduling.queues import (
    COHORT_EXHAUSTED,
    EPS,
    OVER_QUOTA,
    QueueBook,
    Refusal,
    add,
    job_usage,
    placement_spec,
    reclaims_from,
    task_demand,
)
from wire.budgets import MAX_PREEMPTING, clip_start, text_limits
from wire.messages import AdvanceReservation, Job, JobSpec, Queue, Task


def _victim_try(entry: str) -> tuple[str, int]:
    job_id, _, number = entry.rpartition(":")
    return job_id, int(number) if number.isdigit() else 0


def takes_from_others(w: Work, job: Job) -> bool:
    """Whether a preemptor waits for a victim of another queue (reclaim, fair share), not
    only for its own queue's (priority). A victim whose record is gone counts as another's."""
    for entry in job.preempting:
        victim = w.latest(_victim_try(entry)[0])
        if victim is None or victim.spec.queue != job.spec.queue:
            return True
    return False


def victims_live(w: Work, job: Job) -> tuple[bool, set[str]]:
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


def foresee(w: Work, adm: Admission, job: Job) -> None:
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


def running_by_cost(w: Work, adm: Admission, qn: str, now: float) -> Ranked:
    """The running jobs of queue `qn` that could be stopped this cycle, cheapest first
    (preemption.Victim.cost), with what each holds: not frozen, every task started and
    none stopping, past the queue's minimum runtime. One reading a cycle, from the order
    the cluster state keeps (scheduling.victimindex); whatever the cycle changes (victims
    chosen, reports) is left out by the reader."""
    hit = adm.running.get(qn)
    if hit is not None:
        return hit
    vq = adm.book.queue(qn)
    ending(w, adm, now)
    ranked = adm.running[qn] = Ranked(_unfrozen(w, w.state.victims.cheapest(qn, now, vq.min_runtime_s,
                                                                              vq.preempt_grace_s,
                                                                              adm.ends_by_queue.get(qn)))
                                       if vq is not None else iter(()))
    return ranked


def ending(w: Work, adm: Admission, now: float) -> dict[str, tuple[float, float]]:
    """The running jobs that end by themselves within the longest grace of any queue
    (`Admission.ends`, worked out once a cycle): job id -> (when its try reaches its time
    limit, when the control plane stops it anyway: its host's drain deadline, or the start
    of an advance reservation that sets its host aside from it; inf: none). A victim among
    them loses nothing when its own queue's grace reaches that far (preemption.victim_cost)."""
    if adm.ends is not None:
        return adm.ends
    state = w.state
    horizon = now + max((q.preempt_grace_s for q in adm.book.queues.values()), default=0.0)
    limits: dict[str, float] = dict(state.deadlines.until(horizon))
    stops: dict[str, float] = {}

    def stopped(host_id: str, at: float, only: AdvanceReservation | None = None) -> None:
        alloc = state.allocs.get(host_id)
        for t in alloc.tasks if alloc is not None else ():
            if t.stop:
                continue
            if only is not None:
                job = state.jobs.get(t.job_id)
                if job is None or advance.admits(only, job.spec.queue, job.spec.user):
                    continue
            if at < stops.get(t.job_id, math.inf):
                stops[t.job_id] = at

    for host_id, cfg in state.hostcfg.items():
        if cfg.draining and cfg.drain_deadline <= horizon:
            stopped(host_id, cfg.drain_deadline)
    for r in state.advance.values():
        if r.starts <= horizon and not advance.over(r, now):
            for host_id in state.set_aside_work.hosts(r.name):
                stopped(host_id, r.starts, r)
    ends = adm.ends = {}
    for job_id in limits.keys() | stops.keys():
        f = state.victims.facts.get(job_id)
        if f is None:
            continue  # not a job that could be stopped now
        at = ends[job_id] = (limits.get(job_id, math.inf), stops.get(job_id, math.inf))
        adm.ends_by_queue.setdefault(f.queue, {})[job_id] = min(at)
    return ends


def _unfrozen(w: Work, ranked: Iterator[tuple[tuple[int, float, float, str], str]]
              ) -> Iterator[tuple[tuple[int, float, float, str], Job]]:
    jobs, frozen = w.state.jobs, w.frozen_jobs
    for cost, job_id in ranked:
        if job_id not in frozen and (job := jobs.get(job_id)) is not None:
            yield cost, job


def _candidates(w: Work, adm: Admission, req: preemption.Request, kind: str, now: float,
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
        pools.append(running_by_cost(w, adm, qn, now))
    out: list[preemption.Victim] = []
    for cost, job in heapq.merge(*pools, key=lambda x: x[0]):
        if kind == preemption.PRIORITY and cost[0] >= req.priority:
            break  # the rest are of the preemptor's priority or higher (the cost starts with it)
        v = _victim(w, adm, job, wanted, now)
        if v is not None:
            out.append(v)
            if len(out) >= limit:
                break
    return out


def paced(left: int, limit: int) -> int:
    """How many victims a preemption limit allows now: what is left of it, or, while none
    of it is used, up to one job's most: the limits pace preemptions rather than cap one,
    so a gang on hosts of small jobs that needs more victims than a limit is not starved."""
    return max(left, MAX_PREEMPTING) if 0 < limit <= left else left


def _lenders(book: QueueBook, name: str, q: Queue) -> list[str]:
    """The queues reclaim for queue `name` (`q`) may take from (`reclaims_from`)."""
    return [n for n, c in book.queues.items() if n != name and reclaims_from(q, c)]


def borrowed_from(adm: Admission, job: Job, q: Queue) -> bool:
    """Whether a queue that reclaim for `job` could take from holds more than its nominal
    quota of a resource the job wants (an unmetered one: any of it), in the book as it
    will be once the preemptions under way are done."""
    book = adm.future
    wanted = [r for r, v in adm.demand(job).items() if v > 0]
    return any(book.over_nominal(n, wanted) and any(book.used(n, r) > EPS for r in wanted)
               for n in _lenders(book, job.spec.queue, q))


def _victim(w: Work, adm: Admission, job: Job, wanted: AbstractSet[str], now: float) -> preemption.Victim | None:
    """A running job as a victim: None when this cycle changed it (a victim already, or a
    report), it holds none of `wanted` (when given), a task of it is on a host a commit in
    flight writes, or one is stopping already."""
    if job.id in w.plan.jobs:
        return None
    read = adm.victims
    v = read[job.id] if job.id in read else read.setdefault(job.id, _as_victim(w, adm, job, now))
    if v is None or wanted and not any(r in wanted for r in v.usage):
        return None
    return v


def _as_victim(w: Work, adm: Admission, job: Job, now: float) -> preemption.Victim | None:
    """What `_victim` reads of a job, whatever the cycle has changed since and whatever is
    wanted: a cycle reads it once (Admission.victims)."""
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
    q = adm.book.queue(job.spec.queue)  # the implicit default queue too: the grace a victim index read uses
    grace = q.preempt_grace_s if q is not None else 0.0
    cap = preemption.checkpoint_cap(job.spec.checkpoints, grace)
    limit_at, stopped_at = ending(w, adm, now).get(job.id, (math.inf, math.inf))
    # The grace its stop would give it is the one its tries were told when placed (its
    # queue's then; 0: the agent's default, unknown here, so its queue's now): whether it
    # ends by itself within it is judged by that (found by a review: by its queue's grace
    # now, raised since, a try was taken to reach its limit within a grace it was not given).
    told = min((task.grace_s if task.grace_s > 0 else grace for _h, task in where), default=grace)
    return preemption.Victim(job.id, job.spec.queue, job.spec.priority, since, job.submitted_at, job_usage(job),
                             tuple(where), cap, limit_at, stopped_at, told)


class _HostVictims:
    """preemption.Hosts over this cycle: the jobs on a host that could be stopped, and
    whether one task of `spec` fits there once some are (on a copy of the host)."""

    def __init__(self, w: Work, adm: Admission, placer: Placer, spec: JobSpec, wanted: AbstractSet[str],
                 now: float) -> None:
        self.w, self.adm, self.placer, self.spec, self.wanted, self.now = w, adm, placer, spec, wanted, now

    def victims_on(self, host_id: str) -> list[preemption.Victim]:
        state, frozen = self.w.state, self.w.frozen_jobs
        alloc = state.allocs.get(host_id)
        out: list[preemption.Victim] = []
        for job_id in dict.fromkeys(t.job_id for t in alloc.tasks) if alloc else ():
            job = state.jobs.get(job_id)
            if job is None or job_id in frozen or preemption.stoppable(job) is None:
                continue
            v = _victim(self.w, self.adm, job, self.wanted, self.now)
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


class _Fits:
    """Whether one waiting job fits on the hosts were some victims stopped, and where
    (preemption.Fit): on a what-if copy of the cycle's placer with their tasks released.
    A search for victims asks of a list that grows by one victim at a time: while each
    list asked extends the one before, the copy is kept and only the new victims' tasks
    are released on it (a fresh copy with every task released again, each time, was the
    most of a cycle's planning with preemptions to find)."""

    def __init__(self, placer: Placer, spec: JobSpec) -> None:
        self.placer, self.spec = placer, spec
        self.trial: Placer | None = None
        self.released: list[preemption.Victim] = []

    def __call__(self, victims: list[preemption.Victim]) -> preemption.Fit:
        done = self.released
        trial = self.trial
        if trial is None or len(victims) < len(done) or any(a is not b for a, b in zip(victims, done, strict=False)):
            trial = self.trial = self.placer.fork()
            done = self.released = []
        for v in victims[len(done):]:
            for host_id, t in v.tasks:
                cap = trial.cap(host_id)
                if cap is not None:
                    cap.let_go(t)
            done.append(v)
        # What failed on the copy before failed with fewer tasks released: it says nothing now.
        trial.failed.clear()
        trial.failed_gangs.clear()
        if self.spec.replicas > 1:
            return trial.place_gang(self.spec) is not None
        choice = trial.place(self.spec)
        return frozenset((choice.host_id,)) if choice is not None else False


def preempt_for(w: Work, adm: Admission, placer: Placer, job: Job, refusal: Refusal | None, now: float,
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
    allowed = min(budget, paced(q.max_preemptions - inflight.get(job.spec.queue, 0), q.max_preemptions),
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
    found = preemption.choose(req, candidates, adm.future, adm.shares, now, _Fits(placer, spec),
                              _HostVictims(w, adm, placer, spec, wanted, now))
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
        why = f"preempted ({found.kind}) by {job.id} of queue {job.spec.queue}"
        # A try whose time limit falls within the grace is stopped for its limit: it ends
        # TIMEOUT, as it would have (not requeued to run again with a fresh limit).
        kind, told = PREEMPT, why
        number = 0
        for t in victim.current_tasks():
            if t.state.terminal:
                continue
            number = t.number
            if v.times_out(now):
                kind = TIMEOUT
                told = clip_start(f"time limit of {t.time_limit_s:g} s due within the grace: {why}",
                                  text_limits(victim.spec)[1])
            # With the grace it was told when placed (its queue's then: found by exploring, a
            # grace lowered since cut a try's checkpoint short of what its environment said).
            stop_attempt(w, t, kind, told, now)
        victim.updated_at = now
        entries.append(f"{victim.id}:{number}")
        w.plan.events.append(job_event("job.preempting", victim, victim.current, now, why))
    me.preempting = entries
    me.updated_at = now
    for v in found.victims:
        adm.future.give(v.queue, v.usage)
    adm.future.take(job.spec.queue, demand)
    key = (found.kind, job.spec.queue)
    w.plan.preempted[key] = w.plan.preempted.get(key, 0) + len(found.victims)
    w.plan.preemption_cost += sum(v.cost(now)[1] for v in found.victims)
    return len(found.victims)
