"""Reads for the API and the console, run so that they cannot stop the scheduler.

The leader's scheduler shares its event loop with the HTTP side. A pass over 50,000
hosts (a hosts page, the fleet's totals, why a job is pending) takes a few hundred
milliseconds of Python; done in one go it would hold every placement back that long,
and a flood of such requests would hold them back for good. So:

- every pass runs in steps (server.views.hosts.Steps): after each slice of hosts the
  loop runs whatever else is ready (a scheduling cycle, a commit's acknowledgement)
  before the next slice;
- one pass runs at a time (`Reads.lock`): a flood of heavy reads queues behind it
  instead of multiplying the CPU it takes;
- on the leader, passes get at most `LEADER_READ_SHARE` of the loop: after each step the
  pass waits three times as long as the step took, so that scheduling keeps the rest
  whatever the HTTP side is asked (a pass takes four times as long there; a follower
  runs them at full speed: point heavy readers at followers);
- the fleet's totals are reused for five times as long as they took to compute, at most
  `SUMMARY_MAX_AGE_S` (a small fleet's are always fresh; 50,000 hosts' are computed
  about once a second however many pages and queries ask; on the leader at most every
  `LEADER_SUMMARY_MAX_AGE_S`, one heartbeat interval), and queue positions come from
  one sort per second (server.views.jobs);
- history queries (SQL) run in a thread (`in_thread`), not on the loop.

One `Reads` per replica (`reads_for`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from server.history.database import DATABASE_DOWN, down_text
from server.views.hosts import FleetSummary, HostQuery, HostRow, Steps
from wire.errors import HistoryUnavailable
from wire.messages import Job

if TYPE_CHECKING:
    from server.replica import Muster

log = logging.getLogger(__name__)
T = TypeVar("T")
SUMMARY_MAX_AGE_S = 1.0
LEADER_SUMMARY_MAX_AGE_S = 5.0
LEADER_READ_SHARE = 0.25


class Reads:
    def __init__(self, muster: Muster, *, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.muster = muster
        self._clock = clock
        self._sleep = sleep
        self.lock = asyncio.Lock()
        self._never_lock = asyncio.Lock()
        self._summary_lock = asyncio.Lock()
        self._summary: FleetSummary | None = None
        self._summary_at = 0.0
        self._summary_cost = 0.0
        self.passes = 0  # passes run (for tests and metrics)

    async def run(self, steps: Steps[T]) -> T:
        """Run a pass a step at a time, one pass at a time, the loop's other work between
        the steps (on the leader, for three times as long as the step took)."""
        async with self.lock:
            self.passes += 1
            while True:
                started = self._clock()
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value
                pause = 0.0
                if self.muster.role == "leader":
                    pause = (self._clock() - started) * (1 / LEADER_READ_SHARE - 1)
                await self._sleep(pause)

    async def summary(self) -> FleetSummary:
        """The fleet's totals, at most `SUMMARY_MAX_AGE_S` old (see the module docstring)."""
        async with self._summary_lock:  # one computation for every request waiting on it
            age = time.monotonic() - self._summary_at
            limit = LEADER_SUMMARY_MAX_AGE_S if self.muster.role == "leader" else SUMMARY_MAX_AGE_S
            if self._summary is None or age > min(limit, 5 * self._summary_cost):
                started = time.monotonic()
                self._summary = await self.run(self.muster.hosts.summary_steps(time.time()))
                self._summary_at = time.monotonic()
                self._summary_cost = self._summary_at - started
            return self._summary

    async def hosts(self, query: HostQuery | None, order: str) -> list[HostRow]:
        return await self.run(self.muster.hosts.select_steps(query, order, time.time()))

    async def rows(self, *, live: bool = True) -> list[HostRow]:
        return await self.run(self.muster.hosts.rows_steps(time.time(), live=live))

    async def why_pending(self, job: Job) -> dict[str, int]:
        return await self.run(self.muster.jobs.why_pending_steps(job, time.time()))

    async def never_runs(self, job: Job) -> list[str]:
        """Why `job` could never run as the cluster stands (views.jobs.JobView.queue_never and
        hosts_never_steps).
        The hosts' first step runs at once, outside the lock: for most jobs a host that
        could take it is among the first looked at, and a submission does not wait behind a
        heavy read. A longer pass is one at a time (`_never_lock`), so that a batch of jobs
        of one shape pays for one and the others read what it found."""
        jobs = self.muster.jobs
        out = jobs.queue_never(job)
        found = _first_step(jobs.hosts_never_steps(job, time.monotonic()))
        if found is not None:
            return out + found
        async with self._never_lock:
            steps = jobs.hosts_never_steps(job, time.monotonic())  # found meanwhile?
            found = _first_step(steps)
            return out + (found if found is not None else await self.run(steps))

    def queue_position(self, job: Job) -> int | None:
        return self.muster.jobs.queue_position(job, time.monotonic())


def _first_step(steps: Steps[list[str]]) -> list[str] | None:
    """Run a pass's first step: its result when that ends it, else None (the rest to run)."""
    try:
        next(steps)
    except StopIteration as done:
        return done.value
    return None


async def in_thread(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """A blocking read (SQL) in a worker thread, off the event loop. A database that does
    not answer is HistoryUnavailable (found by exploring: GraphQL answered its driver's
    text, host and port included, without a code, and "Unexpected error." in production,
    logging a traceback for each)."""
    try:
        return await asyncio.to_thread(fn, *args, **kw)
    except DATABASE_DOWN as exc:
        log.warning("history read failed: %s", down_text(exc))
        raise HistoryUnavailable("the history database does not answer (the server's log says why); live jobs "
                                 "and hosts can still be read, and nothing written is lost") from exc


_READS: weakref.WeakKeyDictionary[Any, Reads] = weakref.WeakKeyDictionary()


def reads_for(muster: Muster) -> Reads:
    reads = _READS.get(muster)
    if reads is None:
        reads = _READS[muster] = Reads(muster)
    return reads
