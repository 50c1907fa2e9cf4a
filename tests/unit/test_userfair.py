"""Fair share between the users of one queue (scheduling.userfair, the planner's and the
queue position's use of it): at equal priority the user whose jobs of the queue hold least
goes next; priority still first; each user's jobs in submission order; off by default."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling.fairshare import within_queue_order
from server.scheduling.planner import QueuePolicy
from server.scheduling.queues import job_gpus
from server.scheduling.userfair import Interleaved, interleaved
from server.views.jobs import JobView
from server.views.queues import queue_users
from tests.factories import job as make_job
from tests.factories import job_spec
from tests.unit.test_gangs import NOW, World
from wire.messages import AttemptState, Job, JobState, Queue, encode
from wire.records import Record
from wire.validation import validate_queue

USERS = ["ann", "bo", "cy"]


def _job(job_id: str, user: str, at: float, gpus: int = 1, priority: int = 0, queue: str = "team") -> Job:
    return make_job(job_id, spec=job_spec(job_id, command=["x"], gpus=gpus, cpus=1, memory_mb=1, user=user,
                                          priority=priority, queue=queue), submitted_at=at)


# ---------------------------------------------------------------- the order alone


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(USERS), st.integers(0, 1), st.integers(0, 2)), min_size=1, max_size=30),
       st.dictionaries(st.sampled_from(USERS), st.tuples(st.integers(0, 6), st.integers(0, 3))),
       st.lists(st.integers(0, 40), max_size=8))
def test_the_order_is_priority_first_then_the_user_holding_least_each_users_jobs_in_order(
        specs: list[tuple[str, int, int]], held: dict[str, tuple[int, int]], reads: list[int]) -> None:
    jobs = within_queue_order([_job(f"j{i}", u, NOW + i, gpus=g, priority=p) for i, (u, p, g) in enumerate(specs)])
    order = Interleaved(jobs, lambda u: (float(held.get(u, (0, 0))[0]), held.get(u, (0, 0))[1]))
    # Read in any order first (the planner reads it as far as it goes, and slices the rest):
    # the same sequence.
    for i in reads:
        if i < len(jobs):
            assert order[i] is order[-len(jobs) + i]
    got = list(order)
    assert len(order) == len(jobs) and sorted(j.id for j in got) == sorted(j.id for j in jobs)
    assert got[2:] == order[2:]
    # Priority first.
    assert [j.spec.priority for j in got] == sorted((j.spec.priority for j in got), reverse=True)
    # Each user's jobs in the queue's own order.
    for u in USERS:
        assert [j for j in got if j.spec.user == u] == [j for j in jobs if j.spec.user == u]
    # Each job handed out is of a user who, counting the jobs handed out before it as
    # placed, held no more than any other user with a job of that priority left.
    load = {u: (float(held.get(u, (0, 0))[0]), held.get(u, (0, 0))[1]) for u in USERS}
    for k, job in enumerate(got):
        rivals = {j.spec.user for j in got[k:] if j.spec.priority == job.spec.priority}
        assert all(load[job.spec.user] <= load[u] for u in rivals), (k, job.id, load)
        g, n = load[job.spec.user]
        load[job.spec.user] = (g + job_gpus(job.spec), n + 1)


def test_equal_users_alternate_and_a_user_holding_more_waits_for_the_others_to_catch_up() -> None:
    jobs = [_job(f"a{i}", "ann", NOW + i) for i in range(6)] + [_job(f"b{i}", "bo", NOW + 10 + i) for i in range(3)]
    assert [j.id for j in interleaved(jobs, lambda u: (0.0, 0))] == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "a4",
                                                                     "a5"]
    # ann holds 2 GPUs already: bo's jobs go until bo holds as much.
    held = {"ann": (2.0, 2)}
    assert [j.id for j in interleaved(jobs, lambda u: held.get(u, (0.0, 0)))][:5] == ["b0", "b1", "a0", "b2", "a1"]
    # CPU-only work: ranked by jobs running.
    cpu = [_job(f"a{i}", "ann", NOW + i, gpus=0) for i in range(3)] + [_job("b0", "bo", NOW + 9, gpus=0)]
    assert [j.id for j in interleaved(cpu, lambda u: (0.0, 5) if u == "ann" else (0.0, 0))][0] == "b0"
    # One user's jobs alone: the list itself, nothing worked out.
    only = jobs[:6]
    assert interleaved(only, lambda u: (0.0, 0)) is only


def test_the_setting_is_validated_and_off_by_default() -> None:
    assert not Queue(name="q").fair_share_users
    assert validate_queue({"name": "q", "fair_share_users": True}).fair_share_users


# ---------------------------------------------------------------- the planner


def _world(fair: bool) -> World:
    w = World()
    w.host("a", gpus=8)
    w.state.apply_state_record(Record("queue.team", next(w.rev), encode(Queue(name="team", fair_share_users=fair))))
    return w


def _add(w: World, job: Job) -> None:
    w.state.apply_state_record(Record(f"job.{job.id}", next(w.rev), encode(job)))


def _add_jobs(w: World, user: str, n: int, at: float, first: int = 0, **fields: int) -> None:
    """`n` one-GPU jobs of `user` (ids its initial and a number from `first`), submitted a
    second apart from `at`."""
    for i in range(n):
        _add(w, _job(f"{user[0]}{first + i}", user, at + i, **fields))


def _placed(w: World, user: str) -> int:
    return sum(1 for j in w.state.jobs.values() if j.spec.user == user and j.state is JobState.PLACED)


def test_a_teammate_is_not_kept_behind_one_users_long_backlog() -> None:
    for fair, expected in ((False, (8, 0)), (True, (4, 4))):
        w = _world(fair)
        _add_jobs(w, "ann", 12, NOW - 100)
        _add_jobs(w, "bo", 4, NOW - 10)
        # The queue positions the API shows follow the planner's order.
        view = JobView(w.state, None, half_life_s=0)
        positions = {j.id: view.queue_position(j, 0.0) for j in w.state.jobs.values()}
        assert sorted(positions.values()) == list(range(1, 17))
        assert (positions["b0"], positions["a1"], positions["b1"]) == ((2, 3, 4) if fair else (13, 2, 14))
        w.cycle()
        assert (_placed(w, "ann"), _placed(w, "bo")) == expected, fair


def test_what_a_user_holds_already_counts_and_priority_comes_first() -> None:
    w = _world(True)
    _add_jobs(w, "ann", 4, NOW - 100, gpus=2)
    w.cycle()  # ann holds all 8 GPUs
    w.cycle(reports=[w.report(f"a{i}", 0, AttemptState.RUNNING) for i in range(4)])
    w.host("b", gpus=8)
    _add_jobs(w, "ann", 6, NOW - 50, first=4)
    _add_jobs(w, "bo", 6, NOW - 10)
    w.cycle()
    # bo holds nothing: bo's six go first, then ann's until the host is full.
    assert (_placed(w, "ann"), _placed(w, "bo")) == (2, 6)
    # A higher priority goes first whoever holds more.
    w = _world(True)
    _add_jobs(w, "ann", 4, NOW - 100, priority=5)
    _add_jobs(w, "bo", 8, NOW - 200)
    w.cycle()
    assert (_placed(w, "ann"), _placed(w, "bo")) == (4, 4)


# ---------------------------------------------------------------- past use


def test_each_users_use_decays_as_a_queues_does_and_the_most_used_are_kept() -> None:
    from server.scheduling.fairshare import LN2, decay, past_users
    from wire.messages import MAX_USAGE_USERS, QueueUsage

    h = 3600.0
    start = QueueUsage(name="team", at=NOW, half_life_s=h)
    # ann holds 2 GPUs and 3 jobs for one half-life: half of the steady state's use.
    rec = decay(start, {"gpu:H100": 2.0}, NOW + h, h, "team", ({"ann": 2.0}, {"ann": 3.0}))
    assert abs(rec.user_gpus["ann"] - 2.0 * h / LN2 * 0.5) < 1e-6
    assert abs(rec.user_jobs["ann"] - 3.0 * h / LN2 * 0.5) < 1e-6
    gpus, jobs = past_users(rec, NOW + h, h)
    assert abs(gpus["ann"] - 1.0) < 1e-9 and abs(jobs["ann"] - 1.5) < 1e-9  # as an allocation held for ever
    # In two steps as in one; then, holding nothing, it halves every half-life.
    two = decay(decay(start, {}, NOW + h / 2, h, "team", ({"ann": 2.0}, {})), {}, NOW + h, h, "team",
                ({"ann": 2.0}, {}))
    assert abs(two.user_gpus["ann"] - rec.user_gpus["ann"]) < 1e-6
    later = decay(rec, {}, NOW + 2 * h, h, "team", ({}, {}))
    assert abs(later.user_gpus["ann"] - rec.user_gpus["ann"] / 2) < 1e-6
    assert past_users(later, NOW + 3 * h, h)[0]["ann"] == past_users(later, NOW + 2 * h, h)[0]["ann"] / 2
    # A queue without fair share between its users keeps no user's use; too many users:
    # those with most kept.
    assert decay(rec, {}, NOW + 2 * h, h, "team").user_gpus == {}
    many = {f"u{i}": float(i + 1) for i in range(MAX_USAGE_USERS + 5)}
    kept = decay(start, {}, NOW + h, h, "team", (many, {})).user_gpus
    assert len(kept) == MAX_USAGE_USERS and "u0" not in kept and f"u{MAX_USAGE_USERS + 4}" in kept


def test_a_user_who_ran_the_queue_lately_goes_after_one_who_did_not() -> None:
    from wire.messages import QueueUsage

    w = _world(True)
    # ann held 8 GPUs of the queue over the last half-life; she holds nothing now.
    past = QueueUsage(name="team", at=NOW, half_life_s=3600.0, user_gpus={"ann": 8 * 3600 / 0.6931471805599453 / 2})
    w.state.apply_state_record(Record("qusage.team", next(w.rev), encode(past)))
    _add_jobs(w, "ann", 8, NOW - 100)
    _add_jobs(w, "bo", 8, NOW - 10)
    view = JobView(w.state, None, half_life_s=3600.0)
    assert view.queue_position(w.job("b3"), 0.0, NOW) == 4 and view.queue_position(w.job("a0"), 0.0, NOW) == 5
    # The queue's users as its page shows them: next first, ann's past use as 4 GPUs.
    users = queue_users(w.state, "team", NOW, 3600.0)
    assert [(u.user, u.gpus, u.jobs, round(u.past_gpus, 6), u.open_jobs) for u in users] == [
        ("bo", 0.0, 0, 0.0, 8), ("ann", 0.0, 0, 4.0, 8)]
    w.cycle()
    # Her past use counts as 4 GPUs held: bo's first four go before her first, then they alternate.
    assert (_placed(w, "ann"), _placed(w, "bo")) == (2, 6)
    # Each at 6 GPUs with past use: ann, with 2 jobs running to bo's 6, goes next.
    assert [(u.user, u.gpus, u.jobs) for u in queue_users(w.state, "team", NOW, 3600.0)] == [("ann", 2.0, 2),
                                                                                            ("bo", 6.0, 6)]
    # Without a half-life only what users hold now counts.
    w = _world(True)
    w.policy = QueuePolicy(half_life_s=0.0)
    w.state.apply_state_record(Record("qusage.team", next(w.rev), encode(past)))
    _add_jobs(w, "ann", 8, NOW - 100)
    _add_jobs(w, "bo", 8, NOW - 10)
    w.cycle()
    assert (_placed(w, "ann"), _placed(w, "bo")) == (4, 4)


def test_the_leader_keeps_each_users_use_only_in_queues_with_fair_share_between_users() -> None:
    for fair in (True, False):
        w = _world(fair)
        for i in range(3):
            _add(w, _job(f"a{i}", "ann", NOW - 100 + i, gpus=2))
        w.cycle()
        w.cycle(reports=[w.report(f"a{i}", 0, AttemptState.RUNNING) for i in range(3)])
        for at in (NOW + 20, NOW + 40):  # the first record starts the count, the next has use in it
            plan = w.cycle(now=at)
            rec = plan.usage["team"]
            w.state.apply_state_record(Record("qusage.team", next(w.rev), encode(rec)))
        assert rec.usage.get("gpu:H100", 0) > 0
        if fair:
            assert set(rec.user_gpus) == set(rec.user_jobs) == {"ann"}
            assert rec.user_gpus["ann"] > 0 and rec.user_jobs["ann"] > 0
        else:
            assert rec.user_gpus == {} and rec.user_jobs == {}


def test_a_queues_usage_record_with_the_most_users_and_the_longest_names_is_read_back() -> None:
    from wire.messages import MAX_MESSAGE_BYTES, MAX_USAGE_USERS, QueueUsage, decode

    users = {"u" * 60 + f"{i:04d}": 1.2345678901234e12 for i in range(MAX_USAGE_USERS)}
    rec = QueueUsage(name="q" * 63, usage={"gpu:" + "m" * 60 + f"{i:03d}": 1.2345678901234e12 for i in range(256)},
                     user_gpus=users, user_jobs=users)
    assert len(encode(rec)) <= MAX_MESSAGE_BYTES and decode(QueueUsage, encode(rec)) == rec
