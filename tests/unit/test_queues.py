"""Queue quotas, fair share and victim choice as pure code (server.scheduling.queues,
fairshare, preemption): the book's answers and figures, cohort borrowing and lending,
usage decay, the admission order, and Hypothesis properties (no queue ever takes more
than nominal + borrowing limit, a cohort never lends more than its pool, the order is
deterministic, victims never come from a queue at or below its nominal quota).
The planner-level tests are in test_queue_planner.py."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling import fairshare, preemption
from server.scheduling.queues import (
    COHORT_EXHAUSTED,
    OVER_QUOTA,
    QueueBook,
    effective_time_limit,
    gpu_amount,
    held_gpus,
    job_demand,
    job_gpus,
    job_usage,
    meters,
    mig_fraction,
    nominal,
)
from server.views.jobs import time_limit
from tests.factories import job, job_spec, task
from wire.messages import Attempt, AttemptState, JobState, Queue, QueueUsage, ResourceQuota

H100 = "gpu:H100"
A100 = "gpu:A100"


def queue(name: str, cohort: str | None = None, weight: float = 1.0, **quota: tuple[float, float | None, float | None]
          ) -> Queue:
    """A queue with quotas given as resource=(nominal, borrowing limit, lending limit);
    resource names use '_' for ':' ("gpu_H100")."""
    return Queue(name=name, cohort=cohort, weight=weight, quota={
        r.replace("gpu_", "gpu:"): ResourceQuota(nominal=n, borrowing_limit=b, lending_limit=lend)
        for r, (n, b, lend) in quota.items()})


def test_demand_counts_gangs_shares_and_mig() -> None:
    assert job_demand(job_spec(gpus=2, cpus=4, memory_mb=100, replicas=3), "H100") == {
        H100: 6.0, "cpu": 12.0, "memory_mb": 300.0}
    assert job_demand(job_spec(gpu_share=250), "A100")[A100] == 0.25
    assert job_demand(job_spec(mig_profile="3g.40gb"), "A100")[A100] == pytest.approx(3 / 7)
    assert "gpu:" not in " ".join(job_demand(job_spec(), None))
    assert mig_fraction("7g.80gb") == 1.0


@pytest.mark.parametrize(("profile", "model", "part"), [
    ("4g.24gb", "A30", 1.0), ("2g.12gb", "A30", 0.5), ("1g.6gb", "A30", 0.25), ("1g.6gb+me", "A30", 0.25),
    ("4g.24gb", None, 1.0), ("2g.12gb+me", "", 0.5),  # an A30's profiles, its model not known
    ("3g.40gb", "H100", 3 / 7), ("1g.18gb", "H200", 1 / 7), ("4g.20gb", "A100", 4 / 7), ("7g.180gb", "B200", 1.0),
    ("3g.40gb", None, 3 / 7), ("2g.48gb", "RTXPRO6000", 0.5), ("1g.24gb", "RTXPRO6000", 0.25),
    ("1g.24gb", "H100", 1 / 7)])
def test_a_mig_instance_is_the_part_of_its_gpus_compute_slices(profile: str, model: str | None,
                                                                 part: float) -> None:
    """Found by exploring: every MIG instance was counted in sevenths, an A30's (4 slices:
    1g.6gb, 2g.12gb, 4g.24gb) too: its whole-GPU instance was 4/7 of a GPU in the queue's
    quota and in the accounting. Its part is of its GPU model's slices; the quota that
    placement books (task_demand, by the model placed on), what a try holds (job_usage,
    held_gpus, by its attempt's model) and what the history records (gpu_amount, by the
    attempt's model) agree."""
    spec = job_spec(mig_profile=profile)
    assert mig_fraction(profile, model) == pytest.approx(part)
    assert job_demand(spec, model or "")[f"gpu:{model or ''}"] == pytest.approx(part)
    if model:
        assert job_gpus(spec.model_copy(update={"gpu_model": model})) == pytest.approx(part)  # as it names it
        j = job("m", spec=spec, state=JobState.RUNNING, attempts=[
            Attempt(id="m.1", number=1, host_id="a", state=AttemptState.RUNNING, gpu_model=model, mig=["MIG-x"])])
        booked = job_demand(spec, model)[f"gpu:{model}"]
        assert job_usage(j)[f"gpu:{model}"] == booked == held_gpus(j) == gpu_amount(spec, model)


def test_job_usage_counts_live_tasks_only() -> None:
    spec = job_spec(gpus=1, replicas=2)
    j = job("g", spec=spec, state=JobState.RUNNING, attempts=[
        Attempt(id="g.1.0", number=1, task=0, host_id="a", state=AttemptState.RUNNING, gpu_model="H100"),
        Attempt(id="g.1.1", number=1, task=1, host_id="b", state=AttemptState.SUCCEEDED, gpu_model="H100")])
    assert job_usage(j)[H100] == 1.0


def test_a_queue_without_cohort_stops_at_its_nominal_quota() -> None:
    book = QueueBook({"a": queue("a", gpu_H100=(8, None, None))}, {"a": {H100: 6}})
    assert book.admits("a", {H100: 2}) is None
    r = book.admits("a", {H100: 3})
    assert r is not None and r.reason == OVER_QUOTA and r.limit == 8
    assert r.detail() == "gpu:H100: 6 held + 3 wanted > 8, its nominal quota (no cohort)"
    # A GPU model it has no quota of is metered too (nominal 0); cpu is not metered.
    assert meters(book.queues["a"], A100) and not meters(book.queues["a"], "cpu")
    assert book.admits("a", {A100: 1}).reason == OVER_QUOTA
    assert book.admits("a", {"cpu": 10_000}) is None


def test_borrowing_within_a_cohort_up_to_the_limits() -> None:
    queues = {"a": queue("a", "c", gpu_H100=(8, 4, None)), "b": queue("b", "c", gpu_H100=(8, None, 2))}
    book = QueueBook(queues, {})
    # a may borrow at most 4, and b lends at most 2 of its 8.
    assert book.admits("a", {H100: 10}) is None
    refusal = book.admits("a", {H100: 11})
    assert refusal is not None and refusal.reason == OVER_QUOTA
    # Each refusal says which limit it met: here the pool (b lends 2 only) ...
    assert refusal.detail() == ("gpu:H100: 0 held + 11 wanted > 10, what it holds + what cohort c has unused "
                                "(0 + 10; its nominal quota 8)")
    # ... and past its borrowing limit, its own limit.
    hard = book.admits("a", {H100: 13})
    assert hard is not None and hard.hard
    assert hard.detail() == "gpu:H100: 0 held + 13 wanted > 12, its nominal quota 8 + borrowing limit 4"
    book.take("a", {H100: 10})
    assert book.borrowed("a") == {H100: 2}
    assert book.lent("b") == {H100: 2}
    # b is within its nominal: its own use never competes with its non-lent part ...
    assert book.admits("b", {H100: 6}) is None
    # ... but the 2 it lends are in use by a: reclaim is what takes them back.
    r = book.admits("b", {H100: 7})
    assert r is not None and r.reason == COHORT_EXHAUSTED and r.within_nominal
    # Its detail says the queue is within its quota and who holds the rest.
    assert r.limit == 6
    assert r.detail() == ("gpu:H100: 0 held + 7 wanted > 6, the part of its quota it does not lend + what cohort c "
                          "has unused (6 + 0); within its nominal quota 8, so queues that borrow hold the rest")
    book.take("b", {H100: 6})
    r = book.admits("b", {H100: 1})
    assert r is not None and r.limit == 6
    assert r.detail() == ("gpu:H100: 6 held + 1 wanted > 6, what it holds + what cohort c has unused (6 + 0); "
                          "within its nominal quota 8, so queues that borrow hold the rest")
    book.give("b", {H100: 6})
    book.give("a", {H100: 2})
    assert book.admits("b", {H100: 8}) is None


def test_what_lenders_are_shown_to_lend_adds_up_to_what_their_cohort_borrows() -> None:
    """Found by review: each lender assumed the others met the borrowers first, so with
    two lenders of 4 unused GPUs and a borrower of 6, each was shown lending 2 (4 in all)."""
    queues = {"a": queue("a", "c", gpu_H100=(4, None, None)), "b": queue("b", "c", gpu_H100=(4, None, None)),
              "z": queue("z", "c", gpu_H100=(0, None, None))}
    book = QueueBook(queues, {"z": {H100: 6.0}})
    assert book.borrowed("z") == {H100: 6.0}
    assert (book.lent("a"), book.lent("b"), book.lent("z")) == ({H100: 3.0}, {H100: 3.0}, {})
    book.take("a", {H100: 1.0})  # a uses 1 of its own: b, with more unused, lends more
    assert book.lent("a") == {H100: pytest.approx(6 * 3 / 7)} and book.lent("b") == {H100: pytest.approx(6 * 4 / 7)}


def test_a_pool_others_overdraw_does_not_refuse_the_part_of_a_quota_not_lent() -> None:
    """b's nominal quota lowered under what it holds: the pool (a's 2 lendable + b's 4) is
    overdrawn by b's 10. a, lending 2 of 12, may still take its other 10; what it would
    draw from the pool beyond them is refused."""
    queues = {"a": queue("a", "c", gpu_H100=(12, 4, 2)), "b": queue("b", "c", gpu_H100=(4, None, None))}
    book = QueueBook(queues, {"a": {H100: 6.0}, "b": {H100: 10.0}})
    assert book.admits("a", {H100: 4}) is None
    refusal = book.admits("a", {H100: 5})
    assert refusal is not None and refusal.reason == COHORT_EXHAUSTED and refusal.within_nominal


def test_default_queue_is_unmetered_and_always_exists() -> None:
    book = QueueBook({}, {"default": {H100: 100}})
    assert book.admits("default", {H100: 1000, "cpu": 1e6}) is None
    assert book.borrowed("default") == {H100: 100}
    assert book.over_nominal("default", [H100])
    assert book.admits("nope", {H100: 1}).reason == "queue does not exist"


def test_time_limits_default_and_maximum() -> None:
    q = Queue(name="q", default_time_limit_s=60, max_time_limit_s=600)
    assert effective_time_limit(job_spec(), q) == 60
    assert effective_time_limit(job_spec(time_limit_s=100), q) == 100
    assert effective_time_limit(job_spec(time_limit_s=1000), q) == 600
    assert effective_time_limit(job_spec(), Queue(name="r", max_time_limit_s=5)) == 5
    assert effective_time_limit(job_spec(), None) == 0
    # An admin removed it (UNLIMITED): neither the default nor the maximum comes back.
    assert effective_time_limit(job_spec(time_limit_s=0, time_limit_exempt=True), q) == 0
    # What the job page and `job show` say of it: the limit, and where it comes from.
    assert time_limit(job_spec(), q) == (60, "the queue's default")
    assert time_limit(job_spec(time_limit_s=100), q) == (100, "its own")
    assert time_limit(job_spec(time_limit_s=1000), q) == (600, "the queue's maximum")
    assert time_limit(job_spec(), Queue(name="r", max_time_limit_s=5)) == (5, "the queue's maximum")
    assert time_limit(job_spec(), None) == (0, "")
    # An ended job: the limit its last try ran under, not the queue's as it is now (found by
    # exploring: a maximum lowered since was shown beside "time limit of 30 s reached").
    from tests.factories import job as make_job
    from wire.messages import Attempt, AttemptState, JobState

    ended = make_job("t", spec=job_spec(time_limit_s=30), state=JobState.TIMEOUT, attempts=[
        Attempt(id="t.1", number=1, host_id="h", state=AttemptState.TIMEOUT, time_limit_s=30)])
    assert time_limit(ended.spec, Queue(name="m", max_time_limit_s=10), ended) == (30, "its last try's")
    assert time_limit(ended.spec, Queue(name="m", max_time_limit_s=60), ended) == (30, "its own")


# ---------------------------------------------------------------- properties of the book

quotas = st.builds(lambda n, b, lend: (n, b, lend), st.integers(0, 16), st.none() | st.integers(0, 8),
                   st.none() | st.integers(0, 16))


@st.composite
def books(draw: st.DrawFn) -> dict[str, Queue]:
    n = draw(st.integers(1, 5))
    out = {}
    for i in range(n):
        cohort = draw(st.sampled_from([None, "c1", "c2"]))
        kw = {"gpu_H100": draw(quotas)} if draw(st.booleans()) else {}
        if draw(st.booleans()):
            kw["gpu_A100"] = draw(quotas)
        out[f"q{i}"] = queue(f"q{i}", cohort, **kw)
    return out


@settings(max_examples=150, deadline=None)
@given(books(), st.lists(st.tuples(st.integers(0, 4), st.sampled_from([H100, A100]), st.integers(1, 6),
                                   st.booleans()), max_size=60))
def test_admitted_usage_never_passes_nominal_plus_borrowing_nor_the_pool(queues: dict[str, Queue], ops: list) -> None:
    book = QueueBook(queues, {})
    names = sorted(queues)
    held: list[tuple[str, dict[str, float]]] = []
    for qi, r, amount, release in ops:
        name = names[qi % len(names)]
        if release and held:
            q, d = held.pop(qi % len(held))
            book.give(q, d)
        elif book.admits(name, {r: amount}) is None:
            book.take(name, {r: amount})
            held.append((name, {r: amount}))
        # Invariants after every step.
        for qn, q in queues.items():
            for res in (H100, A100):
                if not meters(q, res):
                    continue
                used = book.used(qn, res)
                rq = q.quota.get(res)
                limit = nominal(q, res) if q.cohort is None else nominal(q, res) + (
                    math.inf if rq is None or rq.borrowing_limit is None else rq.borrowing_limit)
                assert used <= limit + 1e-6
        for (cohort, res), pool in book.pool.items():
            assert book.drawn[(cohort, res)] <= pool + 1e-6
    # The incremental figures equal a book built afresh from the same usage.
    again = QueueBook(queues, book.usage)
    for key, pool in again.pool.items():
        assert book.pool.get(key, pool) == pytest.approx(pool)
        assert book.drawn.get(key, again.drawn[key]) == pytest.approx(again.drawn[key])


# ---------------------------------------------------------------- fair share


def test_decay_halves_past_use_every_half_life_and_accumulates_use() -> None:
    rec = QueueUsage(name="a", at=0.0, half_life_s=100.0, usage={H100: 1000.0})
    later = fairshare.decay(rec, {}, 100.0, 100.0, "a")
    assert later.usage[H100] == pytest.approx(500.0)
    # Holding 2 GPUs for ever converges to 2 x h / ln 2 resource-seconds.
    steady = fairshare.decay(QueueUsage(name="a", at=0.0, half_life_s=100.0), {H100: 2.0}, 1e6, 100.0, "a")
    assert steady.usage[H100] == pytest.approx(2 * 100 / math.log(2))
    assert fairshare.past_allocation(steady, 1e6, 100.0)[H100] == pytest.approx(2.0)
    # Half-life 0: no memory.
    assert fairshare.decay(rec, {H100: 5.0}, 10.0, 0.0, "a").usage == {}


def test_shares_are_dominant_and_weighted() -> None:
    queues = {"a": queue("a", weight=2.0), "b": queue("b")}
    book = QueueBook(queues, {"a": {H100: 4, "cpu": 10}, "b": {"cpu": 50}})
    s = fairshare.Shares(book, {H100: 8, "cpu": 100})
    assert s.dominant("a") == pytest.approx(0.5) and s.share("a") == pytest.approx(0.25)
    assert s.share("b") == pytest.approx(0.5)
    assert s.entitled("a", ["a", "b"]) == pytest.approx(2 / 3)
    past = fairshare.Shares(book, {H100: 8, "cpu": 100}, past={"b": {H100: 8}})
    assert past.share("b") == pytest.approx(1.0)


def test_a_hosts_part_of_the_capacity_is_what_its_work_holds_and_what_could_be_placed_there() -> None:
    """fairshare.host_capacity: a host that takes work adds its healthy GPUs whole, a faulty
    GPU only while a task holds it; a host that takes none (cordoned, draining, short of
    disk, lost) adds only what its tasks hold, a share or MIG instance as its part."""
    from tests.factories import host_capacity

    cap = host_capacity("h", gpus=4, cpus=16.0, memory_mb=1000, unhealthy=[3], used_cpus=3.0, used_memory_mb=100)
    cap.used_gpus.update({0, 3})
    cap.share_used[1] = 250
    assert fairshare.host_capacity(cap) == ({H100: 4.0, "cpu": 16.0, "memory_mb": 1000.0},
                                            {H100: 1.75, "cpu": 13.0, "memory_mb": 900.0})
    for change in ({"cordoned": True}, {"schedulable": False}, {"pressure": True}):
        off = dataclasses.replace(cap, **change)
        assert fairshare.host_capacity(off) == ({H100: 2.25, "cpu": 3.0, "memory_mb": 100.0}, {})
    mig = dataclasses.replace(cap, cordoned=True, used_gpus=set(), share_used={}, mig_gpus=frozenset({2}),
                              mig={"m1": (2, "3g.40gb", 40_000), "m2": (2, "1g.10gb", 10_000)}, used_mig={"m1"},
                              used_cpus=0.0, used_memory_mb=0)
    assert fairshare.host_capacity(mig) == ({H100: pytest.approx(3 / 7)}, {})


def test_admission_order_interleaves_by_share() -> None:
    jobs = {q: [job(f"{q}{i}", spec=job_spec(queue=q)) for i in range(3)] for q in ("a", "b")}
    held = {"a": 0.0, "b": 0.5}
    out = []
    for j in fairshare.admission_order(jobs, lambda q: held[q]):
        out.append(j.id)
        held[j.spec.queue] += 0.2
    assert out == ["a0", "a1", "a2", "b0", "b1", "b2"] or out[:3] == ["a0", "a1", "a2"]
    assert out[0] == "a0" and "b0" in out[:4]


def test_admission_order_leaves_a_queue_when_told_its_rest_is_dealt_with() -> None:
    jobs = {q: [job(f"{q}{i}", spec=job_spec(queue=q)) for i in range(3)] for q in ("a", "b")}
    asked: list[tuple[str, int]] = []

    def rest(q: str, i: int) -> bool:
        asked.append((q, i))
        return q == "a" and i == 1  # a1 and a2 dealt with by the caller

    out = [j.id for j in fairshare.admission_order(jobs, lambda q: 0.0, rest)]
    assert out == ["a0", "b0", "b1", "b2"]
    assert ("a", 1) in asked and ("a", 2) not in asked


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(-2, 2), st.integers(0, 5)), max_size=30),
       st.dictionaries(st.sampled_from("abc"), st.floats(0, 2), min_size=3, max_size=3))
def test_admission_order_is_deterministic_and_keeps_each_queues_order(specs: list, base: dict) -> None:
    jobs = [job(f"j{i}{q}", spec=job_spec(queue="q" + q, priority=p), submitted_at=1000.0 + t)
            for i, (q, p, t) in enumerate(specs)]
    by_queue: dict[str, list] = {}
    for j in jobs:
        by_queue.setdefault(j.spec.queue, []).append(j)

    def run() -> list[str]:
        held = {"q" + k: v for k, v in base.items()}
        ordered = {q: fairshare.within_queue_order(js) for q, js in by_queue.items()}
        out = []
        for j in fairshare.admission_order(ordered, lambda q: held[q]):
            out.append(j.id)
            held[j.spec.queue] += 0.1
        return out

    first = run()
    assert first == run() and sorted(first) == sorted(j.id for j in jobs)
    for _q, js in by_queue.items():
        mine = [i for i in first if i in {j.id for j in js}]
        assert mine == [j.id for j in fairshare.within_queue_order(js)]


# ---------------------------------------------------------------- victims


def victim(job_id: str, q: str, *, priority: int = 0, started: float = 0.0, gpus: float = 1.0,
           host: str = "h1") -> preemption.Victim:
    return preemption.Victim(job_id, q, priority, started, started, {H100: gpus},
                             ((host, task(job_id, gpu_indices=[0])),))


def test_priority_preemption_takes_the_lowest_priority_then_the_youngest() -> None:
    book = QueueBook({"a": queue("a", gpu_H100=(2, None, None))}, {"a": {H100: 2}})
    req = preemption.Request("new", "a", 5, {H100: 1}, (preemption.PRIORITY,))
    cands = [victim("old", "a", priority=0, started=0), victim("young", "a", priority=0, started=900),
             victim("high", "a", priority=9, started=950)]
    got = preemption.choose(req, cands, book, None, 1000.0, lambda vs: True)
    assert got is not None and [v.job_id for v in got.victims] == ["young"]


def test_min_runtime_protects_young_jobs() -> None:
    q = queue("a", gpu_H100=(1, None, None)).model_copy(update={"min_runtime_s": 600})
    book = QueueBook({"a": q}, {"a": {H100: 1}})
    req = preemption.Request("new", "a", 5, {H100: 1}, (preemption.PRIORITY,))
    assert preemption.choose(req, [victim("v", "a", started=500)], book, None, 1000.0, lambda vs: True) is None
    assert preemption.choose(req, [victim("v", "a", started=300)], book, None, 1000.0, lambda vs: True)


def test_reclaim_takes_only_from_borrowers_and_no_more_than_needed() -> None:
    queues = {"a": queue("a", "c", gpu_H100=(4, None, None)), "b": queue("b", "c", gpu_H100=(4, None, None)),
              "x": queue("x", "other", gpu_H100=(8, None, None))}
    for q in queues.values():
        q.min_runtime_s = 0
    # b borrows 2 of a's 4; x is in another cohort.
    book = QueueBook(queues, {"a": {H100: 2}, "b": {H100: 6}, "x": {H100: 8}})
    req = preemption.Request("new", "a", 0, {H100: 2}, (preemption.RECLAIM,))
    assert book.admits("a", {H100: 2}).reason == COHORT_EXHAUSTED
    cands = [victim(f"b{i}", "b", started=float(i)) for i in range(6)] + [victim("x0", "x", started=99.0)]
    got = preemption.choose(req, cands, book, None, 100.0, lambda vs: True)
    assert got is not None and got.kind == preemption.RECLAIM
    assert sorted(v.job_id for v in got.victims) == ["b4", "b5"]  # the two youngest; never x


def test_reclaim_for_whole_hosts_looks_host_by_host_when_the_cheapest_victims_clear_none() -> None:
    """A gang of two 8-GPU tasks reclaims from 40 hosts full of a borrower's one-GPU jobs.
    The borrower holds 16 GPUs over its nominal quota, so reclaim may stop 16 of its jobs;
    the youngest, taken first, are spread over every host and clear none. Host by host,
    the two hosts whose jobs lose the least work are cleared, and nothing else."""
    queues = {"a": queue("a", "c", gpu_H100=(16, None, None)), "b": queue("b", "c", gpu_H100=(304, None, None))}
    for q in queues.values():
        q.min_runtime_s = 0
    book = QueueBook(queues, {"b": {H100: 320.0}})
    by_host: dict[str, list[preemption.Victim]] = {}
    for h in range(40):
        for g in range(8):
            # Host h's g-th job: on every host the first six are younger than any other.
            started = 1000.0 - (g * 40 + h) if g < 6 else 500.0 - h - g
            if h in (7, 23) and g >= 6:
                started += 200.0  # these two hosts' oldest jobs are the youngest of the oldest
            by_host.setdefault(f"h{h:02d}", []).append(victim(f"b{h}-{g}", "b", started=started, host=f"h{h:02d}"))
    candidates = [v for vs in by_host.values() for v in vs]

    def fits(chosen: list[preemption.Victim]) -> bool:  # two hosts cleared
        ids = {v.job_id for v in chosen}
        return sum(all(v.job_id in ids for v in vs) for vs in by_host.values()) >= 2

    class Hosts:
        def victims_on(self, host_id: str) -> list[preemption.Victim]:
            return by_host[host_id]

        def room(self, host_id: str, victims: Sequence[preemption.Victim]) -> bool:
            ids = {v.job_id for v in victims}
            return all(v.job_id in ids for v in by_host[host_id])

    req = preemption.Request("gang", "a", 0, {H100: 16}, (preemption.RECLAIM,))
    assert preemption.choose(req, candidates, book, None, 1000.0, fits) is None  # cheapest first only
    got = preemption.choose(req, candidates, book, None, 1000.0, fits, Hosts())
    assert got is not None and got.kind == preemption.RECLAIM
    assert sorted({h for v in got.victims for h, _t in v.tasks}) == ["h07", "h23"] and len(got.victims) == 16


@settings(max_examples=150, deadline=None)
@given(books(), st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(1, 4)), max_size=20),
       st.integers(0, 4), st.integers(1, 6), st.sampled_from(preemption.KINDS))
def test_reclaim_and_fair_share_never_take_a_queue_below_its_nominal(queues: dict[str, Queue], running: list,
                                                                     who: int, amount: int, kind: str) -> None:
    names = sorted(queues)
    for q in queues.values():
        q.min_runtime_s = 0
    book = QueueBook(queues, {})
    cands = []
    for i, (qi, prio, g) in enumerate(running):
        name = names[qi % len(names)]
        if book.admits(name, {H100: g}) is None:
            book.take(name, {H100: g})
            cands.append(victim(f"v{i}", name, priority=prio, started=float(i), gpus=g))
    me = names[who % len(names)]
    req = preemption.Request("new", me, 2, {H100: amount}, (kind,))
    shares = fairshare.Shares(book, {H100: 64})
    got = preemption.choose(req, cands, book, shares, 100.0, lambda vs: True)
    if got is None:
        return
    after = book.copy()
    for v in got.victims:
        if kind == preemption.PRIORITY:
            assert v.queue == me and v.priority < 2
        else:
            assert v.queue != me
            # The victim's queue was above its nominal before this victim was given back.
            assert after.over_nominal(v.queue, [H100])
        after.give(v.queue, v.usage)
    assert after.admits(me, {H100: amount}) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=2, max_size=6), st.integers(0, 6),
       st.integers(1, 4), st.randoms(use_true_random=False))
def test_victims_looked_for_host_by_host_keep_the_same_rules(hosts: list[tuple[int, bool]], nominal_b: int,
                                                             amount: int, rnd) -> None:  # type: ignore[no-untyped-def]
    """Hosts of `b`'s one-GPU jobs (some with one of `a`'s own), started in a random
    order, and a job of `a` that needs a whole host cleared: the youngest victims are
    spread, so the search often goes host by host. What it returns keeps the rules:
    victims only from `b` while it is above its nominal quota, the job admitted, a host
    cleared; and where some host can be cleared within `b`'s excess, one is found."""
    queues = {"a": queue("a", "c", gpu_H100=(64, None, None)), "b": queue("b", "c", gpu_H100=(nominal_b, None, None))}
    for q in queues.values():
        q.min_runtime_s = 0
    jobs = [(f"h{j}", "b") for j, (n, _own) in enumerate(hosts) for _ in range(n)]
    jobs += [(f"h{j}", "a") for j, (_n, own) in enumerate(hosts) if own]
    starts = list(range(len(jobs)))
    rnd.shuffle(starts)
    book = QueueBook(queues, {})
    by_host: dict[str, list[preemption.Victim]] = {}
    for i, ((host, name), started) in enumerate(zip(jobs, starts, strict=True)):
        book.take(name, {H100: 1.0})
        by_host.setdefault(host, []).append(victim(f"v{i}", name, started=float(started), host=host))

    def cleared(victims: Sequence[preemption.Victim], host: str) -> bool:
        ids = {v.job_id for v in victims}
        return all(v.job_id in ids for v in by_host[host])

    class Hosts:
        def victims_on(self, host_id: str) -> list[preemption.Victim]:
            return by_host[host_id]

        def room(self, host_id: str, victims: Sequence[preemption.Victim]) -> bool:
            return cleared(victims, host_id)

    req = preemption.Request("new", "a", 0, {H100: amount}, (preemption.RECLAIM,))
    got = preemption.choose(req, [v for vs in by_host.values() for v in vs], book, None, 100.0,
                            lambda vs: any(cleared(vs, h) for h in by_host), Hosts())
    excess = book.used("b", H100) - nominal_b
    clearable = any(all(v.queue == "b" for v in vs) and len(vs) <= excess for vs in by_host.values())
    assert (got is not None) == clearable
    if got is None:
        return
    assert any(cleared(got.victims, h) for h in by_host)
    after = book.copy()
    for v in got.victims:
        assert v.queue == "b" and after.over_nominal("b", [H100])
        after.give(v.queue, v.usage)
    assert after.admits("a", {H100: amount}) is None


def test_queue_watch_alerts_a_storm_once_and_a_starved_queue_once() -> None:
    from server.scheduling.queuewatch import QueueWatch

    w = QueueWatch(storm_count=5, storm_window_s=60, starved_after_s=100)
    assert w.preempted(0.0, 3, 3600.0) == []
    [storm] = w.preempted(10.0, 2, 5400.0)
    assert storm.kind == "preemption.storm" and storm.data["preempted"] == 5
    # What the window's stops cost, by the victims' cost: 1 + 1.5 GPU-hours.
    assert storm.data["gpu_hours_lost"] == 2.5 and "at least 2.50 GPU-hours of work lost" in storm.message
    assert w.preempted(20.0, 4) == []  # the same storm
    assert w.preempted(200.0, 0) == []  # quiet window: re-armed
    assert len(w.preempted(201.0, 5)) == 1
    pending, below = {"a": 3, "b": 1}, {"a"}
    assert w.queues(0.0, pending, set(), below, {}) == []
    assert w.queues(50.0, pending, set(), below, {}) == []
    [starved] = w.queues(100.0, pending, set(), below, {"a": (0.1, 0.5)})
    assert starved.kind == "queue.starved" and starved.data["queue"] == "a"
    assert w.queues(150.0, pending, set(), below, {}) == []  # once
    assert w.queues(160.0, pending, {"a"}, below, {}) == []  # a placement resets it
    assert w.queues(250.0, pending, set(), below, {}) == []
    assert len(w.queues(350.0, pending, set(), below, {})) == 1


def test_fairness_is_jains_index_of_what_the_waiting_queues_hold_over_their_weights() -> None:
    """fairshare.fairness: each waiting queue's dominant share now over its weight's part
    among the waiting queues, Jain's index of those; past use does not count."""
    from server.scheduling.fairshare import fairness, jain

    assert jain([1.0, 1.0, 1.0]) == 1.0 and jain([0.0, 3.0, 0.0]) == pytest.approx(1 / 3) and jain([]) == 1.0
    queues = {"a": queue("a", weight=1.0), "b": queue("b", weight=3.0), "c": queue("c")}
    capacity = {H100: 8.0, "cpu": 100.0}
    # Their weights' parts: a 2 of 8 GPUs, b 6.
    assert fairness(QueueBook(queues, {"a": {H100: 2}, "b": {H100: 6}}), capacity, ["a", "b"]) == pytest.approx(1.0)
    # a holds all, b nothing: towards 1/n.
    assert fairness(QueueBook(queues, {"a": {H100: 8}}), capacity, ["a", "b"]) == pytest.approx(0.5)
    # The dominant resource counts: b's CPUs (75 of 100) for its 3/4.
    assert fairness(QueueBook(queues, {"a": {H100: 2}, "b": {"cpu": 75}}), capacity, ["a", "b"]) == pytest.approx(1.0)
    # Fewer than two waiting: nothing to compare; a queue not waiting is not counted.
    assert fairness(QueueBook(queues, {"a": {H100: 8}}), capacity, ["a"]) == 1.0
    assert fairness(QueueBook(queues, {"a": {H100: 1}, "c": {H100: 7}}), capacity, ["a", "b"]) == pytest.approx(0.5)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=3, max_size=24), st.integers(1, 8), st.integers(0, 24),
       st.randoms(use_true_random=False))
def test_where_a_job_fits_spares_asking_again_and_changes_no_choice(placed: list[int], need: int, nominal_b: int,
                                                                    rnd) -> None:  # type: ignore[no-untyped-def]
    """A placement test that says where the job fits (a host, as cycle.victims' does for
    one task) lets the give-back skip asking it of victims with no task there: the victims
    chosen are those of a test that only says whether, for priority and reclaim alike,
    asked less often."""
    queues = {"a": queue("a", "c", gpu_H100=(64, None, None)), "b": queue("b", "c", gpu_H100=(nominal_b, None, None))}
    for q in queues.values():
        q.min_runtime_s = 0
    book = QueueBook(queues, {})
    by_host: dict[str, list[preemption.Victim]] = {}
    starts = list(range(len(placed)))
    rnd.shuffle(starts)
    for i, h in enumerate(placed):
        name = "a" if i % 5 == 0 else "b"
        book.take(name, {H100: 1.0})
        by_host.setdefault(f"h{h}", []).append(victim(f"v{i}", name, priority=i % 3, started=float(starts[i]),
                                                     host=f"h{h}"))
    free = {h: 8 - len(vs) for h, vs in by_host.items()}
    asked = {"where": 0, "whether": 0}

    def where(victims: list[preemption.Victim]) -> preemption.Fit:
        asked["where"] += 1
        for h in sorted(by_host):  # the first host with room, as a placer's complete search finds one
            if free[h] + sum(1 for v in victims for x, _t in v.tasks if x == h) >= need:
                return frozenset((h,))
        return False

    def whether(victims: list[preemption.Victim]) -> preemption.Fit:
        asked["whether"] += 1
        return bool(where(victims))

    for kinds in ((preemption.PRIORITY,), (preemption.RECLAIM,), (preemption.PRIORITY, preemption.RECLAIM)):
        req = preemption.Request("new", "a", 2, {H100: float(need)}, kinds)
        cands = [v for vs in by_host.values() for v in vs]
        with_where = preemption.choose(req, cands, book, None, 100.0, where)
        asked_where = asked["where"]
        asked["where"] = 0
        with_whether = preemption.choose(req, cands, book, None, 100.0, whether)
        assert (with_where is None) == (with_whether is None)
        if with_where is not None and with_whether is not None:
            assert with_where.kind == with_whether.kind
            assert [v.job_id for v in with_where.victims] == [v.job_id for v in with_whether.victims]
        assert asked_where <= asked["whether"]
        asked.update(where=0, whether=0)


def test_a_victim_off_the_host_the_job_fits_on_is_given_back_without_asking_the_placement() -> None:
    """The cheapest victims alternate between two full hosts; the job (2 GPUs) fits on h0
    once two of its jobs stop. The victim taken on h1 on the way is given back on the
    quota's word: the placement is not asked of it, and the victims are h0's two."""
    book = QueueBook({"a": queue("a", gpu_H100=(16, None, None))}, {"a": {H100: 16}})
    cands = [victim(f"{h}-{i}", "a", started=900.0 - 2 * i - (h == "h1"), host=h)
             for i in range(8) for h in ("h0", "h1")]
    asked: list[list[str]] = []

    def fits(victims: list[preemption.Victim]) -> preemption.Fit:
        asked.append([v.job_id for v in victims])
        for h in ("h0", "h1"):
            if sum(1 for v in victims for x, _t in v.tasks if x == h) >= 2:
                return frozenset((h,))
        return False

    req = preemption.Request("new", "a", 5, {H100: 2}, (preemption.PRIORITY,))
    got = preemption.choose(req, cands, book, None, 1000.0, fits)
    assert got is not None and [v.job_id for v in got.victims] == ["h0-0", "h0-1"]
    # Asked: two victims (no room), three (room on h0), and without h0-1 (no room); h1-0 is
    # given back unasked (the test that only says whether is asked of h0's two as well).
    assert asked == [["h0-0", "h1-0"], ["h0-0", "h1-0", "h0-1"], ["h0-0", "h1-0"]]
