"""Retry policy: whether a job whose attempt ended gets another attempt, and when.
Pure: a function of the job, how the attempt ended, and the clock."""

from __future__ import annotations

from dataclasses import dataclass

from wire.messages import Attempt, AttemptState, Job

# Attempts that ended through no fault of the job's own code: the host was lost, the
# agent fenced itself or shut down. A nonzero exit is the job's own failure.
INFRASTRUCTURE_ENDINGS = (AttemptState.LOST, AttemptState.KILLED)
MAX_BACKOFF_S = 60.0
MAX_DELAY_S = 3600.0  # a job's own retry delay, doubled, is at most an hour
# Attempt.stop_kind of an orderly disruption: the host was drained, its agent shut
# down (an upgrade, a reboot), or an operator requeued the job. Like a preemption, such a try is not counted against
# maxAttempts (as Kubernetes leaves disruptions out of a Job's backoffLimit), and the job
# is requeued at once: the job did nothing wrong, and the operator meant it.
DRAIN = "drain"
SHUTDOWN = "shutdown"
REQUEUE = "requeue"  # an operator's requeue of the job (muster job requeue)
HOST = "host"  # its host could not start it (StatusReport.host_trouble): the host's want, not the job's
HOST_TROUBLE_WAIT_S = 2.0  # such a try's job is placed again no sooner than this
DISRUPTIONS = (DRAIN, SHUTDOWN, REQUEUE, HOST)


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    not_before: float = 0.0
    why: str = ""


def backoff_s(attempt_number: int) -> float:
    """0 s before the 2nd attempt, then 1, 2, 4 ... s, at most a minute."""
    if attempt_number <= 1:
        return 0.0
    return min(MAX_BACKOFF_S, 2.0 ** (attempt_number - 2))


def failure_backoff_s(job: Job, retry: int) -> float:
    """The wait before the `retry`-th retry (1-based) of the job's own failures: its
    `retry_delay_s` doubled for each retry after the first, at most an hour (never less than
    the delay itself); without one the default backoff (1, 2, 4 ... s, at most a minute)."""
    delay = job.spec.retry_delay_s
    if delay <= 0:
        return backoff_s(retry + 1)
    return max(delay, min(MAX_DELAY_S, delay * 2.0 ** min(retry - 1, 32)))


def disrupted(tasks: list[Attempt]) -> bool:
    """A try (its tasks) that ended only through an orderly disruption: every task that
    did not succeed was stopped (KILLED) by a drain, its agent's shutdown or an operator's
    requeue."""
    ended = [t for t in tasks if t.state is not AttemptState.SUCCEEDED]
    return bool(ended) and all(t.state is AttemptState.KILLED and t.stop_kind in DISRUPTIONS for t in ended)


def _tries(job: Job) -> dict[int, list[Attempt]]:
    by_try: dict[int, list[Attempt]] = {}
    for a in job.attempts:
        by_try.setdefault(a.number, []).append(a)
    return by_try


OWN_FAILURES = (AttemptState.FAILED, AttemptState.TIMEOUT)


def _failed(tasks: list[Attempt]) -> bool:
    return any(t.state in OWN_FAILURES for t in tasks)


def _uncounted(tasks: list[Attempt]) -> bool:
    return any(t.state is AttemptState.PREEMPTED for t in tasks) or disrupted(tasks)


def failed_tries(job: Job) -> int:
    """Tries that failed by the job's own doing: a task FAILED, or (when the job asks for
    timeouts to be retried) stopped at its time limit. They count against
    `retry_failures`, not `max_attempts`."""
    return sum(1 for tasks in _tries(job).values() if _failed(tasks))


def retried_codes(job: Job) -> bool:
    """Whether the current try's failures are ones the job asks to retry: every FAILED
    task's exit code among `retry_exit_codes` (any, when none are listed)."""
    codes = job.spec.retry_exit_codes
    return not codes or all(t.exit_code in codes for t in job.current_tasks() if t.state is AttemptState.FAILED)


def uncounted_tries(job: Job) -> int:
    """Tries that do not count as tries used: preempted, or ended by a disruption."""
    return sum(1 for tasks in _tries(job).values() if _uncounted(tasks))


def used_tries(job: Job) -> int:
    """Tries counted against `max_attempts`: all but those uncounted and the job's own
    failures (the job's tries grouped once; a try that is both is left out once)."""
    return job.tries - sum(1 for tasks in _tries(job).values() if _uncounted(tasks) or _failed(tasks))


def decide(job: Job, ended: AttemptState, now: float) -> RetryDecision:
    if ended is AttemptState.PREEMPTED:
        # Requeued at once, keeping its submission time (its place in its queue).
        return RetryDecision(True, now, "preempted; requeued")
    if ended in (AttemptState.FAILED, AttemptState.TIMEOUT):
        spec = job.spec
        failed = failed_tries(job)
        asked = spec.retry_failures and (ended is AttemptState.FAILED or spec.retry_timeouts)
        if asked and failed <= spec.retry_failures and (ended is AttemptState.TIMEOUT or retried_codes(job)):
            what = "reached its time limit" if ended is AttemptState.TIMEOUT else "failed"
            return RetryDecision(True, now + failure_backoff_s(job, failed),
                                 f"try {job.tries} {what}: tried again ({failed} of {spec.retry_failures} retries)")
        if ended is AttemptState.TIMEOUT:
            return RetryDecision(False, why="time limit reached")
        if asked and failed > spec.retry_failures:
            return RetryDecision(False, why=f"failed {failed} times, its {spec.retry_failures} retries used")
        return RetryDecision(False, why="the attempt itself failed")
    if ended not in INFRASTRUCTURE_ENDINGS:
        return RetryDecision(False, why="the attempt itself failed")
    if disrupted(job.current_tasks()):
        if any(t.stop_kind == HOST for t in job.current_tasks()):
            # Its host could not start it: requeued after a moment, by which its agent's
            # heartbeat saying so has been read (found by exploring: placed straight back
            # there, a job went round up to 16 times in a fraction of a second, each try
            # kept in its record).
            return RetryDecision(True, now + HOST_TROUBLE_WAIT_S,
                                 "its host could not start it; requeued (not counted)")
        return RetryDecision(True, now, "stopped by a drain, its agent's shutdown or a requeue; requeued (not counted)")
    used = used_tries(job)
    if used >= job.spec.max_attempts:
        return RetryDecision(False, why=f"all {job.spec.max_attempts} attempts used")
    return RetryDecision(True, now + backoff_s(used), f"attempt {used} {ended.value.lower()}")
