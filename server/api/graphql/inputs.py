"""GraphQL input types and enums."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import strawberry

from server.api.graphql.context import epoch
from server.api.graphql.conversion import plan_once
from server.api.graphql.types import Dependency, JobState
from server.timefmt import DRAIN_DEADLINE_S
from wire.errors import ValidationError


@strawberry.enum(description="What happens to a running attempt when its host is cut off.")
class OnDisconnect(enum.Enum):
    STOP = "STOP"
    KEEP_RUNNING = "KEEP_RUNNING"


# A state no job is in: what `state` and `filter.state` with nothing in common select.
NO_STATE = "-"


@plan_once
@strawberry.input
class SubmitJobInput:
    name: str
    command: list[str]
    gpus: int = 0
    gpu_model: str | None = strawberry.field(default=None, description="One GPU model (shorthand of gpuModels).")
    gpu_models: list[str] | None = strawberry.field(
        default=None, description="GPU models the job may run on, any of them (not with gpuModel).")
    same_model: bool = strawberry.field(
        default=False, description="Gang tasks must all run on one model of gpuModels.")
    gpu_share: int = strawberry.field(
        default=0, description="A share of ONE GPU, in thousandths (1-999; gpus 0). Shared, not isolated: "
                               "several tasks run on that GPU (under CUDA MPS limits where MPS runs).")
    gpu_memory_mb: int = strawberry.field(
        default=0, description="GPU memory a gpuShare task needs on its GPU (0: none reserved).")
    mig_profile: str | None = strawberry.field(
        default=None, description="One MIG instance of this profile, e.g. 1g.10gb (gpus 0, no gpuShare).")
    cpus: float = 1.0
    memory_mb: int = 512
    priority: int = 0
    max_attempts: int = 3
    cwd: str | None = None
    env: strawberry.scalars.JSON | None = None
    replicas: int = strawberry.field(default=1, description="Gang size: tasks placed all at once or not at all.")
    same_rack: bool = strawberry.field(default=False, description="Gang tasks must all share one `rack` label.")
    on_disconnect: OnDisconnect = OnDisconnect.STOP
    replace_after: float = strawberry.field(
        default=0.0, description="KEEP_RUNNING only: seconds to wait after the host is lost before replacing the work."
    )
    queue: str | None = strawberry.field(
        default=None, description="The queue to run in (the token must be bound to it, if bound to any). Default: "
                                  "`default`, or the first of the token's queues when they leave `default` out.")
    time_limit_seconds: float = strawberry.field(
        default=0.0, description="Stop the job after this long running (SIGTERM, grace, SIGKILL); it ends TIMEOUT. "
                                 "0: the queue's default.")
    host_labels: strawberry.scalars.JSON | None = strawberry.field(
        default=None, description="Labels a host must have to run the job, as a map of label to value (at most "
                                  "16; all must match the host's, e.g. {\"zone\": \"eu-1\", \"net\": \"ib\"}).")
    exclude_hosts: list[str] | None = strawberry.field(
        default=None, description="Hosts it must not run on, by id (at most 128), as Slurm's --exclude: a host "
                                  "the submitter finds at fault that the operators have not cordoned.")
    held: bool = strawberry.field(default=False, description="Submit it held: it stays QUEUED, not placed, until "
                                                             "released (updateJob).")
    depends_on: list[strawberry.ID] | None = strawberry.field(
        default=None, description="Jobs it runs after (at most 32): it stays QUEUED, not placed, until they end "
                                  "as `dependency` says.")
    dependency: Dependency = Dependency.AFTER_OK
    group: str | None = strawberry.field(
        default=None, description="A group this job shares with other jobs of its user's (an array, a job name): "
        "with groupLimit, at most that many of them are placed or running at once.")
    group_limit: int = strawberry.field(
        default=0, description="How many jobs of the group may be placed or running at once (0: no limit): an "
        "array's throttle; 1 with the job's name as the group is Slurm's singleton.")
    retry_failures: int = strawberry.field(
        default=0, description="How many times a try that failed (its own code exited nonzero) is tried again, "
        "after a backoff (0: never; at most 100). A gang's try is retried as a whole. These tries do not count "
        "against maxAttempts, which counts the infrastructure's failures.")
    retry_exit_codes: list[int] | None = strawberry.field(
        default=None, description="With retryFailures: only tries whose failed tasks exited with one of these "
        "codes are retried (at most 16; default: any).")
    retry_timeouts: bool = strawberry.field(
        default=False, description="With retryFailures: a try stopped at its time limit is retried too (counted "
        "with the failures) instead of ending the job TIMEOUT.")
    retry_delay_seconds: float = strawberry.field(
        default=0.0, description="With retryFailures: the wait before the first retry of a failed try, doubled "
        "for each retry after it, at most an hour (up to 3600; 0: the default backoff, 1, 2, 4 ... s, at most a "
        "minute). For failures that take time to clear; a retry after a lost host keeps the default.")
    checkpoints: bool = strawberry.field(
        default=False, description="The job saves its state when told to stop (SIGTERM, within its queue's grace: "
        "MUSTER_PREEMPT_DEADLINE) and its next try resumes from it. Preemption then counts a stop as losing "
        "the grace, not the try's work so far, and stops such jobs first among equals.")
    begin_at: dt.datetime | None = strawberry.field(
        default=None, description="Not placed before this time (Slurm's --begin); until then it is QUEUED and "
        "says so in its pendingReasons. Default, or a time past: at once.")


@strawberry.input
class HostActionInput:
    id: strawberry.ID
    reason: str = ""


@strawberry.input
class ClearGpuFaultsInput:
    id: strawberry.ID
    reason: str
    gpus: list[int] | None = strawberry.field(
        default=None, description="The GPU indices to clear; null: every GPU the host reports faulted.")


@strawberry.input(description="The operator's labels of a host to set and to remove (admin).")
class SetHostLabelsInput:
    id: strawberry.ID
    labels: strawberry.scalars.JSON | None = strawberry.field(
        default=None, description="Labels to set, a map of label to value ({\"team\": \"vision\"}): they override "
                                  "what the host's agent reports, and are the only source of the keys only operators "
                                  "set (Cluster.operatorLabelKeys). A host has at most 32 of the operator's.")
    remove: list[str] | None = strawberry.field(
        default=None, description="Keys of the operator's labels to remove: the host then has the agent's value of "
                                  "such a key again, unless only operators set it (then none).")
    reason: str = ""


@strawberry.input
class DrainHostInput:
    id: strawberry.ID
    reason: str
    deadline_seconds: float = strawberry.field(
        default=DRAIN_DEADLINE_S, description="What still runs this long after the drain begins is stopped (and "
                                              "requeued elsewhere).")
    at: dt.datetime | None = strawberry.field(
        default=None, description="When the drain begins (a maintenance window): until then the host takes only "
        "jobs whose time limit (or their queue's default) ends them by the drain's deadline; nothing placed "
        "after it was scheduled is stopped by it. Default, or a time at most 5 minutes past: now (further past "
        "is refused; the deadline is reckoned from the time given, so hosts drained one by one from one start "
        "share one deadline). At most 90 days ahead.")

@strawberry.input(description="Hosts matching every given field.")
class HostFilter:
    health: list[str] | None = strawberry.field(default=None, description="HEALTHY, SUSPECT and/or LOST.")
    rack: str | None = None
    zone: str | None = None
    gpu_model: str | None = strawberry.field(default=None, description="Hosts with at least one GPU of this model.")
    label: str | None = strawberry.field(default=None, description="`key=value`, or `key` for any value.")
    cordoned: bool | None = None
    draining: bool | None = strawberry.field(default=None, description="Hosts whose drain has begun (true) or not.")
    drain_scheduled: bool | None = strawberry.field(
        default=None, description="Hosts with a drain scheduled ahead that has not begun (true) or without.")
    gpu_faults: bool | None = strawberry.field(
        default=None, description="Hosts with (true) or without (false) a faulted GPU.")
    pressure: bool | None = strawberry.field(
        default=None, description="Hosts whose agent asks for no new work (true: see Host.pressure) or not.")
    search: str | None = strawberry.field(default=None, description="Part of the host id (any case).")


@strawberry.enum
class HostSort(enum.Enum):
    ID_ASC = "ID_ASC"
    ID_DESC = "ID_DESC"
    HEALTH = "HEALTH"  # LOST, then SUSPECT, then HEALTHY
    GPUS_FREE_DESC = "GPUS_FREE_DESC"
    LAST_SEEN_DESC = "LAST_SEEN_DESC"


@strawberry.input(description="Jobs matching every given field.")
class JobFilter:
    state: list[JobState] | None = None
    user: str | None = None
    name_prefix: str | None = None
    priority: int | None = None
    submitted_after: dt.datetime | None = strawberry.field(default=None, description="Inclusive.")
    submitted_before: dt.datetime | None = strawberry.field(default=None, description="Exclusive.")
    queue: str | None = None
    group: str | None = strawberry.field(default=None, description="The job's group: an array's (its name), or "
                                                                   "the one given at submission.")

    def filters(self, states: list[str] | None = None) -> dict[str, Any]:
        """The filters as views.jobs.matches and History.list_jobs name them; `states`
        (from the query's own `state` argument) and this filter's `state`, when both are
        given, are both met: a job in one of each (as every other filter adds to them)."""
        after, before = epoch(self.submitted_after), epoch(self.submitted_before)  # one may name no offset: UTC
        if after is not None and before is not None and before < after:
            raise ValidationError("submittedBefore", "submittedBefore is before submittedAfter: no period",
                                  "OUT_OF_RANGE")
        mine = [s.value for s in self.state or ()]
        if states and mine:
            states = [s for s in states if s in mine] or [NO_STATE]
        else:
            states = list(states or mine)
        return dict(state=states or None, user=self.user, name=self.name_prefix, priority=self.priority,
                    submitted_after=after, submitted_before=before,
                    queue=self.queue, group=self.group)


@strawberry.input(description="A change to a job that has not ended; only the fields given change.")
class UpdateJobInput:
    id: strawberry.ID
    priority: int | None = strawberry.field(default=None, description="-1000 to 1000: its place in its queue's "
                                                                       "order, and as a preemption victim.")
    held: bool | None = strawberry.field(default=None, description="true holds a QUEUED job (it is not placed "
                                                                   "until released); false releases it.")
    time_limit_seconds: float | None = strawberry.field(
        default=None, description="A new time limit, in seconds: the job's, and its running try's (one that has run "
                                  "longer is stopped at once, and ends TIMEOUT); 0: none. Only an admin may raise a "
                                  "limit, set one above the queue's maximum or remove it (as Slurm's scontrol update "
                                  "TimeLimit, UNLIMITED), which then holds for every try of the job.")
    reason: str = strawberry.field(default="", description="Why (shown with a hold).")


@strawberry.input(description="A queue's quota of one resource.")
class QueueResourceInput:
    resource: str = strawberry.field(description="\"gpu:<model>\", \"cpu\" or \"memory_mb\".")
    nominal: float
    borrowing_limit: float | None = strawberry.field(default=None, description="null: no limit.")
    lending_limit: float | None = strawberry.field(default=None, description="null: lends all of its nominal.")


@strawberry.input(description="An advance reservation: hosts set aside for some queues' jobs over a time window.")
class AdvanceReservationInput:
    name: str
    hosts: list[strawberry.ID] = strawberry.field(description="The hosts to set aside (at most 4,096).")
    queues: list[str] = strawberry.field(default_factory=list,
                                         description="The queues whose jobs may use them while it is open.")
    users: list[str] = strawberry.field(default_factory=list,
                                        description="The users whose jobs (of any queue) may use them too; queues, "
                                                    "users or both must be named.")
    ends_at: dt.datetime = strawberry.field(description="When the hosts go back to every queue (UTC unless an "
                                                        "offset is given).")
    starts_at: dt.datetime | None = strawberry.field(
        default=None, description="When it opens; default, or a time at most 5 minutes past: now (further past is "
                                  "refused). It starts and ends at most 365 days ahead, and lasts at most 90 days.")
    description: str = ""


@strawberry.input(description="An advance reservation's fields to change: only those given change.")
class AdvanceReservationUpdate:
    name: str
    ends_at: dt.datetime | None = None
    starts_at: dt.datetime | None = strawberry.field(
        default=None, description="A new start (at most 5 minutes past: now; further past is refused); an open "
                                  "reservation given none keeps its own.")
    hosts: list[strawberry.ID] | None = None
    queues: list[str] | None = None
    users: list[str] | None = None
    description: str | None = None


@strawberry.input(description="A queue's settings. On update, only the fields given change (`quota`, when "
                               "given, replaces the whole quota).")
class QueueInput:
    name: str
    description: str | None = None
    cohort: str | None = strawberry.field(default=None, description="On update: \"\" leaves the cohort.")
    weight: float | None = None
    quota: list[QueueResourceInput] | None = None
    preempt_within: bool | None = strawberry.field(default=None, description="Priority preemption in the queue.")
    reclaim: bool | None = strawberry.field(default=None, description="Take back what others borrowed.")
    fair_share_preemption: bool | None = None
    fair_share_users: bool | None = strawberry.field(
        default=None, description="Fair share between the queue's users: at equal priority, the user whose jobs of "
                                  "the queue hold least (GPUs, then jobs running; with past use, decayed) goes next.")
    preempt_grace_seconds: float | None = None
    min_runtime_seconds: float | None = None
    max_preemptions: int | None = None
    default_time_limit_seconds: float | None = None
    max_time_limit_seconds: float | None = None
    max_gpus_per_user: float | None = strawberry.field(
        default=None, description="The most GPUs one user's jobs of the queue hold at once (0: no limit).")
    max_submitted_jobs: int | None = strawberry.field(
        default=None, description="The most jobs not ended (queued, held, placed, running) the queue takes (0: no "
                                  "limit); a submission past it is refused (JOB_LIMIT).")
    max_submitted_jobs_per_user: int | None = strawberry.field(
        default=None, description="The same, for one user's jobs of the queue (0: no limit).")
    max_running_jobs_per_user: int | None = strawberry.field(
        default=None, description="The most jobs of one user's in the queue placed or running at once (0: no "
                                  "limit); the others wait.")
    host_labels: strawberry.scalars.JSON | None = strawberry.field(
        default=None, description="Labels (a map) every host that runs the queue's jobs has: added to each job's "
                                  "hostLabels when it is placed, as the queue has them then (a job asking for "
                                  "another value of one is refused at submission); {} for none. Placed and "
                                  "running jobs stay where they are.")


@strawberry.enum
class JobSort(enum.Enum):
    SUBMITTED_AT_DESC = "-submitted_at"
    SUBMITTED_AT_ASC = "submitted_at"
    PRIORITY_DESC = "-priority"
    PRIORITY_ASC = "priority"


