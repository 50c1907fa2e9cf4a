"""Advance reservations (scheduling.advance, the planner's and why pending's use of it):
hosts set aside for some queues' jobs over a time window. Before it opens, other jobs take
the hosts only if their time limit ends them by its start; while it is open only its
queues' jobs are placed there, and other work still there at its start is stopped and
requeued, not counted; once it is over the hosts are every queue's again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling.advance import SetAside, active, admits, clash, may_run_before, on_host, over, whom
from server.scheduling.maintenance import START_ALLOWANCE_S
from server.scheduling.planner import QueuePolicy
from server.scheduling.queues import SET_ASIDE
from server.views.jobs import JobView
from tests.factories import job as make_job
from tests.factories import job_spec
from tests.unit.test_gangs import NOW, World
from wire.messages import AdvanceReservation, AttemptState, JobState, Queue, encode
from wire.records import Record

LAUNCH = AdvanceReservation(name="launch", hosts=["a"], queues=["launch"], starts=NOW + 600, ends=NOW + 4200)


def _reserve(w: World, r: AdvanceReservation) -> None:
    w.state.apply_state_record(Record(f"advres.{r.name}", next(w.rev), encode(r)))


def _world(*hosts: str) -> World:
    w = World()
    for h in hosts:
        w.host(h)
    w.state.apply_state_record(Record("queue.launch", next(w.rev), encode(Queue(name="launch"))))
    return w


def _submit(w: World, job_id: str, queue: str = "default", limit: float = 0.0, gpus: int = 1,
            at: float = NOW - 10, replicas: int = 1, user: str = "operator") -> None:
    job = make_job(job_id, spec=job_spec(job_id, command=["x"], gpus=gpus, cpus=1, memory_mb=1, queue=queue,
                                         time_limit_s=limit, replicas=replicas, user=user), submitted_at=at)
    w.state.apply_state_record(Record(f"job.{job_id}", next(w.rev), encode(job)))


def _host_of(w: World, job_id: str) -> str | None:
    job = w.job(job_id)
    return job.attempts[-1].host_id if job.attempts and job.state is not JobState.QUEUED else None


# ---------------------------------------------------------------- pure parts


def test_other_queues_may_start_before_it_opens_only_if_their_limit_ends_them_by_its_start() -> None:
    assert START_ALLOWANCE_S == 10  # the figures below allow it
    assert may_run_before(590, NOW, LAUNCH) and not may_run_before(591, NOW, LAUNCH)
    assert not may_run_before(0, NOW, LAUNCH)  # no limit: it could run into the window
    assert not may_run_before(1, NOW + 600, LAUNCH)  # open: nothing of theirs, however short
    assert not active(LAUNCH, NOW + 599) and active(LAUNCH, NOW + 600) and not active(LAUNCH, NOW + 4200)
    assert over(LAUNCH, NOW + 4200) and not over(LAUNCH, NOW + 4199)


def test_the_hosts_set_aside_by_queue_and_limit() -> None:
    rs = {"launch": LAUNCH, "demo": AdvanceReservation(name="demo", hosts=["b", "c"], queues=["demo", "launch"],
                                                       starts=NOW - 10, ends=NOW + 100)}
    kept = SetAside(rs, NOW)
    assert kept("default", "u", 0) == {"a", "b", "c"} and kept("default", "u", 590) == {"b", "c"}
    assert kept("launch", "u", 0) == frozenset()  # in both
    assert kept("demo", "u", 590) == frozenset() and kept("demo", "u", 591) == {"a"}
    assert kept("default", "u", 590) is kept("default", "u", 590)  # once per queue and limit
    assert kept("default", "u", 0) is kept("default", "u", 591)  # one set for all that keep to the same reservations
    assert [r.name for r in kept.keeping("b", "default", "u", 590)] == ["demo"]
    assert SetAside(rs, NOW + 5000)("default", "u", 0) == frozenset() and not SetAside(rs, NOW + 5000)
    assert [r.name for r in on_host(rs.values(), "a", NOW)] == ["launch"]
    assert on_host(rs.values(), "a", NOW + 4200) == []


def test_a_reservation_for_users_admits_their_jobs_of_any_queue() -> None:
    mine = LAUNCH.model_copy(update={"queues": [], "users": ["ann"], "starts": NOW - 1})
    assert admits(mine, "default", "ann") and not admits(mine, "default", "bo") and not admits(mine, "launch", "bo")
    both = LAUNCH.model_copy(update={"users": ["ann", "cy"]})
    assert whom(both) == "queue launch and users ann, cy" and whom(mine) == "user ann"
    kept = SetAside({"mine": mine}, NOW)
    assert kept("default", "ann", 0) == frozenset() and kept("default", "bo", 0) == {"a"}
    assert kept.own("default", "ann") == {"a"} and kept.own("default", "bo") == frozenset()
    # A user no reservation names is looked up with the others of its queue: one set.
    assert kept("default", "bo", 0) is kept("default", "dan", 0)


def test_a_host_is_set_aside_by_one_reservation_at_a_time() -> None:
    later = LAUNCH.model_copy(update={"name": "later", "starts": NOW + 4200, "ends": NOW + 5000})
    assert clash(later, [LAUNCH], NOW) is None  # back to back
    overlapping = later.model_copy(update={"starts": NOW + 4199})
    assert clash(overlapping, [LAUNCH], NOW) is LAUNCH
    assert clash(overlapping.model_copy(update={"hosts": ["b"]}), [LAUNCH], NOW) is None  # other hosts
    assert clash(overlapping, [LAUNCH], NOW + 4200) is None  # it is over
    assert clash(LAUNCH, [LAUNCH], NOW) is None  # its own name


def test_the_record_is_checked() -> None:
    assert AdvanceReservation(name="x", hosts=["a"], queues=["q", "p", "q"], starts=1, ends=2).queues == ["p", "q"]
    assert AdvanceReservation(name="x", hosts=["a"], users=["bo", "ann", "bo"], starts=1, ends=2).users == ["ann",
                                                                                                          "bo"]
    for bad in ({"hosts": []}, {"hosts": ["a", "a"]}, {"hosts": ["bad host"]}, {"queues": []}, {"ends": 1},
                {"queues": ["Q!"]}, {"queues": ["q"], "users": ["bad\nname"]}):
        try:
            AdvanceReservation.model_validate({"name": "x", "hosts": ["a"], "queues": ["q"], "starts": 1, "ends": 2,
                                               **bad})
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


# ---------------------------------------------------------------- the planner


def test_before_it_opens_the_hosts_take_only_other_jobs_that_end_by_its_start() -> None:
    w = _world("a")
    _reserve(w, LAUNCH)
    _submit(w, "open", at=NOW - 3)  # no limit
    _submit(w, "long", limit=591, at=NOW - 2)  # one second too long
    _submit(w, "short", limit=590, at=NOW - 1)
    _submit(w, "ours", queue="launch", at=NOW)
    w.cycle()
    assert _host_of(w, "short") == "a" and _host_of(w, "ours") == "a"
    assert w.job("open").state is JobState.QUEUED and w.job("long").state is JobState.QUEUED
    view = JobView(w.state, None, half_life_s=0)
    why = {r.reason: r.detail for r in view.queue_reasons(w.job("long"), NOW)}
    assert why[SET_ASIDE] == ("the hosts with room for it are set aside: advance reservation launch will set 1 "
                              "host(s) aside for queue launch in about 600 s, and its time limit of 591 s runs past "
                              "that (allowing 10 s to start)")
    assert "it has no time limit" in {r.reason: r.detail for r in view.queue_reasons(w.job("open"), NOW)}[SET_ASIDE]
    # A host not set aside takes them.
    w.host("b")
    w.cycle()
    assert _host_of(w, "open") == "b" and _host_of(w, "long") == "b"
    assert SET_ASIDE not in {r.reason for r in view.queue_reasons(w.job("open"), NOW)}


def test_while_open_only_its_queues_jobs_are_placed_and_other_work_there_is_stopped_uncounted() -> None:
    w = _world("a")
    _submit(w, "early", at=NOW - 100)  # placed before the reservation was made, no limit
    w.cycle(now=NOW - 50)
    w.cycle(reports=[w.report("early", 0, AttemptState.RUNNING, ts=NOW - 50)], now=NOW - 50)
    _reserve(w, LAUNCH)
    w.cycle(now=NOW + 599)
    assert not w.job("early").attempts[0].stop_kind  # not yet open
    _submit(w, "tiny", limit=1, at=NOW + 600)
    _submit(w, "ours", queue="launch", at=NOW + 600)
    w.cycle(now=NOW + 600)
    stopping = w.job("early").attempts[0]
    assert stopping.stop_kind == "drain" and "advance reservation launch" in stopping.reason
    assert [t.stop for t in w.state.allocs["a"].tasks if t.job_id == "early"] == [True]
    assert _host_of(w, "ours") == "a" and w.job("tiny").state is JobState.QUEUED
    w.cycle(reports=[w.report("early", 0, AttemptState.KILLED, ts=NOW + 601)], now=NOW + 601)
    early = w.job("early")
    assert early.state is JobState.QUEUED and early.tries == 1  # requeued; the try a drain's, not counted
    why = {r.reason: r.detail for r in JobView(w.state, None, half_life_s=0).queue_reasons(w.job("tiny"), NOW + 601)}
    assert why[SET_ASIDE].endswith("sets 1 host(s) aside for queue launch for about 3599 s more")
    # Once it is over the host is every queue's again.
    w.cycle(now=NOW + 4200)
    assert _host_of(w, "early") == "a" and _host_of(w, "tiny") == "a"


def test_a_gang_takes_no_host_set_aside_for_others_and_its_own_queues_gang_does() -> None:
    w = _world("a", "b", "c")
    w.policy = QueuePolicy(reserve_jobs=0)  # c is not held for the gang that waits
    _reserve(w, LAUNCH.model_copy(update={"hosts": ["a", "b"], "starts": NOW - 1}))
    _submit(w, "theirs", gpus=8, limit=60, replicas=2)  # a two-host gang: only c is not set aside
    w.cycle()
    assert w.job("theirs").state is JobState.QUEUED
    _submit(w, "ours", queue="launch", gpus=8, replicas=3, at=NOW)
    w.cycle()
    assert sorted(a.host_id for a in w.job("ours").attempts) == ["a", "b", "c"]


def test_a_reservation_for_a_waiting_job_is_never_made_on_hosts_set_aside_for_others() -> None:
    w = _world("a", "b")
    w.policy = QueuePolicy(reserve_after_s=0)
    _reserve(w, LAUNCH)
    _submit(w, "fill", gpus=8, limit=100, at=NOW - 300)
    w.cycle()
    assert _host_of(w, "fill") == "a"  # ends by the reservation's start
    _submit(w, "fill2", gpus=8, limit=5000, at=NOW - 290)
    w.cycle()
    assert _host_of(w, "fill2") == "b"
    _submit(w, "big", gpus=8, at=NOW - 200)  # no limit: a is kept from it, though it frees first
    plan = w.cycle()
    assert [(r.job_id, r.hosts) for r in plan.reservations] == [("big", {"b"})]
    # Also when its reservation is worked out again as a job of the reservation's queue,
    # which may use a, finds no room.
    _submit(w, "ours", queue="launch", gpus=8, limit=500, at=NOW - 150)
    plan = w.cycle()
    assert dict((r.job_id, r.hosts) for r in plan.reservations)["big"] == {"b"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-200, 800), st.integers(1, 600), st.sampled_from(["queue", "user", "both"])),
                min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(1, 8), st.sampled_from([0, 100, 300, 600, 1200]), st.booleans(),
                          st.sampled_from(["ann", "bo"])), min_size=1, max_size=12))
def test_nothing_of_others_is_placed_where_it_would_run_into_a_reservation(
        windows: list[tuple[int, int, str]], jobs: list[tuple[int, int, bool, str]]) -> None:
    """Whatever the reservations (some open, some over; for queue launch, user ann or
    both) and the jobs' queues, users, sizes and limits: every task a reservation does not
    admit placed on its host was placed before the window opened and ends by its start, or
    after it ended; a host not set aside takes what fits."""
    w = _world()
    w.policy = QueuePolicy(reserve_jobs=0)  # no reservations for waiting jobs: the open host's room is any job's
    hosts = [f"h{i}" for i in range(len(windows) + 1)]
    for h in hosts:
        w.host(h)
    for i, (h, (start, length, whose)) in enumerate(zip(hosts, windows, strict=False)):
        _reserve(w, AdvanceReservation(name=f"r{i}", hosts=[h], queues=["launch"] if whose != "user" else [],
                                       users=["ann"] if whose != "queue" else [], starts=NOW + start,
                                       ends=NOW + start + length))
    for i, (gpus, limit, ours, user) in enumerate(jobs):
        _submit(w, f"j{i}", queue="launch" if ours else "default", gpus=gpus, limit=float(limit), at=NOW - 100 + i,
                user=user)
    w.cycle()
    placed = 0
    by_host = {r.hosts[0]: r for r in w.state.advance.values()}
    for i, (_gpus, limit, ours, user) in enumerate(jobs):
        host = _host_of(w, f"j{i}")
        if host is None:
            continue
        placed += 1
        r = by_host.get(host)
        if r is not None and not admits(r, "launch" if ours else "default", user):
            assert over(r, NOW) or (NOW < r.starts and 0 < limit and NOW + START_ALLOWANCE_S + limit <= r.starts)
    assert placed == sum(1 for j in w.state.jobs.values() if j.state is JobState.PLACED)
    alloc = w.state.allocs.get(hosts[-1])
    free = 8 - sum(len(t.gpu_indices) for t in (alloc.tasks if alloc is not None else ()))
    assert all(w.job(f"j{i}").state is JobState.PLACED for i, (g, _, _, _) in enumerate(jobs) if g <= free)


def test_a_waiting_job_of_another_queue_still_gets_a_reservation_when_the_emptiest_hosts_are_set_aside() -> None:
    """The hosts with the most free room, which a reservation is looked for among, are
    those not held back from the job: an open reservation's empty hosts are not all it
    looks at (found when it was: 40 empty hosts set aside, the 16 most free all among
    them, and no reservation made)."""
    w = _world(*[f"s{i:02d}" for i in range(40)], "x", "y")
    w.policy = QueuePolicy(reserve_after_s=0)
    _reserve(w, AdvanceReservation(name="big", hosts=[f"s{i:02d}" for i in range(40)], queues=["launch"],
                                   starts=NOW - 500, ends=NOW + 86400))
    for h in ("x", "y"):
        _submit(w, f"run-{h}", gpus=8, at=NOW - 400)  # no time limit: x and y are full until they end
    w.cycle(now=NOW - 300)
    assert {_host_of(w, "run-x"), _host_of(w, "run-y")} == {"x", "y"}
    _submit(w, "waits", gpus=8, at=NOW - 200)
    plan = w.cycle()
    assert [(r.job_id, len(r.hosts)) for r in plan.reservations] == [("waits", 1)]
    assert plan.reservations[0].hosts <= {"x", "y"}


def test_its_queues_jobs_go_to_the_hosts_set_aside_first_then_anywhere() -> None:
    w = _world("a", "b", "z")
    _reserve(w, LAUNCH.model_copy(update={"hosts": ["z"], "starts": NOW - 1}))
    _submit(w, "x", gpus=6, limit=5000, at=NOW - 100)  # another queue's
    w.cycle()
    tight = _host_of(w, "x")
    assert tight in ("a", "b")
    # One GPU of launch: the reserved host first, though bin-packing's tighter host has room.
    _submit(w, "ours1", queue="launch", gpus=1, at=NOW - 90)
    w.cycle()
    assert _host_of(w, "ours1") == "z"
    # z full: launch's next jobs go anywhere, a gang too.
    _submit(w, "ours7", queue="launch", gpus=7, at=NOW - 80)
    _submit(w, "ours8", queue="launch", gpus=8, at=NOW - 70)
    _submit(w, "gang", queue="launch", gpus=1, replicas=2, at=NOW - 60)
    w.cycle()
    assert _host_of(w, "ours7") == "z" and _host_of(w, "ours8") not in ("z", tight)
    assert [a.host_id for a in w.job("gang").attempts] == [tight, tight]


def test_a_users_jobs_of_any_queue_use_the_hosts_set_aside_for_the_user_and_others_do_not() -> None:
    w = _world("a", "z")
    _reserve(w, AdvanceReservation(name="demo", hosts=["z"], users=["ann"], starts=NOW - 1, ends=NOW + 3600))
    _submit(w, "x", gpus=7, limit=5000, at=NOW - 100, user="bo")
    w.cycle()
    assert _host_of(w, "x") == "a"  # z is set aside for ann
    _submit(w, "ann1", gpus=1, at=NOW - 90, user="ann")
    _submit(w, "bo7", gpus=7, at=NOW - 80, user="bo")  # z's room only
    w.cycle()
    assert _host_of(w, "ann1") == "z"  # ann's, though a is tighter
    assert w.job("bo7").state is JobState.QUEUED
    why = {r.reason: r.detail for r in JobView(w.state, None, half_life_s=0).queue_reasons(w.job("bo7"), NOW)}
    assert "demo sets 1 host(s) aside for user ann for about" in why[SET_ASIDE]


def test_before_it_opens_its_queues_jobs_are_placed_as_any_other() -> None:
    w = _world("a", "z")
    _reserve(w, LAUNCH.model_copy(update={"hosts": ["z"]}))  # opens in 600 s
    _submit(w, "x", gpus=7, limit=60, at=NOW - 100)
    w.cycle()
    tight = _host_of(w, "x")
    _submit(w, "ours1", queue="launch", gpus=1, at=NOW - 90)
    w.cycle()
    assert _host_of(w, "ours1") == tight  # bin-packing's tighter host, not z


def test_why_pending_names_only_the_reservations_of_hosts_the_job_could_take() -> None:
    """Found by exploring: a job excluding host a was told a's reservation kept it waiting."""
    w = _world("a", "b")
    _reserve(w, LAUNCH)  # a
    _reserve(w, AdvanceReservation(name="later", hosts=["b"], queues=["launch"], starts=NOW + 900, ends=NOW + 5000))
    spec = job_spec("open", command=["x"], gpus=1, cpus=1, memory_mb=1, exclude_hosts=["a"])
    w.state.apply_state_record(Record("job.open", next(w.rev), encode(make_job("open", spec=spec,
                                                                              submitted_at=NOW - 10))))
    w.cycle()
    assert w.job("open").state is JobState.QUEUED
    why = {r.reason: r.detail for r in JobView(w.state, None, half_life_s=0).queue_reasons(w.job("open"), NOW)}
    assert "advance reservation later " in why[SET_ASIDE] and "reservation launch" not in why[SET_ASIDE], why
