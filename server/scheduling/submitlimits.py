"""Submission limits: how many jobs not yet ended (queued, held, waiting for others,
placed or running) a queue takes, in all and from each user, as Slurm's MaxSubmitJobs
and MaxSubmitJobsPerUser. A submission past a limit is refused, and nothing of it is
stored; jobs already in the queue are never touched by a limit, even one lowered under
them. This keeps one team's runaway script (a loop of `submitJob`, a sweep of a million
points) from filling the state every replica holds in memory and every scheduling cycle
reads.

Pure: `OpenJobs` is a tally kept from job records as they arrive; `refusal` decides."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from wire.messages import Job, Queue

JOB_LIMIT = "JOB_LIMIT"  # the API error code of a refused submission


def is_open(job: Job | None) -> bool:
    """A job counted against the limits: one that has not ended."""
    return job is not None and not job.state.terminal


class OpenJobs:
    """Jobs not ended, per queue and per user of each queue. Counts may go below zero in a
    tally of changes (a job ending that another tally counted): `total` and `user` give
    them as they are, for adding up."""

    def __init__(self) -> None:
        self._users: dict[str, Counter[str]] = {}
        self._queues: Counter[str] = Counter()

    def add(self, queue: str, user: str, n: int) -> None:
        if not n:
            return
        users = self._users.setdefault(queue, Counter())
        users[user] += n
        if not users[user]:
            del users[user]
            if not users:
                del self._users[queue]
        self._queues[queue] += n
        if not self._queues[queue]:
            del self._queues[queue]

    def update(self, old: Job | None, new: Job | None) -> None:
        """A job's record changed from `old` to `new` (either None: created, dropped)."""
        if is_open(old):
            assert old is not None
            self.add(old.spec.queue, old.spec.user, -1)
        if is_open(new):
            assert new is not None
            self.add(new.spec.queue, new.spec.user, 1)

    def total(self, queue: str) -> int:
        return self._queues.get(queue, 0)

    def user(self, queue: str, user: str) -> int:
        users = self._users.get(queue)
        return users.get(user, 0) if users else 0

    def users(self, queue: str) -> dict[str, int]:
        return dict(self._users.get(queue, {}))

    @classmethod
    def of(cls, jobs: Iterable[Job]) -> OpenJobs:
        """The tally counted afresh (what ClusterState keeps as records arrive)."""
        out = cls()
        for job in jobs:
            out.update(None, job)
        return out


def limited(q: Queue) -> bool:
    return bool(q.max_submitted_jobs or q.max_submitted_jobs_per_user)


def refusal(q: Queue, user: str, tallies: Sequence[OpenJobs]) -> str:
    """Why `q` takes no more jobs from `user`, its jobs not ended being those of all
    `tallies` added up; "" if it takes one more."""
    in_queue = sum(t.total(q.name) for t in tallies)
    of_user = sum(t.user(q.name, user) for t in tallies)
    if q.max_submitted_jobs and in_queue >= q.max_submitted_jobs:
        return (f"queue {q.name!r} has {in_queue} jobs not ended, its limit (maxSubmittedJobs "
                f"{q.max_submitted_jobs}): wait for some to end or cancel some")
    if q.max_submitted_jobs_per_user and of_user >= q.max_submitted_jobs_per_user:
        return (f"{user} has {of_user} jobs not ended in queue {q.name!r}, its per-user limit "
                f"(maxSubmittedJobsPerUser {q.max_submitted_jobs_per_user}): wait for some to end or cancel some")
    return ""
