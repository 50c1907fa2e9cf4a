"""Retry policy: whether a job whose attempt ended gets another attempt, and when.
Pure: a function of the job, how the attempt ended, and the clock."""

from __future__ import annotations

from dataclasses import dataclass

from wire.messages import AttemptState, Job

# Attempts that ended through no fault of the job's own code: the host was lost, the
# agent fenced itself or shut down. A nonzero exit is the job's own failure.
INFRASTRUCTURE_ENDINGS = (AttemptState.LOST, AttemptState.KILLED)
MAX_BACKOFF_S = 60.0


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


def preempted_tries(job: Job) -> int:
    """Tries that ended because they were preempted: they do not count as tries used."""
    return len({a.number for a in job.attempts if a.state is AttemptState.PREEMPTED})


def decide(job: Job, ended: AttemptState, now: float) -> RetryDecision:
    if ended is AttemptState.PREEMPTED:
        # Requeued at once, keeping its submission time (its place in its queue).
        return RetryDecision(True, now, "preempted; requeued")
    if ended is AttemptState.TIMEOUT:
        return RetryDecision(False, why="time limit reached")
    if ended not in INFRASTRUCTURE_ENDINGS:
        return RetryDecision(False, why="the attempt itself failed")
    used = job.tries - preempted_tries(job)
    if used >= job.spec.max_attempts:
        return RetryDecision(False, why=f"all {job.spec.max_attempts} attempts used")
    return RetryDecision(True, now + backoff_s(used), f"attempt {used} {ended.value.lower()}")
