"""Reconciliation: jobs history holds as not ended whose record has left the state bucket.

A finished job's last record expires from the `state` bucket after
`MUSTER_FINISHED_JOB_TTL`. When history did not read that record before it expired (the
database down for longer, and the writing historian restarted or handed its lease over
meanwhile, so that the next one resumed past it), its row stays QUEUED, PLACED or RUNNING
for good, listed among the live jobs, and an attempt of it with no end was charged up to
the moment `usage` was asked, without bound. The writing historian therefore looks, at
its start and every `RECONCILE_EVERY_S`, for the jobs history holds as not ended that
were last updated longer ago than the TTL (at least `MIN_AGE_S`), reads each one's key,
and settles those whose key is gone: FAILED, saying its outcome is unknown, at its last
known time (its record's `updated_at`), its attempts that had not ended LOST at that time.
A job whose record comes back later (the bucket restored) is written over it as usual.
"""

from __future__ import annotations

import asyncio
import logging
import time

from server.history.database import History
from wire import subjects
from wire.kv import Store
from wire.messages import AttemptState, Job, JobState
from wire.stopping import pause

log = logging.getLogger(__name__)

RECONCILE_EVERY_S = 600.0
MIN_AGE_S = 600.0  # the least age of a job looked for (a TTL of 0 keeps records: only a lost bucket loses them)
_CHUNK = 200  # jobs read from history, then looked up in the bucket, at a time
UNKNOWN_END = ("outcome unknown: its record left the state bucket (MUSTER_FINISHED_JOB_TTL) before history "
               "read how it ended")
UNKNOWN_ATTEMPT = "outcome unknown (its job's record left the state bucket before history read its end)"


def ended_unknown(job: Job) -> Job:
    """The job as history settles it when its record is gone: FAILED with `UNKNOWN_END`,
    each attempt that had not ended LOST at the job's last known time (its start, for one
    that started later than that). Pure."""
    out = job.model_copy(deep=True)
    out.state = JobState.FAILED
    out.end_reason = UNKNOWN_END
    for a in out.attempts:
        if not a.state.terminal:
            a.state = AttemptState.LOST
            a.finished_at = max(job.updated_at, a.started_at or a.placed_at)
            a.reason = a.reason or UNKNOWN_ATTEMPT
    return out


async def reconcile(store: Store, history: History, ttl_s: float, now: float) -> int:
    """Settle (`ended_unknown`) the jobs history holds as not ended, last updated more than
    the TTL (at least MIN_AGE_S) before `now`, whose key the state bucket no longer has.
    Returns how many were settled. Raises StoreError when NATS does not answer (nothing
    of that chunk is settled)."""
    cutoff = now - max(ttl_s, MIN_AGE_S)
    after: tuple[float, str] | None = None
    settled = 0
    while True:
        batch = await asyncio.to_thread(history.unfinished_before, cutoff, after, _CHUNK)
        if not batch:
            return settled
        recs = await asyncio.gather(*(store.get(subjects.job_key(job.id)) for job, _ in batch))
        gone = [(ended_unknown(job), rev) for (job, rev), rec in zip(batch, recs, strict=True) if rec.value is None]
        if gone:
            settled += await asyncio.to_thread(history.settle, gone)
        if len(batch) < _CHUNK:
            return settled
        last = batch[-1][0]
        after = (last.updated_at, last.id)


async def run(store: Store, history: History, ttl_s: float, stop: asyncio.Event,
              every_s: float = RECONCILE_EVERY_S) -> None:
    """`reconcile` at once, then every `every_s` until `stop`; a failure (NATS or the
    database down) is logged and tried again at the next round."""
    while not stop.is_set():
        try:
            n = await reconcile(store, history, ttl_s, time.time())
            if n:
                log.warning("history: %d jobs whose record left the state bucket before history read their end "
                            "marked FAILED (outcome unknown)", n)
        except Exception as exc:  # noqa: BLE001 - NATS or the database down: next round
            log.warning("history reconciliation failed (%s); trying again in %.0f s", exc, every_s)
        await pause(stop, every_s)
