"""Jobs placed or running, counted by a key of the job's (its user's group, its queue and
user), kept from job records as they arrive: what limits on how many jobs run at once are
checked against (job groups, a queue's per-user running-jobs limit). A job counts from its
placement, or from the moment the jobs it preempted are told to stop (it is placed as soon
as they have), until it is queued again, or has ended and its tasks have stopped.

Pure: a tally over records; a tally of changes may go below zero."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from wire.messages import Job, JobState

K = TypeVar("K", bound=Hashable)


def live(job: Job | None) -> bool:
    """A job that counts: placed or running, queued while its victims stop, or ended while
    a task of it still stops (`Job.stopping`: found by exploring, a singleton started while
    the one cancelled before it ran on for its grace)."""
    if job is None:
        return False
    return job.state in (JobState.PLACED, JobState.RUNNING) or (job.state is JobState.QUEUED and bool(job.preempting)) \
        or job.stopping


def queue_user(job: Job) -> tuple[str, str]:
    """The key of a queue's per-user counts: (queue, user)."""
    return job.spec.queue, job.spec.user


class LiveCounts(Generic[K]):
    """Live jobs per `key(job)` (None: the job is not counted)."""

    def __init__(self, key: Callable[[Job], K | None]) -> None:
        self.key = key
        self._n: Counter[K] = Counter()

    def add(self, k: K, n: int) -> None:
        self._n[k] += n
        if not self._n[k]:
            del self._n[k]

    def update(self, old: Job | None, new: Job | None) -> None:
        """A job's record changed from `old` to `new` (either None: created, dropped)."""
        if old is not None and live(old) and (k := self.key(old)) is not None:
            self.add(k, -1)
        if new is not None and live(new) and (k := self.key(new)) is not None:
            self.add(k, 1)

    def get(self, k: K) -> int:
        return self._n.get(k, 0)

    def as_dict(self) -> dict[K, int]:
        return dict(self._n)

    def recount(self, jobs: Iterable[Job]) -> LiveCounts[K]:
        """The same tally counted afresh over `jobs` (what ClusterState keeps as records arrive)."""
        out = LiveCounts(self.key)
        for job in jobs:
            out.update(None, job)
        return out
