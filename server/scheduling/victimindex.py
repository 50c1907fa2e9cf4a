"""The running jobs that could be stopped for another, per queue, kept in an order from
which the cheapest to stop at any moment can be read without looking at the rest.

A victim's cost (preemption.Victim.cost) is its priority, then its runtime times its size
(GPUs held, or thousandths of its CPUs; the runtime at most its queue's grace for a job
that checkpoints), which grows with the clock, so no one order of all a queue's jobs
holds for long. Within one (priority, size, checkpoints) group it does: the later a job
started, the cheaper it is (or as cheap, and first among equals), whatever the time.
Each group is therefore kept sorted by start (a SortedList, updated as job records
arrive), and a search for victims merges the groups' youngest jobs by their cost now,
reading only as far as it needs. The few jobs that end by themselves within the grace
(their time limit, their host's drain or reservation) cost nothing: the reader names
them, and they are read first, out of their groups. Building the ranking by walking every running job of a
queue, each cycle, was most of a cycle's cost with 140,000 running jobs and a long
backlog (docs/benchmarks.md, "A long queue").

Pure data, no I/O; ClusterState keeps one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import NamedTuple

from sortedcontainers import SortedList

from server.scheduling.preemption import checkpoint_cap, stoppable, victim_cost
from wire.messages import Job

Cost = tuple[int, float, float, str]  # preemption.Victim.cost


class Facts(NamedTuple):
    """What ranking a stoppable job needs, whatever the clock (preemption.stoppable)."""

    queue: str
    priority: int
    size: float
    started_at: float
    submitted_at: float
    checkpoints: bool

    @property
    def group(self) -> tuple[int, float, bool]:
        return (self.priority, self.size, self.checkpoints)


class VictimIndex:
    def __init__(self) -> None:
        self.facts: dict[str, Facts] = {}
        # queue -> (priority, size, checkpoints) -> (started_at, submitted_at, job id), ascending
        self._groups: dict[str, dict[tuple[int, float, bool], SortedList]] = {}

    def update(self, job: Job) -> None:
        """A job record arrived: index it if it could be stopped now, else forget it."""
        known = stoppable(job)
        if known is None:
            self.drop(job.id)
            return
        facts = Facts(job.spec.queue, job.spec.priority, known[1], known[0], job.submitted_at, job.spec.checkpoints)
        old = self.facts.get(job.id)
        if old == facts:
            return
        if old is not None:
            self._remove(job.id, old)
        self.facts[job.id] = facts
        groups = self._groups.setdefault(facts.queue, {})
        group = groups.get(facts.group)
        if group is None:
            group = groups[facts.group] = SortedList()
        group.add((facts.started_at, facts.submitted_at, job.id))

    def drop(self, job_id: str) -> None:
        old = self.facts.pop(job_id, None)
        if old is not None:
            self._remove(job_id, old)

    def _remove(self, job_id: str, old: Facts) -> None:
        groups = self._groups[old.queue]
        group = groups[old.group]
        group.remove((old.started_at, old.submitted_at, job_id))
        if not group:
            del groups[old.group]
            if not groups:
                del self._groups[old.queue]

    def young(self, queue: str, now: float, min_runtime_s: float,
              below: int | None = None) -> tuple[int, float | None]:
        """The queue's stoppable jobs (of a priority lower than `below`, when given) still
        younger than `min_runtime_s` at `now`: how many, and the seconds until the first
        of them may be stopped (None: there is none)."""
        count = 0
        first: float | None = None
        for (priority, _size, _ckpt), group in self._groups.get(queue, {}).items():
            if below is not None and priority >= below:
                continue
            # The first that has run less than the minimum, by the test `cheapest` makes
            # (now - started < min_runtime_s: one that has run it exactly may be stopped),
            # from a little before it, as floating point may put it on either side.
            at = group.bisect_left((now - min_runtime_s - 1.0,))
            for started, _submitted, _job_id in group.islice(at):
                if now - started < min_runtime_s:
                    break
                at += 1
            if at < len(group):
                count += len(group) - at
                due = group[at][0] + min_runtime_s - now
                first = due if first is None else min(first, due)
        return count, first

    def below(self, queue: str, priority: int) -> int:
        """How many of the queue's stoppable jobs have a priority lower than `priority`."""
        return sum(len(g) for (p, _size, _ckpt), g in self._groups.get(queue, {}).items() if p < priority)

    def cheapest(self, queue: str, now: float, min_runtime_s: float = 0.0, grace_s: float = math.inf,
                 ends: Mapping[str, float] | None = None) -> Iterator[tuple[Cost, str]]:
        """The queue's stoppable jobs that have run at least `min_runtime_s`, cheapest
        first: (cost, job id), the cost as preemption.Victim.cost has it at `now` (with
        the queue's grace, `grace_s`, as the cap of those that checkpoint). `ends`: when
        jobs are stopped anyway (their time limit, their host's drain or reservation), for
        those that end within the grace (at no cost, read first; others may be left out).
        Lazy: each step reads a few more jobs. The index must not change while it is read
        (a cycle plans without awaiting)."""
        groups = self._groups.get(queue)
        if not groups:
            return iter(())
        soon: list[tuple[Cost, str]] = []
        for job_id, at in (ends or {}).items():
            f = self.facts.get(job_id)
            if f is not None and f.queue == queue and at <= now + grace_s and now - f.started_at >= min_runtime_s:
                soon.append((victim_cost(f.priority, f.size, checkpoint_cap(f.checkpoints, grace_s), f.started_at,
                                         f.submitted_at, job_id, now, at, grace_s), job_id))
        soon.sort()
        skip = frozenset(job_id for _cost, job_id in soon)
        runs = [_group_by_cost(group, prio, size, checkpoint_cap(ckpt, grace_s), now, min_runtime_s, skip)
                for (prio, size, ckpt), group in groups.items()]
        if soon:
            runs.append(iter(soon))
        if len(runs) == 1:
            return runs[0]
        return heapq.merge(*runs, key=lambda x: x[0])


def _group_by_cost(group: SortedList, priority: int, size: float, cap: float, now: float,
                   min_runtime_s: float, skip: AbstractSet[str] = frozenset()) -> Iterator[tuple[Cost, str]]:
    """One (priority, size, checkpoints) group in cost order: the youngest first. Jobs
    whose runtimes times the size round to one cost are put in the cost's own order (its
    later terms); those past the cap all cost the cap, in start order (youngest first),
    as the cost says, so they are read as they come. Jobs in `skip` (read elsewhere: they
    end within the grace) are left out."""
    # Start at jobs a little younger than the minimum runtime allows; the exact test is below.
    latest = (now - min_runtime_s + 1.0,)
    tied: list[tuple[Cost, str]] = []
    tied_key: tuple[float, ...] = ()
    for started, submitted, job_id in group.irange(maximum=latest, reverse=True):
        ran = now - started
        if ran < min_runtime_s or job_id in skip:
            continue
        cost = victim_cost(priority, size, cap, started, submitted, job_id, now)
        key = (cost[1], cost[2]) if ran >= cap else (cost[1],)
        if tied and key != tied_key:
            if len(tied) > 1:
                tied.sort()
            yield from tied
            tied = []
        tied_key = key
        tied.append((cost, job_id))
    if len(tied) > 1:
        tied.sort()
    yield from tied
