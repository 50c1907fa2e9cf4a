"""The GraphQL queries. Hosts come from the host read model (server.views.hosts), jobs
from the job view (live record, else history), attempts, events and alerts from the
history database."""

from __future__ import annotations

import datetime as dt
import json
import time

import strawberry
from strawberry.types import Info

from server.api.graphql.context import epoch, muster, ts
from server.api.graphql.cursors import (
    b64,
    decode_cursor,
    decode_key_cursor,
    encode_cursor,
    encode_key_cursor,
    history_cursor,
    history_page,
    index_after,
    job_keyset,
    page_args,
    unb64,
)
from server.api.graphql.inputs import HostFilter, HostSort, JobFilter, JobSort
from server.api.graphql.types import (
    AdvanceReservation,
    Alert,
    AlertConnection,
    AlertEdge,
    Attempt,
    AttemptConnection,
    AttemptEdge,
    Cluster,
    GpuCounts,
    HistoryEvent,
    HistoryEventConnection,
    HistoryEventEdge,
    Host,
    HostConnection,
    HostCounts,
    HostEdge,
    IdleGpus,
    Job,
    JobConnection,
    JobCounts,
    JobEdge,
    JobState,
    Leadership,
    PageInfo,
    Queue,
    QueueConnection,
    QueueEdge,
    Usage,
)
from server.api.reads import in_thread, reads_for
from server.health.idlegpus import running_idle
from server.health.rules import Health
from server.history.database import JOB_SORTS, job_cursor
from server.history.models import EventRow
from server.replica import Muster
from server.views.hosts import ORDERS, HostQuery, HostRow
from server.views.queues import rows as queue_rows
from wire.errors import ValidationError
from wire.messages import Attempt as AttemptModel
from wire.messages import AttemptState
from wire.messages import Job as JobModel

# History reads at most that make one page of `jobs` (the rows of the first, then those
# after them while rows whose live record no longer passes the filters left it short).
JOB_PAGE_READS = 4

# GraphQL host sorts as orders of the read model.
HOST_ORDERS = {HostSort.ID_ASC: "id", HostSort.ID_DESC: "-id", HostSort.HEALTH: "health",
               HostSort.GPUS_FREE_DESC: "free", HostSort.LAST_SEEN_DESC: "last_seen"}


def host_query(f: HostFilter | None) -> HostQuery:
    if f is None:
        return HostQuery()
    health = frozenset(h.upper() for h in f.health) if f.health else None
    unknown = sorted((health or set()) - {h.value for h in Health})
    if unknown:
        # (found by exploring: an unknown one matched no host, quietly, where an unknown
        # job state is refused)
        raise ValidationError("health", f"unknown health {', '.join(map(repr, unknown))}: HEALTHY, SUSPECT or LOST",
                              "INVALID")
    if f.label == "":
        # (found by exploring: taken for no selector, it matched every host, and a script's
        # empty variable cordoned or drained the whole cluster through the CLI)
        raise ValidationError("label", "an empty label selector: give a key or key=value, or leave it out",
                              "INVALID")
    return HostQuery(search=f.search or None, health=health,
                     rack=f.rack, zone=f.zone, model=f.gpu_model, label=f.label, cordoned=f.cordoned,
                     draining=f.draining, drain_scheduled=f.drain_scheduled, gpu_faults=f.gpu_faults,
                     pressure=f.pressure)


def host_key(r: HostRow, order: str) -> tuple[str | int | float, ...]:
    """A host's keyset-cursor key under `order`: its sort value(s), then its id."""
    if order in ("id", "-id"):
        return (r.id,)
    value = ORDERS[order].key(r)
    return (*value, r.id) if isinstance(value, tuple) else (value, r.id)


def cluster(mu: Muster) -> Cluster:
    now = time.time()
    c = mu.hosts.counts(now)
    j = mu.state.job_counts()
    return Cluster(
        hosts=HostCounts(total=c.total, healthy=c.health["HEALTHY"], suspect=c.health["SUSPECT"],
                         lost=c.health["LOST"]),
        gpus=GpuCounts(total=c.gpus_total, allocated=c.gpus_allocated),
        jobs=JobCounts(queued=j.get("QUEUED", 0), placed=j.get("PLACED", 0), running=j.get("RUNNING", 0),
                       succeeded=j.get("SUCCEEDED", 0), failed=j.get("FAILED", 0),
                       cancelled=j.get("CANCELLED", 0), timeout=j.get("TIMEOUT", 0)),
        leadership=Leadership(term=mu.term, leader=mu.leader, role=mu.role,
                              replica=mu.config.name),
        _mu=mu,
    )


def alert(r: EventRow) -> Alert:
    return Alert(id=strawberry.ID(r.id), kind=r.kind.removeprefix("alert."), ts=ts(r.ts),
                 host_id=r.host_id, job_id=r.job_id, message=r.message)


def _before(keyset: str) -> tuple[float, str]:
    """A newest-first cursor's job (submission time, id), from its key as `job_keyset`
    checked it."""
    when, job_id = json.loads(keyset)
    return float(when), str(job_id)


@strawberry.type
class Query:
    @strawberry.field
    def ping(self) -> str:
        return "pong"

    @strawberry.field
    async def job(self, info: Info, id: strawberry.ID) -> Job | None:
        mu = muster(info)
        m = mu.state.jobs.get(str(id)) or await in_thread(mu.jobs.get, str(id))
        return Job(_m=m) if m else None

    @strawberry.field(description="Running jobs whose GPUs have all been idle for their agent's --gpu-idle-after "
                                  "(alert job.gpus_idle), idle longest first; at most `first` (1,000 at most).")
    def idle_gpus(self, info: Info, first: int = 100) -> list[IdleGpus]:
        if not 0 <= first <= 1000:
            raise ValidationError("first", "must be from 0 to 1000", "OUT_OF_RANGE")
        state = muster(info).state
        found = sorted(running_idle(state.idle_gpus(), state.jobs), key=lambda f: (f[3], f[1].id))
        return [IdleGpus(job=Job(_m=job), attempt=Attempt(_m=a, _job_id=job.id), host=strawberry.ID(host_id),
                         since=dt.datetime.fromtimestamp(since, tz=dt.UTC)) for job, a, host_id, since in found[:first]]

    @strawberry.field(description="Jobs from the history database (newest first by default), with live "
                                  "records laid over them; the first page newest first also lists the "
                                  "matching jobs history has not written yet. Cursors are keyset cursors: "
                                  "stable while jobs are added.")
    async def jobs(
        self,
        info: Info,
        first: int | None = 50,
        after: str | None = None,
        state: JobState | None = None,
        filter: JobFilter | None = None,
        sort: JobSort = JobSort.SUBMITTED_AT_DESC,
    ) -> JobConnection:
        _, n = page_args(first, None)
        mu = muster(info)
        assert mu.history is not None
        offset = 0
        keyset: str | None = None
        if after:
            kind, rest = unb64(after)
            if kind == "o":
                offset = decode_cursor(after)
            elif kind == "j":
                sort_name, _, keyset = rest.partition(":")
                if sort_name != sort.value:
                    raise ValidationError("after", "this cursor belongs to another sort order", "INVALID_CURSOR")
                keyset = job_keyset(keyset, [column == "id" for column, _ in JOB_SORTS[sort.value]])
            else:
                raise ValidationError("after", "invalid cursor", "INVALID_CURSOR")
        filters = (filter or JobFilter()).filters([state.value] if state is not None else None)
        rows, total = await in_thread(mu.history.list_jobs, **filters, sort=sort.value, limit=n + 1, offset=offset,
                                      after=keyset)
        more = len(rows) > n
        rows = rows[:n]
        # Each shown job with the job its cursor is made of (the history row, whose order the
        # next page continues).
        shown, stale = mu.jobs.overlay(rows, **filters)
        # Rows whose live record no longer passes the filters are left out; the rows after
        # them fill the page, for a few reads at most (found by exploring: a page whose rows
        # were all left out had no edges, and said there was a next page without a cursor).
        for _ in range(JOB_PAGE_READS - 1):
            if not more or len(shown) >= n:
                break
            want = n - len(shown)
            extra, _ = await in_thread(mu.history.list_jobs, **filters, sort=sort.value, limit=want + 1,
                                       after=job_cursor(rows[-1], sort.value), counted=False)
            more = len(extra) > want
            rows += extra[:want]
            kept, left_out = mu.jobs.overlay(extra[:want], **filters)
            shown += kept
            stale += left_out
        total -= stale
        listed = len(shown)  # jobs this page and the next ones list from here on, shown or not
        if sort is JobSort.SUBMITTED_AT_DESC and (not after or keyset is not None):
            # Jobs not written to history yet come where they fall, newest first: a job is
            # listed once submitted, on whichever page (past the first, those older than the
            # cursor; the count then is of those, with history's).
            before = _before(keyset) if keyset is not None else None
            fresh, count = mu.jobs.unrecorded(rows, n, before=before, **filters)
            if fresh:
                total += count
                listed += count
                more = more or listed > n
                shown = ([(j, j) for j in fresh] + shown)[:n]
        edges = [JobEdge(cursor=b64(f"j:{sort.value}:{job_cursor(j, sort.value)}"), node=Job(_m=live))
                 for j, live in shown]
        end = edges[-1].cursor if edges else None
        if more and rows and listed <= n:
            # Every job read is shown or left out: the next page goes on after the last row
            # read, which may be one left out (also when none is shown).
            end = b64(f"j:{sort.value}:{job_cursor(rows[-1], sort.value)}")
        return JobConnection(
            total_count=total,
            edges=edges,
            page_info=PageInfo(has_next_page=more, end_cursor=end),
        )

    @strawberry.field
    def host(self, info: Info, id: strawberry.ID) -> Host | None:
        return Host.of(info, str(id))

    @strawberry.field(description="Hosts, filtered and sorted in one pass. Cursors are keyset cursors: "
                                  "stable while hosts come and go.")
    async def hosts(
        self,
        info: Info,
        first: int | None = 50,
        after: str | None = None,
        health: str | None = None,
        filter: HostFilter | None = None,
        sort: HostSort = HostSort.ID_ASC,
    ) -> HostConnection:
        _, n = page_args(first, None)
        mu = muster(info)
        now = time.time()
        if health:
            filter = HostFilter(**{**(vars(filter) if filter else {}), "health": [health]})
        order = HOST_ORDERS[sort]
        rows = await reads_for(mu).hosts(host_query(filter), order)
        start = 0
        if after:
            kind, _ = unb64(after)
            if kind == "o":
                start = decode_cursor(after)
            else:
                key = decode_key_cursor(after, "h" + sort.value)
                if not isinstance(key, list):
                    raise ValidationError("after", "invalid cursor", "INVALID_CURSOR")
                start = index_after([host_key(r, order) for r in rows], key, sort is HostSort.ID_DESC)
        page = rows[start: start + n]
        mu.hosts.refresh(page, now)
        edges = [HostEdge(cursor=encode_key_cursor("h" + sort.value, host_key(r, order)), node=Host.from_row(r))
                 for r in page]
        return HostConnection(
            total_count=len(rows),
            edges=edges,
            page_info=PageInfo(has_next_page=start + len(page) < len(rows),
                               end_cursor=edges[-1].cursor if edges else None),
        )

    @strawberry.field(description="Attempts from the history database, by placement time. Cursors are keyset "
                                  "cursors: stable while attempts are added.")
    async def attempts(self, info: Info, first: int | None = 50, after: str | None = None,
                 job_id: strawberry.ID | None = None, host_id: strawberry.ID | None = None,
                 newest_first: bool = False) -> AttemptConnection:
        order = "ad" if newest_first else "aa"
        offset, key, n = history_page(first, after, order)
        mu = muster(info)
        assert mu.history is not None
        jid = str(job_id) if job_id is not None else None
        hid = str(host_id) if host_id is not None else None
        # Counted before the page is read, and never fewer than the page shows: the
        # historian writes between the two reads.
        total = await in_thread(mu.history.count_attempts, job_id=jid, host_id=hid)
        rows = await in_thread(mu.history.list_attempts, job_id=jid, host_id=hid, limit=n + 1, offset=offset,
                               newest_first=newest_first, after=key)
        more, rows = len(rows) > n, rows[:n]
        total = max(total, offset + len(rows))
        jobs: dict[str, JobModel | None] = {}
        edges = []
        for r in rows:
            if r.job_id not in jobs:
                jobs[r.job_id] = mu.state.jobs.get(r.job_id) or await in_thread(mu.history.get_job, r.job_id)
            job = jobs[r.job_id]
            m = next((a for a in job.attempts if a.id == r.id), None) if job else None
            if m is None:
                m = AttemptModel(id=r.id, number=r.number, host_id=r.host_id, state=AttemptState(r.state),
                                 term=r.term, placed_at=r.placed_at, started_at=r.started_at,
                                 finished_at=r.finished_at, exit_code=r.exit_code)
            edges.append(AttemptEdge(cursor=history_cursor(order, r.placed_at, r.id),
                                     node=Attempt(_m=m, _job_id=r.job_id)))
        return AttemptConnection(total_count=total, edges=edges, page_info=PageInfo(
            has_next_page=more, end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field(description="Recorded job, attempt and host events, oldest first unless newestFirst. "
                                  "Cursors are keyset cursors: stable while events are added.")
    async def events(self, info: Info, first: int | None = 50, after: str | None = None,
               job_id: strawberry.ID | None = None, host_id: strawberry.ID | None = None,
               kind: str | None = None, since: dt.datetime | None = None,
               newest_first: bool = False) -> HistoryEventConnection:
        order = "ed" if newest_first else "ea"
        offset, key, n = history_page(first, after, order)
        mu = muster(info)
        assert mu.history is not None
        jid = str(job_id) if job_id is not None else None
        hid = str(host_id) if host_id is not None else None
        since_s = epoch(since)
        total = await in_thread(mu.history.count_events, job_id=jid, host_id=hid, kind=kind, since=since_s)
        rows = await in_thread(mu.history.list_events, job_id=jid, host_id=hid, kind=kind, since=since_s,
                               limit=n + 1, offset=offset, newest_first=newest_first, after=key)
        more, rows = len(rows) > n, rows[:n]
        total = max(total, offset + len(rows))  # as for attempts
        edges = [HistoryEventEdge(cursor=history_cursor(order, r.ts, r.id), node=HistoryEvent(
            id=strawberry.ID(r.id), ts=ts(r.ts), kind=r.kind, job_id=r.job_id, host_id=r.host_id,
            message=r.message)) for r in rows]
        return HistoryEventConnection(total_count=total, edges=edges, page_info=PageInfo(
            has_next_page=more, end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field(description="Alerts, newest first (also published on the `alerts.>` NATS subjects). "
                                  "Cursors are keyset cursors: stable while alerts are added.")
    async def alerts(self, info: Info, first: int | None = 50, after: str | None = None,
               kind: str | None = None) -> AlertConnection:
        offset, key, n = history_page(first, after, "al")
        mu = muster(info)
        assert mu.history is not None
        rows, total = await in_thread(mu.history.list_alerts, kind=kind, limit=n + 1, offset=offset, after=key)
        more, rows = len(rows) > n, rows[:n]
        edges = [AlertEdge(cursor=history_cursor("al", r.ts, r.id), node=alert(r)) for r in rows]
        return AlertConnection(total_count=total, edges=edges, page_info=PageInfo(
            has_next_page=more, end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field
    def cluster(self, info: Info) -> Cluster:
        return cluster(muster(info))

    @strawberry.field(description="Queues by name, with quota, use, borrowing, lending, pending and running "
                                  "counts and fair share.")
    def queues(self, info: Info, first: int | None = 50, after: str | None = None) -> QueueConnection:
        offset, n = page_args(first, after)
        mu = muster(info)
        rows = queue_rows(mu.state, time.time(), mu.jobs.half_life_s)
        page = rows[offset: offset + n]
        edges = [QueueEdge(cursor=encode_cursor(offset + i), node=Queue(_row=r)) for i, r in enumerate(page)]
        return QueueConnection(total_count=len(rows), edges=edges, page_info=PageInfo(
            has_next_page=offset + len(page) < len(rows), end_cursor=edges[-1].cursor if edges else None))

    @strawberry.field(description="Advance reservations (hosts set aside for queues over a time window), soonest "
                                  "first; those over are kept a day after they end.")
    def advance_reservations(self, info: Info) -> list[AdvanceReservation]:
        return [AdvanceReservation(_r=r) for r in sorted(muster(info).state.advance.values(),
                                                         key=lambda r: (r.starts, r.name))]

    @strawberry.field(description="One advance reservation by name, or null.")
    def advance_reservation(self, info: Info, name: str) -> AdvanceReservation | None:
        r = muster(info).state.advance.get(name)
        return None if r is None else AdvanceReservation(_r=r)

    @strawberry.field
    def queue(self, info: Info, name: str) -> Queue | None:
        mu = muster(info)
        return next((Queue(_row=r) for r in queue_rows(mu.state, time.time(), mu.jobs.half_life_s)
                     if r.queue.name == name), None)

    @strawberry.field(description="GPU-seconds (per model), CPU-seconds and memory MB-seconds used by attempts in "
                                  "[since, until), per queue and user, from the history database.")
    async def usage(self, info: Info, queue: str | None = None, user: str | None = None,
                    since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[Usage]:
        mu = muster(info)
        assert mu.history is not None
        # As Unix times: one given with an offset and one without (taken as UTC) compare so
        # (found by exploring: comparing the two raised a TypeError, an unexpected error).
        start, end = epoch(since), epoch(until)
        if start is not None and end is not None and end < start:
            # (found by exploring: an empty list, as if nothing had run)
            raise ValidationError("until", "until is before since: no period", "OUT_OF_RANGE")
        rows = await in_thread(mu.history.usage, queue=queue, user=user, since=start, until=end)
        return [Usage(queue=r.queue, user=r.user, gpu_model=r.gpu_model, gpu_seconds=r.gpu_seconds,
                      cpu_seconds=r.cpu_seconds, memory_mb_seconds=r.memory_mb_seconds, attempts=r.attempts,
                      gpu_seconds_lost_to_preemption=r.lost_gpu_seconds, gpu_util_pct=r.gpu_util_pct)
                for r in rows]
