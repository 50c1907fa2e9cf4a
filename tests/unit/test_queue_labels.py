"""A queue's host labels (`Queue.host_labels`: the hosts its jobs run on, a partition):
added to each job's own when it is placed, as the queue has them then, so that a queue
moved to other hosts takes its waiting jobs along; a job asking for another value of one
is refused at submission (API and NATS), and one whose queue changed so that its labels
conflict waits, saying why."""

from __future__ import annotations

import pytest

from server.scheduling.planner import plan_cycle
from server.scheduling.queues import LABEL_CONFLICT, label_conflict, placement_spec, queue_refusal
from server.views.jobs import JobView
from tests.factories import job, job_spec
from tests.unit.test_gangs import NOW, World
from wire.errors import InvalidInput
from wire.messages import JobState, Queue, SubmitRequest, encode
from wire.records import Record
from wire.validation import validate_queue


def test_a_queues_labels_are_added_to_a_jobs_when_it_is_placed_and_a_conflict_is_refused() -> None:
    q = Queue(name="team", host_labels={"rack": "rb"})
    own = job_spec("j", host_labels={"zone": "z1"})
    placed = placement_spec(own, q)
    assert placed is not None and placed.host_labels == {"rack": "rb", "zone": "z1"}
    assert own.host_labels == {"zone": "z1"}  # the job's own spec is not changed
    assert placement_spec(own, q) is placed  # made once while the queue's labels stay
    moved = placement_spec(own, Queue(name="team", host_labels={"rack": "rc"}))
    assert moved is not None and moved.host_labels == {"rack": "rc", "zone": "z1"}
    same = job_spec("j", host_labels={"rack": "rb"})
    assert placement_spec(same, q) is same and placement_spec(same, None) is same  # nothing to add
    other = job_spec("j", host_labels={"rack": "ra"})
    assert label_conflict(other, q) == "queue 'team' runs on hosts with rack=rb; the job asks for rack=ra"
    assert placement_spec(other, q) is None
    refused = queue_refusal(other, q)
    assert refused is not None and refused.field == "hostLabels" and queue_refusal(own, q) is None
    with pytest.raises(InvalidInput):
        validate_queue({"name": "team", "host_labels": {"Bad Key": "v"}})


def _queue(w: World, labels: dict[str, str]) -> None:
    w.state.apply_state_record(Record("queue.team", next(w.rev), encode(Queue(name="team", host_labels=labels))))


def test_a_nats_submission_to_a_queue_with_labels_runs_on_its_hosts() -> None:
    w = World()
    w.host("a", rack="ra")
    w.host("b", rack="rb")
    _queue(w, {"rack": "rb"})
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=1, submissions=[SubmitRequest(
        user="alice", ts=NOW, jobs=[
            {"id": "job-team-1", "name": "t", "command": ["x"], "queue": "team", "gpus": 1},
            {"id": "job-team-2", "name": "t", "command": ["x"], "queue": "team", "gpus": 1,
             "host_labels": {"rack": "ra"}}])])
    assert plan.jobs["job-team-1"].spec.host_labels == {}  # its own; the queue's apply where it is placed
    assert plan.jobs["job-team-1"].state is JobState.PLACED and plan.jobs["job-team-1"].attempts[0].host_id == "b"
    assert "job-team-2" not in plan.jobs
    assert dict(plan.rejected)["job-team-2"].startswith("hostLabels: queue 'team' runs on hosts with rack=rb")


def test_a_queue_moved_to_other_hosts_takes_its_waiting_jobs_along() -> None:
    """Jobs queued while the queue ran on rack ra (its one host full) are placed on rack rb
    once the operator moves the queue there; a job whose own labels ask for rack ra waits,
    and why pending says so."""
    w = World()
    w.host("a", rack="ra", gpus=1)
    w.host("b", rack="rb", gpus=2)
    _queue(w, {"rack": "ra"})
    for jid, labels in (("j-fill", {}), ("j-wait", {}), ("j-own", {"rack": "ra"})):
        rec = job(jid, spec=job_spec(jid, command=["x"], gpus=1, cpus=1, memory_mb=1, queue="team",
                                     host_labels=labels), submitted_at=NOW + len(labels))
        w.state.apply_state_record(Record(f"job.{jid}", next(w.rev), encode(rec)))
    w.cycle()
    assert w.job("j-fill").attempts[0].host_id == "a"
    assert w.job("j-wait").state is JobState.QUEUED and w.job("j-own").state is JobState.QUEUED
    _queue(w, {"rack": "rb"})
    w.cycle(now=NOW + 1)
    assert w.job("j-wait").state is JobState.PLACED and w.job("j-wait").attempts[0].host_id == "b"
    assert w.job("j-wait").spec.host_labels == {}
    assert w.job("j-fill").attempts[0].host_id == "a"  # placed work stays where it runs
    assert w.job("j-own").state is JobState.QUEUED  # room on b, but it asks for rack ra
    reasons = JobView(w.state, None).queue_reasons(w.job("j-own"), NOW + 1)
    assert [r.reason for r in reasons] == [LABEL_CONFLICT]
    assert "queue 'team' runs on hosts with rack=rb; the job asks for rack=ra" in reasons[0].detail
    # Moved back: it runs on a once j-fill's GPU is free ... and j-fill has not ended, so it
    # still waits, now for room.
    _queue(w, {"rack": "ra"})
    w.cycle(now=NOW + 2)
    assert w.job("j-own").state is JobState.QUEUED
    assert LABEL_CONFLICT not in [r.reason for r in JobView(w.state, None).queue_reasons(w.job("j-own"), NOW + 2)]


def test_a_labelled_copy_goes_with_its_spec() -> None:
    """Found by exploring: placement_spec's copies kept every spec they were made for, the
    ended jobs' too, up to 200,000 (about 1.5 GB at 500 jobs/s in a labelled queue). A
    copy is kept only while its spec lives, and handed out again while it does."""
    import gc

    from server.scheduling import queues as queues_module
    from wire.messages import Queue

    q = Queue(name="zoned", host_labels={"zone": "z1"})
    spec = job_spec("kept")
    ident = id(spec)
    first = queues_module.placement_spec(spec, q)
    assert first is not None and first.host_labels == {"zone": "z1"}
    # (Its own entry looked at, not the count: other tests' specs in this process may be
    # collected meanwhile, and their entries go with them.)
    assert queues_module.placement_spec(spec, q) is first and queues_module._LABELLED[ident][2] is first
    del spec, first
    gc.collect()
    assert ident not in queues_module._LABELLED
