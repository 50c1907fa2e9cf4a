"""Submissions that came over NATS turned into queued jobs, and jobs waiting for others
released or cancelled once those ended. Pure."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

from server.scheduling import submitlimits
from server.scheduling.cycle.reports import hold_text
from server.scheduling.cycle.work import KeyInFlight, Work, job_event
from server.scheduling.dependencies import kind as dependency_kind
from server.scheduling.dependencies import waits
from server.scheduling.queues import queue_named, queue_refusal
from server.scheduling.submitlimits import OpenJobs
from wire import subjects
from wire.budgets import CANCEL_REASON_MAX, clip_start
from wire.messages import JOB_ID_PATTERN, Job, JobSpec, JobState, SubmitRequest
from wire.validation import SUBMIT_FIELDS, validate_job

JOB_ID_RE = re.compile(JOB_ID_PATTERN)


def apply_submission(w: Work, req: SubmitRequest, known_models: set[str], now: float) -> None:
    """Jobs submitted over NATS become QUEUED job records in this cycle's commit (and may
    be placed in the same commit). A job id that is the same user's job already, sent as
    it was, is a publish sent again, skipped; one whose job differs (found by exploring:
    skipped without a word, a corrected job never ran), one that is another user's job,
    that an earlier job had (`req.used`, or a record gone since), or given twice in the
    message is refused, as is a field no job has (found by exploring: each was dropped
    without a word, a misspelt `gpu` ran with none, and an id used before ran a second
    job under the first's id)."""
    seen: set[str] = set()
    used = set(req.used or ())
    for data in req.jobs:
        job_id = data.get("id")
        if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
            w.plan.rejected.append((str(job_id)[:64], "id: 8-64 letters, digits, '_' or '-'"))
            continue
        if job_id in seen:
            w.plan.rejected.append((job_id, "id: given twice in this submission"))
            continue
        seen.add(job_id)
        existing = w.plan.jobs.get(job_id) or w.state.jobs.get(job_id)
        if existing is not None and existing.spec.user != req.user:
            w.plan.rejected.append((job_id, "id: another user's job has it (choose another id)"))
            continue
        if existing is None and (job_id in used or subjects.job_key(job_id) in w.state.revisions):
            w.plan.rejected.append((job_id, "id: an earlier job had it, and ids are never reused (choose another)"))
            continue
        if existing is None and job_id in w.frozen_jobs:
            raise KeyInFlight(subjects.job_key(job_id))  # plan_cycle holds such submissions back
        unknown = sorted(k for k in data if k not in SUBMIT_FIELDS)
        if unknown:
            w.plan.rejected.append((job_id, f"{', '.join(unknown)[:200]}: no such field (the stored spec's names: "
                                            "gpus, memory_mb, time_limit_s, ...)"))
            continue
        if data.get("held") is not None and not isinstance(data["held"], bool):  # (1 == True: "held": 1 ran)
            w.plan.rejected.append((job_id, "held: must be true or false"))
            continue
        fields = {k: v for k, v in data.items() if k not in ("id", "user", "held")}
        fields["user"] = req.user
        if req.queue:
            # Sent on muster.submit.<user>.<queue>: of that queue only (a submitter bound to
            # queues may publish nowhere else; found by exploring: its credentials put jobs
            # in any queue, past the queues its team's token is bound to).
            if fields.get("queue") in (None, ""):
                fields["queue"] = req.queue
            elif fields["queue"] != req.queue:
                w.plan.rejected.append((job_id, f"queue: sent for queue {req.queue!r}, it names "
                                                f"{str(fields['queue'])[:64]!r}"))
                continue
        spec, errors = validate_job(fields, known_models)
        if spec is None:
            w.plan.rejected.append((job_id, "; ".join(str(e) for e in errors)))
            continue
        if existing is not None:
            differs = spec_differences(existing.spec, spec)
            if differs:
                w.plan.rejected.append((job_id, f"id: in use by your job {job_id}, which differs "
                                                f"({', '.join(differs[:5])}): a job sent again is skipped only "
                                                "unchanged; choose another id"))
            continue
        # As the API refuses one (found by exploring: one to no queue was stored and waited
        # for ever).
        refused = queue_refusal(spec, queue_named(w.state.queues, spec.queue))
        if refused is not None:
            w.plan.rejected.append((job_id, str(refused)))
            continue
        submitted = req.ts if 0 < req.ts <= now else now
        hold = hold_text(req.user, at_submission=True) if data.get("held") is True else ""
        job = Job(id=job_id, spec=spec, submitted_at=submitted, updated_at=now, hold=hold, not_before=spec.begin_at,
                  uid_key=uid_key(req.nonce, job_id))
        job.waiting_for, never = dependency_state(w, job, spec.depends_on, req.recorded)
        if never:
            w.plan.rejected.append((job_id, f"dependsOn: {never}"))
            continue
        limit = submission_refusal(w, spec)
        if limit:
            w.plan.rejected.append((job_id, f"{submitlimits.JOB_LIMIT}: {limit}"))
            w.plan.limited[spec.queue] = w.plan.limited.get(spec.queue, 0) + 1
            continue
        w.plan.jobs[job_id] = job
        w.plan.accepted += 1
        if w.open_changes is not None:
            w.open_changes.update(None, job)


def spec_differences(stored: JobSpec, sent: JobSpec) -> list[str]:
    """The fields (the stored spec's names, sorted) in which a job sent again differs from
    the stored job of its id, but those only the control plane sets."""
    a, b = stored.model_dump(), sent.model_dump()
    return sorted(k for k in a if k != "time_limit_exempt" and a[k] != b.get(k))


def uid_key(nonce: str, job_id: str) -> str:
    """A NATS-submitted job's uid key (Job.uid_key): drawn from the leader's nonce for its
    submission, which its client cannot choose; "" (its id) without one."""
    return hashlib.sha256(f"{nonce}:{job_id}".encode()).hexdigest()[:32] if nonce else ""


def submission_refusal(w: Work, spec: JobSpec) -> str:
    """Why the job's queue takes no more jobs of its user (scheduling.submitlimits),
    counting the jobs stored, what the commits in flight and this cycle change; "" if it
    takes it. A queue without a record (`default` as it comes, a queue not created yet)
    has no limits."""
    q = w.state.queues.get(spec.queue)
    if q is None or not submitlimits.limited(q):
        return ""
    if w.open_changes is None:
        w.open_changes = OpenJobs()
        for old, new in w.replaced():
            w.open_changes.update(old, new)
    return submitlimits.refusal(q, spec.user, (w.state.open_jobs, w.open_changes))


def dependency_state(w: Work, job: Job, deps: Sequence[str],
                     recorded: Mapping[str, JobState] | None = None) -> tuple[list[str], str]:
    """Of `deps` (job ids `job` runs after), those it still waits for, and why it can never
    run ("" if it can): a dependency whose end its rule excludes (afterok: any but
    SUCCEEDED; afternotok: SUCCEEDED), or one no longer known (its record gone, and not in
    `recorded`: the states history gave for a submission's dependencies, as the API
    reads them from history; found by exploring, one known only to history was accepted
    over GraphQL and refused over NATS). dependencies.waits over each job's latest record:
    this cycle's, a commit's in flight, or the stored one (found by exploring: a job sent
    after another's submission was acknowledged was refused, its dependency "not known",
    while the cycle that created that one was still committing)."""
    recorded = recorded or {}
    left, never = waits(job.spec, deps, lambda d: w.latest(d) or recorded.get(d))
    if never is None:
        return left, ""
    dep, ended = never
    return left, f"dependency {dep} is not known" if ended is None else f"dependency {dep} ended {ended.value}"


def resolve_dependencies(w: Work, now: float, room: int) -> None:
    """Jobs whose dependencies ended (or went): those all met go back to their queue (and
    may be placed in this cycle), those that can never be met (afterok, one ended
    otherwise; afternotok, one SUCCEEDED) end CANCELLED saying which, the rest wait for
    fewer."""
    for job_id in sorted(w.state.deps.due):
        if w.plan.keys + 2 > room:
            return
        if w.busy(job_id):
            continue
        job = w.plan.jobs.get(job_id) or w.state.jobs.get(job_id)
        if job is None or job.state is not JobState.QUEUED or not job.waiting_for:
            continue
        left, never = dependency_state(w, job, job.waiting_for)
        if not never and left == job.waiting_for:
            continue
        job = w.job(job_id)
        assert job is not None
        job.updated_at = now
        if never:
            job.state = JobState.CANCELLED
            job.hold = ""
            job.waiting_for = []
            job.cancel_reason = clip_start(f"{never}: it could never run ({dependency_kind(job.spec)})",
                                           CANCEL_REASON_MAX)
            w.plan.events.append(job_event("job.cancelled", job, None, now, job.cancel_reason))
        else:
            job.waiting_for = left
            if not left:
                job.freed_at = now
