"""Job groups with a limit on how many run at once: a job names a group (`JobSpec.group`)
and a limit (`JobSpec.group_limit`); of one user's jobs in that group, at most the limit
are placed or running at a time, the others waiting their turn in their queue. This is a
job array's throttle (Slurm's `--array=0-999%16`: `muster job submit --array 1000%16`) and,
with a limit of 1 and the job's name as the group, Slurm's `--dependency=singleton`
(`muster job submit --singleton`): a sweep of a thousand points does not take every GPU its
quota allows at once, and a nightly job does not start while yesterday's still runs. As
Slurm's, a singleton waits for every job of its user with its name, singleton or not (those
outside its group are tallied apart: `named_counts`).

A job waiting for its group is not blocked by the cluster: it is no reason to preempt
anything nor to hold a reservation. Groups are per user, so one user's group cannot hold
back another's jobs.

Pure: the tally (`counts`, scheduling.livecounts) is kept from job records as they
arrive; `waits` decides."""

from __future__ import annotations

from server.scheduling.livecounts import LiveCounts
from wire.messages import Job

Key = tuple[str, str]  # (user, group), or (user, name)
GroupKey = tuple[str, str, int]  # (user, group, limit)


def key(job: Job) -> GroupKey | None:
    """The group a job counts in, or None (no group, or no limit to count against): its
    user's jobs of that group name and that limit (found by exploring: a singleton named
    after a group of others with a limit of 3 was held back by them, and once that was
    undone, a job named after its group of limit 1 ran beside the group's others; with the
    limit in the key the first is no member of the others' group, and the second is)."""
    return (job.spec.user, job.spec.group, job.spec.group_limit) if job.spec.group and job.spec.group_limit else None


def counts() -> LiveCounts[GroupKey]:
    """An empty tally of jobs placed or running per (user, group, limit) (scheduling.livecounts)."""
    return LiveCounts(key)


def singleton(job: Job) -> bool:
    """A singleton: the group of its own name, with a limit of 1."""
    return job.spec.group_limit == 1 and job.spec.group == job.spec.name


def named_key(job: Job) -> Key:
    """(user, name) of a job: what a singleton of that name waits for (found by exploring:
    a singleton started beside a plain job of its name, where Slurm's waits for every job of
    its user and name; and not for a job of another name put in a group of its name)."""
    return job.spec.user, job.spec.name


def named_counts() -> LiveCounts[Key]:
    """An empty tally of jobs placed or running per (user, name)."""
    return LiveCounts(named_key)


def running(job: Job, in_group: int, named: int) -> int:
    """The jobs `job`'s limit counts, placed or running, a preemptor itself not among
    them: for a singleton the `named` jobs of its user and name, and the `in_group` of its
    group (of its name: a job named after the group it is put in with a limit of 1 is a
    singleton too, and another of that group must keep it waiting as well; found by
    exploring, two of a group limited to 1 ran at once), the larger (its limit is 1: it
    waits while either is any); for another the `in_group` of its group."""
    return (max(named, in_group) if singleton(job) else in_group) - bool(job.preempting)


def waits(job: Job, running: int) -> bool:
    """Whether `job` waits for its group: `running` of the jobs its limit counts are placed
    or running (this one not among them) and that is its limit already."""
    return key(job) is not None and running >= job.spec.group_limit


def wait_text(job: Job, running: int) -> str:
    """Why pending, in words."""
    if singleton(job):
        return (f"{running} of {job.spec.user}'s jobs named {job.spec.name!r} or of its group {job.spec.group!r} "
                "placed or running: a singleton starts when none is")
    return (f"{running} job(s) of {job.spec.user}'s group {job.spec.group!r} placed or running, its limit "
            f"{job.spec.group_limit}: it starts when one of them ends")
