"""A queue's host labels (`Queue.host_labels`: the hosts its jobs run on, a partition):
added to each job's own at submission, through the API and over NATS; a job asking for
another value of one is refused."""

from __future__ import annotations

import pytest

from server.scheduling.planner import plan_cycle
from server.scheduling.queues import with_queue_labels
from tests.factories import job_spec
from tests.unit.test_gangs import NOW, World
from wire.errors import InvalidInput
from wire.messages import MAX_HOST_LABELS, JobState, Queue, SubmitRequest, encode
from wire.records import Record
from wire.validation import validate_queue


def test_a_queues_labels_are_added_to_a_jobs_and_a_conflict_is_refused() -> None:
    q = Queue(name="team", host_labels={"rack": "rb"})
    spec, why = with_queue_labels(job_spec("j", host_labels={"zone": "z1"}), q)
    assert not why and spec.host_labels == {"rack": "rb", "zone": "z1"}
    same = job_spec("j", host_labels={"rack": "rb"})
    assert with_queue_labels(same, q) == (same, "")  # nothing to add: the spec as it was
    _spec, why = with_queue_labels(job_spec("j", host_labels={"rack": "ra"}), q)
    assert why == "queue 'team' runs on hosts with rack=rb; the job asks for rack=ra"
    many = job_spec("j", host_labels={f"k{i}": "v" for i in range(MAX_HOST_LABELS)})
    assert "more than 16" in with_queue_labels(many, q)[1]
    assert with_queue_labels(same, None) == (same, "")
    with pytest.raises(InvalidInput):
        validate_queue({"name": "team", "host_labels": {"Bad Key": "v"}})


def test_a_nats_submission_to_a_queue_with_labels_gets_them_and_runs_on_its_hosts() -> None:
    w = World()
    w.host("a", rack="ra")
    w.host("b", rack="rb")
    w.state.apply_state_record(Record("queue.team", next(w.rev), encode(Queue(name="team",
                                                                               host_labels={"rack": "rb"}))))
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=1, submissions=[SubmitRequest(
        user="alice", ts=NOW, jobs=[
            {"id": "job-team-1", "name": "t", "command": ["x"], "queue": "team", "gpus": 1},
            {"id": "job-team-2", "name": "t", "command": ["x"], "queue": "team", "gpus": 1,
             "host_labels": {"rack": "ra"}}])])
    assert plan.jobs["job-team-1"].spec.host_labels == {"rack": "rb"}
    assert plan.jobs["job-team-1"].state is JobState.PLACED and plan.jobs["job-team-1"].attempts[0].host_id == "b"
    assert "job-team-2" not in plan.jobs
    assert dict(plan.rejected)["job-team-2"].startswith("hostLabels: queue 'team' runs on hosts with rack=rb")
