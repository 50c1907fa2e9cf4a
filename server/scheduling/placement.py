"""Placement: which host, and which of its GPUs, a task goes to. Pure code, no I/O.

`place()` filters every host through named feasibility checks, ranks the feasible
ones (bin-packing: the tightest fit wins, so large jobs still find empty hosts) and
returns either a choice or the counted reasons each host was rejected; the counts
answer "why is my job pending?".
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import EllipsisType

from wire.budgets import ALLOC_RECORD_OVERHEAD, RECORD_BUDGET, task_bytes
from wire.messages import JobSpec, Task

# Rejection reasons, in the order they are checked (the first failing one counts).
NOT_HEALTHY = "host not healthy"
CORDONED = "host cordoned"
WRONG_MODEL = "wrong GPU model"
TOO_FEW_GPUS = "not enough GPUs on host"
NO_FREE_GPUS = "not enough free GPUs"
NO_FREE_SHARE = "no GPU with enough free share"
TOO_LITTLE_GPU_MEMORY = "no GPU with that much memory on host"
NO_FREE_GPU_MEMORY = "no GPU with enough free GPU memory"
NO_MIG = "no MIG instance of that profile"
NO_FREE_MIG = "no free MIG instance of that profile"
TOO_FEW_CPUS = "not enough CPUs on host"
NO_FREE_CPU = "not enough free CPU"
TOO_LITTLE_MEMORY = "not enough memory on host"
NO_FREE_MEMORY = "not enough free memory"
TOO_MANY_TASKS = "host runs its maximum number of tasks"
RECORD_FULL = "host's assignment record is full"
NO_LABELS = "host lacks a required label"
EXCLUDED = "host excluded by the job"
UNDER_PRESSURE = "host asks for no new work"  # its disk nearly full, ... (Heartbeat.pressure)
REASONS = (NOT_HEALTHY, CORDONED, UNDER_PRESSURE, EXCLUDED, NO_LABELS, WRONG_MODEL, TOO_FEW_GPUS, NO_FREE_GPUS,
           NO_FREE_SHARE, TOO_LITTLE_GPU_MEMORY, NO_FREE_GPU_MEMORY, NO_MIG, NO_FREE_MIG, TOO_FEW_CPUS, NO_FREE_CPU,
           TOO_LITTLE_MEMORY, NO_FREE_MEMORY, TOO_MANY_TASKS, RECORD_FULL)
# The reasons a host gives however little it runs: it could not take the job even idle.
NEVER = frozenset({EXCLUDED, NO_LABELS, WRONG_MODEL, TOO_FEW_GPUS, TOO_LITTLE_GPU_MEMORY, NO_MIG, TOO_FEW_CPUS,
                   TOO_LITTLE_MEMORY})
# One host's assignment record lists every task it runs; this keeps it well under NATS's
# 1 MB message limit (and no GPU host runs more at once in practice).
MAX_TASKS_PER_HOST = 256
FULL = 1000  # thousandths of a GPU


@dataclass
class HostCapacity:
    """What the placement needs to know about one host: a mutable working copy, so a
    scheduling cycle can reserve capacity as it places one job after another.

    A GPU is held whole (`used_gpus`), or shared by tasks that each hold thousandths of
    it and some of its memory (`share_used`, `share_memory_used`), or it is in MIG mode
    (`mig_gpus`) and only its instances (`mig`: uuid -> (GPU, profile, memory)) are
    scheduled, each whole (`used_mig`). Shares are integers: no drift. A GPU held one way
    is given out no other way, also while a host's MIG layout has changed under tasks
    that hold it: a GPU held whole or shared gives no MIG instance, and a GPU whose MIG
    instance is held is not given whole or shared (every GPU, when the host no longer
    reports a held instance: which GPU it was on is not known)."""

    id: str
    schedulable: bool  # the heartbeat key is live (health is checked by the caller)
    cordoned: bool
    gpu_models: dict[int, str]  # GPU index -> model
    unhealthy_gpus: frozenset[int]
    cpus: float
    memory_mb: int
    used_gpus: set[int] = field(default_factory=set)
    used_cpus: float = 0.0
    used_memory_mb: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    tasks: int = 0
    # Bytes its tasks take in the host's allocation record (wire.budgets).
    record_bytes: int = 0
    gpu_memory: dict[int, int] = field(default_factory=dict)  # GPU index -> MB
    # Its agent asks for no new work (Heartbeat.pressure: its disk nearly full, ...).
    pressure: bool = False
    share_used: dict[int, int] = field(default_factory=dict)  # GPU index -> thousandths held by shares
    share_memory_used: dict[int, int] = field(default_factory=dict)  # GPU index -> MB held by shares
    mig: dict[str, tuple[int, str, int]] = field(default_factory=dict)
    mig_gpus: frozenset[int] = frozenset()
    used_mig: set[str] = field(default_factory=set)
    # Counts changes (reserve(), release(), and each time capacity.Placer.cap() hands the
    # copy out to be changed): what a cycle has memoised about it holds while it is
    # unchanged (the Placer's scores).
    version: int = 0
    # Whether its GPUs are of more than one model (from `gpu_models`, which never changes:
    # worked out once, on first use).
    _mixed: bool | None = field(default=None, repr=False, compare=False)  # (carried by copy())

    def mixed_models(self) -> bool:
        if self._mixed is None:
            models = iter(self.gpu_models.values())
            first = next(models, None)
            self._mixed = any(m != first for m in models)
        return self._mixed

    def _usable(self, i: int, models: frozenset[str] | str | None) -> bool:
        if i in self.unhealthy_gpus or i in self.mig_gpus:
            return False
        if models is None:
            return True
        m = self.gpu_models[i]
        return m == models if isinstance(models, str) else m in models

    def mig_held_gpus(self) -> frozenset[int] | set[int]:
        """The GPUs held through MIG instances (every GPU when a held instance is one the
        host no longer reports)."""
        if not self.used_mig:
            return frozenset()
        held = set()
        for u in self.used_mig:
            where = self.mig.get(u)
            if where is None:
                return set(self.gpu_models)
            held.add(where[0])
        return held

    def free_gpus(self, models: frozenset[str] | str | None) -> list[int]:
        """GPUs free to be held whole: healthy, not in MIG mode, not held, not shared."""
        free = sorted(i for i in self.gpu_models
                      if i not in self.used_gpus and not self.share_used.get(i) and self._usable(i, models))
        if self.used_mig:
            busy = self.mig_held_gpus()
            free = [i for i in free if i not in busy]
        return free

    def share_options(self, share: int, memory_mb: int, models: frozenset[str] | str | None) -> list[int]:
        """GPUs a share of `share` thousandths with `memory_mb` of GPU memory fits on."""
        fits = [i for i in sorted(self.gpu_models)
                if i not in self.used_gpus and self._usable(i, models)
                and self.share_used.get(i, 0) + share <= FULL
                and self.share_memory_used.get(i, 0) + memory_mb <= self.gpu_memory.get(i, 0)]
        if self.used_mig:
            busy = self.mig_held_gpus()
            fits = [i for i in fits if i not in busy]
        return fits

    def free_share(self, i: int) -> int:
        """Thousandths of GPU `i` still free (0 when it is held whole or through a MIG
        instance, faulty or in MIG mode)."""
        if i in self.used_gpus or not self._usable(i, None) or (self.used_mig and i in self.mig_held_gpus()):
            return 0
        return FULL - self.share_used.get(i, 0)

    def mig_free(self, u: str, g: int) -> bool:
        """Whether MIG instance `u` (on GPU `g`) may be given: not held, its GPU healthy and
        held no other way (whole or shared, as before a change of its MIG layout)."""
        return (u not in self.used_mig and g not in self.unhealthy_gpus and g not in self.used_gpus
                and not self.share_used.get(g))

    def free_mig(self, profile: str, models: frozenset[str] | None) -> list[str]:
        return sorted(u for u, (g, p, _m) in self.mig.items()
                      if p == profile and self.mig_free(u, g) and (models is None or self.gpu_models.get(g) in models))

    def copy(self) -> HostCapacity:
        """A working copy: what placement changes (the used amounts) is its own; the
        host's description (models, labels, MIG instances) is shared and never changed."""
        return dataclasses.replace(self, used_gpus=set(self.used_gpus), share_used=dict(self.share_used),
                                   share_memory_used=dict(self.share_memory_used), used_mig=set(self.used_mig))

    def reserve(self, gpus: list[int], cpus: float, memory_mb: int, record_bytes: int = 0, share: int = 0,
                gpu_memory_mb: int = 0, mig: Iterable[str] = ()) -> None:
        if share:
            for i in gpus:
                self.share_used[i] = self.share_used.get(i, 0) + share
                self.share_memory_used[i] = self.share_memory_used.get(i, 0) + gpu_memory_mb
        else:
            self.used_gpus.update(gpus)
        self.used_mig.update(mig)
        self.used_cpus += cpus
        self.used_memory_mb += memory_mb
        self.tasks += 1
        self.record_bytes += record_bytes
        self.version += 1

    def release(self, gpus: list[int], cpus: float, memory_mb: int, record_bytes: int = 0, share: int = 0,
                gpu_memory_mb: int = 0, mig: Iterable[str] = ()) -> None:
        if share:
            for i in gpus:
                self.share_used[i] = max(0, self.share_used.get(i, 0) - share)
                self.share_memory_used[i] = max(0, self.share_memory_used.get(i, 0) - gpu_memory_mb)
                if not self.share_used[i]:
                    del self.share_used[i]
                    self.share_memory_used.pop(i, None)
        else:
            self.used_gpus.difference_update(gpus)
        self.used_mig.difference_update(mig)
        self.used_cpus = max(0.0, self.used_cpus - cpus)
        self.used_memory_mb = max(0, self.used_memory_mb - memory_mb)
        self.tasks = max(0, self.tasks - 1)
        self.record_bytes = max(0, self.record_bytes - record_bytes)
        self.version += 1

    def hold(self, task: Task) -> None:
        """Reserve what an assigned task holds (its allocation record's entry)."""
        self.reserve(task.gpu_indices, task.cpus, task.memory_mb, 0, task.gpu_share, task.gpu_memory_mb, task.mig)

    def let_go(self, task: Task) -> None:
        """Release what an assigned task holds, its bytes in the allocation record included
        (what the host would have were the task stopped)."""
        self.release(task.gpu_indices, task.cpus, task.memory_mb, len(task.compact_json()) + 1, task.gpu_share,
                     task.gpu_memory_mb, task.mig)


@dataclass(frozen=True)
class Choice:
    host_id: str
    gpu_indices: list[int]
    mig: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rejection:
    reasons: Counter[str]
    hosts_considered: int


EPS = 1e-9


def check(spec: JobSpec, host: HostCapacity, models: frozenset[str] | None | EllipsisType = ...,
          ) -> tuple[str | None, list[int], tuple[str, ...]]:
    """Feasibility of one host: (None, GPU indices, MIG instances) when it fits, else
    (reason, [], ()). `models` narrows the job's accepted GPU models (a gang whose tasks
    must share one model); by default the job's own. Whole GPUs: of one model (a task
    never spans models: its quota and its accounting count one), the lowest free indices
    when they are of one model, else those of the accepted model with the fewest free
    that are enough (best fit); a share: the
    fitting GPU with the least free share left (best fit); MIG: the first free instance
    of the profile."""
    if not host.schedulable:
        return NOT_HEALTHY, [], ()
    if host.cordoned:
        return CORDONED, [], ()
    if host.pressure:
        return UNDER_PRESSURE, [], ()
    if spec.exclude_hosts and host.id in spec.exclude_hosts:
        return EXCLUDED, [], ()
    if spec.host_labels and not labels_match(spec, host):
        return NO_LABELS, [], ()
    accept = spec.models() if models is ... else models
    gpus: list[int] = []
    mig: tuple[str, ...] = ()
    if spec.gpus > 0 or spec.gpu_share > 0:
        if accept is not None and not any(m in accept for m in host.gpu_models.values()):
            return WRONG_MODEL, [], ()
        # GPUs in MIG mode are scheduled only through their instances.
        matching = [i for i, m in host.gpu_models.items()
                    if (accept is None or m in accept) and i not in host.mig_gpus]
        mixed = spec.gpus > 1 and host.mixed_models()
        if len(matching) < max(1, spec.gpus) or (mixed and _most_of_one_model(host, matching) < spec.gpus):
            return TOO_FEW_GPUS, [], ()
        if spec.gpus > 0:
            free = host.free_gpus(accept)
            if len(free) < spec.gpus:
                return NO_FREE_GPUS, [], ()
            gpus = _of_one_model(host, free, spec.gpus) if mixed else free[: spec.gpus]
            if not gpus:
                return NO_FREE_GPUS, [], ()
        else:
            fits = host.share_options(spec.gpu_share, 0, accept)
            if not fits:
                return NO_FREE_SHARE, [], ()
            if spec.gpu_memory_mb:
                fits = host.share_options(spec.gpu_share, spec.gpu_memory_mb, accept)
                if not fits:
                    big = any(host.gpu_memory.get(i, 0) >= spec.gpu_memory_mb for i in matching)
                    return NO_FREE_GPU_MEMORY if big else TOO_LITTLE_GPU_MEMORY, [], ()
            gpus = [min(fits, key=lambda i: (FULL - host.share_used.get(i, 0), i))]  # (fits: share_options')
    elif spec.mig_profile is not None:
        if accept is not None and not any(m in accept for m in host.gpu_models.values()):
            return WRONG_MODEL, [], ()
        offered = [u for u, (g, p, _m) in host.mig.items()
                   if p == spec.mig_profile and (accept is None or host.gpu_models.get(g) in accept)]
        if not offered:
            return NO_MIG, [], ()
        instances = host.free_mig(spec.mig_profile, accept)
        if not instances:
            return NO_FREE_MIG, [], ()
        mig = (instances[0],)
    if host.used_cpus + spec.cpus > host.cpus + EPS:
        return NO_FREE_CPU if spec.cpus <= host.cpus + EPS else TOO_FEW_CPUS, [], ()
    if host.used_memory_mb + spec.memory_mb > host.memory_mb:
        return NO_FREE_MEMORY if spec.memory_mb <= host.memory_mb else TOO_LITTLE_MEMORY, [], ()
    if host.tasks >= MAX_TASKS_PER_HOST:
        return TOO_MANY_TASKS, [], ()
    if host.record_bytes + task_bytes(spec) + ALLOC_RECORD_OVERHEAD > RECORD_BUDGET:
        return RECORD_FULL, [], ()
    return None, gpus, mig


def _most_of_one_model(host: HostCapacity, gpus: list[int]) -> int:
    """The most of `gpus` that are of one model."""
    return max(Counter(host.gpu_models[i] for i in gpus).values())


def _of_one_model(host: HostCapacity, free: list[int], n: int) -> list[int]:
    """`n` of the `free` GPUs (sorted), all of one model: the lowest ones when they are;
    else of the model with the fewest free that are enough (its lowest indices first
    among equals); [] when no model has `n` free."""
    models = host.gpu_models
    first = models[free[0]]
    if all(models[i] == first for i in free[:n]):
        return free[:n]
    by_model: dict[str, list[int]] = {}
    for i in free:
        by_model.setdefault(models[i], []).append(i)
    fits = [g for g in by_model.values() if len(g) >= n]
    if not fits:
        return []
    return min(fits, key=lambda g: (len(g), g[0]))[:n]


def idle_room(spec: JobSpec, host: HostCapacity, most: int = 1,
              models: frozenset[str] | None | EllipsisType = ...) -> tuple[int, str | None]:
    """How many tasks of `spec` (up to `most`; of `models` when given, as `check` takes
    them) `host` could take running nothing else, with every GPU healthy, uncordoned and
    live, as a gang's tasks are placed (one after another, on one host while it has
    room); with none, why not (a reason in NEVER)."""
    idle = HostCapacity(host.id, True, False, host.gpu_models, frozenset(), host.cpus, host.memory_mb,
                        labels=host.labels, gpu_memory=host.gpu_memory, mig=host.mig, mig_gpus=host.mig_gpus)
    n = 0
    while n < most:
        reason, gpus, mig = check(spec, idle, models)
        if reason is not None:
            return n, reason if n == 0 else None
        idle.reserve(gpus, spec.cpus, spec.memory_mb, task_bytes(spec), spec.gpu_share, spec.gpu_memory_mb, mig)
        n += 1
    return n, None


def labels_match(spec: JobSpec, host: HostCapacity) -> bool:
    """Whether the host has every label the job requires (`JobSpec.host_labels`)."""
    return all(host.labels.get(k) == v for k, v in spec.host_labels.items())


def allowed_host(spec: JobSpec, host: HostCapacity) -> bool:
    """Whether the job may run on the host at all, by what it names: the host is not one
    it excludes (`JobSpec.exclude_hosts`) and has every label it requires."""
    return (not spec.exclude_hosts or host.id not in spec.exclude_hosts) \
        and (not spec.host_labels or labels_match(spec, host))


def _score(spec: JobSpec, host: HostCapacity) -> tuple[float, ...]:
    """Lower is better: bin-packing prefers the host left with the least free room."""
    free_gpus_after = len(host.free_gpus(None)) - spec.gpus
    free_cpu_after = host.cpus - host.used_cpus - spec.cpus
    free_mem_after = host.memory_mb - host.used_memory_mb - spec.memory_mb
    return (free_gpus_after, free_cpu_after, free_mem_after)


def place(spec: JobSpec, hosts: Iterable[HostCapacity]) -> Choice | Rejection:
    """Choose a host for one task of `spec`, or say why none fits (bin-packing over every
    host given; the scheduler's Placer uses the capacity index instead)."""
    best: tuple[tuple[float, ...], str, list[int], tuple[str, ...]] | None = None
    reasons: Counter[str] = Counter()
    n = 0
    for host in hosts:
        n += 1
        reason, gpus, mig = check(spec, host)
        if reason is not None:
            reasons[reason] += 1
            continue
        key = (_score(spec, host), host.id, gpus, mig)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        return Rejection(reasons, n)
    return Choice(best[1], best[2], best[3])


def explain(spec: JobSpec, hosts: Iterable[HostCapacity]) -> Counter[str]:
    """Counted reasons every host rejects `spec` right now (empty when one fits)."""
    reasons: Counter[str] = Counter()
    for host in hosts:
        reason = check(spec, host)[0]
        if reason is not None:
            reasons[reason] += 1
    return reasons
