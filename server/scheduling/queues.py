"""Queue quotas: what each job costs, what each queue holds, and whether a queue may take
more (nominal quota, borrowing within a cohort, lending limits). Pure: a snapshot of the
queues and their usage in, answers out.

Resources are named "gpu:<model>" (GPUs, a share or MIG instance counted as the part of
a GPU it is), "cpu" (cores) and "memory_mb". A queue meters a resource it has a quota
for; listing any "gpu:<model>" meters GPUs of every model (a model it does not list has
nominal 0 there). A resource a queue does not meter is not limited for it, and a queue
with no quota at all is unmetered: it takes what is free, and everything it holds counts
as borrowed (reclaim may take it back).

Cohorts (Kueue's model): each queue of a cohort lends the part of its nominal quota
above `nominal - lending_limit` to the cohort's pool; a queue's use above its own
non-lent part draws on the pool, and a queue may use at most `nominal +
borrowing_limit`. A queue within its nominal quota can still find the pool drained by
borrowers: that is what reclaim (server.scheduling.preemption) takes back.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from server.timefmt import duration_text
from wire.errors import ValidationError
from wire.messages import (
    DEFAULT_QUEUE,
    Attempt,
    AttemptState,
    Job,
    JobSpec,
    Queue,
    implicit_default_queue,
)

Resources = dict[str, float]
GPU_PREFIX = "gpu:"
CPU = "cpu"
MEMORY = "memory_mb"
EPS = 1e-6

# Queue-level reasons a queued job waits (why pending).
OVER_QUOTA = "over nominal quota and cannot borrow"
COHORT_EXHAUSTED = "cohort exhausted"
FAIR_SHARE = "waiting for fair share"
PREEMPTION_GRACE = "waiting for a preemption grace to end"
RECLAIM_WAIT = "waiting for reclaim"
PRIORITY_WAIT = "waiting for priority preemption"
GANG_WHOLE = "gang cannot fit as a whole"
UNKNOWN_QUEUE = "queue does not exist"
HELD = "held"
DEPENDENCY = "waiting for other jobs"
USER_LIMIT = "user at its queue's per-user limit"
RESERVED = "holds a reservation"
RESERVED_FOR_OTHER = "hosts reserved for another job"
MAINTENANCE = "hosts closing for maintenance"
SET_ASIDE = "hosts set aside for others"
GROUP_LIMIT = "waiting for its group"
NOT_YET = "waiting for its start time"
LABEL_CONFLICT = "host labels conflict with its queue's"


def gpu_key(model: str) -> str:
    return GPU_PREFIX + model


# A GPU in MIG mode has 7 compute slices (A100, H100, H200, GH200, B200, GB200), except
# those named here (NVIDIA's MIG user guide; `agent.gpu.normalise_model` names models).
# GPU models whose MIG mode has 4 compute slices, not 7 (the RTX PRO 6000 Blackwell: 1g.24gb,
# 2g.48gb, 4g.96gb; its 1g.24gb is also an H100 NVL's seventh, so only its model tells).
MIG_SLICES: dict[str, int] = {"A30": 4, "RTXPRO6000": 4}
MIG_SLICES_DEFAULT = 7
# The profiles only a GPU of 4 slices has (an A30's: 1g.6gb, 2g.12gb, 4g.24gb, the first
# two also "+me"): the slices of an instance whose GPU model is not known.
FOUR_SLICE_PROFILES = frozenset({"1g.6gb", "2g.12gb", "4g.24gb"})


def mig_slices(profile: str, model: str | None = None) -> int:
    """The compute slices of the GPU a MIG instance of `profile` is made on: by its GPU's
    `model` when that is one of MIG_SLICES, else by the profile (only an A30's profiles
    are of 4 slices; every other of 7)."""
    if model and model in MIG_SLICES:
        return MIG_SLICES[model]
    return 4 if profile.split("+", 1)[0] in FOUR_SLICE_PROFILES else MIG_SLICES_DEFAULT


def mig_fraction(profile: str | None, model: str | None = None) -> float:
    """The part of a GPU a MIG instance is: its compute slices of its GPU's ("3g.40gb" on
    an H100 -> 3/7, "2g.12gb" on an A30 -> 2/4; `mig_slices`)."""
    if not profile:
        return 0.0
    try:
        return min(1.0, int(profile.split("g", 1)[0]) / mig_slices(profile, model))
    except ValueError:
        return 1.0


def gpu_amount(spec: JobSpec, model: str | None = None) -> float:
    """GPUs one task of `spec` holds: whole GPUs, a share, or a MIG instance's part (of a
    GPU of `model`, the model it was placed on; not known: the one the job names, if one)."""
    if spec.gpus > 0:
        return float(spec.gpus)
    if spec.gpu_share > 0:
        return spec.gpu_share / 1000
    if not spec.mig_profile:
        return 0.0
    if not model:
        models = spec.models()
        model = next(iter(models)) if models is not None and len(models) == 1 else None
    return mig_fraction(spec.mig_profile, model)


def job_gpus(spec: JobSpec) -> float:
    """GPUs a job holds when placed: each of its tasks' (a share or MIG instance as its part)."""
    return gpu_amount(spec) * spec.replicas if spec.wants_gpu() else 0.0


def held_gpus(job: Job) -> float:
    """GPUs a job holds for its user's per-user limit: its last try's tasks not yet ended,
    whatever the job's state (one that ended while a task runs out its stop's grace still
    holds that task's GPUs, as its queue's quota counts them: `job_usage`)."""
    if not job.spec.wants_gpu():
        return 0.0
    return sum(gpu_amount(job.spec, t.gpu_model) for t in job.current_tasks() if not t.state.terminal)


def user_gpus(jobs: Iterable[Job], queue: str) -> dict[str, float]:
    """GPUs each user's live jobs of `queue` hold (`held_gpus`), worked out afresh (the
    cluster state keeps the same as records arrive: ClusterState.user_usage)."""
    out: dict[str, float] = {}
    for job in jobs:
        if job.spec.queue != queue:
            continue
        held = held_gpus(job)
        if held:
            out[job.spec.user] = out.get(job.spec.user, 0.0) + held
    return out


def add_user(into: dict[str, dict[str, float]], job: Job, sign: float) -> None:
    """Add (`sign` 1) or take away (-1) what a job holds to its user's GPUs in its queue
    (queue -> user -> GPUs; users and queues at zero left out)."""
    held = held_gpus(job)
    if not held:
        return
    q, user = job.spec.queue, job.spec.user
    users = into.setdefault(q, {})
    nv = users.get(user, 0.0) + sign * held
    if abs(nv) < EPS:
        users.pop(user, None)
        if not users:
            del into[q]
    else:
        users[user] = nv


def job_size(spec: JobSpec) -> tuple[float, ...]:
    """What a job takes, in every respect its queue's admission is decided on (its GPU
    models aside): a job at least as large in each is refused or borrows likewise."""
    return (gpu_amount(spec), spec.replicas, spec.cpus, spec.memory_mb)


def task_demand(spec: JobSpec, model: str | None) -> Resources:
    """What one task of `spec` costs, its GPUs counted as `model` ("" when unknown)."""
    d: Resources = {CPU: spec.cpus, MEMORY: float(spec.memory_mb)}
    g = gpu_amount(spec, model)
    if g > 0:
        d[gpu_key(model or "")] = g
    return d


def job_demand(spec: JobSpec, model: str | None) -> Resources:
    """What the whole job (every task of a gang) costs with its GPUs of `model`."""
    return {r: v * spec.replicas for r, v in task_demand(spec, model).items()}


def attempt_usage(spec: JobSpec, a: Attempt) -> Resources:
    return task_demand(spec, a.gpu_model)


def preemption_loss(spec: JobSpec, a: Attempt) -> float:
    """GPU-seconds of work a task that ended preempted lost: all it ran, or for a job that
    checkpoints (it saved its state when told to stop) the time from its stop to its exit.
    The scheduler's metric and the history's accounting both count it so."""
    if a.started_at is None or a.finished_at is None:
        return 0.0
    gpus = sum(v for r, v in attempt_usage(spec, a).items() if r.startswith("gpu:"))
    since = max(a.stop_at or a.started_at, a.started_at) if spec.checkpoints else a.started_at
    return max(0.0, a.finished_at - since) * gpus


def job_usage(job: Job) -> Resources:
    """What a job's live attempts hold now (placed, running or stopping)."""
    out: Resources = {}
    for a in job.current_tasks():
        if a.state in (AttemptState.PLACED, AttemptState.RUNNING):
            for r, v in attempt_usage(job.spec, a).items():
                out[r] = out.get(r, 0.0) + v
    return out


def add(into: dict[str, float], d: Mapping[str, float], sign: float = 1.0) -> None:
    for r, v in d.items():
        nv = into.get(r, 0.0) + sign * v
        if abs(nv) < EPS:
            into.pop(r, None)
        else:
            into[r] = nv


def meters(q: Queue, resource: str) -> bool:
    """Whether `q` has a quota for `resource` (GPUs: for any model)."""
    if resource.startswith(GPU_PREFIX):
        return any(k.startswith(GPU_PREFIX) for k in q.quota)
    return resource in q.quota


def unmetered(q: Queue) -> bool:
    return not q.quota


def reclaims_from(q: Queue, other: Queue) -> bool:
    """Whether reclaim for queue `q` may take what `other` holds above its nominal quota:
    `other` is of `q`'s cohort, unmetered, or of no cohort (it could not have borrowed:
    what it holds above its nominal quota it kept when it left a cohort or its quota was
    cut; found by exploring, a queue moved out of its cohort kept what it had borrowed
    for good, its cohort's members below their nominal quotas)."""
    return other.name != q.name and (
        other.cohort is None or unmetered(other) or (q.cohort is not None and other.cohort == q.cohort))


def nominal(q: Queue, resource: str) -> float:
    rq = q.quota.get(resource)
    return rq.nominal if rq is not None else 0.0


def borrowing_limit(q: Queue, resource: str) -> float:
    rq = q.quota.get(resource)
    if rq is None:
        # A metered resource without an entry (a GPU model the queue does not list):
        # nothing of its own, and it may borrow without a limit of its own.
        return math.inf
    return math.inf if rq.borrowing_limit is None else rq.borrowing_limit


def guaranteed(q: Queue, resource: str) -> float:
    """The part of the nominal quota the queue does not lend."""
    rq = q.quota.get(resource)
    if rq is None or rq.lending_limit is None:
        return 0.0
    return max(0.0, rq.nominal - rq.lending_limit)


@dataclass(frozen=True)
class Refusal:
    """Why a queue may not take a demand now, on which resource, with the figures."""

    reason: str
    resource: str
    used: float
    wanted: float
    limit: float
    # The queue's own limit is reached (nominal without a cohort, or nominal + borrowing
    # limit), not merely the cohort's pool: no preemption across queues can help.
    hard: bool = False
    # The queue's nominal quota of the resource and its cohort: what `limit` is made of.
    nominal: float = 0.0
    cohort: str | None = None
    # The part of its nominal quota the queue does not lend (its lending limit's rest).
    guaranteed: float = 0.0

    def detail(self) -> str:
        head = f"{self.resource}: {_fmt(self.used)} held + {_fmt(self.wanted)} wanted > {_fmt(self.limit)}"
        if self.reason == COHORT_EXHAUSTED:
            return (f"{head}, {self._pool_part()}); within its nominal quota {_fmt(self.nominal)}, "
                    "so queues that borrow hold the rest")
        return head + (f", {self.bound()}" if self.reason != UNKNOWN_QUEUE else "")

    def bound(self) -> str:
        """What `limit` is, in words."""
        if self.cohort is None:
            return "its nominal quota (no cohort)"
        if self.hard:
            return f"its nominal quota {_fmt(self.nominal)} + borrowing limit {_fmt(self.limit - self.nominal)}"
        return f"{self._pool_part()}; its nominal quota {_fmt(self.nominal)})"

    def _pool_part(self) -> str:
        # The limit a cohort sets: what the queue holds, or the part of its quota it never
        # lends when it holds less, + what the cohort has unused; the figures' parenthesis
        # left open for the caller to add to and close.
        label, base = ("what it holds", self.used) if self.used >= self.guaranteed else (
            "the part of its quota it does not lend", self.guaranteed)
        return f"{label} + what cohort {self.cohort} has unused ({_fmt(base)} + {_fmt(self.limit - base)}"

    @property
    def within_nominal(self) -> bool:
        """Blocked by the cohort only, while the queue would stay within its nominal
        quota: reclaim may help."""
        return self.reason == COHORT_EXHAUSTED


def _fmt(x: float) -> str:
    return "unlimited" if math.isinf(x) else f"{x:g}"


class QueueBook:
    """Every queue's configuration and live usage, for one cycle or one read: `admits`
    answers whether a queue may take a demand, `take`/`give` move usage as the cycle
    places or stops work. Copying is cheap (a few queues, a few resources each)."""

    def __init__(self, queues: Mapping[str, Queue], usage: Mapping[str, Mapping[str, float]]) -> None:
        self.queues: dict[str, Queue] = dict(queues)
        if DEFAULT_QUEUE not in self.queues:
            self.queues[DEFAULT_QUEUE] = implicit_default_queue()
        self.usage: dict[str, dict[str, float]] = {q: dict(u) for q, u in usage.items()}
        # Changes with every take/give of a queue (shares computed from the book are cached by it).
        self.versions: dict[str, int] = {}
        self.gpu_metered = {n: any(k.startswith(GPU_PREFIX) for k in q.quota) for n, q in self.queues.items()}
        self.cohorts: dict[str, list[str]] = {}
        for name in sorted(self.queues):
            c = self.queues[name].cohort
            if c is not None:
                self.cohorts.setdefault(c, []).append(name)
        # Per cohort and resource: the pool (lendable nominal) and what of it is drawn.
        self.pool: dict[tuple[str, str], float] = {}
        self.drawn: dict[tuple[str, str], float] = {}
        for cohort, members in self.cohorts.items():
            resources = {r for m in members for r in self.queues[m].quota} | {
                r for m in members for r in self.usage.get(m, {})}
            for r in resources:
                self._recount(cohort, r)

    def copy(self) -> QueueBook:
        other = QueueBook.__new__(QueueBook)
        other.queues = self.queues
        other.usage = {q: dict(u) for q, u in self.usage.items()}
        other.versions = {}
        other.cohorts = self.cohorts
        other.gpu_metered = self.gpu_metered
        other.pool = dict(self.pool)
        other.drawn = dict(self.drawn)
        return other

    def queue(self, name: str) -> Queue | None:
        return self.queues.get(name)

    def meters(self, name: str, resource: str) -> bool:
        """`meters(queue, resource)`, from figures kept per queue."""
        if resource.startswith(GPU_PREFIX):
            return self.gpu_metered.get(name, False)
        q = self.queues.get(name)
        return q is not None and resource in q.quota

    def used(self, name: str, resource: str) -> float:
        return self.usage.get(name, {}).get(resource, 0.0)

    def _recount(self, cohort: str, r: str) -> None:
        pool = drawn = 0.0
        for m in self.cohorts[cohort]:
            q = self.queues[m]
            if not meters(q, r):
                continue
            g = guaranteed(q, r)
            pool += nominal(q, r) - g
            drawn += max(0.0, self.used(m, r) - g)
        self.pool[(cohort, r)] = pool
        self.drawn[(cohort, r)] = drawn

    def _drawn_by(self, name: str, r: str, used: float) -> float:
        return max(0.0, used - guaranteed(self.queues[name], r))

    def admits(self, name: str, demand: Mapping[str, float]) -> Refusal | None:
        """None when queue `name` may take `demand` on top of what it holds, else the
        first refusal (resources in name order)."""
        q = self.queues.get(name)
        if q is None:
            return Refusal(UNKNOWN_QUEUE, "", 0.0, 0.0, 0.0)
        for r in sorted(demand):
            want = demand[r]
            if want <= 0 or not self.meters(name, r):
                continue
            used = self.used(name, r)
            new = used + want
            n = nominal(q, r)
            if q.cohort is None:
                if new > n + EPS:
                    return Refusal(OVER_QUOTA, r, used, want, n, hard=True, nominal=n)
                continue
            limit = n + borrowing_limit(q, r)
            if new > limit + EPS:
                return Refusal(OVER_QUOTA, r, used, want, limit, hard=True, nominal=n, cohort=q.cohort)
            key = (q.cohort, r)
            if key not in self.pool:
                self._recount(q.cohort, r)
            more = self._drawn_by(name, r, new) - self._drawn_by(name, r, used)
            drawn = self.drawn[key] + more
            # Only what it would draw from the pool is refused there: a pool others overdraw
            # (a quota lowered under them) does not refuse the part of its quota it does not lend.
            if more > EPS and drawn > self.pool[key] + EPS:
                # The most it may hold now, shown as its limit: what it holds (or the part
                # of its quota it does not lend, when it holds less) + what the pool has unused.
                g = guaranteed(q, r)
                avail = max(used, g) + max(0.0, self.pool[key] - self.drawn[key])
                return Refusal(COHORT_EXHAUSTED if new <= n + EPS else OVER_QUOTA, r, used, want, avail,
                               nominal=n, cohort=q.cohort, guaranteed=g)
        return None

    def take(self, name: str, d: Mapping[str, float], sign: float = 1.0) -> None:
        """Queue `name` now holds `d` more (`sign` -1: less)."""
        q = self.queues.get(name)
        self.versions[name] = self.versions.get(name, 0) + 1
        before = dict(self.usage.get(name, {}))
        add(self.usage.setdefault(name, {}), d, sign)
        if q is None or q.cohort is None:
            return
        for r in d:
            key = (q.cohort, r)
            if key not in self.pool:
                self._recount(q.cohort, r)
                continue
            if meters(q, r):
                self.drawn[key] += self._drawn_by(name, r, self.used(name, r)) - self._drawn_by(
                    name, r, before.get(r, 0.0))

    def give(self, name: str, d: Mapping[str, float]) -> None:
        self.take(name, d, -1.0)

    def borrowed(self, name: str) -> Resources:
        """What the queue holds above its nominal quota, per metered resource (an
        unmetered queue: all it holds)."""
        q = self.queues.get(name)
        out: Resources = {}
        for r, v in self.usage.get(name, {}).items():
            if q is None or unmetered(q):
                over = v
            elif meters(q, r):
                over = v - nominal(q, r)
            else:
                continue
            if over > EPS:
                out[r] = over
        return out

    def lent(self, name: str) -> Resources:
        """The part of the queue's lendable nominal quota others use now: what the cohort's
        queues borrow (hold above their nominal quota), divided between the lenders in
        proportion to their unused lendable quota (so that the cohort's lent figures add up
        to what it borrows), at most the queue's own unused part."""
        q = self.queues.get(name)
        out: Resources = {}
        if q is None or q.cohort is None:
            return out
        members = [self.queues[m] for m in self.cohorts.get(q.cohort, ())]
        for r in q.quota:
            unused = self._unused_lendable(q, r)
            if unused <= EPS:
                continue
            total = sum(self._unused_lendable(m, r) for m in members)
            borrowed = sum(max(0.0, self.used(m.name, r) - nominal(m, r)) for m in members if meters(m, r))
            part = min(unused, borrowed * unused / total) if total > EPS else 0.0
            if part > EPS:
                out[r] = part
        return out

    def _unused_lendable(self, q: Queue, r: str) -> float:
        """What of the queue's lendable nominal quota of `r` it does not use itself."""
        if not meters(q, r):
            return 0.0
        g = guaranteed(q, r)
        return max(0.0, nominal(q, r) - g - max(0.0, self.used(q.name, r) - g))

    def over_nominal(self, name: str, resources: Iterable[str]) -> bool:
        """Whether the queue holds more than its nominal quota of any of `resources`
        (always for an unmetered queue): only then may reclaim or fair share take from it."""
        q = self.queues.get(name)
        if q is None or unmetered(q):
            return True
        return any(self.meters(name, r) and self.used(name, r) > nominal(q, r) + EPS for r in resources)

    def would_borrow(self, name: str, demand: Mapping[str, float]) -> bool:
        """Whether taking `demand` puts the queue above its nominal quota on a resource it
        meters (an unmetered queue always borrows)."""
        q = self.queues.get(name)
        if q is None or unmetered(q):
            return True
        return any(v > 0 and self.meters(name, r) and self.used(name, r) + v > nominal(q, r) + EPS
                   for r, v in demand.items())

    def within_nominal(self, name: str, demand: Mapping[str, float]) -> bool:
        """Whether the queue, taking `demand`, stays within its nominal quota on every
        resource it meters (and meters at least one of them): reclaim applies."""
        q = self.queues.get(name)
        if q is None or unmetered(q):
            return False
        metered = [r for r in demand if demand[r] > 0 and self.meters(name, r)]
        return bool(metered) and all(self.used(name, r) + demand[r] <= nominal(q, r) + EPS for r in metered)


def queue_usage(jobs: Iterable[Job]) -> dict[str, dict[str, float]]:
    """Live usage per queue from job records (a full recount; the cluster view keeps the
    same figures as records arrive)."""
    out: dict[str, dict[str, float]] = {}
    for j in jobs:
        u = job_usage(j)
        if u:
            add(out.setdefault(j.spec.queue, {}), u)
    return out


def label_conflict(spec: JobSpec, q: Queue | None) -> str:
    """Why a job of `spec` cannot run in queue `q` for its host labels ("" when it can): a
    label of its own that asks for another value than the queue's."""
    if q is None or not q.host_labels:
        return ""
    for k, v in q.host_labels.items():
        if spec.host_labels.get(k, v) != v:
            return f"queue {q.name!r} runs on hosts with {k}={v}; the job asks for {k}={spec.host_labels[k]}"
    return ""


def queue_named(queues: Mapping[str, Queue], name: str) -> Queue | None:
    """Queue `name` as the planner's book has it: its record in `queues`, or the implicit
    default queue."""
    return queues.get(name) or (implicit_default_queue() if name == DEFAULT_QUEUE else None)


def queue_refusal(spec: JobSpec, q: Queue | None) -> ValidationError | None:
    """The refusal of a submission to queue `q` (None: there is no such queue), or None:
    over the queue's maximum time limit, or host labels that conflict with the queue's.
    The API and NATS submissions refuse alike (found by exploring: a job over the maximum
    was refused by the API and taken over NATS, its limit cut without a word)."""
    if q is None:
        return ValidationError("queue", f"no queue named {spec.queue!r}", "UNKNOWN_QUEUE")
    if q.max_time_limit_s and spec.time_limit_s > q.max_time_limit_s:
        return ValidationError("timeLimitSeconds",
                               f"queue {q.name!r} allows at most {duration_text(q.max_time_limit_s)}", "OUT_OF_RANGE")
    why = label_conflict(spec, q)
    return ValidationError("hostLabels", why, "INVALID") if why else None


# id(spec) -> (a weak reference to the spec, the queue's labels, the spec with them):
# placement_spec's copies, so that a queued job is not copied again each cycle while its
# queue's labels stay. An entry goes with its spec (found by exploring: the specs of jobs
# long ended were kept, up to 200,000 of them, about 1.5 GB at 500 jobs/s).
_LABELLED: dict[int, tuple[weakref.ref[JobSpec], tuple[tuple[str, str], ...], JobSpec]] = {}
_LABELLED_MAX = 200_000


def placement_spec(spec: JobSpec, q: Queue | None) -> JobSpec | None:
    """The spec a job of queue `q` is placed with: its own host labels and the queue's as
    the queue has them now, so that a queue moved to other hosts takes its waiting jobs
    along (as Kueue applies a resource flavor's node labels at admission, not at
    submission); None when they conflict (`label_conflict`: it waits until either
    changes). Jobs already placed keep their hosts."""
    if q is None or not q.host_labels:
        return spec
    own = spec.host_labels
    if all(own.get(k) == v for k, v in q.host_labels.items()):
        return spec
    if label_conflict(spec, q):
        return None
    key = tuple(sorted(q.host_labels.items()))
    hit = _LABELLED.get(id(spec))
    if hit is not None and hit[0]() is spec and hit[1] == key:
        return hit[2]
    labelled = spec.model_copy(update={"host_labels": {**own, **q.host_labels}})
    if len(_LABELLED) >= _LABELLED_MAX:
        _LABELLED.clear()  # (a bound on the live ones too: copied again when asked)
    ident = id(spec)
    _LABELLED[ident] = (weakref.ref(spec, lambda _gone: _LABELLED.pop(ident, None)), key, labelled)
    return labelled


def effective_time_limit(spec: JobSpec, q: Queue | None) -> float:
    """The time limit a job runs under: its own, else its queue's default, capped by the
    queue's maximum (0: none), unless an admin set it past that maximum or removed it
    (`time_limit_exempt`: its own, 0 for none)."""
    if spec.time_limit_exempt:
        return spec.time_limit_s
    limit = spec.time_limit_s or (q.default_time_limit_s if q is not None else 0.0)
    if q is not None and q.max_time_limit_s > 0:
        limit = min(limit, q.max_time_limit_s) if limit > 0 else q.max_time_limit_s
    return limit
