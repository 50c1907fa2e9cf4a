"""One cycle's queue accounting (`Admission`: the queue book with this cycle's changes,
fair shares, the preemptions under way), a queue's jobs in its order, and what a
quota's refusals say of later, larger jobs. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from server.scheduling import fairshare, preemption, userfair
from server.scheduling.cycle.work import QueuePolicy, Work
from server.scheduling.livecounts import LiveCounts
from server.scheduling.queues import (
    CPU,
    MEMORY,
    OVER_QUOTA,
    QueueBook,
    Refusal,
    add,
    gpu_key,
    job_demand,
    nominal,
    placement_spec,
)
from server.state.cluster import ClusterState
from wire.messages import Job, JobSpec, Queue


def at_least(size: tuple[float, ...], floor: tuple[float, ...]) -> bool:
    """Whether `size` is at least `floor` in every respect (both `job_size` tuples)."""
    return all(x >= y for x, y in zip(size, floor, strict=True))


def queue_order(jobs: list[Job], q: Queue | None = None, state: ClusterState | None = None, now: float = 0.0,
                half_life_s: float = 0.0) -> Sequence[Job]:
    """One queue's jobs in its order: by priority, then submission order; in a queue `q`
    with fair share between its users, the users' order from what they hold in `state`
    and their past use decayed to `now` (scheduling.userfair). Across queues the planner
    interleaves them by fair share (scheduling.fairshare)."""
    ordered = fairshare.within_queue_order(jobs)
    if q is None or state is None or not q.fair_share_users:
        return ordered
    usage, live = state.user_usage.get(q.name, {}), state.user_live
    past_gpus, past_jobs = fairshare.past_users(state.queue_past.get(q.name), now, half_life_s)
    return userfair.interleaved(ordered, lambda user: (usage.get(user, 0.0) + past_gpus.get(user, 0.0),
                                                       live.get((q.name, user)) + past_jobs.get(user, 0.0)))


K = TypeVar("K")


class LiveTally(Generic[K]):
    """A count of the state's jobs placed or running (scheduling.livecounts) as this cycle
    sees it: the records of commits in flight and of this cycle so far in place of the
    state's (gathered in one pass over them, when first asked), then what it places."""

    def __init__(self, w: Work, counts: LiveCounts[K]) -> None:
        self.w = w
        self.counts = counts
        self._delta: LiveCounts[K] | None = None

    def _changes(self) -> LiveCounts[K]:
        if self._delta is None:
            self._delta = LiveCounts(self.counts.key)
            for old, new in self.w.replaced():
                self._delta.update(old, new)
        return self._delta

    def get(self, k: K) -> int:
        return self.counts.get(k) + self._changes().get(k)

    def add(self, k: K) -> None:
        """One more job of `k` placed (or preempting) this cycle."""
        self._changes().add(k, 1)

    def note(self, k: K) -> None:
        """`add`, for a job whose record this cycle has changed (or is about to, before the
        tally is next read): counted now only if the changes were gathered already, else
        gathered with them when first asked (a tally no one reads costs nothing)."""
        if self._delta is not None:
            self._delta.add(k, 1)


class Admission:
    """One cycle's queue accounting: the queue book (what each queue holds, this cycle's
    changes included), fair shares, and the preemptions under way."""

    def __init__(self, w: Work, now: float, policy: QueuePolicy) -> None:
        state = w.state
        self.policy = policy
        usage = {q: dict(u) for q, u in state.queue_usage.items()}
        # The records of commits in flight (their placements, stops and ends) and this
        # cycle's reports, cancels and evictions in place of the state's.
        for old_queue, old_held, queue, held in w.held_changes():
            if old_queue is not None and old_held:
                add(usage.setdefault(old_queue, {}), old_held, -1.0)
            add(usage.setdefault(queue, {}), held)
        self.book = QueueBook(state.queues, usage)
        # The book as it will be once the preemptions under way are done (victims gone,
        # preemptors placed): what further preemptions are decided on, so that victims
        # stopping are not counted as borrowing twice.
        self.future = self.book.copy()
        past = {q: fairshare.past_allocation(rec, now, policy.half_life_s) for q, rec in state.queue_past.items()}
        self.shares = fairshare.Shares(self.book, state.capacity_at(now), past)
        self.models = sorted(state.index.models())
        self._demands: dict[str, tuple[JobSpec, dict[str, float]]] = {}
        self._any_model: dict[str, str] = {}  # per queue, the model a job naming none is counted as
        # Per queue, its running jobs that could be victims, cheapest first: built once a
        # cycle (cycle.victims.running_by_cost), read by every search for victims.
        self.running: dict[str, Ranked] = {}
        # Per running job read as a victim this cycle, what every search reads of it
        # (cycle.victims._victim; None: it cannot be stopped now).
        self.victims: dict[str, preemption.Victim | None] = {}
        # The running jobs that end by themselves within the longest grace of a queue:
        # job id -> (its time limit, its host's stop), and per queue job id -> the earlier
        # (cycle.victims.ending, worked out when a search for victims first asks).
        self.ends: dict[str, tuple[float, float]] | None = None
        self.ends_by_queue: dict[str, dict[str, float]] = {}

    def queue(self, job: Job) -> Queue | None:
        return self.book.queue(job.spec.queue)

    def restrict(self, job: Job, seen: dict[str, float] | None = None) -> tuple[JobSpec | None, Refusal | None]:
        """The spec to place the job with (its GPU models narrowed to those its queue may
        take it on, and its queue's host labels added: placement_spec), or the queue's
        refusal; (None, None) when its own host labels and its queue's conflict (it is not
        placed). Each refusal met on the way lowers `seen` (resource -> the least demand of
        it refused) where it is lower."""
        qn = job.spec.queue
        q = self.book.queue(qn)
        assert q is not None
        labelled = placement_spec(job.spec, q)
        if labelled is None:
            return None, None
        spec = labelled
        models = self.models_of(qn, spec) if spec.wants_gpu() else None
        if models is None:
            refusal = self.book.admits(qn, job_demand(spec, None))
            if refusal is not None and seen is not None:
                _note(seen, refusal)
            return (spec, None) if refusal is None else (None, refusal)
        allowed: list[str] = []
        refusals: list[tuple[bool, Refusal]] = []
        for m in models:
            refusal = self.book.admits(qn, job_demand(spec, m))
            if refusal is None:
                allowed.append(m)
            else:
                if seen is not None:
                    _note(seen, refusal)
                # The refusal shown: one on a model the queue has a quota of, if any.
                refusals.append((nominal(q, "gpu:" + m) <= 0, refusal))
        if not allowed:
            return None, min(refusals, key=lambda x: x[0])[1] if refusals else Refusal(OVER_QUOTA, "gpu:", 0, 0, 0)
        if frozenset(allowed) == spec.models() or (spec.models() is None and len(allowed) == len(models)):
            return spec, None  # nothing narrowed: a job of any model stays one (placed without a model set)
        return spec.model_copy(update={"gpu_model": None, "gpu_models": allowed}), None

    def models_of(self, queue: str, spec: JobSpec | None) -> list[str] | None:
        """The GPU models `restrict` asks the queue's quota about for a job (`spec`; None:
        one naming no models), None when the queue meters no GPUs."""
        if not self.book.gpu_metered.get(queue, False):
            return None
        models = spec.models() if spec is not None else None
        return sorted(models) if models else self.models

    def borrows(self, queue: str, size: tuple[float, ...]) -> bool:
        """`QueueBook.would_borrow` for a job of `size` (`job_size`) naming no GPU model,
        its GPUs counted as `demand` counts them: worked out from the size alone, and
        true of every job at least as large in each respect."""
        q = self.book.queue(queue)
        if q is None:
            return False
        gpus, tasks, cpus, memory = size
        model = self._any_model.get(queue)
        if model is None:
            model = self._any_model[queue] = _counted_model(q, self.models)
        return self.book.would_borrow(queue, {CPU: cpus * tasks, MEMORY: memory * tasks,
                                              gpu_key(model): gpus * tasks})

    def demand(self, job: Job) -> dict[str, float]:
        """What the job would take (for preemption): its GPUs counted as the model its
        queue has most quota of among those it accepts."""
        hit = self._demands.get(job.id)
        if hit is not None and hit[0] is job.spec:
            return hit[1]
        d = self._demand(job)
        self._demands[job.id] = (job.spec, d)
        return d

    def _demand(self, job: Job) -> dict[str, float]:
        spec = job.spec
        q = self.book.queue(spec.queue)
        model = _counted_model(q, sorted(spec.models() or self.models)) if spec.wants_gpu() else None
        return job_demand(spec, model)


def _counted_model(q: Queue | None, models: list[str]) -> str:
    """The model a job that accepts any of `models` is counted as: the one its queue has
    most quota of (the first on a tie; "" when there are none)."""
    models = models or [""]
    return max(models, key=lambda m: (nominal(q, "gpu:" + m) if q else 0.0, -models.index(m)))


def _note(seen: dict[str, float], refusal: Refusal) -> None:
    if refusal.resource and refusal.wanted < seen.get(refusal.resource, math.inf):
        seen[refusal.resource] = refusal.wanted


def refused_whole(seen: Mapping[str, float], size: tuple[float, ...], models: Sequence[str] | None) -> bool:
    """Whether a job of `size` (`job_size`) is refused by its queue on every GPU model it
    may take (`models`; None: its GPUs are not metered), given `seen`, the least demand of
    each resource the queue's quota refused this cycle: it demands at least that much
    of one resource, for each model. Placements only take within a cycle, and a queue's
    quota refuses each resource on its own, more of it the more is asked
    (`QueueBook.admits`), so such a job is refused too."""
    gpus, tasks, cpus, memory = size
    if cpus * tasks >= seen.get(CPU, math.inf) or memory * tasks >= seen.get(MEMORY, math.inf):
        return True
    if models is None or not models or gpus <= 0:
        return False
    want = gpus * tasks
    return all(want >= seen.get(gpu_key(m), math.inf) for m in models)


class Ranked:
    """A queue's running jobs that could be stopped, cheapest first, read only as far as
    the searches go: a search for victims stops after a few, and a cycle's searches share
    one reading (what was read is kept in `done`)."""

    __slots__ = ("_rest", "done")

    def __init__(self, rest: Iterator[tuple[tuple[int, float, float, str], Job]]) -> None:
        self._rest = rest
        self.done: list[tuple[tuple[int, float, float, str], Job]] = []

    def __iter__(self) -> Iterator[tuple[tuple[int, float, float, str], Job]]:
        i = 0
        done = self.done
        while True:
            if i < len(done):
                yield done[i]
                i += 1
            else:
                item = next(self._rest, None)
                if item is None:
                    return
                done.append(item)
