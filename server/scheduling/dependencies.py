"""Jobs that wait for other jobs (`Job.waiting_for`, from `JobSpec.depends_on`), indexed
by the jobs they wait for, and which of them the planner must look at: those with a
dependency that has ended, or whose record is gone (`due`). Kept as job records arrive,
so that a cycle looks at the few waiting jobs whose dependencies changed, not at every
waiting job. Pure data, no I/O; ClusterState keeps one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from wire.messages import Job, JobSpec, JobState


def kind(spec: JobSpec) -> str:
    """The job's dependency rule, as Slurm names it: afterok, afterany or afternotok."""
    return "afterany" if spec.depend_any else "afternotok" if spec.depend_not_ok else "afterok"


def needs(spec: JobSpec) -> str:
    """What the job needs of each job it runs after, in words ("to succeed", ...)."""
    return {"afterok": "to succeed", "afterany": "to end", "afternotok": "to end otherwise than SUCCEEDED"}[kind(spec)]


def waits(spec: JobSpec, deps: Sequence[str],
          lookup: Callable[[str], Job | JobState | None]) -> tuple[list[str], tuple[str, JobState | None] | None]:
    """Of `deps` (jobs a job with `spec` runs after, found with `lookup`: a job, or only
    the state history last saw it in, for one whose record is gone), those not ended
    yet, which it waits for; and the first that means it can never run: (its id, None) for
    one not known, (its id, its end) for one whose end the rule excludes (afterok: any but
    SUCCEEDED; afternotok: SUCCEEDED). The API, at submission, and the leader, as
    dependencies end, decide alike."""
    left: list[str] = []
    for d in deps:
        dep = lookup(d)
        if dep is None:
            return left, (d, None)
        state = dep if isinstance(dep, JobState) else dep.state
        if not state.terminal:
            left.append(d)
        elif not spec.depend_any and (state is JobState.SUCCEEDED) is spec.depend_not_ok:
            return left, (d, state)
        elif isinstance(dep, Job) and dep.stopping:
            left.append(d)  # ended, but a task of it is still stopping: it has not ended yet for what runs after it
    return left, None


class Dependencies:
    def __init__(self) -> None:
        self.waiting: dict[str, tuple[str, ...]] = {}  # waiting job -> the jobs it waits for
        self.waiters: dict[str, set[str]] = {}  # job -> the jobs waiting for it
        self.due: set[str] = set()  # waiting jobs with a dependency ended or gone

    @staticmethod
    def _ended(jobs: Mapping[str, Job], job_id: str) -> bool:
        """Gone, or ended with its tasks stopped (`Job.stopping`: a cancelled job whose task
        runs out its grace has not ended for the jobs that run after it)."""
        job = jobs.get(job_id)
        return job is None or job.state.terminal and not job.stopping

    def changed(self, jobs: Mapping[str, Job], job_id: str) -> None:
        """Job `job_id`'s record was set or dropped (`jobs` as it now stands)."""
        for d in self.waiting.pop(job_id, ()):
            waiters = self.waiters.get(d)
            if waiters is not None:
                waiters.discard(job_id)
                if not waiters:
                    del self.waiters[d]
        self.due.discard(job_id)
        job = jobs.get(job_id)
        if job is not None and job.waiting_for and job.state is JobState.QUEUED:
            deps = tuple(job.waiting_for)
            self.waiting[job_id] = deps
            for d in deps:
                self.waiters.setdefault(d, set()).add(job_id)
            self._check(jobs, job_id)
        for w in self.waiters.get(job_id, ()):
            self._check(jobs, w)

    def _check(self, jobs: Mapping[str, Job], waiting: str) -> None:
        if any(self._ended(jobs, d) for d in self.waiting[waiting]):
            self.due.add(waiting)
        else:
            self.due.discard(waiting)
