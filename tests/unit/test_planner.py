"""plan_cycle: placement, status reports, cancels, retries, queue order, purity, key cap."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.scheduling import retry
from server.scheduling.cycle.admission import queue_order
from server.scheduling.cycle.reports import REPORT_DELAY_S
from server.scheduling.eviction import EvictionBudget
from server.scheduling.planner import Plan, plan_cycle
from server.state.cluster import ClusterState, HostConfig
from tests.factories import heartbeat_record, job_spec
from tests.factories import job as make_job
from wire.messages import Attempt, AttemptState, Command, HostAlloc, Job, JobState, StatusReport, encode
from wire.records import Record

NOW = 1_000_000.0
TERM = 7


class World:
    """A ClusterState fed through real encoded records, with a revision counter."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.state = ClusterState(heartbeat_interval_s=interval_s)
        self.rev = itertools.count(1)

    def host(
        self,
        host_id: str,
        *,
        gpus: int = 8,
        model: str = "H100",
        cpus: int = 64,
        memory_mb: int = 256_000,
        unhealthy: tuple[int, ...] = (),
        now: float = NOW,
    ) -> None:
        rec = heartbeat_record(host_id, next(self.rev), shape=False, boot_id="boot", seq=0, ts=now, gpus=gpus,
                               model=model, unhealthy=unhealthy, cpus=cpus, memory_mb=memory_mb)
        self.state.apply_host_record(rec, now=now)

    def submit(
        self,
        job_id: str,
        *,
        gpus: int = 0,
        model: str | None = None,
        cpus: float = 1.0,
        memory_mb: int = 512,
        priority: int = 0,
        max_attempts: int = 3,
        submitted_at: float = NOW - 100,
    ) -> None:
        spec = job_spec(job_id, command=["run", job_id], gpus=gpus, gpu_model=model, cpus=cpus, memory_mb=memory_mb,
                        priority=priority, max_attempts=max_attempts)
        job = make_job(job_id, spec=spec, submitted_at=submitted_at)
        self.state.apply_state_record(Record(f"job.{job_id}", next(self.rev), encode(job)))

    def alloc_record(self, alloc: HostAlloc) -> None:
        self.state.apply_state_record(Record(f"alloc.{alloc.host_id}", next(self.rev), encode(alloc)))

    def commit(self, plan: Plan) -> None:
        """What the scheduler does after a successful commit: apply the records."""
        for job in plan.jobs.values():
            self.state.apply_state_record(Record(f"job.{job.id}", next(self.rev), encode(job)))
        for alloc in plan.allocs.values():
            self.alloc_record(alloc)

    def cycle(
        self,
        *,
        reports: list[StatusReport] | None = None,
        commands: list[Command] | None = None,
        now: float = NOW,
        term: int = TERM,
        max_keys: int = 900,
        commit: bool = True,
    ) -> Plan:
        plan = plan_cycle(self.state, reports=reports or [], commands=commands or [], now=now, term=term,
                          max_keys=max_keys)
        if commit:
            self.commit(plan)
        return plan

    def job(self, job_id: str) -> Job:
        return self.state.jobs[job_id]

    def tasks(self, host_id: str) -> list:
        alloc = self.state.allocs.get(host_id)
        return list(alloc.tasks) if alloc else []


def report(world: World, job_id: str, state: AttemptState, *, exit_code: int | None = None,
           attempt_id: str | None = None, host_id: str | None = None, ts: float = NOW) -> StatusReport:
    cur = world.job(job_id).current
    assert cur is not None or (attempt_id and host_id)
    return StatusReport(
        host_id=host_id or cur.host_id,
        attempt_id=attempt_id or cur.id,
        job_id=job_id,
        state=state,
        exit_code=exit_code,
        ts=ts,
        output_tail="out",
    )


def cancel(job_id: str, by: str = "alice", reason: str = "") -> Command:
    return Command(kind="cancel", job_id=job_id, by=by, reason=reason, ts=NOW)


def dump(state: ClusterState) -> dict:
    return {
        "hosts": {k: (e.heartbeat.model_dump() if e.heartbeat else None, e.revision, e.seen_at, e.present)
                  for k, e in state.hosts.items()},
        "jobs": {k: j.model_dump() for k, j in state.jobs.items()},
        "allocs": {k: a.model_dump() for k, a in state.allocs.items()},
        "revisions": dict(state.revisions),
    }


@pytest.fixture
def w() -> World:
    world = World(interval_s=3600.0)  # the clock moves by minutes at most in these tests
    world.host("h1", gpus=8, cpus=64)
    return world


# ---------------------------------------------------------------- placement


def test_queued_job_is_placed(w: World) -> None:
    w.submit("j1", gpus=2, model="H100", cpus=4, memory_mb=2048)
    plan = w.cycle(commit=False)
    assert plan.placed == 1
    job = plan.jobs["j1"]
    assert job.state is JobState.PLACED
    assert job.updated_at == NOW
    assert len(job.attempts) == 1
    a = job.attempts[0]
    assert a.number == 1
    assert a.id == "j1.1"
    assert a.host_id == "h1"
    assert a.gpu_indices == [0, 1]
    assert a.state is AttemptState.PLACED
    assert a.term == TERM
    assert a.placed_at == NOW
    alloc = plan.allocs["h1"]
    assert alloc.term == TERM
    assert len(alloc.tasks) == 1
    t = alloc.tasks[0]
    assert (t.attempt_id, t.job_id, t.number) == ("j1.1", "j1", 1)
    assert t.command == ["run", "j1"]
    assert t.gpu_indices == [0, 1]
    assert t.cpus == 4.0 and t.memory_mb == 2048
    assert t.term == TERM and t.stop is False
    assert [e.kind for e in plan.events] == ["job.placed"]
    ev = plan.events[0]
    assert (ev.job_id, ev.host_id, ev.attempt_id) == ("j1", "h1", "j1.1")
    assert ev.data == {"state": "PLACED"}
    assert plan.keys == 2


def test_second_job_gets_other_gpus_in_same_cycle_and_next(w: World) -> None:
    w.submit("a", gpus=3, submitted_at=1)
    w.submit("b", gpus=3, submitted_at=2)
    plan = w.cycle()
    assert plan.jobs["a"].attempts[0].gpu_indices == [0, 1, 2]
    assert plan.jobs["b"].attempts[0].gpu_indices == [3, 4, 5]
    w.submit("c", gpus=3, submitted_at=3)
    w.submit("d", gpus=2, submitted_at=4)
    plan = w.cycle()
    assert "c" not in plan.jobs  # only 2 GPUs left
    assert plan.jobs["d"].attempts[0].gpu_indices == [6, 7]
    assert w.job("c").state is JobState.QUEUED


def test_higher_priority_first_fifo_within_priority() -> None:
    w = World()
    w.host("h1", gpus=2)
    w.submit("low-old", gpus=1, priority=0, submitted_at=1)
    w.submit("high-new", gpus=1, priority=5, submitted_at=50)
    w.submit("high-old", gpus=1, priority=5, submitted_at=10)
    w.submit("mid", gpus=1, priority=1, submitted_at=0)
    order = [j.id for j in queue_order(list(w.state.jobs.values()))]
    assert order == ["high-old", "high-new", "mid", "low-old"]
    plan = w.cycle()
    assert set(plan.jobs) == {"high-old", "high-new"}
    assert [e.job_id for e in plan.events] == ["high-old", "high-new"]
    assert w.job("mid").state is JobState.QUEUED
    assert w.job("low-old").state is JobState.QUEUED


def test_queue_order_ties_broken_by_id() -> None:
    w = World()
    w.submit("b", submitted_at=5)
    w.submit("a", submitted_at=5)
    assert [j.id for j in queue_order(list(w.state.jobs.values()))] == ["a", "b"]


def test_job_that_does_not_fit_stays_queued_and_untouched(w: World) -> None:
    w.submit("big", gpus=16)
    w.submit("wrong", gpus=1, model="A100")
    w.submit("fits", gpus=1, submitted_at=NOW)
    before = w.job("big").model_dump()
    plan = w.cycle(commit=False)
    assert "big" not in plan.jobs and "wrong" not in plan.jobs
    assert plan.jobs["fits"].state is JobState.PLACED
    assert w.job("big").model_dump() == before
    assert all(e.job_id == "fits" for e in plan.events)


def test_no_hosts_means_nothing_placed() -> None:
    w = World()
    w.submit("j1")
    plan = w.cycle()
    assert plan.placed == 0 and not plan.jobs and not plan.allocs and not plan.events


def test_unhealthy_gpus_are_not_assigned() -> None:
    w = World()
    w.host("h1", gpus=4, unhealthy=(0, 1))
    w.submit("j", gpus=2)
    plan = w.cycle()
    assert plan.jobs["j"].attempts[0].gpu_indices == [2, 3]
    w.submit("k", gpus=1)
    assert w.cycle().placed == 0


def test_stale_host_is_not_used() -> None:
    w = World()
    w.host("h1", now=NOW - 60)  # 12 intervals without a heartbeat: SUSPECT
    w.submit("j")
    assert w.cycle().placed == 0


def test_existing_allocation_is_respected() -> None:
    w = World()
    w.host("h1", gpus=2, cpus=8)
    w.submit("j1", gpus=1)
    w.cycle()
    assert w.tasks("h1")[0].gpu_indices == [0]
    w.submit("j2", gpus=1)
    plan = w.cycle()
    assert plan.jobs["j2"].attempts[0].gpu_indices == [1]
    assert [t.attempt_id for t in w.tasks("h1")] == ["j1.1", "j2.1"]


def test_not_before_delays_placement(w: World) -> None:
    w.submit("j")
    job = w.job("j").model_copy(deep=True)
    job.not_before = NOW + 10
    w.state.apply_state_record(Record("job.j", next(w.rev), encode(job)))
    assert w.cycle(now=NOW + 5).placed == 0
    assert w.cycle(now=NOW + 10).placed == 1


# ---------------------------------------------------------------- reports


def placed(w: World, job_id: str = "j1", **kw) -> None:
    w.submit(job_id, **kw)
    plan = w.cycle()
    assert plan.jobs[job_id].state is JobState.PLACED


def test_running_report_moves_placed_to_running(w: World) -> None:
    placed(w)
    plan = w.cycle(reports=[report(w, "j1", AttemptState.RUNNING, ts=NOW + 1)], now=NOW + 2)
    job = plan.jobs["j1"]
    assert job.state is JobState.RUNNING
    assert job.attempts[0].state is AttemptState.RUNNING
    assert job.attempts[0].started_at == NOW + 1
    assert job.updated_at == NOW + 2
    assert [e.kind for e in plan.events] == ["job.running"]
    assert plan.ignored == 0
    # A repeated RUNNING report carries nothing new.
    plan = w.cycle(reports=[report(w, "j1", AttemptState.RUNNING)])
    assert plan.ignored == 1 and not plan.jobs and not plan.events


@pytest.mark.parametrize("skew", [-3600.0, -30.0, 0.0, 3600.0])
def test_a_reports_time_is_bounded_by_when_the_store_stored_it(w: World, skew: float) -> None:
    """Found by exploring: an agent whose clock was an hour behind ran a 2-hour try (from
    NOW + 1 to NOW + 7201), and its reports, dated by its clock, had the try end an hour
    early: charged half its run. A report's time is taken within REPORT_DELAY_S before
    when the status stream stored it, and never after; a clock ahead, read late, is
    bounded by the stored time, not by when the leader reads it. Within the tolerance the
    agent's clock stands."""
    placed(w, gpus=4)

    def cycle(r: StatusReport, stored: float, now: float) -> Plan:
        plan = plan_cycle(w.state, reports=[r], commands=[], now=now, term=TERM, max_keys=900,
                          report_stamps=[stored])
        w.commit(plan)
        return plan

    cycle(report(w, "j1", AttemptState.RUNNING, ts=NOW + 1 + skew), NOW + 1, NOW + 1)
    cycle(report(w, "j1", AttemptState.SUCCEEDED, exit_code=0, ts=NOW + 7201 + skew), NOW + 7201, NOW + 9000)
    a = w.job("j1").attempts[0]
    if skew == -3600.0:
        assert (a.started_at, a.finished_at) == (NOW, NOW + 7201 - REPORT_DELAY_S)  # not before its placement
    elif skew == 3600.0:
        assert (a.started_at, a.finished_at) == (NOW + 1, NOW + 7201)
    else:
        assert (a.started_at, a.finished_at) == (max(NOW, NOW + 1 + skew), NOW + 7201 + skew)


def test_succeeded_frees_the_alloc_task(w: World) -> None:
    placed(w, gpus=8, cpus=64)
    w.submit("waiting", gpus=1, submitted_at=NOW)
    assert w.cycle().placed == 0  # host full
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING)])
    ended = report(w, "j1", AttemptState.SUCCEEDED, exit_code=0, ts=NOW + 3).model_copy(update={"gpu_util_pct": 71.5})
    plan = w.cycle(reports=[ended], now=NOW + 5)
    job = plan.jobs["j1"]
    assert job.state is JobState.SUCCEEDED
    a = job.attempts[0]
    assert a.state is AttemptState.SUCCEEDED
    assert a.exit_code == 0 and a.finished_at == NOW + 3 and a.output_tail == "out"
    assert a.gpu_util_pct == 71.5  # how busy its GPUs were over its run, as its agent reported
    kinds = [e.kind for e in plan.events]
    assert kinds[0] == "job.succeeded"
    # The freed capacity is used in the same cycle.
    assert plan.jobs["waiting"].state is JobState.PLACED
    assert [t.attempt_id for t in w.tasks("h1")] == ["waiting.1"]


def test_terminal_report_without_running_sets_started_at(w: World) -> None:
    placed(w)
    plan = w.cycle(reports=[report(w, "j1", AttemptState.SUCCEEDED, exit_code=0, ts=NOW + 4)], now=NOW + 5)
    a = plan.jobs["j1"].attempts[0]
    assert a.started_at == NOW + 4 and a.finished_at == NOW + 4
    assert w.tasks("h1") == []


def test_a_reports_time_is_kept_within_what_the_leader_knows(w: World) -> None:
    """Found by exploring: a report dated a day ahead (an agent's clock, or a forged one)
    was taken as it was, and `usage` counted the finished attempt's GPU-hours for that day.
    A time ahead of the leader's is now; one before the placement is the placement's. A
    MIG attempt keeps no GPU utilisation (NVML tells none per instance)."""
    placed(w)
    placed_at = w.job("j1").current.placed_at
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING, ts=placed_at - 50)], now=NOW + 1)
    assert w.job("j1").current.started_at == placed_at
    ahead = report(w, "j1", AttemptState.SUCCEEDED, exit_code=0, ts=NOW + 86400)
    a = w.cycle(reports=[ahead], now=NOW + 10).jobs["j1"].attempts[0]
    assert a.finished_at == NOW + 10
    placed(w, "m1")  # as if on a MIG instance
    rec = w.job("m1").model_copy(deep=True)
    rec.attempts[0].mig = ["MIG-abc"]
    w.state.apply_state_record(Record("job.m1", next(w.rev), encode(rec)))
    busy = report(w, "m1", AttemptState.SUCCEEDED, exit_code=0, ts=NOW + 11).model_copy(update={"gpu_util_pct": 80.0})
    assert w.cycle(reports=[busy], now=NOW + 12).jobs["m1"].attempts[0].gpu_util_pct is None


def test_failed_with_exit_code_fails_the_job(w: World) -> None:
    placed(w, max_attempts=5)
    plan = w.cycle(reports=[report(w, "j1", AttemptState.FAILED, exit_code=3)], now=NOW + 1)
    job = plan.jobs["j1"]
    assert job.state is JobState.FAILED
    assert job.attempts[0].state is AttemptState.FAILED
    assert job.attempts[0].exit_code == 3
    assert len(job.attempts) == 1  # own failures are not retried
    ev = [e for e in plan.events if e.kind == "job.failed"]
    assert len(ev) == 1 and ev[0].message == "exit code 3"
    assert plan.allocs["h1"].tasks == []
    # Never placed again.
    assert w.cycle(now=NOW + 100).placed == 0


def test_an_oom_kill_is_the_failed_attempts_reason_and_the_jobs(w: World) -> None:
    placed(w)
    why = "oom-killed: the kernel killed 1 process of the task for using more than its memory limit of 64 MB"
    r = report(w, "j1", AttemptState.FAILED, exit_code=-9).model_copy(update={"reason": why})
    plan = w.cycle(reports=[r], now=NOW + 1)
    job = plan.jobs["j1"]
    assert job.state is JobState.FAILED and job.attempts[0].reason == why
    assert [e.message for e in plan.events if e.kind == "job.failed"] == [f"exit code -9 ({why})"]


def test_output_tail_is_truncated(w: World) -> None:
    placed(w)
    r = report(w, "j1", AttemptState.FAILED, exit_code=1)
    r.output_tail = "x" * 10000 + "END"
    plan = w.cycle(reports=[r])
    tail = plan.jobs["j1"].attempts[0].output_tail
    assert len(tail) == 4096 and tail.endswith("END")


@pytest.mark.parametrize("ending", [AttemptState.LOST, AttemptState.KILLED])
def test_lost_or_killed_requeues_with_next_attempt_and_backoff(w: World, ending: AttemptState) -> None:
    placed(w, gpus=1, max_attempts=3)
    # Attempt 1 ends: requeued with no backoff, and placed again in the same cycle.
    plan = w.cycle(reports=[report(w, "j1", ending)], now=NOW + 1)
    job = plan.jobs["j1"]
    assert job.state is JobState.PLACED
    assert job.attempts[0].state is ending
    assert job.not_before == NOW + 1
    assert [e.kind for e in plan.events] == ["job.requeued", "job.placed"]
    assert plan.placed == 1
    assert [a.number for a in job.attempts] == [1, 2]
    assert job.attempts[1].id == "j1.2"
    assert job.attempts[1].gpu_indices == [0]
    assert [t.attempt_id for t in w.tasks("h1")] == ["j1.2"]
    # Attempt 2 ends: backoff of 1 s before the third.
    plan = w.cycle(reports=[report(w, "j1", ending)], now=NOW + 10)
    assert plan.jobs["j1"].state is JobState.QUEUED
    assert plan.jobs["j1"].not_before == NOW + 11
    assert w.cycle(now=NOW + 10.5).placed == 0
    assert w.job("j1").state is JobState.QUEUED
    plan = w.cycle(now=NOW + 11)
    assert plan.placed == 1
    assert [a.number for a in plan.jobs["j1"].attempts] == [1, 2, 3]
    # Attempt 3 ends: all attempts used.
    plan = w.cycle(reports=[report(w, "j1", ending)], now=NOW + 20)
    job = plan.jobs["j1"]
    assert job.state is JobState.FAILED
    assert len(job.attempts) == 3
    ev = [e for e in plan.events if e.kind == "job.failed"]
    assert len(ev) == 1 and "all 3 attempts used" in ev[0].message
    assert w.cycle(now=NOW + 1000).placed == 0
    assert w.tasks("h1") == []


def test_work_on_a_host_never_heard_of_is_requeued() -> None:
    """A leader that starts after a host's key expired and was removed has the host's
    alloc record but no record of the host: its work is lost, not waited on forever."""
    w = World(interval_s=3600.0)
    w.host("h1")
    placed(w)
    # A new leader: the job and alloc records, no record of h1; h2 is alive.
    fresh = World(interval_s=3600.0)
    fresh.host("h2")
    for key, rec in (("job.j1", w.job("j1")), ("alloc.h1", w.state.allocs["h1"])):
        fresh.state.apply_state_record(Record(key, 100 + len(fresh.state.revisions), encode(rec)))
    assert fresh.state.unheard == {"h1"}
    plan = plan_cycle(fresh.state, reports=[], commands=[], now=NOW + 1, term=TERM, max_keys=900,
                      budget=EvictionBudget())
    job = plan.jobs["j1"]
    assert job.attempts[0].state is AttemptState.LOST
    assert job.state is JobState.PLACED and job.current.host_id == "h2"
    assert plan.allocs["h1"].tasks == [] and plan.evicted == 1


def test_unheard_host_keeps_its_work_through_the_grace_period_and_heartbeating_again_ends_it() -> None:
    """A whole NATS cluster restarted with the hosts bucket lost: every host has work but
    no record. Nothing is evicted within the grace period; a host that heartbeats again
    keeps its work; one still unheard after the grace period is replaced."""
    w = World(interval_s=3600.0)
    w.host("h1")
    w.host("h2")
    placed(w, "j1", gpus=8)  # a whole host each
    placed(w, "j2", gpus=8)
    where = {j: w.job(j).current.host_id for j in ("j1", "j2")}
    assert sorted(where.values()) == ["h1", "h2"]
    fresh = World(interval_s=3600.0)
    fresh.host("h3")
    for key, rec in [(f"job.{j}", w.job(j)) for j in ("j1", "j2")] + \
                    [(f"alloc.{h}", w.state.allocs[h]) for h in ("h1", "h2")]:
        fresh.state.apply_state_record(Record(key, 100 + len(fresh.state.revisions), encode(rec)))
    assert fresh.state.unheard == {"h1", "h2"}
    since = {"h1": NOW, "h2": NOW}

    def cycle(now: float) -> Plan:
        return plan_cycle(fresh.state, reports=[], commands=[], now=now, term=TERM, max_keys=900,
                          budget=EvictionBudget(), unheard_since=since, unheard_grace_s=15.0)

    plan = cycle(NOW + 14.9)
    assert plan.evicted == 0 and plan.held_unheard == 2 and not plan.jobs
    # j1's host heartbeats again: it is no longer unheard and keeps its work.
    fresh.host(where["j1"])
    assert fresh.state.unheard == {where["j2"]}
    plan = cycle(NOW + 15.0)
    assert plan.evicted == 1 and plan.held_unheard == 0
    assert plan.jobs["j2"].attempts[0].state is AttemptState.LOST
    assert plan.jobs["j2"].current.host_id == "h3"
    assert "j1" not in plan.jobs


def test_work_on_a_lost_host_waits_until_the_status_reports_are_read_up_to_its_expiry() -> None:
    """h1's key expired at NOW + 10. Its work is replaced only once every status report
    stored before then has been given to a cycle: a report the agent stored first (its task
    finished) ends the attempt instead, and the finished work does not run again."""
    w = World(interval_s=3600.0)
    w.host("h1")
    w.host("h2")
    placed(w, "j1", gpus=8)
    placed(w, "j2", gpus=8)
    on = {w.job(j).current.host_id: j for j in ("j1", "j2")}
    lost = "h1"
    w.state.apply_host_record(Record(lost, next(w.rev), None), now=NOW + 10)
    w.host("h3")  # somewhere for the work to go

    def cycle(read_to: float | None, reports: list[StatusReport] = (), stamps: list[float] = (),
              max_keys: int = 900) -> Plan:
        return plan_cycle(w.state, reports=list(reports), commands=[], now=NOW + 11, term=TERM,
                          max_keys=max_keys, budget=EvictionBudget(), reports_read_to=read_to,
                          report_stamps=list(stamps))

    plan = cycle(NOW + 9.9)
    assert plan.evicted == 0 and plan.held_for_reports == 1 and not plan.jobs
    # The report its agent stored at NOW + 9, read now: the attempt ends as reported.
    done = report(w, on[lost], AttemptState.SUCCEEDED, exit_code=0)
    plan = cycle(NOW + 10.5, [done], [NOW + 9])
    assert plan.evicted == 0 and plan.held_for_reports == 0
    assert plan.jobs[on[lost]].state is JobState.SUCCEEDED and len(plan.jobs[on[lost]].attempts) == 1
    # A report left for the next cycle (key cap) stored before the expiry still holds it.
    other = report(w, on["h2"], AttemptState.RUNNING)
    plan = cycle(NOW + 10.5, [other, other], [NOW + 9, NOW + 9], max_keys=259)  # room for one
    assert plan.reports_used == 1 and plan.evicted == 0 and plan.held_for_reports == 1
    # Read past the expiry with nothing from h1: its work is replaced; unknown: no wait.
    for read_to in (NOW + 10.5, None):
        plan = cycle(read_to)
        assert plan.evicted == 1 and plan.held_for_reports == 0
        assert plan.jobs[on[lost]].attempts[0].state is AttemptState.LOST


@pytest.mark.parametrize("keep_running", [False, True])
def test_a_try_on_a_lost_host_ends_when_its_host_was_lost_not_when_there_was_room(keep_running: bool) -> None:
    """Found by exploring: h1's key expired at NOW + 10 with its 8-GPU try running, and no
    host had room for it for 8 h; the try ended LOST when room appeared, its record (and
    the accounting) charging it 8 h of the 8 GPUs. It ends when its host was lost; a
    KEEP_RUNNING try, which its agent keeps running through `replaceAfter`, when it was
    due to be replaced."""
    w = World(interval_s=3600.0)
    w.host("h1")
    extra = {"on_disconnect": "KEEP_RUNNING", "replace_after_s": 300.0} if keep_running else {}
    spec = job_spec("j1", command=["run"], gpus=8, **extra)
    w.state.apply_state_record(Record("job.j1", next(w.rev), encode(make_job("j1", spec=spec, submitted_at=NOW))))
    w.cycle()
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING, ts=NOW + 1)], now=NOW + 1)
    w.state.apply_host_record(Record("h1", next(w.rev), None), now=NOW + 10)

    def cycle(now: float) -> Plan:
        plan = plan_cycle(w.state, reports=[], commands=[], now=now, term=TERM, max_keys=900,
                          budget=EvictionBudget())
        w.commit(plan)
        return plan

    for now in (NOW + 60, NOW + 3600):
        plan = cycle(now)
        assert plan.evicted == 0 and plan.held_no_capacity + plan.held_keep_running == 1
    w.host("h2", now=NOW + 8 * 3600)  # room, 8 h later
    plan = cycle(NOW + 8 * 3600)
    assert plan.evicted == 1
    first = w.job("j1").attempts[0]
    assert first.state is AttemptState.LOST and first.started_at == NOW + 1
    assert first.finished_at == (NOW + 10 + 300 if keep_running else NOW + 10)
    assert w.job("j1").current.number == 2 and w.job("j1").current.host_id == "h2"


@pytest.mark.parametrize("said", ["heartbeat", "report"])
def test_work_placed_on_a_host_that_left_is_requeued_uncounted_when_it_expires(said: str) -> None:
    """Found by exploring: every agent stopped at once, the leader placed a try on a host
    whose agent was shutting down (before it read so); the agent exited without giving it
    back, and at the host's expiry the try ended LOST, counted against maxAttempts. A try
    never started on a host that said it was leaving ends KILLED by that shutdown instead:
    not counted. One that had started still ends LOST."""
    w = World(interval_s=3600.0)
    w.host("h1")
    w.host("h2")
    placed(w, "j1", gpus=8, max_attempts=1)
    placed(w, "j2", gpus=8, max_attempts=1)
    where = {j: w.job(j).current.host_id for j in ("j1", "j2")}
    started = next(j for j, h in where.items() if h == "h1")
    w.cycle(reports=[report(w, started, AttemptState.RUNNING)])
    for h in ("h1", "h2"):  # both leaving; neither agent tells of the unstarted try
        if said == "heartbeat":
            w.state.apply_host_record(heartbeat_record(h, next(w.rev), shape=False, leaving=True, ts=NOW + 1),
                                      now=NOW + 1)
        else:
            w.state.mark_leaving(h, NOW + 1)
        w.state.apply_host_record(Record(h, next(w.rev), None), now=NOW + 10)
    w.host("h3", now=NOW + 10)
    w.host("h4", now=NOW + 10)
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW + 11, term=TERM, max_keys=900,
                      budget=EvictionBudget())
    unstarted = next(j for j in where if j != started)
    first = plan.jobs[unstarted].attempts[0]
    assert (first.state, first.stop_kind) == (AttemptState.KILLED, retry.SHUTDOWN), first
    assert plan.jobs[unstarted].state is JobState.PLACED  # tried again, though max_attempts is 1
    assert plan.jobs[started].attempts[0].state is AttemptState.LOST
    assert plan.jobs[started].state is JobState.FAILED


def test_lost_with_single_attempt_fails(w: World) -> None:
    placed(w, max_attempts=1)
    plan = w.cycle(reports=[report(w, "j1", AttemptState.LOST)])
    assert plan.jobs["j1"].state is JobState.FAILED


def test_late_report_for_earlier_attempt_is_ignored(w: World) -> None:
    placed(w)
    old = report(w, "j1", AttemptState.RUNNING)
    w.cycle(reports=[report(w, "j1", AttemptState.LOST)])
    w.cycle()
    assert w.job("j1").current.number == 2
    before = dump(w.state)
    plan = w.cycle(reports=[old], commit=False)
    assert plan.ignored == 1 and not plan.jobs and not plan.allocs and not plan.events
    assert dump(w.state) == before


@pytest.mark.parametrize("kind", ["unknown job", "unknown attempt", "wrong host", "terminal attempt"])
def test_bad_reports_are_ignored_and_change_nothing(w: World, kind: str) -> None:
    w.host("h2")
    placed(w, "j1")
    placed(w, "done")
    w.cycle(reports=[report(w, "done", AttemptState.SUCCEEDED, exit_code=0)])
    cur = w.job("j1").current
    if kind == "unknown job":
        r = StatusReport(host_id=cur.host_id, attempt_id="nope.1", job_id="nope", state=AttemptState.FAILED, ts=NOW)
    elif kind == "unknown attempt":
        r = StatusReport(host_id=cur.host_id, attempt_id="j1.9", job_id="j1", state=AttemptState.FAILED, ts=NOW)
    elif kind == "wrong host":
        other = "h2" if cur.host_id == "h1" else "h1"
        r = report(w, "j1", AttemptState.FAILED, host_id=other, exit_code=1)
    else:
        r = report(w, "done", AttemptState.LOST)
    before = dump(w.state)
    plan = w.cycle(reports=[r], commit=False)
    assert plan.ignored == 1
    assert plan.jobs == {} and plan.allocs == {} and plan.events == []
    assert dump(w.state) == before


def test_duplicate_terminal_report_in_one_batch_is_ignored(w: World) -> None:
    placed(w)
    r = report(w, "j1", AttemptState.SUCCEEDED, exit_code=0)
    plan = w.cycle(reports=[r, r], commit=False)
    assert plan.jobs["j1"].state is JobState.SUCCEEDED
    assert plan.ignored == 1
    assert [e.kind for e in plan.events] == ["job.succeeded"]


def test_running_after_terminal_in_one_batch_does_not_reopen_attempt(w: World) -> None:
    placed(w)
    done = report(w, "j1", AttemptState.SUCCEEDED, exit_code=0)
    late = report(w, "j1", AttemptState.RUNNING)
    plan = w.cycle(reports=[done, late], commit=False)
    job = plan.jobs["j1"]
    assert job.state is JobState.SUCCEEDED
    assert job.attempts[0].state is AttemptState.SUCCEEDED


def test_cancel_after_success_in_same_cycle_keeps_success(w: World) -> None:
    placed(w)
    plan = w.cycle(reports=[report(w, "j1", AttemptState.SUCCEEDED, exit_code=0)], commands=[cancel("j1")],
                   commit=False)
    assert plan.jobs["j1"].state is JobState.SUCCEEDED
    assert plan.ignored == 1


# ---------------------------------------------------------------- cancel


def test_cancel_queued_job(w: World) -> None:
    w.submit("big", gpus=64)
    plan = w.cycle(commands=[cancel("big", by="bob")], now=NOW + 1)
    job = plan.jobs["big"]
    assert job.state is JobState.CANCELLED
    assert job.cancel_reason == "cancelled by bob"
    assert job.attempts == []
    assert job.updated_at == NOW + 1
    assert plan.allocs == {}
    assert [e.kind for e in plan.events] == ["job.cancelled"]


def test_cancel_queued_job_that_would_fit_is_not_placed(w: World) -> None:
    w.submit("j1")
    plan = w.cycle(commands=[cancel("j1", reason="not needed")])
    assert plan.jobs["j1"].state is JobState.CANCELLED
    assert plan.jobs["j1"].cancel_reason == "not needed"
    assert plan.placed == 0 and plan.allocs == {}
    assert w.cycle().placed == 0


def test_cancel_running_job_holds_capacity_until_killed(w: World) -> None:
    placed(w, "j1", gpus=8)
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING)])
    w.submit("next", gpus=1, submitted_at=NOW)
    plan = w.cycle(commands=[cancel("j1")])
    job = plan.jobs["j1"]
    assert job.state is JobState.CANCELLED
    assert job.attempts[0].state is AttemptState.RUNNING
    assert job.attempts[0].reason == "cancelled by alice"
    tasks = w.tasks("h1")
    assert len(tasks) == 1 and tasks[0].attempt_id == "j1.1" and tasks[0].stop is True
    assert tasks[0].stop_reason == "cancelled by alice"  # what the agent reports the attempt ended for
    assert "next" not in plan.jobs  # the GPUs are still held
    assert w.cycle().placed == 0
    # The agent reports the process gone: capacity is freed and reused at once.
    plan = w.cycle(reports=[report(w, "j1", AttemptState.KILLED)])
    job = plan.jobs["j1"]
    assert job.state is JobState.CANCELLED
    assert job.attempts[0].state is AttemptState.KILLED
    assert len(job.attempts) == 1
    assert [e.kind for e in plan.events][0] == "attempt.stopped"
    assert plan.jobs["next"].state is JobState.PLACED
    assert [t.attempt_id for t in w.tasks("h1")] == ["next.1"]


def update(job_id: str, *, priority: int | None = None, hold: bool | None = None, reason: str = "") -> Command:
    return Command(kind="update", job_id=job_id, by="alice", reason=reason, priority=priority, hold=hold, ts=NOW)


def test_a_held_job_is_not_placed_until_released_and_keeps_its_place(w: World) -> None:
    w.host("h1", gpus=1)
    w.submit("old", gpus=1, submitted_at=NOW - 100)
    w.submit("new", gpus=1, submitted_at=NOW - 50)
    plan = w.cycle(commands=[update("old", hold=True, reason="dataset not ready")])
    assert plan.jobs["old"].state is JobState.QUEUED and plan.jobs["old"].hold == "held by alice: dataset not ready"
    assert plan.jobs["new"].state is JobState.PLACED  # the held job is passed over in the same cycle
    assert [e.kind for e in plan.events][0] == "job.updated"
    assert list(w.state.backlog.ids()) == [] and w.state.backlog.held == {"old": "default"}
    # Holding a job that is not queued changes nothing; a release puts it back in its place.
    assert w.cycle(commands=[update("new", hold=True)]).ignored == 1
    assert w.job("new").hold == ""
    w.cycle(reports=[report(w, "new", AttemptState.SUCCEEDED, exit_code=0)])
    assert w.job("old").state is JobState.QUEUED
    plan = w.cycle(commands=[update("old", hold=False)])
    assert plan.jobs["old"].state is JobState.PLACED and plan.jobs["old"].hold == ""
    assert w.state.backlog.held == {}
    # A held job cancelled is no longer held.
    w.submit("third", gpus=1)
    w.cycle(commands=[update("third", hold=True)])
    assert w.state.backlog.held == {"third": "default"}
    plan = w.cycle(commands=[cancel("third")])
    assert plan.jobs["third"].state is JobState.CANCELLED and plan.jobs["third"].hold == ""
    assert w.state.backlog.held == {}


def test_a_job_submitted_held_over_nats_is_not_placed(w: World) -> None:
    from wire.messages import SubmitRequest

    sub = SubmitRequest(user="u", ts=NOW, jobs=[{"id": "held-job-1", "name": "h", "command": ["true"], "held": True},
                                                {"id": "free-job-1", "name": "f", "command": ["true"]}])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub])
    held = plan.jobs["held-job-1"]
    assert held.state is JobState.QUEUED and held.hold == "held by u at submission"
    assert plan.jobs["free-job-1"].state is JobState.PLACED


def test_a_nats_submission_to_a_queue_that_does_not_exist_is_rejected(w: World) -> None:
    """As the API refuses one; found by exploring: it was stored and waited for ever."""
    from wire.messages import SubmitRequest

    sub = SubmitRequest(user="u", ts=NOW, jobs=[{"id": "lost-queue-1", "name": "x", "command": ["true"],
                                                 "queue": "nosuchqueue"}])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub])
    assert "lost-queue-1" not in plan.jobs
    assert plan.rejected == [("lost-queue-1", "queue: no queue named 'nosuchqueue'")]


def test_a_nats_submission_over_its_queues_maximum_time_limit_is_rejected(w: World) -> None:
    """As the API refuses one (found by exploring: it was taken, and its limit cut to the
    maximum without a word to its submitter)."""
    from wire.messages import Queue, SubmitRequest, encode
    from wire.records import Record

    w.state.apply_state_record(Record("queue.tl", 900, encode(Queue(name="tl", max_time_limit_s=60))))
    sub = SubmitRequest(user="u", ts=NOW, jobs=[
        {"id": "too-long-1", "name": "x", "command": ["true"], "queue": "tl", "time_limit_s": 100},
        {"id": "in-time-1", "name": "y", "command": ["true"], "queue": "tl", "time_limit_s": 60}])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub])
    assert "too-long-1" not in plan.jobs and "in-time-1" in plan.jobs
    assert plan.rejected == [("too-long-1", "timeLimitSeconds: queue 'tl' allows at most 60 s")]


def test_a_nats_submissions_ids_and_fields_are_checked(w: World) -> None:
    """Found by exploring, each dropped without a word (or worse): an id given twice in a
    message, another user's job's id (alice's job never made, bob's kept), an id an
    earlier job had (history's, or a record gone: it ran a second job under the first's
    id), a misspelt field (`gpu`: it ran without a GPU), a `held` that is not a boolean
    (held "yes" ran). The same user's id again is a retried publish: skipped."""
    from wire.messages import SubmitRequest

    def job(job_id: str, **kw: object) -> dict[str, object]:
        return {"id": job_id, "name": "x", "command": ["true"], **kw}

    w.commit(plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM,
                        submissions=[SubmitRequest(user="bob", ts=NOW, jobs=[job("nightly-etl-1")])]))
    assert w.job("nightly-etl-1").spec.user == "bob"
    w.state.revisions["job.gone-job-1"] = 5  # an expired record, as ClusterState keeps its revision
    sub = SubmitRequest(user="alice", ts=NOW, used=["old-job-01"], jobs=[
        job("twice-job-1"), job("twice-job-1", name="y"), job("nightly-etl-1"), job("old-job-01"),
        job("gone-job-1"), job("typo-job-1", gpu=2), job("held-job-1", held="yes"), job("fine-job-1", held=False)])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub])
    assert set(plan.jobs) == {"twice-job-1", "fine-job-1"} and plan.jobs["twice-job-1"].spec.name == "x"
    assert plan.rejected == [
        ("twice-job-1", "id: given twice in this submission"),
        ("nightly-etl-1", "id: another user's job has it (choose another id)"),
        ("old-job-01", "id: an earlier job had it, and ids are never reused (choose another)"),
        ("gone-job-1", "id: an earlier job had it, and ids are never reused (choose another)"),
        ("typo-job-1", "gpu: no such field (the stored spec's names: gpus, memory_mb, time_limit_s, ...)"),
        ("held-job-1", "held: must be true or false")]
    # bob's publish again: skipped, nothing said.
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM,
                      submissions=[SubmitRequest(user="bob", ts=NOW, jobs=[job("nightly-etl-1")])])
    assert plan.rejected == [] and "nightly-etl-1" not in plan.jobs


def test_a_nats_submission_sent_for_a_queue_is_of_that_queue_only(w: World) -> None:
    """Sent on muster.submit.<user>.<queue> (what a submitter bound to queues may publish
    on; found by exploring: its credentials put jobs in any queue): a job naming no queue
    is in it, one naming another is refused. The subject's user and queue are the
    leader's reading (wire.subjects.submitter_of), a client's body is not."""
    from wire import subjects
    from wire.messages import Queue, SubmitRequest, encode
    from wire.records import Record

    assert subjects.submitter_of("muster.submit.alice") == ("alice", "")
    assert subjects.submitter_of("muster.submit.alice.research") == ("alice", "research")
    for bad in ("muster.submit.alice.Research", "muster.submit.alice.a.b", "muster.submit.", "muster.other.x"):
        assert subjects.submitter_of(bad) is None, bad
    for name in ("research", "prod"):
        w.state.apply_state_record(Record(f"queue.{name}", 900, encode(Queue(name=name))))
    sub = SubmitRequest(user="alice", ts=NOW, queue="research", jobs=[
        {"id": "no-queue-01", "name": "x", "command": ["true"]},
        {"id": "its-queue-1", "name": "x", "command": ["true"], "queue": "research"},
        {"id": "elsewhere-1", "name": "x", "command": ["true"], "queue": "prod"}])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub])
    assert {i: j.spec.queue for i, j in plan.jobs.items()} == {"no-queue-01": "research", "its-queue-1": "research"}
    assert plan.rejected == [("elsewhere-1", "queue: sent for queue 'research', it names 'prod'")]


def after(w: World, job_id: str, deps: list[str], *, any_end: bool = False, not_ok: bool = False,
          gpus: int = 1) -> None:
    """Submit `job_id` to run after `deps`, waiting for those of them not ended (as the API does)."""
    spec = job_spec(job_id, command=["run", job_id], gpus=gpus, depends_on=deps, depend_any=any_end,
                    depend_not_ok=not_ok)
    waiting = [d for d in deps if not w.job(d).state.terminal]
    w.state.apply_state_record(Record(f"job.{job_id}", next(w.rev), encode(
        make_job(job_id, spec=spec, submitted_at=NOW - 50, waiting_for=waiting))))


def test_a_job_cancelled_while_it_waits_for_others_waits_for_none(w: World) -> None:
    """Found by exploring: a cancelled job kept its `waitingFor` (listed "CANCELLED after")."""
    w.submit("prep-job", gpus=1)
    w.cycle()
    after(w, "train-job", ["prep-job"])
    plan = w.cycle(commands=[cancel("train-job")], now=NOW + 1)
    job = plan.jobs["train-job"]
    assert job.state is JobState.CANCELLED and job.waiting_for == []
    w.commit(plan)
    assert "train-job" not in w.state.backlog.waiting


def test_a_job_runs_after_its_dependencies_succeed(w: World) -> None:
    w.submit("prep-job", gpus=1)
    w.cycle()
    after(w, "train-job", ["prep-job"])
    plan = w.cycle()
    assert "train-job" not in plan.jobs and w.state.backlog.waiting == {"train-job": "default"}
    assert w.state.deps.due == set()  # nothing to look at while prep runs
    w.cycle(reports=[report(w, "prep-job", AttemptState.RUNNING)])
    assert "train-job" not in w.cycle().jobs
    w.cycle(reports=[report(w, "prep-job", AttemptState.SUCCEEDED, exit_code=0)])
    assert w.state.deps.due == {"train-job"}
    plan = w.cycle()
    assert plan.jobs["train-job"].waiting_for == [] and plan.jobs["train-job"].state is JobState.PLACED
    assert w.state.deps.due == set() and w.state.backlog.waiting == {}


def test_a_failed_dependency_cancels_its_dependents_down_the_chain(w: World) -> None:
    w.submit("prep-job", gpus=1, max_attempts=1)
    w.cycle()
    after(w, "train-job", ["prep-job"])
    after(w, "eval-job", ["train-job"])
    after(w, "cleanup-job", ["train-job"], any_end=True)
    w.cycle(reports=[report(w, "prep-job", AttemptState.FAILED, exit_code=1)])
    plan = w.cycle()
    assert plan.jobs["train-job"].state is JobState.CANCELLED
    assert plan.jobs["train-job"].cancel_reason == "dependency prep-job ended FAILED: it could never run (afterok)"
    assert [e.kind for e in plan.events] == ["job.cancelled"]
    plan = w.cycle()  # the next link: afterok cancelled, afterany free to run
    assert plan.jobs["eval-job"].state is JobState.CANCELLED
    assert plan.jobs["cleanup-job"].state is JobState.PLACED and plan.jobs["cleanup-job"].waiting_for == []


def test_an_afternotok_job_runs_after_a_failure_and_a_success_cancels_it(w: World) -> None:
    w.submit("train-job", gpus=1, max_attempts=1)
    w.submit("eval-job", gpus=1)
    w.cycle()
    after(w, "alert-job", ["train-job"], not_ok=True)
    after(w, "cleanup-job", ["eval-job"], not_ok=True)
    w.cycle(reports=[report(w, "train-job", AttemptState.FAILED, exit_code=1),
                     report(w, "eval-job", AttemptState.SUCCEEDED, exit_code=0)])
    plan = w.cycle()
    assert plan.jobs["alert-job"].state is JobState.PLACED and plan.jobs["alert-job"].waiting_for == []
    assert plan.jobs["cleanup-job"].state is JobState.CANCELLED
    assert plan.jobs["cleanup-job"].cancel_reason == ("dependency eval-job ended SUCCEEDED: it could never run "
                                                      "(afternotok)")


def test_the_dependency_rules_decide_alike_for_every_end() -> None:
    from server.scheduling.dependencies import waits

    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.RUNNING):
        dep = make_job("dep-job", state=state)
        for any_end, not_ok, runs in ((False, False, state is JobState.SUCCEEDED), (True, False, True),
                                      (False, True, state is not JobState.SUCCEEDED)):
            spec = job_spec("x", depends_on=["dep-job"], depend_any=any_end, depend_not_ok=not_ok)
            left, never = waits(spec, ["dep-job"], {"dep-job": dep}.get)
            if not state.terminal:
                assert (left, never) == (["dep-job"], None)
            else:
                assert left == [] and (never is None) is runs, (state, any_end, not_ok)


def test_a_dependency_whose_record_is_gone_cancels_the_job(w: World) -> None:
    w.submit("prep-job", gpus=1)
    after(w, "train-job", ["prep-job"])
    w.state.apply_state_record(Record("job.prep-job", next(w.rev), None))
    plan = w.cycle()
    assert plan.jobs["train-job"].state is JobState.CANCELLED
    assert plan.jobs["train-job"].cancel_reason.startswith("dependency prep-job is not known")


def test_a_nats_submission_runs_after_a_job_of_the_same_batch(w: World) -> None:
    from wire.messages import SubmitRequest

    sub = SubmitRequest(user="u", ts=NOW, jobs=[
        {"id": "first-job", "name": "a", "command": ["true"], "gpus": 1},
        {"id": "second-job", "name": "b", "command": ["true"], "depends_on": ["first-job"]},
        {"id": "orphan-job", "name": "c", "command": ["true"], "depends_on": ["nosuch-job"]}])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub])
    assert plan.jobs["second-job"].waiting_for == ["first-job"] and plan.jobs["second-job"].state is JobState.QUEUED
    assert plan.rejected == [("orphan-job", "dependsOn: dependency nosuch-job is not known")]


def test_a_nats_submission_runs_after_a_job_only_history_has_as_the_api_would(w: World) -> None:
    """Found by exploring: a dependency known only to history (its record expired) was
    accepted over GraphQL, which reads history, and refused over NATS as not known. The
    leader marks the submission with what history holds of it (SubmitRequest.recorded):
    the planner judges it by that end, by the same rules."""
    from wire.messages import SubmitRequest

    sub = SubmitRequest(user="u", ts=NOW, recorded={"etl-done-01": JobState.SUCCEEDED,
                                                     "etl-fail-01": JobState.FAILED}, jobs=[
        {"id": "after-ok-01", "name": "a", "command": ["true"], "depends_on": ["etl-done-01"]},
        {"id": "after-ok-02", "name": "b", "command": ["true"], "depends_on": ["etl-fail-01"]},
        {"id": "after-not-ok", "name": "c", "command": ["true"], "depends_on": ["etl-fail-01"],
         "depend_not_ok": True}])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub])
    assert plan.jobs["after-ok-01"].waiting_for == [] and plan.jobs["after-ok-01"].state is JobState.PLACED
    assert plan.jobs["after-not-ok"].waiting_for == []
    assert plan.rejected == [("after-ok-02", "dependsOn: dependency etl-fail-01 ended FAILED")]


def requeue(job_id: str, *, hold: bool = False, reason: str = "") -> Command:
    return Command(kind="requeue", job_id=job_id, by="alice", reason=reason, hold=hold, ts=NOW)


def test_a_requeue_stops_the_try_and_queues_the_job_again_uncounted(w: World) -> None:
    placed(w, "j1", gpus=8, max_attempts=1)
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING)])
    w.submit("next", gpus=8, submitted_at=NOW - 10)  # behind j1 in the queue, waiting for its GPUs
    plan = w.cycle(commands=[requeue("j1", reason="bad node")])
    a = plan.jobs["j1"].attempts[0]
    assert (a.state, a.stop_kind, a.reason) == (AttemptState.RUNNING, "requeue", "requeued by alice: bad node")
    assert [(t.attempt_id, t.stop) for t in w.tasks("h1")] == [("j1.1", True)]
    assert w.cycle(commands=[requeue("j1")]).ignored == 1  # already stopping
    # The task is gone: the job is queued again at its old place (ahead of `next`), and
    # the try is not counted (one attempt allowed, a second made).
    plan = w.cycle(reports=[report(w, "j1", AttemptState.KILLED)])
    job = plan.jobs["j1"]
    assert job.attempts[0].state is AttemptState.KILLED and len(job.attempts) == 2
    assert job.state is JobState.PLACED
    # `next` stays queued (its record may gain the reservation it now holds on h1).
    assert "next" not in plan.jobs or plan.jobs["next"].state is JobState.QUEUED


def test_a_requeue_with_hold_leaves_the_job_held(w: World) -> None:
    placed(w, "j1", gpus=8)
    plan = w.cycle(commands=[requeue("j1", hold=True, reason="check the data")])
    assert plan.jobs["j1"].hold == "held by alice: check the data"
    plan = w.cycle(reports=[report(w, "j1", AttemptState.KILLED)])
    assert plan.jobs["j1"].state is JobState.QUEUED and len(plan.jobs["j1"].attempts) == 1
    assert w.state.backlog.held == {"j1": "default"}
    assert w.cycle(commands=[requeue("j1")]).ignored == 1  # a queued job: nothing to requeue


def test_a_priority_change_moves_a_job_in_its_queue(w: World) -> None:
    w.host("h1", gpus=0)  # nothing fits until a GPU comes
    w.submit("a", gpus=1, submitted_at=NOW - 100)
    w.submit("b", gpus=1, submitted_at=NOW - 50)
    plan = w.cycle(commands=[update("b", priority=5)])
    assert plan.jobs["b"].spec.priority == 5 and plan.events[0].message == "priority 0 -> 5"
    assert [j.id for j in w.state.queued()] == ["b", "a"]
    w.host("h1", gpus=1)
    assert w.cycle().jobs["b"].state is JobState.PLACED
    assert w.job("a").state is JobState.QUEUED
    # The same priority again is no change.
    assert w.cycle(commands=[update("a", priority=0)]).ignored == 1


def test_a_drain_past_its_deadline_stops_the_hosts_tasks_saying_so(w: World) -> None:
    placed(w, "j1", gpus=8)
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING)])
    cfg = HostConfig(cordoned=True, draining=True, drain_deadline=NOW - 1, reason="reboot", by="alice")
    w.state.apply_state_record(Record("hostcfg.h1", next(w.rev), cfg.model_dump_json().encode()))
    w.cycle()
    tasks = w.tasks("h1")
    assert [(t.attempt_id, t.stop, t.stop_reason) for t in tasks] == [("j1.1", True, "host h1 drained: reboot")]
    # The agent stops the task and reports the task's stop reason as the attempt's.
    killed = report(w, "j1", AttemptState.KILLED).model_copy(update={"reason": tasks[0].stop_reason})
    plan = w.cycle(reports=[killed])
    assert plan.jobs["j1"].attempts[0].reason == "host h1 drained: reboot"


def test_a_drained_try_is_requeued_at_once_and_not_counted_against_max_attempts(w: World) -> None:
    """A drain is the operator's doing, not the job's: the try it stops does not use one of
    the job's attempts (a later plain kill still does)."""
    placed(w, "j1", gpus=8, max_attempts=1)
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING)])
    cfg = HostConfig(cordoned=True, draining=True, drain_deadline=NOW - 1, reason="reboot", by="alice")
    w.state.apply_state_record(Record("hostcfg.h1", next(w.rev), cfg.model_dump_json().encode()))
    plan = w.cycle()
    assert plan.jobs["j1"].attempts[0].stop_kind == "drain"
    killed = report(w, "j1", AttemptState.KILLED).model_copy(update={"reason": w.tasks("h1")[0].stop_reason})
    w.cycle(reports=[killed], now=NOW + 1)
    job = w.job("j1")
    assert job.state is JobState.QUEUED and job.not_before == NOW + 1
    assert job.attempts[0].state is AttemptState.KILLED and job.attempts[0].reason == "host h1 drained: reboot"
    # Placed on another host, and killed there by the infrastructure: its one attempt is used.
    w.state.apply_state_record(Record("hostcfg.h1", next(w.rev), HostConfig().model_dump_json().encode()))
    w.host("h2", gpus=8)
    w.cycle(now=NOW + 2)
    assert w.job("j1").state is JobState.PLACED and w.job("j1").tries == 2
    w.cycle(reports=[report(w, "j1", AttemptState.KILLED)], now=NOW + 3)
    assert w.job("j1").state is JobState.FAILED


def test_a_try_its_agent_stopped_while_shutting_down_is_not_counted(w: World) -> None:
    placed(w, "j1", gpus=8, max_attempts=1)
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING)])
    bye = report(w, "j1", AttemptState.KILLED).model_copy(update={"shutdown": True, "reason": "agent shutting down"})
    w.cycle(reports=[bye], now=NOW + 1)
    job = w.job("j1")  # requeued at once, and placed again in the same cycle
    assert job.state is JobState.PLACED and job.tries == 2 and job.attempts[0].stop_kind == "shutdown"
    # The same report without the mark (a kill the agent did not make for its shutdown)
    # uses the job's one attempt.
    w.cycle(reports=[report(w, "j1", AttemptState.KILLED)], now=NOW + 3)
    assert w.job("j1").state is JobState.FAILED


def test_a_drain_leaves_a_job_whose_record_is_in_flight_for_a_later_cycle(w: World) -> None:
    placed(w, "j1", gpus=4)
    placed(w, "j2", gpus=4)
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING), report(w, "j2", AttemptState.RUNNING)])
    cfg = HostConfig(cordoned=True, draining=True, drain_deadline=NOW - 1, reason="", by="alice")
    w.state.apply_state_record(Record("hostcfg.h1", next(w.rev), cfg.model_dump_json().encode()))
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, max_keys=900, frozen_jobs={"j1"})
    w.commit(plan)
    assert {t.job_id: t.stop for t in w.tasks("h1")} == {"j1": False, "j2": True}
    assert "j1" not in plan.jobs and plan.jobs["j2"].attempts[0].stop_kind == "drain"
    w.cycle()  # j1's record is no longer in flight
    assert all(t.stop and t.stop_reason == "host h1 drained" for t in w.tasks("h1"))
    assert w.job("j1").attempts[0].stop_kind == "drain"


def test_cancel_of_terminal_or_unknown_job_is_ignored(w: World) -> None:
    placed(w)
    w.cycle(reports=[report(w, "j1", AttemptState.SUCCEEDED, exit_code=0)])
    before = dump(w.state)
    plan = w.cycle(commands=[cancel("j1"), cancel("ghost")], commit=False)
    assert plan.ignored == 2 and not plan.jobs and not plan.events
    assert dump(w.state) == before


# ---------------------------------------------------------------- purity, term, key cap


def test_plan_cycle_never_mutates_its_input(w: World) -> None:
    w.host("h2", gpus=4)
    placed(w, "r", gpus=2)
    w.cycle(reports=[report(w, "r", AttemptState.RUNNING)])
    placed(w, "c", gpus=2)
    placed(w, "l", gpus=1)
    w.submit("q1", gpus=4)
    w.submit("q2", gpus=8)
    w.submit("q3")
    before = dump(w.state)
    caps_before = {k: vars(v).copy() for k, v in w.state.capacities(NOW).items()}
    plan = plan_cycle(
        w.state,
        reports=[report(w, "r", AttemptState.SUCCEEDED, exit_code=0), report(w, "l", AttemptState.LOST)],
        commands=[cancel("c"), cancel("q3")],
        now=NOW + 1,
        term=TERM + 1,
    )
    assert plan.jobs and plan.allocs and plan.events
    assert dump(w.state) == before
    assert {k: vars(v) for k, v in w.state.capacities(NOW).items()} == caps_before
    # The plan's records are copies, not the snapshot's objects.
    for jid, job in plan.jobs.items():
        if jid in w.state.jobs:
            assert job is not w.state.jobs[jid]
    for hid, alloc in plan.allocs.items():
        if hid in w.state.allocs:
            assert alloc is not w.state.allocs[hid]


def test_term_stamped_on_changed_allocs(w: World) -> None:
    placed(w, "a", gpus=1)
    assert w.state.allocs["h1"].term == TERM
    plan = w.cycle(reports=[report(w, "a", AttemptState.SUCCEEDED, exit_code=0)], term=TERM + 3)
    assert plan.allocs["h1"].term == TERM + 3
    w.submit("b", gpus=1)
    plan = w.cycle(term=TERM + 4)
    a = plan.jobs["b"].attempts[0]
    assert a.term == TERM + 4
    assert plan.allocs["h1"].tasks[0].term == TERM + 4
    assert plan.allocs["h1"].term == TERM + 4


def test_max_keys_caps_a_cycle() -> None:
    w = World()
    for i in range(10):
        w.host(f"h{i}", gpus=1)
    for i in range(10):
        w.submit(f"j{i}", gpus=1, submitted_at=i)
    order: list[list[str]] = []
    while sum(map(len, order)) < 10 and len(order) < 10:
        plan = w.cycle(max_keys=7)
        assert plan.keys <= 7
        assert plan.placed > 0
        order.append(sorted(plan.jobs))
    assert order[0] == ["j0", "j1", "j2"]  # FIFO: the earliest submissions first
    assert [j for cyc in order for j in cyc] == [f"j{i}" for i in range(10)]
    assert len(order) == 4
    assert all(j.state is JobState.PLACED for j in w.state.jobs.values())
    assert plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM).placed == 0


def test_max_keys_with_one_host_counts_the_shared_alloc_once() -> None:
    w = World()
    w.host("h1", gpus=0, cpus=64)
    for i in range(10):
        w.submit(f"j{i}", submitted_at=i)
    plan = w.cycle(max_keys=5)
    assert plan.keys <= 5
    assert plan.placed == 3  # 3 job keys + 1 alloc key; a 4th would leave no room
    assert set(plan.jobs) == {"j0", "j1", "j2"}


# ---------------------------------------------------------------- property

HOSTS = {"h1": (4, 16, 64_000), "h2": (2, 8, 16_000), "h3": (0, 32, 128_000)}  # gpus, cpus, memory


def check_invariants(state: ClusterState) -> None:
    for host_id, alloc in state.allocs.items():
        ngpus, ncpus, mem = HOSTS[host_id]
        gpus = [g for t in alloc.tasks for g in t.gpu_indices]
        assert len(gpus) == len(set(gpus)), f"GPU double-booked on {host_id}: {alloc.tasks}"
        assert all(0 <= g < ngpus for g in gpus)
        assert sum(t.cpus for t in alloc.tasks) <= ncpus + 1e-6
        assert sum(t.memory_mb for t in alloc.tasks) <= mem
    live_tasks = {t.attempt_id: (h, t) for h, a in state.allocs.items() for t in a.tasks}
    assert len(live_tasks) == sum(len(a.tasks) for a in state.allocs.values())
    for job in state.jobs.values():
        live = [a for a in job.attempts if not a.state.terminal]
        assert len(live) <= 1, f"two live attempts for {job.id}: {job.attempts}"
        assert [a.number for a in job.attempts] == list(range(1, len(job.attempts) + 1))
        assert len(job.attempts) <= job.spec.max_attempts
        for a in live:
            assert a is job.attempts[-1]
            assert a.id in live_tasks, f"live attempt {a.id} has no task"
            assert live_tasks[a.id][0] == a.host_id
            assert live_tasks[a.id][1].gpu_indices == a.gpu_indices
        if job.state in (JobState.PLACED, JobState.RUNNING):
            assert len(live) == 1
        if job.state is JobState.QUEUED:
            assert not live
        if job.state in (JobState.SUCCEEDED, JobState.FAILED):
            assert not live
    for attempt_id, (_host_id, t) in live_tasks.items():
        job = state.jobs[t.job_id]
        a = next(a for a in job.attempts if a.id == attempt_id)
        assert not a.state.terminal, f"task {attempt_id} kept for a finished attempt"
        if not t.stop:
            assert job.state in (JobState.PLACED, JobState.RUNNING)


action = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 3), st.sampled_from([0.5, 1.0, 4.0, 12.0]),
              st.integers(-2, 2), st.integers(1, 3)),
    st.tuples(st.just("report"), st.integers(0, 30),
              st.sampled_from([AttemptState.RUNNING, AttemptState.SUCCEEDED, AttemptState.FAILED,
                               AttemptState.LOST, AttemptState.KILLED]),
              st.booleans(), st.integers(0, 2)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.5, 1.0, 3.0])),
)


def play(w: World, batch: list[tuple], now: float, n_jobs: int, *,
         one_input_per_job: bool) -> tuple[list[StatusReport | Command], float, int]:
    """Carry out one batch of random actions: submissions and clock ticks at once; reports
    and cancels returned, in order, as the next cycle's inputs."""
    inputs: list[StatusReport | Command] = []
    touched: set[str] = set()
    ids = sorted(w.state.jobs)
    for act in batch:
        if act[0] == "submit":
            _, gpus, cpus, prio, max_attempts = act
            n_jobs += 1
            w.submit(f"j{n_jobs:03d}", gpus=gpus, cpus=cpus, memory_mb=4000 * (gpus + 1),
                     priority=prio, max_attempts=max_attempts, submitted_at=now)
        elif act[0] == "tick":
            now += act[1]
        elif not ids:
            continue
        elif act[0] == "report":
            _, pick, st_, right_host, extra = act
            job = w.job(ids[pick % len(ids)])
            if (one_input_per_job and job.id in touched) or not job.attempts:
                continue
            touched.add(job.id)
            a = job.attempts[-1 - (extra % len(job.attempts))] if extra else job.attempts[-1]
            host_id = a.host_id if right_host else next(h for h in HOSTS if h != a.host_id)
            inputs.append(StatusReport(host_id=host_id, attempt_id=a.id, job_id=job.id, state=st_,
                                       exit_code=None if st_ is not AttemptState.FAILED else 1, ts=now))
        elif act[0] == "cancel":
            jid = ids[act[1] % len(ids)]
            if one_input_per_job and jid in touched:
                continue
            touched.add(jid)
            inputs.append(cancel(jid))
    return inputs, now, n_jobs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.lists(action, min_size=1, max_size=4), min_size=1, max_size=25))
def test_property_random_cycles_never_overcommit(steps: list[list[tuple]]) -> None:
    w = World(interval_s=1e9)  # hosts stay healthy however far the clock moves
    for hid, (g, c, m) in HOSTS.items():
        w.host(hid, gpus=g, cpus=c, memory_mb=m)
    now = NOW
    n_jobs = 0
    for batch in steps:
        inputs, now, n_jobs = play(w, batch, now, n_jobs, one_input_per_job=True)
        reports = [r for r in inputs if isinstance(r, StatusReport)]
        commands = [c for c in inputs if isinstance(c, Command)]
        plan = w.cycle(reports=reports, commands=commands, now=now, max_keys=12)
        assert plan.keys <= 12 + len(reports) + len(commands)
        check_invariants(w.state)
    # Terminal jobs stay terminal and hold nothing.
    for job in w.state.jobs.values():
        if job.state.terminal and job.state is not JobState.CANCELLED:
            assert all(t.job_id != job.id for a in w.state.allocs.values() for t in a.tasks)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.lists(action, min_size=1, max_size=6), st.sampled_from(["AB", "BA", "B"])),
                      min_size=1, max_size=20))
def test_property_pipelined_cycles_touch_disjoint_records_and_never_overcommit(
        steps: list[tuple[list[tuple], str]]) -> None:
    """The scheduler plans cycle B while cycle A's commit is in flight, with A's records
    frozen. B must touch none of them (so the two commits cannot conflict), and whatever
    becomes of A (committed before B, after B, or never: its commit failed), the state
    stays consistent: B decided nothing that relied on A."""
    w = World(interval_s=1e9)
    for hid, (g, c, m) in HOSTS.items():
        w.host(hid, gpus=g, cpus=c, memory_mb=m)
    now = NOW
    n_jobs = 0
    for batch, order in steps:
        inputs, now, n_jobs = play(w, batch, now, n_jobs, one_input_per_job=False)
        half = len(inputs) // 2

        def plan(part: list, now: float = now, **frozen: set[str]) -> Plan:
            return plan_cycle(w.state, reports=[r for r in part if isinstance(r, StatusReport)],
                              commands=[c for c in part if isinstance(c, Command)], now=now, term=TERM,
                              max_keys=12, **frozen)

        a_plan = plan(inputs[:half])
        b_plan = plan(inputs[half:], frozen_jobs=set(a_plan.jobs), frozen_hosts=set(a_plan.allocs))
        assert not set(a_plan.jobs) & set(b_plan.jobs)
        assert not set(a_plan.allocs) & set(b_plan.allocs)
        for name in order:
            w.commit(a_plan if name == "A" else b_plan)
            check_invariants(w.state)


def test_a_frozen_host_takes_no_placement_and_a_frozen_job_waits(w: World) -> None:
    w.host("h2", gpus=8, cpus=64)
    w.submit("a", gpus=1, submitted_at=1)
    w.submit("b", gpus=1, submitted_at=2)
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM,
                      frozen_jobs={"a"}, frozen_hosts={"h1"})
    assert set(plan.jobs) == {"b"} and plan.jobs["b"].attempts[0].host_id == "h2"
    assert set(plan.allocs) == {"h2"}
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM,
                      frozen_hosts={"h1", "h2"})
    assert plan.placed == 0 and not plan.allocs


def test_inputs_touching_frozen_records_wait_with_everything_after_them(w: World) -> None:
    from wire.messages import SubmitRequest

    w.submit("a", gpus=1)
    w.submit("b", gpus=1)
    w.cycle()
    ra, rb = report(w, "a", AttemptState.RUNNING), report(w, "b", AttemptState.RUNNING)
    plan = plan_cycle(w.state, reports=[ra, rb], commands=[cancel("b")], now=NOW, term=TERM,
                      frozen_jobs={"a"})
    # a's report waits; b's report and cancel, behind it, do not.
    assert (plan.reports_used, plan.deferred_reports) == (2, [0])
    assert (plan.commands_used, plan.deferred_commands) == (1, [])
    assert set(plan.jobs) == {"b"} and plan.jobs["b"].state is JobState.CANCELLED
    assert plan.jobs["b"].attempts[0].state is AttemptState.RUNNING
    # Any job of the try on a frozen host holds the report back (a gang's end touches every host).
    plan = plan_cycle(w.state, reports=[rb], commands=[], now=NOW, term=TERM, frozen_hosts={"h1"})
    assert plan.deferred_reports == [0] and not plan.jobs
    sub = SubmitRequest(user="u", ts=NOW, jobs=[{"id": "c", "name": "c", "command": ["true"]}])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[sub],
                      frozen_jobs={"c"})
    assert plan.deferred_submissions == [0] and "c" not in plan.jobs


def test_the_largest_nats_submission_always_fits_in_one_cycle() -> None:
    """A submission is taken whole or waits; one that could never fit would block every
    submission behind it, so the decoder refuses anything larger than fits."""
    from pydantic import ValidationError

    from wire.messages import MAX_SUBMIT_JOBS, SubmitRequest

    w = World()
    w.host("h1", gpus=8)
    jobs = [{"id": f"big-{i:04d}", "name": f"b{i}", "command": ["true"], "gpus": 0, "cpus": 0.01,
             "memory_mb": 1} for i in range(MAX_SUBMIT_JOBS)]
    big = SubmitRequest(user="u", ts=NOW, jobs=jobs)
    small = SubmitRequest(user="u", ts=NOW, jobs=[dict(jobs[0], id="after-big")])
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[big, small])
    assert plan.submissions_used >= 1
    assert {f"big-{i:04d}" for i in range(MAX_SUBMIT_JOBS)} <= set(plan.jobs)
    with pytest.raises(ValidationError):
        SubmitRequest(user="u", ts=NOW, jobs=[dict(jobs[0], id=f"x{i}") for i in range(MAX_SUBMIT_JOBS + 1)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=8), max_size=12))
def test_current_tasks_are_the_attempts_of_the_latest_try(tasks_per_try: list[int]) -> None:
    """Tries are appended one after another: the latest try's attempts, read from the
    tail, are every attempt with the latest number."""
    attempts = [Attempt(id=f"j.{n}.{t}", number=n, task=t, host_id=f"h{t}") for n, k in enumerate(tasks_per_try, 1)
                for t in range(k)]
    job = make_job("j", spec=job_spec("j", command=["x"]), submitted_at=NOW, attempts=attempts)
    last = attempts[-1].number if attempts else 0
    assert job.current_tasks() == [a for a in attempts if a.number == last]
