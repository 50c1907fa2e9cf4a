"""The GraphQL API (strawberry). Types here are views; storage models live in messages.

Conventions: Relay-style connections with opaque cursors, one `input` argument per
mutation where the mutation takes more than an id, and payloads whose expected
failures are `userErrors`, never exceptions.
"""

from __future__ import annotations

import base64
import enum
import datetime as dt
import json
import time
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field as dc_field

import strawberry
from strawberry.extensions import (
    MaskErrors,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    ParserCache,
    QueryDepthLimiter,
    ValidationCache,
)
from strawberry.types import Info

from server.api import subscriptions
from server.api.auth import allows
from wire.messages import Attempt as AttemptModel
from wire.messages import Heartbeat, HostAlloc
from wire.messages import Job as JobModel
from wire.messages import JobState as JobStateEnum
from server.replica import HostView, Muster, UserError as UserErrorData

JobState = strawberry.enum(JobStateEnum, name="JobState")


def _ts(t: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc) if t else None


def _muster(info: Info) -> Muster:
    return info.context["muster"]


def _forbidden(info: Info, needed: str = "operator") -> list[UserError] | None:
    """A userError when the caller's role may not do this, else None."""
    if allows(info.context.get("token"), needed):
        return None
    return [UserError(field="", message=f"this needs the {needed} role", code="FORBIDDEN")]


def _user(info: Info) -> str:
    tok = info.context.get("token")
    return tok.name if tok else "anonymous"


def encode_cursor(n: int) -> str:
    """An offset cursor: the item at position `n`."""
    return _b64(f"o:{n}")


def _b64(s: str) -> str:
    return base64.urlsafe_b64encode(s.encode()).decode()


def _unb64(c: str) -> tuple[str, str]:
    try:
        kind, _, rest = base64.urlsafe_b64decode(c.encode()).decode().partition(":")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("invalid cursor") from exc
    return kind, rest


def decode_cursor(c: str | None) -> int:
    """The offset after an offset cursor (0 without one)."""
    if not c:
        return 0
    kind, n = _unb64(c)
    try:
        if kind != "o":
            raise ValueError
        return max(0, int(n) + 1)
    except ValueError as exc:
        raise ValueError("invalid cursor") from exc


def encode_key_cursor(kind: str, key: object) -> str:
    """A keyset cursor: the sort key of an item (stable when items come and go)."""
    return _b64(f"{kind}:{json.dumps(key, separators=(',', ':'))}")


def decode_key_cursor(c: str, kind: str) -> object:
    k, rest = _unb64(c)
    if k != kind:
        raise ValueError("invalid cursor")
    try:
        return json.loads(rest)
    except ValueError as exc:
        raise ValueError("invalid cursor") from exc


MAX_PAGE = 500


def _page_args(first: int | None, after: str | None) -> tuple[int, int]:
    n = 50 if first is None else first
    if n < 0 or n > MAX_PAGE:
        raise ValueError(f"first must be from 0 to {MAX_PAGE}")
    return decode_cursor(after), n


@strawberry.type
class UserError:
    field: str
    message: str
    code: str


def _errors(errs: list[UserErrorData]) -> list[UserError]:
    return [UserError(field=e.field, message=e.message, code=e.code) for e in errs]


@strawberry.type
class Label:
    key: str
    value: str


@strawberry.type
class PageInfo:
    has_next_page: bool
    end_cursor: str | None


@strawberry.type
class Host:
    id: strawberry.ID
    health: str
    cordoned: bool
    draining: bool
    simulated: bool
    labels: list[Label]
    gpus: int
    gpu_model: str
    gpus_allocated: int
    gpus_unhealthy: int
    gpu_util_pct: float
    cpus: int
    cpu_pct: float
    memory_mb: int
    mem_used_mb: int
    last_seen: dt.datetime | None
    tasks: int

    @staticmethod
    def from_view(v: HostView) -> Host:
        return Host(
            id=strawberry.ID(v.id), health=v.health, cordoned=v.cordoned, draining=v.draining,
            simulated=v.simulated,
            labels=[Label(key=k, value=val) for k, val in sorted(v.labels.items())],
            gpus=v.gpus, gpu_model=v.gpu_model, gpus_allocated=v.gpus_allocated,
            gpus_unhealthy=v.gpus_unhealthy, gpu_util_pct=v.gpu_util_pct, cpus=v.cpus,
            cpu_pct=v.cpu_pct, memory_mb=v.memory_mb, mem_used_mb=v.mem_used_mb,
            last_seen=_ts(v.last_seen), tasks=v.tasks,
        )

    @staticmethod
    def unknown(host_id: str) -> Host:
        return Host(
            id=strawberry.ID(host_id), health="LOST", cordoned=False, draining=False, simulated=False, labels=[],
            gpus=0, gpu_model="-", gpus_allocated=0, gpus_unhealthy=0, gpu_util_pct=0.0, cpus=0,
            cpu_pct=0.0, memory_mb=0, mem_used_mb=0, last_seen=None, tasks=0,
        )


@strawberry.type
class HostEdge:
    cursor: str
    node: Host


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
        v = _muster(info).host_view(self._m.host_id)
        return Host.from_view(v) if v else Host.unknown(self._m.host_id)

    @strawberry.field
    def gpu_indices(self) -> list[int]:
        return self._m.gpu_indices

    @strawberry.field
    def exit_code(self) -> int | None:
        return self._m.exit_code

    @strawberry.field
    def output_tail(self) -> str:
        return self._m.output_tail

    @strawberry.field
    def term(self) -> int:
        return self._m.term

    @strawberry.field
    def placed_at(self) -> dt.datetime | None:
        return _ts(self._m.placed_at)

    @strawberry.field
    def started_at(self) -> dt.datetime | None:
        return _ts(self._m.started_at)

    @strawberry.field
    def finished_at(self) -> dt.datetime | None:
        return _ts(self._m.finished_at)

    @strawberry.field
    def reason(self) -> str:
        return self._m.reason


@strawberry.type
class PendingReason:
    reason: str
    hosts: int


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
    def state(self) -> JobState:  # type: ignore[valid-type]
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

    @strawberry.field
    def gpu_model(self) -> str | None:
        return self._m.spec.gpu_model

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

    @strawberry.field
    def same_rack(self) -> bool:
        return self._m.spec.same_rack

    @strawberry.field
    def submitted_at(self) -> dt.datetime | None:
        return _ts(self._m.submitted_at)

    @strawberry.field
    def updated_at(self) -> dt.datetime | None:
        return _ts(self._m.updated_at)

    @strawberry.field
    def cancel_reason(self) -> str:
        return self._m.cancel_reason

    @strawberry.field
    def attempts(self) -> list[Attempt]:
        return [Attempt(_m=a, _job_id=self._m.id) for a in self._m.attempts]

    @strawberry.field(description="Why the job is still queued: hosts rejecting it, counted by reason.")
    def pending_reasons(self, info: Info) -> list[PendingReason]:
        reasons = _muster(info).why_pending(self._m)
        return [PendingReason(reason=r, hosts=n) for r, n in sorted(reasons.items(), key=lambda x: -x[1])]

    @strawberry.field(description="1-based place in the queue while QUEUED.")
    def queue_position(self, info: Info) -> int | None:
        return _muster(info).queue_position(self._m)


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


@strawberry.type
class GpuCounts:
    total: int
    allocated: int


@strawberry.type
class JobCounts:
    queued: int
    placed: int
    running: int
    succeeded: int
    failed: int
    cancelled: int


@strawberry.type
class Leadership:
    term: int
    leader: str
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
    state: JobState  # type: ignore[valid-type]
    count: int


@dataclass
class Aggregates:
    by_model: dict[str, list[int]] = dc_field(default_factory=dict)  # model -> [total, allocated, healthy]
    by_rack: dict[str, list[int]] = dc_field(default_factory=dict)
    cpu_total: float = 0.0
    cpu_allocated: float = 0.0
    mem_total: int = 0
    mem_allocated: int = 0


# What one host adds to the aggregates: (rack, cpus, memory MB, CPUs allocated, memory MB
# allocated, ((model, GPUs, allocated, healthy), ...)).
_Contribution = tuple[str, int, int, float, int, tuple[tuple[str, int, int, int], ...]]
# Per replica: host id -> (heartbeat, allocation, healthy, contribution), reused while the
# host's last decoded heartbeat and allocation record are the same objects and its health
# the same, so a `cluster` query over 50,000 hosts does not walk 400,000 GPUs each time.
_AGG_MEMO: weakref.WeakKeyDictionary[Muster, dict[str, tuple[Heartbeat, HostAlloc | None, bool, _Contribution]]] = (
    weakref.WeakKeyDictionary())


def _contribution(hb: Heartbeat, alloc: HostAlloc | None, host_ok: bool) -> _Contribution:
    used: set[int] = set()
    cpu_allocated, mem_allocated = 0.0, 0
    for t in alloc.tasks if alloc is not None else ():
        used.update(t.gpu_indices)
        cpu_allocated += t.cpus
        mem_allocated += t.memory_mb
    bad = {u.index for u in hb.gpu_usage if not u.healthy} if host_ok else None
    per_model: dict[str, list[int]] = {}
    for g in hb.gpus:
        m = per_model.get(g.model)
        if m is None:
            m = per_model[g.model] = [0, 0, 0]
        m[0] += 1
        m[1] += 1 if g.index in used else 0
        m[2] += 1 if bad is not None and g.index not in bad else 0
    return (hb.labels.get("rack") or "-", hb.cpus, hb.memory_mb, cpu_allocated, mem_allocated,
            tuple((k, v[0], v[1], v[2]) for k, v in per_model.items()))


def aggregates(mu: Muster, now: float | None = None) -> Aggregates:
    """GPU, CPU and memory totals and allocations in one pass over the hosts whose
    heartbeat key is live (LOST hosts count for nothing). Reads the last decoded
    heartbeat: what is counted here is part of its shape, so it is never stale. Each
    host's share is memoised (see _AGG_MEMO)."""
    st = mu.state
    now = st.health_time(now)
    memo = _AGG_MEMO.get(mu)
    if memo is None or len(memo) > len(st.hosts):
        memo = _AGG_MEMO[mu] = {k: v for k, v in (memo or {}).items() if k in st.hosts}
    agg = Aggregates()
    suspect_after = 2 * st.heartbeat_interval_s
    for host_id, e in st.hosts.items():
        hb = e.heartbeat
        if hb is None or not e.present:
            continue
        host_ok = now - e.seen_at <= suspect_after  # server.health.rules.host_health of a present host, inlined
        alloc = st.allocs.get(host_id)
        hit = memo.get(host_id)
        if hit is not None and hit[0] is hb and hit[1] is alloc and hit[2] == host_ok:
            c = hit[3]
        else:
            c = _contribution(hb, alloc, host_ok)
            memo[host_id] = (hb, alloc, host_ok, c)
        rack, cpus, mem, cpu_allocated, mem_allocated, models = c
        agg.cpu_total += cpus
        agg.mem_total += mem
        agg.cpu_allocated += cpu_allocated
        agg.mem_allocated += mem_allocated
        r = agg.by_rack.get(rack)
        if r is None:
            r = agg.by_rack[rack] = [0, 0, 0]
        for model, total, allocated, healthy in models:
            m = agg.by_model.get(model)
            if m is None:
                m = agg.by_model[model] = [0, 0, 0]
            m[0] += total
            m[1] += allocated
            m[2] += healthy
            r[0] += total
            r[1] += allocated
            r[2] += healthy
    return agg


@strawberry.type
class Cluster:
    hosts: HostCounts
    gpus: GpuCounts
    jobs: JobCounts
    leadership: Leadership
    _mu: strawberry.Private[Muster | None] = None
    _agg: strawberry.Private[Aggregates | None] = None

    def _aggregates(self) -> Aggregates:
        if self._agg is None:
            assert self._mu is not None
            self._agg = aggregates(self._mu)
        return self._agg

    @strawberry.field(description="GPUs on live hosts by GPU model.")
    def gpus_by_model(self) -> list[GpuModelCounts]:
        return [GpuModelCounts(model=k, total=v[0], allocated=v[1], healthy=v[2])
                for k, v in sorted(self._aggregates().by_model.items())]

    @strawberry.field(description="GPUs on live hosts by `rack` label.")
    def gpus_by_rack(self) -> list[GpuRackCounts]:
        return [GpuRackCounts(rack=k, total=v[0], allocated=v[1], healthy=v[2])
                for k, v in sorted(self._aggregates().by_rack.items())]

    @strawberry.field(description="CPUs of live hosts, and those reserved by their tasks.")
    def cpu(self) -> CpuCounts:
        a = self._aggregates()
        return CpuCounts(total=a.cpu_total, allocated=round(a.cpu_allocated, 3))

    @strawberry.field(description="Memory (MB) of live hosts, and that reserved by their tasks.")
    def memory_mb(self) -> MemoryCounts:
        a = self._aggregates()
        return MemoryCounts(total=a.mem_total, allocated=a.mem_allocated)

    @strawberry.field(description="Jobs held in the state store, by state (every state, zeros too).")
    def jobs_by_state(self) -> list[JobStateCount]:
        assert self._mu is not None
        counts = self._mu.state.job_counts()
        return [JobStateCount(state=st, count=counts.get(st.value, 0)) for st in JobStateEnum]


@strawberry.enum(description="What happens to a running attempt when its host is cut off.")
class OnDisconnect(enum.Enum):
    STOP = "STOP"
    KEEP_RUNNING = "KEEP_RUNNING"


@strawberry.input
class SubmitJobInput:
    name: str
    command: list[str]
    gpus: int = 0
    gpu_model: str | None = None
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


@strawberry.type
class SubmitJobPayload:
    job: Job | None
    user_errors: list[UserError]


@strawberry.type
class CancelJobPayload:
    job: Job | None
    user_errors: list[UserError]


@strawberry.input
class HostActionInput:
    id: strawberry.ID
    reason: str = ""


@strawberry.input
class DrainHostInput:
    id: strawberry.ID
    reason: str
    deadline_seconds: float = 300.0


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


@strawberry.input(description="Hosts matching every given field.")
class HostFilter:
    health: list[str] | None = strawberry.field(default=None, description="HEALTHY, SUSPECT and/or LOST.")
    rack: str | None = None
    zone: str | None = None
    gpu_model: str | None = strawberry.field(default=None, description="Hosts with at least one GPU of this model.")
    label: str | None = strawberry.field(default=None, description="`key=value`, or `key` for any value.")
    cordoned: bool | None = None
    search: str | None = strawberry.field(default=None, description="Host id prefix.")


@strawberry.enum
class HostSort(enum.Enum):
    ID_ASC = "ID_ASC"
    ID_DESC = "ID_DESC"
    HEALTH = "HEALTH"  # LOST, then SUSPECT, then HEALTHY
    GPUS_FREE_DESC = "GPUS_FREE_DESC"
    LAST_SEEN_DESC = "LAST_SEEN_DESC"


@strawberry.input(description="Jobs matching every given field.")
class JobFilter:
    state: list[JobState] | None = None  # type: ignore[valid-type]
    user: str | None = None
    name_prefix: str | None = None
    priority: int | None = None
    submitted_after: dt.datetime | None = strawberry.field(default=None, description="Inclusive.")
    submitted_before: dt.datetime | None = strawberry.field(default=None, description="Exclusive.")


@strawberry.enum
class JobSort(enum.Enum):
    SUBMITTED_AT_DESC = "-submitted_at"
    SUBMITTED_AT_ASC = "submitted_at"
    PRIORITY_DESC = "-priority"
    PRIORITY_ASC = "priority"


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


_HEALTH_RANK = {"LOST": 0, "SUSPECT": 1, "HEALTHY": 2}


def _epoch(t: dt.datetime | None) -> float | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def select_hosts(mu: Muster, f: HostFilter | None, sort: HostSort, now: float) -> list[tuple[str | int | float, ...]]:
    """The sort key of every matching host, in order; a key's last item is the host id.
    One pass over the hosts, reading only what the shape of the last decoded heartbeat
    holds (no decoding).

    Keys are tuples of strings and numbers only, which the garbage collector stops
    tracking at its next young collection. (Keys of lists, 100,000 tracked objects per
    call at 50,000 hosts, were promoted to the oldest generation while the call ran, and
    every fifth or so hosts query paid a full collection: ~2 s at 50,000 hosts.)"""
    st = mu.state
    healths = {h.upper() for h in f.health} if f and f.health else None
    rack = f.rack if f else None
    zone = f.zone if f else None
    model = f.gpu_model if f else None
    label_k = label_v = None
    if f and f.label:
        label_k, eq, label_v = f.label.partition("=")
        if not eq:
            label_v = None
    cordoned = f.cordoned if f else None
    search = f.search if f else None
    need_health = healths is not None or sort is HostSort.HEALTH
    out: list[tuple[str | int | float, ...]] = []
    for hid, e in st.hosts.items():
        hb = e.heartbeat
        if hb is None:
            continue
        if search and not hid.startswith(search):
            continue
        labels = hb.labels
        if rack is not None and labels.get("rack") != rack:
            continue
        if zone is not None and labels.get("zone") != zone:
            continue
        if label_k is not None and (label_k not in labels or (label_v is not None and labels[label_k] != label_v)):
            continue
        if model is not None and not any(g.model == model for g in hb.gpus):
            continue
        if cordoned is not None:
            cfg = st.hostcfg.get(hid)
            if bool(cfg and cfg.cordoned) != cordoned:
                continue
        health = st.health(hid, now).value if need_health else ""
        if healths is not None and health not in healths:
            continue
        if sort is HostSort.HEALTH:
            key: tuple[str | int | float, ...] = (_HEALTH_RANK.get(health, 3), hid)
        elif sort is HostSort.GPUS_FREE_DESC:
            alloc = st.allocs.get(hid)
            used = len({i for t in alloc.tasks for i in t.gpu_indices}) if alloc else 0
            bad = sum(1 for u in hb.gpu_usage if not u.healthy)
            key = (-(len(hb.gpus) - used - bad), hid)
        elif sort is HostSort.LAST_SEEN_DESC:
            key = (-round(e.seen_at, 6), hid)
        else:
            key = (hid,)
        out.append(key)
    out.sort(reverse=sort is HostSort.ID_DESC)
    return out


def _page_after(rows: list[tuple[str | int | float, ...]], after: list[object], reverse: bool) -> int:
    """Index of the first row strictly after the cursor key."""
    import bisect

    key = tuple(after)
    try:
        if not reverse:
            return bisect.bisect_right(rows, key)  # type: ignore[arg-type]
        for i, k in enumerate(rows):
            if k < key:  # type: ignore[operator]
                return i
    except TypeError as exc:  # a cursor whose values do not compare with this sort's keys
        raise ValueError("invalid cursor") from exc
    return len(rows)


def _count(history: object, table: object, conds: list[object]) -> int:
    from sqlalchemy import func
    from sqlmodel import Session, select

    with Session(history.engine) as s:  # type: ignore[attr-defined]
        return int(s.exec(select(func.count()).select_from(table).where(*conds)).one())  # type: ignore[arg-type]


def _cluster(mu: Muster) -> Cluster:
    s = mu.summary()
    j = s.jobs
    return Cluster(
        hosts=HostCounts(total=s.hosts_total, healthy=s.hosts_healthy, suspect=s.hosts_suspect,
                         lost=s.hosts_lost),
        gpus=GpuCounts(total=s.gpus_total, allocated=s.gpus_allocated),
        jobs=JobCounts(queued=j.get("QUEUED", 0), placed=j.get("PLACED", 0), running=j.get("RUNNING", 0),
                       succeeded=j.get("SUCCEEDED", 0), failed=j.get("FAILED", 0),
                       cancelled=j.get("CANCELLED", 0)),
        leadership=Leadership(term=mu.state.term, leader=mu.state.leader, role=mu.role,
                              replica=mu.config.name),
        _mu=mu,
    )


def _alert(r: object) -> Alert:
    return Alert(id=strawberry.ID(r.id), kind=r.kind.removeprefix("alert."), ts=_ts(r.ts),  # type: ignore[attr-defined]
                 host_id=r.host_id, job_id=r.job_id, message=r.message)  # type: ignore[attr-defined]


@strawberry.type
class Query:
    @strawberry.field
    def ping(self) -> str:
        return "pong"

    @strawberry.field
    def job(self, info: Info, id: strawberry.ID) -> Job | None:
        m = _muster(info).get_job(str(id))
        return Job(_m=m) if m else None

    @strawberry.field(description="Jobs from the history database (newest first by default). "
                                  "Cursors are keyset cursors: stable while jobs are added.")
    def jobs(
        self,
        info: Info,
        first: int | None = 50,
        after: str | None = None,
        state: JobState | None = None,  # type: ignore[valid-type]
        filter: JobFilter | None = None,
        sort: JobSort = JobSort.SUBMITTED_AT_DESC,
    ) -> JobConnection:
        from server.history.database import job_cursor

        _, n = _page_args(first, None)
        mu = _muster(info)
        assert mu.history is not None
        states: list[str] = []
        if state is not None:
            states.append(state.value)
        if filter and filter.state:
            states.extend(s.value for s in filter.state if s.value not in states)
        offset = 0
        keyset: str | None = None
        if after:
            kind, rest = _unb64(after)
            if kind == "o":
                offset = decode_cursor(after)
            elif kind == "j":
                sort_name, _, keyset = rest.partition(":")
                if sort_name != sort.value:
                    raise ValueError("this cursor belongs to another sort order")
            else:
                raise ValueError("invalid cursor")
        f = filter or JobFilter()
        rows, total = mu.history.list_jobs(
            state=states or None, user=f.user, name=f.name_prefix, priority=f.priority,
            submitted_after=_epoch(f.submitted_after), submitted_before=_epoch(f.submitted_before),
            sort=sort.value, limit=n + 1, offset=offset, after=keyset)
        more = len(rows) > n
        rows = rows[:n]
        edges = [JobEdge(cursor=_b64(f"j:{sort.value}:{job_cursor(j, sort.value)}"),
                         node=Job(_m=mu.state.jobs.get(j.id, j))) for j in rows]
        return JobConnection(
            total_count=total,
            edges=edges,
            page_info=PageInfo(has_next_page=more, end_cursor=edges[-1].cursor if edges else None),
        )

    @strawberry.field
    def host(self, info: Info, id: strawberry.ID) -> Host | None:
        v = _muster(info).host_view(str(id))
        return Host.from_view(v) if v else None

    @strawberry.field(description="Hosts, filtered and sorted in one pass. Cursors are keyset cursors: "
                                  "stable while hosts come and go.")
    def hosts(
        self,
        info: Info,
        first: int | None = 50,
        after: str | None = None,
        health: str | None = None,
        filter: HostFilter | None = None,
        sort: HostSort = HostSort.ID_ASC,
    ) -> HostConnection:
        _, n = _page_args(first, None)
        mu = _muster(info)
        now = time.time()
        if health:
            filter = HostFilter(**{**(vars(filter) if filter else {}), "health": [health]})
        rows = select_hosts(mu, filter, sort, now)
        start = 0
        if after:
            kind, _ = _unb64(after)
            if kind == "o":
                start = decode_cursor(after)
            else:
                key = decode_key_cursor(after, "h" + sort.value)
                if not isinstance(key, list):
                    raise ValueError("invalid cursor")
                start = _page_after(rows, key, sort is HostSort.ID_DESC)
        page = rows[start: start + n]
        edges = []
        for key in page:
            v = mu.host_view(str(key[-1]), now)
            if v is not None:
                edges.append(HostEdge(cursor=encode_key_cursor("h" + sort.value, key), node=Host.from_view(v)))
        return HostConnection(
            total_count=len(rows),
            edges=edges,
            page_info=PageInfo(has_next_page=start + len(page) < len(rows),
                               end_cursor=edges[-1].cursor if edges else None),
        )

    @strawberry.field(description="Attempts from the history database, by placement time.")
    def attempts(self, info: Info, first: int | None = 50, after: str | None = None,
                 job_id: strawberry.ID | None = None, host_id: strawberry.ID | None = None,
                 newest_first: bool = False) -> AttemptConnection:
        from server.history.database import AttemptRow
        from wire.messages import AttemptState

        offset, n = _page_args(first, after)
        mu = _muster(info)
        assert mu.history is not None
        jid = str(job_id) if job_id is not None else None
        hid = str(host_id) if host_id is not None else None
        rows = mu.history.list_attempts(job_id=jid, host_id=hid, limit=n, offset=offset, newest_first=newest_first)
        conds = []
        if jid is not None:
            conds.append(AttemptRow.job_id == jid)
        if hid is not None:
            conds.append(AttemptRow.host_id == hid)
        total = _count(mu.history, AttemptRow, conds)
        jobs: dict[str, JobModel | None] = {}
        edges = []
        for i, r in enumerate(rows):
            if r.job_id not in jobs:
                jobs[r.job_id] = mu.get_job(r.job_id)
            job = jobs[r.job_id]
            m = next((a for a in job.attempts if a.id == r.id), None) if job else None
            if m is None:
                m = AttemptModel(id=r.id, number=r.number, host_id=r.host_id, state=AttemptState(r.state),
                                 term=r.term, placed_at=r.placed_at, started_at=r.started_at,
                                 finished_at=r.finished_at, exit_code=r.exit_code)
            edges.append(AttemptEdge(cursor=encode_cursor(offset + i), node=Attempt(_m=m, _job_id=r.job_id)))
        return AttemptConnection(total_count=total, edges=edges, page_info=PageInfo(
            has_next_page=offset + len(edges) < total, end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field(description="Recorded job, attempt and host events, oldest first unless newestFirst.")
    def events(self, info: Info, first: int | None = 50, after: str | None = None,
               job_id: strawberry.ID | None = None, host_id: strawberry.ID | None = None,
               kind: str | None = None, since: dt.datetime | None = None,
               newest_first: bool = False) -> HistoryEventConnection:
        from server.history.database import EventRow

        offset, n = _page_args(first, after)
        mu = _muster(info)
        assert mu.history is not None
        jid = str(job_id) if job_id is not None else None
        hid = str(host_id) if host_id is not None else None
        since_s = _epoch(since)
        rows = mu.history.list_events(job_id=jid, host_id=hid, kind=kind, since=since_s, limit=n, offset=offset,
                                      newest_first=newest_first)
        conds = []
        if jid is not None:
            conds.append(EventRow.job_id == jid)
        if hid is not None:
            conds.append(EventRow.host_id == hid)
        if kind is not None:
            conds.append(EventRow.kind == kind)
        if since_s is not None:
            conds.append(EventRow.ts >= since_s)
        total = _count(mu.history, EventRow, conds)
        edges = [HistoryEventEdge(cursor=encode_cursor(offset + i), node=HistoryEvent(
            id=strawberry.ID(r.id), ts=_ts(r.ts), kind=r.kind, job_id=r.job_id, host_id=r.host_id,
            message=r.message)) for i, r in enumerate(rows)]
        return HistoryEventConnection(total_count=total, edges=edges, page_info=PageInfo(
            has_next_page=offset + len(edges) < total, end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field(description="Alerts, newest first (also published on the `alerts.>` NATS subjects).")
    def alerts(self, info: Info, first: int | None = 50, after: str | None = None,
               kind: str | None = None) -> AlertConnection:
        from server.history.recorder import list_alerts

        offset, n = _page_args(first, after)
        mu = _muster(info)
        assert mu.history is not None
        rows, total = list_alerts(mu.history, kind=kind, limit=n, offset=offset)
        edges = [AlertEdge(cursor=encode_cursor(offset + i), node=_alert(r)) for i, r in enumerate(rows)]
        return AlertConnection(total_count=total, edges=edges, page_info=PageInfo(
            has_next_page=offset + len(edges) < total, end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field
    def cluster(self, info: Info) -> Cluster:
        return _cluster(_muster(info))


@strawberry.type
class HostHealthChange:
    host_id: strawberry.ID
    old_health: str | None = strawberry.field(description="null when the host was not known before.")
    new_health: str
    at: dt.datetime | None

    @strawberry.field
    def host(self, info: Info) -> Host | None:
        v = _muster(info).host_view(str(self.host_id))
        return Host.from_view(v) if v else None


def _can_read(info: Info) -> None:
    if not allows(info.context.get("token"), "viewer"):
        raise PermissionError("a valid token is required")


@strawberry.type
class Subscription:
    @strawberry.subscription(description="Host health transitions (HEALTHY, SUSPECT, LOST), as they happen.")
    async def host_health(self, info: Info, host_id: strawberry.ID | None = None) -> AsyncGenerator[HostHealthChange, None]:
        _can_read(info)
        gen = subscriptions.hub_for(_muster(info)).host_health()
        try:
            async for c in gen:
                if host_id is None or c.host_id == str(host_id):
                    yield HostHealthChange(host_id=strawberry.ID(c.host_id), old_health=c.old, new_health=c.new,
                                           at=_ts(c.ts))
        finally:
            await gen.aclose()

    @strawberry.subscription(description="Job records as they change; with `id`, that job only: its "
                                         "current record first, and the subscription completes once it has finished.")
    async def job_updates(self, info: Info, id: strawberry.ID | None = None) -> AsyncGenerator[Job, None]:
        _can_read(info)
        mu = _muster(info)
        gen = subscriptions.hub_for(mu).job_updates(str(id) if id is not None else None)
        try:
            if id is not None:
                current = mu.get_job(str(id))
                if current is None:
                    raise ValueError(f"no job {id}")
                yield Job(_m=current)
                if current.state.terminal:
                    return
            async for j in gen:
                yield Job(_m=j)
                if id is not None and j.state.terminal:
                    return
        finally:
            await gen.aclose()

    @strawberry.subscription(description="The cluster summary every `intervalSeconds` (at least 0.5).")
    async def cluster_stats(self, info: Info, interval_seconds: float = 2.0) -> AsyncGenerator[Cluster, None]:
        import asyncio

        _can_read(info)
        mu = _muster(info)
        interval = max(0.5, min(interval_seconds, 3600.0))
        while True:
            yield _cluster(mu)
            await asyncio.sleep(interval)

    @strawberry.subscription(description="Alerts as they are published (`kind` like \"host.lost\").")
    async def alerts(self, info: Info, kind: str | None = None) -> AsyncGenerator[Alert, None]:
        _can_read(info)
        gen = subscriptions.hub_for(_muster(info)).alerts(kind)
        try:
            async for a in gen:
                yield Alert(id=strawberry.ID(a.id), kind=a.kind, ts=_ts(a.ts), host_id=a.host_id, job_id=a.job_id,
                            message=a.message)
        finally:
            await gen.aclose()


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def submit_job(self, info: Info, input: SubmitJobInput) -> SubmitJobPayload:
        if denied := _forbidden(info):
            return SubmitJobPayload(job=None, user_errors=denied)
        job, errors = await _muster(info).submit(_job_data(input), _user(info))
        return SubmitJobPayload(job=Job(_m=job) if job else None, user_errors=_errors(errors))

    @strawberry.mutation(description="Submit up to 1,000 jobs in one request; each gets its own payload.")
    async def submit_jobs(self, info: Info, input: list[SubmitJobInput]) -> list[SubmitJobPayload]:
        if denied := _forbidden(info):
            return [SubmitJobPayload(job=None, user_errors=denied)]
        if len(input) > MAX_BATCH_SUBMIT:
            return [SubmitJobPayload(job=None, user_errors=[UserError(
                field="input", message=f"at most {MAX_BATCH_SUBMIT} jobs per request", code="TOO_LARGE")])]
        results = await _muster(info).submit_many([_job_data(i) for i in input], _user(info))
        return [SubmitJobPayload(job=Job(_m=j) if j else None, user_errors=_errors(e)) for j, e in results]

    @strawberry.mutation
    async def cancel_job(self, info: Info, id: strawberry.ID, reason: str = "") -> CancelJobPayload:
        mu = _muster(info)
        if denied := _forbidden(info):
            return CancelJobPayload(job=None, user_errors=denied)
        errors = await mu.cancel(str(id), _user(info), reason)
        job = mu.get_job(str(id))
        return CancelJobPayload(job=Job(_m=job) if job else None, user_errors=_errors(errors))

    @strawberry.mutation
    async def cordon_host(self, info: Info, input: HostActionInput) -> HostActionPayload:
        return await _host_action(info, input, True)

    @strawberry.mutation
    async def uncordon_host(self, info: Info, input: HostActionInput) -> HostActionPayload:
        return await _host_action(info, input, False)

    @strawberry.mutation(description="Cordon a host and stop what still runs on it after the deadline.")
    async def drain_host(self, info: Info, input: DrainHostInput) -> HostActionPayload:
        mu = _muster(info)
        if denied := _forbidden(info):
            return HostActionPayload(host=None, user_errors=denied)
        errors = await mu.drain(str(input.id), _user(info), input.reason, input.deadline_seconds)
        v = mu.host_view(str(input.id))
        return HostActionPayload(host=Host.from_view(v) if v else None, user_errors=_errors(errors))


MAX_BATCH_SUBMIT = 1000


def _job_data(i: SubmitJobInput) -> dict[str, object]:
    return {
        "name": i.name, "command": i.command, "gpus": i.gpus, "gpu_model": i.gpu_model,
        "cpus": i.cpus, "memory_mb": i.memory_mb, "priority": i.priority,
        "max_attempts": i.max_attempts, "cwd": i.cwd, "env": i.env or {},
        "on_disconnect": i.on_disconnect.value, "replace_after_s": i.replace_after,
        "replicas": i.replicas, "same_rack": i.same_rack,
    }


async def _host_action(info: Info, input: HostActionInput, cordon: bool) -> HostActionPayload:
    mu = _muster(info)
    if denied := _forbidden(info):
        return HostActionPayload(host=None, user_errors=denied)
    errors = await mu.set_cordon(str(input.id), cordon, _user(info), input.reason)
    v = mu.host_view(str(input.id))
    return HostActionPayload(host=Host.from_view(v) if v else None, user_errors=_errors(errors))


def build_schema(production: bool = False) -> strawberry.Schema:
    extensions: list = [
        lambda: ParserCache(maxsize=256),
        lambda: ValidationCache(maxsize=256),
        lambda: QueryDepthLimiter(max_depth=10),
        lambda: MaxTokensLimiter(max_token_count=5000),
        lambda: MaxAliasesLimiter(max_alias_count=30),
    ]
    if production:
        extensions.append(MaskErrors)
    return strawberry.Schema(query=Query, mutation=Mutation, subscription=Subscription, extensions=extensions)


def schema_sdl() -> str:
    return build_schema().as_str() + "\n"

