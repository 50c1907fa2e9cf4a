"""Operators' commands on jobs (cancel, update, requeue; cancel, hold and release many), which the leader
applies, and a running attempt's live output asked of its agent."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from server.operations.base import Operations
from server.scheduling.queues import effective_time_limit
from server.timefmt import duration_text
from server.views.jobs import matches
from wire import subjects
from wire.errors import Forbidden, NotFound, StoreError, ValidationError
from wire.messages import Command, Job, JobState, OutputReply, OutputRequest, decode, encode
from wire.validation import MAX_TIME_LIMIT_S, validate_reason

log = logging.getLogger(__name__)

# Agents one request (a GraphQL query, a console page) asks for running attempts' output
# (Muster.live_output): a page of running jobs, or a large gang's page polled every two
# seconds, cannot become a request to every agent of the cluster.
MAX_LIVE_OUTPUTS = 32

# Jobs one request may cancel, hold or release by filter (cancelJobs, holdJobs,
# releaseJobs together; run it again for more), the live jobs looked at between two yields
# of the event loop, and the commands published at once.
MATCHING_ACTIONS = ("cancel", "hold", "release")
MAX_CANCEL_MATCHING = 100_000
CANCEL_SCAN_CHUNK = 20_000
CANCEL_PUBLISH_CHUNK = 256


@dataclass(frozen=True)
class Matched:
    """What JobOperations.act_on_matching_counted asked for: the jobs' ids, the oldest
    first; and how many jobs matched too but are of queues the caller's token may not act
    on, left alone (0 for a token bound to no queue)."""
    ids: list[str]
    outside_queues: int = 0



class JobOperations(Operations):
    def _live_job_for(self, job_id: str, queues: list[str] | None) -> Job:
        """A job an operator acts on: it exists, `queues` (the caller's token's) allow its
        queue, and it has not ended. Raises NotFound, Forbidden or ValidationError
        (ALREADY_FINISHED)."""
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id[:128]}")  # (an id of any length is echoed only so far)
        if queues is not None and job.spec.queue not in queues:
            raise Forbidden(f"this token acts only on jobs of its queues ({', '.join(queues)}); "
                            f"job {job_id} is in queue {job.spec.queue!r}")
        if job.state.terminal:
            raise ValidationError("id", f"job is already {job.state.value}", "ALREADY_FINISHED")
        return job

    async def _command(self, cmd: Command) -> None:
        assert self.store is not None
        try:
            await self.store.js.publish(f"{subjects.CMDS_PREFIX}.{cmd.kind}", encode(cmd))
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"{cmd.kind}: {exc}") from exc

    async def cancel(self, job_id: str, by: str, reason: str = "", queues: list[str] | None = None) -> None:
        """Ask the leader to cancel a job. Raises NotFound, Forbidden when `queues` (the
        caller's token's) leave the job's queue out, or ValidationError (ALREADY_FINISHED)
        for a job that has ended."""
        reason = validate_reason(reason)
        self._live_job_for(job_id, queues)
        await self._command(Command(kind="cancel", job_id=job_id, by=by, reason=reason))

    async def update_job(self, job_id: str, by: str, *, priority: int | None = None, hold: bool | None = None,
                         time_limit_s: float | None = None, may_raise: bool = False, reason: str = "",
                         queues: list[str] | None = None) -> None:
        """Ask the leader to change a job that has not ended: its priority (-1000 to 1000),
        hold it (True: a QUEUED job stays queued but is not placed; `reason` says why) or
        release it (False), and its time limit in seconds (a running try's too: one that
        has run longer is stopped at once; 0: none). As with Slurm's `scontrol update
        TimeLimit`, only an admin (`may_raise`) may raise a limit, set one above the queue's
        maximum or remove it (UNLIMITED).
        Raises NotFound, Forbidden (`queues`, as cancel; a raise without `may_raise`),
        ValidationError (nothing to change, a value out of range, holding a job that is
        not QUEUED or is taking GPUs by preemption, holding a held job or releasing one not
        held with nothing else to change, a limit for a try that is stopping;
        ALREADY_FINISHED)."""
        reason = validate_reason(reason)
        if priority is None and hold is None and time_limit_s is None:
            raise ValidationError("input", "give a priority, a time limit, or hold or release the job", "REQUIRED")
        if priority is not None and not -1000 <= priority <= 1000:
            raise ValidationError("priority", "must be from -1000 to 1000", "OUT_OF_RANGE")
        if time_limit_s is not None and not 0 <= time_limit_s <= MAX_TIME_LIMIT_S:
            raise ValidationError("timeLimitSeconds", f"must be from 0 (none) to {MAX_TIME_LIMIT_S} seconds",
                                  "OUT_OF_RANGE")
        job = self._live_job_for(job_id, queues)
        if hold and (job.state is not JobState.QUEUED or job.preempting):
            why = "it is taking GPUs by preemption" if job.preempting else f"it is {job.state.value}"
            raise ValidationError("hold", f"only a queued job can be held; {why} (requeue it held instead: "
                                          "requeueJob with hold, muster job requeue --hold)", "NOT_QUEUED")
        if hold is not None and priority is None and time_limit_s is None and bool(job.hold) == hold:
            # Nothing would change (found by exploring: "change requested", and a second
            # hold's reason was dropped).
            raise ValidationError("hold", f"it is held already ({job.hold}): release it first" if hold
                                  else "it is not held", "ALREADY_HELD" if hold else "NOT_HELD")
        exempt = False
        if time_limit_s is not None:
            self._check_time_limit(job, time_limit_s, may_raise)
            q = self.queue(job.spec.queue)
            # An admin's limit past the queue's maximum holds for every try (found by
            # exploring: a queued job's raise was accepted, and its try ran capped), and so
            # does an admin's removal of the limit (0: neither the queue's default nor its
            # maximum comes back).
            exempt = may_raise and (time_limit_s == 0 or (q is not None and 0 < q.max_time_limit_s < time_limit_s))
        await self._command(Command(kind="update", job_id=job_id, by=by, reason=reason, priority=priority, hold=hold,
                                    time_limit_s=time_limit_s, time_limit_exempt=exempt))

    def _check_time_limit(self, job: Job, limit: float, may_raise: bool) -> None:
        """A new time limit for `job` that the caller may set: one no longer than the limit
        it runs (or would run) under now, within its queue's maximum, unless `may_raise`.
        A try that is being stopped keeps its end."""
        live = [t for t in job.current_tasks() if not t.state.terminal]
        if any(t.stop_kind for t in live):
            raise ValidationError("timeLimitSeconds", "its try is being stopped already", "STOPPING")
        if may_raise:
            return
        if limit == 0:
            raise Forbidden("only an admin may remove a time limit")
        q = self.queue(job.spec.queue)
        now_limit = live[0].time_limit_s if live else effective_time_limit(job.spec, q)
        if now_limit and limit > now_limit:
            raise Forbidden(f"only an admin may raise a time limit ({duration_text(now_limit)} now)")
        if q is not None and q.max_time_limit_s and limit > q.max_time_limit_s:
            raise Forbidden(f"only an admin may set a time limit over the maximum of queue {q.name} "
                            f"({duration_text(q.max_time_limit_s)})")

    async def act_on_matching(self, action: str, by: str, reason: str = "", queues: list[str] | None = None,
                              limit: int = MAX_CANCEL_MATCHING, **filters: Any) -> list[str]:
        """act_on_matching_counted's ids."""
        return (await self.act_on_matching_counted(action, by, reason, queues, limit, **filters)).ids

    async def act_on_matching_counted(self, action: str, by: str, reason: str = "", queues: list[str] | None = None,
                                      limit: int = MAX_CANCEL_MATCHING, **filters: Any) -> Matched:
        """Ask the leader to cancel (`action` "cancel": every job that has not ended), hold
        ("hold": every QUEUED job not held nor taking GPUs by preemption; it stays queued,
        not placed until released, as Slurm's `scontrol hold` of a list) or release
        ("release": every held job; `reason` unused) the jobs that match `filters` (those
        of views.jobs.matches: state, user, name, priority, submitted_after,
        submitted_before, queue, group; at least one given), of the queues `queues` (the
        caller's token's) allow: at most `limit`, the oldest first. A group is named within
        its user's jobs: a `group` without a `user` is the caller's (`by`) own group, as
        the jobs that share a group's limit are. Returns their ids, and
        how many more matched but are of queues that `queues` leave out (not acted on: found
        by exploring, a team's `muster job cancel --name x` was told no job matched).
        Raises ValidationError (no filter, a limit out of range), NotFound (no such queue),
        Forbidden (a queue the token may not act on), StoreError (NATS did not take a
        command: run it again)."""
        assert action in MATCHING_ACTIONS, action
        reason = validate_reason(reason if action != "release" else "")
        empty = [k for k in ("name", "user", "queue", "group") if filters.get(k) == ""]
        if empty:
            # (found by exploring: an empty value was taken for none, so `--name "" --queue
            # q`, a script's empty variable, held or cancelled the whole queue)
            field = {"name": "namePrefix"}.get(empty[0], empty[0])
            raise ValidationError(field, f"{field} is empty: give a value, or leave it out (it would match every "
                                         "job)", "INVALID")
        if not any(v not in (None, "", [], ()) for v in filters.values()):
            raise ValidationError("filter", "give at least one filter (a name prefix, user, queue, state ...)",
                                  "REQUIRED")
        if not 1 <= limit <= MAX_CANCEL_MATCHING:
            raise ValidationError("limit", f"must be from 1 to {MAX_CANCEL_MATCHING}", "OUT_OF_RANGE")
        queue = filters.get("queue")
        if queues is not None and queue is not None and queue not in queues:
            raise Forbidden(f"this token acts only on jobs of its queues ({', '.join(queues)}); not of {queue!r}")
        if queue is not None and self.queue(queue) is None:
            # (found by exploring: a misspelt queue matched nothing, and was told so as if
            # the queue had nothing to cancel; a queue with live jobs cannot be deleted)
            raise NotFound(f"no queue {queue[:128]!r} (muster queue list)")
        if filters.get("group") is not None and filters.get("user") is None:
            # (found by exploring: `job cancel --group etl` cancelled every user's etl group)
            filters = {**filters, "user": by}

        def wanted(j: Job) -> bool:
            if action == "hold":
                return j.state is JobState.QUEUED and not j.hold and not j.preempting
            if action == "release":
                return bool(j.hold) and not j.state.terminal
            return not j.state.terminal

        live = list(self.state.jobs.values())
        found: list[Job] = []
        outside = 0
        for start in range(0, len(live), CANCEL_SCAN_CHUNK):
            if start:
                await asyncio.sleep(0)  # half a million live jobs: let the scheduler and the API run
            for j in live[start:start + CANCEL_SCAN_CHUNK]:
                if wanted(j) and matches(j, **filters):
                    if queues is None or j.spec.queue in queues:
                        found.append(j)
                    else:
                        outside += 1
        found.sort(key=lambda j: (j.submitted_at, j.id))
        ids = [j.id for j in found[:limit]]
        assert self.store is not None
        js = self.store.js

        def command(job_id: str) -> Command:
            if action == "cancel":
                return Command(kind="cancel", job_id=job_id, by=by, reason=reason)
            return Command(kind="update", job_id=job_id, by=by, reason=reason, hold=action == "hold")

        for start in range(0, len(ids), CANCEL_PUBLISH_CHUNK):
            cmds = [command(i) for i in ids[start:start + CANCEL_PUBLISH_CHUNK]]
            try:
                await asyncio.gather(*(js.publish(f"{subjects.CMDS_PREFIX}.{c.kind}", encode(c)) for c in cmds))
            except Exception as exc:  # noqa: BLE001
                raise StoreError(f"{action}: {exc} (the first {start} were asked for; run it again)") from exc
        return Matched(ids, outside)

    async def requeue(self, job_id: str, by: str, reason: str = "", hold: bool = False,
                      queues: list[str] | None = None) -> None:
        """Ask the leader to stop a placed or running job's try and queue the job again
        (the try is not counted against its attempts), held when `hold`. Raises NotFound,
        Forbidden (`queues`, as cancel), ValidationError (NOT_RUNNING; ALREADY_FINISHED)."""
        reason = validate_reason(reason)
        job = self._live_job_for(job_id, queues)
        if job.state not in (JobState.PLACED, JobState.RUNNING):
            raise ValidationError("id", f"job {job_id} is {job.state.value}: only a placed or running job is "
                                        "requeued", "NOT_RUNNING")
        stopping = next((t.stop_kind for t in job.current_tasks() if not t.state.terminal and t.stop_kind), "")
        if stopping and not hold:
            # Its try ends as that stop says (a preempted job is queued again by it): a
            # requeue would be taken and dropped (found by exploring).
            raise ValidationError("id", f"job {job_id}'s try is being stopped already ({stopping}): it ends as "
                                        "that stop says; requeue it held to keep it from being placed again",
                                  "ALREADY_STOPPING")
        await self._command(Command(kind="requeue", job_id=job_id, by=by, reason=reason, hold=hold))

    async def live_output(self, host_id: str, attempt_id: str, timeout_s: float = 2.0) -> str | None:
        """A running attempt's output so far, asked of its host's agent; None when the agent
        does not answer in time (gone, cut off, or an agent from before this request) or
        runs no such attempt. A caller asks at most MAX_LIVE_OUTPUTS agents per request."""
        reply = await self.live_output_reply(host_id, attempt_id, timeout_s)
        return reply.output_tail if reply is not None else None

    async def live_output_reply(self, host_id: str, attempt_id: str, timeout_s: float = 2.0) -> OutputReply | None:
        """The agent's answer for a running attempt (its output's tail, and how many bytes it
        wrote in all), or None (as `live_output`)."""
        assert self.store is not None
        try:
            msg = await self.store.nc.request(subjects.output_subject(host_id),
                                              encode(OutputRequest(attempt_id=attempt_id)), timeout=timeout_s)
            reply = decode(OutputReply, msg.data)
        except Exception as exc:  # noqa: BLE001 - no responders, a timeout, a reply that does not decode
            log.info("no output from %s for %s: %s", host_id, attempt_id, exc)
            return None
        return reply if reply.attempt_id == attempt_id and reply.running else None
