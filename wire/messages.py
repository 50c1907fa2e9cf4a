"""Wire and storage formats: every message and KV record Muster reads or writes.

All are pydantic models with a version field `v`; `decode()` is the one entry point for
untrusted bytes: it enforces a size bound and the schema and raises `DecodeError`.
"""

from __future__ import annotations

import enum
import json
import os
import random
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from wire.errors import DecodeError

MAX_MESSAGE_BYTES = 256 * 1024  # what agents and clients may send
MAX_RECORD_BYTES = 1024 * 1024  # job and allocation records (NATS's default message limit)
HOST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
LABEL_KEY_PATTERN = r"^[a-z][a-z0-9_.-]{0,62}$"
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9_.-]{0,63}$"
_LABEL_KEY = re.compile(LABEL_KEY_PATTERN)
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)
MAX_HOST_LABELS = 16  # labels a job may require of its host (JobSpec.host_labels)
MAX_EXCLUDED_HOSTS = 128  # hosts a job may name as ones it must not run on (JobSpec.exclude_hosts)


def _checked_host_ids(hosts: list[str]) -> list[str]:
    """`hosts` when each is a host id, else ValueError."""
    for h in hosts:
        if not re.fullmatch(HOST_ID_PATTERN, h):
            raise ValueError(f"not a host id: {h[:64]!r}")
    return hosts


def _checked_labels(labels: dict[str, str], what: str) -> dict[str, str]:
    """`labels` when every key and value has the label form, else ValueError."""
    for k, v in labels.items():
        if not _LABEL_KEY.fullmatch(k) or not _LABEL_VALUE.fullmatch(v):
            raise ValueError(f"invalid {what} {k[:64]!r}")
    return labels


class JobState(str, enum.Enum):
    QUEUED = "QUEUED"
    PLACED = "PLACED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"  # stopped at its time limit (not retried)

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)


class AttemptState(str, enum.Enum):
    PLACED = "PLACED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    LOST = "LOST"
    # Set by the control plane when an attempt it stopped has ended (the agent reports
    # KILLED): stopped to make room for another job, or at its time limit.
    PREEMPTED = "PREEMPTED"
    TIMEOUT = "TIMEOUT"

    @property
    def terminal(self) -> bool:
        return self not in (AttemptState.PLACED, AttemptState.RUNNING)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=False)

    def to_json(self) -> bytes:
        """The message or record as sent and stored (`encode`)."""
        return self.model_dump_json(exclude_defaults=False).encode()


# ---------------------------------------------------------------- heartbeats


MIG_PROFILE_PATTERN = r"^[1-9]g\.[0-9]{1,4}gb(\+me)?$"  # e.g. 1g.10gb, 3g.40gb, 1g.18gb+me


class MigInstance(_Model):
    """A MIG instance of a GPU in MIG mode: a device of its own, scheduled whole."""

    uuid: str = Field(min_length=1, max_length=96)  # CUDA_VISIBLE_DEVICES=MIG-<uuid>
    profile: str = Field(pattern=MIG_PROFILE_PATTERN)
    memory_mb: int = Field(ge=0)


class GpuInfo(_Model):
    index: int = Field(ge=0, le=63)
    model: str = Field(max_length=64)
    memory_mb: int = Field(ge=0)
    uuid: str = Field(default="", max_length=96)
    # A GPU in MIG mode is scheduled only through its instances (never whole or shared).
    mig: list[MigInstance] = Field(default_factory=list, max_length=8)
    # In MIG mode (also with no instance made yet, or none the agent could read: CUDA
    # cannot use such a GPU whole). Older agents send none: a GPU with instances is in
    # MIG mode whatever this says.
    mig_mode: bool = False

    def in_mig_mode(self) -> bool:
        return self.mig_mode or bool(self.mig)


# The figures of a GPU's telemetry (GpuUsage), by the names `GpuUsage.unread` gives them.
GpuFigure = Literal["util", "memory", "temperature", "power"]
GPU_FIGURES: tuple[GpuFigure, ...] = ("util", "memory", "temperature", "power")
GPU_FIGURE_FIELDS: dict[GpuFigure, str] = {"util": "util_pct", "memory": "mem_used_mb", "temperature": "temp_c",
                                           "power": "power_w"}
_MAX_UNREAD_SENT = 16  # names a heartbeat may give per GPU (a newer agent's included)


class GpuUsage(_Model):
    index: int = Field(ge=0, le=63)
    util_pct: float = 0.0
    mem_used_mb: int = 0
    temp_c: float = 0.0
    power_w: float = 0.0
    healthy: bool = True
    fault: str | None = None
    # What the agent runs on this GPU: thousandths of it allocated to shared tasks, and
    # the GPU memory they were given (a GPU held whole shows 1000).
    share_allocated: int = 0
    mem_allocated_mb: int = 0
    # The figures the agent could not read (NVML refused or failed the call, as it refuses
    # utilisation for a GPU in MIG mode; NVML hangs): unknown, not 0. Each still says 0
    # there, for servers older than the field, which ignore it; older agents send none.
    # Names this version does not know (a newer agent's) are dropped, not refused.
    unread: list[GpuFigure] = Field(default_factory=list, max_length=len(GPU_FIGURES))

    @field_validator("unread", mode="before")
    @classmethod
    def _known_figures(cls, names: object) -> object:
        """The known names of `names`, once each, in GPU_FIGURES' order."""
        if not isinstance(names, (list, tuple)) or len(names) > _MAX_UNREAD_SENT:
            return names  # (refused by the field's own rules)
        return [f for f in GPU_FIGURES if f in names]

    @property
    def util_read(self) -> float | None:
        """Utilisation in percent; None when not read."""
        return None if "util" in self.unread else self.util_pct

    @property
    def mem_used_read(self) -> int | None:
        """GPU memory in use in MB; None when not read."""
        return None if "memory" in self.unread else self.mem_used_mb

    @property
    def temp_read(self) -> float | None:
        """Temperature in °C; None when not read."""
        return None if "temperature" in self.unread else self.temp_c

    @property
    def power_read(self) -> float | None:
        """Power draw in watts; None when not read."""
        return None if "power" in self.unread else self.power_w


# A GPU under this utilisation at a heartbeat is idle there (Heartbeat.gpu_idle).
GPU_IDLE_UTIL_PCT = 5.0
MAX_TASKS_PER_HEARTBEAT = 256  # attempts one heartbeat may name (a host's tasks: placement.MAX_TASKS_PER_HOST)


class Heartbeat(_Model):
    v: Literal[1] = 1
    host_id: str = Field(pattern=HOST_ID_PATTERN)
    boot_id: str = Field(max_length=64)
    # The agent process that sent it, drawn at its start: an agent that finds another's
    # heartbeats in its host's key refuses to start (two would run the host's work twice).
    instance: str = Field(default="", max_length=32)
    seq: int = 0
    ts: float
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=64)
    cpus: int = Field(ge=0, le=4096)
    memory_mb: int = Field(ge=0)
    gpu_usage: list[GpuUsage] = Field(default_factory=list, max_length=64)
    cpu_pct: float = 0.0
    mem_used_mb: int = 0
    simulated: bool = False
    agent_version: str = Field(default="", max_length=32)
    # Highest leadership term this agent has seen (it refuses older ones).
    term: int = 0
    # How the agent isolates task attempts (agent.isolation): a line saying so, and whether
    # they are confined (a cgroup with a memory limit, and a user other than the agent's
    # and root); None from an agent that does not say.
    isolation: str = Field(default="", max_length=256)
    isolated: bool | None = None
    # The agent's self-fences since it started (agent.agent): how many have ended, how
    # long the last one lasted (from the freeze until a heartbeat was stored again), and
    # the attempts they froze and then continued, or stopped.
    fences: int = Field(default=0, ge=0)
    last_fence_s: float = Field(default=0.0, ge=0)
    fence_continued: int = Field(default=0, ge=0)
    fence_stopped: int = Field(default=0, ge=0)
    # The agent is shutting down: it starts no new attempt, so nothing is placed on it.
    leaving: bool = False
    # Running attempts whose GPUs have all been idle (under GPU_IDLE_UTIL_PCT at every
    # heartbeat) for the agent's `--gpu-idle-after` or longer: attempt id -> since when (the
    # agent's clock). Part of the shape, so the control plane decodes each change of the set.
    gpu_idle: dict[str, float] = Field(default_factory=dict, max_length=MAX_TASKS_PER_HEARTBEAT)
    # Why the host should be given no new work now, "" while it may: its disk nearly full
    # (the agent's `--min-free-disk-mb`), or a try it could not start for want of the
    # host's resources (no space, memory or processes) in the last minute. As Kubernetes'
    # DiskPressure: the host stays HEALTHY, its work runs on, nothing new is placed there.
    # Part of the shape.
    pressure: str = Field(default="", max_length=512)

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        """The same rule the agent checks its configuration with (validation.validate_labels):
        a heartbeat from an agent that skipped it is refused, not shown."""
        return _checked_labels(labels, "label")


SHAPE_HEADER = "Muster-Shape"


def shape_digest(hb: Heartbeat) -> str:
    """A digest of what placement needs from a heartbeat (GPUs, their health, CPU, RAM,
    labels, boot, whether the agent is shutting down), and of the fence counters, so that
    a fence is seen when it is over.
    Sent as the `Muster-Shape` header so the control plane can take a heartbeat with an
    unchanged shape as liveness alone, without decoding it."""
    import hashlib

    parts = [hb.host_id, hb.boot_id, str(hb.cpus), str(hb.memory_mb), str(hb.simulated)]
    parts += [f"{g.index}:{g.model}:{g.memory_mb}" + "".join(f"|{m.uuid}/{m.profile}/{m.memory_mb}" for m in g.mig)
              + ("|mig" if g.mig_mode and not g.mig else "")  # (unchanged for GPUs not in MIG mode)
              for g in hb.gpus]
    parts += [f"u{u.index}:{u.fault}" for u in hb.gpu_usage if not u.healthy]
    parts += [f"{k}={v}" for k, v in sorted(hb.labels.items())]
    if hb.isolated is not None:  # (absent from older agents' heartbeats: their digest is unchanged)
        parts += [f"isolated={hb.isolated}", hb.isolation]
    if hb.fences or hb.fence_continued or hb.fence_stopped:  # (a host that never fenced: unchanged)
        parts.append(f"fences={hb.fences}/{hb.fence_continued}/{hb.fence_stopped}")
    if hb.leaving:  # (a host not shutting down: unchanged)
        parts.append("leaving")
    if hb.gpu_idle:  # (a host whose attempts use their GPUs: unchanged)
        parts.append("idle=" + ",".join(sorted(hb.gpu_idle)))
    if hb.pressure:  # (a host under no pressure: unchanged)
        parts.append("pressure=" + hb.pressure)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]


# ---------------------------------------------------------------- jobs

DEFAULT_QUEUE = "default"
QUEUE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


MAX_DEPENDENCIES = 32  # jobs one job may run after
MAX_EPOCH_S = 2**33  # a time in epoch seconds (the year 2242)


class JobSpec(_Model):
    # Derived once and kept (wire.budgets.task_bytes); a spec is not changed once validated.
    _task_bytes: int | None = PrivateAttr(default=None)

    name: str = Field(max_length=128)
    command: list[str] = Field(min_length=1, max_length=256)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    gpus: int = Field(default=0, ge=0, le=64)
    gpu_model: str | None = None
    cpus: float = Field(default=1.0, ge=0, le=4096)
    memory_mb: int = Field(default=512, ge=0)
    priority: int = Field(default=0, ge=-1000, le=1000)
    max_attempts: int = Field(default=3, ge=1, le=100)
    user: str = Field(default="operator", max_length=64)
    # What happens when the job's host is cut off: STOP (the agent fences itself and the
    # work is replaced once the host is lost) or KEEP_RUNNING (the agent keeps the process
    # and the control plane waits `replace_after_s` after the loss before replacing it).
    on_disconnect: Literal["STOP", "KEEP_RUNNING"] = "STOP"
    replace_after_s: float = Field(default=0.0, ge=0, le=7 * 24 * 3600)
    # A gang: `replicas` tasks, each with the resources above, placed all at once or
    # not at all, optionally all on hosts sharing one `rack` label; if one fails, all
    # are stopped and the gang is retried as one.
    replicas: int = Field(default=1, ge=1, le=256)
    same_rack: bool = False
    # GPU models the job may run on (any of them; `gpu_model` is the one-model form and,
    # when set, the only element). A gang's tasks may mix models unless `same_model`.
    gpu_models: list[str] | None = Field(default=None, max_length=32)
    same_model: bool = False
    # A share of ONE GPU, in thousandths (1-999; `gpus` is then 0), with the GPU memory
    # it needs (0: none reserved). Several shared tasks run on one GPU, not isolated from
    # each other (CUDA MPS limits them where it runs on the host).
    gpu_share: int = Field(default=0, ge=0, le=999)
    gpu_memory_mb: int = Field(default=0, ge=0)
    # One MIG instance of this profile (e.g. "1g.18gb"); `gpus` and `gpu_share` are 0.
    mig_profile: str | None = Field(default=None, pattern=MIG_PROFILE_PATTERN)
    # The queue the job runs in (its quota, fair share and preemption rules), and its
    # time limit in seconds (0: the queue's default, if any).
    queue: str = Field(default=DEFAULT_QUEUE, pattern=QUEUE_NAME_PATTERN)
    time_limit_s: float = Field(default=0.0, ge=0, le=365 * 24 * 3600)
    # An admin set `time_limit_s` past the queue's maximum (updateJob): every try of the job
    # runs under it, not capped by the queue (never set by a submission).
    time_limit_exempt: bool = False
    # Labels a host must have to run the job (key=value each, all of them: a zone, a
    # network, a driver line), as its agent reports them (`--labels`).
    host_labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_HOST_LABELS)
    # Hosts the job must not run on (their ids, sorted, each once), as Slurm's `--exclude`:
    # a host its user finds at fault that the operators have not cordoned.
    exclude_hosts: list[str] = Field(default_factory=list, max_length=MAX_EXCLUDED_HOSTS)
    # Jobs this one runs after (their ids): once every one of them SUCCEEDED (afterok), once
    # every one of them ended whatever its end (`depend_any`: afterany), or once every one
    # of them ended otherwise than SUCCEEDED (`depend_not_ok`: afternotok, for a job that
    # cleans up or reports a failure). Under afterok one that ends otherwise, under
    # afternotok one that SUCCEEDED, cancels this job.
    depends_on: list[str] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    depend_any: bool = False
    depend_not_ok: bool = False
    # A group the job shares with others of its user's (an array, a job name), and how many
    # of them may be placed or running at once (0: no limit): an array's throttle, or with
    # 1 and the job's name as the group, Slurm's singleton (server.scheduling.groups).
    group: str = Field(default="", max_length=128)
    group_limit: int = Field(default=0, ge=0, le=100_000)
    # How many times a try that failed (its own code exited nonzero; with `retry_timeouts`
    # also one stopped at its time limit) is tried again (0: never), optionally only for
    # the exit codes listed (server.scheduling.retry); a gang's try as a whole.
    retry_failures: int = Field(default=0, ge=0, le=100)
    retry_exit_codes: list[int] = Field(default_factory=list, max_length=16)
    retry_timeouts: bool = False
    # The wait before the first retry of a failed try, doubling for each retry after it, at
    # most an hour (0: the default, 1, 2, 4 ... s, at most a minute), for
    # failures that take time to clear (a file server or licence server down); retries after
    # a lost host keep the default (server.scheduling.retry).
    retry_delay_s: float = Field(default=0.0, ge=0, le=3600)
    # The job saves its state when told to stop (SIGTERM, within its queue's grace) and
    # its next try resumes from it: a preemption costs it the grace, not its work so far,
    # and victims are chosen so (server.scheduling.preemption.Victim.cost).
    checkpoints: bool = False
    # Not placed before this time (epoch seconds; 0: at once), as Slurm's `--begin`: the
    # job's `not_before` from its submission.
    begin_at: float = Field(default=0.0, ge=0, le=MAX_EPOCH_S)

    @field_validator("host_labels")
    @classmethod
    def _host_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return _checked_labels(labels, "host label")

    @field_validator("exclude_hosts")
    @classmethod
    def _exclude_hosts(cls, hosts: list[str]) -> list[str]:
        return sorted(set(_checked_host_ids(hosts)))

    def models(self) -> frozenset[str] | None:
        """The GPU models the job accepts, None for any."""
        if self.gpu_models:
            return frozenset(self.gpu_models)
        return frozenset({self.gpu_model}) if self.gpu_model else None

    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_share > 0 or self.mig_profile is not None


class Attempt(_Model):
    id: str
    number: int  # the try: all tasks of a gang's try share it
    task: int = 0  # index of the task within a gang
    host_id: str
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_share: int = 0  # thousandths of gpu_indices[0] (a shared GPU)
    mig: list[str] = Field(default_factory=list)  # MIG instance uuids
    state: AttemptState = AttemptState.PLACED
    term: int = 0
    placed_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    output_tail: str = ""
    reason: str = ""
    # What the control plane stopped it for ("preempt", "timeout", "gpu-fault") and when
    # (the reason names the job it made room for, or the fault); the agent's KILLED
    # report then ends it PREEMPTED, TIMEOUT or (a GPU fault) KILLED.
    stop_kind: str = ""
    stop_at: float | None = None
    # Set at placement: the time limit it runs under (0: none), the GPU model it got.
    time_limit_s: float = 0.0
    # Set at its end, from its agent's report: its GPUs' mean utilisation over its run, in
    # percent (None: not reported; see StatusReport.gpu_util_pct).
    gpu_util_pct: float | None = None
    gpu_model: str = ""


RESERVED_HOSTS_KEPT = 16  # hosts a job record names of its reservation (the count is kept whole)


class Reserved(_Model):
    """A queued job's reservation, as its leader last wrote it (scheduling.backfill): the
    hosts held for it (the first RESERVED_HOSTS_KEPT), how many, when it could start
    there (None: unknown, a task there has no time limit) and when it was made."""

    hosts: list[str] = Field(default_factory=list)
    host_count: int = 0
    start: float | None = None
    since: float = 0.0


class Job(_Model):
    """The `job.<id>` record. Stored without the fields that hold their defaults (every
    reader fills them in again): a decoded record then keeps only the fields it carries in
    pydantic's set of given fields, which with some forty fields given costs a live job as
    much memory again; and the record is a third of the bytes."""

    v: Literal[1] = 1
    id: str
    spec: JobSpec
    state: JobState = JobState.QUEUED
    submitted_at: float
    updated_at: float
    attempts: list[Attempt] = Field(default_factory=list)
    # Why the job is still queued: counted rejection reasons of the last placement try.
    pending_reasons: dict[str, int] = Field(default_factory=dict)
    not_before: float = 0.0
    cancel_reason: str = ""
    # Who held the job and why (empty: not held). A held job stays QUEUED but is not
    # considered for placement until it is released.
    hold: str = ""
    # Of `spec.depends_on`, the jobs it still waits for (set at submission; the leader
    # takes each out as it ends). A job that waits stays QUEUED but is not considered
    # for placement.
    waiting_for: list[str] = Field(default_factory=list)
    # When it was last released, or last stopped waiting for the jobs it runs after (0:
    # never held nor waiting): how long it has waited for room counts from then
    # (`waiting_since`), not from its submission.
    freed_at: float = 0.0
    # Why the job ended when no attempt says so (its records could not be written, ...).
    end_reason: str = ""
    # A job that preempted others waits for these attempts to end before it is placed
    # (the handover: its tasks never start beside the ones they replace).
    preempting: list[str] = Field(default_factory=list)
    # While QUEUED: the hosts held for it so that smaller jobs do not keep it waiting.
    reserved: Reserved | None = None
    # What the uid its tasks run as is drawn from, a secret never shown: for a job submitted
    # through the API, a key the server drew when it stored the job; over NATS, whose ids
    # their clients choose, one the leader drew when it accepted it (from a public id, a
    # client could reckon each job's uid and keep one that is another job's). "": its id
    # (jobs stored before uid keys).
    uid_key: str = ""

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_defaults=True).encode()

    @property
    def waiting_since(self) -> float:
        """Since when the job may be placed: its submission, its begin time or a retry's
        backoff, its release, or its dependencies' end, whichever came last."""
        return max(self.submitted_at, self.not_before, self.freed_at)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def tries(self) -> int:
        """How many tries were made (a gang's tasks of one try count once)."""
        return self.attempts[-1].number if self.attempts else 0

    @property
    def stopping(self) -> bool:
        """Ended (its state terminal: cancelled, at its time limit, a gang task failed)
        while a task of its last try has not been confirmed stopped yet (its stop's grace).
        Until then it still runs: jobs that run after it, and limits on how many of a kind
        run at once (a singleton), wait for it."""
        return self.state.terminal and any(not a.state.terminal for a in self.current_tasks())

    def current_tasks(self) -> list[Attempt]:
        """The attempts of the latest try (one, or one per gang task). Tries are appended
        one after another (cycle.placing.place_queued), so they are the list's tail: no walk
        over every attempt, which the planner asks for every status report."""
        atts = self.attempts
        if not atts:
            return []
        n = self.tries
        i = len(atts) - 1
        while i > 0 and atts[i - 1].number == n:
            i -= 1
        return atts[i:]


# ---------------------------------------------------------------- allocations


# A grace of 0 (SIGKILL at once) as `Task.grace_s` says it: 0 there is the agent's own
# default (found by exploring: a queue's grace of 0 gave its tries the agent's 10 s).
IMMEDIATE_GRACE_S = 0.001


class Task(_Model):
    """One task attempt assigned to a host: what the agent runs, and what it holds.

    Immutable (a change is a new Task: `model_copy(update=...)`), so its JSON is made
    once (`compact_json`) however often the host's record is rewritten around it."""

    model_config = ConfigDict(frozen=True)
    _json: bytes | None = PrivateAttr(default=None)

    attempt_id: str
    job_id: str
    number: int
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    gpu_indices: list[int] = Field(default_factory=list)
    # A share of gpu_indices[0] in thousandths, with the GPU memory it was given (MPS's
    # limits where MPS runs); 0 for whole GPUs.
    gpu_share: int = 0
    gpu_memory_mb: int = 0
    mig: list[str] = Field(default_factory=list)  # MIG instance uuids (CUDA_VISIBLE_DEVICES=MIG-<uuid>)
    cpus: float = 0.0
    memory_mb: int = 0
    term: int = 0
    # Set when the job was cancelled or its host drained: the agent stops the process
    # and reports KILLED.
    stop: bool = False
    # KEEP_RUNNING jobs: the agent does not stop this attempt when it fences itself.
    keep_running: bool = False
    # With `stop`: why (shown in the agent's log and report), and the grace in seconds
    # between SIGTERM and SIGKILL (0: the agent's own default; a queue's grace of 0 is sent
    # as IMMEDIATE_GRACE_S). Set at placement to its queue's grace, told to the task
    # (MUSTER_PREEMPT_DEADLINE), and kept by its preemption or time limit.
    stop_reason: str = ""
    grace_s: float = 0.0
    # Its job's `uid_key`: what the uid it runs as is drawn from ("": its job's id).
    uid_key: str = ""

    def __eq__(self, other: object) -> bool:  # the fields only, not the cached JSON
        return type(other) is type(self) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # equal by value, and it holds a dict

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Task:
        copy = super().model_copy(update=update, deep=deep)
        private = copy.__pydantic_private__
        assert private is not None  # the model has a private attribute
        private["_json"] = None  # pydantic copies private attributes: not this one
        return copy

    def compact_json(self) -> bytes:
        """The task as JSON without the fields that hold their defaults (a decoder fills
        them in again): what an `alloc` record lists, made once per task. (The cache is
        read from pydantic's private dict: `self._json` takes BaseModel.__getattr__, ~30
        times slower.)"""
        private = self.__pydantic_private__
        assert private is not None
        data: bytes | None = private.get("_json")
        if data is None:
            data = private["_json"] = self.model_dump_json(exclude_defaults=True).encode()
        return data


def max_counts(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    """Counts that only grow (`HostAlloc.gpu_clears`) from two readings: the larger of each."""
    return {i: max(a.get(i, 0), b.get(i, 0)) for i in a.keys() | b.keys()}


class HostAlloc(_Model):
    """The `alloc.<host>` record: every attempt assigned to a host. It is both the
    allocation ledger (checked against capacity) and the agent's assignment list."""

    v: Literal[1] = 1
    host_id: str
    term: int = 0
    tasks: list[Task] = Field(default_factory=list)
    # How many times an operator cleared each GPU's fault mark (`muster host
    # clear-gpu-faults`), by GPU index: when a count rises, the agent forgets that mark.
    gpu_clears: dict[int, int] = Field(default_factory=dict, max_length=64)

    def to_json(self) -> bytes:
        """The record as stored: rewritten on every placement and completion on its
        host, so built from each task's JSON, made once (`Task.compact_json`)."""
        clears = f'"gpu_clears":{json.dumps(self.gpu_clears, sort_keys=True)},' if self.gpu_clears else ""
        head = f'{{"v":{self.v},"host_id":{json.dumps(self.host_id)},"term":{self.term},{clears}"tasks":['
        return head.encode() + b",".join(t.compact_json() for t in self.tasks) + b"]}"


def host_gpus_held(alloc: HostAlloc | None, hb: Heartbeat | None = None) -> set[int]:
    """The indices of a host's GPUs its tasks hold: whole, a share of one (a GPU shared by
    several tasks once), or one of its MIG instances (found by exploring:
    `cluster.gpus.allocated` counted none for MIG tasks; their GPUs are known from the
    host's heartbeat `hb`). The host's row and the cluster's count alike."""
    if alloc is None:
        return set()
    held = {i for t in alloc.tasks for i in t.gpu_indices}
    if hb is not None and any(t.mig for t in alloc.tasks):
        parents = {m.uuid: g.index for g in hb.gpus for m in g.mig}
        held.update(parents[u] for t in alloc.tasks for u in t.mig if u in parents)
    return held


# ---------------------------------------------------------------- queues


class ResourceQuota(_Model):
    """A queue's quota of one resource: what it is guaranteed (`nominal`), how much more
    it may borrow from its cohort (None: no limit), and how much of its nominal it lends
    to the cohort while unused (None: all of it)."""

    nominal: float = Field(default=0.0, ge=0, le=1e15)
    borrowing_limit: float | None = Field(default=None, ge=0, le=1e15)
    lending_limit: float | None = Field(default=None, ge=0, le=1e15)


# Resource names of quotas and usage: "gpu:<model>", "cpu" (cores), "memory_mb".
RESOURCE_PATTERN = r"^(cpu|memory_mb|gpu:[A-Za-z0-9][A-Za-z0-9_.+-]{0,63})$"


class Queue(_Model):
    """The `queue.<name>` record: a queue's quota, fair-share weight, cohort, preemption
    rules and time limits (server.scheduling.queues). A queue without any quota is
    unmetered: it uses what is free, and all it holds counts as borrowed."""

    v: Literal[1] = 1
    name: str = Field(pattern=QUEUE_NAME_PATTERN)
    description: str = Field(default="", max_length=512)
    cohort: str | None = Field(default=None, pattern=QUEUE_NAME_PATTERN)
    weight: float = Field(default=1.0, gt=0, le=1000)
    quota: dict[str, ResourceQuota] = Field(default_factory=dict, max_length=64)
    # Preemption, each kind on or off: (a) a higher-priority job of this queue stops a
    # lower-priority one of the same queue; (b) a job of this queue within its nominal
    # quota takes back what others borrowed; (c) fair share across queues.
    preempt_within: bool = True
    reclaim: bool = True
    fair_share_preemption: bool = False
    # SIGTERM .. SIGKILL for this queue's preempted (and timed-out) attempts; exported to
    # tasks as MUSTER_PREEMPT_DEADLINE. Attempts younger than `min_runtime_s` are not
    # preempted. At most `max_preemptions` victims are stopping for this queue's jobs at
    # once (one preemption may stop more, up to MAX_PREEMPTING, while none stops for it).
    preempt_grace_s: float = Field(default=30.0, ge=0, le=24 * 3600)
    min_runtime_s: float = Field(default=60.0, ge=0, le=7 * 24 * 3600)
    max_preemptions: int = Field(default=8, ge=0, le=10_000)
    # Time limits: applied to jobs that give none (0: none), and the most a job may ask.
    default_time_limit_s: float = Field(default=0.0, ge=0, le=365 * 24 * 3600)
    max_time_limit_s: float = Field(default=0.0, ge=0, le=365 * 24 * 3600)
    # The most GPUs one user's jobs of this queue hold at once (a share or MIG instance
    # counts as its part; 0: no limit), as Slurm's MaxTRESPerUser: one user's long array
    # does not take the whole queue from its teammates.
    max_gpus_per_user: float = Field(default=0.0, ge=0, le=1_000_000)
    # The most jobs not ended (queued, held, placed, running) the queue takes, in all and
    # from one user (0: no limit), as Slurm's MaxSubmitJobs and MaxSubmitJobsPerUser: a
    # submission past either is refused (server.scheduling.submitlimits).
    max_submitted_jobs: int = Field(default=0, ge=0, le=100_000_000)
    max_submitted_jobs_per_user: int = Field(default=0, ge=0, le=100_000_000)
    # The most jobs of one user's in this queue placed or running at once (0: no limit),
    # as Slurm's MaxJobsPerUser: the others wait their turn (CPU-only work and GPU shares
    # included, which a GPU limit hardly bounds).
    max_running_jobs_per_user: int = Field(default=0, ge=0, le=100_000_000)
    # Labels every host that runs this queue's jobs has (a partition's hosts: a rack a
    # team bought, the hosts of a network): added to each job's own `host_labels` when it
    # is placed, as they are then (server.scheduling.queues.placement_spec).
    host_labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_HOST_LABELS)
    # Fair share between the queue's users (server.scheduling.userfair): at equal
    # priority, the user whose jobs of the queue hold least goes next, not the earliest
    # submission; off, the queue is in priority and submission order.
    fair_share_users: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0
    by: str = Field(default="", max_length=64)

    @field_validator("host_labels")
    @classmethod
    def _queue_host_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return _checked_labels(labels, "host label")

    @field_validator("quota")
    @classmethod
    def _resources(cls, quota: dict[str, ResourceQuota]) -> dict[str, ResourceQuota]:
        for k in quota:
            if not re.fullmatch(RESOURCE_PATTERN, k):
                raise ValueError(f"unknown resource {k[:64]!r}")
        return quota


def implicit_default_queue() -> Queue:
    """The `default` queue as it is until an operator stores one: unmetered, without
    preemption, no time limits (the scheduler's behaviour before queues existed)."""
    return Queue(name=DEFAULT_QUEUE, preempt_within=False, reclaim=False)


# The most hosts one advance reservation sets aside (its record names each).
MAX_SET_ASIDE_HOSTS = 4096
# The most users whose decayed use a queue's `qusage` record keeps (those with most).
MAX_USAGE_USERS = 1024


class AdvanceReservation(_Model):
    """The `advres.<name>` record: hosts set aside for some queues' and users' jobs from
    `starts` to `ends` (server.scheduling.advance), as Slurm's advance reservations
    (`accounts=`, `users=`). Until `starts` other jobs take the hosts only if their time
    limit ends them by then; from `starts` to `ends` only the jobs of the named queues and
    users are placed there, and other work still there at `starts` is stopped and
    requeued (not counted as a try)."""

    v: Literal[1] = 1
    name: str = Field(pattern=QUEUE_NAME_PATTERN)
    description: str = Field(default="", max_length=512)
    hosts: list[str] = Field(min_length=1, max_length=MAX_SET_ASIDE_HOSTS)
    queues: list[str] = Field(default_factory=list, max_length=64)
    users: list[str] = Field(default_factory=list, max_length=256)
    starts: float
    ends: float
    created_at: float = 0.0
    by: str = Field(default="", max_length=64)

    @field_validator("hosts")
    @classmethod
    def _host_ids(cls, hosts: list[str]) -> list[str]:
        if len(set(_checked_host_ids(hosts))) != len(hosts):
            raise ValueError("a host is named twice")
        return hosts

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, queues: list[str]) -> list[str]:
        for q in queues:
            if not re.fullmatch(QUEUE_NAME_PATTERN, q):
                raise ValueError(f"not a queue name: {q[:64]!r}")
        return sorted(set(queues))

    @field_validator("users")
    @classmethod
    def _user_names(cls, users: list[str]) -> list[str]:
        for u in users:
            if not u or len(u) > 64 or not u.isprintable():
                raise ValueError(f"not a user name: {u[:64]!r}")
        return sorted(set(users))

    @model_validator(mode="after")
    def _window(self) -> AdvanceReservation:
        if not self.ends > self.starts:
            raise ValueError("it must end after it starts")
        if not self.queues and not self.users:
            raise ValueError("it must name queues or users whose jobs may use the hosts")
        return self


class QueueUsage(_Model):
    """The `qusage.<name>` record, kept by the leader: the queue's past use, in
    resource-seconds decayed with the fair-share half-life, as of `at`."""

    v: Literal[1] = 1
    name: str = Field(pattern=QUEUE_NAME_PATTERN)
    at: float = 0.0
    half_life_s: float = 0.0
    usage: dict[str, float] = Field(default_factory=dict, max_length=256)
    # In a queue with fair share between its users: each user's GPU-seconds and
    # job-seconds (jobs placed or running), decayed alike; the users with most use kept.
    user_gpus: dict[str, float] = Field(default_factory=dict, max_length=MAX_USAGE_USERS)
    user_jobs: dict[str, float] = Field(default_factory=dict, max_length=MAX_USAGE_USERS)


# ---------------------------------------------------------------- agent -> server


class StatusReport(_Model):
    v: Literal[1] = 1
    host_id: str = Field(pattern=HOST_ID_PATTERN)
    attempt_id: str = Field(max_length=128)
    job_id: str = Field(max_length=128)
    state: AttemptState
    exit_code: int | None = None
    output_tail: str = Field(default="", max_length=16384)
    ts: float
    term: int = 0
    reason: str = Field(default="", max_length=512)
    # A task that failed while a GPU it holds was faulted: what the agent saw of the
    # fault (the leader then counts the end as the infrastructure's, not the job's).
    gpu_fault: str = Field(default="", max_length=512)
    # The agent stopped the attempt because the agent itself is shutting down (an orderly
    # stop: the leader does not count the try against the job's maxAttempts).
    shutdown: bool = False
    # The try could not start for want of the host's resources (no space, memory or
    # processes, a cgroup it could not make), or was handed back unstarted while the host
    # had such trouble: not the job's failure; requeued at once, not counted (retry.HOST).
    host_trouble: bool = False
    # With an end: its GPUs' mean utilisation over its run, in percent, from the agent's
    # samples at each heartbeat (None: no sample, a MIG instance, or no GPU).
    gpu_util_pct: float | None = Field(default=None, ge=0, le=100)
    # The agent process that sent it (`Heartbeat.instance`; "" from older agents).
    instance: str = Field(default="", max_length=32)


# ---------------------------------------------------------------- api <-> agent


class OutputRequest(_Model):
    """A running attempt's output so far, asked of its host's agent (`muster.output.<host>`)."""

    v: Literal[1] = 1
    attempt_id: str = Field(max_length=128)


class OutputReply(_Model):
    """The agent's answer: the last bytes its process wrote (stdout and stderr, as the
    final report's `output_tail` keeps them); `running` false when the agent runs no such
    attempt (it ended, or never ran here)."""

    v: Literal[1] = 1
    attempt_id: str = Field(max_length=128)
    running: bool
    output_tail: str = Field(default="", max_length=16384)
    ts: float
    # Bytes the process wrote in all, the tail being their last ones (0 from an agent
    # older than this field): a follower prints exactly what is new since its last look.
    written: int = Field(default=0, ge=0)


# ---------------------------------------------------------------- api -> leader


class Command(_Model):
    """An operator's command on a job, applied by the leader: `cancel`; `update`, which
    changes what is given of `priority`, `hold` (True holds a queued job, False releases
    it; None: unchanged) and `time_limit_s` (the job's, and its running try's); or
    `requeue`, which stops a placed or running job's try (not counted against its
    attempts) and queues it again, held when `hold` is True."""

    v: Literal[1] = 1
    kind: Literal["cancel", "update", "requeue"]
    job_id: str = Field(max_length=128)
    by: str = Field(default="", max_length=64)
    reason: str = Field(default="", max_length=512)
    ts: float = Field(default_factory=time.time)
    priority: int | None = Field(default=None, ge=-1000, le=1000)
    hold: bool | None = None
    # 0: none (an admin's removal, with `time_limit_exempt`).
    time_limit_s: float | None = Field(default=None, ge=0, le=365 * 24 * 3600)
    # With `time_limit_s`: an admin's limit past the queue's maximum, or no limit
    # (JobSpec.time_limit_exempt).
    time_limit_exempt: bool = False


JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{7,63}$"


# Jobs in one NATS submission. The leader takes a submission whole into one commit beside
# reports and commands (server/planner.py keeps 642 of a commit's 900 keys for inputs), so
# a larger one could never be taken and would hold up every submission behind it.
MAX_SUBMIT_JOBS = 500
# Bytes of one NATS submission's message: the leader decodes no larger one (and NATS takes
# none past its max_payload, 1 MiB by default: submit_over_nats splits by the smaller).
MAX_SUBMIT_BYTES = 4 * 1024 * 1024


class SubmitRequest(_Model):
    """A batch of jobs submitted over NATS (`muster.submit.<user>`). Each job is a dict
    with a client-chosen `id` (so a retried publish cannot create it twice) and the same
    fields as the GraphQL SubmitJobInput, in snake_case."""

    v: Literal[1] = 1
    user: str = Field(default="nats", max_length=64)
    ts: float = 0.0
    jobs: list[dict[str, object]] = Field(min_length=1, max_length=MAX_SUBMIT_JOBS)
    # Drawn at random by the leader as it reads the submission (a client's is replaced):
    # its jobs' uid keys are made from it (Job.uid_key).
    nonce: str = ""
    # Set by the leader before it plans with the submission (a client's is replaced): the
    # ids of its jobs that an earlier job had (history knows them): refused, ids are never
    # reused. None: not asked (none known).
    used: list[str] | None = None
    # Set by the leader with `used` (a client's is replaced): of the jobs its jobs run after
    # (`depends_on`) that the leader does not hold, those history has, with the state
    # history last saw each in, so that a dependency known only to history is judged as
    # the API judges it.
    recorded: dict[str, JobState] = Field(default_factory=dict)
    # Set by the leader from the subject (`muster.submit.<user>.<queue>`; a client's is
    # replaced): the only queue its jobs may be in ("": any), the one a job naming none is in.
    queue: str = ""


class Event(_Model):
    """Published on `muster.events.<kind>` and recorded in history."""

    v: Literal[1] = 1
    kind: str
    ts: float = Field(default_factory=time.time)
    job_id: str | None = None
    host_id: str | None = None
    attempt_id: str | None = None
    message: str = ""
    data: dict[str, object] = Field(default_factory=dict)


M = TypeVar("M", bound=BaseModel)


def encode(model: _Model) -> bytes:
    return model.to_json()


def decode(cls: type[M], data: bytes, limit: int = MAX_MESSAGE_BYTES) -> M:
    """Decode untrusted bytes into `cls`, or raise DecodeError."""
    if len(data) > limit:
        raise DecodeError(f"{cls.__name__}: {len(data)} bytes exceeds {limit}")
    try:
        return cls.model_validate_json(data)
    except PydanticValidationError as exc:
        raise DecodeError(f"{cls.__name__}: {exc.error_count()} validation errors") from exc
    except (ValueError, TypeError) as exc:  # pragma: no cover - defensive
        raise DecodeError(f"{cls.__name__}: {exc}") from exc


_ID_RANDOM_BITS = 40
_id_lock = threading.Lock()
_id_random = random.Random()  # seeded from os.urandom
os.register_at_fork(after_in_child=_id_random.seed)  # a forked child does not repeat its parent's ids
_last_id = [0, 0]  # the millisecond and the random part of this process's last id


def new_id(prefix: str) -> str:
    """Sortable unique id: millisecond time, then 40 random bits. Within one process ids
    strictly increase: one made in the same millisecond as the last (or while the clock
    stands behind it) counts up from the last one's random part, as ULID's monotonic mode
    does, so jobs submitted together (an array, a batch) keep their order."""
    ms = int(time.time() * 1000)
    with _id_lock:
        if ms <= _last_id[0]:
            ms, rand = _last_id[0], _last_id[1] + 1
            if rand >> _ID_RANDOM_BITS:
                ms, rand = ms + 1, 0
        else:
            # Not os.urandom: a system call lets go of the GIL, and taking it back behind the
            # heartbeat ingest's and the lease's threads stalled the event loop that answers
            # submissions (py-spy, one job per request). The random module is seeded from
            # the system's randomness and again in a forked child; an id is not a secret.
            rand = _id_random.getrandbits(_ID_RANDOM_BITS)
        _last_id[0], _last_id[1] = ms, rand
    return f"{prefix}{ms:012x}{rand:010x}"
