"""One scheduling cycle's decisions, as a pure function of a snapshot, inputs and a clock.

`plan_cycle()` folds agent status reports and operator commands into the job and
allocation records, then places queued jobs, and returns the changed records and the
events to publish. The scheduler commits the result atomically; nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from server.health.rules import Health
from server.scheduling import maintenance
from server.scheduling.capacity import Placer
from server.scheduling.cycle.placing import place_queued, update_usage
from server.scheduling.cycle.reports import apply_cancel, apply_report, apply_requeue, apply_update, fail_unwritable
from server.scheduling.cycle.stops import (
    drain_due,
    enforce_time_limits,
    evict_lost,
    pass_gpu_clears,
    stop_on_faulted_gpus,
    stop_set_aside,
)
from server.scheduling.cycle.submissions import apply_submission, resolve_dependencies
from server.scheduling.cycle.work import KeyInFlight, Plan, QueuePolicy, Work
from server.scheduling.eviction import EvictionBudget
from server.scheduling.queues import Resources
from server.state.cluster import ClusterState
from wire.messages import Command, Job, StatusReport, SubmitRequest

# The planner's interface: plan_cycle fills a Plan under a QueuePolicy, and raises
# KeyInFlight when a record an earlier cycle writes would be touched.
__all__ = ["KeyInFlight", "Plan", "QueuePolicy", "plan_cycle"]


def plan_cycle(
    state: ClusterState,
    *,
    reports: list[StatusReport],
    commands: list[Command],
    now: float,
    term: int,
    max_keys: int = 900,
    budget: EvictionBudget | None = None,
    submissions: list[SubmitRequest] = (),  # type: ignore[assignment]
    frozen_jobs: frozenset[str] | set[str] = frozenset(),
    frozen_hosts: frozenset[str] | set[str] = frozenset(),
    placements: int | None = None,
    evict: bool = True,
    fail: Mapping[str, str] | None = None,
    skip: Collection[str] = (),
    policy: str = "fgd",
    unheard_since: Mapping[str, float] | None = None,
    unheard_grace_s: float = 0.0,
    candidates: int = 16,
    queues: QueuePolicy | None = None,
    usage: bool = True,
    reports_read_to: float | None = None,
    report_stamps: Sequence[float] = (),
    pending: Mapping[str, Job] | None = None,
    pending_held: Mapping[str, Resources] | None = None,
) -> Plan:
    """Decide one cycle. `state` is read, never modified. Records in `frozen_jobs` and
    `frozen_hosts` (written by earlier cycles whose commits are in flight) are neither
    read for decisions nor written: inputs that would touch them wait (they and every
    input after them are left unused), and no job is placed on a frozen host.

    The scheduler narrows a cycle when it looks for an input the store refuses (see
    scheduling.scheduler, isolation): at most `placements` jobs placed, no eviction or
    drain unless `evict`; the jobs in `fail` end FAILED with their reason, and those in
    `skip` are left alone (their records cannot be written at all).

    `queues` holds the fair-share and preemption settings; with `usage` the queues'
    decayed past use is brought up to date when due (the scheduler passes False while a
    commit in flight writes it). `pending` holds the job records the commits in flight
    write (the `frozen_jobs`): their placements count against queue quotas and per-user
    limits, so that pipelined cycles do not each admit up to the same limit; `pending_held`
    what each of them holds (queues.job_usage), where the caller knows it already.

    `reports_read_to` is the store's time up to which every status report has been
    given to this cycle or an earlier one (None: not known), and `report_stamps` when the
    store stored each of `reports` (inf, or none given: not known): work on a host whose
    key expired later waits (`evict_lost`), and so does any whose expiry is newer than a
    report this cycle leaves for the next; a report's time is bounded by its stamp
    (`cycle.reports.report_time`)."""
    plan = Plan()
    w = Work(state, plan, frozen_jobs, frozen_hosts, pending, pending_held)
    for job_id, why in (fail or {}).items():
        if job_id not in frozen_jobs and not w.busy(job_id):
            fail_unwritable(w, job_id, why, now)
    # Each input touches at most a job and a host's allocation (a gang's failure may
    # touch every host of the gang, at most 256): leave room for them and for placements.
    room = max(2, max_keys - 258)
    for i, r in enumerate(reports):
        if plan.keys + 2 > room:
            break
        plan.reports_used += 1
        if w.busy(r.job_id, (r.host_id,)):
            plan.deferred_reports.append(i)
            continue
        apply_report(w, r, now, report_stamps[i] if i < len(report_stamps) else math.inf)
    for i, c in enumerate(commands):
        if plan.keys + 2 > room:
            break
        plan.commands_used += 1
        if w.busy(c.job_id):
            plan.deferred_commands.append(i)
            continue
        if c.kind == "cancel":
            apply_cancel(w, c, now)
        elif c.kind == "update":
            apply_update(w, c, now)
        elif c.kind == "requeue":
            apply_requeue(w, c, now)
    known = state.index.models()
    for i, req in enumerate(submissions):
        if plan.keys + len(req.jobs) > room:
            break
        plan.submissions_used += 1
        if frozen_jobs and any(isinstance(d.get("id"), str) and d["id"] in frozen_jobs for d in req.jobs):
            plan.deferred_submissions.append(i)  # a retried publish of jobs being committed
            continue
        apply_submission(w, req, known, now)
    resolve_dependencies(w, now, room)

    def healthy(host_id: str) -> bool:
        """Whether the host may take work: healthy, not being changed by a commit in flight,
        and not in a maintenance window that has begun."""
        return host_id not in frozen_hosts and state.health(host_id, now) is Health.HEALTHY \
            and not (state.maintenance and maintenance.started(state.maintenance.get(host_id), now))

    queues = queues or QueuePolicy()
    if evict:
        enforce_time_limits(w, now, room)  # first: a limit passed before a drain's deadline is the try's end
        drain_due(w, now, room)
        stop_set_aside(w, now, room)
        pass_gpu_clears(w)
        stop_on_faulted_gpus(w, now, room)
    frag = state.shapes.fragmentation()
    if evict and budget is not None:
        if reports_read_to is not None and plan.reports_used < min(len(reports), len(report_stamps)):
            reports_read_to = min(reports_read_to, report_stamps[plan.reports_used])
        evict_lost(w, Placer(state.index, healthy, policy=policy, fragmentation=frag, candidates=candidates), now,
                   budget, max_keys, unheard_since, unheard_grace_s, reports_read_to)
    placer = Placer(state.index, healthy, policy=policy, fragmentation=frag, candidates=candidates)
    # Capacity freed or taken by this cycle's reports, cancels and evictions.
    for host_id, alloc in plan.allocs.items():
        cap = placer.cap(host_id)
        if cap is None:
            continue
        cap.used_gpus.clear()
        cap.share_used.clear()
        cap.share_memory_used.clear()
        cap.used_mig.clear()
        cap.used_cpus = 0.0
        cap.used_memory_mb = 0
        cap.tasks = 0
        cap.record_bytes = 0
        for t in alloc.tasks:
            cap.hold(t)
            cap.record_bytes += len(t.compact_json()) + 1
    for host_id, bad in w.faulted.items():
        cap = placer.cap(host_id)
        if cap is not None:
            cap.unhealthy_gpus = cap.unhealthy_gpus | bad
    for alloc in plan.allocs.values():
        alloc.term = term or alloc.term
    if evict and usage and plan.keys + len(state.queue_usage) + len(state.queue_past) < room:
        update_usage(w, now, queues)
    if placements != 0:
        place_queued(w, placer, now, term, max_keys, placements=placements, skip=skip, policy=queues)
    return plan
