"""The job read model, the same for GraphQL and the console: a job is its live record in
the state bucket while there is one (fresher), else its row in the history database.

`JobView` answers: one job (`get`), pages of jobs (`page`: history rows with the live
records laid over them), why a queued job is not placed (`why_pending`), where it stands
in the queue (`queue_position`) and its timeline (`timeline`). Reads of history are plain
calls that block; callers on an event loop run them in a thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from server.health.rules import Health
from server.history.timeline import job_events
from server.scheduling.capacity import Placer
from server.scheduling.placement import NOT_HEALTHY, check
from server.scheduling.planner import queue_order
from server.scheduling.queues import effective_time_limit
from server.views import queues as queue_view
from server.views.hosts import STEP_ROWS, Steps, finish
from wire.messages import Job, JobSpec, JobState, Queue

if TYPE_CHECKING:
    from server.history.database import History
    from server.state.cluster import ClusterState


ORDER_MAX_AGE_S = 1.0
# How a task's GPU is shared, as GraphQL, the console and the CLI say it.
SHARED = "shared, not isolated"
MIG = "MIG instance"


def sharing(share: int, mig: bool) -> str | None:
    """None for whole GPUs (or none), SHARED for a share of one GPU (time-sliced, or
    limited by CUDA MPS where it runs: never isolated), MIG for a MIG instance."""
    return SHARED if share else MIG if mig else None


def time_limit(spec: JobSpec, q: Queue | None) -> tuple[float, str]:
    """The time limit a job's tries run under (0: none), and where it comes from in words:
    '' (none), 'its own', "the queue's default" or "the queue's maximum"."""
    limit = effective_time_limit(spec, q)
    if not limit:
        return 0.0, ""
    if spec.time_limit_s and limit == spec.time_limit_s:
        return limit, "its own"
    if q is not None and not spec.time_limit_s and limit == q.default_time_limit_s:
        return limit, "the queue's default"
    return limit, "the queue's maximum"


@dataclass
class TimelineEvent:
    ts: float
    kind: str
    host_id: str | None
    message: str


@dataclass
class JobPage:
    jobs: list[Job]
    total: int


class JobView:
    def __init__(self, state: ClusterState, history: History | None, half_life_s: float = 3600.0) -> None:
        self.state = state
        self.history = history
        self.half_life_s = half_life_s  # of queues' past use, as the scheduler decays it
        self._positions: dict[str, int] = {}
        self._order_at: float | None = None

    def get(self, job_id: str) -> Job | None:
        """The live record, else the recorded one (reads the database)."""
        job = self.state.jobs.get(job_id)
        if job is None and self.history is not None:
            job = self.history.get_job(job_id)
        return job

    def page(self, *, state: str | None = None, limit: int, offset: int = 0, newest_live: bool = False,
             **filters: Any) -> JobPage:
        """A page of jobs from history (`History.list_jobs` with `filters`), each replaced by
        its live record. With `newest_live` (the newest-first first page), live jobs newer
        than anything history has written yet are put on top."""
        assert self.history is not None
        rows, total = self.history.list_jobs(state=[state] if state else None, limit=limit, offset=offset,
                                             **filters)
        shown = self.overlay(rows, state, newest_live=newest_live, limit=limit)
        if newest_live:
            total += max(0, len(shown) - len(rows))
        return JobPage(shown, total)

    def overlay(self, rows: Sequence[Job], state: str | None, *, newest_live: bool, limit: int) -> list[Job]:
        live = self.state.jobs
        out = [live.get(j.id, j) for j in rows]
        if state:
            out = [j for j in out if j.state.value == state]
        if newest_live:
            seen = {j.id for j in rows}
            newest = max(((j.submitted_at, j.id) for j in rows), default=None)
            extra = [j for j in list(live.values())
                     if j.id not in seen and (not state or j.state.value == state)
                     and (newest is None or (j.submitted_at, j.id) > newest)]
            if extra:
                out = sorted(extra + out, key=lambda j: (j.submitted_at, j.id), reverse=True)[:limit]
        return out

    def why_pending(self, job: Job, now: float) -> dict[str, int]:
        """Hosts rejecting a queued job now, counted by reason (placement.check, health
        at the read clock, as the planner judges it)."""
        return finish(self.why_pending_steps(job, now))

    def why_pending_steps(self, job: Job, now: float) -> Steps[dict[str, int]]:
        """`why_pending` as steps (server.views.hosts.Steps)."""
        if job.state is not JobState.QUEUED:
            return {}
        reasons: Counter[str] = Counter()
        # The capacity index, read in place: a fresh copy of 50,000 hosts' capacities per
        # request cost seconds, mostly in garbage collection.
        for n, cap in enumerate(list(self.state.index.caps.values()), start=1):
            if self.state.health(cap.id, now) is not Health.HEALTHY:
                reasons[NOT_HEALTHY] += 1
            elif (r := check(job.spec, cap)[0]) is not None:
                reasons[r] += 1
            if n % STEP_ROWS == 0:
                yield
        return dict(reasons)

    def queue_reasons(self, job: Job, now: float) -> list[queue_view.QueueReason]:
        """Why a queued job waits at queue level (server.views.queues.reasons); for a gang,
        whether the hosts take its tasks one by one but not all at once."""
        whole: bool | None = None
        if job.state is JobState.QUEUED and job.spec.replicas > 1:
            placer = Placer(self.state.index, lambda h: self.state.health(h, now) is Health.HEALTHY,
                            policy="binpack")
            if placer.place(job.spec) is not None:
                whole = placer.place_gang(job.spec) is not None
        return queue_view.reasons(self.state, job, now, self.half_life_s, whole)

    def queue_position(self, job: Job, now: float | None = None) -> int | None:
        """1-based place in its queue's order (priority, then submission) while QUEUED.
        The orders are sorted at most once every `ORDER_MAX_AGE_S` (given `now`), however
        many jobs ask."""
        if job.state is not JobState.QUEUED:
            return None
        fresh = now is not None and self._order_at is not None and 0 <= now - self._order_at <= ORDER_MAX_AGE_S
        if not fresh or job.id not in self._positions:  # a job queued since: sort again
            by_queue: dict[str, list[Job]] = {}
            for j in self.state.queued():
                by_queue.setdefault(j.spec.queue, []).append(j)
            self._positions = {j.id: i for js in by_queue.values() for i, j in enumerate(queue_order(js), start=1)}
            self._order_at = now
        return self._positions.get(job.id)

    @staticmethod
    def timeline(job: Job, recorded: Sequence[Any]) -> list[TimelineEvent]:
        """The job's events: those history recorded, merged (by id) with those derived from
        the live record, which history may not have written yet; oldest first."""
        merged: dict[str, TimelineEvent] = {}
        for e in recorded:
            merged[str(e.id)] = TimelineEvent(e.ts, e.kind, e.host_id, e.message or "")
        for d in job_events(job):
            host = d.get("host_id")
            at = d["ts"]
            assert isinstance(at, (int, float))
            merged.setdefault(str(d["id"]), TimelineEvent(float(at), str(d["kind"]),
                                                          host if isinstance(host, str) else None,
                                                          str(d.get("message") or "")))
        return sorted(merged.values(), key=lambda e: (e.ts, e.kind))
