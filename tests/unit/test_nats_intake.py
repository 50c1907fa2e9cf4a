"""The leader's intake of NATS submissions (scheduling.cycle.submissions), cycle by cycle:
what it takes, skips and refuses, with earlier cycles' commits still in flight."""

from __future__ import annotations

from typing import Any

from server.scheduling.planner import Plan, plan_cycle
from server.state.cluster import ClusterState
from wire.messages import JobState, SubmitRequest, encode
from wire.records import Record

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



def _stored(state: ClusterState, plan: Plan) -> None:
    """What the scheduler does once a cycle's commit landed: its records reach the state."""
    for job in plan.jobs.values():
        state.apply_state_record(Record(f"job.{job.id}", len(state.revisions) + 100, encode(job)))


def test_an_id_sent_again_by_its_user_is_skipped_only_when_the_job_is_the_same() -> None:
    """Found by exploring: the same user's id that exists was skipped without a word even
    when the job sent differed (a corrected job under its first id: the first ran, and its
    submitter never heard that the correction was not). A job sent again unchanged (a
    publish sent again) is still skipped, held or not; a different one is refused, also
    when the first is created by the same cycle."""
    state = ClusterState(heartbeat_interval_s=60)
    _stored(state, _cycle(state, _job("train-job-1", gpus=1, env={"A": "1"})))
    for held in (False, True):
        again = _cycle(state, _job("train-job-1", gpus=1, env={"A": "1"}, held=held))
        assert again.rejected == [] and again.jobs == {}
    changed = _cycle(state, _job("train-job-1", gpus=2, env={"A": "2"}))
    assert changed.jobs == {} and changed.rejected == [
        ("train-job-1", "id: in use by your job train-job-1, which differs (env, gpus): a job sent again is skipped "
                        "only unchanged; choose another id")]
    # Two messages of one cycle: the first creates it, the second differs.
    plan = plan_cycle(state, reports=[], commands=[], now=NOW, term=TERM, submissions=[
        SubmitRequest(user="alice", ts=NOW, nonce="a", used=[], jobs=[_job("eval-job-01")]),
        SubmitRequest(user="alice", ts=NOW, nonce="b", used=[], jobs=[_job("eval-job-01")]),
        SubmitRequest(user="alice", ts=NOW, nonce="c", used=[], jobs=[_job("eval-job-01", name="y")])])
    assert list(plan.jobs) == ["eval-job-01"] and plan.jobs["eval-job-01"].spec.name == "x"
    assert plan.rejected == [("eval-job-01", "id: in use by your job eval-job-01, which differs (name): a job sent "
                                             "again is skipped only unchanged; choose another id")]


def test_held_and_every_field_of_the_wrong_type_is_refused_not_read_as_its_default() -> None:
    """Found by exploring: `"held": 1` (or 1.0) was taken, and the job was not held
    (1 == True); `"time_limit_s": ""`, `"env": []`, `"gpu_share": false` and the like were
    read as `... or 0` and taken as the defaults. Null is still the default, and "" still
    names the default queue, no GPU model or no MIG profile."""
    state = ClusterState(heartbeat_interval_s=60)
    wrong = {"held": 1, "time_limit_s": "", "env": [], "gpu_share": False, "gpu_memory_mb": "", "host_labels": [],
             "exclude_hosts": {}, "depends_on": "", "group": 0, "group_limit": False, "retry_failures": False,
             "retry_exit_codes": {}, "retry_delay_s": "", "begin_at": False, "queue": 0, "gpu_model": False,
             "mig_profile": 0}
    plan = _cycle(state, *(_job(f"wrong-{k.replace('_', '-')}", **{k: v}) for k, v in wrong.items()),
                  _job("wrong-held-float", held=1.0))
    assert plan.jobs == {}
    fields = {job_id: why.split(":")[0] for job_id, why in plan.rejected}
    assert fields == {"wrong-held": "held", "wrong-held-float": "held", "wrong-time-limit-s": "timeLimitSeconds",
                      "wrong-env": "env", "wrong-gpu-share": "gpuShare", "wrong-gpu-memory-mb": "gpuMemoryMb",
                      "wrong-host-labels": "hostLabels", "wrong-exclude-hosts": "excludeHosts",
                      "wrong-depends-on": "dependsOn", "wrong-group": "group", "wrong-group-limit": "groupLimit",
                      "wrong-retry-failures": "retryFailures", "wrong-retry-exit-codes": "retryExitCodes",
                      "wrong-retry-delay-s": "retryDelaySeconds", "wrong-begin-at": "beginAt", "wrong-queue": "queue",
                      "wrong-gpu-model": "gpuModel", "wrong-mig-profile": "migProfile"}, plan.rejected
    nulls = {k: None for k in wrong}
    fine = _cycle(state, _job("null-fields", **nulls), _job("empty-names", queue="", gpu_model="", mig_profile=""))
    assert fine.rejected == [] and set(fine.jobs) == {"null-fields", "empty-names"}
    spec = fine.jobs["null-fields"].spec
    assert (spec.queue, spec.time_limit_s, spec.env, spec.gpu_share, spec.gpu_model) == ("default", 0.0, {}, 0, None)
    assert fine.jobs["null-fields"].hold == "" and fine.jobs["empty-names"].spec.mig_profile is None
