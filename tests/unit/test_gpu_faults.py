"""plan_cycle and GPU faults: a try holding a GPU its host reports faulted is stopped and
tried again elsewhere; a task that failed on a faulted GPU is the infrastructure's
failure, not the job's."""

from __future__ import annotations

from server.scheduling.cycle.work import GPU_FAULT
from server.state.cluster import HostConfig
from tests.factories import heartbeat_record, job_spec
from tests.factories import job as make_job
from tests.unit.test_planner import NOW, World, report
from wire.messages import AttemptState, HostAlloc, JobState, StatusReport, decode, encode
from wire.records import Record

XID = "xid 79: GPU has fallen off the bus"


def fault(w: World, host_id: str, gpus: int, bad: tuple[int, ...], now: float = NOW) -> None:
    """The host's next heartbeat reports the GPUs in `bad` faulted."""
    rec = heartbeat_record(host_id, next(w.rev), shape=False, boot_id="boot", seq=1, ts=now, gpus=gpus,
                           cpus=64, memory_mb=256_000, unhealthy=bad, fault=XID)
    w.state.apply_host_record(rec, now=now)


def running(w: World, *job_ids: str, now: float = NOW) -> None:
    w.cycle(reports=[report(w, j, AttemptState.RUNNING, ts=now) for j in job_ids], now=now)


def two_running(a: str, b: str) -> World:
    """Host h1 with 2 GPUs, jobs `a` and `b` running on one each."""
    w = World(interval_s=3600.0)
    w.host("h1", gpus=2)
    w.submit(a, gpus=1)
    w.submit(b, gpus=1)
    w.cycle()
    running(w, a, b)
    return w


def test_a_try_on_a_faulted_gpu_is_stopped_then_tried_again_on_another() -> None:
    w = two_running("on0", "on1")
    assert w.job("on0").current.gpu_indices == [0] and w.job("on1").current.gpu_indices == [1]
    fault(w, "h1", 2, (0,))
    assert w.state.faulted_work == {"h1"}
    plan = w.cycle()
    assert plan.gpu_fault_stops == 1
    assert w.state.faulted_work == set()  # told to stop: nothing more to do there
    [stopped] = [t for t in w.tasks("h1") if t.stop]
    assert stopped.job_id == "on0" and "GPU 0 faulted (xid 79" in stopped.stop_reason
    a = w.job("on0").current
    assert a.stop_kind == GPU_FAULT and "GPU 0 faulted" in a.reason and a.state is AttemptState.RUNNING
    assert w.job("on1").current.stop_kind == ""
    assert w.cycle().gpu_fault_stops == 0  # asked once
    # The agent stops it (SIGTERM) and reports it KILLED: the job is tried again, and
    # the faulted GPU is never chosen; with GPU 1 busy it waits for another host.
    w.cycle(reports=[report(w, "on0", AttemptState.KILLED, exit_code=-15)])
    job = w.job("on0")
    assert job.state is JobState.QUEUED
    assert job.current.state is AttemptState.KILLED and "GPU 0 faulted (xid 79" in job.current.reason
    assert not any(t.job_id == "on0" for t in w.tasks("h1"))
    assert w.cycle().placed == 0
    w.host("h2", gpus=1)
    w.cycle()
    job = w.job("on0")
    assert job.state is JobState.PLACED and job.current.host_id == "h2" and job.tries == 2


def test_a_task_that_failed_on_a_faulted_gpu_is_retried_and_another_failure_is_not() -> None:
    w = two_running("sick", "buggy")
    # The process died with its GPU before the heartbeat told the leader: the agent's
    # report says what faulted.
    sick = w.job("sick").current
    w.cycle(reports=[
        StatusReport(host_id="h1", attempt_id=sick.id, job_id="sick", state=AttemptState.FAILED, exit_code=1,
                     ts=NOW, gpu_fault=f"GPU {sick.gpu_indices[0]} faulted ({XID})"),
        report(w, "buggy", AttemptState.FAILED, exit_code=1),
    ])
    job = w.job("sick")
    first = job.attempts[0]
    assert first.state is AttemptState.KILLED and first.exit_code == 1
    assert "faulted (xid 79" in first.reason and "exited with code 1" in first.reason
    assert w.job("buggy").state is JobState.FAILED
    # Tried again at once, in the same cycle: the heartbeat does not say the GPU faulted
    # yet, but the report did, so the new try got the GPU the other job left.
    assert job.state is JobState.PLACED and job.tries == 2
    assert job.current.gpu_indices != first.gpu_indices


def test_the_leader_knows_the_fault_from_the_heartbeat_when_the_report_does_not_say() -> None:
    w = World(interval_s=3600.0)
    w.host("h1", gpus=2)
    w.submit("j", gpus=1, max_attempts=1)
    w.cycle()
    running(w, "j")
    fault(w, "h1", 2, (w.job("j").current.gpu_indices[0],))
    # An agent of an earlier version reports the failure without the fault.
    w.cycle(reports=[report(w, "j", AttemptState.FAILED, exit_code=2)])
    job = w.job("j")
    assert job.current.state is AttemptState.KILLED and "faulted" in job.current.reason
    # Its one attempt is used: it fails, and says why.
    assert job.state is JobState.FAILED


def test_a_gang_is_stopped_whole_when_one_of_its_gpus_faults_and_retried_as_one() -> None:
    w = World(interval_s=3600.0)
    w.host("h1", gpus=1)
    w.host("h2", gpus=1)
    spec = job_spec("g", command=["x"], gpus=1, cpus=1, memory_mb=1, replicas=2)
    w.state.apply_state_record(Record("job.g", next(w.rev), encode(make_job("g", spec=spec, submitted_at=NOW - 9))))
    w.cycle()
    tasks = w.job("g").current_tasks()
    assert {t.host_id for t in tasks} == {"h1", "h2"}
    w.cycle(reports=[StatusReport(host_id=t.host_id, attempt_id=t.id, job_id="g", state=AttemptState.RUNNING,
                                  ts=NOW) for t in tasks])
    fault(w, "h2", 1, (0,))
    plan = w.cycle()
    assert plan.gpu_fault_stops == 1
    assert all(t.stop for h in ("h1", "h2") for t in w.tasks(h))
    on_h1 = next(t for t in w.job("g").current_tasks() if t.host_id == "h1")
    assert on_h1.stop_kind == GPU_FAULT and on_h1.reason.startswith("gang task on h2: GPU 0 faulted")
    # The first KILLED report waits for the other task; the second decides for the gang.
    first, second = w.job("g").current_tasks()
    w.cycle(reports=[StatusReport(host_id=first.host_id, attempt_id=first.id, job_id="g",
                                  state=AttemptState.KILLED, ts=NOW)])
    assert w.job("g").state is JobState.RUNNING
    w.cycle(reports=[StatusReport(host_id=second.host_id, attempt_id=second.id, job_id="g",
                                  state=AttemptState.KILLED, ts=NOW)])
    job = w.job("g")
    assert job.state is JobState.QUEUED and job.tries == 1
    assert all(t.state is AttemptState.KILLED for t in job.current_tasks())


def test_a_fault_on_a_gpu_no_task_holds_stops_nothing() -> None:
    w = World(interval_s=3600.0)
    w.host("h1", gpus=2)
    w.submit("j", gpus=1)
    w.cycle()
    running(w, "j")
    held = w.job("j").current.gpu_indices[0]
    fault(w, "h1", 2, (1 - held,))
    assert w.state.faulted_gpus == {"h1": frozenset({1 - held})} and w.state.faulted_work == set()
    plan = w.cycle()
    assert plan.gpu_fault_stops == 0 and not any(t.stop for t in w.tasks("h1"))
    # The GPU comes back healthy (a new agent after a reset): the host is no longer listed.
    w.host("h1", gpus=2)
    assert w.state.faulted_gpus == {}


def test_an_operators_clear_of_the_fault_marks_is_passed_to_the_agent_in_the_assignment() -> None:
    w = World(interval_s=3600.0)
    w.host("h1", gpus=2)
    w.submit("j", gpus=1)
    w.cycle()
    cfg = HostConfig(cordoned=True, reason="reset", gpu_clears={0: 2, 1: 1})
    w.state.apply_state_record(Record("hostcfg.h1", next(w.rev), cfg.model_dump_json().encode()))
    plan = w.cycle()
    alloc = w.state.allocs["h1"]
    assert plan.allocs["h1"].gpu_clears == {0: 2, 1: 1} and alloc.gpu_clears == {0: 2, 1: 1}
    assert [t.job_id for t in alloc.tasks] == ["j"]  # the tasks are kept
    again = decode(HostAlloc, alloc.to_json())
    assert again.gpu_clears == {0: 2, 1: 1} and again == alloc
    assert "h1" not in w.cycle().allocs  # passed once
    cfg = cfg.model_copy(update={"gpu_clears": {0: 2, 1: 2}})  # GPU 1 cleared again
    w.state.apply_state_record(Record("hostcfg.h1", next(w.rev), cfg.model_dump_json().encode()))
    w.cycle()
    assert w.state.allocs["h1"].gpu_clears == {0: 2, 1: 2}
    # A host the leader never assigned anything gets an assignment carrying the clear.
    w.host("h2", gpus=1)
    w.state.apply_state_record(Record("hostcfg.h2", next(w.rev),
                                      HostConfig(gpu_clears={0: 1}).model_dump_json().encode()))
    w.cycle()
    assert w.state.allocs["h2"].gpu_clears == {0: 1} and w.state.allocs["h2"].tasks == []
