"""Job groups with a limit on how many run at once: a job names a group (`JobSpec.group`)
and a limit (`JobSpec.group_limit`); of one user's jobs in that group, at most the limit
are placed or running at a time, the others waiting their turn in their queue. This is a
job array's throttle (Slurm's `--array=0-999%16`: `muster job submit --array 1000%16`) and,
with a limit of 1 and the job's name as the group, Slurm's `--dependency=singleton`
(`muster job submit --singleton`): a sweep of a thousand points does not take every GPU its
quota allows at once, and a nightly job does not start while yesterday's still runs.

A job waiting for its group is not blocked by the cluster: it is no reason to preempt
anything nor to hold a reservation. Groups are per user, so one user's group cannot hold
back another's jobs.

Pure: the tally (`counts`, scheduling.livecounts) is kept from job records as they
arrive; `waits` decides."""

from __future__ import annotations

from server.scheduling.livecounts import LiveCounts
from wire.messages import Job

Key = tuple[str, str]  # (user, group)


def key(job: Job) -> Key | None:
    """The group a job counts in, or None (no group, or no limit to count against)."""
    return (job.spec.user, job.spec.group) if job.spec.group and job.spec.group_limit else None


def counts() -> LiveCounts[Key]:
    """An empty tally of jobs placed or running per (user, group) (scheduling.livecounts)."""
    return LiveCounts(key)


def waits(job: Job, running: int) -> bool:
    """Whether `job` waits for its group: `running` of the group's jobs are placed or
    running (this one not among them) and that is its limit already."""
    return key(job) is not None and running >= job.spec.group_limit


def wait_text(job: Job, running: int) -> str:
    """Why pending, in words."""
    what = "singleton" if job.spec.group_limit == 1 and job.spec.group == job.spec.name else "group"
    return (f"{running} job(s) of {job.spec.user}'s {what} {job.spec.group!r} placed or running, its limit "
            f"{job.spec.group_limit}: it starts when one of them ends")
