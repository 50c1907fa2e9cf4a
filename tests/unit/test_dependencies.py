"""scheduling.dependencies: the jobs waiting for others, by the jobs they wait for, and
those whose wait the planner must look at (`due`), kept as job records arrive, always
equal to working them out from the records afresh."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.state.cluster import ClusterState
from tests.factories import job, job_spec, set_or_drop
from wire.messages import Job, JobState

IDS = [f"j{i}" for i in range(6)]


def afresh(jobs: dict[str, Job]) -> tuple[dict[str, tuple[str, ...]], set[str]]:
    """The waiting jobs with what they wait for, and those with a dependency ended or gone."""
    waiting = {j.id: tuple(j.waiting_for) for j in jobs.values() if j.state is JobState.QUEUED and j.waiting_for}
    due = {w for w, deps in waiting.items() if any(d not in jobs or jobs[d].state.terminal for d in deps)}
    return waiting, due


record = st.builds(
    lambda i, state, deps: job(f"j{i}", state=state, waiting_for=[d for d in deps if d != f"j{i}"],
                               spec=job_spec(f"j{i}", depends_on=list(deps))),
    st.integers(0, 5), st.sampled_from([JobState.QUEUED, JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED,
                                        JobState.FAILED]),
    st.lists(st.sampled_from(IDS), max_size=3, unique=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(record, st.integers(0, 5)), max_size=40))
def test_the_index_equals_the_records_worked_out_afresh(steps: list) -> None:
    """Records set (a job, waiting or not, ended or not) and dropped (an index) in any order."""
    state = ClusterState()
    for step in steps:
        set_or_drop(state, step)
        waiting, due = afresh(state.jobs)
        assert state.deps.waiting == waiting
        assert state.deps.due == due
        assert state.deps.waiters == {d: {w for w, ds in waiting.items() if d in ds}
                                      for d in {d for ds in waiting.values() for d in ds}}
        # The backlog keeps waiting jobs out of every queue's order.
        assert set(state.backlog.waiting) == {w for w in waiting if not state.jobs[w].hold}
        assert not set(waiting) & set(state.backlog.ids())
