"""The leader marks the NATS submissions waiting for a cycle with the ids of their jobs that an
earlier job had (SubmitRequest.used) and the states of the jobs they run after that only
history knows (SubmitRequest.recorded), asking history once for them all; a history out of
reach holds nothing up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from server.scheduling import scheduler as scheduler_module
from server.scheduling.scheduler import Scheduler
from server.state.cluster import ClusterState
from tests.factories import job_spec
from wire import subjects
from wire.messages import Job, JobState, SubmitRequest


class _Leading:
    leading = True
    term = 1
    changed = asyncio.Event()


def _request(*ids: object) -> SubmitRequest:
    return SubmitRequest(user="alice", jobs=[{"id": i, "name": "x", "command": ["true"]} for i in ids])


def _used(sched: Scheduler) -> list[list[str] | None]:
    return [r.used for _, r in sched._submissions]


async def test_history_is_asked_once_of_the_ids_the_view_does_not_have() -> None:
    asked: list[list[str]] = []

    async def used(ids: list[str]) -> dict[str, JobState]:
        asked.append(ids)
        return {i: JobState.SUCCEEDED for i in ("old-job-01", "old-job-02") if i in ids}

    state = ClusterState()
    state.apply_job(Job(id="live-job-01", spec=job_spec("live-job-01"), submitted_at=1.0, updated_at=1.0), 3)
    state.revisions[subjects.job_key("gone-job-01")] = 7  # a record gone: the planner refuses it itself
    sched = Scheduler(None, state, _Leading(), recorded_jobs=used)  # type: ignore[arg-type]
    msg: Any = object()
    sched._submissions = [(msg, _request("live-job-01", "gone-job-01", "old-job-01", "new-job-01", 5)),
                          (msg, _request("old-job-02", "new-job-02"))]
    await sched._screen_submissions()
    assert asked == [["new-job-01", "new-job-02", "old-job-01", "old-job-02"]]
    assert _used(sched) == [["old-job-01"], ["old-job-02"]]
    await sched._screen_submissions()  # marked: not asked again
    assert len(asked) == 1


async def test_a_history_out_of_reach_is_not_asked_again_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that fails (or does not answer within USED_IDS_WAIT_S) marks nothing,
    and is left alone for USED_IDS_PAUSE_S: each ask holds one of the replica's threads."""
    calls = 0

    async def down(ids: list[str]) -> dict[str, JobState]:
        nonlocal calls
        calls += 1
        raise OSError("connection refused")

    clock = [1000.0]
    monkeypatch.setattr(scheduler_module.time, "monotonic", lambda: clock[0])
    sched = Scheduler(None, ClusterState(), _Leading(), recorded_jobs=down)  # type: ignore[arg-type]
    msg: Any = object()
    sched._submissions = [(msg, _request("new-job-01"))]
    await sched._screen_submissions()
    assert _used(sched) == [[]] and calls == 1
    clock[0] += scheduler_module.USED_IDS_PAUSE_S - 1
    sched._submissions.append((msg, _request("new-job-02")))
    await sched._screen_submissions()
    assert _used(sched) == [[], []] and calls == 1
    clock[0] += 2

    async def back(ids: list[str]) -> dict[str, JobState]:
        return dict.fromkeys(ids, JobState.FAILED)

    sched.recorded_jobs = back
    sched._submissions.append((msg, _request("new-job-03")))
    await sched._screen_submissions()
    assert _used(sched) == [[], [], ["new-job-03"]]


async def test_the_jobs_a_submission_runs_after_that_only_history_has_are_marked_with_their_state() -> None:
    """Found by exploring: a job over NATS that runs after a job known only to history (its
    record expired) was refused as depending on no known job, where the API, which reads
    history, accepted it. The leader asks history for those in the same question as for
    the ids, and marks each submission with their states; the planner judges them."""
    asked: list[list[str]] = []

    async def recorded(ids: list[str]) -> dict[str, JobState]:
        asked.append(ids)
        return {i: st for i, st in (("etl-done-01", JobState.SUCCEEDED), ("etl-fail-01", JobState.FAILED)) if i in ids}

    state = ClusterState()
    state.apply_job(Job(id="live-job-01", spec=job_spec("live-job-01"), submitted_at=1.0, updated_at=1.0), 3)
    sched = Scheduler(None, state, _Leading(), recorded_jobs=recorded)  # type: ignore[arg-type]
    msg: Any = object()
    after = {"id": "new-job-01", "name": "x", "command": ["true"],
             "depends_on": ["etl-done-01", "etl-fail-01", "live-job-01", "nowhere-01", 7]}
    sched._submissions = [(msg, SubmitRequest(user="alice", jobs=[after])), (msg, _request("new-job-02"))]
    await sched._screen_submissions()
    assert asked == [["etl-done-01", "etl-fail-01", "new-job-01", "new-job-02", "nowhere-01"]]
    assert [r.recorded for _, r in sched._submissions] == [
        {"etl-done-01": JobState.SUCCEEDED, "etl-fail-01": JobState.FAILED}, {}]
    assert _used(sched) == [[], []]
