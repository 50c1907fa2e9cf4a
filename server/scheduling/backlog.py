"""The queued jobs of each queue, kept in their within-queue order as job records arrive,
with the smallest job of each queue in every respect admission is decided on.

Every cycle the planner walks the queues in admission order (scheduling.fairshare) and
skips the rest of a queue once a job no larger than any of them was refused or would
borrow (the planner's shortcuts). Sorting each queue and finding its smallest job from
scratch was 45 % of a cycle profiled at 10,000 full hosts with 4,256 jobs queued; here
both move with each record instead: a job is inserted at or removed from its place (a
binary search and a list move) and its size counted in or out. It is the one record
of which jobs are queued: the cluster view, the queue figures (pending counts, active
queues) and the metrics read it. Pure data, no I/O; ClusterState keeps one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Mapping

from server.scheduling.fairshare import order_key
from server.scheduling.queues import job_size
from wire.messages import Job, JobState

OrderKey = tuple[int, float, str]


class Backlog:
    def __init__(self) -> None:
        # queue -> its queued jobs' order keys (fairshare.order_key), in order; jobs that
        # wait for victims to stop (`preempting`: job id -> queue; a few at a time) are
        # kept apart, as the planner takes them.
        self.order: dict[str, list[OrderKey]] = {}
        self.preempting: dict[str, str] = {}
        # Held jobs, and jobs waiting for others to end (job id -> queue): queued, but not
        # for placement until released or their dependencies are met; not in any order nor
        # count below.
        self.held: dict[str, str] = {}
        self.waiting: dict[str, str] = {}
        # queue -> per respect of `job_size`, how many queued jobs have each value; and how
        # many name GPU models (a job that does is compared with nothing: `least` None).
        self._sizes: dict[str, list[Counter[float]]] = {}
        self._with_models: Counter[str] = Counter()
        # queue -> its version (one more with each job added or removed), and the list of
        # its jobs `jobs_of` handed out at a version: kept while the queue is unchanged.
        self._version: Counter[str] = Counter()
        self._lists: dict[str, tuple[int, list[Job]]] = {}
        # queue -> (not before, job id) of its queued jobs that have a time before which they
        # are not placed (a begin time, a retry's back-off), in order: `eligible_counts`.
        self._later: dict[str, list[tuple[float, str]]] = {}

    def update(self, old: Job | None, new: Job | None) -> None:
        """A job record replaced (`old` and `new` of one job; None: none)."""
        if old is not None and old.state is JobState.QUEUED:
            self._remove(old)
        if new is not None and new.state is JobState.QUEUED:
            self._add(new)

    def _add(self, job: Job) -> None:
        if job.hold:
            self.held[job.id] = job.spec.queue
            return
        if job.waiting_for:
            self.waiting[job.id] = job.spec.queue
            return
        if job.preempting:
            self.preempting[job.id] = job.spec.queue
            return
        q = job.spec.queue
        bisect.insort(self.order.setdefault(q, []), order_key(job))
        if job.not_before:
            bisect.insort(self._later.setdefault(q, []), (job.not_before, job.id))
        self._version[q] += 1
        counts = self._sizes.setdefault(q, [Counter() for _ in range(4)])
        for c, v in zip(counts, job_size(job.spec), strict=True):
            c[v] += 1
        if job.spec.models() is not None:
            self._with_models[q] += 1

    def _remove(self, job: Job) -> None:
        if job.hold:
            self.held.pop(job.id, None)
            return
        if job.waiting_for:
            self.waiting.pop(job.id, None)
            return
        if job.preempting:
            self.preempting.pop(job.id, None)
            return
        q = job.spec.queue
        keys = self.order.get(q)
        key = order_key(job)
        i = bisect.bisect_left(keys, key) if keys else 0
        if not keys or i >= len(keys) or keys[i] != key:
            return  # not held (never added)
        del keys[i]
        self._version[q] += 1
        if not keys:
            del self.order[q]
            self._lists.pop(q, None)
        later = self._later.get(q)
        if job.not_before and later:
            j = bisect.bisect_left(later, (job.not_before, job.id))
            if j < len(later) and later[j] == (job.not_before, job.id):
                del later[j]
            if not later:
                del self._later[q]
        counts = self._sizes[q]
        for c, v in zip(counts, job_size(job.spec), strict=True):
            c[v] -= 1
            if not c[v]:
                del c[v]
        if not any(counts):
            del self._sizes[q]
        if job.spec.models() is not None:
            self._with_models[q] -= 1
            if not self._with_models[q]:
                del self._with_models[q]

    def jobs_of(self, queue: str, jobs: Mapping[str, Job]) -> list[Job]:
        """The queue's queued jobs in order (`jobs`: the cluster view's job records, whose
        every change passes through `update`). One list is kept while the queue is
        unchanged, so a long queue nothing touched costs nothing to hand out again each
        cycle: the list is shared, and the caller must not change it."""
        v = self._version[queue]
        got = self._lists.get(queue)
        if got is None or got[0] != v:
            got = self._lists[queue] = (v, [jobs[k[2]] for k in self.order.get(queue, ())])
        return got[1]

    def least(self, queue: str) -> tuple[float, ...] | None:
        """The smallest of the queue's queued jobs in each respect of `job_size` (None when
        it has none, or one of them names GPU models)."""
        counts = self._sizes.get(queue)
        if not counts or self._with_models.get(queue):
            return None
        return tuple(min(c) for c in counts)

    def held_in(self, queue: str) -> int:
        """How many of the queue's queued jobs are held or wait for others."""
        return sum(1 for q in self.held.values() if q == queue) + sum(1 for q in self.waiting.values() if q == queue)

    def count(self, queue: str) -> int:
        """How many of the queue's jobs are queued (those waiting for victims included;
        held ones and those waiting for other jobs not)."""
        return len(self.order.get(queue, ())) + sum(1 for q in self.preempting.values() if q == queue)

    def counts(self) -> dict[str, int]:
        """Per queue with queued jobs, how many."""
        out = {q: len(keys) for q, keys in self.order.items()}
        for q in self.preempting.values():
            out[q] = out.get(q, 0) + 1
        return out

    def eligible_counts(self, now: float) -> dict[str, int]:
        """`counts` less the jobs not to be placed before a time still ahead at `now` (a
        begin time, a retry's back-off): the queues' jobs that could be placed now, which
        is what a starving queue lacks room for."""
        out = self.counts()
        for q, later in self._later.items():
            ahead = len(later) - bisect.bisect_right(later, (now, "\U0010ffff"))
            if ahead:
                left = out.get(q, 0) - ahead
                if left > 0:
                    out[q] = left
                else:
                    out.pop(q, None)
        return out

    def ids(self) -> Iterator[str]:
        """Every queued job's id but those held or waiting for other jobs: queue by queue
        in order, then those waiting for victims."""
        for keys in self.order.values():
            for key in keys:
                yield key[2]
        yield from self.preempting

    def __len__(self) -> int:
        return sum(len(keys) for keys in self.order.values()) + len(self.preempting)
