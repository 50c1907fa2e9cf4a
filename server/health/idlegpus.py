"""Alerts for running attempts whose GPUs stay idle: jobs that hold GPUs and do not use
them, the waste operators of shared GPU clusters most often find too late. Each agent
samples its running attempts' GPUs at every heartbeat and names in its heartbeat those
whose GPUs have all been idle (under `GPU_IDLE_UTIL_PCT`) for its `--gpu-idle-after`
(`Heartbeat.gpu_idle`); this turns what the hosts say into `job.gpus_idle` alerts. Pure:
what is idle, the jobs and a clock in, alert events out (the scheduler publishes them).

Each attempt is alerted once while it stays idle, and again if it becomes idle again
after using its GPUs. A leader that takes over alerts the attempts idle at its first
check again: a second alert rather than none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from server.health.alertsummary import summarized
from server.timefmt import iso_utc
from wire.messages import GPU_IDLE_UTIL_PCT, Attempt, AttemptState, Event, Job
from wire.subjects import ALERT_JOB_GPUS_IDLE


def running_idle(idle: Mapping[str, tuple[str, float]],
                 jobs: Mapping[str, Job]) -> Iterator[tuple[Job, Attempt, str, float]]:
    """(job, attempt, host, idle since) for each of `idle` (attempt id -> (host, since), as
    the hosts' agents say) that is a running attempt on that host, by attempt id."""
    for attempt_id, (host_id, since) in sorted(idle.items()):
        job = jobs.get(attempt_id.split(".", 1)[0])
        a = next((t for t in job.current_tasks() if t.id == attempt_id), None) if job is not None else None
        if job is not None and a is not None and a.state is AttemptState.RUNNING and a.host_id == host_id:
            yield job, a, host_id, since


@dataclass
class IdleWatch:
    _alerted: set[str] = field(default_factory=set)  # attempts idle at the last check

    def check(self, now: float, idle: Mapping[str, tuple[str, float]], jobs: Mapping[str, Job]) -> list[Event]:
        """`idle`: attempt id -> (host, idle since), as the hosts' agents say; an alert for
        each running attempt idle now and not at the last check (one for them all past a
        few)."""
        current: set[str] = set()
        new: list[Event] = []
        by_queue: dict[str, int] = {}
        for job, a, host_id, since in running_idle(idle, jobs):
            attempt_id = a.id
            current.add(attempt_id)
            if attempt_id in self._alerted:
                continue
            spec = job.spec
            held = f"{len(a.gpu_indices)} GPU(s)" if not a.gpu_share else f"{a.gpu_share}/1000 of a GPU"
            new.append(Event(
                kind=ALERT_JOB_GPUS_IDLE, ts=now, job_id=job.id, host_id=host_id,
                message=(f"job {job.id} ({spec.name}, queue {spec.queue}, user {spec.user}) holds {held} on "
                         f"{host_id} that have been idle (under {GPU_IDLE_UTIL_PCT:g} % at every heartbeat) since "
                         f"{iso_utc(since)}"),
                data={"attempt": attempt_id, "since": since, "queue": spec.queue, "user": spec.user,
                      "gpus": a.gpu_indices, "gpu_share": a.gpu_share}))
            by_queue[spec.queue] = by_queue.get(spec.queue, 0) + 1
        self._alerted = current
        return summarized(new, now, f"{len(new)} jobs hold GPUs that have been idle",
                          {"by_queue": by_queue}, of="job")
