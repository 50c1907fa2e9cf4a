"""Preemption: which running jobs to stop so that a waiting job can run. Pure: the
candidates, the queue book, a feasibility test and a clock in; the victims out.

Three kinds, each switched per queue (wire.messages.Queue):
- priority: within one queue, a job stops lower-priority jobs of the same queue;
- reclaim: a job of a queue that stays within its nominal quota stops jobs of queues
  that borrow (hold more than their nominal quota, in its cohort, or unmetered queues);
- fair share (off by default): a job stops jobs of queues over their nominal quota
  whose share stays at least as high as the preemptor's queue's share.

Rules: reclaim and fair share never take a job from a queue that is not above its
nominal quota (checked again after each victim chosen); no job younger than its queue's
`min_runtime_s` and no job already stopping is a victim; a gang is a victim as a whole.
Victims are chosen to lose the least work: lowest priority first, then the least
runtime times GPUs held (a job that checkpoints, `JobSpec.checkpoints`, loses at most its
queue's grace of it; one that ends by itself within its queue's grace, at its time limit
or by its host's drain or an advance reservation, loses nothing: stopped, one at its time
limit ends TIMEOUT); then every victim not needed for the fit is given back (most
valuable first), so the set is minimal in that order. Where the cheapest victims over every host free no
room the job fits in (spread over many hosts, none cleared), they are looked for host by
host, whole hosts' sets the cheapest first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from server.scheduling.fairshare import Shares
from server.scheduling.queues import QueueBook, Resources, gpu_amount, reclaims_from
from wire.messages import Job, JobState, Task

PRIORITY = "priority"
RECLAIM = "reclaim"
FAIR_SHARE = "fair-share"
KINDS = (PRIORITY, RECLAIM, FAIR_SHARE)
MAX_CANDIDATES = 256


@dataclass(frozen=True)
class Victim:
    """A running job that could be stopped: its queue, what it holds and where."""

    job_id: str
    queue: str
    priority: int
    started_at: float
    submitted_at: float
    usage: Resources
    tasks: tuple[tuple[str, Task], ...]  # (host, task) of each live task
    # The most seconds of work a stop loses: its queue's grace for a job that checkpoints
    # (it saves its state in the grace and resumes from it), else all it has run.
    cap: float = math.inf
    # When its try reaches its time limit, and when the control plane stops it anyway
    # (its host's drain deadline, the start of an advance reservation that sets its host
    # aside from it); its queue's grace: a victim that ends by itself within the grace
    # loses nothing by being stopped (`victim_cost`).
    limit_at: float = math.inf
    stopped_at: float = math.inf
    grace_s: float = 0.0

    def cost(self, now: float) -> tuple[int, float, float, str]:
        """Lower is cheaper to stop: low priority, then little work lost (victim_cost)."""
        gpus = sum(v for r, v in self.usage.items() if r.startswith("gpu:"))
        size = work_size(gpus, self.usage.get("cpu", 1.0))
        return victim_cost(self.priority, size, self.cap, self.started_at, self.submitted_at, self.job_id, now,
                           min(self.limit_at, self.stopped_at), self.grace_s)

    def times_out(self, now: float) -> bool:
        """Whether its time limit falls within its grace from `now`, before anything else
        stops it: stopped now, it ends TIMEOUT, as its limit would have ended it."""
        return self.limit_at < math.inf and self.limit_at <= min(now + self.grace_s, self.stopped_at)


def victim_cost(priority: int, size: float, cap: float, started_at: float, submitted_at: float, job_id: str,
                now: float, ends_at: float = math.inf, grace_s: float = 0.0) -> tuple[int, float, float, str]:
    """What stopping a running job costs at `now`, lower first: its priority, then the
    work lost, its runtime (at most `cap`, for a job that checkpoints) times its size;
    among equals the later submitted, or, among jobs that checkpoint and would each lose
    their whole cap, the later started. A job that ends by itself (`ends_at`: its time
    limit, or a stop of its host's) within `grace_s` loses nothing: left running, it
    would be told to stop before the grace of a stop told now runs out."""
    ran = now - started_at
    if ends_at < math.inf and ends_at <= now + grace_s:
        return (priority, 0.0, -submitted_at, job_id)
    if ran >= cap:
        return (priority, cap * size, -started_at, job_id)
    return (priority, ran * size, -submitted_at, job_id)


def checkpoint_cap(checkpoints: bool, grace_s: float) -> float:
    """A victim's `cap`: the grace of its queue for a job that checkpoints, else none."""
    return grace_s if checkpoints else math.inf


def work_size(gpus: float, cpus: float) -> float:
    """What a victim's runtime is multiplied by to weigh the work its stop loses: the GPUs
    its live tasks hold, or thousandths of their CPUs for a job without GPUs."""
    return gpus or cpus / 1000


def stoppable(job: Job) -> tuple[float, float] | None:
    """What a search for victims needs of a job whatever the clock, worked out when its
    record changes (server.state.cluster keeps it per running job): when its first live
    task started, and the GPUs its live tasks hold (thousandths of their CPUs for a job
    without GPUs), the size `Victim.cost` multiplies its runtime by. None when it cannot
    be stopped: not running, a live task not started yet, or one already stopping."""
    if job.state is not JobState.RUNNING:
        return None
    tasks = [t for t in job.current_tasks() if not t.state.terminal]
    started = [t.started_at for t in tasks if t.started_at is not None]
    if not tasks or len(started) < len(tasks) or any(t.stop_kind for t in tasks):
        return None
    return min(started), work_size(sum(gpu_amount(job.spec, t.gpu_model) for t in tasks),
                                   job.spec.cpus * len(tasks))


@dataclass
class Preemption:
    kind: str
    victims: list[Victim] = field(default_factory=list)


@dataclass(frozen=True)
class Request:
    """A waiting job that may preempt: its queue, priority, the resources it needs (the
    whole gang) and which kinds of preemption its queue allows now."""

    job_id: str
    queue: str
    priority: int
    demand: Resources
    kinds: tuple[str, ...]


def eligible(v: Victim, req: Request, kind: str, book: QueueBook, shares: Shares | None, now: float) -> bool:
    """Whether `v` may be stopped for `req` by `kind`, with `book` as it stands (victims
    chosen before already given back)."""
    vq = book.queue(v.queue)
    if vq is None or now - v.started_at < vq.min_runtime_s:
        return False
    if kind == PRIORITY:
        return v.queue == req.queue and v.priority < req.priority
    if v.queue == req.queue:
        return False
    relevant = [r for r in req.demand if req.demand[r] > 0 and v.usage.get(r, 0.0) > 0]
    if not relevant or not book.over_nominal(v.queue, relevant):
        return False
    if kind == RECLAIM:
        me = book.queue(req.queue)
        return me is not None and reclaims_from(me, vq)
    if kind == FAIR_SHARE:
        if shares is None:
            return False
        after = book.copy()
        after.give(v.queue, v.usage)
        after.take(req.queue, req.demand)
        s = Shares(after, shares.capacity, shares.past)
        # Shares meeting is fair; the move back would leave the other queue lower: no ping-pong.
        return s.share(v.queue) >= s.share(req.queue) - 1e-9
    return False


class Hosts(Protocol):
    """What a search for victims host by host asks of the caller."""

    def victims_on(self, host_id: str) -> Sequence[Victim]:
        """Every running job with a task on the host that could be stopped at all."""
        ...

    def room(self, host_id: str, victims: Sequence[Victim]) -> bool:
        """Whether one task of the waiting job would fit on the host were `victims` stopped."""
        ...


Fit = bool | AbstractSet[str]
"""What a placement test (`choose`'s `fits`) says of a set of victims: False, the waiting
job does not fit were they stopped; a (non-empty) set of hosts, it fits there; True, it
fits, where is not said (a gang: its placement is not known to hold wherever the hosts it
was found on stay as they are)."""


def choose(req: Request, candidates: Sequence[Victim], book: QueueBook, shares: Shares | None, now: float,
           fits: Callable[[list[Victim]], Fit], hosts: Hosts | None = None) -> Preemption | None:
    """The cheapest set of victims after whose stop `req` is admitted by its queue's quota
    and `fits` on the hosts (the caller's placement test with their tasks released), for
    the first kind (in `req.kinds` order) that finds one; None when none does.

    Victims are taken cheapest first over every host. Where that finds none, and `hosts`
    is given, host by host (`_by_host`): the cheapest victims spread over many hosts may
    never clear any one host, which a job of whole hosts (a gang of 8-GPU tasks among
    one-GPU jobs) needs."""
    ranked = sorted(candidates, key=lambda v: v.cost(now))[:MAX_CANDIDATES]
    for kind in req.kinds:
        if kind == RECLAIM and not book.within_nominal(req.queue, req.demand):
            continue  # reclaim only restores a queue's nominal quota
        found = _cheapest_first(req, kind, ranked, book, shares, now, fits)
        if found is None and hosts is not None:
            found = _by_host(req, kind, ranked, book, shares, now, fits, hosts)
        if found is None:
            continue
        return Preemption(kind, _needed(req, book, fits, *found))
    return None


def _needed(req: Request, book: QueueBook, fits: Callable[[list[Victim]], Fit], chosen: list[Victim],
            where: Fit) -> list[Victim]:
    """`chosen` less every victim the fit and the quota do not need, the most valuable
    given back first. `where` is what `fits` said of `chosen`: a victim with no task on
    the hosts the job fits on is not needed for the fit (those hosts stay as they were), so
    only the quota is asked of it."""
    again = book.copy()
    for x in chosen:
        again.give(x.queue, x.usage)
    for v in list(reversed(chosen)):
        if len(chosen) == 1:
            break
        again.take(v.queue, v.usage)  # were it kept running
        if again.admits(req.queue, req.demand) is None:
            rest = [x for x in chosen if x is not v]
            if isinstance(where, AbstractSet) and not any(h in where for h, _t in v.tasks):
                chosen = rest
                continue
            got = fits(rest)
            if got:
                chosen, where = rest, got
                continue
        again.give(v.queue, v.usage)
    return chosen


def _cheapest_first(req: Request, kind: str, ranked: Sequence[Victim], book: QueueBook, shares: Shares | None,
                    now: float, fits: Callable[[list[Victim]], Fit]) -> tuple[list[Victim], Fit] | None:
    chosen: list[Victim] = []
    trial = book.copy()
    for v in ranked:
        if not eligible(v, req, kind, trial, shares, now):
            continue
        chosen.append(v)
        trial.give(v.queue, v.usage)
        if trial.admits(req.queue, req.demand) is None and (where := fits(chosen)):
            return chosen, where
    return None


def _by_host(req: Request, kind: str, ranked: Sequence[Victim], book: QueueBook, shares: Shares | None,
             now: float, fits: Callable[[list[Victim]], Fit], hosts: Hosts) -> tuple[list[Victim], Fit] | None:
    """Victims host by host: on each host where a candidate runs (the cheapest
    candidates' hosts first), the cheapest of its eligible jobs after whose stop one task
    of the waiting job fits there; then whole hosts' sets, the least work lost first,
    until the job fits and its quota admits it."""
    order: dict[str, None] = {}
    for v in ranked:
        for h, _t in v.tasks:
            order.setdefault(h, None)
    options: list[tuple[tuple[int, float], list[Victim]]] = []
    for h in order:
        here = sorted((v for v in hosts.victims_on(h) if eligible(v, req, kind, book, shares, now)),
                      key=lambda v: v.cost(now))
        picked: list[Victim] = []
        for v in here:
            picked.append(v)
            if hosts.room(h, picked):
                costs = [v.cost(now) for v in picked]
                options.append(((max(c[0] for c in costs), sum(c[1] for c in costs)), picked))
                break
    options.sort(key=lambda o: o[0])
    chosen: list[Victim] = []
    seen: set[str] = set()
    trial = book.copy()
    for _cost, picked in options:
        for v in picked:
            if v.job_id in seen or not eligible(v, req, kind, trial, shares, now):
                continue
            seen.add(v.job_id)
            chosen.append(v)
            trial.give(v.queue, v.usage)
        if chosen and trial.admits(req.queue, req.demand) is None and (where := fits(chosen)):
            return chosen, where
    return None
