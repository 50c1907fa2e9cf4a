"""The per-user and per-group limits during one cycle's placement: what each user's jobs
hold (GPUs, jobs placed or running) and each job group's jobs placed or running, as the
cycle goes on, and whether a job waits for them. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from server.scheduling import fairshare, groups, userfair
from server.scheduling.cycle.admission import LiveTally
from server.scheduling.cycle.work import QueuePolicy, Work
from server.scheduling.livecounts import queue_user
from server.scheduling.queues import EPS, add_user, job_gpus
from wire.messages import Job, Queue


class UserLimits:
    """A cycle's tallies for the limits of queues' users and of job groups.

    `claimed`: the preemptors, waiting for their victims or starting with a commit in
    flight, whose victims' GPUs count as theirs already."""

    def __init__(self, w: Work, claimed: Sequence[Job], now: float, policy: QueuePolicy) -> None:
        self.w = w
        self.claimed = claimed
        self.now = now
        self.policy = policy
        # Per queue with a per-user GPU limit: the GPUs each user's jobs hold, this cycle's
        # changes so far included (reports, cancels, replacements), plus what the user's
        # preemptors will take and what this cycle places.
        self.by_user: dict[str, dict[str, float]] = {}
        # Jobs placed or running per user and job group, and per queue and user: the state's
        # counts with this cycle's changes and the commits in flight, then what it places.
        self.in_group = LiveTally(w, w.state.group_live)
        self.named = LiveTally(w, w.state.named_live)
        self.user_jobs = LiveTally(w, w.state.user_live)

    def tally(self, qn: str) -> dict[str, float]:
        """GPUs held per user of queue `qn`."""
        if qn not in self.by_user:
            # The state's figures (kept as records arrive), with this cycle's changes and
            # the commits in flight in place of the records they replace.
            theirs = {qn: dict(self.w.state.user_usage.get(qn, {}))}
            for old, new in self.w.replaced():
                if old is not None and old.spec.queue == qn:
                    add_user(theirs, old, -1.0)
                if new.spec.queue == qn:
                    add_user(theirs, new, 1.0)
            users = theirs.get(qn, {})
            for j in self.claimed:
                if j.spec.queue == qn and j.spec.wants_gpu():
                    users[j.spec.user] = users.get(j.spec.user, 0.0) + job_gpus(j.spec)
            self.by_user[qn] = users
        return self.by_user[qn]

    def over(self, job: Job, q: Queue) -> bool:
        """The job would take its user past one of its queue's per-user limits, of GPUs or
        of jobs placed or running: it waits, and is not a reason to preempt anything
        (other users' jobs of the queue go on). A preemptor's own claim is counted already."""
        if q.max_running_jobs_per_user and self.user_jobs.get(queue_user(job)) - bool(job.preempting) \
                >= q.max_running_jobs_per_user:
            return True
        if not q.max_gpus_per_user or not job.spec.wants_gpu():
            return False
        own = job_gpus(job.spec) if job.preempting else 0.0
        return self.tally(job.spec.queue).get(job.spec.user, 0.0) - own + job_gpus(job.spec) \
            > q.max_gpus_per_user + EPS

    def waits_for_group(self, job: Job) -> bool:
        """The job's group has its limit of jobs placed or running: it waits its turn, and
        is not a reason to preempt anything. A preemptor is counted in its group already."""
        k = groups.key(job)
        if k is None:
            return False
        named = self.named.get((job.spec.user, job.spec.name)) if groups.singleton(job) else 0
        return groups.waits(job, groups.running(job, self.in_group.get(k), named))

    def waits(self, job: Job, q: Queue | None) -> bool:
        """Either of the above (a job whose queue is gone is held by neither)."""
        return (q is not None and self.over(job, q)) or self.waits_for_group(job)

    def claim(self, job: Job, q: Queue | None) -> None:
        """Count a job placed, or one whose preemption starts, against its user's limits and
        its group's."""
        if q is not None and q.max_gpus_per_user and job.spec.wants_gpu():
            users = self.tally(job.spec.queue)
            users[job.spec.user] = users.get(job.spec.user, 0.0) + job_gpus(job.spec)
        if q is not None and q.max_running_jobs_per_user:
            self.user_jobs.add(queue_user(job))
        k = groups.key(job)
        if k is not None:
            self.in_group.add(k)
        # Read only for singletons: counted now only once one has read it (the job's record,
        # placed or preempting by the next read, is gathered otherwise).
        self.named.note(groups.named_key(job))

    def user_load(self, qn: str) -> Callable[[str], userfair.Load]:
        """Each user's load in queue `qn` for fair share between its users: what the user
        holds as the cycle begins, and their decayed past use (scheduling.userfair)."""
        past_gpus, past_jobs = fairshare.past_users(self.w.state.queue_past.get(qn), self.now,
                                                    self.policy.half_life_s)
        return lambda user: (self.tally(qn).get(user, 0.0) + past_gpus.get(user, 0.0),
                             self.user_jobs.get((qn, user)) + past_jobs.get(user, 0.0))
