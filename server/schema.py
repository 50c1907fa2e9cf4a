"""The GraphQL API (strawberry). Types here are views; storage models live in messages.

Conventions: Relay-style connections with opaque cursors, one `input` argument per
mutation where the mutation takes more than an id, and payloads whose expected
failures are `userErrors`, never exceptions.
"""

from __future__ import annotations

import base64
import enum
import datetime as dt
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

from server.auth import allows
from server.messages import Attempt as AttemptModel
from server.messages import Job as JobModel
from server.messages import JobState as JobStateEnum
from server.runtime import HostView, Muster, UserError as UserErrorData

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
    return base64.urlsafe_b64encode(f"o:{n}".encode()).decode()


def decode_cursor(c: str | None) -> int:
    if not c:
        return 0
    try:
        kind, _, n = base64.urlsafe_b64decode(c.encode()).decode().partition(":")
        if kind != "o":
            raise ValueError
        return max(0, int(n) + 1)
    except (ValueError, UnicodeDecodeError) as exc:
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

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self._m.id)

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
        return [Attempt(_m=a) for a in self._m.attempts]

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
class Cluster:
    hosts: HostCounts
    gpus: GpuCounts
    jobs: JobCounts
    leadership: Leadership


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


@strawberry.type
class Query:
    @strawberry.field
    def ping(self) -> str:
        return "pong"

    @strawberry.field
    def job(self, info: Info, id: strawberry.ID) -> Job | None:
        m = _muster(info).get_job(str(id))
        return Job(_m=m) if m else None

    @strawberry.field
    def jobs(
        self,
        info: Info,
        first: int | None = 50,
        after: str | None = None,
        state: JobState | None = None,  # type: ignore[valid-type]
    ) -> JobConnection:
        offset, n = _page_args(first, after)
        mu = _muster(info)
        assert mu.history is not None
        rows, total = mu.history.list_jobs(state=state.value if state else None, limit=n, offset=offset)
        edges = [JobEdge(cursor=encode_cursor(offset + i), node=Job(_m=mu.state.jobs.get(j.id, j)))
                 for i, j in enumerate(rows)]
        return JobConnection(
            total_count=total,
            edges=edges,
            page_info=PageInfo(has_next_page=offset + len(edges) < total,
                               end_cursor=edges[-1].cursor if edges else None),
        )

    @strawberry.field
    def host(self, info: Info, id: strawberry.ID) -> Host | None:
        v = _muster(info).host_view(str(id))
        return Host.from_view(v) if v else None

    @strawberry.field
    def hosts(
        self,
        info: Info,
        first: int | None = 50,
        after: str | None = None,
        health: str | None = None,
    ) -> HostConnection:
        offset, n = _page_args(first, after)
        views = _muster(info).host_views()
        if health:
            views = [v for v in views if v.health == health.upper()]
        page = views[offset: offset + n]
        edges = [HostEdge(cursor=encode_cursor(offset + i), node=Host.from_view(v)) for i, v in enumerate(page)]
        return HostConnection(
            total_count=len(views),
            edges=edges,
            page_info=PageInfo(has_next_page=offset + len(edges) < len(views),
                               end_cursor=edges[-1].cursor if edges else None),
        )

    @strawberry.field(description="Alerts, newest first (also published on the `alerts.>` NATS subjects).")
    def alerts(self, info: Info, first: int | None = 50, after: str | None = None,
               kind: str | None = None) -> AlertConnection:
        from server.recorder import list_alerts

        offset, n = _page_args(first, after)
        mu = _muster(info)
        assert mu.history is not None
        rows, total = list_alerts(mu.history, kind=kind, limit=n, offset=offset)
        edges = [AlertEdge(cursor=encode_cursor(offset + i), node=Alert(
            id=strawberry.ID(r.id), kind=r.kind.removeprefix("alert."), ts=_ts(r.ts), host_id=r.host_id,
            job_id=r.job_id, message=r.message)) for i, r in enumerate(rows)]
        return AlertConnection(total_count=total, edges=edges, page_info=PageInfo(
            has_next_page=offset + len(edges) < total, end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field
    def cluster(self, info: Info) -> Cluster:
        mu = _muster(info)
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
        )


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
    return strawberry.Schema(query=Query, mutation=Mutation, extensions=extensions)


def schema_sdl() -> str:
    return build_schema().as_str() + "\n"

