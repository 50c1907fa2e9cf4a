"""Retries of a job's own failures (retry.decide with `retry_failures`, `retry_exit_codes`,
`retry_timeouts`): a failed try is tried again after a backoff up to the count asked for,
only for the exit codes listed, a timeout only when asked; such tries do not count
against `max_attempts`, which counts the infrastructure's failures."""

from __future__ import annotations

from server.scheduling import retry
from tests.factories import job as make_job
from tests.factories import job_spec
from tests.unit.test_gangs import NOW, World
from wire.budgets import check_spec
from wire.messages import Attempt, AttemptState, Job, JobSpec, JobState, encode
from wire.records import Record
from wire.validation import validate_job


def _tries(*ends: tuple[AttemptState, int | None]) -> list[Attempt]:
    return [Attempt(id=f"j.{n}", number=n, host_id="h", state=state, exit_code=code)
            for n, (state, code) in enumerate(ends, start=1)]


def _job(spec: JobSpec, *ends: tuple[AttemptState, int | None]) -> Job:
    return make_job("j", spec=spec, attempts=_tries(*ends))


F, T, L = AttemptState.FAILED, AttemptState.TIMEOUT, AttemptState.LOST


def test_failed_tries_are_retried_with_a_backoff_up_to_the_count_asked_for() -> None:
    spec = job_spec("j", retry_failures=2)
    first = retry.decide(_job(spec, (F, 1)), F, NOW)
    assert first.retry and first.not_before == NOW + 1 and first.why == "try 1 failed: tried again (1 of 2 retries)"
    second = retry.decide(_job(spec, (F, 1), (F, 1)), F, NOW)
    assert second.retry and second.not_before == NOW + 2
    third = retry.decide(_job(spec, (F, 1), (F, 1), (F, 1)), F, NOW)
    assert not third.retry and third.why == "failed 3 times, its 2 retries used"
    assert not retry.decide(_job(job_spec("j"), (F, 1)), F, NOW).retry  # none asked: as ever


def test_a_retry_delay_is_waited_before_the_first_retry_and_doubles_up_to_an_hour() -> None:
    """A job whose failures take time to clear (a service down) waits what it asks before
    each retry (the backoff was a constant: 1, 2, 4 ... s); a lost host's retry keeps the
    default."""
    spec = job_spec("j", retry_failures=20, retry_delay_s=600)
    waits = [retry.decide(_job(spec, *[(F, 1)] * n), F, NOW).not_before - NOW for n in range(1, 5)]
    assert waits == [600, 1200, 2400, 3600]
    assert retry.decide(_job(spec, *[(F, 1)] * 20), F, NOW).not_before == NOW + 3600
    # An hour asked: an hour each time (never less than the delay).
    assert retry.failure_backoff_s(_job(job_spec("j", retry_failures=5, retry_delay_s=3600)), 3) == 3600
    assert retry.decide(_job(spec, (F, 1), (L, None)), L, NOW).not_before == NOW  # the first infrastructure retry
    assert retry.decide(_job(spec, (L, None), (L, None)), L, NOW).not_before == NOW + 1
    # Validated: a number of seconds up to an hour, with retryFailures.
    spec2, errors = validate_job({"name": "a", "command": ["x"], "retry_failures": 2, "retry_delay_s": 30})
    assert not errors and spec2 is not None and spec2.retry_delay_s == 30.0
    for bad in (-1, 3601, "soon", float("nan"), True):
        _spec, errors = validate_job({"name": "a", "command": ["x"], "retry_failures": 2, "retry_delay_s": bad})
        assert [e.field for e in errors] == ["retryDelaySeconds"], bad
    _spec, errors = validate_job({"name": "a", "command": ["x"], "retry_delay_s": 30})
    assert [e.field for e in errors] == ["retryFailures"]


def test_only_the_exit_codes_listed_are_retried_and_a_timeout_only_when_asked() -> None:
    spec = job_spec("j", retry_failures=3, retry_exit_codes=[75])
    assert retry.decide(_job(spec, (F, 75)), F, NOW).retry
    assert not retry.decide(_job(spec, (F, 1)), F, NOW).retry
    assert not retry.decide(_job(job_spec("j", retry_failures=3), (T, None)), T, NOW).retry
    timed = retry.decide(_job(job_spec("j", retry_failures=3, retry_timeouts=True), (T, None)), T, NOW)
    assert timed.retry and "reached its time limit" in timed.why


def test_retried_failures_do_not_use_the_attempts_kept_for_the_infrastructure() -> None:
    spec = job_spec("j", retry_failures=5, max_attempts=2)
    # Two failures retried, then a lost host: one of its two attempts used, so it goes on.
    assert retry.decide(_job(spec, (F, 1), (F, 1), (L, None)), L, NOW).retry
    assert not retry.decide(_job(spec, (F, 1), (L, None), (L, None)), L, NOW).retry  # both attempts used
    # A gang's try with a task that failed and one preempted is left out once, not twice:
    # after it and a lost host, the one attempt kept for the infrastructure is used.
    both = [Attempt(id="j.1.0", number=1, task=0, host_id="h", state=F, exit_code=1),
            Attempt(id="j.1.1", number=1, task=1, host_id="h", state=AttemptState.PREEMPTED),
            Attempt(id="j.2.0", number=2, task=0, host_id="h", state=L),
            Attempt(id="j.2.1", number=2, task=1, host_id="h", state=L)]
    gang = make_job("j", spec=job_spec("j", replicas=2, retry_failures=5, max_attempts=1), attempts=both)
    assert retry.used_tries(gang) == 1 and not retry.decide(gang, L, NOW).retry


def test_retries_are_validated_and_bounded_by_what_the_record_holds() -> None:
    _spec, errors = validate_job({"name": "a", "command": ["x"], "retry_exit_codes": [1]})
    assert [e.field for e in errors] == ["retryFailures"]
    _spec, errors = validate_job({"name": "a", "command": ["x"], "retry_failures": 101})
    assert [e.field for e in errors] == ["retryFailures"]
    spec, errors = validate_job({"name": "a", "command": ["x"], "retry_failures": 3, "retry_exit_codes": [75, 1, 75]})
    assert not errors and spec is not None and spec.retry_exit_codes == [1, 75]
    # An exit code is 0-255, or -N for a task ended by signal N (as the agent reports it).
    spec, errors = validate_job({"name": "a", "command": ["x"], "retry_failures": 1, "retry_exit_codes": [-11, 255]})
    assert not errors and spec is not None and spec.retry_exit_codes == [-11, 255]
    for code in (256, -65, 2**31 - 1):
        _spec, errors = validate_job({"name": "a", "command": ["x"], "retry_failures": 1, "retry_exit_codes": [code]})
        assert [e.field for e in errors] == ["retryExitCodes"], code
    big = JobSpec(name="g", command=["x"], gpus=8, replicas=64, retry_failures=100)
    assert [f for f, _m in check_spec(big)] == ["retryFailures"]


def test_a_gang_whose_task_fails_is_retried_as_a_whole_then_succeeds() -> None:
    w = World()
    for h in "ab":
        w.host(h)
    job = make_job("g", spec=job_spec("g", command=["x"], gpus=8, cpus=1, memory_mb=1, replicas=2, retry_failures=1))
    w.state.apply_state_record(Record("job.g", next(w.rev), encode(job)))
    w.cycle()
    w.cycle(reports=[w.report("g", i, AttemptState.RUNNING) for i in range(2)])
    w.cycle(reports=[w.report("g", 0, AttemptState.FAILED, code=1)])  # the other is stopped with it
    w.cycle(reports=[w.report("g", 1, AttemptState.KILLED)])
    g = w.job("g")
    assert g.state is JobState.QUEUED and g.not_before == NOW + 1 and g.tries == 1
    w.cycle(now=NOW + 1)
    w.cycle(reports=[w.report("g", i, AttemptState.RUNNING) for i in range(2)], now=NOW + 1)
    w.cycle(reports=[w.report("g", i, AttemptState.FAILED, code=1) for i in range(2)], now=NOW + 2)
    g = w.job("g")
    assert g.state is JobState.FAILED and g.tries == 2  # its one retry used


def test_a_try_its_host_could_not_start_is_requeued_at_once_and_not_counted() -> None:
    """StatusReport.host_trouble (no space, memory, processes on the host): not the job's
    failure; a job of one attempt is tried again, at once (a review: such tries used up
    the job's attempts on the same host)."""
    w = World()
    w.host("a")
    w.submit("j", gpus=1, max_attempts=1)
    w.cycle()
    r = w.report("j", 0, AttemptState.KILLED).model_copy(update={"host_trouble": True,
                                                                  "reason": "the host could not start it: ..."})
    w.cycle(reports=[r])
    job = w.job("j")
    # Requeued, after a moment (its host's heartbeat saying so is read meanwhile).
    assert job.attempts[0].stop_kind == retry.HOST and job.state is JobState.QUEUED
    assert job.not_before == NOW + retry.HOST_TROUBLE_WAIT_S
    from server.views.jobs import JobView

    [why] = JobView(w.state, None, half_life_s=0).queue_reasons(job, NOW)
    assert why.detail == ("its host could not start try 1 (not counted): placed again in about 2 s, once that "
                          "host's heartbeat saying so has been read")
    w.cycle(now=NOW + retry.HOST_TROUBLE_WAIT_S)
    job = w.job("j")
    assert job.state is JobState.PLACED and job.tries == 2
    assert retry.used_tries(job) == 1  # the try now placed only
    # Without the flag (an older agent) it counts, and a job of one attempt ends.
    w.submit("k", gpus=1, max_attempts=1)
    w.cycle()
    w.cycle(reports=[w.report("k", 0, AttemptState.KILLED)])
    assert w.job("k").state is JobState.FAILED
