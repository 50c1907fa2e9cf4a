"""Submissions: a job, or a batch of jobs, checked against its queue, its limits and its
dependencies, and stored QUEUED (any replica stores them; the leader places them)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from server import metrics
from server.operations.base import Operations, maybe_stored
from server.scheduling import submitlimits
from server.scheduling.cycle.reports import hold_text
from server.scheduling.dependencies import kind as dependency_kind
from server.scheduling.dependencies import waits
from server.scheduling.queues import queue_refusal
from server.scheduling.submitlimits import OpenJobs
from wire import subjects
from wire.errors import DecodeError, Forbidden, InvalidInput, ValidationError
from wire.kv import Write
from wire.messages import DEFAULT_QUEUE, Job, JobSpec, decode, encode, new_id
from wire.retrying import SUBMIT_RETRY_S
from wire.validation import validate_job


class Submissions(Operations):
    # Jobs this replica's requests are storing now: counted against submission limits.
    _storing: OpenJobs

    def _check_queue(self, spec: JobSpec, allowed: list[str] | None) -> JobSpec:
        """A job may go to an existing queue its token is bound to, within the queue's
        maximum time limit, and with host labels that do not conflict with the queue's
        (which apply when it is placed: scheduling.queues.placement_spec); returns its spec.
        Raises Forbidden or ValidationError."""
        if allowed is not None and spec.queue not in allowed:
            raise Forbidden(f"this token may not submit to queue {spec.queue!r} (only to {', '.join(allowed)})")
        refused = queue_refusal(spec, self.queue(spec.queue))
        if refused is not None:
            raise refused
        return spec

    @contextlib.contextmanager
    def _storing_now(self, jobs: Sequence[Job]) -> Iterator[None]:
        """While `jobs` are being stored, concurrent requests count them against the
        submission limits (`_check_limits`)."""
        for j in jobs:
            self._storing.update(None, j)
        try:
            yield
        finally:
            for j in jobs:
                self._storing.update(j, None)

    def _check_limits(self, spec: JobSpec, batch: OpenJobs | None = None) -> None:
        """The job's queue takes one more job of its user: its submission limits count the
        jobs this replica has seen not ended, those it is storing now, and `batch` (the
        request's jobs accepted before this one). Raises ValidationError (JOB_LIMIT)."""
        q = self.queue(spec.queue)
        if q is None or not submitlimits.limited(q):
            return
        tallies = [self.state.open_jobs, self._storing] + ([batch] if batch is not None else [])
        why = submitlimits.refusal(q, spec.user, tallies)
        if why:
            metrics.SUBMISSIONS_REFUSED.labels(spec.queue).inc()
            raise ValidationError("queue", why, submitlimits.JOB_LIMIT)

    async def _dependencies(self, items: Iterable[dict[str, Any]]) -> Callable[[str], Job | None]:
        """How the jobs `items` run after are looked up while they are checked: the live
        record, else history's, read for them all at once, in a thread, before the checks
        (found by exploring: a read of the database per dependency not live, on the event
        loop, held it 13 s for 1,000 jobs of 32 dependencies each)."""
        wanted = {d for data in items if isinstance(deps := data.get("depends_on"), list)
                  for d in deps if isinstance(d, str)}
        missing = sorted(d for d in wanted if d not in self.state.jobs)
        recorded = await asyncio.to_thread(self.jobs.recorded, missing) if missing else {}
        live = self.state.jobs
        return lambda d: live.get(d) or recorded.get(d)

    def _waits_for(self, spec: JobSpec, lookup: Callable[[str], Job | None]) -> list[str]:
        """Of the jobs `spec` runs after (found with `lookup`), those it must wait for (not
        ended yet, as this replica sees them: the leader takes out each as it ends). Raises
        ValidationError for one that does not exist, or one whose end its rule excludes
        (afterok: any but SUCCEEDED; afternotok: SUCCEEDED): the job could never run."""
        left, never = waits(spec, spec.depends_on, lookup)
        if never is not None:
            dep, ended = never
            if ended is None:
                raise ValidationError("dependsOn", f"no job {dep}", "UNKNOWN_DEPENDENCY")
            raise ValidationError("dependsOn", f"job {dep} ended {ended.value}: this job could never run "
                                               f"({dependency_kind(spec)}; use AFTER_ANY to run after it whatever its "
                                               "end)", "DEPENDENCY_FAILED")
        return left

    @staticmethod
    def default_queue(allowed: list[str] | None) -> str:
        """The queue of a job that names none: `default`, or the first queue of a token
        bound to queues that leave `default` out (a team's token submits to its team's
        queue without saying so)."""
        return allowed[0] if allowed and DEFAULT_QUEUE not in allowed else DEFAULT_QUEUE

    @classmethod
    def _job_input(cls, data: dict[str, Any], user: str, allowed: list[str] | None) -> tuple[dict[str, Any], str]:
        """A job's input with its user, and its queue when it names none; and its hold
        (`held` in the input: it is submitted held, as sbatch -H), or ""."""
        data = dict(data)
        data.setdefault("user", user)
        if not data.get("queue"):
            data["queue"] = cls.default_queue(allowed)
        hold = hold_text(user, at_submission=True) if data.pop("held", False) else ""
        return data, hold

    async def submit(self, data: dict[str, Any], user: str, queues: list[str] | None = None) -> Job:
        """Validate and store a job (QUEUED). Raises InvalidInput (nothing stored) when
        it is rejected; Forbidden when `queues` (the caller's token's) leave its queue out."""
        lookup = await self._dependencies([data])  # (no wait from the limits' check to the store's)
        data, hold = self._job_input(data, user, queues)
        spec, errors = validate_job(data, self.known_gpu_models())
        if spec is None:
            raise InvalidInput(errors)
        spec = self._check_queue(spec, queues)
        self._check_limits(spec)
        waits = self._waits_for(spec, lookup)
        now = time.time()
        job = Job(id=new_id("j"), spec=spec, submitted_at=now, updated_at=now, hold=hold, waiting_for=waits,
                  not_before=spec.begin_at, uid_key=new_uid_key())
        assert self.store is not None
        record = encode(job)
        with self._storing_now([job]), maybe_stored(f"job {job.id}"):
            # Tried again while NATS cannot take it; a try that was stored is found, not
            # repeated (its id is fresh: a record under it is this job's, placed since or not).
            stored = await self.store.create(subjects.job_key(job.id), record, within_s=SUBMIT_RETRY_S,
                                             ours=lambda found: _is_job(found, job))
        if stored.value is not None and stored.value != record:
            job = decode(Job, stored.value)
        self.state.apply_job(job, stored.revision)
        metrics.SUBMISSIONS.inc()
        return job

    async def submit_many(self, items: list[dict[str, Any]], user: str,
                          queues: list[str] | None = None) -> list[Job | InvalidInput | Forbidden]:
        """Validate every job, then store the valid ones in one atomic batch per 1,000;
        each item's result is its job or why it was rejected."""
        lookup = await self._dependencies(items)  # (no wait from here until the jobs are being stored)
        known = self.known_gpu_models()
        now = time.time()
        results: list[Job | InvalidInput | Forbidden] = []
        batch = OpenJobs()
        for data in items:
            data, hold = self._job_input(data, user, queues)
            spec, errors = validate_job(data, known)
            waits: list[str] = []
            if spec is not None:
                try:
                    spec = self._check_queue(spec, queues)
                    self._check_limits(spec, batch)
                    waits = self._waits_for(spec, lookup)
                except ValidationError as exc:
                    spec, errors = None, [exc]
                except Forbidden as exc:
                    results.append(exc)
                    continue
            if spec is None:
                results.append(InvalidInput(errors))
                continue
            job = Job(id=new_id("j"), spec=spec, submitted_at=now, updated_at=now, hold=hold, waiting_for=waits,
                      not_before=spec.begin_at, uid_key=new_uid_key())
            batch.update(None, job)
            results.append(job)
        assert self.store is not None
        jobs = [j for j in results if isinstance(j, Job)]
        # Each key must not exist yet (a fresh id), and a retry after a lost reply is
        # refused as a duplicate.
        for i in range(0, len(jobs), 1000):
            chunk = jobs[i : i + 1000]
            with self._storing_now(chunk), maybe_stored(f"{len(chunk)} jobs (the first {chunk[0].id})"):
                res = await self.store.commit([Write(subjects.job_key(j.id), encode(j), expected=0) for j in chunk],
                                              within_s=SUBMIT_RETRY_S)
            if not res.duplicate:
                for j in chunk:
                    self.state.apply_job(j, res.revisions[subjects.job_key(j.id)])
        metrics.SUBMISSIONS.inc(len(jobs))
        return results


def new_uid_key() -> str:
    """A job's uid key (Job.uid_key), drawn at random by the server that stores it and
    never shown (no GraphQL type, not the console): the uid its tasks run as is drawn from
    it, not from its public id. Found by exploring: from the id, an operator could submit
    held jobs, reckon each one's uid offline, keep one that shared a running job's uid (one
    of 1,000 in 414 tries) and cancel the rest; that job's tasks could then read the
    other's env and enter its working directory. A job stored before has none and runs as
    the uid of its id, as it did."""
    return secrets.token_hex(16)


def _is_job(found: bytes, job: Job) -> bool:
    """Whether a record found under `job`'s key is that job (as stored, or changed since)."""
    try:
        other = decode(Job, found)
    except DecodeError:
        return False
    return other.id == job.id and other.submitted_at == job.submitted_at
