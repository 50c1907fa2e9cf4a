"""Gang jobs in the planner: all or nothing, one rack, failure of one stops all, retried
as one, no deadlock between gangs, and a big gang is not starved by small jobs."""

from __future__ import annotations

import itertools

import pytest

from server.scheduling.eviction import EvictionBudget
from server.scheduling.planner import Plan, QueuePolicy, plan_cycle
from server.state.cluster import ClusterState, HostConfig
from tests.factories import heartbeat_record, job_spec
from tests.factories import job as make_job
from wire.messages import AttemptState, Command, Job, JobState, StatusReport, encode
from wire.records import Record

NOW = 1_000_000.0


class World:
    def __init__(self) -> None:
        self.state = ClusterState(heartbeat_interval_s=1e9)
        self.rev = itertools.count(1)
        self.policy = QueuePolicy()

    def host(self, host_id: str, rack: str = "r1", gpus: int = 8) -> None:
        rec = heartbeat_record(host_id, next(self.rev), shape=False, boot_id="b", seq=0, ts=NOW, labels={"rack": rack},
                               gpus=gpus, gpu_memory_mb=1, cpus=64, memory_mb=10**6)
        self.state.apply_host_record(rec, now=NOW)

    def lose(self, host_id: str) -> None:
        self.state.apply_host_record(Record(host_id, next(self.rev), None), now=NOW)

    def submit(self, job_id: str, gpus: int = 0, replicas: int = 1, same_rack: bool = False,
               at: float = NOW, max_attempts: int = 3, time_limit_s: float = 0.0, cpus: float = 1) -> None:
        job = make_job(job_id, spec=job_spec(job_id, command=["x"], gpus=gpus, cpus=cpus, memory_mb=1,
                                             replicas=replicas, same_rack=same_rack, max_attempts=max_attempts,
                                             time_limit_s=time_limit_s), submitted_at=at)
        self.state.apply_state_record(Record(f"job.{job_id}", next(self.rev), encode(job)))

    def cycle(self, reports: list[StatusReport] | None = None, now: float = NOW,
              commands: list[Command] | None = None) -> Plan:
        plan = plan_cycle(self.state, reports=reports or [], commands=commands or [], now=now, term=1,
                          budget=EvictionBudget(), queues=self.policy)
        for job in plan.jobs.values():
            self.state.apply_state_record(Record(f"job.{job.id}", next(self.rev), encode(job)))
        for alloc in plan.allocs.values():
            self.state.apply_state_record(Record(f"alloc.{alloc.host_id}", next(self.rev), encode(alloc)))
        return plan

    def job(self, job_id: str) -> Job:
        return self.state.jobs[job_id]

    def report(self, job_id: str, task: int, state: AttemptState, code: int | None = None,
               number: int | None = None, ts: float = NOW) -> StatusReport:
        job = self.job(job_id)
        n = number or job.tries
        a = next(a for a in job.attempts if a.number == n and a.task == task)
        return StatusReport(host_id=a.host_id, attempt_id=a.id, job_id=job_id, state=state, exit_code=code, ts=ts)

    def used_gpus(self) -> int:
        return sum(len(t.gpu_indices) for a in self.state.allocs.values() for t in a.tasks)


def test_gang_is_placed_whole_in_one_commit() -> None:
    w = World()
    for h in "abcd":
        w.host(h)
    w.submit("g", gpus=8, replicas=3)
    plan = w.cycle()
    job = w.job("g")
    assert job.state is JobState.PLACED
    assert [(a.number, a.task) for a in job.attempts] == [(1, 0), (1, 1), (1, 2)]
    assert len({a.host_id for a in job.attempts}) == 3
    assert set(plan.allocs) == {a.host_id for a in job.attempts}
    assert w.used_gpus() == 24
    # Each task is told its index, the gang's size and every member's host (its peers).
    hosts = ",".join(a.host_id for a in job.attempts)
    for a in job.attempts:
        t = next(t for t in w.state.allocs[a.host_id].tasks if t.attempt_id == a.id)
        assert (t.env["MUSTER_GANG_TASK"], t.env["MUSTER_GANG_SIZE"], t.env["MUSTER_GANG_HOSTS"]) == \
            (str(a.task), "3", hosts)


def test_gang_that_does_not_fit_places_nothing() -> None:
    w = World()
    w.host("a")
    w.host("b")
    w.submit("g", gpus=8, replicas=3)
    plan = w.cycle()
    assert plan.placed == 0 and w.job("g").state is JobState.QUEUED
    assert w.job("g").attempts == [] and w.used_gpus() == 0


def test_same_rack_gang_lands_in_one_rack() -> None:
    w = World()
    w.host("a1", rack="r1")
    w.host("a2", rack="r1")
    for h in ("b1", "b2", "b3"):
        w.host(h, rack="r2")
    w.submit("g", gpus=8, replicas=3, same_rack=True)
    w.cycle()
    assert {a.host_id for a in w.job("g").attempts} == {"b1", "b2", "b3"}
    w.submit("h", gpus=8, replicas=2, same_rack=True)
    w.cycle()
    assert {a.host_id for a in w.job("h").attempts} == {"a1", "a2"}


def test_a_same_rack_gang_reserves_a_rack_it_could_start_in() -> None:
    """The rack with the most free GPUs has too few hosts for the gang: its reservation
    goes to a rack with enough, not to one where it could never start."""
    w = World()
    for h in ("b1", "b2", "b3"):
        w.host(h, rack="r2")
    for j in ("x1", "x2", "x3"):
        w.submit(j, gpus=5)
    w.cycle()
    assert {w.job(j).attempts[0].host_id for j in ("x1", "x2", "x3")} == {"b1", "b2", "b3"}
    w.host("a1", rack="r1")  # 16 GPUs free in r1, 9 in r2
    w.host("a2", rack="r1")
    w.submit("g", gpus=8, replicas=3, same_rack=True, at=NOW - 20)
    plan = w.cycle()
    assert w.job("g").state is JobState.QUEUED
    assert [(r.job_id, r.hosts) for r in plan.reservations] == [("g", frozenset({"b1", "b2", "b3"}))]
    # With r2 too small as well, no rack could ever hold it: nothing is held.
    w.lose("b3")
    w.submit("g2", gpus=8, replicas=3, same_rack=True, at=NOW - 19)
    assert [r.job_id for r in w.cycle().reservations] == []


def test_one_failed_task_stops_the_gang_and_it_fails_as_one() -> None:
    w = World()
    for h in "abc":
        w.host(h)
    w.submit("g", gpus=8, replicas=3)
    w.cycle()
    w.cycle(reports=[w.report("g", i, AttemptState.RUNNING) for i in range(3)])
    w.cycle(reports=[w.report("g", 1, AttemptState.FAILED, code=2)])
    job = w.job("g")
    assert job.state is JobState.RUNNING
    stops = [t for a in w.state.allocs.values() for t in a.tasks]
    assert len(stops) == 2 and all(t.stop and t.stop_reason == "gang task 1 ended FAILED" for t in stops)
    plan = w.cycle(reports=[w.report("g", 0, AttemptState.KILLED), w.report("g", 2, AttemptState.KILLED)])
    assert w.job("g").state is JobState.FAILED
    assert w.used_gpus() == 0
    # Its end names the task that failed, with its exit code (found by exploring: it named
    # the last task stopped with it, "gang task 1 ended FAILED", no exit code).
    failed = next(t for t in w.job("g").attempts if t.task == 1)
    ev = [e for e in plan.events if e.kind == "job.failed"]
    assert [(e.attempt_id, e.message) for e in ev] == [(failed.id, "exit code 2 (gang task 1)")], ev


def test_a_gang_with_a_drained_member_is_requeued_without_using_an_attempt() -> None:
    w = World()
    for h in "ab":
        w.host(h)
    w.submit("g", gpus=8, replicas=2, max_attempts=1)
    w.cycle()
    w.cycle(reports=[w.report("g", i, AttemptState.RUNNING) for i in range(2)])
    drained = w.job("g").attempts[0].host_id
    cfg = HostConfig(cordoned=True, draining=True, drain_deadline=NOW - 1, reason="", by="ops")
    w.state.apply_state_record(Record(f"hostcfg.{drained}", next(w.rev), cfg.model_dump_json().encode()))
    w.cycle()
    # Every task of the try is told to stop in the same cycle (found by exploring: the
    # others got their SIGTERM only once the drained one had gone, a grace later).
    other = w.job("g").attempts[1]
    assert other.stop_kind == "drain" and other.reason == f"gang task on {drained}: host {drained} drained"
    told = {t.attempt_id: t for a in w.state.allocs.values() for t in a.tasks}
    assert all(t.stop for t in told.values()) and len(told) == 2, told
    w.cycle(reports=[w.report("g", 0, AttemptState.KILLED)])
    other = w.job("g").attempts[1]
    assert other.stop_kind == "drain" and other.state is AttemptState.RUNNING
    w.cycle(reports=[w.report("g", 1, AttemptState.KILLED)])
    # ... and the try, ended by the drain alone, uses none of the gang's one attempt.
    job = w.job("g")
    assert job.state is JobState.QUEUED and [a.stop_kind for a in job.attempts] == ["drain", "drain"]


def test_lost_member_retries_the_whole_gang() -> None:
    w = World()
    for h in "abcd":
        w.host(h)
    w.submit("g", gpus=8, replicas=3)
    w.cycle()
    w.cycle(reports=[w.report("g", i, AttemptState.RUNNING) for i in range(3)])
    lost_host = w.job("g").attempts[0].host_id
    w.lose(lost_host)
    w.cycle()
    # The lost task is over; the others are told to stop; nothing new yet.
    job = w.job("g")
    assert job.attempts[0].state is AttemptState.LOST
    assert job.tries == 1
    w.cycle(reports=[w.report("g", 1, AttemptState.KILLED), w.report("g", 2, AttemptState.KILLED)])
    job = w.job("g")
    assert job.tries == 2 and job.state is JobState.PLACED
    second = [a for a in job.attempts if a.number == 2]
    assert len(second) == 3 and lost_host not in {a.host_id for a in second}


def test_concurrent_gangs_do_not_deadlock() -> None:
    w = World()
    for h in "abcd":
        w.host(h)
    w.submit("g1", gpus=8, replicas=3, at=NOW - 2)
    w.submit("g2", gpus=8, replicas=3, at=NOW - 1)
    w.cycle()
    assert w.job("g1").state is JobState.PLACED and w.job("g2").state is JobState.QUEUED
    assert w.job("g2").attempts == []
    w.cycle(reports=[w.report("g1", i, AttemptState.RUNNING) for i in range(3)])
    w.cycle(reports=[w.report("g1", i, AttemptState.SUCCEEDED, code=0) for i in range(3)])
    assert w.job("g1").state is JobState.SUCCEEDED
    assert w.job("g2").state is JobState.PLACED


def _stream(w: World, steps: int, reserve: bool) -> bool:
    """Small 4-GPU jobs arrive every step and run two steps; a 2x8-GPU gang waits."""
    w.host("a")
    w.host("b")
    started: dict[str, int] = {}
    if not reserve:
        w.policy = QueuePolicy(reserve_after_s=1e12)
    for step in range(steps):
        t = NOW + 1 + 5 * step
        done = [j for j, s in started.items() if step - s >= 2 and w.job(j).state is JobState.PLACED]
        reports = [w.report(j, 0, AttemptState.SUCCEEDED, code=0) for j in done]
        w.submit(f"s{step}", gpus=4, at=t - 0.5)
        if step == 1:  # the gang arrives once small work is running
            w.submit("gang", gpus=8, replicas=2, at=t - 1)
        w.cycle(reports=reports, now=t)
        for j in list(w.state.jobs):
            if j.startswith("s") and j not in started and w.job(j).state is JobState.PLACED:
                started[j] = step
        if "gang" in w.state.jobs and w.job("gang").state is JobState.PLACED:
            return True
    return False


def test_without_a_reservation_the_gang_would_starve() -> None:
    # The scenario is a real starvation: with reservations switched off, it never runs.
    assert _stream(World(), steps=40, reserve=False) is False


def test_big_gang_is_not_starved_by_a_stream_of_small_jobs() -> None:
    w = World()
    assert _stream(w, steps=40, reserve=True) is True
    assert {a.host_id for a in w.job("gang").attempts} == {"a", "b"}


def test_a_gang_retried_whole_after_one_task_succeeded_passes_muster_check() -> None:
    """Found by exploring: a gang's task 1 succeeded, task 0's host was lost, the gang ran
    again whole and succeeded; `muster check` said "SUCCEEDED with 3 successful attempts".
    A successful try is one whose every task succeeded: exactly one, the last."""
    from server.state.invariants import Capacity, check
    from wire.messages import GpuInfo, Heartbeat, JobSpec

    now = 1_000_000.0
    st = ClusterState(heartbeat_interval_s=1e9)
    rev = itertools.count(1)
    for h in ("a", "b", "c"):
        hb = Heartbeat(host_id=h, boot_id="b", ts=now, cpus=8, memory_mb=64000,
                       gpus=[GpuInfo(index=0, model="H100", memory_mb=80000)])
        st.apply_heartbeat(h, next(rev), encode(hb), None, now)
    job = Job(id="gang0001", spec=JobSpec(name="g", command=["x"], gpus=1, replicas=2), submitted_at=now,
              updated_at=now)
    st.apply_state_record(Record("job.gang0001", next(rev), encode(job)))
    budget = EvictionBudget()

    def cycle(at: float, reports: list[StatusReport] | None = None) -> None:
        plan = plan_cycle(st, reports=reports or [], commands=[], now=at, term=1, budget=budget)
        for j in plan.jobs.values():
            st.apply_job(j, next(rev))
        for al in plan.allocs.values():
            st.apply_alloc(al, next(rev))

    def report(t: object, state: AttemptState, at: float) -> StatusReport:
        return StatusReport(host_id=t.host_id, attempt_id=t.id, job_id="gang0001", state=state, ts=at,  # type: ignore[attr-defined]
                            exit_code=0 if state is AttemptState.SUCCEEDED else None)

    cycle(now)
    tasks = st.jobs["gang0001"].current_tasks()
    cycle(now + 1, [report(t, AttemptState.RUNNING, now + 1) for t in tasks])
    cycle(now + 2, [report(tasks[1], AttemptState.SUCCEEDED, now + 2)])
    st.apply_heartbeat(tasks[0].host_id, next(rev), None, None, now + 3)  # task 0's host lost
    cycle(now + 4)
    assert st.jobs["gang0001"].tries == 2
    again = st.jobs["gang0001"].current_tasks()
    cycle(now + 5, [report(t, AttemptState.RUNNING, now + 5) for t in again])
    cycle(now + 6, [report(t, AttemptState.SUCCEEDED, now + 6) for t in again])
    done = st.jobs["gang0001"]
    assert done.state is JobState.SUCCEEDED
    caps = {h: Capacity(1, 8, 64000) for h in "abc"}
    assert check(st.jobs.values(), caps, st.allocs.values(), 1) == []
    # Two whole successful tries, or a last one short of a task, are still violations.
    twice = done.model_copy(update={"attempts": [a.model_copy(update={"state": AttemptState.SUCCEEDED})
                                                 for a in done.attempts]})
    assert any("successful tries [1, 2]" in p for p in check([twice], caps))
    short = done.model_copy(update={"attempts": done.attempts[:-1]})
    assert any("1 of 2 tasks of the last succeeded" in p for p in check([short], caps))


def test_a_gangs_time_limit_counts_from_its_first_start_and_follows_changes_after_a_task_ended() -> None:
    """Found by exploring: once a gang's first task had ended (SUCCEEDED), its deadline took
    the start of the tasks still running (later) and the limit of the ended task, which a
    change of the limit does not reach: a raise was ignored (TIMEOUT at the old limit), a
    lowering too."""
    from wire.messages import Command

    def started() -> World:
        w = World()
        w.host("a")
        w.host("b")
        w.submit("g", gpus=8, replicas=2, time_limit_s=600)
        w.cycle()
        w.cycle([w.report("g", 0, AttemptState.RUNNING, ts=NOW), w.report("g", 1, AttemptState.RUNNING, ts=NOW + 100)],
                now=NOW + 100)
        w.cycle([w.report("g", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 150)], now=NOW + 150)
        return w

    w = started()
    assert w.state.deadlines.get("g") == NOW + 600  # from the first start, not task 1's
    assert w.cycle(now=NOW + 601).timed_out == 1
    w = started()
    w.cycle(commands=[Command(kind="update", job_id="g", by="admin", time_limit_s=7200, ts=NOW + 160)], now=NOW + 160)
    assert w.state.deadlines.get("g") == NOW + 7200
    assert w.cycle(now=NOW + 750).timed_out == 0  # raised: not stopped at the old limit
    w = started()
    w.cycle(commands=[Command(kind="update", job_id="g", by="ops", time_limit_s=160, ts=NOW + 160)], now=NOW + 160)
    assert w.state.deadlines.get("g") == NOW + 160
    assert w.cycle(now=NOW + 170).timed_out == 1  # lowered below what it has run: stopped


def test_a_gang_whose_task_was_killed_keeps_that_end_when_its_limit_passes_while_the_rest_stop() -> None:
    """Found by exploring: a gang task KILLED as the host's (a fence, say) 10 s before the
    limit has the rest stopped for it; the limit passing meanwhile made them TIMEOUT, and
    the job ended TIMEOUT, not retried. The try keeps the end it had: retried."""

    def running() -> World:
        """A gang of two with a 600 s limit, both tasks running from NOW."""
        w = World()
        w.host("a")
        w.host("b")
        w.submit("g", gpus=8, replicas=2, time_limit_s=600, max_attempts=3)
        w.cycle()
        w.cycle([w.report("g", 0, AttemptState.RUNNING, ts=NOW), w.report("g", 1, AttemptState.RUNNING, ts=NOW)],
                now=NOW)
        return w

    w = running()
    # The kill and the limit in one cycle, and in two.
    both = w.cycle([w.report("g", 1, AttemptState.KILLED, ts=NOW + 599)], now=NOW + 601)
    assert both.timed_out == 0
    assert w.state.deadlines.get("g") is None
    assert w.cycle(now=NOW + 602).timed_out == 0
    w.cycle([w.report("g", 0, AttemptState.KILLED, ts=NOW + 603)], now=NOW + 603)
    j = w.job("g")
    assert j.state is not JobState.TIMEOUT and j.tries == 2, (j.state, j.tries)
    assert [a.state for a in j.attempts if a.number == 1] == [AttemptState.KILLED, AttemptState.KILLED]
    # A task that ended after the limit (its report read late, with the limit's cycle): the
    # limit came first, and the try ends TIMEOUT (a review).
    w = running()
    assert w.cycle([w.report("g", 1, AttemptState.KILLED, ts=NOW + 605)], now=NOW + 606).timed_out == 1
    w.cycle([w.report("g", 0, AttemptState.KILLED, ts=NOW + 607)], now=NOW + 607)
    assert w.job("g").state is JobState.TIMEOUT


@pytest.mark.parametrize("stopped_by", ["drain", "reservation"])
def test_a_keep_running_try_on_a_lost_host_is_held_through_a_drain_or_reservation_of_that_host(
        stopped_by: str) -> None:
    """Found by exploring: a drain whose deadline passed (or an advance reservation that
    opened) on a host already lost marked its KEEP_RUNNING try to stop, and the eviction took
    a try marked to stop for one with nothing left to replace: it ended at once and the job
    was placed elsewhere, 3,580 s before its replaceAfter, while the cut-off agent (which
    never stops such a task) ran it on. It is held until replaceAfter as any such try."""
    from wire.messages import AdvanceReservation

    w = World()
    w.host("a")
    w.host("b", gpus=0)
    spec = job_spec("k", command=["x"], gpus=1, cpus=1, memory_mb=1, on_disconnect="KEEP_RUNNING",
                    replace_after_s=3600)
    w.state.apply_state_record(Record("job.k", next(w.rev), encode(make_job("k", spec=spec, submitted_at=NOW))))
    w.cycle()
    w.cycle([w.report("k", 0, AttemptState.RUNNING)])
    w.host("b")  # room elsewhere
    w.lose("a")
    w.cycle(now=NOW + 10)
    if stopped_by == "drain":
        cfg = HostConfig(cordoned=True, draining=True, drain_deadline=NOW + 20, reason="rma", by="ops")
        w.state.apply_state_record(Record("hostcfg.a", next(w.rev), cfg.model_dump_json().encode()))
    else:
        r = AdvanceReservation(name="launch", hosts=["a"], queues=["launch"], starts=NOW + 20, ends=NOW + 9000)
        w.state.apply_state_record(Record("advres.launch", next(w.rev), encode(r)))
    for at in (NOW + 30, NOW + 31):
        plan = w.cycle(now=at)
        assert plan.held_keep_running == 1 and w.job("k").tries == 1, (at, w.job("k").attempts)
    w.cycle(now=NOW + 3620)  # past replaceAfter: replaced, the stop's (not counted)
    j = w.job("k")
    assert j.tries == 2 and j.attempts[0].state is AttemptState.KILLED and j.attempts[1].host_id == "b"
