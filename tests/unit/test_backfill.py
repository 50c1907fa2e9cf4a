"""Reservations and backfill (scheduling.backfill, the planner's use of it): a large job
that waits holds the hosts where it could start soonest; other jobs use them only when
their time limit ends them by then; a stream of small jobs does not starve it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling.backfill import STOPPING_S, UNKNOWN, Reservation, may_backfill, start_on, task_end
from server.scheduling.deadlines import Deadlines
from server.scheduling.maintenance import START_ALLOWANCE_S
from server.scheduling.placement import HostCapacity
from server.scheduling.planner import QueuePolicy
from server.scheduling.queues import RESERVED, RESERVED_FOR_OTHER
from server.views.jobs import JobView
from tests.factories import heartbeat_record, host_capacity, job_spec
from tests.factories import job as make_job
from tests.unit.test_gangs import NOW, World
from wire.messages import AttemptState, JobState, Reserved, Task, encode, implicit_default_queue
from wire.records import Record

# The stop's grace of the default queue's tasks: what a task holds its GPUs for after its
# deadline (and what a job backfilling must leave before a reserved start).
GRACE = implicit_default_queue().preempt_grace_s


def _task(i: int, gpus: list[int], **kw: object) -> Task:
    return Task(attempt_id=f"t{i}.1", job_id=f"t{i}", number=1, command=["x"], gpu_indices=gpus, cpus=1,
                memory_mb=1, **kw)  # type: ignore[arg-type]


def _host(used: list[int]) -> HostCapacity:
    return host_capacity("h", gpus=8, used_gpus=used)


# ---------------------------------------------------------------- pure parts


def test_a_task_ends_at_its_deadline_soon_when_stopping_and_never_without_a_limit() -> None:
    # At its deadline a task is told to stop: it has left once its stop's grace is over (the
    # agent's when its queue names none). Found by review: the end was the deadline itself.
    assert task_end(_task(1, [0]), None, NOW + 30, NOW) == NOW + 30 + STOPPING_S
    assert task_end(_task(1, [0], grace_s=40), None, NOW + 30, NOW) == NOW + 70
    assert task_end(_task(1, [0]), None, NOW - 5, NOW) == NOW + STOPPING_S  # past its deadline: stopping now
    assert task_end(_task(1, [0], stop=True, grace_s=40), None, None, NOW) == NOW + 40
    assert task_end(_task(1, [0]), None, None, NOW) == UNKNOWN


def test_the_start_on_a_host_is_when_enough_of_its_tasks_have_ended() -> None:

    spec = job_spec("big", gpus=6, cpus=1, memory_mb=1)
    ends = [(NOW + 300, _task(1, [0, 1])), (NOW + 100, _task(2, [2, 3])), (UNKNOWN, _task(3, [4]))]
    # 3 GPUs free; 6 wanted: task 2 (at +100) frees 2 -> 5, task 1 (at +300) frees 2 -> 7.
    assert start_on(_host([0, 1, 2, 3, 4]), ends, spec, None, NOW) == NOW + 300
    assert start_on(_host([]), [], spec, None, NOW) == NOW  # fits now
    # Only once the task with no time limit ends.
    assert start_on(_host([0, 1, 2, 3, 4]), ends, job_spec("all", gpus=8, cpus=1, memory_mb=1), None, NOW) == UNKNOWN
    # Never: the host has too few GPUs.
    assert start_on(_host([]), [], job_spec("huge", gpus=9, cpus=1, memory_mb=1), None, NOW) is None


def test_a_job_backfills_only_when_its_limit_ends_it_by_the_reserved_start() -> None:
    r = Reservation("big", frozenset({"h"}), NOW + 100)
    # Its limit runs from its start (allowed START_ALLOWANCE_S), and at its end it has its
    # stop's grace to leave (found by review: neither was allowed for).
    assert may_backfill(100 - START_ALLOWANCE_S - STOPPING_S, NOW, r)
    assert not may_backfill(101 - START_ALLOWANCE_S - STOPPING_S, NOW, r)
    assert may_backfill(100 - START_ALLOWANCE_S - 5, NOW, r, grace_s=5)
    assert not may_backfill(101 - START_ALLOWANCE_S - 5, NOW, r, grace_s=5)
    assert not may_backfill(0, NOW, r)  # no limit: it may run past the start
    assert not may_backfill(10, NOW, Reservation("big", frozenset({"h"}), UNKNOWN))
    assert may_backfill(0, NOW, None)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.one_of(st.none(), st.integers(0, 20))), max_size=40),
       st.integers(0, 20), st.integers(0, 8))
def test_the_deadline_index_agrees_with_a_plain_dict(steps: list[tuple[str, int | None]], now: int, n: int) -> None:
    index, model = Deadlines(), dict[str, float]()
    for job_id, at in steps:
        if at is None:
            index.drop(job_id)
            model.pop(job_id, None)
        else:
            index.set(job_id, float(at))
            model[job_id] = float(at)
    assert index == model and len(index) == len(model)
    ordered = sorted((d, j) for j, d in model.items())
    assert index.due(float(now)) == [j for d, j in ordered if d <= now]
    assert list(index.earliest(n)) == ordered[:n]


# ---------------------------------------------------------------- in the planner


def _running(w: World, job_id: str, gpus: int, limit: float) -> str:
    w.submit(job_id, gpus=gpus, at=NOW - 100, time_limit_s=limit)
    w.cycle(now=NOW - 50)
    w.cycle(reports=[w.report(job_id, 0, AttemptState.RUNNING, ts=NOW - 50)], now=NOW - 50)
    assert w.job(job_id).state is JobState.RUNNING
    return w.job(job_id).attempts[0].host_id


def test_the_reservation_is_where_the_job_starts_soonest_and_short_jobs_backfill_it() -> None:
    w = World()
    w.host("a")
    w.host("b")
    a_host = _running(w, "long", gpus=6, limit=10_000)  # on a until NOW + 9,950 (and its grace)
    b_host = _running(w, "soon", gpus=7, limit=150)  # on b until NOW + 100, gone by NOW + 130
    assert (a_host, b_host) == ("a", "b")
    w.submit("big", gpus=8, at=NOW - 20)
    w.submit("over", gpus=1, at=NOW - 10, time_limit_s=200)  # would still run at NOW + 130
    w.submit("over2", gpus=1, at=NOW - 9, time_limit_s=200)
    w.submit("open", gpus=1, at=NOW - 8)  # no limit at all
    plan = w.cycle()
    # Host a has more free GPUs (2 against 1), but b frees up first.
    assert plan.reservations == [Reservation("big", frozenset({"b"}), NOW + 100 + GRACE)]
    assert w.job("over").attempts[0].host_id == w.job("over2").attempts[0].host_id == "a"
    assert w.job("open").state is JobState.QUEUED  # the free GPU left is on b, kept for big
    # The reservation is in big's record (what every replica's why-pending reads).
    assert w.job("big").reserved == Reserved(hosts=["b"], host_count=1, start=NOW + 130, since=NOW)
    assert w.state.reserved == {"big"}
    view = JobView(w.state, None, half_life_s=0)
    big_why = {r.reason: r.detail for r in view.queue_reasons(w.job("big"), NOW)}
    assert big_why[RESERVED].startswith("1 host(s) held for it (b)") and "in about 130 s" in big_why[RESERVED]
    open_why = {r.reason: r.detail for r in view.queue_reasons(w.job("open"), NOW)}
    assert "held for job big" in open_why[RESERVED_FOR_OTHER] and "no time limit" in open_why[RESERVED_FOR_OTHER]
    # Ends by NOW + 90 once started (10 s allowed for that), gone 30 s later: may use b.
    w.submit("short", gpus=1, at=NOW - 7, time_limit_s=90)
    w.submit("tiny", gpus=1, at=NOW - 5, time_limit_s=50)
    w.cycle()
    assert w.job("open").state is JobState.QUEUED
    on_b = [j for j in ("short", "tiny") if w.job(j).state is JobState.PLACED and w.job(j).attempts[0].host_id == "b"]
    assert len(on_b) == 1  # one of the two backfilled b's free GPU
    # b's jobs end; big starts there.
    w.cycle(reports=[w.report(j, 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 60) for j in ("soon", *on_b)],
            now=NOW + 60)
    assert w.job("big").state is JobState.PLACED and w.job("big").attempts[0].host_id == "b"
    assert w.job("big").reserved is None and "big" not in w.state.reserved  # (open, still waiting, holds one now)


def _two_busy_hosts(x_limit: float = 500, y_limit: float = 300, policy: QueuePolicy | None = None) -> World:
    """Hosts a and b of 8 GPUs: x runs on a with 6 of them (until NOW + x_limit - 50), y on
    b with 7 (until NOW + y_limit - 50, and its grace); a time limit of 0 is none."""
    w = World()
    if policy is not None:
        w.policy = policy
    w.host("a")
    w.host("b")
    assert _running(w, "x", gpus=6, limit=x_limit) == "a"
    assert _running(w, "y", gpus=7, limit=y_limit) == "b"
    return w


def test_two_jobs_hold_hosts_of_their_own_and_a_job_may_backfill_only_those_it_ends_in_time_on() -> None:
    w = _two_busy_hosts()  # b is free at NOW + 280 (a deadline and its grace), a at NOW + 480
    w.submit("big", gpus=8, at=NOW - 20)
    w.submit("big2", gpus=8, at=NOW - 19)
    w.submit("open", gpus=1, at=NOW - 8)  # no time limit: may use neither
    plan = w.cycle()
    assert plan.reservations == [Reservation("big", frozenset({"b"}), NOW + 250 + GRACE),
                                 Reservation("big2", frozenset({"a"}), NOW + 450 + GRACE)]
    assert w.state.reserved == {"big", "big2"} and w.job("open").state is JobState.QUEUED
    view = JobView(w.state, None, half_life_s=0)
    why = {r.reason: r.detail for r in view.queue_reasons(w.job("open"), NOW)}
    assert why[RESERVED_FOR_OTHER] == ("the hosts with room for it are held for jobs big (could start in about 280 s)"
                                       ", big2 (could start in about 480 s); it has no time limit, so it may not "
                                       "use them meanwhile")
    # 300 s ends it before a's start, not b's: it goes to a. 100 s ends it before either.
    w.submit("mid", gpus=2, at=NOW - 7, time_limit_s=300)
    w.submit("short", gpus=1, at=NOW - 6, time_limit_s=100)
    w.cycle()
    assert w.job("mid").attempts[0].host_id == "a" and w.job("short").attempts[0].host_id == "b"
    assert w.job("open").state is JobState.QUEUED
    # With one reservation at a time, open would have run on a.
    w1 = _two_busy_hosts(policy=QueuePolicy(reserve_jobs=1))
    w1.submit("big", gpus=8, at=NOW - 20)
    w1.submit("big2", gpus=8, at=NOW - 19)
    w1.submit("open", gpus=1, at=NOW - 8)
    assert [r.job_id for r in w1.cycle().reservations] == ["big"] and w1.job("open").attempts[0].host_id == "a"


def test_a_job_without_gpus_uses_a_reserved_host_while_it_leaves_the_reserved_jobs_cpu_and_memory() -> None:
    w = World()
    w.host("a")
    _running(w, "x", gpus=6, limit=500)  # on a (64 CPUs), until NOW + 450
    w.submit("big", gpus=8, cpus=40, at=NOW - 20)
    w.cycle()
    assert w.state.reserved == {"big"}
    # No time limit, no GPU: 20 CPUs leave 63 - 20 = 43 >= big's 40, so big starts as soon.
    w.submit("prep", cpus=20, at=NOW - 5)
    # 10 more would leave 33 < 40: kept off, and why pending says so.
    w.submit("etl", cpus=10, at=NOW - 4)
    w.cycle()
    assert w.job("prep").state is JobState.PLACED and w.job("etl").state is JobState.QUEUED
    why = {r.reason: r.detail for r in JobView(w.state, None, half_life_s=0).queue_reasons(w.job("etl"), NOW)}
    assert "held for job big" in why[RESERVED_FOR_OTHER]
    # x ends: big starts on a beside prep.
    w.cycle(reports=[w.report("x", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 1)], now=NOW + 1)
    assert w.job("big").state is JobState.PLACED and w.job("big").attempts[0].host_id == "a"


def _unlimited(waited: float) -> tuple[World, Reservation | None]:
    w = _two_busy_hosts(x_limit=0, y_limit=0, policy=QueuePolicy(reserve_after_s=10, reserve_max_s=100))
    w.submit("big", gpus=8, at=NOW - waited)
    return w, next(iter(w.cycle().reservations), None)


def test_without_a_time_limit_a_reservation_holds_the_emptiest_host_for_a_bounded_time() -> None:
    w, r = _unlimited(waited=20)
    assert r is not None and r.start == UNKNOWN
    assert r.hosts == {w.job("x").attempts[0].host_id}  # the most free GPUs
    assert _unlimited(waited=9)[1] is None  # not waited long enough
    assert _unlimited(waited=111)[1] is None  # waited past 10 + 100 s: its start unknown, no more


def test_a_jobs_wait_for_a_reservation_counts_from_when_it_could_first_be_placed() -> None:
    """A job held, or waiting for its begin time or the jobs it runs after, longer than
    the window of reservations whose start is unknown never held one, while jobs submitted
    after it did (found by exploring): its wait counts from its release, its begin time or
    its dependencies' end."""
    from wire.messages import Command

    def parked(**fields: object) -> tuple[World, Reservation | None]:
        w = _two_busy_hosts(x_limit=0, y_limit=0, policy=QueuePolicy(reserve_after_s=10, reserve_max_s=100))
        w.submit("big", gpus=8, at=NOW - 1000)
        job = w.job("big").model_copy(update=fields)
        w.state.apply_state_record(Record("job.big", next(w.rev), encode(job)))
        return w, next(iter(w.cycle().reservations), None)

    assert parked()[1] is None  # waited 1,000 s for room: past the window
    for fields in ({"not_before": NOW - 20}, {"freed_at": NOW - 20}):
        _w, r = parked(**fields)
        assert r is not None and r.job_id == "big" and r.start == UNKNOWN, fields
        assert parked(**{k: NOW - 5 for k in fields})[1] is None  # not waited long enough since
    # A release and the end of the jobs it runs after say when.
    w, _r = parked(hold="held by op")
    w.cycle(commands=[Command(kind="update", job_id="big", by="op", hold=False, ts=NOW)], now=NOW + 1)
    assert w.job("big").freed_at == NOW + 1 and w.job("big").waiting_since == NOW + 1
    w.submit("first", gpus=0)
    w.cycle()
    after = make_job("then", spec=job_spec("then", command=["x"], gpus=8, cpus=1, memory_mb=1, depends_on=["first"]),
                     submitted_at=NOW - 1000, waiting_for=["first"])
    w.state.apply_state_record(Record("job.then", next(w.rev), encode(after)))
    w.cycle(reports=[w.report("first", 0, AttemptState.RUNNING)], now=NOW + 2)
    w.cycle(reports=[w.report("first", 0, AttemptState.SUCCEEDED, code=0)], now=NOW + 3)
    w.cycle(now=NOW + 4)  # the end is read back, then the jobs after it are looked at
    assert w.job("then").waiting_for == [] and w.job("then").freed_at == NOW + 4


def _streams(seed: int, policy: QueuePolicy, steps: int = 40, bigs: int = 1) -> list[int | None]:
    """Four 8-GPU hosts, six 1-GPU jobs arriving each 5 s step and running 2-8 steps (no
    time limits); `bigs` 8-GPU jobs arrive at step 5. The steps each waited (None: never
    placed)."""
    rnd = random.Random(seed)
    w = World()
    w.policy = policy
    for h in range(4):
        w.host(f"h{h}")
    ends: dict[str, int] = {}
    waited: dict[str, int] = {}
    names = [f"big{i}" if i else "big" for i in range(bigs)]
    for step in range(steps):
        t = NOW + 1 + 5 * step
        done = [j for j, e in ends.items() if e <= step]
        for j in done:
            del ends[j]
        for k in range(6):
            w.submit(f"s{step}.{k}", gpus=1, at=t - 0.5 + k * 0.01)
        if step == 5:
            for i, name in enumerate(names):
                w.submit(name, gpus=8, at=t - 1 + i * 0.01)
        w.cycle(reports=[w.report(j, 0, AttemptState.SUCCEEDED, code=0) for j in done], now=t)
        for j, job in w.state.jobs.items():
            if j.startswith("s") and j not in ends and job.state is JobState.PLACED:
                ends[j] = step + rnd.randint(2, 8)
        for name in names:
            if name in w.state.jobs and name not in waited and w.job(name).state is JobState.PLACED:
                waited[name] = step - 5
        if len(waited) == bigs:
            break
    return [waited.get(name) for name in names]


def _stream(seed: int, policy: QueuePolicy, steps: int = 40) -> int | None:
    return _streams(seed, policy, steps)[0]


def test_a_big_single_host_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    # With reservations off the same stream never lets it run (seed 0 is such a stream).
    assert _stream(0, QueuePolicy(reserve_after_s=1e12)) is None
    waited = _stream(0, QueuePolicy())
    assert waited is not None and waited <= 2 + 8  # the reservation after 2 steps, the host's jobs done in 8


def test_several_big_jobs_hold_reservations_at_once_and_none_waits_for_the_others() -> None:
    """Two 8-GPU jobs in the same stream: with one reservation at a time the second gets
    its own only once the first runs; with several, each holds a host of its own from the
    start and both run once their hosts' small jobs end."""
    for seed in (3, 5):  # streams where the second waits past 2 + 8 steps with one at a time
        one = _streams(seed, QueuePolicy(reserve_jobs=1), bigs=2)
        several = _streams(seed, QueuePolicy(reserve_jobs=4), bigs=2)
        # Reserved after 2 steps, the host's small jobs done in 8 more.
        assert all(x is not None and x <= 2 + 8 for x in several), (seed, several)
        assert one[0] is not None and one[0] <= 2 + 8 and (one[1] is None or one[1] > 2 + 8), (seed, one)
    assert _streams(1, QueuePolicy(reserve_jobs=0), bigs=2) == [None, None]  # 0: no reservations


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 2))
def test_a_reserved_job_starts_by_its_reserved_start_when_every_job_has_a_limit(seed: int, bigs: int) -> None:
    """Jobs of 1-4 GPUs with time limits, each ending at a random time within its limit;
    one or two 8-GPU jobs wait. Once one holds a reservation with a known start, nothing
    placed after keeps it from starting by then (backfilled jobs end in time, and the
    other's reservation is on other hosts)."""
    rnd = random.Random(seed)
    w = World()
    for h in range(3):
        w.host(f"h{h}")
    ends: dict[str, float] = {}
    names = ["big", "big2"][:bigs]
    promised: dict[str, float] = {}
    for step in range(80):
        t = NOW + 5 * step
        done = [j for j, e in ends.items() if e <= t]
        reports = [w.report(j, 0, AttemptState.SUCCEEDED, code=0, ts=t) for j in done]
        for j in done:
            del ends[j]
        for k in range(rnd.randint(0, 3)):
            w.submit(f"s{step}.{k}", gpus=rnd.randint(1, 4), at=t - 0.5 + k * 0.01,
                     time_limit_s=float(rnd.choice([20, 40, 80, 160])))
        if step == 3:
            for i, name in enumerate(names):
                w.submit(name, gpus=8, at=t - 1 + i * 0.01, time_limit_s=1000)
        plan = w.cycle(reports=reports, now=t)
        started = [j for j, job in w.state.jobs.items() if job.state is JobState.PLACED and j not in ends]
        w.cycle(reports=[w.report(j, 0, AttemptState.RUNNING, ts=t) for j in started], now=t)
        for j in started:
            ends[j] = t + rnd.uniform(1, w.job(j).spec.time_limit_s)
        waiting = [n for n in names if n in w.state.jobs and w.job(n).state is JobState.QUEUED]
        for name in names:
            if name in w.state.jobs and name not in waiting and name in promised:
                assert t <= promised.pop(name) + 5  # placed in the first cycle at or after it
        if step > 3 and not waiting:
            return
        for r in plan.reservations:
            if r.job_id in waiting and r.known():
                promised[r.job_id] = min(promised.get(r.job_id, r.start), r.start)
        for name, at in promised.items():
            assert t <= at + 5, f"{name}'s reserved start passed and it is still queued"


def test_a_job_no_host_can_take_does_not_keep_the_next_from_its_reservation() -> None:

    w = _two_busy_hosts()
    nowhere = make_job("nowhere", spec=job_spec("nowhere", command=["x"], gpus=1, cpus=1, memory_mb=1,
                                                host_labels={"pool": "none"}), submitted_at=NOW - 30)
    w.state.apply_state_record(Record("job.nowhere", next(w.rev), encode(nowhere)))
    w.submit("big", gpus=8, at=NOW - 20)
    plan = w.cycle()
    assert w.job("nowhere").state is JobState.QUEUED  # first in order, and no host has its label
    assert plan.reservations == [Reservation("big", frozenset({"b"}), NOW + 250 + GRACE)]


def test_a_reservation_stays_with_its_job_while_it_waits() -> None:
    w = _two_busy_hosts()
    w.submit("big", gpus=8, at=NOW - 20)
    w.cycle()
    assert w.state.reserved == {"big"}
    # A job ahead of it in the queue (submitted earlier) that finds no room either does
    # not take the reservation from it: it gets the other host.
    w.submit("first", gpus=8, at=NOW - 25)
    plan = w.cycle(now=NOW + 1)
    assert plan.reservations == [Reservation("big", frozenset({"b"}), NOW + 250 + GRACE),
                                 Reservation("first", frozenset({"a"}), NOW + 450 + GRACE)]
    assert "big" not in plan.jobs  # unchanged: not written again
    # y ends: the job ahead is placed first, on b (a reservation never reorders the
    # queue); big's reservation moves to a, free once x ends.
    plan = w.cycle(reports=[w.report("y", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 2)], now=NOW + 2)
    assert w.job("first").state is JobState.PLACED and w.job("first").attempts[0].host_id == "b"
    assert plan.reservations == [Reservation("big", frozenset({"a"}), NOW + 450 + GRACE)]
    assert w.job("big").reserved == Reserved(hosts=["a"], host_count=1, start=NOW + 450 + GRACE, since=NOW)
    # x ends: big starts on a; no job holds a reservation any more.
    plan = w.cycle(reports=[w.report("x", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 3)], now=NOW + 3)
    assert w.job("big").state is JobState.PLACED and w.job("big").attempts[0].host_id == "a"
    assert plan.reservations == [] and w.job("big").reserved is None and w.state.reserved == set()


def test_the_job_a_reservation_is_kept_for_is_placed_on_it_when_a_job_ahead_waits() -> None:
    w = _two_busy_hosts()
    w.submit("big", gpus=8, at=NOW - 20)
    w.cycle()
    assert w.state.reserved == {"big"}
    # A gang ahead of big that needs both hosts, and y ends: the gang finds no room and
    # the cycle keeps big's reservation (b, free now), so big must be placed there.
    w.submit("gang", gpus=8, replicas=2, at=NOW - 30)
    plan = w.cycle(reports=[w.report("y", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 1)], now=NOW + 1)
    assert w.job("gang").state is JobState.QUEUED
    assert w.job("big").state is JobState.PLACED and w.job("big").attempts[0].host_id == "b"
    # The gang holds what is left (a), its start unknown until it holds both.
    assert plan.reservations == [Reservation("gang", frozenset({"a"}), UNKNOWN)]  # big's went with its placement


def test_a_gang_with_too_few_hosts_it_may_use_holds_none_of_them() -> None:
    """A gang of three whole-host tasks on a cluster of two hosts (or whose third host is
    drained) could never start on what it would hold: it holds nothing, and a job after
    it that could start gets its reservation and runs."""
    w = _two_busy_hosts()
    w.submit("gang", gpus=8, replicas=3, at=NOW - 30)
    w.submit("big", gpus=8, at=NOW - 20)
    w.submit("open", gpus=1, at=NOW - 8)  # no time limit: only a host nobody holds
    plan = w.cycle()
    assert plan.reservations == [Reservation("big", frozenset({"b"}), NOW + 250 + GRACE)]
    assert w.job("gang").reserved is None and w.job("gang").state is JobState.QUEUED
    assert w.job("open").attempts[0].host_id == "a"
    # Two tasks on two hosts: the gang holds both, from when both are free.
    w2 = _two_busy_hosts()
    w2.submit("gang", gpus=8, replicas=2, at=NOW - 30)
    w2.submit("open", gpus=1, at=NOW - 8)
    assert w2.cycle().reservations == [Reservation("gang", frozenset({"a", "b"}), NOW + 450 + GRACE)]
    assert w2.job("open").state is JobState.QUEUED


def test_a_reserved_job_placed_in_the_cycle_leaves_the_rest_of_its_hosts_to_the_jobs_after_it() -> None:
    w = _two_busy_hosts()
    w.submit("mid", gpus=4, at=NOW - 20)
    w.cycle()
    assert w.job("mid").reserved is not None and w.job("mid").reserved.hosts == ["b"]
    # y ends: b is free. The gang ahead of mid finds no room (mid keeps b, the gang holds
    # a); mid is placed on b, and the 4 GPUs it leaves there go to a job with no limit.
    w.submit("gang", gpus=8, replicas=2, at=NOW - 30)
    w.submit("open", gpus=1, at=NOW - 5)
    plan = w.cycle(reports=[w.report("y", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 1)], now=NOW + 1)
    assert w.job("mid").state is JobState.PLACED and w.job("mid").attempts[0].host_id == "b"
    assert w.job("open").state is JobState.PLACED and w.job("open").attempts[0].host_id == "b"
    assert plan.reservations == [Reservation("gang", frozenset({"a"}), UNKNOWN)]


def test_a_full_cluster_still_gives_a_reservation() -> None:
    # No host has a GPU free, so the index files none under the model's free GPUs: the
    # hosts are found by all their GPUs instead, and the one whose tasks end first wins.
    w = World()
    for h in "abc":
        w.host(h)
    _running(w, "x", gpus=8, limit=0)
    _running(w, "y", gpus=8, limit=900)
    _running(w, "z", gpus=8, limit=0)
    w.submit("big", gpus=8, at=NOW - 20)
    plan = w.cycle()
    assert plan.reservations == [Reservation("big", frozenset({w.job("y").attempts[0].host_id}), NOW + 850 + GRACE)]
    # With no time limit anywhere, still a reservation (its start unknown), also for a
    # job that names its GPU model.
    w2 = World()
    for h in "ab":
        w2.host(h)
    _running(w2, "x", gpus=8, limit=0)
    _running(w2, "z", gpus=8, limit=0)
    big = make_job("big", spec=job_spec("big", command=["x"], gpus=8, gpu_model="H100", cpus=1, memory_mb=1),
                   submitted_at=NOW - 20)
    w2.state.apply_state_record(Record("job.big", next(w2.rev), encode(big)))
    r = next(iter(w2.cycle().reservations), None)
    assert r is not None and r.start == UNKNOWN and len(r.hosts) == 1


def test_a_gang_of_one_model_holds_hosts_of_one_model_or_none() -> None:
    """Found by exploring: a `sameModel` gang of two tasks on A100 or L4, with one host of
    each, held both hosts (a set it can never run on) with a start of "now" for ever, and
    every other job was kept off them, idle as they were. It holds hosts of one model only:
    none here, two A100 hosts once there are two."""
    w = World()
    for host_id, model in (("a1", "A100"), ("l1", "L4")):
        rec = heartbeat_record(host_id, next(w.rev), shape=False, boot_id="b", seq=0, ts=NOW, gpus=2, model=model,
                               cpus=64, memory_mb=10**6)
        w.state.apply_host_record(rec, now=NOW)

    def submit(job_id: str, **fields: object) -> None:
        spec = job_spec(job_id, command=["x"], cpus=1, memory_mb=1, **fields)
        w.state.apply_state_record(Record(f"job.{job_id}", next(w.rev), encode(make_job(job_id, spec=spec,
                                                                                         submitted_at=NOW - 30))))

    submit("pair", gpus=2, gpu_models=["A100", "L4"], same_model=True, replicas=2)
    w.cycle()
    assert w.job("pair").state is JobState.QUEUED and w.job("pair").reserved is None
    submit("one", gpus=1, gpu_model="A100")  # no time limit: only a host nobody holds
    w.cycle()
    assert w.job("one").state is JobState.PLACED
    rec = heartbeat_record("a2", next(w.rev), shape=False, boot_id="b", seq=0, ts=NOW, gpus=2, model="A100",
                           cpus=64, memory_mb=10**6)
    w.state.apply_host_record(rec, now=NOW)
    plan = w.cycle()
    assert [(r.job_id, sorted(r.hosts)) for r in plan.reservations] == [("pair", ["a1", "a2"])]


def test_a_gang_that_fits_stacked_on_one_host_holds_it() -> None:
    """Found by exploring: a gang of two 1-GPU tasks that only one 2-GPU host can take
    (placement stacks a gang's tasks) held nothing, since it found fewer hosts than tasks,
    and a later job with no time limit took the GPU the first job there freed: it waited for
    ever. It holds the host, for both of its tasks."""
    w = World()
    w.host("h", gpus=2)
    for name, limit in (("x", 40.0), ("y", 80.0)):
        w.submit(name, gpus=1, at=NOW - 100, time_limit_s=limit)
        w.cycle(now=NOW - 50)
        w.cycle(reports=[w.report(name, 0, AttemptState.RUNNING, ts=NOW - 50)], now=NOW - 50)
    w.submit("gang", gpus=1, replicas=2, at=NOW - 30, time_limit_s=60)
    plan = w.cycle()
    assert plan.reservations == [Reservation("gang", frozenset({"h"}), NOW + 30 + GRACE, stacked=True)]
    w.submit("open", gpus=1, at=NOW - 5)  # no time limit
    w.cycle(reports=[w.report("x", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 1)], now=NOW + 1)
    assert w.job("open").state is JobState.QUEUED  # x's GPU is kept for the gang
    w.cycle(reports=[w.report("y", 0, AttemptState.SUCCEEDED, code=0, ts=NOW + 2)], now=NOW + 2)
    assert w.job("gang").state is JobState.PLACED and {a.host_id for a in w.job("gang").attempts} == {"h"}


def test_why_pending_counts_the_start_allowance_and_the_grace_as_backfill_does() -> None:
    """Found by review: a job whose 100 s limit would end before a start 130 s away was told
    its limit 'runs past that': backfill also allows 10 s to start and its grace to leave."""
    w = World()
    w.host("a")
    _running(w, "soon", gpus=7, limit=150)  # ends NOW + 100, gone by NOW + 130
    w.submit("big", gpus=8, at=NOW - 20)
    w.submit("mid", gpus=1, at=NOW - 5, time_limit_s=100)
    w.cycle()
    assert w.job("mid").state is JobState.QUEUED
    why = {r.reason: r.detail for r in JobView(w.state, None, half_life_s=0).queue_reasons(w.job("mid"), NOW)}
    assert ("its time limit of 100 s runs past that (allowing 10 s to start and its grace of 30 s to leave)"
            in why[RESERVED_FOR_OTHER]), why


@pytest.mark.parametrize(("short", "enough"), [("A100", "L4"), ("L4", "A100")])
def test_a_gang_of_one_model_holds_the_model_with_hosts_enough_whatever_their_names(short: str,
                                                                                       enough: str) -> None:
    """Found by review: a model short of hosts sorting first kept the one with hosts enough
    from being chosen (both starts unknown), so the gang held nothing."""
    w = World()
    hosts = [("s1", short), ("e1", enough), ("e2", enough)]
    for host_id, model in hosts:
        w.state.apply_host_record(heartbeat_record(host_id, next(w.rev), shape=False, boot_id="b", seq=0, ts=NOW,
                                                   gpus=2, model=model, cpus=64, memory_mb=10**6), now=NOW)

    def submit(job_id: str, at: float, **fields: object) -> None:
        spec = job_spec(job_id, command=["x"], cpus=1, memory_mb=1, **fields)
        w.state.apply_state_record(Record(f"job.{job_id}", next(w.rev), encode(make_job(job_id, spec=spec,
                                                                                         submitted_at=at))))

    for host_id, model in hosts:  # every host busy with a job of no time limit
        submit(f"busy-{host_id}", NOW - 200, gpus=2, gpu_model=model)
        w.cycle(now=NOW - 150)
    submit("pair", NOW - 100, gpus=2, gpu_models=[short, enough], same_model=True, replicas=2)
    plan = w.cycle()
    assert [(r.job_id, sorted(r.hosts)) for r in plan.reservations] == [("pair", ["e1", "e2"])]


def test_a_stacked_gangs_host_is_kept_from_jobs_without_gpus_that_would_take_what_all_its_tasks_need() -> None:
    """Found by review: a job with no GPU and no time limit was let onto a host held for a
    stacked gang when what it left held one task's CPUs, not the gang's: it waited for ever."""
    w = World()
    w.host("h", gpus=2)  # 64 CPUs
    for name, limit in (("x", 40.0), ("y", 80.0)):
        w.submit(name, gpus=1, at=NOW - 100, time_limit_s=limit, cpus=4)
        w.cycle(now=NOW - 50)
        w.cycle(reports=[w.report(name, 0, AttemptState.RUNNING, ts=NOW - 50)], now=NOW - 50)
    w.submit("gang", gpus=1, replicas=2, at=NOW - 30, time_limit_s=60, cpus=24)  # 48 CPUs on h
    assert [r.stacked for r in w.cycle().reservations] == [True]
    w.submit("hog", at=NOW - 5, cpus=30)  # 56 free - 30 = 26: one task's 24, not two
    w.submit("small", at=NOW - 4, cpus=8)  # 56 - 8 = 48: both tasks' still
    w.cycle(now=NOW + 1)
    assert w.job("hog").state is JobState.QUEUED and w.job("small").state is JobState.PLACED


def test_a_task_taking_gpus_the_reserved_job_cannot_use_spares_its_host() -> None:
    """Found by exploring: a job waiting for a whole GPU held its host, and jobs of MIG
    slices waited beside free MIG instances it could never use. A task spares a reserved
    host when the GPUs it takes are not of a kind the reserved job takes (MIG instances
    against whole GPUs or shares, and back; a model it does not take), and the CPU and
    memory left still hold the reserved tasks."""
    from server.scheduling.backfill import spares
    from tests.factories import host_capacity, job_spec

    cap = host_capacity("m1", gpus=4, model="A100", cpus=64, memory_mb=256_000)
    whole = job_spec("w", gpus=1, gpu_model="A100", cpus=4, memory_mb=1000)
    mig = job_spec("m", gpus=0, mig_profile="1g.10gb", cpus=2, memory_mb=1000)
    assert spares(cap, mig, whole) and spares(cap, whole, mig)
    assert not spares(cap, job_spec("w2", gpus=1, cpus=1, memory_mb=10), whole)  # a whole GPU it could use
    assert not spares(cap, job_spec("s", gpus=0, gpu_share=500, cpus=1, memory_mb=10), whole)  # a share of one
    h100 = job_spec("h", gpus=1, gpu_model="H100", cpus=1, memory_mb=10)
    assert spares(cap, h100, whole)  # a model the reserved job does not take
    assert spares(cap, job_spec("c", gpus=0, cpus=1, memory_mb=10), whole)  # no GPU, as before
    hungry = job_spec("mh", gpus=0, mig_profile="1g.10gb", cpus=62, memory_mb=1000)
    assert not spares(cap, hungry, whole)  # the CPUs the reserved task needs
    from dataclasses import replace

    from server.scheduling.placement import MAX_TASKS_PER_HOST
    from wire.budgets import RECORD_BUDGET

    full = replace(cap, tasks=MAX_TASKS_PER_HOST - 2)  # room for two tasks: the reserved one's and this
    assert spares(full, mig, whole) and not spares(full, mig, whole, tasks=2)
    assert not spares(replace(cap, record_bytes=RECORD_BUDGET - 100), mig, whole)  # no room in its record
    # What the planner and why pending ask (a review: it kept every job wanting a GPU off,
    # whatever `spares` said).
    from server.scheduling.backfill import kept_off

    r = Reservation("w", frozenset({"m1"}), None)
    assert kept_off(mig, 0.0, NOW, r, whole, lambda _h: cap) == frozenset()
    assert kept_off(job_spec("w2", gpus=1, cpus=1, memory_mb=10), 0.0, NOW, r, whole, lambda _h: cap) == {"m1"}
