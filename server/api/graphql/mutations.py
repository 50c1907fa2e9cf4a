"""The GraphQL mutations: each checks the caller's role, runs one operation of the replica
(server.replica.Muster), and returns a payload whose expected failures are `userErrors`
(server.api.graphql.errors)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import strawberry
from strawberry.types import Info

from server.api.auth import allows, require_cluster_wide
from server.api.graphql.context import epoch, muster, operation_counts, require, user
from server.api.graphql.errors import UserError, attempt, user_errors
from server.api.graphql.inputs import (
    AdvanceReservationInput,
    AdvanceReservationUpdate,
    ClearGpuFaultsInput,
    Dependency,
    DrainHostInput,
    HostActionInput,
    JobFilter,
    QueueInput,
    SetHostLabelsInput,
    SubmitJobInput,
    UpdateJobInput,
)
from server.api.graphql.types import (
    AdvanceReservation,
    AdvanceReservationPayload,
    CancelJobPayload,
    CancelJobsPayload,
    DeleteAdvanceReservationPayload,
    DeleteQueuePayload,
    Host,
    HostActionPayload,
    Job,
    JobsChangedPayload,
    Queue,
    QueuePayload,
    SubmitJobPayload,
    UpdateJobPayload,
)
from server.operations.jobs import MAX_CANCEL_MATCHING, Matched
from server.views.queues import rows as queue_rows
from wire.errors import AuthError, MusterError, ValidationError
from wire.messages import Job as JobModel

if TYPE_CHECKING:
    from server.replica import Muster

P = TypeVar("P")  # a payload type
MAX_BATCH_SUBMIT = 1000


def _job_data(i: SubmitJobInput) -> dict[str, object]:
    return {
        "name": i.name, "command": i.command, "gpus": i.gpus, "gpu_model": i.gpu_model,
        "cpus": i.cpus, "memory_mb": i.memory_mb, "priority": i.priority,
        "max_attempts": i.max_attempts, "cwd": i.cwd, "env": i.env,
        "on_disconnect": i.on_disconnect.value, "replace_after_s": i.replace_after,
        "replicas": i.replicas, "same_rack": i.same_rack, "gpu_models": i.gpu_models,
        "same_model": i.same_model, "gpu_share": i.gpu_share, "gpu_memory_mb": i.gpu_memory_mb,
        "mig_profile": i.mig_profile,
        "queue": i.queue, "time_limit_s": i.time_limit_seconds, "host_labels": i.host_labels,
        "exclude_hosts": i.exclude_hosts or [], "held": i.held, "depends_on": [str(d) for d in i.depends_on or []],
        "depend_any": i.dependency is Dependency.AFTER_ANY, "depend_not_ok": i.dependency is Dependency.AFTER_NOT_OK,
        "group": i.group or "", "group_limit": i.group_limit, "begin_at": epoch(i.begin_at) or 0.0,
        "retry_failures": i.retry_failures, "retry_exit_codes": i.retry_exit_codes or [],
        "retry_timeouts": i.retry_timeouts, "retry_delay_s": i.retry_delay_seconds, "checkpoints": i.checkpoints,
    }


def _queue_data(i: QueueInput) -> dict[str, object]:
    """The fields given, as wire.messages.Queue names them."""
    fields = {
        "description": i.description, "cohort": i.cohort, "weight": i.weight,
        "preempt_within": i.preempt_within, "reclaim": i.reclaim, "fair_share_preemption": i.fair_share_preemption,
        "fair_share_users": i.fair_share_users,
        "preempt_grace_s": i.preempt_grace_seconds, "min_runtime_s": i.min_runtime_seconds,
        "max_preemptions": i.max_preemptions, "default_time_limit_s": i.default_time_limit_seconds,
        "max_time_limit_s": i.max_time_limit_seconds, "max_gpus_per_user": i.max_gpus_per_user,
        "max_submitted_jobs": i.max_submitted_jobs, "max_submitted_jobs_per_user": i.max_submitted_jobs_per_user,
        "max_running_jobs_per_user": i.max_running_jobs_per_user, "host_labels": i.host_labels,
    }
    data: dict[str, object] = {k: v for k, v in fields.items() if v is not None}
    if data.get("cohort") == "":
        data["cohort"] = None
    if i.quota is not None:
        named = [q.resource for q in i.quota]
        if len(set(named)) != len(named):
            twice = next(r for r in named if named.count(r) > 1)
            raise ValidationError("quota", f"{twice} is given twice", "INVALID")
        data["quota"] = {q.resource: {"nominal": q.nominal, "borrowing_limit": q.borrowing_limit,
                                      "lending_limit": q.lending_limit} for q in i.quota}
    return data


def _queue(info: Info, name: str) -> Queue | None:
    mu = muster(info)
    for row in queue_rows(mu.state, time.time(), mu.jobs.half_life_s):
        if row.queue.name == name:
            return Queue(_row=row)
    return None


def _take(info: Info, what: str, n: int, most: int) -> bool:
    """Count `n` more of `what` in this operation (a request's mutations run one after the
    other); False, counting nothing, past `most`."""
    counts = operation_counts(info)
    done = counts.get(what, 0)
    if done + n > most:
        return False
    counts[what] = done + n
    return True


def bound_queues(info: Info) -> list[str] | None:
    """The queues the caller's token may submit to (None: any; admins: any)."""
    tok = info.context.get("token")
    return None if tok is None else tok.submit_queues


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def submit_job(self, info: Info, input: SubmitJobInput) -> SubmitJobPayload:
        async def op() -> JobModel:
            require(info)
            if not _take(info, "submitted", 1, MAX_BATCH_SUBMIT):
                raise ValidationError("input", f"at most {MAX_BATCH_SUBMIT} jobs per request", "TOO_LARGE")
            return await muster(info).submit(_job_data(input), user(info), bound_queues(info))

        job, errors = await attempt(op)
        return SubmitJobPayload(job=Job(_m=job) if job else None, user_errors=errors)

    @strawberry.mutation(description="Submit up to 1,000 jobs in one request (aliases of submitJobs and submitJob "
                                     "counted together); each gets its own payload.")
    async def submit_jobs(self, info: Info, input: list[SubmitJobInput]) -> list[SubmitJobPayload]:
        try:
            require(info)
        except AuthError as exc:
            return [SubmitJobPayload(job=None, user_errors=user_errors(exc))]
        if not _take(info, "submitted", len(input), MAX_BATCH_SUBMIT):
            # Counted over the request, not the field: aliases of one mutation (up to 30)
            # each under the limit took 30,000 jobs in one request (found by exploring).
            return [SubmitJobPayload(job=None, user_errors=[UserError(
                field="input", message=f"at most {MAX_BATCH_SUBMIT} jobs per request", code="TOO_LARGE")])]
        results = await muster(info).submit_many([_job_data(i) for i in input], user(info), bound_queues(info))
        return [SubmitJobPayload(job=None, user_errors=user_errors(r)) if isinstance(r, MusterError)
                else SubmitJobPayload(job=Job(_m=r), user_errors=[]) for r in results]

    @strawberry.mutation
    async def cancel_job(self, info: Info, id: strawberry.ID, reason: str = "") -> CancelJobPayload:
        async def op() -> None:
            require(info)
            await muster(info).cancel(str(id), user(info), reason, bound_queues(info))

        job, errors = await _on_job(info, str(id), op)
        return CancelJobPayload(job=job, user_errors=errors)

    @strawberry.mutation(description="Change a job that has not ended: its priority, its time limit (its running "
                                     "try's too; only an admin may raise one), or hold or release it (a held job "
                                     "stays QUEUED and is not placed). The leader applies it shortly. A token "
                                     "bound to queues changes their jobs only.")
    async def update_job(self, info: Info, input: UpdateJobInput) -> UpdateJobPayload:
        async def op() -> None:
            require(info)
            await muster(info).update_job(str(input.id), user(info), priority=input.priority, hold=input.held,
                                          time_limit_s=input.time_limit_seconds,
                                          may_raise=allows(info.context.get("token"), "admin"),
                                          reason=input.reason, queues=bound_queues(info))

        job, errors = await _on_job(info, str(input.id), op)
        return UpdateJobPayload(job=job, user_errors=errors)

    @strawberry.mutation(description="Stop a placed or running job's try and queue the job again at its place "
                                     "(the try is not counted against maxAttempts; its tasks get SIGTERM, the "
                                     "grace, SIGKILL), held when `hold`. As Slurm's scontrol requeue (and "
                                     "requeuehold). A token bound to queues requeues their jobs only.")
    async def requeue_job(self, info: Info, id: strawberry.ID, reason: str = "",
                          hold: bool = False) -> UpdateJobPayload:
        async def op() -> None:
            require(info)
            await muster(info).requeue(str(id), user(info), reason, hold, bound_queues(info))

        job, errors = await _on_job(info, str(id), op)
        return UpdateJobPayload(job=job, user_errors=errors)

    @strawberry.mutation(description="Cancel every job that has not ended and matches `filter` (at least one of "
                                     "its fields given), the oldest first, at most `limit` (by default and at most "
                                     "100000 over the request, holdJobs, releaseJobs and aliases together; run it "
                                     "again for more). A `group` without a `user` is the caller's own group (groups "
                                     "are per user). A token bound to queues cancels only their jobs. The leader "
                                     "stops them shortly, as cancelJob.")
    async def cancel_jobs(self, info: Info, filter: JobFilter, reason: str = "",
                          limit: int | None = None) -> CancelJobsPayload:
        return await _on_matching(info, "cancel", filter, reason, limit, CancelJobsPayload)

    @strawberry.mutation(description="Hold every QUEUED job that matches `filter` (at least one of its fields "
                                     "given) and is not held already nor taking GPUs by preemption: each stays "
                                     "queued, not placed until released (Slurm's scontrol hold of many jobs). The "
                                     "oldest first, at most `limit`, as cancelJobs; a group as cancelJobs takes it. "
                                     "A token bound to queues holds only their jobs. The leader applies it shortly, "
                                     "as updateJob's hold.")
    async def hold_jobs(self, info: Info, filter: JobFilter, reason: str = "",
                        limit: int | None = None) -> JobsChangedPayload:
        return await _on_matching(info, "hold", filter, reason, limit, JobsChangedPayload)

    @strawberry.mutation(description="Release every held job that matches `filter` (at least one of its fields "
                                     "given): each takes its place in its queue again. The oldest first, at most "
                                     "`limit`, as cancelJobs; a group as cancelJobs takes it. A token bound to "
                                     "queues releases only their jobs.")
    async def release_jobs(self, info: Info, filter: JobFilter, limit: int | None = None) -> JobsChangedPayload:
        return await _on_matching(info, "release", filter, "", limit, JobsChangedPayload)

    @strawberry.mutation(description="Create a queue (admin).")
    async def create_queue(self, info: Info, input: QueueInput) -> QueuePayload:
        async def op() -> str:
            require(info, "admin")
            q = await muster(info).create_queue({"name": input.name, **_queue_data(input)}, user(info))
            return q.name

        name, errors = await attempt(op)
        return QueuePayload(queue=_queue(info, name) if name else None, user_errors=errors)

    @strawberry.mutation(description="Change a queue's settings (admin): only the fields given change.")
    async def update_queue(self, info: Info, input: QueueInput) -> QueuePayload:
        async def op() -> str:
            require(info, "admin")
            q = await muster(info).update_queue(input.name, _queue_data(input), user(info))
            return q.name

        name, errors = await attempt(op)
        return QueuePayload(queue=_queue(info, name) if name else None, user_errors=errors)

    @strawberry.mutation(description="Delete a queue (admin). Refused while it has queued, placed or running jobs.")
    async def delete_queue(self, info: Info, name: str) -> DeleteQueuePayload:
        async def op() -> bool:
            require(info, "admin")
            await muster(info).delete_queue(name, user(info))
            return True

        done, errors = await attempt(op)
        return DeleteQueuePayload(deleted=bool(done), user_errors=errors)

    @strawberry.mutation(description="Set hosts aside for some queues' jobs over a time window (admin): an advance "
                                     "reservation. Refused when a host is set aside by another reservation over "
                                     "an overlapping window (OVERLAPS).")
    async def create_advance_reservation(self, info: Info, input: AdvanceReservationInput) -> AdvanceReservationPayload:
        async def op() -> AdvanceReservation:
            require(info, "admin")
            r = await muster(info).create_advance_reservation(
                {"name": input.name, "hosts": [str(h) for h in input.hosts], "queues": input.queues,
                 "users": input.users, "starts": epoch(input.starts_at), "ends": epoch(input.ends_at),
                 "description": input.description},
                user(info))
            return AdvanceReservation(_r=r)

        r, errors = await attempt(op)
        return AdvanceReservationPayload(reservation=r, user_errors=errors)

    @strawberry.mutation(description="Change an advance reservation (admin): its end, start, hosts, queues, users "
                                     "or description; checked as a new one is.")
    async def update_advance_reservation(self, info: Info,
                                         input: AdvanceReservationUpdate) -> AdvanceReservationPayload:
        async def op() -> AdvanceReservation:
            require(info, "admin")
            r = await muster(info).update_advance_reservation(input.name, {
                "ends": epoch(input.ends_at), "starts": epoch(input.starts_at),
                "hosts": [str(h) for h in input.hosts] if input.hosts is not None else None,
                "queues": input.queues, "users": input.users, "description": input.description}, user(info))
            return AdvanceReservation(_r=r)

        r, errors = await attempt(op)
        return AdvanceReservationPayload(reservation=r, user_errors=errors)

    @strawberry.mutation(description="Delete an advance reservation (admin): its hosts go back to every queue.")
    async def delete_advance_reservation(self, info: Info, name: str) -> DeleteAdvanceReservationPayload:
        async def op() -> bool:
            require(info, "admin")
            await muster(info).delete_advance_reservation(name, user(info))
            return True

        done, errors = await attempt(op)
        return DeleteAdvanceReservationPayload(deleted=bool(done), user_errors=errors)

    @strawberry.mutation
    async def cordon_host(self, info: Info, input: HostActionInput) -> HostActionPayload:
        return await _on_host(info, str(input.id),
                              lambda m: m.set_cordon(str(input.id), True, user(info), input.reason))

    @strawberry.mutation
    async def uncordon_host(self, info: Info, input: HostActionInput) -> HostActionPayload:
        return await _on_host(info, str(input.id),
                              lambda m: m.set_cordon(str(input.id), False, user(info), input.reason))

    @strawberry.mutation(description="Clear GPU fault marks of a host, after those GPUs were reset or replaced (a "
                                     "reason is required; `gpus`: which, by default every faulted one): its agent "
                                     "forgets them and the GPUs take work again until a new fault. A GPU still "
                                     "unreachable is marked again at once.")
    async def clear_gpu_faults(self, info: Info, input: ClearGpuFaultsInput) -> HostActionPayload:
        return await _on_host(info, str(input.id),
                              lambda m: m.clear_gpu_faults(str(input.id), user(info), input.reason, input.gpus))

    @strawberry.mutation(description="Set or remove the operator's labels of a host (admin): as Slurm's node "
                                     "features in slurm.conf, or Kubernetes' node labels set by the admin. They "
                                     "override what its agent reports; for the keys only operators set "
                                     "(Cluster.operatorLabelKeys) they are the host's only labels. A cordon or drain "
                                     "stays as it is. The event host.labels records it.")
    async def set_host_labels(self, info: Info, input: SetHostLabelsInput) -> HostActionPayload:
        async def op() -> None:
            require(info, "admin")
            await muster(info).set_labels(str(input.id), user(info), input.labels or {}, input.remove or [],
                                          input.reason)

        _, errors = await attempt(op)
        return _host_payload(info, str(input.id), errors)

    @strawberry.mutation(description="Cordon a host and stop what still runs on it after the deadline; with "
                                     "`at`, from then on (a maintenance window), the host taking until then only "
                                     "jobs that the deadline would not stop. Replaces a drain or cordon set before.")
    async def drain_host(self, info: Info, input: DrainHostInput) -> HostActionPayload:
        return await _on_host(info, str(input.id),
                              lambda m: m.drain(str(input.id), user(info), input.reason, input.deadline_seconds,
                                                epoch(input.at)))


async def _on_matching(info: Info, action: str, filter: JobFilter, reason: str, limit: int | None,
                       payload: Callable[..., P]) -> P:
    """cancelJobs, holdJobs or releaseJobs (`action`): its `payload` (the ids of the jobs
    asked for, their count, the user errors; the jobs that matched but are of queues the
    token may not act on, and the token's queues). At most MAX_CANCEL_MATCHING jobs over the
    request, every such field and alias together."""
    async def op() -> Matched:
        require(info)
        counts = operation_counts(info)
        left = MAX_CANCEL_MATCHING - counts.get("matched", 0)
        if limit is not None and limit < 1:
            # (found by exploring: 0 and -1 were told "at most 100000")
            raise ValidationError("limit", "must be at least 1 (leave it out for every match)", "OUT_OF_RANGE")
        if left <= 0 or (limit is not None and limit > left):
            raise ValidationError("limit", f"at most {MAX_CANCEL_MATCHING} jobs cancelled, held or released per "
                                           "request", "OUT_OF_RANGE")
        done = await muster(info).act_on_matching_counted(action, user(info), reason, bound_queues(info),
                                                          limit=limit if limit is not None else left,
                                                          **filter.filters())
        counts["matched"] = counts.get("matched", 0) + len(done.ids)
        return done

    done, errors = await attempt(op)
    ids = done.ids if done is not None else []
    return payload(count=len(ids), job_ids=[strawberry.ID(i) for i in ids], user_errors=errors,
                   outside_token_queues=done.outside_queues if done is not None else 0,
                   token_queues=bound_queues(info))


async def _on_job(info: Info, job_id: str, op: Callable[[], Awaitable[None]]) -> tuple[Job | None, list[UserError]]:
    """An action on a job (`op`), its errors as `userErrors`, and the job as it is then
    (not shown to a caller refused it)."""
    _, errors = await attempt(op)
    if any(e.code == "FORBIDDEN" for e in errors):
        return None, errors
    job = muster(info).jobs.get(job_id)
    return (Job(_m=job) if job else None), errors


async def _on_host(info: Info, host_id: str, act: Callable[[Muster], Awaitable[object]]) -> HostActionPayload:
    """An operator's action on a host (`act` on the replica), its errors as `userErrors`;
    a team's token (bound to queues) is refused."""
    async def op() -> None:
        require_cluster_wide(info.context.get("token"))
        await act(muster(info))

    _, errors = await attempt(op)
    return _host_payload(info, host_id, errors)


def _host_payload(info: Info, host_id: str, errors: list[UserError]) -> HostActionPayload:
    forbidden = any(e.code == "FORBIDDEN" for e in errors)
    return HostActionPayload(host=None if forbidden else Host.of(info, host_id), user_errors=errors)
