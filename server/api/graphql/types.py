"""The GraphQL object types: views over the read models (server.views) and the
wire records, never storage models themselves."""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import time
from dataclasses import dataclass

import strawberry
from strawberry.types import Info

from server.api.graphql.context import muster, ts
from server.api.graphql.errors import UserError
from server.api.reads import reads_for
from server.operations.jobs import MAX_LIVE_OUTPUTS
from server.replica import Muster
from server.scheduling import advance
from server.views.hosts import FleetSummary, GpuDevice, GpuUse, HostRow
from server.views.jobs import reason_detail, sharing, time_limit
from server.views.queues import QueueRow as QueueRowModel
from server.views.queues import fairness as queue_fairness
from server.views.queues import queue_users
from wire.messages import AdvanceReservation as AdvanceReservationModel
from wire.messages import Attempt as AttemptModel
from wire.messages import AttemptState as AttemptStateEnum
from wire.messages import Job as JobModel
from wire.messages import JobState as JobStateEnum
from wire.messages import OutputReply

# The wire's enum is the GraphQL enum (strawberry.enum registers the class itself).
strawberry.enum(JobStateEnum, name="JobState")
JobState = JobStateEnum


@strawberry.enum(description="When a job with dependsOn may run: AFTER_OK once every job it runs after "
                             "SUCCEEDED (one that ends otherwise cancels it), AFTER_ANY once every one of "
                             "them ended, whatever its end, AFTER_NOT_OK once every one of them ended otherwise "
                             "than SUCCEEDED (FAILED, CANCELLED, TIMEOUT; one that SUCCEEDED cancels it: a job "
                             "that cleans up or reports a failure), as Slurm's afterok, afterany, afternotok.")
class Dependency(enum.Enum):
    AFTER_OK = "AFTER_OK"
    AFTER_ANY = "AFTER_ANY"
    AFTER_NOT_OK = "AFTER_NOT_OK"


@strawberry.type
class Label:
    key: str
    value: str


@strawberry.type
class PageInfo:
    has_next_page: bool
    end_cursor: str | None


@strawberry.type(description="A MIG instance: a device of its own, scheduled whole.")
class MigInstance:
    uuid: str = strawberry.field(description="CUDA_VISIBLE_DEVICES=MIG-<uuid> for the task on it.")
    profile: str
    memory_mb: int
    allocated: bool


@strawberry.type(description="One GPU of a host and what is allocated of it.")
class HostGpu:
    index: int
    model: str
    memory_mb: int
    uuid: str
    healthy: bool
    share_allocated: int = strawberry.field(
        description="Thousandths of the GPU allocated: 1000 when a task holds it whole, else the sum of the "
                    "shares of the tasks sharing it.")
    mem_allocated_mb: int = strawberry.field(description="GPU memory given to the tasks sharing it.")
    tasks: int
    sharing: str | None = strawberry.field(
        description="\"shared, not isolated\" when tasks share it, \"MIG instance\" in MIG mode, else null.")
    mig_instances: list[MigInstance]
    fault: str | None = strawberry.field(
        description="What faulted (an Xid, uncorrectable ECC errors, the GPU unreachable) when it is not healthy; "
                    "cleared by clearGpuFaults or the agent's restart.")
    util_pct: float | None = strawberry.field(
        default=None, description="Utilization in the latest heartbeat, in percent; null when its agent could not "
                                  "read it (NVML gives none for a GPU in MIG mode; a failed or hung call).")
    mem_used_mb: int | None = strawberry.field(
        default=None, description="GPU memory in use in the latest heartbeat; null when not read (as utilPct).")
    temp_c: float | None = strawberry.field(
        default=None, description="Temperature in the latest heartbeat, in °C; null when not read (as utilPct).")
    power_w: float | None = strawberry.field(
        default=None, description="Power draw in the latest heartbeat, in watts; null when not read (as utilPct).")

    @staticmethod
    def of(d: GpuDevice) -> HostGpu:
        shared = not d.whole and d.share_allocated > 0
        return HostGpu(index=d.index, model=d.model, memory_mb=d.memory_mb, uuid=d.uuid, healthy=d.healthy,
                       share_allocated=d.share_allocated, mem_allocated_mb=d.mem_allocated_mb, tasks=d.tasks,
                       sharing=sharing(int(shared), d.mig_mode),
                       mig_instances=[MigInstance(uuid=m.uuid, profile=m.profile, memory_mb=m.memory_mb,
                                                  allocated=m.allocated) for m in d.mig], fault=d.fault,
                       util_pct=d.util_pct, mem_used_mb=d.mem_used_mb, temp_c=d.temp_c, power_w=d.power_w)


@strawberry.type
class Host:
    id: strawberry.ID
    health: str
    cordoned: bool
    draining: bool
    simulated: bool
    labels: list[Label] = strawberry.field(description=(
        "The host's labels as placement, queues' and jobs' hostLabels and failure domains (rack, zone) read them: "
        "its agent's (--labels), but for the keys only operators set (Cluster.operatorLabelKeys), and the "
        "operator's (operatorLabels), which override the agent's."))
    gpus: int
    gpu_model: str
    gpus_allocated: int
    gpus_unhealthy: int
    gpu_util_pct: float | None = strawberry.field(description=(
        "The mean utilization of its GPUs in its latest heartbeat, in percent, over those whose utilization its "
        "agent could read (see HostGpu.utilPct); null without GPUs or when none was read."))
    cpus: int
    cpu_pct: float
    memory_mb: int
    mem_used_mb: int
    last_seen: dt.datetime | None
    tasks: int
    isolated: bool | None = strawberry.field(
        default=None, description="Whether the host's agent confines tasks (a cgroup with a memory limit, and "
        "a user other than the agent's and root); false: NOT ISOLATED; null: the agent does not say")
    isolation: str = strawberry.field(default="", description="How the host's agent isolates tasks, in words")
    fences: int = strawberry.field(
        default=0, description="Times the host's agent fenced itself since it started (no heartbeat stored "
        "for its fence delay: attempts frozen, then continued if its key held, else stopped)")
    last_fence_seconds: float = strawberry.field(
        default=0.0, description="How long the last fence lasted, from the freeze to a heartbeat stored again")
    fence_continued: int = strawberry.field(
        default=0, description="Attempts frozen by those fences and continued (the host's key held)")
    fence_stopped: int = strawberry.field(
        default=0, description="Attempts frozen by those fences and stopped (the key changed, or no answer "
        "before the deadline)")
    leaving: bool = strawberry.field(
        default=False, description="The host's agent is shutting down: it starts nothing new and nothing is "
        "placed on it (until it starts again, or its heartbeat expires and the host is lost)")
    pressure: str = strawberry.field(
        default="", description="Why the host's agent asks for no new work now, empty while it may: its disk nearly "
        "full (its --min-free-disk-mb), or a try it could not start for want of the host's resources in the last "
        "minute. Its work runs on; nothing new is placed there (as Kubernetes' DiskPressure).")
    drain_at: dt.datetime | None = strawberry.field(
        default=None, description="When a drain scheduled ahead begins (a maintenance window; until then the host "
        "takes only jobs that its deadline would not stop); null: none, or it has begun")
    drain_deadline: dt.datetime | None = strawberry.field(
        default=None, description="When what still runs on the draining host is stopped (a drain begun or ahead)")
    operator_labels: list[Label] = strawberry.field(
        default_factory=list, description="The labels an admin set on the host (setHostLabels, muster host label): "
        "each is in labels as set here.")
    agent_labels: list[Label] = strawberry.field(
        default_factory=list, description="The labels the host's agent reports (its --labels), as it reports them. "
        "Its value of a key only operators set is ignored, and one the operator set too is overridden: labels has "
        "the operator's. An agent's credentials are on its host: what it reports is the host's word, not the "
        "operator's.")

    @strawberry.field(description="The queued job this host is held for (a reservation: nothing else is placed "
                                  "here unless its time limit ends it before that job could start); null: none.")
    def reserved_for(self, info: Info) -> strawberry.ID | None:
        job = muster(info).jobs.reserved_on(str(self.id))
        return strawberry.ID(job.id) if job is not None else None

    @strawberry.field(description="The advance reservations not over that set this host aside for some queues, "
                                  "soonest first.")
    def set_aside(self, info: Info) -> list[AdvanceReservation]:
        state = muster(info).state
        return [AdvanceReservation(_r=r) for r in advance.on_host(state.advance.values(), str(self.id), time.time())]

    @strawberry.field(description="Each GPU with what placement holds of it: whole, shares (shared, not "
                                  "isolated) or MIG instances.")
    def gpu_devices(self, info: Info) -> list[HostGpu]:
        return [HostGpu.of(d) for d in muster(info).hosts.devices(str(self.id))]

    @staticmethod
    def from_row(r: HostRow) -> Host:
        return Host(
            id=strawberry.ID(r.id), health=r.health, cordoned=r.cordoned, draining=r.draining,
            simulated=r.simulated,
            labels=[Label(key=k, value=val) for k, val in sorted(r.labels.items())],
            gpus=r.gpus, gpu_model=r.gpu_model, gpus_allocated=r.gpus_allocated,
            gpus_unhealthy=r.gpus_unhealthy, gpu_util_pct=r.gpu_util_pct, cpus=r.cpus,
            cpu_pct=r.cpu_pct, memory_mb=r.memory_mb, mem_used_mb=r.mem_used_mb,
            last_seen=ts(r.last_seen), tasks=r.tasks, isolated=r.isolated, isolation=r.isolation,
            fences=r.fences, last_fence_seconds=r.last_fence_s, fence_continued=r.fence_continued,
            fence_stopped=r.fence_stopped, leaving=r.leaving and r.present,
            pressure=r.pressure if r.present else "",
            drain_at=ts(r.drain_at) if r.drain_at else None,
            drain_deadline=ts(r.drain_deadline) if r.drain_deadline else None,
            operator_labels=[Label(key=k, value=val) for k, val in sorted(r.operator_labels.items())],
            agent_labels=[Label(key=k, value=val) for k, val in sorted(r.agent_labels.items())],
        )

    @staticmethod
    def of(info: Info, host_id: str) -> Host | None:
        """The host's row in the read model, as a GraphQL Host (None if never heard of)."""
        r = muster(info).hosts.row(host_id, time.time())
        return Host.from_row(r) if r is not None else None

    @staticmethod
    def unknown(host_id: str) -> Host:
        return Host(
            id=strawberry.ID(host_id), health="LOST", cordoned=False, draining=False, simulated=False, labels=[],
            gpus=0, gpu_model="-", gpus_allocated=0, gpus_unhealthy=0, gpu_util_pct=None, cpus=0,
            cpu_pct=0.0, memory_mb=0, mem_used_mb=0, last_seen=None, tasks=0,
        )


@strawberry.type
class HostEdge:
    cursor: str
    node: Host


@strawberry.type(description="A running job's try whose GPUs have all been idle (under 5 % at every heartbeat) "
                              "for its agent's --gpu-idle-after: it holds GPUs it does not use.")
class IdleGpus:
    job: Job
    attempt: Attempt
    host: strawberry.ID
    since: dt.datetime = strawberry.field(description="Since when, by its agent's clock.")


@strawberry.type
class HostConnection:
    total_count: int
    edges: list[HostEdge]
    page_info: PageInfo


@strawberry.type
class Attempt:
    _m: strawberry.Private[AttemptModel]
    _job_id: strawberry.Private[str | None] = None

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self._m.id)

    @strawberry.field(description="The job this attempt belongs to.")
    def job_id(self) -> strawberry.ID | None:
        return strawberry.ID(self._job_id) if self._job_id else None

    @strawberry.field
    def number(self) -> int:
        return self._m.number

    @strawberry.field(description="Index of the task within a gang (0 for single jobs).")
    def task(self) -> int:
        return self._m.task

    @strawberry.field
    def state(self) -> str:
        return self._m.state.value

    @strawberry.field
    def host(self, info: Info) -> Host:
        return Host.of(info, self._m.host_id) or Host.unknown(self._m.host_id)

    @strawberry.field(description="The GPUs it runs on (for a share: the one GPU it shares).")
    def gpu_indices(self) -> list[int]:
        return self._m.gpu_indices

    @strawberry.field(description="Thousandths of gpuIndices[0] it holds (0: whole GPUs).")
    def gpu_share(self) -> int:
        return self._m.gpu_share

    @strawberry.field(description="MIG instances (UUIDs) it runs on.")
    def mig_instances(self) -> list[str]:
        return self._m.mig

    @strawberry.field(description="null for whole GPUs, \"shared, not isolated\" for a share, \"MIG instance\".")
    def gpu_sharing(self) -> str | None:
        return sharing(self._m.gpu_share, bool(self._m.mig))

    @strawberry.field
    def exit_code(self) -> int | None:
        return self._m.exit_code

    @strawberry.field
    def output_tail(self) -> str:
        return self._m.output_tail

    @strawberry.field(description="A running attempt's output so far (stdout and stderr, the last 4 KB), asked of "
                                  "its host's agent: null when the attempt is not RUNNING, the agent does not "
                                  f"answer within 2 s, or the request has already asked for {MAX_LIVE_OUTPUTS}. "
                                  "outputTail holds the output once the attempt has ended.")
    async def live_output(self, info: Info) -> str | None:
        reply = await self._live(info)
        return reply.output_tail if reply is not None else None

    @strawberry.field(description="A running attempt's GPUs' utilisation in its host's latest heartbeat, in "
                                  "percent (their mean; for a share of a GPU, the whole GPU's, which its other "
                                  "tasks share): is it using what it holds? null when it is not running, runs "
                                  "on a MIG instance (NVML reports no utilisation per instance), holds no GPU, "
                                  "or its agent could not read the utilisation of one of its GPUs.")
    def gpu_util_pct(self, info: Info) -> float | None:
        use = self._gpu_use(info)
        return round(use.util_pct, 1) if use is not None and use.util_pct is not None else None

    @strawberry.field(description="Its GPUs' mean utilisation over its run, in percent, as its agent sampled it at "
                                  "each heartbeat and reported at its end (for a share, the whole GPU's): null "
                                  "while it runs (see gpuUtilPct), on a MIG instance, without GPUs, for a run "
                                  "shorter than a heartbeat interval, or from an older agent.")
    def gpu_util_avg_pct(self) -> float | None:
        return self._m.gpu_util_pct

    @strawberry.field(description="A running attempt's GPUs' memory in use in its host's latest heartbeat, in MB "
                                  "(theirs in all; for a share, the whole GPU's); null as gpuUtilPct (here, the "
                                  "memory in use not read).")
    def gpu_mem_used_mb(self, info: Info) -> int | None:
        use = self._gpu_use(info)
        return use.mem_used_mb if use is not None else None

    @strawberry.field(description="Since when a running attempt's GPUs have all been idle (under 5 % at every "
                                  "heartbeat), once that has lasted its agent's --gpu-idle-after (30 minutes by "
                                  "default; the agent's clock): it holds GPUs it does not use (alert "
                                  "job.gpus_idle). null otherwise.")
    def gpu_idle_since(self, info: Info) -> dt.datetime | None:
        a = self._m
        if a.state is not AttemptStateEnum.RUNNING:
            return None
        return ts(muster(info).state.gpu_idle_since(a.host_id, a.id))

    def _gpu_use(self, info: Info) -> GpuUse | None:
        a = self._m
        if a.state is not AttemptStateEnum.RUNNING or a.mig:
            return None
        return muster(info).hosts.gpu_use(a.host_id, a.gpu_indices)

    @strawberry.field(description="With liveOutput: how many bytes the attempt's process has written in all, the "
                                  "output being their last ones (null with liveOutput, or from an agent that does "
                                  "not count them). Two looks tell exactly what was written between them (muster "
                                  "job logs -f).")
    async def live_output_bytes(self, info: Info) -> float | None:
        reply = await self._live(info)
        return float(reply.written) if reply is not None and reply.written else None

    async def _live(self, info: Info) -> OutputReply | None:
        """The agent's answer for this attempt, asked once per request however many of its
        fields are read."""
        if self._m.state is not AttemptStateEnum.RUNNING:
            return None
        # One request asks at most MAX_LIVE_OUTPUTS agents: a page of running jobs cannot
        # turn one query into a request to every agent of the cluster.
        asked: dict[str, asyncio.Task[OutputReply | None]] = info.context.setdefault("live_outputs", {})
        if self._m.id not in asked:
            if len(asked) >= MAX_LIVE_OUTPUTS:
                return None
            asked[self._m.id] = asyncio.ensure_future(muster(info).live_output_reply(self._m.host_id, self._m.id))
        return await asked[self._m.id]

    @strawberry.field
    def term(self) -> int:
        return self._m.term

    @strawberry.field
    def placed_at(self) -> dt.datetime | None:
        return ts(self._m.placed_at)

    @strawberry.field
    def started_at(self) -> dt.datetime | None:
        return ts(self._m.started_at)

    @strawberry.field
    def finished_at(self) -> dt.datetime | None:
        return ts(self._m.finished_at)

    @strawberry.field(description="Why the attempt ended (or is being stopped): a preemption names the job it made "
                                  "room for; a time limit says so; a GPU fault names the GPU and the fault.")
    def reason(self) -> str:
        return self._m.reason

    @strawberry.field(description="What stopped it, when the control plane or its agent did: preempt, timeout, "
                                  "gpu-fault, cancel, drain, requeue, shutdown (the agent's) or host (its host could "
                                  "not start it); empty otherwise. A try stopped by preempt, drain, requeue, shutdown "
                                  "or host does not count against maxAttempts.")
    def stop_kind(self) -> str:
        return self._m.stop_kind

    @strawberry.field(description="GPU model of the GPUs it got.")
    def gpu_model(self) -> str:
        return self._m.gpu_model

    @strawberry.field(description="The time limit it ran under (0: none).")
    def time_limit_seconds(self) -> float:
        return self._m.time_limit_s


@strawberry.type
class PendingReason:
    reason: str
    hosts: int = strawberry.field(description="Hosts rejecting the job for this reason (0 for queue reasons).")
    kind: str = strawberry.field(default="host", description="`host`: a placement check; `queue`: the queue's "
                                                            "quota, cohort, fair share, a preemption or a gang.")
    detail: str = strawberry.field(default="", description="The figures behind a queue reason; for a host reason, "
                                                           "whether those hosts could not take the job even idle.")


@strawberry.type(description="Hosts held for a queued job so that smaller jobs do not keep it waiting; jobs "
                             "whose time limit ends them before `start` may use them meanwhile (backfill).")
class Reservation:
    hosts: list[str] = strawberry.field(description="The hosts held (the first 16).")
    host_count: int
    start: dt.datetime | None = strawberry.field(description="When the job could start there, from the time "
                                                             "limits of the tasks there; null: unknown (a task "
                                                             "there has no time limit).")
    since: dt.datetime | None


@strawberry.type
class Job:
    _m: strawberry.Private[JobModel]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self._m.id)

    @strawberry.field
    def name(self) -> str:
        return self._m.spec.name

    @strawberry.field
    def state(self) -> JobState:
        return self._m.state

    @strawberry.field
    def user(self) -> str:
        return self._m.spec.user

    @strawberry.field
    def command(self) -> list[str]:
        return self._m.spec.command

    @strawberry.field
    def gpus(self) -> int:
        return self._m.spec.gpus

    @strawberry.field(description="The one GPU model asked for (gpuModel), or null.")
    def gpu_model(self) -> str | None:
        return self._m.spec.gpu_model

    @strawberry.field(description="Every GPU model the job accepts (gpuModel or gpuModels); empty for any.")
    def gpu_models(self) -> list[str]:
        return sorted(self._m.spec.models() or ())

    @strawberry.field(description="Gang tasks all on one model of gpuModels.")
    def same_model(self) -> bool:
        return self._m.spec.same_model

    @strawberry.field(description="Thousandths of one GPU asked for (0: whole GPUs or none).")
    def gpu_share(self) -> int:
        return self._m.spec.gpu_share

    @strawberry.field(description="GPU memory a gpuShare task needs on its GPU.")
    def gpu_memory_mb(self) -> int:
        return self._m.spec.gpu_memory_mb

    @strawberry.field(description="The MIG profile asked for, or null.")
    def mig_profile(self) -> str | None:
        return self._m.spec.mig_profile

    @strawberry.field(description="How the job's GPU is shared: null for whole GPUs (or none), \"shared, not "
                                  "isolated\" for a gpuShare, \"MIG instance\" for a migProfile.")
    def gpu_sharing(self) -> str | None:
        return sharing(self._m.spec.gpu_share, bool(self._m.spec.mig_profile))

    @strawberry.field
    def cpus(self) -> float:
        return self._m.spec.cpus

    @strawberry.field
    def memory_mb(self) -> int:
        return self._m.spec.memory_mb

    @strawberry.field
    def priority(self) -> int:
        return self._m.spec.priority

    @strawberry.field
    def replicas(self) -> int:
        return self._m.spec.replicas

    @strawberry.field(description="The queue the job runs in.")
    def queue(self) -> str:
        return self._m.spec.queue

    @strawberry.field(description="The job's own time limit (0: its queue's default, if any).")
    def time_limit_seconds(self) -> float:
        return self._m.spec.time_limit_s

    @strawberry.field(description="The time limit its tries run under: its own, else its queue's default, capped "
                                  "by the queue's maximum (0: none); for a placed or running try, the limit that "
                                  "try runs under (an operator may have changed it: updateJob).")
    def effective_time_limit_seconds(self, info: Info) -> float:
        return time_limit(self._m.spec, muster(info).queue(self._m.spec.queue), self._m)[0]

    @strawberry.field
    def same_rack(self) -> bool:
        return self._m.spec.same_rack

    @strawberry.field(description="Labels a host must have to run it, as the job asked; its queue's `hostLabels` "
                                  "apply too, as the queue has them when the job is placed.")
    def host_labels(self) -> list[Label]:
        return [Label(key=k, value=v) for k, v in sorted(self._m.spec.host_labels.items())]

    @strawberry.field(description="Hosts it must not run on, as the job asked (`excludeHosts`).")
    def exclude_hosts(self) -> list[str]:
        return list(self._m.spec.exclude_hosts)

    @strawberry.field(description="The jobs it runs after (see `dependency`).")
    def depends_on(self) -> list[strawberry.ID]:
        return [strawberry.ID(d) for d in self._m.spec.depends_on]

    @strawberry.field(description="AFTER_OK, AFTER_ANY or AFTER_NOT_OK: when it may run, given `dependsOn`.")
    def dependency(self) -> Dependency:
        spec = self._m.spec
        return Dependency.AFTER_ANY if spec.depend_any else Dependency.AFTER_NOT_OK if spec.depend_not_ok \
            else Dependency.AFTER_OK

    @strawberry.field(description="How many times a failed try is tried again (see SubmitJobInput).")
    def retry_failures(self) -> int:
        return self._m.spec.retry_failures

    @strawberry.field(description="The exit codes retryFailures retries (empty: any).")
    def retry_exit_codes(self) -> list[int]:
        return list(self._m.spec.retry_exit_codes)

    @strawberry.field(description="Whether a try stopped at its time limit is retried too.")
    def retry_timeouts(self) -> bool:
        return self._m.spec.retry_timeouts

    @strawberry.field(description="The wait before the first retry of a failed try, doubling after (0: the "
                      "default backoff; see SubmitJobInput).")
    def retry_delay_seconds(self) -> float:
        return self._m.spec.retry_delay_s

    @strawberry.field(description="Whether it saves its state when told to stop and resumes from it (see "
                      "SubmitJobInput).")
    def checkpoints(self) -> bool:
        return self._m.spec.checkpoints

    @strawberry.field(description="Not placed before this time, as submitted (null: at once).")
    def begin_at(self) -> dt.datetime | None:
        return ts(self._m.spec.begin_at) if self._m.spec.begin_at else None

    @strawberry.field(description="While QUEUED, the time before which it is not placed: its begin time, or "
                                  "its next try's after a retry backoff (null: none, or passed).")
    def not_before(self) -> dt.datetime | None:
        return ts(self._m.not_before) if self._m.not_before > time.time() else None

    @strawberry.field(description="The group it shares with other jobs of its user's (\"\": none).")
    def group(self) -> str:
        return self._m.spec.group

    @strawberry.field(description="How many jobs of its group may be placed or running at once (0: no limit).")
    def group_limit(self) -> int:
        return self._m.spec.group_limit

    @strawberry.field(description="Of `dependsOn`, the jobs it still waits for: while any, it is QUEUED but not "
                                  "placed.")
    def waiting_for(self) -> list[strawberry.ID]:
        return [strawberry.ID(d) for d in self._m.waiting_for]

    @strawberry.field
    def submitted_at(self) -> dt.datetime | None:
        return ts(self._m.submitted_at)

    @strawberry.field
    def updated_at(self) -> dt.datetime | None:
        return ts(self._m.updated_at)

    @strawberry.field
    def cancel_reason(self) -> str:
        return self._m.cancel_reason

    @strawberry.field(description="Who held this queued job and why (\"held by alice: dataset not ready\"); "
                                  "null when it is not held. A held job is not placed until released "
                                  "(updateJob).")
    def hold(self) -> str | None:
        return self._m.hold if self._m.hold and not self._m.state.terminal else None

    @strawberry.field(description="The hosts held for this queued job, while it holds a reservation.")
    def reservation(self, info: Info) -> Reservation | None:
        r = self._m.reserved
        if r is None or self._m.state is not JobStateEnum.QUEUED or self._m.id not in muster(info).state.reserved:
            return None
        return Reservation(hosts=list(r.hosts), host_count=r.host_count,
                           start=ts(r.start) if r.start is not None else None, since=ts(r.since))

    @strawberry.field(description="Why the job ended when no attempt says so (for example: the store refused "
                                  "its records).")
    def end_reason(self) -> str:
        return self._m.end_reason

    @strawberry.field
    def attempts(self) -> list[Attempt]:
        return [Attempt(_m=a, _job_id=self._m.id) for a in self._m.attempts]

    @strawberry.field(description="Why the job is still queued: its queue's reasons first (quota, cohort, fair "
                                  "share, preemption grace, gang), then hosts rejecting it, counted by reason.")
    async def pending_reasons(self, info: Info) -> list[PendingReason]:
        mu = muster(info)
        queue = [PendingReason(reason=r.reason, hosts=0, kind="queue", detail=r.detail)
                 for r in mu.jobs.queue_reasons(self._m, time.time())]
        reasons = await reads_for(mu).why_pending(self._m)
        return queue + [PendingReason(reason=r, hosts=n, detail=reason_detail(r))
                        for r, n in sorted(reasons.items(), key=lambda x: -x[1])]

    @strawberry.field(description=(
        "While QUEUED: why it could never run as the cluster stands, when so (what SubmitJobPayload.warnings "
        "said at submission, worked out now); empty otherwise."))
    async def could_never_run(self, info: Info) -> list[str]:
        if self._m.state is not JobStateEnum.QUEUED:
            return []
        return await reads_for(muster(info)).never_runs(self._m)

    @strawberry.field(description="1-based place in its queue (priority, then submission) while QUEUED and "
                                  "neither held, waiting for other jobs, nor kept back by a begin time or a "
                                  "retry backoff.")
    def queue_position(self, info: Info) -> int | None:
        return reads_for(muster(info)).queue_position(self._m)


@strawberry.type
class JobEdge:
    cursor: str
    node: Job


@strawberry.type
class JobConnection:
    total_count: int
    edges: list[JobEdge]
    page_info: PageInfo


@strawberry.type
class HostCounts:
    total: int
    healthy: int
    suspect: int
    lost: int


@strawberry.type(description="GPUs of the hosts whose heartbeat key is live (a LOST host's count for nothing, "
                             "its allocated ones included).")
class GpuCounts:
    total: int
    allocated: int = strawberry.field(description="GPUs any task holds: whole, a share of it or one of its MIG "
                                                  "instances (each GPU once).")


@strawberry.type
class JobCounts:
    queued: int
    placed: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    timeout: int = 0


@strawberry.type
class Leadership:
    term: int = strawberry.field(description="The leader's term: the one this replica holds when it leads, "
                                             "otherwise the newest it has seen in the store.")
    leader: str = strawberry.field(description="The replica holding the leader lease: this one while it leads; "
                                               "empty while none is known to (the lease key was not renewed "
                                               "within its TTL and a second, or this replica cannot hear the "
                                               "store).")
    role: str = strawberry.field(description="This replica's role: leader or follower.")
    replica: str


@strawberry.type
class GpuGroup:
    total: int
    allocated: int
    healthy: int = strawberry.field(description="GPUs not reported faulty on HEALTHY hosts.")


@strawberry.type
class GpuModelCounts(GpuGroup):
    model: str


@strawberry.type
class GpuRackCounts(GpuGroup):
    rack: str = strawberry.field(description="The host's `rack` label (\"-\" when it has none).")


@strawberry.type
class CpuCounts:
    total: float
    allocated: float


@strawberry.type(description="Megabytes, as Floats: a fleet's total passes GraphQL's 32-bit Int "
                               "(2^31 MB = 2 PiB, about 1,000 hosts of 2 TiB).")
class MemoryCounts:
    total: float
    allocated: float


@strawberry.type
class JobStateCount:
    state: JobState
    count: int


@dataclass
@strawberry.type
class Cluster:
    hosts: HostCounts
    gpus: GpuCounts
    jobs: JobCounts
    leadership: Leadership
    _mu: strawberry.Private[Muster | None] = None
    _summary: strawberry.Private[FleetSummary | None] = None
    _fairness: strawberry.Private[tuple[float, int] | None] = None

    def _queue_fairness(self) -> tuple[float, int]:
        if self._fairness is None:
            assert self._mu is not None
            self._fairness = queue_fairness(self._mu.state, time.time())
        return self._fairness

    async def _fleet(self) -> FleetSummary:
        if self._summary is None:
            assert self._mu is not None
            self._summary = await reads_for(self._mu).summary()
        return self._summary

    @strawberry.field(description="The label keys only operators set (setHostLabels): placement and failure "
                                  "domains ignore what agents report of them. Those of MUSTER_OPERATOR_LABEL_KEYS (as "
                                  "this replica has it), and every key beginning `muster.` (not listed).")
    def operator_label_keys(self) -> list[str]:
        assert self._mu is not None
        return sorted(self._mu.state.label_trust.keys)

    @strawberry.field(description="GPUs on live hosts by GPU model.")
    async def gpus_by_model(self) -> list[GpuModelCounts]:
        return [GpuModelCounts(model=k, total=v[0], allocated=v[1], healthy=v[2])
                for k, v in sorted((await self._fleet()).by_model.items())]

    @strawberry.field(description="GPUs on live hosts by `rack` label.")
    async def gpus_by_rack(self) -> list[GpuRackCounts]:
        return [GpuRackCounts(rack=k, total=v[0], allocated=v[1], healthy=v[2])
                for k, v in sorted((await self._fleet()).by_gpu_rack.items())]

    @strawberry.field(description="CPUs of live hosts, and those reserved by their tasks.")
    async def cpu(self) -> CpuCounts:
        a = await self._fleet()
        return CpuCounts(total=a.cpus, allocated=round(a.cpu_allocated, 3))

    @strawberry.field(description="Memory (MB) of live hosts, and that reserved by their tasks.")
    async def memory_mb(self) -> MemoryCounts:
        a = await self._fleet()
        return MemoryCounts(total=a.memory_mb, allocated=a.mem_allocated)

    @strawberry.field(description=(
        "How fairly the queues with jobs waiting hold the cluster now: Jain's index over them of what each holds "
        "(its dominant share) over its weight's part among them. 1 when each holds its part, or fewer than two "
        "wait; towards 1/n as one holds all. The same as the muster_queue_fairness gauge."))
    def queue_fairness(self) -> float:
        return self._queue_fairness()[0]

    @strawberry.field(description="Queues with jobs waiting for placement (those queueFairness is over).")
    def queues_waiting(self) -> int:
        return self._queue_fairness()[1]

    @strawberry.field(description="Jobs held in the state store, by state (every state, zeros too).")
    def jobs_by_state(self) -> list[JobStateCount]:
        assert self._mu is not None
        counts = self._mu.state.job_counts()
        return [JobStateCount(state=st, count=counts.get(st.value, 0)) for st in JobStateEnum]


@strawberry.type
class SubmitJobPayload:
    job: Job | None
    user_errors: list[UserError]

    @strawberry.field(description=(
        "Why the job stored could never run as the cluster stands, when so (it is accepted and waits all the same): "
        "its queue's own limits refuse it however little the queue holds, or no host known could take it even "
        "idle (for a gang, not all its tasks where one placement may put them), with the hosts' reasons counted. "
        "Worked out only when asked."))
    async def warnings(self, info: Info) -> list[str]:
        if self.job is None:
            return []
        return await reads_for(muster(info)).never_runs(self.job._m)


@strawberry.type
class CancelJobPayload:
    job: Job | None
    user_errors: list[UserError]


@strawberry.type
class UpdateJobPayload:
    job: Job | None
    user_errors: list[UserError]


@strawberry.type
class CancelJobsPayload:
    count: int = strawberry.field(description="The jobs whose cancel was asked for.")
    job_ids: list[strawberry.ID] = strawberry.field(description="Their ids, oldest first.")
    user_errors: list[UserError]
    outside_token_queues: int = strawberry.field(
        default=0, description="Jobs that match too but are of queues the caller's token may not act on: left "
                               "alone (0 for a token bound to no queue).")
    token_queues: list[str] | None = strawberry.field(
        default=None, description="The queues the caller's token acts on when it is bound to queues (a team's); "
                                  "null when it acts on every queue.")


@strawberry.type
class JobsChangedPayload:
    count: int = strawberry.field(description="The jobs whose change was asked for.")
    job_ids: list[strawberry.ID] = strawberry.field(description="Their ids, oldest first.")
    user_errors: list[UserError]
    outside_token_queues: int = strawberry.field(
        default=0, description="Jobs that match too but are of queues the caller's token may not act on: left "
                               "alone (0 for a token bound to no queue).")
    token_queues: list[str] | None = strawberry.field(
        default=None, description="The queues the caller's token acts on when it is bound to queues (a team's); "
                                  "null when it acts on every queue.")


@strawberry.type
class Alert:
    id: strawberry.ID
    kind: str
    ts: dt.datetime | None
    host_id: str | None
    job_id: str | None
    message: str


@strawberry.type
class AlertEdge:
    cursor: str
    node: Alert


@strawberry.type
class AlertConnection:
    total_count: int
    edges: list[AlertEdge]
    page_info: PageInfo


@strawberry.type
class HostActionPayload:
    host: Host | None
    user_errors: list[UserError]


@strawberry.type
class AttemptEdge:
    cursor: str
    node: Attempt


@strawberry.type
class AttemptConnection:
    total_count: int
    edges: list[AttemptEdge]
    page_info: PageInfo


@strawberry.type
class HistoryEvent:
    id: strawberry.ID
    ts: dt.datetime | None
    kind: str
    job_id: str | None
    host_id: str | None
    message: str


@strawberry.type
class HistoryEventEdge:
    cursor: str
    node: HistoryEvent


@strawberry.type
class HistoryEventConnection:
    total_count: int
    edges: list[HistoryEventEdge]
    page_info: PageInfo




@strawberry.type(description="One resource of a queue: \"gpu:<model>\", \"cpu\" (cores) or \"memory_mb\".")
class QueueResource:
    resource: str
    nominal: float | None = strawberry.field(description="Guaranteed amount; null: not metered for this queue.")
    borrowing_limit: float | None = strawberry.field(description="How much more it may borrow; null: no limit.")
    lending_limit: float | None = strawberry.field(description="How much of its nominal it lends; null: all.")
    used: float
    borrowed: float = strawberry.field(description="Held above the nominal quota.")
    lent: float = strawberry.field(description="Of its nominal quota, held by other queues of its cohort.")


@strawberry.type(description="A user and a count of their jobs.")
class UserCount:
    user: str
    jobs: int


@strawberry.type
class Queue:
    _row: strawberry.Private[QueueRowModel]

    @strawberry.field
    def name(self) -> str:
        return self._row.queue.name

    @strawberry.field
    def description(self) -> str:
        return self._row.queue.description

    @strawberry.field
    def cohort(self) -> str | None:
        return self._row.queue.cohort

    @strawberry.field
    def weight(self) -> float:
        return self._row.queue.weight

    @strawberry.field(description="Quota, use, borrowing and lending per resource.")
    def resources(self) -> list[QueueResource]:
        return [QueueResource(resource=r.resource, nominal=r.nominal, borrowing_limit=r.borrowing_limit,
                              lending_limit=r.lending_limit, used=r.used, borrowed=r.borrowed, lent=r.lent)
                for r in self._row.resources]

    @strawberry.field(description="Jobs waiting to be placed now.")
    def pending_count(self) -> int:
        return self._row.pending

    @strawberry.field(description="Queued jobs not considered for placement: held, waiting for the jobs they "
                                  "run after, or not to be placed before a begin time or a retry's back-off still "
                                  "ahead (not in pendingCount).")
    def parked_count(self) -> int:
        return self._row.parked

    @strawberry.field(description="Jobs placed or running.")
    def running_count(self) -> int:
        return self._row.running

    @strawberry.field(description="Weighted dominant share: current and decayed past use over the cluster's "
                                  "usable capacity (what hosts that take new work have, and what runs on the "
                                  "others), divided by the weight. The lowest goes first.")
    def fair_share(self) -> float:
        return self._row.share

    @strawberry.field(description="Dominant share, unweighted: current and decayed past use over the cluster's "
                                  "usable capacity, the largest over resources. Compare it with entitledShare.")
    def dominant_share(self) -> float:
        return self._row.dominant

    @strawberry.field(description="The dominant share its weight entitles it to among the active queues (itself "
                                  "counted as active).")
    def entitled_share(self) -> float:
        return self._row.entitled

    @strawberry.field
    def preempt_within(self) -> bool:
        return self._row.queue.preempt_within

    @strawberry.field
    def reclaim(self) -> bool:
        return self._row.queue.reclaim

    @strawberry.field
    def fair_share_preemption(self) -> bool:
        return self._row.queue.fair_share_preemption

    @strawberry.field(description="Fair share between the queue's users, as Slurm's Fair Tree within an account: "
                                  "at equal priority, the user whose jobs of the queue hold least (GPUs held, then "
                                  "jobs placed or running, each with the user's past use decayed with the fair-share "
                                  "half-life) goes next, not the earliest submission; each user's jobs in submission "
                                  "order.")
    def fair_share_users(self) -> bool:
        return self._row.queue.fair_share_users

    @strawberry.field
    def preempt_grace_seconds(self) -> float:
        return self._row.queue.preempt_grace_s

    @strawberry.field
    def min_runtime_seconds(self) -> float:
        return self._row.queue.min_runtime_s

    @strawberry.field
    def max_preemptions(self) -> int:
        return self._row.queue.max_preemptions

    @strawberry.field
    def default_time_limit_seconds(self) -> float:
        return self._row.queue.default_time_limit_s

    @strawberry.field
    def max_time_limit_seconds(self) -> float:
        return self._row.queue.max_time_limit_s

    @strawberry.field(description="The most GPUs one user's jobs of the queue hold at once (0: no limit); a job "
                                  "that would take its user past it waits (queue reason: user at its queue's "
                                  "per-user limit) and preempts nothing.")
    def max_gpus_per_user(self) -> float:
        return self._row.queue.max_gpus_per_user

    @strawberry.field(description="The most jobs not ended (queued, held, placed, running) the queue takes (0: no "
                                  "limit), as Slurm's MaxSubmitJobs: a submission past it is refused (JOB_LIMIT); "
                                  "jobs already in the queue are never touched.")
    def max_submitted_jobs(self) -> int:
        return self._row.queue.max_submitted_jobs

    @strawberry.field(description="The most jobs not ended one user has in the queue (0: no limit), as Slurm's "
                                  "MaxSubmitJobsPerUser.")
    def max_submitted_jobs_per_user(self) -> int:
        return self._row.queue.max_submitted_jobs_per_user

    @strawberry.field(description="The most jobs of one user's in the queue placed or running at once (0: no "
                                  "limit), as Slurm's MaxJobsPerUser; a job past it waits (queue reason: user at its "
                                  "queue's per-user limit, which names the jobs) and preempts nothing.")
    def max_running_jobs_per_user(self) -> int:
        return self._row.queue.max_running_jobs_per_user

    @strawberry.field(description="Labels every host that runs the queue's jobs has (added to each job's "
                                  "hostLabels when it is placed, as the queue has them then).")
    def host_labels(self) -> list[Label]:
        return [Label(key=k, value=v) for k, v in sorted(self._row.queue.host_labels.items())]

    @strawberry.field(description="Jobs of the queue not ended (queued, held, placed, running): what "
                                  "maxSubmittedJobs counts.")
    def submitted_jobs(self) -> int:
        return self._row.open_jobs

    @strawberry.field(description="Per user, the jobs of the queue not ended (what maxSubmittedJobsPerUser "
                                  "counts), most first; `first` users (default 20).")
    def submitted_jobs_by_user(self, first: int = 20) -> list[UserCount]:
        ranked = sorted(self._row.open_by_user.items(), key=lambda kv: (-kv[1], kv[0]))
        return [UserCount(user=u, jobs=n) for u, n in ranked[:max(0, min(first, 1000))]]

    @strawberry.field(description="The queue's users in the order fair share between them goes (least held first, "
                                  "with past use when the queue has it on): what each holds, its past use and its "
                                  "jobs not ended; `first` users (default 20).")
    def users(self, info: Info, first: int = 20) -> list[QueueUser]:
        mu = muster(info)
        ranked = queue_users(mu.state, self._row.queue.name, time.time(), mu.jobs.half_life_s)
        return [QueueUser(user=u.user, gpus=u.gpus, jobs=u.jobs, past_gpus=u.past_gpus, past_jobs=u.past_jobs,
                          jobs_not_ended=u.open_jobs) for u in ranked[:max(0, min(first, 1000))]]

    @strawberry.field(description="The advance reservations not over that name this queue, soonest first.")
    def advance_reservations(self, info: Info) -> list[AdvanceReservation]:
        now, name = time.time(), self._row.queue.name
        found = [r for r in muster(info).state.advance.values() if name in r.queues and not advance.over(r, now)]
        return [AdvanceReservation(_r=r) for r in sorted(found, key=lambda r: (r.starts, r.name))]

    @strawberry.field
    def updated_at(self) -> dt.datetime | None:
        return ts(self._row.queue.updated_at)


@strawberry.type(description="One user of a queue.")
class QueueUser:
    user: str
    gpus: float = strawberry.field(description="GPUs the user's jobs of the queue hold (a share as its part).")
    jobs: int = strawberry.field(description="The user's jobs of the queue placed or running.")
    past_gpus: float = strawberry.field(description="Past use of GPUs, decayed, as a steady allocation (kept while "
                                                    "the queue has fair share between its users).")
    past_jobs: float = strawberry.field(description="Past use of jobs placed or running, the same way.")
    jobs_not_ended: int


@strawberry.type
class QueueEdge:
    cursor: str
    node: Queue


@strawberry.type
class QueueConnection:
    total_count: int
    edges: list[QueueEdge]
    page_info: PageInfo


@strawberry.type
class QueuePayload:
    queue: Queue | None
    user_errors: list[UserError]


@strawberry.type
class DeleteQueuePayload:
    deleted: bool
    user_errors: list[UserError]


@strawberry.enum(description="Where an advance reservation stands: its window not begun, open, or past.")
class AdvanceReservationState(enum.Enum):
    UPCOMING = "UPCOMING"
    ACTIVE = "ACTIVE"
    OVER = "OVER"


@strawberry.type(description="Hosts set aside for some queues' and users' jobs over a time window (Slurm's "
                             "advance reservations). Until it starts, other jobs take the hosts only if their time "
                             "limit ends them by its start; while it is open, only its jobs are placed there (and "
                             "there first), and other work still there at its start is stopped and requeued (not "
                             "counted as a try).")
class AdvanceReservation:
    _r: strawberry.Private[AdvanceReservationModel]

    @strawberry.field
    def name(self) -> str:
        return self._r.name

    @strawberry.field
    def description(self) -> str:
        return self._r.description

    @strawberry.field(description="The hosts set aside.")
    def hosts(self) -> list[strawberry.ID]:
        return [strawberry.ID(h) for h in self._r.hosts]

    @strawberry.field
    def host_count(self) -> int:
        return len(self._r.hosts)

    @strawberry.field(description="The queues whose jobs may use the hosts while it is open.")
    def queues(self) -> list[str]:
        return list(self._r.queues)

    @strawberry.field(description="The users whose jobs, of any queue, may use them too.")
    def users(self) -> list[str]:
        return list(self._r.users)

    @strawberry.field
    def starts_at(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self._r.starts, tz=dt.UTC)

    @strawberry.field
    def ends_at(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self._r.ends, tz=dt.UTC)

    @strawberry.field
    def state(self) -> AdvanceReservationState:
        now = time.time()
        if now >= self._r.ends:
            return AdvanceReservationState.OVER
        return AdvanceReservationState.ACTIVE if now >= self._r.starts else AdvanceReservationState.UPCOMING

    @strawberry.field
    def created_at(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self._r.created_at, tz=dt.UTC)

    @strawberry.field(description="Who made it.")
    def by(self) -> str:
        return self._r.by


@strawberry.type
class AdvanceReservationPayload:
    reservation: AdvanceReservation | None
    user_errors: list[UserError]


@strawberry.type
class DeleteAdvanceReservationPayload:
    deleted: bool
    user_errors: list[UserError]


@strawberry.type(description="Resources used over a period by one queue, user and GPU model.")
class Usage:
    queue: str
    user: str
    gpu_model: str
    gpu_seconds: float
    cpu_seconds: float
    memory_mb_seconds: float
    attempts: int
    gpu_seconds_lost_to_preemption: float = strawberry.field(description=(
        "GPU-seconds of work lost by its attempts that ended PREEMPTED in the period: all each ran, or from its "
        "stop to its exit for a job that checkpoints. Against gpuSeconds, what preemption cost the queue."))
    gpu_util_pct: float | None = strawberry.field(default=None, description=(
        "How busy its GPUs were over the period, in percent: the mean utilisation of the attempts whose agent "
        "reported it at their end (Attempt.gpuUtilAvgPct), weighted by GPU-seconds; null when none did (a "
        "running attempt reports at its end). Against gpuSeconds, how much of what the queue held it used."))
