"""The job read model, the same for GraphQL and the console: a job is its live record in
the state bucket while there is one (fresher), else its row in the history database.

`JobView` answers: one job (`get`), pages of jobs (history rows with the live records
laid over them, `overlay`, and on the first page the jobs history has not written yet,
`unrecorded`), why a queued job is not placed (`why_pending`), where it stands
in the queue (`queue_position`) and its timeline (`timeline`). Reads of history are plain
calls that block; callers on an event loop run them in a thread.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from server.health.rules import Health
from server.history.timeline import job_events
from server.scheduling import advance, fairshare, maintenance
from server.scheduling.backfill import Reservation, comes_before, kept_off
from server.scheduling.capacity import Placer
from server.scheduling.cycle.admission import queue_order
from server.scheduling.placement import NEVER, NOT_HEALTHY, check, idle_room
from server.scheduling.queues import QueueBook, effective_time_limit, job_demand, placement_spec, queue_named
from server.views import queues as queue_view
from server.views.hosts import STEP_ROWS, Steps, finish
from wire.messages import Job, JobSpec, JobState, Queue

if TYPE_CHECKING:
    from server.history.database import History
    from server.state.cluster import ClusterState


ORDER_MAX_AGE_S = 1.0
# JobView.unrecorded: how far before the newest recorded job it looks for unrecorded
# ones (replicas' clocks), and the most live jobs it walks.
UNRECORDED_SLACK_S = 60.0
UNRECORDED_SCAN = 20_000
# What a host reason of `why_pending` says beyond its name (GraphQL and the console).
NEVER_DETAIL = "these hosts could not take it even idle"
# How long `JobView.hosts_never_steps` keeps what it found for a shape of job, and for at most
# how many shapes.
NEVER_MEMO_S = 30.0
NEVER_MEMO_SIZE = 1024
# How many hosts its first step looks at: a submission's own (Reads.never_runs).
NEVER_FIRST_ROWS = 64

# How a task's GPU is shared, as GraphQL, the console and the CLI say it.
SHARED = "shared, not isolated"
MIG = "MIG instance"


def reason_detail(reason: str) -> str:
    """The detail shown with a host reason of `why_pending`: whether those hosts could not
    take the job even idle (placement.NEVER), or nothing."""
    return NEVER_DETAIL if reason in NEVER else ""


def sharing(share: int, mig: bool) -> str | None:
    """None for whole GPUs (or none), SHARED for a share of one GPU (time-sliced, or
    limited by CUDA MPS where it runs: never isolated), MIG for a MIG instance."""
    return SHARED if share else MIG if mig else None


def time_limit(spec: JobSpec, q: Queue | None, job: Job | None = None) -> tuple[float, str]:
    """The time limit a job's tries run under (0: none), and where it comes from in words:
    '' (none), 'its own', "the queue's default" or "the queue's maximum". Given the
    `job`, a placed or running try's own limit (set at placement, or changed since by an
    operator) is the one told; for an ended job, its last try's."""
    if job is not None and job.state in (JobState.PLACED, JobState.RUNNING):
        live = next((t for t in job.current_tasks() if not t.state.terminal), None)
        if live is not None and live.time_limit_s != effective_time_limit(spec, q):
            return live.time_limit_s, "its running try's" if live.time_limit_s else ""
    elif job is not None and job.state.terminal and job.attempts:
        # An ended job: the limit its last try ran under (found by exploring: a queue's
        # maximum lowered since was shown beside "time limit of 30 s reached").
        last = job.attempts[-1]
        if last.time_limit_s != effective_time_limit(spec, q):
            return last.time_limit_s, "its last try's" if last.time_limit_s else ""
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


def matches(job: Job, *, state: str | Sequence[str] | None = None, user: str | None = None,
            name: str | None = None, priority: int | None = None, submitted_after: float | None = None,
            submitted_before: float | None = None, queue: str | None = None, group: str | None = None) -> bool:
    """Whether `job` passes the filters of `History.list_jobs` (the same names and meaning)."""
    if state and job.state.value not in ([state] if isinstance(state, str) else state):
        return False
    spec = job.spec
    return ((user is None or spec.user == user) and (not name or spec.name.startswith(name))
            and (priority is None or spec.priority == priority) and (queue is None or spec.queue == queue)
            and (group is None or spec.group == group)
            and (submitted_after is None or job.submitted_at >= submitted_after)
            and (submitted_before is None or job.submitted_at < submitted_before))


class JobView:
    def __init__(self, state: ClusterState, history: History | None, half_life_s: float = 3600.0) -> None:
        self.state = state
        self.history = history
        self.half_life_s = half_life_s  # of queues' past use, as the scheduler decays it
        self._positions: dict[str, int] = {}
        self._order_at: float | None = None
        # A shape of job (placement_spec's fields, its tasks, the hosts known) -> (when,
        # what hosts_never_steps found).
        self._never: dict[tuple[Any, ...], tuple[float, list[str]]] = {}

    def get(self, job_id: str) -> Job | None:
        """The live record, else the recorded one (reads the database)."""
        job = self.state.jobs.get(job_id)
        if job is None and self.history is not None:
            job = self.history.get_job(job_id)
        return job

    def recorded(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The recorded jobs of `job_ids`, by id, in one batched read of the database (no
        live records: a caller off the event loop must not read the state it changes)."""
        return self.history.get_jobs(job_ids) if self.history is not None and job_ids else {}

    def overlay(self, rows: Sequence[Job], **filters: Any) -> tuple[list[tuple[Job, Job]], int]:
        """History rows, each with its live record where there is one (fresher: the row to
        show), less those whose live record no longer passes `filters` (`matches`: history
        lags behind, and a job cancelled a moment ago is not listed among the QUEUED ones);
        and how many were left out, to take from the rows' count."""
        live = self.state.jobs
        out = []
        for row in rows:
            cur = live.get(row.id, row)
            if cur is row or matches(cur, **filters):
                out.append((row, cur))
        return out, len(rows) - len(out)

    def unrecorded(self, rows: Sequence[Job], limit: int, before: tuple[float, str] | None = None,
                   **filters: Any) -> tuple[list[Job], int]:
        """For a page newest first: the live jobs newer than every one of `rows` (that
        page's history rows) and, past the first page, older than its cursor (`before`:
        submission time and id), that match `filters` (`matches`), newest first, at most
        `limit`, and how many there are: jobs the historian has not written yet, so that a
        job is listed from the moment its submission is answered, on whichever page it
        falls. Live jobs are held in the order they were first seen, which is their
        submission order but for replicas' clocks: the walk goes from the newest back and
        stops at the first job submitted UNRECORDED_SLACK_S before the newest row, or after
        UNRECORDED_SCAN jobs (a read never walks the whole of a large live set)."""
        newest = max(((j.submitted_at, j.id) for j in rows), default=None)
        floor = newest[0] - UNRECORDED_SLACK_S if newest else float("-inf")
        out: list[Job] = []
        for n, job in enumerate(reversed(self.state.jobs.values())):
            if n >= UNRECORDED_SCAN or job.submitted_at < floor:
                break
            key = (job.submitted_at, job.id)
            if (newest is None or key > newest) and (before is None or key < before) and matches(job, **filters):
                out.append(job)
        out.sort(key=lambda j: (j.submitted_at, j.id), reverse=True)
        return out[:limit], len(out)

    def why_pending(self, job: Job, now: float) -> dict[str, int]:
        """Hosts rejecting a queued job now, counted by reason (placement.check, health
        at the read clock, as the planner judges it)."""
        return finish(self.why_pending_steps(job, now))

    def why_pending_steps(self, job: Job, now: float) -> Steps[dict[str, int]]:
        """`why_pending` as steps (server.views.hosts.Steps)."""
        if job.state is not JobState.QUEUED:
            return {}
        spec = placement_spec(job.spec, self.state.queues.get(job.spec.queue))
        if spec is None:  # its labels conflict with its queue's: no host is looked at (queue_reasons says why)
            return {}
        reasons: Counter[str] = Counter()
        # The capacity index, read in place: a fresh copy of 50,000 hosts' capacities per
        # request cost seconds, mostly in garbage collection.
        for n, cap in enumerate(list(self.state.index.caps.values()), start=1):
            if self.state.health(cap.id, now) is not Health.HEALTHY:
                reasons[NOT_HEALTHY] += 1
            elif (r := check(spec, cap)[0]) is not None:
                reasons[r] += 1
            if n % STEP_ROWS == 0:
                yield
        return dict(reasons)

    def queue_never(self, job: Job) -> list[str]:
        """Why the job could never run as the cluster stands, as warnings for its submitter
        (this and `hosts_never_steps`; none when it could: it is accepted all the same and
        waits, for a host that can take it to join or a quota to change). Here: a warning
        when its queue refuses it by its own limits with nothing else held (its nominal
        quota, or nominal + borrowing limit) on every GPU model it could run on (those of
        the hosts known, for a job naming none)."""
        q = self.state.queues.get(job.spec.queue)
        spec = placement_spec(job.spec, q)
        if q is None or spec is None:
            return []  # refused at submission, or its queue went since
        book = QueueBook({q.name: q}, {})
        models: list[str | None] = [None]
        if spec.wants_gpu():
            models = [*sorted(spec.models() or self.state.index.models())] or [None]
        refusals = []
        for m in models:
            r = book.admits(q.name, job_demand(spec, m))
            if r is None or not r.hard:
                return []
            refusals.append(r)
        most = max(refusals, key=lambda r: r.limit)  # the model it could hold most of
        return [f"queue {q.name} can never admit it: {most.detail()}"]

    def hosts_never_steps(self, job: Job, now: float) -> Steps[list[str]]:
        """A warning when no host known could take the job even idle (for a gang, when
        the hosts could take fewer of its tasks than it has where one placement may put
        them), each other host's reason counted; none with no host known. Exactly when
        the planner's Placer could not place it were every host idle (a property test).
        What it finds is kept `NEVER_MEMO_S` (`now` is monotonic) per shape of job and
        number of hosts known. It yields after the first `NEVER_FIRST_ROWS` hosts, then
        every STEP_ROWS (`Steps`): a pass over every host is paid only for a job that few
        hosts or none can take."""
        q = self.state.queues.get(job.spec.queue)
        spec = placement_spec(job.spec, q)
        caps = self.state.index.caps
        if spec is None or not caps:
            return []
        key = (spec.gpus, spec.gpu_share, spec.gpu_memory_mb, spec.mig_profile, spec.models(), spec.cpus,
               spec.memory_mb, tuple(sorted(spec.host_labels.items())), tuple(spec.exclude_hosts), spec.replicas,
               spec.same_rack, spec.same_model, len(caps))
        hit = self._never.get(key)
        if hit is not None and now - hit[0] < NEVER_MEMO_S:
            return hit[1]
        # A gang's tasks go where one placement of it may put them: one rack with
        # `sameRack` (hosts without a rack label take none), one model of several with
        # `sameModel` (capacity.Placer.place_gang). Per such group: tasks the hosts could
        # take idle, and on how many hosts; the best group is the one told.
        models = spec.models()
        gang = spec.replicas > 1
        choices: list[frozenset[str] | None] = [frozenset({m}) for m in sorted(models)] \
            if gang and spec.same_model and models is not None and len(models) > 1 else [models]
        tasks: Counter[tuple[str, int]] = Counter()
        hosts: Counter[tuple[str, int]] = Counter()
        reasons: Counter[str] = Counter()
        enough = False
        for n, cap in enumerate(list(caps.values()), start=1):
            rack = cap.labels.get("rack", "") if gang and spec.same_rack else ""
            why_not: str | None = None
            took = False
            for i, m in enumerate(choices if rack or not (gang and spec.same_rack) else ()):
                room, why = idle_room(spec, cap, spec.replicas - tasks[rack, i], m)
                if room:
                    took = True
                    tasks[rack, i] += room
                    hosts[rack, i] += 1
                    enough = enough or tasks[rack, i] >= spec.replicas
                elif why_not is None:
                    why_not = why
            if not took and why_not is not None:
                reasons[why_not] += 1
            if enough:
                break
            if n == NEVER_FIRST_ROWS or n % STEP_ROWS == 0:
                yield
        found: list[str] = []
        if not enough:
            why = ", ".join(f"{k} {'host' if k == 1 else 'hosts'}: {r}"
                            for r, k in sorted(reasons.items(), key=lambda x: (-x[1], x[0])))
            best = max(tasks, key=lambda g: (tasks[g], g), default=("", 0))
            if spec.replicas == 1:
                found.append(f"no host could run it even idle (of {len(caps)} known: {why}); it waits for one "
                             "that can")
            else:
                where = "".join([f" in rack {best[0]}" if best[0] else "",
                                 f" of model {sorted(choices[best[1]] or ())[0]}" if len(choices) > 1 else ""])
                found.append(f"the {len(caps)} hosts known could run at most {tasks[best]} of its {spec.replicas} "
                             f"tasks{where} even idle (on {hosts[best]} of them"
                             f"{f'; the others take none: {why}' if why else ''}); it waits for more")
        if len(self._never) >= NEVER_MEMO_SIZE:
            self._never.clear()
        self._never[key] = (now, found)
        return found

    def queue_reasons(self, job: Job, now: float) -> list[queue_view.QueueReason]:
        """Why a queued job waits at queue level (server.views.queues.reasons), with whether
        a host has room for it now, and for a gang whether the hosts take its tasks one by
        one but not all at once."""
        whole: bool | None = None
        fits: bool | None = None
        reserved_for: list[Job] = []
        closing: list[str] = []
        # A placement is tried only when the queue admits the job: otherwise the quota is
        # what keeps it waiting, whatever room the hosts have (a list asking why for many
        # jobs would pay a placement for each).
        waits = job.state is JobState.QUEUED and not job.hold and not job.waiting_for and job.not_before <= now
        b = queue_view.book(self.state) if waits else None  # one book for both questions
        spec = placement_spec(job.spec, self.state.queues.get(job.spec.queue))
        if waits and spec is not None and queue_view.admitted(self.state, job, b):
            placer = Placer(self.state.index, lambda h: self.state.health(h, now) is Health.HEALTHY,
                            policy="binpack")
            fits = placer.place(spec) is not None
            if fits and spec.replicas > 1:
                whole = fits = placer.place_gang(spec) is not None
            if fits:
                closing = self._closing_for(job, spec, placer, now)
                if not closing:
                    reserved_for = self._kept_from(job, spec, placer, now)
        return queue_view.reasons(self.state, job, now, self.half_life_s, whole, fits, reserved_for, b, closing)

    def _closing_for(self, job: Job, spec: JobSpec, placer: Placer, now: float) -> list[str]:
        """The hosts with a maintenance window (a drain scheduled or begun), or set aside by
        an advance reservation for other queues, that `job` may not take, when only they
        have room for it; none when it has room elsewhere."""
        if not self.state.maintenance and not self.state.advance:
            return []
        q = queue_named(self.state.queues, job.spec.queue)
        limit = effective_time_limit(job.spec, q)
        windows = self.state.maintenance
        kept = maintenance.KeptOff(windows, now)(limit) | maintenance.begun(windows, now) \
            | advance.SetAside(self.state.advance, now)(job.spec.queue, job.spec.user, limit)
        if not kept:
            return []
        placer.exclude = set(kept)
        if (placer.place_gang(spec) if spec.replicas > 1 else placer.place(spec)) is not None:
            return []
        # The kept hosts that would take a task of it now: not those it excludes, whose
        # labels or models it does not take, or with no room (found by exploring: a
        # reservation of a host the job excludes was named).
        fit = [h for h in sorted(kept) if (cap := placer.view(h)) is not None and check(spec, cap)[0] is None]
        return fit or sorted(kept)

    def reserved_on(self, host_id: str) -> Job | None:
        """The queued job whose reservation holds `host_id` (as its record names it), if any:
        why a host with free GPUs takes no other job (scheduling.backfill)."""
        for job_id in sorted(self.state.reserved):
            job = self.state.jobs.get(job_id)
            if job is not None and job.reserved is not None and host_id in job.reserved.hosts:
                return job
        return None

    def _kept_from(self, job: Job, spec: JobSpec, placer: Placer, now: float) -> list[Job]:
        """The jobs whose reservations hold the only hosts with room for `job`, which may
        not backfill them (its time limit runs past their reserved starts); none when it
        has room elsewhere. Of several, those whose hosts alone would give it room (all of
        them if none would alone)."""
        q = queue_named(self.state.queues, job.spec.queue)
        limit = effective_time_limit(job.spec, q)
        blockers: list[tuple[Job, frozenset[str]]] = []
        shares: fairshare.Shares | None = None

        def share(name: str) -> float:  # worked out only when a reservation of another queue is met
            nonlocal shares
            shares = shares or queue_view.shares(self.state, queue_view.book(self.state), now, self.half_life_s)
            return shares.share(name)

        for other_id in sorted(self.state.reserved):
            other = self.state.jobs.get(other_id)
            r = other.reserved if other is not None and other_id != job.id else None
            if other is None or r is None or comes_before(job, other, share):
                continue
            hosts = kept_off(job.spec, limit, now, Reservation.of_record(other_id, r), other.spec, placer.view,
                             q.preempt_grace_s if q is not None else 0.0)
            if hosts:
                blockers.append((other, hosts))

        def room(exclude: set[str]) -> bool:
            placer.exclude = exclude  # its failures so far are kept with what they held back
            return (placer.place_gang(spec) if spec.replicas > 1 else placer.place(spec)) is not None

        if not blockers or room({h for _, hosts in blockers for h in hosts}):
            return []
        if len(blockers) == 1:
            return [blockers[0][0]]
        named = [b for b, _ in blockers if room({h for o, hosts in blockers if o is not b for h in hosts})]
        return named or [b for b, _ in blockers]

    def queue_position(self, job: Job, now: float | None = None, at: float | None = None) -> int | None:
        """1-based place in its queue's order (priority, then submission; the users' fair
        order in a queue with fair share between its users) while QUEUED, not held, not
        waiting for other jobs and not kept back until later (a begin time, a retry's
        back-off: such a job neither has a place nor takes one from the jobs after it).
        The orders are sorted at most once every `ORDER_MAX_AGE_S` (given `now`, a
        monotonic clock), however many jobs ask; users' past use decayed to `at` (the wall
        clock's time by default)."""
        at = time.time() if at is None else at
        if job.state is not JobState.QUEUED or job.hold or job.waiting_for or job.not_before > at:
            return None
        fresh = now is not None and self._order_at is not None and 0 <= now - self._order_at <= ORDER_MAX_AGE_S
        if not fresh or job.id not in self._positions:  # a job queued since: sort again
            by_queue: dict[str, list[Job]] = {}
            for j in self.state.queued():
                if j.not_before <= at:
                    by_queue.setdefault(j.spec.queue, []).append(j)
            queues = self.state.queues
            self._positions = {j.id: i for qn, js in by_queue.items() for i, j in enumerate(
                queue_order(js, queues.get(qn), self.state, at, self.half_life_s), start=1)}
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
