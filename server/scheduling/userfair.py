"""Fair share between the users of one queue (a queue's `fair_share_users`), as Slurm's
Fair Tree ranks the users within an account and Kueue's admission fair sharing ranks the
workloads of one ClusterQueue: a teammate's few jobs do not wait behind one user's long
backlog at equal priority.

The order within such a queue: higher priority first, as in every queue; among the jobs
of one priority, the user whose jobs of the queue hold least goes next (GPUs held, then
jobs placed or running: a user of CPU-only work is ranked by its jobs; each with the
user's past use, decayed with the fair-share half-life as a queue's is), ties by the
earlier submission of each user's next job; each user's own jobs in submission order.
Each job handed out counts for its user as though placed, so that users with equal jobs
alternate, and a user holding 8 GPUs waits while a teammate holding none takes up to 8.

The order is worked out as far as it is read (`Interleaved`): a cycle that stops after a
few jobs of a long queue does not sort the rest. Pure: jobs and the users' holdings in.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from server.scheduling.queues import job_gpus
from wire.messages import Job

# What a user's jobs of the queue hold: GPUs, and jobs placed or running (each with the
# user's decayed past use of it as a steady allocation: scheduling.fairshare.past_users).
Load = tuple[float, float]


class Interleaved(Sequence[Job]):
    """A queue's jobs (given in within-queue order: priority, then submission) in the
    users' fair order, given what each user holds now (`load(user)`)."""

    def __init__(self, jobs: Sequence[Job], load: Callable[[str], Load]) -> None:
        self._n = len(jobs)
        self._streams: dict[str, list[Job]] = {}
        for job in jobs:
            self._streams.setdefault(job.spec.user, []).append(job)
        self._next = dict.fromkeys(self._streams, 0)
        self._load = {u: load(u) for u in self._streams}
        self._heap = [self._key(u) for u in self._streams]
        heapq.heapify(self._heap)
        self._out: list[Job] = []

    def _key(self, user: str) -> tuple[int, float, float, float, str, str]:
        job = self._streams[user][self._next[user]]
        gpus, running = self._load[user]
        return (-job.spec.priority, gpus, running, job.submitted_at, job.id, user)

    def _fill(self, upto: int) -> None:
        while len(self._out) < upto and self._heap:
            user = heapq.heappop(self._heap)[-1]
            job = self._streams[user][self._next[user]]
            self._out.append(job)
            gpus, running = self._load[user]
            self._load[user] = (gpus + job_gpus(job.spec), running + 1)
            self._next[user] += 1
            if self._next[user] < len(self._streams[user]):
                heapq.heappush(self._heap, self._key(user))

    @property
    def users(self) -> int:
        return len(self._streams)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Job: ...

    @overload
    def __getitem__(self, i: slice) -> list[Job]: ...

    def __getitem__(self, i: int | slice) -> Job | list[Job]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            self._fill(stop)
            return self._out[start:stop:step]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        self._fill(i + 1)
        return self._out[i]

    def __iter__(self) -> Iterator[Job]:
        for i in range(self._n):
            yield self[i]

    def __bool__(self) -> bool:
        return self._n > 0


def interleaved(jobs: Sequence[Job], load: Callable[[str], Load]) -> Sequence[Job]:
    """`jobs` (one queue's, in within-queue order) in the users' fair order; the same
    sequence when all are one user's."""
    if len(jobs) < 2:
        return jobs
    order = Interleaved(jobs, load)  # one pass over the jobs, splitting them by user
    return jobs if order.users == 1 else order
