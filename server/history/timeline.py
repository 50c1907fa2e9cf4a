"""A job's timeline derived from its record: pure, shared by the history writer (which
stores it as event rows) and the job view (which merges it with what was recorded)."""

from __future__ import annotations

from wire.messages import Job


def job_events(job: Job) -> list[dict[str, object]]:
    """The timeline of a job, derived from its record: ids are deterministic, so the
    same event is written once however often (and by however many replicas) it is seen."""
    out: list[dict[str, object]] = [dict(id=f"{job.id}:submitted", ts=job.submitted_at, kind="job.submitted",
                                         job_id=job.id, host_id=None, message=job.spec.name)]
    for a in job.attempts:
        out.append(dict(id=f"{a.id}:placed", ts=a.placed_at, kind="attempt.placed", job_id=job.id,
                        host_id=a.host_id, message=f"attempt {a.number} on {a.host_id} GPUs {a.gpu_indices}"))
        if a.started_at is not None:
            out.append(dict(id=f"{a.id}:started", ts=a.started_at, kind="attempt.started", job_id=job.id,
                            host_id=a.host_id, message=f"attempt {a.number} running"))
        if a.state.terminal and a.finished_at is not None:
            detail = f"exit code {a.exit_code}" if a.exit_code is not None else ""
            out.append(dict(id=f"{a.id}:{a.state.value.lower()}", ts=a.finished_at,
                            kind=f"attempt.{a.state.value.lower()}", job_id=job.id, host_id=a.host_id,
                            message="; ".join(x for x in (detail, a.reason) if x)))
    if job.state.terminal:
        out.append(dict(id=f"{job.id}:{job.state.value.lower()}", ts=job.updated_at,
                        kind=f"job.{job.state.value.lower()}", job_id=job.id,
                        host_id=job.current.host_id if job.current else None,
                        message=job.cancel_reason or job.end_reason))
    return out
