"""muster_placement_latency_seconds runs from when a job could be placed (scheduler.placeable_since)."""

from __future__ import annotations

from server.scheduling.scheduler import placeable_since
from tests.factories import job_spec
from wire.messages import Attempt, AttemptState, Job


def _try(n: int, state: AttemptState, finished_at: float | None) -> Attempt:
    return Attempt(id=f"lat-job-1.{n}", job_id="lat-job-1", number=n, host_id="h1", state=state, term=1,
                   finished_at=finished_at)


def test_a_job_could_be_placed_since_its_last_try_ended_or_it_was_freed() -> None:
    """Found by exploring: a requeued job's placement counted from its submission, its
    earlier run (47 s) taken for the time it waited."""
    job = Job(id="lat-job-1", spec=job_spec("lat"), submitted_at=100.0, updated_at=100.0)
    assert placeable_since(job) == 100.0
    job.not_before = 130.0  # a begin time, or a retry's backoff
    assert placeable_since(job) == 130.0
    job.attempts = [_try(1, AttemptState.PREEMPTED, 180.0), _try(2, AttemptState.RUNNING, None)]
    assert placeable_since(job) == 180.0  # the try that ended; the one just placed is not counted
    job.freed_at = 200.0  # released from a hold after that
    assert placeable_since(job) == 200.0
