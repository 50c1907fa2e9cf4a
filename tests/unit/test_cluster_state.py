"""The cluster view (server.state.cluster.ClusterState) keeps no trace of a deleted key for
ever: found by exploring, every job ever seen kept its key's revision (a leak of about 100
bytes a job: GBs a day at 500 jobs/s)."""

from __future__ import annotations

import pytest

from server.state import cluster as cluster_module
from server.state.cluster import DELETED_KEEP_S, ClusterState
from tests.factories import job_spec
from wire.messages import Job, encode
from wire.records import Record


def test_a_deleted_keys_revision_is_forgotten_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(cluster_module.time, "monotonic", lambda: clock[0])
    state = ClusterState()

    def record(job_id: str, revision: int, deleted: bool = False) -> Record:
        job = Job(id=job_id, spec=job_spec(job_id), submitted_at=1.0, updated_at=1.0)
        return Record(f"job.{job_id}", revision, None if deleted else encode(job))

    for rev, job_id in enumerate(("gone-job-1", "back-job-1"), start=1):
        state.apply_state_record(record(job_id, rev))
    state.apply_state_record(record("gone-job-1", 3, deleted=True))
    state.apply_state_record(record("back-job-1", 4, deleted=True))
    state.apply_state_record(record("back-job-1", 2))  # older than its deletion: not applied
    assert "back-job-1" not in state.jobs and state.revisions["job.back-job-1"] == 4
    clock[0] += 1
    state.apply_state_record(record("back-job-1", 5))  # written again since its deletion
    clock[0] += DELETED_KEEP_S
    state.apply_state_record(record("other-job-1", 6))
    assert "job.gone-job-1" not in state.revisions and not state.deleted
    assert state.revisions["job.back-job-1"] == 5 and "back-job-1" in state.jobs
