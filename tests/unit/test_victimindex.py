"""scheduling.victimindex: a queue's stoppable jobs read cheapest first, at any clock,
minimum runtime and grace (the cap of what a job that checkpoints loses), always the order
of preemption.Victim.cost over the records afresh."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling.preemption import Victim, checkpoint_cap, stoppable
from server.state.cluster import ClusterState
from tests.factories import job, job_spec, set_or_drop
from wire.messages import Attempt, AttemptState, Job, JobState


def afresh(jobs: dict[str, Job], queue: str, now: float, min_runtime_s: float,
           grace_s: float = math.inf, ends: dict[str, float] | None = None) -> list[tuple[tuple, str]]:
    """Every stoppable job of `queue` past the minimum runtime, sorted by its cost now
    (Victim.cost, its size as the index has it; `ends`: when jobs end by themselves)."""
    out = []
    for j in jobs.values():
        facts = stoppable(j)
        if j.spec.queue != queue or facts is None or now - facts[0] < min_runtime_s:
            continue
        v = Victim(j.id, queue, j.spec.priority, facts[0], j.submitted_at, {"gpu:x": facts[1]}, (),
                   checkpoint_cap(j.spec.checkpoints, grace_s), (ends or {}).get(j.id, math.inf), math.inf,
                   grace_s)
        out.append((v.cost(now), j.id))
    return sorted(out)


def running(i: int, queue: str, prio: int, gpus: int, cpus: float, started: float, submitted: float,
            state: JobState, stopping: bool, checkpoints: bool = False) -> Job:
    att = Attempt(id=f"j{i}.1", number=1, host_id="h1", state=AttemptState.RUNNING, started_at=started,
                  stop_kind="preempt" if stopping else "")
    return job(f"j{i}", state=state, submitted_at=submitted, attempts=[att],
               spec=job_spec(f"j{i}", queue=queue, priority=prio, gpus=gpus, cpus=cpus, checkpoints=checkpoints))


# Few distinct values, so that costs tie (equal runtimes x sizes, equal submissions) often;
# 0.1-step starts and 3-GPU jobs make products that round.
record = st.builds(
    running, st.integers(0, 9), st.sampled_from(["a", "b"]), st.integers(0, 1), st.sampled_from([0, 1, 3]),
    st.sampled_from([1.0, 3.0]), st.sampled_from([0.1, 0.2, 0.30000000000000004, 0.3, 1.7, 5.0, 5.0, 9.9]),
    st.sampled_from([1.0, 2.0, 2.0]),
    st.sampled_from([JobState.RUNNING, JobState.RUNNING, JobState.RUNNING, JobState.QUEUED, JobState.SUCCEEDED]),
    st.booleans(), st.booleans())


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(record, st.integers(0, 9)), max_size=40),
       st.sampled_from([10.0, 10.3, 12.0, 1e9]), st.sampled_from([0.0, 0.0, 2.0, 5.0, 8.3, 9.8]),
       st.sampled_from([None, 1]), st.sampled_from([math.inf, 0.0, 2.0, 4.9, 8.3]),
       st.dictionaries(st.sampled_from([f"j{i}" for i in range(12)]),
                       st.sampled_from([9.0, 10.0, 12.0, 14.9, 18.3, 40.0, 1e9 + 2.0]), max_size=6))
def test_the_cheapest_first_equals_sorting_by_cost_afresh(steps: list, now: float, min_runtime_s: float,
                                                          below: int | None, grace_s: float,
                                                          ends: dict[str, float]) -> None:
    """Records set (a job) and dropped (an index) in any order, a job's queue, priority,
    size, start, state and checkpointing changing between its records; jobs that
    checkpoint cost at most the grace of work (many of them exactly that: ties); jobs that
    end by themselves within the grace (`ends`, some of them of no queue read, not
    stoppable or not known) cost nothing. The jobs still too young to be stopped (`young`)
    are exactly the others: a job that has run the minimum runtime exactly (a start of 5.0
    at 10.0 with 5.0) may be stopped, and is not young."""
    state = ClusterState()
    for step in steps:
        set_or_drop(state, step)
    for q in ("a", "b"):
        assert list(state.victims.cheapest(q, now, min_runtime_s, grace_s, ends)) == afresh(
            state.jobs, q, now, min_runtime_s, grace_s, ends)
        assert list(state.victims.cheapest(q, now, min_runtime_s, grace_s)) == afresh(state.jobs, q, now,
                                                                                      min_runtime_s, grace_s)
        starts = [f[0] for j in state.jobs.values() if j.spec.queue == q and (f := stoppable(j)) is not None
                  and (below is None or j.spec.priority < below) and now - f[0] < min_runtime_s]
        count, first = state.victims.young(q, now, min_runtime_s, below)
        assert count == len(starts)
        assert first == (min(starts) + min_runtime_s - now if starts else None)
    assert set(state.victims.facts) == {j.id for j in state.jobs.values() if stoppable(j) is not None}


def test_a_job_that_checkpoints_costs_at_most_its_grace() -> None:
    """A job that checkpoints loses at most its queue's grace of work: after 100 s it is
    cheaper to stop than one that does not and has run 20 s; those that have run past
    the grace all cost the grace, the latest started first; the grace is the queue's,
    read when the index is (none given: they cost what they ran, as any other)."""
    state = ClusterState()
    for i, started, submitted, ckpt in ((1, 0.0, 3.0, True), (2, 80.0, 0.0, False), (3, 50.0, 1.0, True),
                                        (4, 97.0, 2.0, True)):
        state._set_job(running(i, "a", 0, 1, 1.0, started, submitted, JobState.RUNNING, False, ckpt))
    got = list(state.victims.cheapest("a", 100.0, 0.0, 10.0))
    assert [job_id for _, job_id in got] == ["j4", "j3", "j1", "j2"]
    assert [cost[1] for cost, _ in got] == [3.0, 10.0, 10.0, 20.0]
    assert got == afresh(state.jobs, "a", 100.0, 0.0, 10.0)
    assert [job_id for _, job_id in state.victims.cheapest("a", 100.0)] == ["j4", "j2", "j3", "j1"]


def test_ties_in_runtime_times_size_go_in_the_cost_order() -> None:
    """Equal starts and submissions: the job id decides, lowest first, also in the middle
    of a group (the start order alone would put the highest id first)."""
    state = ClusterState()
    for i, started in ((1, 5.0), (2, 5.0), (3, 1.0), (4, 5.0)):
        state._set_job(running(i, "a", 0, 1, 1.0, started, 2.0, JobState.RUNNING, False))
    assert [job_id for _, job_id in state.victims.cheapest("a", 10.0)] == ["j1", "j2", "j4", "j3"]


def test_reading_stops_where_the_reader_stops() -> None:
    """The first victims are read without ranking the rest: a queue of 10,000 running jobs
    of one size is read one job at a time, youngest first."""
    state = ClusterState()
    for i in range(10_000):
        state._set_job(running(i, "a", 0, 1, 1.0, float(i), 1.0, JobState.RUNNING, False))
    ranked = state.victims.cheapest("a", 20_000.0)
    assert [job_id for _, job_id in (next(ranked), next(ranked))] == ["j9999", "j9998"]
    # Past the minimum runtime only: jobs started after 20,000 - 15,000 are left out.
    assert next(state.victims.cheapest("a", 20_000.0, 15_000.0))[1] == "j5000"
    assert list(state.victims.cheapest("nope", 20_000.0)) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3), max_size=4), min_size=1, max_size=5), st.integers(1, 8),
       st.integers(1, 3), st.lists(st.integers(0, 40), min_size=1, max_size=12))
def test_a_search_asks_where_a_job_fits_as_a_fresh_copy_would_answer(hosts: list[list[int]], gpus: int,
                                                                     replicas: int, asks: list[int]) -> None:
    """cycle.victims' placement test keeps its what-if copy while the victims asked of grow
    one by one: every answer, through growing, shrinking and unrelated lists, is what a
    fresh copy with those victims' tasks released says (the job fits, on the host named)."""
    from server.scheduling.capacity import CapacityIndex, Placer
    from server.scheduling.cycle.victims import _Fits
    from tests.factories import host_capacity, task

    index = CapacityIndex()
    victims: list[Victim] = []
    for h, sizes in enumerate(hosts):
        first = 0
        placed: list[tuple[str, object]] = []
        for k, n in enumerate(sizes):
            if first + n > 8:
                break
            t = task(f"v{h}-{k}", gpu_indices=list(range(first, first + n)), cpus=1.0)
            placed.append((f"h{h}", t))
            first += n
        index.put(host_capacity(f"h{h}", used_gpus=range(first), used_cpus=float(len(placed))))
        victims += [Victim(t.job_id, "b", 0, 0.0, 0.0, {"gpu:H100": 1.0}, ((where, t),))  # type: ignore[arg-type]
                    for where, t in placed]
    placer = Placer(index, healthy=lambda host_id: True)
    spec = job_spec("w", gpus=gpus, replicas=replicas)
    fits = _Fits(placer, spec)
    for n in asks:
        chosen = victims[: n % (len(victims) + 1)] if n < 30 else victims[n % (len(victims) + 1):]
        trial = placer.fork()
        for v in chosen:
            for host_id, t in v.tasks:
                cap = trial.cap(host_id)
                assert cap is not None
                cap.let_go(t)
        if replicas > 1:
            assert fits(chosen) is (trial.place_gang(spec) is not None)
            continue
        fresh = trial.place(spec)
        got = fits(chosen)
        assert got == (frozenset((fresh.host_id,)) if fresh is not None else False)
