"""Reservations and backfill: a large job that has waited does not starve behind a stream
of smaller ones, and the room held for it is not left idle when a job known to end in
time could use it. Pure: tasks' expected ends are worked out from their records, the
time limits they run under and a clock.

A job that finds no room after waiting a while gets a reservation: the hosts where it
could start soonest (`start_on`, from the expected ends of the tasks there), and that
start. Other jobs may be placed on those hosts only if their own time limit ends them
by the reserved start (`may_backfill`), as Slurm's backfill does, or if they take
nothing the reserved job will need there (`spares`: a job that wants no GPU and leaves
the CPU and memory a task of the reserved job asks for). A task without a time
limit has no known end; a reservation whose start is unknown holds its hosts for a
bounded time only (the planner's `QueuePolicy.reserve_max_s`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from server.scheduling.deadlines import Deadlines
from server.scheduling.maintenance import START_ALLOWANCE_S
from server.scheduling.placement import MAX_TASKS_PER_HOST, HostCapacity, check
from wire.budgets import ALLOC_RECORD_OVERHEAD, RECORD_BUDGET, task_bytes
from wire.messages import IMMEDIATE_GRACE_S, HostAlloc, Job, JobSpec, Reserved, Task

UNKNOWN = math.inf
# A task told to stop (preempted, timed out, cancelled) is expected gone this long after
# now when it names no grace of its own: the agent's default SIGTERM-to-SIGKILL grace
# (agent.Agent's kill_grace_s, 10 s) and its report.
STOPPING_S = 15.0


@dataclass(frozen=True)
class Reservation:
    """Hosts held for one waiting job, from `start` on (UNKNOWN: no known time);
    `stacked`: one host for all the tasks of a gang."""

    job_id: str
    hosts: frozenset[str]
    start: float
    stacked: bool = False

    def holds_all(self, replicas: int) -> bool:
        """Whether the hosts are enough for every task of the job (a task each, or stacked)."""
        return self.stacked or len(self.hosts) >= replicas

    def known(self) -> bool:
        return self.start != UNKNOWN

    @classmethod
    def of_record(cls, job_id: str, r: Reserved) -> Reservation:
        """The reservation a job's record names (`Job.reserved`: its first hosts only)."""
        return cls(job_id, frozenset(r.hosts), r.start if r.start is not None else UNKNOWN)


def leave_s(grace_s: float) -> float:
    """How long a stop with grace `grace_s` is expected to take to free what it holds:
    that grace, or STOPPING_S for none given (0) or a queue's grace of 0 (sent as
    IMMEDIATE_GRACE_S: the stop's report still takes its time)."""
    return grace_s if grace_s > IMMEDIATE_GRACE_S else STOPPING_S


def task_end(task: Task, job: Job | None, deadline: float | None, now: float) -> float:
    """When a task is expected to have freed what it holds: soon when it is being
    stopped; its stop's grace after its job's deadline when running under a time limit
    (at the deadline it is only told to stop); its time limit and grace after now (and
    the time a start takes) when placed and not started yet; otherwise unknown."""
    grace = leave_s(task.grace_s)
    if task.stop:
        return now + grace
    attempt = None
    if job is not None:
        attempt = next((a for a in job.current_tasks() if a.id == task.attempt_id), None)
    if attempt is not None and attempt.stop_kind:
        return now + grace
    if deadline is not None:
        return max(now, deadline) + grace
    if attempt is not None and attempt.time_limit_s > 0:
        started = attempt.started_at if attempt.started_at is not None else now + START_ALLOWANCE_S
        return max(now, started + attempt.time_limit_s) + grace
    return UNKNOWN


Ends = list[tuple[float, Task]]  # the tasks on a host, each with its expected end


def host_ends(tasks: Iterable[Task], job_of: Callable[[str], Job | None], deadline_of: Callable[[str], float | None],
              now: float) -> Ends:
    """The tasks on a host, each with its expected end (`task_end`)."""
    return [(task_end(t, job_of(t.job_id), deadline_of(t.job_id), now), t) for t in tasks]


def ends_by_host(alloc_of: Callable[[str], HostAlloc | None], job_of: Callable[[str], Job | None],
                 deadlines: Deadlines, now: float) -> Callable[[str], Ends]:
    """`host -> Ends` over allocations and job records looked up as given (a cycle's own
    copies first, or the state's alone)."""
    def ends(host_id: str) -> Ends:
        alloc = alloc_of(host_id)
        return host_ends(alloc.tasks if alloc is not None else (), job_of, deadlines.get, now)

    return ends


def soonest_hosts(deadlines: Deadlines, job_of: Callable[[str], Job | None], n: int) -> set[str]:
    """The hosts of the `n` running tries whose deadlines come first."""
    out: set[str] = set()
    for _d, job_id in deadlines.earliest(n):
        job = job_of(job_id)
        if job is not None:
            out.update(a.host_id for a in job.current_tasks())
    return out


def start_on(cap: HostCapacity, ends: Ends, spec: JobSpec, models: frozenset[str] | None,
             now: float) -> float | None:
    """The earliest time one task of `spec` fits on the host, were the tasks there to end
    when expected (`ends`: (expected end, task)): UNKNOWN when it fits only once a task
    with no known end is gone, None when it would not fit even on the empty host."""
    if check(spec, cap, models)[0] is None:
        return now
    view = cap.copy()
    for end, task in sorted(ends, key=lambda e: (e[0], e[1].attempt_id)):
        view.release(task.gpu_indices, task.cpus, task.memory_mb, 0, task.gpu_share, task.gpu_memory_mb, task.mig)
        if check(spec, view, models)[0] is None:
            return max(now, end)
    return None


def choose(spec: JobSpec, starts: dict[str, float], free: Callable[[str], int]) -> tuple[list[str], float]:
    """The hosts to reserve for `spec` among those whose start is known or not: the
    `replicas` hosts that could take a task soonest (more free GPUs, then host id, among
    equals), and when the last of them could."""
    ranked = sorted(starts, key=lambda h: (starts[h], -free(h), h))[: spec.replicas]
    if len(ranked) < spec.replicas:
        return ranked, UNKNOWN
    return ranked, max((starts[h] for h in ranked), default=UNKNOWN)


def spares(cap: HostCapacity | None, spec: JobSpec, reserved: JobSpec, tasks: int = 1) -> bool:
    """Whether a task of `spec` placed on the host now leaves the reserved job's start
    there as it is: it takes no GPU the reserved job could use (none at all, a MIG
    instance where the reserved job wants whole GPUs or shares, a whole GPU or a share
    where it wants MIG instances, which are on other GPUs, or a GPU of a model it does not
    take; found by exploring: a job waiting for a whole GPU kept jobs of MIG slices off the
    free MIG instances of its host), and what is free of CPU and memory now, less what it
    takes, still holds the `tasks` tasks of `reserved` the host is held for (the tasks
    there only free more as they end, so the reserved tasks' GPUs are the wait, not their
    CPU or memory), nor the host's room for their tasks in its record (its task count and
    record size: found reviewing, where a backfilled task could take the last of a full
    host's 256 tasks)."""
    if cap is None:
        return False
    if (cap.tasks + 1 + tasks > MAX_TASKS_PER_HOST
            or cap.record_bytes + task_bytes(spec) + task_bytes(reserved) * tasks + ALLOC_RECORD_OVERHEAD
            > RECORD_BUDGET):
        return False
    if spec.wants_gpu():
        mine, theirs = spec.models(), reserved.models()
        apart = ((spec.mig_profile is None) != (reserved.mig_profile is None)
                 or (mine is not None and theirs is not None and not mine & theirs))
        if not apart:
            return False
    return (cap.cpus - cap.used_cpus - spec.cpus >= reserved.cpus * tasks - 1e-9
            and cap.memory_mb - cap.used_memory_mb - spec.memory_mb >= reserved.memory_mb * tasks)


def comes_before(job: Job, holder: Job, share: Callable[[str], float]) -> bool:
    """Whether `job` comes before `holder`, the job a reservation was made for, so that the
    reservation does not hold against it: of another queue with a lower fair-share rank
    (`share`: share per weight; found by exploring, where the reservations of an over-share
    queue's waiting jobs kept the fair-share preemption of a queue at none of its share off
    every host), or of the same queue and a higher priority (found by exploring: preempted
    low-priority jobs, which keep their submission time and so reserve at once, kept the
    higher-priority jobs that preempted them from starting or preempting on every host for
    ten minutes). Among a queue's jobs of one priority a reservation stays with its job.
    The planner and why pending decide alike with it."""
    if job.spec.queue == holder.spec.queue:
        return job.spec.priority > holder.spec.priority
    return share(job.spec.queue) < share(holder.spec.queue)


def kept_off(spec: JobSpec, limit_s: float, now: float, r: Reservation, reserved: JobSpec | None,
             view: Callable[[str], HostCapacity | None], grace_s: float = 0.0) -> frozenset[str]:
    """The hosts of reservation `r` that a job of `spec`, running at most `limit_s` and
    stopped with a grace of `grace_s` (its queue's; 0: `STOPPING_S`), may not take now:
    none when its limit ends it by the reserved start (`may_backfill`); else those where
    it would take a GPU, CPU or memory a task of the reserved job (`reserved`) needs
    (`spares`, over the hosts as `view` gives them). The planner and why pending decide
    alike with it."""
    if may_backfill(limit_s, now, r, grace_s):
        return frozenset()
    if reserved is None:
        return r.hosts
    # A gang held fewer hosts than it has tasks is stacked: each host for all of them.
    tasks = reserved.replicas if r.stacked or len(r.hosts) < reserved.replicas else 1
    return frozenset(h for h in r.hosts if not spares(view(h), spec, reserved, tasks))


def may_backfill(limit_s: float, now: float, reservation: Reservation | None, grace_s: float = 0.0) -> bool:
    """Whether a job that runs at most `limit_s` (0: no limit) may be placed on the
    reservation's hosts: its limit ends it by the reserved start, allowing
    `START_ALLOWANCE_S` for it to start (its limit runs from its start) and its stop's
    grace (`grace_s`; 0, the queue's 0 or none given: `STOPPING_S`) for it to leave: the end `task_end`
    will expect of it."""
    if reservation is None:
        return True
    leave = leave_s(grace_s)
    return limit_s > 0 and reservation.known() and now + START_ALLOWANCE_S + limit_s + leave <= reservation.start
