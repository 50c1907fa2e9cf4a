"""Maintenance windows (scheduling.maintenance, the planner's and the views' use of it): a
host with a drain scheduled ahead takes, until it begins, only jobs that its deadline
would not stop; from its start nothing; at its deadline what still runs is stopped."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling.maintenance import START_ALLOWANCE_S, KeptOff, Window, may_run_before, started
from server.scheduling.planner import QueuePolicy
from server.scheduling.queues import MAINTENANCE
from server.state.cluster import HostConfig
from server.views.hosts import HostTable
from server.views.jobs import JobView
from tests.factories import job as make_job
from tests.factories import job_spec
from tests.unit.test_backfill import _running
from tests.unit.test_gangs import NOW, World
from wire.messages import AttemptState, JobState, Queue, encode
from wire.records import Record

WINDOW = Window(starts=NOW + 600, stops=NOW + 900)


def _schedule(w: World, host_id: str, starts: float, stops: float) -> None:
    cfg = HostConfig(draining=True, drain_at=starts, drain_deadline=stops, reason="driver update", by="ops", ts=NOW)
    w.state.apply_state_record(Record(f"hostcfg.{host_id}", next(w.rev), cfg.model_dump_json().encode()))


def _host_of(w: World, job_id: str) -> str | None:
    job = w.job(job_id)
    return job.attempts[-1].host_id if job.attempts else None


# ---------------------------------------------------------------- pure parts


def test_a_job_may_start_before_the_window_only_if_its_limit_ends_it_by_the_deadline() -> None:
    assert START_ALLOWANCE_S == 10  # the figures below allow it
    assert may_run_before(890, NOW, WINDOW) and not may_run_before(891, NOW, WINDOW)
    assert not may_run_before(0, NOW, WINDOW)  # no limit: it could run into the window
    assert not may_run_before(10, NOW + 600, WINDOW)  # begun: nothing new, however short
    assert may_run_before(10, NOW + 599, WINDOW)
    assert started(WINDOW, NOW + 600) and not started(WINDOW, NOW + 599) and not started(None, NOW)


def test_the_hosts_kept_off_are_worked_out_once_per_limit() -> None:
    windows = {"a": WINDOW, "b": Window(NOW + 100, NOW + 100)}
    kept = KeptOff(windows, NOW)
    assert kept(0) == {"a", "b"} and kept(90) == set() and kept(91) == {"b"} and kept(891) == {"a", "b"}
    assert kept(91) is kept(91) and kept(0) is kept(891)  # limits keeping to the same windows share one set
    assert KeptOff({}, NOW)(0) == frozenset()


def test_a_host_setting_makes_a_window_only_for_a_drain_scheduled_ahead() -> None:
    assert HostConfig(draining=True, drain_at=NOW + 1, drain_deadline=NOW + 5).window() == Window(NOW + 1, NOW + 5)
    assert HostConfig(cordoned=True, draining=True, drain_deadline=NOW + 5).window() is None  # begun at once
    assert HostConfig(cordoned=True).window() is None
    ahead = HostConfig(draining=True, drain_at=NOW + 1, drain_deadline=NOW + 5)
    assert not ahead.cordoned_at(NOW) and ahead.cordoned_at(NOW + 1)
    w = World()
    w.host("a")
    _schedule(w, "a", NOW + 1, NOW + 5)
    assert w.state.maintenance == {"a": Window(NOW + 1, NOW + 5)}
    w.state.apply_state_record(Record("hostcfg.a", next(w.rev), HostConfig().model_dump_json().encode()))
    assert w.state.maintenance == {}  # uncordoned: the window is gone


# ---------------------------------------------------------------- in the planner


def test_before_the_window_only_jobs_that_end_by_its_deadline_are_placed_there() -> None:
    w = World()
    w.host("a")
    _schedule(w, "a", WINDOW.starts, WINDOW.stops)
    w.submit("open", gpus=1, at=NOW - 3)  # no limit: could still run at the deadline
    w.submit("long", gpus=1, at=NOW - 2, time_limit_s=891)  # one second too long
    w.submit("short", gpus=1, at=NOW - 1, time_limit_s=890)  # ends by the deadline, started within 10 s
    w.cycle()
    assert w.job("short").state is JobState.PLACED and _host_of(w, "short") == "a"
    assert w.job("open").state is JobState.QUEUED and w.job("long").state is JobState.QUEUED
    # Why pending says which hosts and why, for the job with no limit and the one too long.
    view = JobView(w.state, None, half_life_s=0)
    why = {r.reason: r.detail for r in view.queue_reasons(w.job("long"), NOW)}
    assert why[MAINTENANCE] == ("the hosts with room for it (a) are drained for maintenance in about 600 s, what "
                                "still runs there stopped in about 900 s; its time limit of 891 s runs past that "
                                "(allowing 10 s to start), so it may not start there now")
    why_open = {r.reason: r.detail for r in view.queue_reasons(w.job("open"), NOW)}
    assert "it has no time limit" in why_open[MAINTENANCE]
    # A host with no window takes them.
    w.host("b")
    w.cycle()
    assert _host_of(w, "open") == "b" and _host_of(w, "long") == "b"
    assert MAINTENANCE not in {r.reason for r in view.queue_reasons(w.job("open"), NOW)}


def test_a_queue_default_time_limit_counts_as_the_jobs_limit() -> None:
    w = World()
    w.host("a")
    _schedule(w, "a", WINDOW.starts, WINDOW.stops)
    w.state.apply_state_record(Record("queue.default", next(w.rev),
                                      encode(Queue(name="default", default_time_limit_s=300))))
    w.submit("j", gpus=1)  # no limit of its own: its queue's 300 s
    w.cycle()
    assert _host_of(w, "j") == "a"


def test_once_the_window_begins_nothing_new_is_placed_and_at_its_deadline_the_rest_is_stopped() -> None:
    w = World()
    w.host("a")
    w.submit("early", gpus=1, at=NOW - 10)  # placed before the drain was scheduled, no limit
    w.cycle(now=NOW - 5)
    w.cycle(reports=[w.report("early", 0, AttemptState.RUNNING, ts=NOW - 5)], now=NOW - 5)
    _schedule(w, "a", WINDOW.starts, WINDOW.stops)
    w.submit("tiny", gpus=1, at=WINDOW.starts, time_limit_s=1)
    w.cycle(now=WINDOW.starts)
    assert w.job("tiny").state is JobState.QUEUED
    assert w.job("early").state is JobState.RUNNING and not w.job("early").attempts[0].stop_kind
    w.cycle(now=WINDOW.stops)
    stopping = w.job("early").attempts[0]
    assert stopping.stop_kind == "drain" and "driver update" in stopping.reason
    assert w.state.allocs["a"].tasks[0].stop
    w.cycle(reports=[w.report("early", 0, AttemptState.KILLED, ts=WINDOW.stops + 1)], now=WINDOW.stops + 1)
    assert w.job("early").state is JobState.QUEUED  # requeued, the try not counted (a drain's)
    w.cycle(now=WINDOW.stops + 2)
    assert w.job("early").state is JobState.QUEUED and w.job("tiny").state is JobState.QUEUED


def test_a_gang_takes_no_host_whose_window_its_limit_runs_into() -> None:
    w = World()
    for h in "abc":
        w.host(h)
    _schedule(w, "a", WINDOW.starts, WINDOW.stops)
    w.submit("g", gpus=8, replicas=3, time_limit_s=1000)
    w.cycle()
    assert w.job("g").state is JobState.QUEUED and w.used_gpus() == 0
    w.submit("g2", gpus=8, replicas=2, time_limit_s=1000)
    w.cycle()
    assert sorted(a.host_id for a in w.job("g2").attempts) == ["b", "c"]


def test_a_reservation_is_never_made_on_a_host_whose_window_its_job_would_run_into() -> None:
    """Also when a job holding a reservation has it worked out again while another job,
    which may use the window's host, finds no room."""
    w = World()
    w.host("a")
    w.host("b")
    assert _running(w, "ra", 8, 100) == "a"  # a frees at NOW + 50
    assert _running(w, "rb", 8, 1000) == "b"  # b at NOW + 950
    _schedule(w, "a", WINDOW.starts, WINDOW.stops)
    w.submit("keeper", gpus=8, at=NOW - 300)  # no time limit: it may not run on a
    plan = w.cycle()
    assert [(r.job_id, r.hosts) for r in plan.reservations] == [("keeper", {"b"})]
    # A job of higher priority with a limit that fits a's window finds no room either.
    urgent = make_job("urgent", spec=job_spec("urgent", command=["x"], gpus=8, cpus=1, memory_mb=1, priority=10,
                                              time_limit_s=500), submitted_at=NOW - 200)
    w.state.apply_state_record(Record("job.urgent", next(w.rev), encode(urgent)))
    plan = w.cycle()
    assert dict((r.job_id, r.hosts) for r in plan.reservations)["keeper"] == {"b"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-200, 800), st.integers(0, 600)), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(1, 8), st.sampled_from([0, 100, 300, 600, 1200])), min_size=1, max_size=12))
def test_nothing_placed_would_run_into_a_window(windows: list[tuple[int, int]], jobs: list[tuple[int, int]]) -> None:
    """Whatever the windows (some begun) and the jobs' sizes and limits: every task placed
    on a host with a window was placed before it began and ends by its deadline; a host
    without one takes what fits."""
    w = World()
    w.policy = QueuePolicy(reserve_jobs=0)  # no reservations: the open host's room is any job's
    hosts = [f"h{i}" for i in range(len(windows) + 1)]
    for h in hosts:
        w.host(h)
    for h, (start, length) in zip(hosts, windows, strict=False):
        _schedule(w, h, NOW + start, NOW + start + length)
    for i, (gpus, limit) in enumerate(jobs):
        w.submit(f"j{i}", gpus=gpus, at=NOW - 100 + i, time_limit_s=float(limit))
    w.cycle()
    placed = 0
    for i, (_gpus, limit) in enumerate(jobs):
        host = _host_of(w, f"j{i}")
        if host is None:
            continue
        placed += 1
        window = w.state.maintenance.get(host)
        if window is not None:
            assert NOW < window.starts and 0 < limit and NOW + START_ALLOWANCE_S + limit <= window.stops
    assert placed == sum(1 for j in w.state.jobs.values() if j.state is JobState.PLACED)
    # The host without a window takes every job that its room left at the end would fit.
    alloc = w.state.allocs.get(hosts[-1])
    free = 8 - sum(len(t.gpu_indices) for t in (alloc.tasks if alloc is not None else ()))
    assert all(w.job(f"j{i}").state is JobState.PLACED for i, (g, _) in enumerate(jobs) if g <= free)


# ---------------------------------------------------------------- as shown


def test_a_host_row_shows_the_window_ahead_then_the_drain_begun() -> None:
    w = World()
    w.host("a")
    _schedule(w, "a", WINDOW.starts, WINDOW.stops)
    table = HostTable(w.state)
    ahead = table.row("a", NOW)
    assert ahead is not None
    assert (ahead.drain_at, ahead.drain_deadline, ahead.cordoned, ahead.draining) == \
        (WINDOW.starts, WINDOW.stops, False, False)
    begun = table.row("a", WINDOW.starts)
    assert begun is not None
    assert (begun.drain_at, begun.drain_deadline, begun.cordoned, begun.draining) == (0.0, WINDOW.stops, True, True)


def test_the_hosts_kept_off_are_freed_with_their_cycle() -> None:
    """Found by exploring: KeptOff and its union held each other (a lambda over `self`), a
    reference cycle the server's collector, freezing what lives, never freed: one every few
    scheduling cycles. Reference counting frees it now."""
    import gc
    import weakref

    kept = KeptOff({"h1": Window(100.0, 200.0), "h2": Window(50.0, 60.0)}, now=10.0)
    assert kept(3600.0) == frozenset({"h1", "h2"})
    gone = weakref.ref(kept)
    gc.disable()
    try:
        del kept
        assert gone() is None
    finally:
        gc.enable()


def test_a_reservation_is_not_held_on_a_host_closed_by_the_time_the_job_could_start_there() -> None:
    """Found by exploring: a job that waited was held host a, whose maintenance window began
    before the reserved start (a was free only after it), so it could never start there;
    host b, where it could, was given to a later job without a time limit, and the job
    waited for the window's end. The same with an advance reservation for another queue.
    It is held b, and the later job kept off b."""
    from wire.messages import AdvanceReservation

    # ("late reservation": one that opens after the job's 100 s limit from its start on a,
    # NOW + 680, but within the 10 s allowed for a start: a review.)
    for closed_by in ("window", "reservation", "late reservation"):
        w = World()
        w.host("a")
        w.host("b")
        assert _running(w, "ra", 8, 700) == "a"  # a frees at about NOW + 650
        assert _running(w, "rb", 4, 800) == "b"  # b has 4 GPUs free now, all at about NOW + 750
        if closed_by == "window":
            _schedule(w, "a", NOW + 600, NOW + 5000)
        else:
            starts = NOW + 600 if closed_by == "reservation" else NOW + 680 + 105
            r = AdvanceReservation(name="launch", hosts=["a"], queues=["launch"], starts=starts, ends=NOW + 5000)
            w.state.apply_state_record(Record("advres.launch", next(w.rev), encode(r)))
        w.submit("keeper", gpus=8, at=NOW - 300, time_limit_s=100)  # fits nowhere now; waited 300 s
        w.submit("filler", gpus=4, at=NOW - 10)  # behind it, without a time limit
        plan = w.cycle()
        assert [(r.job_id, sorted(r.hosts)) for r in plan.reservations] == [("keeper", ["b"])], closed_by
        assert w.job("filler").state is JobState.QUEUED, closed_by
