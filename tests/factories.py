"""Builders of what tests feed Muster: heartbeats and their KV records, job specs, jobs,
tasks, host allocations, and the placement's `HostCapacity`.

Each builder makes a valid object from defaults, and every field can be given: a test
passes the values it depends on (and asserts on), and leaves the rest to the defaults.
The defaults are plain, fixed values (time `T0`, no wall clock), so that a builder
called twice with the same arguments makes equal objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from server.scheduling.placement import HostCapacity
from wire.messages import (
    GPU_FIGURE_FIELDS,
    SHAPE_HEADER,
    GpuFigure,
    GpuInfo,
    GpuUsage,
    Heartbeat,
    HostAlloc,
    Job,
    JobSpec,
    JobState,
    Task,
    encode,
    shape_digest,
)
from wire.records import Record

if TYPE_CHECKING:
    from server.state.cluster import ClusterState

T0 = 1_000_000.0  # the time of everything a test does not date itself


def _per_gpu(value: float | Sequence[float], index: int) -> float:
    """One figure for every GPU, or one per GPU."""
    return float(value) if isinstance(value, int | float) else float(value[index])


def heartbeat(
    host_id: str = "h1",
    *,
    gpus: int = 2,
    model: str = "H100",
    gpu_memory_mb: int = 80_000,
    uuids: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
    unhealthy: Iterable[int] = (),
    fault: str | None = None,
    cpus: int = 16,
    memory_mb: int = 64_000,
    util: float | Sequence[float] = 0.0,
    temp_c: float | Sequence[float] = 0.0,
    power_w: float | Sequence[float] = 0.0,
    unread: Mapping[int, Sequence[GpuFigure]] | None = None,
    simulated: bool = False,
    boot_id: str = "boot-1",
    seq: int = 1,
    ts: float = T0,
    **fields: Any,
) -> Heartbeat:
    """Host `host_id` with `gpus` GPUs of `model` (`gpu_memory_mb` each, `uuids` if given),
    each reporting usage (`util` percent, `temp_c`, `power_w`: one figure, or one per GPU);
    the GPUs in `unhealthy` report unhealthy (with `fault`); `unread`: GPU index -> the
    figures its agent could not read (GpuUsage.unread, each then 0). Any other Heartbeat field
    (`cpu_pct`, `mem_used_mb`, `agent_version`, `term`, or `gpus`/`gpu_usage` lists
    built by hand, replacing the ones built here) is passed through."""
    bad = set(unhealthy)
    infos = [GpuInfo(index=i, model=model, memory_mb=gpu_memory_mb, **({"uuid": uuids[i]} if uuids else {}))
             for i in range(gpus)]
    usage = [GpuUsage(index=i, util_pct=_per_gpu(util, i), temp_c=_per_gpu(temp_c, i), power_w=_per_gpu(power_w, i),
                      healthy=i not in bad, fault=fault if i in bad else None) for i in range(gpus)]
    for i, figures in (unread or {}).items():
        usage[i] = GpuUsage.model_validate({**usage[i].model_dump(), "unread": list(figures),
                                            **{GPU_FIGURE_FIELDS[f]: 0 for f in figures}})
    values: dict[str, Any] = {"gpus": infos, "gpu_usage": usage, **fields}
    return Heartbeat(host_id=host_id, boot_id=boot_id, seq=seq, ts=ts, labels=dict(labels or {}), cpus=cpus,
                     memory_mb=memory_mb, simulated=simulated, **values)


def heartbeat_record(
    hb: Heartbeat | str = "h1",
    revision: int = 1,
    *,
    key: str | None = None,
    shape: bool = True,
    stamp: float = 0.0,
    behind: int = 0,
    skipped: int = 0,
    **heartbeat_fields: Any,
) -> Record:
    """A record of the `hosts` bucket as a watch yields it (what
    `ClusterState.apply_host_record` takes): the heartbeat's bytes under `key` (its
    host id unless given) at `revision`, with the `Muster-Shape` header an agent sends
    (`shape=False`: without it, as a record the server must decode), and the watch's
    `stamp`, `behind` and `skipped`. `hb` is a Heartbeat, or a host id for
    `heartbeat(hb, **heartbeat_fields)`."""
    if isinstance(hb, str):
        hb = heartbeat(hb, **heartbeat_fields)
    elif heartbeat_fields:
        raise TypeError("heartbeat fields given with a built Heartbeat")
    headers = {SHAPE_HEADER: shape_digest(hb)} if shape else None
    return Record(key or hb.host_id, revision, encode(hb), headers, stamp=stamp, behind=behind, skipped=skipped)


def job_spec(name: str = "j", *, command: Sequence[str] = ("true",), **fields: Any) -> JobSpec:
    """A job spec named `name` running `command`; any other JobSpec field may be given."""
    return JobSpec(name=name, command=list(command), **fields)


def job(
    job_id: str = "j",
    *,
    spec: JobSpec | None = None,
    state: JobState = JobState.QUEUED,
    submitted_at: float = T0,
    updated_at: float | None = None,
    **fields: Any,
) -> Job:
    """Job `job_id` in `state`, running `spec` (by default `job_spec(job_id)`), updated
    when submitted unless `updated_at` is given; any other Job field (`attempts`,
    `not_before`, `pending_reasons`, ...) may be given."""
    return Job(id=job_id, spec=spec if spec is not None else job_spec(job_id), state=state,
               submitted_at=submitted_at, updated_at=submitted_at if updated_at is None else updated_at, **fields)


def set_or_drop(state: ClusterState, step: Job | int) -> None:
    """One step of a property over a sequence of job records: a record applied to `state`
    (a Job), or job `j<step>` dropped from it (an int)."""
    if isinstance(step, Job):
        state._set_job(step)
    else:
        state._drop_job(f"j{step}")


def task(
    job_id: str = "j",
    number: int = 1,
    *,
    attempt_id: str | None = None,
    command: Sequence[str] = ("true",),
    **fields: Any,
) -> Task:
    """Try `number` of job `job_id` as a host's task (attempt id `<job>.<number>` unless
    given); any other Task field (`gpu_indices`, `cpus`, `memory_mb`, `term`, `stop`,
    ...) may be given."""
    return Task(attempt_id=attempt_id or f"{job_id}.{number}", job_id=job_id, number=number, command=list(command),
                **fields)


def host_alloc(host_id: str = "h1", tasks: Iterable[Task] = (), *, term: int = 0) -> HostAlloc:
    """The `alloc.<host>` record of `host_id`: its tasks, written in `term`."""
    return HostAlloc(host_id=host_id, term=term, tasks=list(tasks))


def host_capacity(
    host_id: str = "h1",
    *,
    gpus: int = 8,
    model: str = "H100",
    models: Mapping[int, str] | None = None,
    cpus: float = 64.0,
    memory_mb: int = 256_000,
    schedulable: bool = True,
    cordoned: bool = False,
    unhealthy: Iterable[int] = (),
    used_gpus: Iterable[int] = (),
    used_cpus: float = 0.0,
    used_memory_mb: int = 0,
    labels: Mapping[str, str] | None = None,
) -> HostCapacity:
    """What the placement knows of a host: `gpus` GPUs of `model` (or the index -> model
    map `models`), its CPUs and memory, what is used, health and cordon."""
    return HostCapacity(
        id=host_id,
        schedulable=schedulable,
        cordoned=cordoned,
        gpu_models=dict(models) if models is not None else {i: model for i in range(gpus)},
        unhealthy_gpus=frozenset(unhealthy),
        cpus=cpus,
        memory_mb=memory_mb,
        used_gpus=set(used_gpus),
        used_cpus=used_cpus,
        used_memory_mb=used_memory_mb,
        labels=dict(labels or {}),
    )
