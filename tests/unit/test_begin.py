"""A job's begin time (`JobSpec.begin_at`, Slurm's `--begin`): its `not_before` from its
submission, so it is not placed before then; why pending says when it begins, or when a
retry backoff ends."""

from __future__ import annotations

from server.scheduling.planner import plan_cycle
from server.scheduling.queues import NOT_YET
from server.views.jobs import JobView
from tests.factories import job_spec
from tests.unit.test_gangs import NOW, World
from wire.messages import AttemptState, JobState, SubmitRequest, encode
from wire.records import Record
from wire.validation import validate_job


def test_a_begin_time_is_a_time_and_is_kept_in_the_spec() -> None:
    spec, errors = validate_job({"name": "a", "command": ["x"], "begin_at": NOW + 60})
    assert not errors and spec is not None and spec.begin_at == NOW + 60
    for bad in (-1, "soon", float("nan"), 2.0**40):
        _spec, errors = validate_job({"name": "a", "command": ["x"], "begin_at": bad})
        assert [e.field for e in errors] == ["beginAt"], bad


def test_a_job_is_not_placed_before_its_begin_time_and_says_when_it_begins() -> None:
    w = World()
    w.host("a")
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=1, submissions=[SubmitRequest(
        user="alice", ts=NOW, jobs=[{"id": "job-later", "name": "later", "command": ["x"], "begin_at": NOW + 60},
                                    {"id": "job-now-1", "name": "now", "command": ["x"]}])])
    # Over NATS as through the API (the replica's submit): not before its begin time.
    assert plan.jobs["job-later"].not_before == NOW + 60 and plan.jobs["job-now-1"].not_before == 0
    for job in plan.jobs.values():
        w.state.apply_state_record(Record(f"job.{job.id}", next(w.rev), encode(job)))
    w.cycle()
    assert w.job("job-now-1").state is JobState.PLACED and w.job("job-later").state is JobState.QUEUED
    why = JobView(w.state, None, half_life_s=0).queue_reasons(w.job("job-later"), NOW)
    assert [(r.reason, r.detail) for r in why] == [
        (NOT_YET, "not placed before its begin time (in about 60 s); not considered for placement until then")]
    w.cycle(now=NOW + 59)
    assert w.job("job-later").state is JobState.QUEUED
    w.cycle(now=NOW + 60)
    assert w.job("job-later").state is JobState.PLACED


def test_why_pending_names_a_retry_backoff() -> None:
    w = World()
    w.host("a")
    w.submit("flaky", gpus=1)
    for _ in range(2):  # the first retry comes at once, the second after 1 s (retry.backoff_s)
        w.cycle()
        w.cycle(reports=[w.report("flaky", 0, AttemptState.RUNNING)])
        w.cycle(reports=[w.report("flaky", 0, AttemptState.LOST)])
    job = w.job("flaky")
    assert job.state is JobState.QUEUED and job.not_before == NOW + 1
    why = JobView(w.state, None, half_life_s=0).queue_reasons(job, NOW)
    assert [(r.reason, r.detail) for r in why] == [
        (NOT_YET, "its next try waits out the retry backoff (in about 1 s) after try 2 ended")]
    assert job_spec("x").begin_at == 0.0 and job.spec.begin_at == 0.0


def test_a_held_job_with_a_begin_time_is_told_both() -> None:
    """Held, it is not placed until released; released before its begin time, not until
    then: why pending says both (the hold hid the begin time)."""
    from server.scheduling.queues import HELD

    w = World()
    w.host("a")
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=1, submissions=[SubmitRequest(
        user="alice", ts=NOW, jobs=[{"id": "job-later", "name": "later", "command": ["x"], "begin_at": NOW + 60,
                                     "held": True}])])
    for job in plan.jobs.values():
        w.state.apply_state_record(Record(f"job.{job.id}", next(w.rev), encode(job)))
    why = JobView(w.state, None, half_life_s=0).queue_reasons(w.job("job-later"), NOW)
    assert [r.reason for r in why] == [HELD, NOT_YET]
    assert why[1].detail.startswith("not placed before its begin time (in about 60 s)")


def test_a_job_kept_back_until_its_begin_time_has_no_queue_position_and_takes_none() -> None:
    """A job that begins tomorrow was shown first in its queue, and every job behind it one
    place further back than it stood."""
    w = World()
    w.host("a", gpus=1)
    w.submit("running", gpus=1)
    w.cycle()
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=1, submissions=[SubmitRequest(
        user="alice", ts=NOW, jobs=[{"id": "job-later", "name": "later", "command": ["x"], "begin_at": NOW + 86400,
                                     "gpus": 1},
                                    {"id": "job-next", "name": "next", "command": ["x"], "gpus": 1}])])
    for job in plan.jobs.values():
        w.state.apply_state_record(Record(f"job.{job.id}", next(w.rev), encode(job)))
    view = JobView(w.state, None, half_life_s=0)
    assert view.queue_position(w.job("job-later"), 0.0, NOW) is None
    assert view.queue_position(w.job("job-next"), 0.0, NOW) == 1
    # Once its begin time has passed it takes its place by submission again.
    assert view.queue_position(w.job("job-later"), 1.0, NOW + 86400) == 1
    assert view.queue_position(w.job("job-next"), 1.0, NOW + 86400) == 2
