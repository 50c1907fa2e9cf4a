"""The scheduler's intake of a NATS submission: the ids of its jobs that an earlier job had
are marked from history (SubmitRequest.used), and a history out of reach holds nothing up."""

from __future__ import annotations

import asyncio

import pytest

from server.scheduling import scheduler as scheduler_module
from server.scheduling.scheduler import Scheduler
from server.state.cluster import ClusterState
from tests.factories import job_spec
from wire import subjects
from wire.messages import Job, SubmitRequest


class _Leading:
    leading = True
    term = 1
    changed = asyncio.Event()


def _request(*ids: object) -> SubmitRequest:
    return SubmitRequest(user="alice", jobs=[{"id": i, "name": "x", "command": ["true"]} for i in ids])


async def test_history_is_asked_only_of_ids_the_view_does_not_have() -> None:
    asked: list[list[str]] = []

    async def used(ids: list[str]) -> set[str]:
        asked.append(ids)
        return {"old-job-01"} & set(ids)

    state = ClusterState()
    state.apply_job(Job(id="live-job-01", spec=job_spec("live-job-01"), submitted_at=1.0, updated_at=1.0), 3)
    state.revisions[subjects.job_key("gone-job-01")] = 7  # a record gone: the planner refuses it itself
    sched = Scheduler(None, state, _Leading(), used_ids=used)  # type: ignore[arg-type]
    req = await sched._screen_submission(_request("live-job-01", "gone-job-01", "old-job-01", "new-job-01", 5))
    assert asked == [["old-job-01", "new-job-01"]] and req.used == ["old-job-01"]
    same = _request("live-job-01")
    assert await sched._screen_submission(same) is same and len(asked) == 1  # nothing to ask


async def test_a_history_out_of_reach_is_not_asked_again_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that fails (or does not answer within USED_IDS_WAIT_S) marks nothing,
    and is left alone for USED_IDS_PAUSE_S: each ask holds one of the replica's threads."""
    calls = 0

    async def down(ids: list[str]) -> set[str]:
        nonlocal calls
        calls += 1
        raise OSError("connection refused")

    clock = [1000.0]
    monkeypatch.setattr(scheduler_module.time, "monotonic", lambda: clock[0])
    sched = Scheduler(None, ClusterState(), _Leading(), used_ids=down)  # type: ignore[arg-type]
    assert (await sched._screen_submission(_request("new-job-01"))).used == [] and calls == 1
    clock[0] += scheduler_module.USED_IDS_PAUSE_S - 1
    assert (await sched._screen_submission(_request("new-job-02"))).used == [] and calls == 1
    clock[0] += 2

    async def back(ids: list[str]) -> set[str]:
        return set(ids)

    sched.used_ids = back
    assert (await sched._screen_submission(_request("new-job-03"))).used == ["new-job-03"]
