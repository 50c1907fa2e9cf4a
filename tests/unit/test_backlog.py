"""scheduling.backlog: each queue's queued jobs in order, their ids and counts, and its
smallest job, kept as job records arrive, always equal to working them out from the
records afresh."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fairness import Simulation, build_parser, simulate
from server.scheduling.backlog import Backlog
from server.scheduling.fairshare import order_key
from server.scheduling.queues import job_size
from server.state.cluster import ClusterState
from tests.factories import job, job_spec, set_or_drop
from wire.messages import Job, JobState


def afresh(jobs: dict[str, Job]) -> tuple[dict, set[str], dict]:
    """What a Backlog should hold for these records: per queue the ordered keys, the
    preempting queued jobs, and per queue the smallest size (None if one names models)."""
    order: dict[str, list] = {}
    least: dict[str, tuple | None] = {}
    preempting: set[str] = set()
    for j in jobs.values():
        if j.state is not JobState.QUEUED or j.hold:
            continue
        if j.preempting:
            preempting.add(j.id)
            continue
        order.setdefault(j.spec.queue, []).append(order_key(j))
    for q in order:
        order[q].sort()
        queued = [j for j in jobs.values()
                  if j.state is JobState.QUEUED and not j.hold and not j.preempting and j.spec.queue == q]
        least[q] = None if any(j.spec.models() is not None for j in queued) else \
            tuple(min(col) for col in zip(*(job_size(j.spec) for j in queued), strict=True))
    return order, preempting, least


def kept(b: Backlog) -> tuple[dict, set[str], dict]:
    return ({q: list(keys) for q, keys in b.order.items()}, set(b.preempting), {q: b.least(q) for q in b.order})


record = st.builds(
    lambda i, state, queue, prio, at, gpus, cpus, model, preempting, hold, not_before: job(
        f"j{i}", state=state, submitted_at=at, preempting=["v"] if preempting else [], hold="held" if hold else "",
        not_before=not_before,
        spec=job_spec(f"j{i}", queue=queue, priority=prio, gpus=gpus, cpus=cpus, gpu_model=model)),
    st.integers(0, 7), st.sampled_from([JobState.QUEUED, JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED]),
    st.sampled_from(["a", "b"]), st.integers(0, 2), st.sampled_from([1.0, 2.0, 3.0]), st.integers(0, 4),
    st.sampled_from([1.0, 2.0]), st.sampled_from([None, None, "H100"]), st.booleans(),
    st.sampled_from([False, False, True]), st.sampled_from([0.0, 0.0, 1.0, 1.5, 2.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(record, st.integers(0, 7)), max_size=40))
def test_the_backlog_equals_the_records_worked_out_afresh(steps: list) -> None:
    """Records set (a job) and dropped (an index) in any order, a job's priority, time,
    queue, size, models, `preempting` and hold changing between its records."""
    state = ClusterState()
    for step in steps:
        set_or_drop(state, step)
        assert kept(state.backlog) == afresh(state.jobs)
        # The one record of which jobs are queued: ids, counts per queue, the total; held
        # jobs apart, in none of them.
        queued = [j for j in state.jobs.values() if j.state is JobState.QUEUED and not j.hold]
        assert state.backlog.held == {j.id: j.spec.queue for j in state.jobs.values()
                                      if j.state is JobState.QUEUED and j.hold}
        assert len(state.backlog) == len(queued) and sorted(state.backlog.ids()) == sorted(j.id for j in queued)
        per_queue = Counter(j.spec.queue for j in queued)
        assert state.backlog.counts() == dict(per_queue)
        # Those that could be placed at a time: not before it (a begin time, a back-off) left out.
        for now in (0.5, 1.5, 3.0):
            ready = Counter(j.spec.queue for j in queued if j.preempting or j.not_before <= now)
            assert state.backlog.eligible_counts(now) == dict(ready), now
        assert all(state.backlog.count(q) == per_queue[q] for q in ("a", "b"))
        # Each queue's jobs in order are the current records, however long the list handed
        # out for a queue has been kept (it is asked for after every step).
        for q in ("a", "b"):
            want = sorted((j for j in queued if j.spec.queue == q and not j.preempting), key=order_key)
            got = state.backlog.jobs_of(q, state.jobs)
            assert [j.id for j in got] == [j.id for j in want]
            assert all(g is state.jobs[g.id] for g in got)


def test_the_backlog_stays_right_through_a_fairness_run_with_reclaim(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cycle of a small fairness run (placements, reclaim, requeues, ends), checked
    after the cycle's records are applied."""
    checked = [0]
    real_apply = Simulation.apply

    def apply(self: Simulation, plan: object) -> None:
        real_apply(self, plan)
        assert kept(self.state.backlog) == afresh(self.state.jobs)
        checked[0] += 1

    args = build_parser().parse_args(["--tenants", "3", "--hosts", "6", "--rate", "20", "--wave", "3", "--gap", "10",
                                      "--tail", "25", "--mean-duration", "20", "--grace", "3"])
    monkeypatch.setattr(Simulation, "apply", apply)
    rep = simulate(args)
    assert checked[0] > 50 and rep["preemption"]["preempted_tries"] > 0 and rep["correctness"]["ok"]
