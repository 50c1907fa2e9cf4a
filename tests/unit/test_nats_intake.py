"""The leader's intake of NATS submissions (scheduling.cycle.submissions), cycle by cycle:
what it takes, skips and refuses, with earlier cycles' commits still in flight."""

from __future__ import annotations

from typing import Any

from server.scheduling.planner import Plan, plan_cycle
from server.state.cluster import ClusterState
from wire.messages import JobState, SubmitRequest

NOW = 1_000_000.0
TERM = 3


def _job(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": job_id, "name": "x", "command": ["true"], **fields}


def _cycle(state: ClusterState, *jobs: dict[str, Any], user: str = "alice", in_flight: tuple[Plan, ...] = (),
           now: float = NOW) -> Plan:
    """One cycle taking one submission of `jobs`, with `in_flight`'s commits not landed yet."""
    pending = {k: v for p in in_flight for k, v in p.jobs.items()}
    return plan_cycle(state, reports=[], commands=[], now=now, term=TERM,
                      submissions=[SubmitRequest(user=user, ts=now, nonce="n", used=[], jobs=list(jobs))],
                      frozen_jobs=set(pending), pending=pending)


def test_a_job_runs_after_one_an_earlier_cycle_is_still_committing() -> None:
    """Found by exploring: a client that published A, had it acknowledged, then published
    B to run after A had B refused ("dependency A is not known") whenever B's cycle came
    while A's commit was still in flight (up to three cycles are)."""
    state = ClusterState(heartbeat_interval_s=60)
    first = _cycle(state, _job("train-job-1"))
    second = _cycle(state, _job("eval-job-01", depends_on=["train-job-1"]), in_flight=(first,), now=NOW + 0.01)
    third = _cycle(state, _job("report-job1", depends_on=["eval-job-01", "train-job-1"]),
                   in_flight=(first, second), now=NOW + 0.02)
    assert second.rejected == [] and third.rejected == []
    assert second.jobs["eval-job-01"].waiting_for == ["train-job-1"]
    assert third.jobs["report-job1"].waiting_for == ["eval-job-01", "train-job-1"]
    assert third.jobs["report-job1"].state is JobState.QUEUED
    # One no cycle knows is still refused.
    fourth = _cycle(state, _job("orphan-job1", depends_on=["nosuch-job"]), in_flight=(first,))
    assert fourth.rejected == [("orphan-job1", "dependsOn: dependency nosuch-job is not known")]
