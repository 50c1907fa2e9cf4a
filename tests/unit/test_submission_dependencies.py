"""The API's submissions (server.operations.submissions) look up the jobs they run after
once per request: live records from the view, the rest from history in one batched read
off the event loop. The store and history are stood in for."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from server.operations.submissions import Submissions
from server.scheduling.submitlimits import OpenJobs
from server.state.cluster import ClusterState
from server.views.jobs import JobView
from tests.factories import job
from wire.errors import InvalidInput
from wire.kv import CommitResult, Write
from wire.messages import Job, JobState, encode
from wire.records import Record


class _History:
    """History holding some ended jobs; says on which thread it was read, and how."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = {j.id: j for j in jobs}
        self.reads: list[tuple[str, int, bool]] = []  # (how, ids asked, on the event loop's thread)

    def get_job(self, job_id: str) -> Job | None:
        self.reads.append(("one", 1, threading.current_thread() is threading.main_thread()))
        return self.jobs.get(job_id)

    def get_jobs(self, ids: list[str]) -> dict[str, Job]:
        self.reads.append(("many", len(ids), threading.current_thread() is threading.main_thread()))
        return {i: self.jobs[i] for i in ids if i in self.jobs}


class _Store:
    async def commit(self, writes: list[Write], **kw: Any) -> CommitResult:
        return CommitResult(revisions={w.key: n for n, w in enumerate(writes, start=1)})

    async def create(self, key: str, value: bytes, **kw: Any) -> Any:
        return SimpleNamespace(value=value, revision=1)


def _submissions(history: _History) -> Submissions:
    ops = Submissions()
    ops.state = ClusterState(heartbeat_interval_s=60)
    ops.store = _Store()  # type: ignore[assignment]
    ops.jobs = JobView(ops.state, history)  # type: ignore[arg-type]
    ops._storing = OpenJobs()
    return ops


async def test_a_batch_reads_the_dependencies_history_holds_once_off_the_event_loop() -> None:
    """Found by exploring: submitJobs read history once per dependency not live, on the
    event loop (1,000 jobs of 32 dependencies each held it 13 s)."""
    old = [job(f"old-job-{i:04d}", state=JobState.SUCCEEDED) for i in range(31)]
    history = _History(old)
    ops = _submissions(history)
    ops.state.apply_state_record(Record("job.live-job-01", 1, encode(job("live-job-01"))))
    deps = [j.id for j in old] + ["live-job-01"]
    items = [{"name": f"n{i}", "command": ["true"], "depends_on": deps} for i in range(50)]
    items.append({"name": "orphan", "command": ["true"], "depends_on": ["nosuch-job-1"]})
    results = await ops.submit_many(items, "alice")
    assert all(isinstance(r, Job) and r.waiting_for == ["live-job-01"] for r in results[:50])
    orphan = results[50]
    assert isinstance(orphan, InvalidInput) and orphan.code == "UNKNOWN_DEPENDENCY"
    assert history.reads == [("many", 32, False)]  # the 31 ended, and one no one has
    one = await ops.submit({"name": "one", "command": ["true"], "depends_on": ["old-job-0001", "live-job-01"]},
                           "alice")
    assert one.waiting_for == ["live-job-01"] and history.reads[1:] == [("many", 1, False)]
