"""Submission limits (server.scheduling.submitlimits): the jobs not ended per queue and
user, kept by the cluster state as records arrive, and the leader's check of NATS
submissions against them, counting the commits in flight and its own cycle. The API's
check is tested end to end in tests/integration/test_submitlimits.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling.planner import plan_cycle
from server.scheduling.submitlimits import JOB_LIMIT, OpenJobs, refusal
from server.state.cluster import ClusterState
from tests.factories import job as make_job
from tests.factories import job_spec, set_or_drop
from tests.unit.test_planner import NOW, TERM, World
from tests.unit.test_queue_planner import user_record
from wire.messages import JobState, Queue, SubmitRequest, encode
from wire.records import Record


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(user_record, st.integers(0, 7)), max_size=40))
def test_the_jobs_not_ended_kept_equal_a_count_afresh(steps: list) -> None:
    """Records set and dropped in any order (a job's queue, user and state changing between
    its records, ended ones included): what the state keeps is what counting every record
    gives."""
    state = ClusterState()
    for step in steps:
        set_or_drop(state, step)
        afresh = OpenJobs.of(state.jobs.values())
        for q in ("a", "b"):
            assert state.open_jobs.users(q) == afresh.users(q)
            assert state.open_jobs.total(q) == afresh.total(q) == sum(afresh.users(q).values())
            assert afresh.total(q) == sum(1 for j in state.jobs.values()
                                          if j.spec.queue == q and not j.state.terminal)


def _tally(*jobs: tuple[str, str, int]) -> OpenJobs:
    t = OpenJobs()
    for queue, user, n in jobs:
        t.add(queue, user, n)
    return t


def test_a_queue_refuses_past_its_limit_and_a_user_past_theirs() -> None:
    q = Queue(name="team", max_submitted_jobs=5, max_submitted_jobs_per_user=3)
    assert refusal(q, "alice", [_tally(("team", "alice", 2), ("team", "bob", 2))]) == ""
    why = refusal(q, "alice", [_tally(("team", "alice", 3), ("other", "alice", 9))])
    assert "alice has 3 jobs not ended in queue 'team'" in why and "maxSubmittedJobsPerUser 3" in why
    assert refusal(q, "bob", [_tally(("team", "alice", 3))]) == ""  # alice's count is hers only
    why = refusal(q, "bob", [_tally(("team", "alice", 3), ("team", "carol", 2))])
    assert "queue 'team' has 5 jobs not ended" in why and "maxSubmittedJobs 5" in why
    # Tallies add up; a change tally may take away (a job in flight ending).
    assert refusal(q, "alice", [_tally(("team", "alice", 3)), _tally(("team", "alice", -1))]) == ""
    assert refusal(q, "alice", [_tally(("team", "alice", 2)), _tally(("team", "alice", 1))]) != ""
    assert refusal(Queue(name="team"), "alice", [_tally(("team", "alice", 10**6))]) == ""  # 0: no limit


def _job(w: World, job_id: str, user: str, state: JobState = JobState.QUEUED) -> None:
    job = make_job(job_id, state=state, spec=job_spec(job_id, queue="team", user=user, gpus=0), submitted_at=NOW)
    w.state.apply_state_record(Record(f"job.{job_id}", next(w.rev), encode(job)))


def _sub(user: str, *ids: str) -> SubmitRequest:
    return SubmitRequest(user=user, ts=NOW, jobs=[{"id": i, "name": i, "command": ["true"], "queue": "team"}
                                                  for i in ids])


def test_the_leader_refuses_nats_submissions_past_a_limit_counting_commits_in_flight_and_its_cycle() -> None:
    w = World()
    q = Queue(name="team", max_submitted_jobs_per_user=3, max_submitted_jobs=5)
    w.state.apply_state_record(Record("queue.team", next(w.rev), encode(q)))
    _job(w, "stored-1", "alice")
    _job(w, "ended-1", "alice", JobState.SUCCEEDED)  # ended: not counted
    # A commit in flight creates one more of alice's (not in the state yet).
    flight = {"flight-1": make_job("flight-1", spec=job_spec("flight-1", queue="team", user="alice", gpus=0))}
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, pending=flight,
                      submissions=[_sub("alice", "new-job-a1", "new-job-a2"),
                                   _sub("bob", "new-job-b1", "new-job-b2", "new-job-b3")])
    assert "new-job-a1" in plan.jobs and "new-job-a2" not in plan.jobs  # 1 stored + 1 in flight + a1: 3
    assert {"new-job-b1", "new-job-b2"} <= set(plan.jobs) and "new-job-b3" not in plan.jobs  # the queue's 5
    refused = dict(plan.rejected)
    assert refused["new-job-a2"].startswith(f"{JOB_LIMIT}: alice has 3 jobs not ended in queue 'team'")
    assert refused["new-job-b3"].startswith(f"{JOB_LIMIT}: queue 'team' has 5 jobs not ended")
    assert plan.limited == {"team": 2}  # what the scheduler counts on /metrics
    # A commit in flight that ends one of alice's jobs makes room for one more.
    ending = {"stored-1": w.state.jobs["stored-1"].model_copy(update={"state": JobState.CANCELLED})}
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, pending=ending,
                      submissions=[_sub("alice", "new-job-a3", "new-job-a4", "new-job-a5", "new-job-a6")])
    assert {"new-job-a3", "new-job-a4", "new-job-a5"} <= set(plan.jobs) and "new-job-a6" not in plan.jobs
