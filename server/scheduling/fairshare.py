"""Fair share: which queue's job is considered next. Pure: usage, capacity and a clock in.

A queue's share is its dominant resource share (DRF) divided by its weight: the largest,
over the cluster's resources, of what it holds plus its decayed past use, each as a part
of the cluster's capacity of that resource. Past use is the queue's resource-seconds
decayed with a half-life (`qusage.<queue>` records, kept by the leader: `decay`),
expressed as the allocation that, held for ever, would decay to the same figure
(usage x ln 2 / half-life). So a queue that ran heavily a moment ago still ranks
behind one that did not, and the difference halves every half-life; with the half-life
0 only what queues hold now counts.

The admission order interleaves the queues: always the next job of the queue with the
lowest share (ties: the queue's name), the share recomputed as the cycle places jobs;
within a queue, higher priority first, then submission order.

The cluster's capacity a share is taken of is what the cluster's work holds and what
placement could still give (`host_capacity`, summed over hosts by the cluster state): the
free part of a host that takes no new work (cordoned, draining, short of disk, its agent
leaving or lost) and of a faulty GPU is not capacity, as no queue could get it; what runs
there still is use, and counts on both sides.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from server.scheduling.placement import FULL, HostCapacity
from server.scheduling.queues import CPU, MEMORY, QueueBook, gpu_key, mig_fraction
from wire.messages import MAX_USAGE_USERS, Job, QueueUsage

LN2 = math.log(2)


def decay(rec: QueueUsage | None, held: Mapping[str, float], now: float, half_life_s: float,
          name: str, users: tuple[Mapping[str, float], Mapping[str, float]] | None = None) -> QueueUsage:
    """The queue's decayed past use brought from `rec.at` to `now`, `held` having been
    held (constant) in between: u' = u 2^(-dt/h) + a h/ln2 (1 - 2^(-dt/h)). A missing
    record starts from nothing at `now`; a record kept under another half-life is
    rescaled to this one's steady state. With `users` (GPUs and jobs each user holds, in a
    queue with fair share between its users), each user's use decayed alike, the
    MAX_USAGE_USERS users with most kept."""
    if rec is None or half_life_s <= 0:
        return QueueUsage(name=name, at=now, half_life_s=half_life_s, usage={})
    dt = max(0.0, now - rec.at)
    f = 0.5 ** (dt / half_life_s)
    scale = half_life_s / rec.half_life_s if rec.half_life_s > 0 else 1.0

    def decayed(old: Mapping[str, float], now_held: Mapping[str, float], keep: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in set(old) | set(now_held):
            v = old.get(k, 0.0) * scale * f + now_held.get(k, 0.0) * half_life_s / LN2 * (1 - f)
            if v > 1e-9:
                out[k] = v
        if len(out) > keep:
            out = dict(sorted(out.items(), key=lambda kv: -kv[1])[:keep])
        return out

    usage = decayed(rec.usage, held, 256)
    if users is None:
        return QueueUsage(name=name, at=max(now, rec.at), half_life_s=half_life_s, usage=usage)
    return QueueUsage(name=name, at=max(now, rec.at), half_life_s=half_life_s, usage=usage,
                      user_gpus=decayed(rec.user_gpus, users[0], MAX_USAGE_USERS),
                      user_jobs=decayed(rec.user_jobs, users[1], MAX_USAGE_USERS))


def past_users(rec: QueueUsage | None, now: float, half_life_s: float) -> tuple[dict[str, float], dict[str, float]]:
    """Each user's decayed past use (GPUs, jobs) as a steady allocation, as of `now`, as
    `past_allocation` gives a queue's."""
    if rec is None or half_life_s <= 0:
        return {}, {}
    f = 0.5 ** (max(0.0, now - rec.at) / half_life_s)
    scale = half_life_s / rec.half_life_s if rec.half_life_s > 0 else 1.0
    k = scale * f * LN2 / half_life_s
    return {u: v * k for u, v in rec.user_gpus.items()}, {u: v * k for u, v in rec.user_jobs.items()}


def past_allocation(rec: QueueUsage | None, now: float, half_life_s: float) -> dict[str, float]:
    """The decayed past use as a steady allocation (resource units), as of `now`."""
    if rec is None or half_life_s <= 0:
        return {}
    f = 0.5 ** (max(0.0, now - rec.at) / half_life_s)
    scale = half_life_s / rec.half_life_s if rec.half_life_s > 0 else 1.0
    return {r: v * scale * f * LN2 / half_life_s for r, v in rec.usage.items()}


def takes_work(cap: HostCapacity) -> bool:
    """Whether placement may put new work on the host, as its index entry says (the
    planner also keeps work off hosts not HEALTHY and in a maintenance window begun)."""
    return cap.schedulable and not cap.cordoned and not cap.pressure


def host_capacity(cap: HostCapacity) -> tuple[dict[str, float], dict[str, float]]:
    """What one host adds to the cluster's capacity for fair share, and the free part of
    it: on a host that takes new work (`takes_work`), each healthy GPU whole (a share or
    MIG instance held or not), its CPUs and memory; and everywhere what its tasks hold (a
    share or MIG instance as its part, as a queue's use counts it), on a faulty GPU or a
    host that takes no new work included. The free part is what of the first no task
    holds: what a maintenance window once begun takes out (`ClusterState.capacity_at`)."""
    total: dict[str, float] = {}
    free: dict[str, float] = {}
    takes = takes_work(cap)
    mig_held: dict[int, float] = {}
    for u in cap.used_mig:
        where = cap.mig.get(u)
        if where is not None:  # an instance its host no longer reports: which GPU is not known
            g, profile, _memory = where
            mig_held[g] = mig_held.get(g, 0.0) + mig_fraction(profile, cap.gpu_models.get(g))
    for i, m in cap.gpu_models.items():
        held = 1.0 if i in cap.used_gpus else min(1.0, cap.share_used.get(i, 0) / FULL + mig_held.get(i, 0.0))
        k = gpu_key(m)
        if takes and i not in cap.unhealthy_gpus:
            total[k] = total.get(k, 0.0) + 1.0
            if held < 1.0:
                free[k] = free.get(k, 0.0) + 1.0 - held
        elif held > 0.0:
            total[k] = total.get(k, 0.0) + held
    if takes:
        total[CPU] = max(cap.cpus, cap.used_cpus)
        total[MEMORY] = float(max(cap.memory_mb, cap.used_memory_mb))
        free[CPU] = max(0.0, cap.cpus - cap.used_cpus)
        free[MEMORY] = float(max(0, cap.memory_mb - cap.used_memory_mb))
    else:
        total[CPU] = cap.used_cpus
        total[MEMORY] = float(cap.used_memory_mb)
    return {r: v for r, v in total.items() if v > 0}, {r: v for r, v in free.items() if v > 0}


class Shares:
    """Queues' weighted dominant shares against the cluster's `capacity` (what its work
    holds and what placement could still give: `host_capacity`)."""

    def __init__(self, book: QueueBook, capacity: Mapping[str, float],
                 past: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.book = book
        self.capacity = {r: v for r, v in capacity.items() if v > 0}
        self.past = past or {}
        self._cache: dict[str, tuple[int, float]] = {}

    def dominant(self, name: str) -> float:
        """The queue's dominant share (unweighted): 0 for a queue that holds nothing and
        has no past use."""
        held = self.book.usage.get(name, {})
        past = self.past.get(name, {})
        best = 0.0
        for r, cap in self.capacity.items():
            x = (held.get(r, 0.0) + past.get(r, 0.0)) / cap
            if x > best:
                best = x
        return best

    def share(self, name: str) -> float:
        version = self.book.versions.get(name, 0)
        hit = self._cache.get(name)
        if hit is not None and hit[0] == version:
            return hit[1]
        q = self.book.queues.get(name)
        value = self.dominant(name) / (q.weight if q is not None else 1.0)
        self._cache[name] = (version, value)
        return value

    def entitled(self, name: str, active: list[str]) -> float:
        """The dominant share the queue is entitled to among the `active` queues (those
        holding or wanting something): its weight's part of the weights."""
        weights = {a: (self.book.queues[a].weight if a in self.book.queues else 1.0) for a in active}
        if name not in weights:
            weights[name] = self.book.queues[name].weight if name in self.book.queues else 1.0
        total = sum(weights.values())
        return weights[name] / total if total > 0 else 0.0


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index of `xs`, (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n
    when one has everything; 1 for none, or all zero."""
    sq = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * sq) if sq > 0 else 1.0


def fairness(book: QueueBook, capacity: Mapping[str, float], waiting: Sequence[str]) -> float:
    """How fairly the queues with jobs waiting (`waiting`) hold the cluster now: Jain's
    index over them of what each holds (its dominant share of the cluster's `capacity`,
    past use not counted) over what its weight entitles it to among them. 1 when each
    holds its weight's part (or fewer than two wait); towards 1/n as one holds all."""
    if len(waiting) < 2:
        return 1.0
    now = Shares(book, capacity)  # no past use: what they hold now
    active = list(waiting)
    return jain([now.dominant(q) / now.entitled(q, active) for q in waiting])


def order_key(job: Job) -> tuple[int, float, str]:
    """Where a job stands in its queue: higher priority first, then submission order."""
    return (-job.spec.priority, job.submitted_at, job.id)


def within_queue_order(jobs: list[Job]) -> list[Job]:
    """A queue's jobs: higher priority first, then submission order."""
    return sorted(jobs, key=order_key)


def admission_order(by_queue: Mapping[str, Sequence[Job]], share: Callable[[str], float],
                    rest: Callable[[str, int], bool] | None = None) -> Iterator[Job]:
    """Each queue's jobs (already in within-queue order), interleaved: the queue with the
    lowest `share` (as it is when its turn comes) goes next; ties by queue name. `share`
    is read again after every job, so placements made meanwhile count. `rest(q, i)`, asked
    before a queue's i-th job is handed out, may drop that job and the queue's others
    after it (the caller has dealt with them all: none of them could be admitted)."""
    heap = [(share(q), q, 0) for q, jobs in by_queue.items() if jobs]
    heapq.heapify(heap)
    while heap:
        s, q, i = heapq.heappop(heap)
        now_s = share(q)
        if now_s > s + 1e-12:  # it took more since it was queued up: back in line
            heapq.heappush(heap, (now_s, q, i))
            continue
        if rest is not None and rest(q, i):
            continue
        jobs = by_queue[q]
        yield jobs[i]
        if i + 1 < len(jobs):
            heapq.heappush(heap, (share(q), q, i + 1))
