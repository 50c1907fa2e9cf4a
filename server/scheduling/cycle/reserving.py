"""Reservations during one cycle's placement: hosts held for the jobs that waited longest
and found no room, where they could start soonest (scheduling.backfill), and their record
in the jobs (`Job.reserved`). Pure."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from server.scheduling import advance, maintenance
from server.scheduling.backfill import Ends, Reservation, soonest_hosts
from server.scheduling.capacity import Placer
from server.scheduling.cycle.admission import Admission
from server.scheduling.cycle.limits import UserLimits
from server.scheduling.cycle.work import QueuePolicy, Work
from server.scheduling.queues import effective_time_limit
from wire.messages import RESERVED_HOSTS_KEPT, Job, JobSpec, JobState, Reserved

# Reservations: the hosts of the jobs whose time limit comes soonest are looked at as
# well as those with the most free room (scheduling.backfill).
RESERVE_SOONEST = 32
RESERVE_TRIES = 4  # jobs a cycle looks for hosts to reserve for, past those it reserves for


class Reserving:
    """The reservations one cycle makes, in the order it makes them (`made`: job id ->
    its reservation), and the jobs it worked one out for."""

    def __init__(self, w: Work, adm: Admission, placer: Placer, limits: UserLimits, policy: QueuePolicy,
                 now: float, skip: Collection[str], closing: maintenance.KeptOff, set_aside: advance.SetAside,
                 ends: Callable[[str], Ends]) -> None:
        self.w, self.adm, self.placer, self.limits, self.policy = w, adm, placer, limits, policy
        self.now, self.skip, self.closing, self.set_aside = now, skip, closing, set_aside
        self.ends = ends  # the tasks on a host, each with when it is expected to have ended
        self.made: dict[str, Reservation] = {}
        self.tried: set[str] = set()  # jobs this cycle worked a reservation out for, held or not
        self.left = RESERVE_TRIES + policy.reserve_jobs

    def open(self) -> bool:
        """Whether `reserve_for` may still make a reservation this cycle."""
        return len(self.made) < self.policy.reserve_jobs and self.left > 0

    def holders(self) -> list[tuple[Job, JobSpec]]:
        """The jobs whose records hold a reservation, with the specs to place them with,
        while they still wait for room only (queued, not placed nor preempting, admitted
        by their quota and their user's limit) and have waited long enough; longest held
        first."""
        w, now, policy = self.w, self.now, self.policy
        out = []
        for job_id in w.state.reserved:
            job = w.latest(job_id)
            if job is None or job.state is not JobState.QUEUED or job.hold or job.waiting_for or job.preempting \
                    or job.id in w.frozen_jobs or job.id in self.skip or job.not_before > now \
                    or now - job.waiting_since < policy.reserve_after_s or job.id in self.tried:
                continue
            q = self.adm.queue(job)
            if q is None or self.limits.waits(job, q):
                continue
            spec, _refusal = self.adm.restrict(job)
            if spec is not None:
                out.append((job, spec))
        return sorted(out, key=lambda js: (js[0].reserved.since if js[0].reserved else now, js[0].id))

    def reserve(self, job: Job, spec: JobSpec) -> None:
        """Hold hosts for `job` where it could start soonest, none of another
        reservation's nor of a maintenance window or an advance reservation for other
        queues its time limit would run into, if it may hold them. A gang that finds
        fewer hosts than it has tasks holds them only while other reservations hold the
        rest: where the hosts it may use are too few even without those, holding some
        would keep them idle for a start that cannot come."""
        placer, now = self.placer, self.now
        self.tried.add(job.id)
        held = placer.exclude
        limit = effective_time_limit(job.spec, self.adm.queue(job))
        apart = held | self.closing(limit) | self.set_aside(job.spec.queue, job.spec.user, limit)
        placer.exclude = apart | {h for r in self.made.values() for h in r.hosts}
        soonest = soonest_hosts(self.w.state.deadlines, self.w.state.jobs.get, RESERVE_SOONEST)
        got = placer.reservation_for(job.id, spec, now, self.ends, soonest)
        for _ in range(RESERVE_TRIES):
            # Hosts a window or another's advance reservation will have closed by the time
            # the job could start there (those above are closed to it if it started now):
            # found by exploring, a job was held a host it could never start on, and waited
            # for the window's end while a host it could use was given to others.
            shut = self.shut_by_then(got, limit, job)
            if not shut:
                break
            apart = apart | shut
            placer.exclude = placer.exclude | shut
            got = placer.reservation_for(job.id, spec, now, self.ends, soonest)
        else:
            if self.shut_by_then(got, limit, job):
                got = Reservation(job.id, frozenset(), got.start)
        if got.hosts and not spec.same_rack and not got.holds_all(spec.replicas):
            placer.exclude = apart
            if not placer.reservation_for(job.id, spec, now, self.ends, soonest).holds_all(spec.replicas):
                got = Reservation(job.id, frozenset(), got.start)
        placer.exclude = held
        # Counted from when it could first be placed (found by exploring: a job held, or
        # waiting for its begin time or the jobs it runs after, for longer than the window
        # never held a reservation whose start is unknown, while the jobs behind it did).
        waited = now - job.waiting_since
        if got.hosts and (got.known() or waited < self.policy.reserve_after_s + self.policy.reserve_max_s):
            self.made[job.id] = got

    def shut_by_then(self, got: Reservation, limit: float, job: Job) -> frozenset[str]:
        """The hosts of `got` closed to `job` by the time it could start there (`got.start`,
        unknown: at any time ahead): a maintenance window its limit would run into, or an
        advance reservation for others open then or opening before its limit ends it."""
        if not got.hosts:
            return frozenset()
        state, start = self.w.state, got.start
        out: set[str] = set()
        for h in got.hosts:
            window = state.maintenance.get(h) if state.maintenance else None
            if window is not None and not maintenance.started(window, self.now) and (
                    not got.known() or not maintenance.may_run_before(limit, start, window)):
                out.add(h)
        for r in state.advance.values() if state.advance else ():
            if r.ends > start and not advance.admits(r, job.spec.queue, job.spec.user) and (
                    not got.known() or not advance.may_run_before(limit, start, r)):
                out.update(got.hosts.intersection(r.hosts))
        return frozenset(out)

    def reserve_for(self, job: Job, spec: JobSpec) -> None:
        """Hold hosts for a job that found no room, once it has waited long enough."""
        policy = self.policy
        waited = self.now - job.waiting_since
        if not self.open() or job.preempting or waited < policy.reserve_after_s or job.id in self.tried:
            return
        # The first jobs a cycle that waited and found no room and that some hosts could
        # ever take; a few tries more, so that jobs no host can take do not cost more.
        # A job that holds a reservation keeps it while it still waits, and waits only for
        # room, even if other jobs that find no room now come first (jobs ahead of it
        # that fit are placed as ever: a reservation never reorders the queue): the
        # holders are served first, the oldest reservation first.
        self.left -= 1
        for keeper, keeper_spec in self.holders():
            if len(self.made) >= policy.reserve_jobs:
                return
            self.reserve(keeper, keeper_spec)
        if len(self.made) < policy.reserve_jobs and job.id not in self.tried:
            self.reserve(job, spec)


# A reservation's start written again into its job's record only once it moved this much.
RESERVED_START_SLACK_S = 30.0


def record_reservations(w: Work, reservations: Sequence[Reservation], complete: bool, now: float, max_keys: int,
                        skip: Collection[str]) -> None:
    """Keep `Job.reserved` in the records: each job this cycle reserved for gets it when
    it is new or has changed (hosts, or its start by more than RESERVED_START_SLACK_S);
    the other queued jobs that have one lose it, once a cycle has looked at every queued
    job or made a reservation (which looks at every job that holds one first; a cycle cut
    short before either says nothing of them). Records in flight or left alone (`skip`)
    wait for a later cycle."""
    def writable(job_id: str) -> Job | None:
        if job_id in w.frozen_jobs or job_id in skip:
            return None
        cur = w.latest(job_id)
        if cur is None or cur.state is not JobState.QUEUED:
            return None
        if job_id not in w.plan.jobs and w.plan.keys + 1 > max_keys:
            return None
        return w.job(job_id)

    kept = {r.job_id for r in reservations}
    if complete or reservations:
        for job_id in sorted(w.state.reserved - kept):
            job = writable(job_id)
            if job is not None:
                job.reserved = None
    for reservation in reservations:
        _record(w, reservation, now, writable)


def _record(w: Work, reservation: Reservation, now: float, writable: Callable[[str], Job | None]) -> None:
    cur = w.latest(reservation.job_id)
    old = cur.reserved if cur is not None else None
    hosts = sorted(reservation.hosts)
    new = Reserved(hosts=hosts[:RESERVED_HOSTS_KEPT], host_count=len(hosts),
                   start=reservation.start if reservation.known() else None, since=old.since if old else now)
    if old is not None and (old.hosts, old.host_count) == (new.hosts, new.host_count) and (
            old.start == new.start if old.start is None or new.start is None
            else abs(new.start - old.start) <= RESERVED_START_SLACK_S):
        return
    job = writable(reservation.job_id)
    if job is not None:
        job.reserved = new
