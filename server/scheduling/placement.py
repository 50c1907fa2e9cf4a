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

from wire.budgets import ALLOC_RECORD_OVERHEAD, RECORD_BUDGET, task_bytes
from wire.messages import JobSpec

# Rejection reasons, in the order they are checked (the first failing one counts).
NOT_HEALTHY = "host not healthy"
CORDONED = "host cordoned"
WRONG_MODEL = "wrong GPU model"
TOO_FEW_GPUS = "not enough GPUs on host"
NO_FREE_GPUS = "not enough free GPUs"
NO_FREE_CPU = "not enough free CPU"
NO_FREE_MEMORY = "not enough free memory"
TOO_MANY_TASKS = "host runs its maximum number of tasks"
RECORD_FULL = "host's assignment record is full"
REASONS = (NOT_HEALTHY, CORDONED, WRONG_MODEL, TOO_FEW_GPUS, NO_FREE_GPUS, NO_FREE_CPU, NO_FREE_MEMORY,
           TOO_MANY_TASKS, RECORD_FULL)
# One host's assignment record lists every task it runs; this keeps it well under NATS's
# 1 MB message limit (and no GPU host runs more at once in practice).
MAX_TASKS_PER_HOST = 256


@dataclass
class HostCapacity:
    """What the placement needs to know about one host: a mutable working copy, so a
    scheduling cycle can reserve capacity as it places one job after another."""

    id: str
    schedulable: bool  # healthy (heartbeating)
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

    def free_gpus(self, model: str | None) -> list[int]:
        return sorted(
            i
            for i, m in self.gpu_models.items()
            if i not in self.used_gpus
            and i not in self.unhealthy_gpus
            and (model is None or m == model)
        )

    def copy(self) -> HostCapacity:
        """A working copy: what placement changes (the used amounts) is its own; the
        host's description (models, labels) is shared and never changed."""
        return dataclasses.replace(self, used_gpus=set(self.used_gpus))

    def reserve(self, gpus: list[int], cpus: float, memory_mb: int, record_bytes: int = 0) -> None:
        self.used_gpus.update(gpus)
        self.used_cpus += cpus
        self.used_memory_mb += memory_mb
        self.tasks += 1
        self.record_bytes += record_bytes

    def release(self, gpus: list[int], cpus: float, memory_mb: int, record_bytes: int = 0) -> None:
        self.used_gpus.difference_update(gpus)
        self.used_cpus = max(0.0, self.used_cpus - cpus)
        self.used_memory_mb = max(0, self.used_memory_mb - memory_mb)
        self.tasks = max(0, self.tasks - 1)
        self.record_bytes = max(0, self.record_bytes - record_bytes)


@dataclass(frozen=True)
class Choice:
    host_id: str
    gpu_indices: list[int]


@dataclass(frozen=True)
class Rejection:
    reasons: Counter[str]
    hosts_considered: int


EPS = 1e-9


def check(spec: JobSpec, host: HostCapacity) -> tuple[str | None, list[int]]:
    """Feasibility of one host: (None, gpu indices) when it fits, else (reason, [])."""
    if not host.schedulable:
        return NOT_HEALTHY, []
    if host.cordoned:
        return CORDONED, []
    gpus: list[int] = []
    if spec.gpus > 0:
        if spec.gpu_model is not None and spec.gpu_model not in host.gpu_models.values():
            return WRONG_MODEL, []
        matching = [i for i, m in host.gpu_models.items() if spec.gpu_model in (None, m)]
        if len(matching) < spec.gpus:
            return (WRONG_MODEL if not matching and spec.gpu_model else TOO_FEW_GPUS), []
        free = host.free_gpus(spec.gpu_model)
        if len(free) < spec.gpus:
            return NO_FREE_GPUS, []
        gpus = free[: spec.gpus]
    if host.used_cpus + spec.cpus > host.cpus + EPS:
        return NO_FREE_CPU, []
    if host.used_memory_mb + spec.memory_mb > host.memory_mb:
        return NO_FREE_MEMORY, []
    if host.tasks >= MAX_TASKS_PER_HOST:
        return TOO_MANY_TASKS, []
    if host.record_bytes + task_bytes(spec) + ALLOC_RECORD_OVERHEAD > RECORD_BUDGET:
        return RECORD_FULL, []
    return None, gpus


def _score(spec: JobSpec, host: HostCapacity) -> tuple[float, ...]:
    """Lower is better: bin-packing prefers the host left with the least free room."""
    free_gpus_after = len(host.free_gpus(None)) - spec.gpus
    free_cpu_after = host.cpus - host.used_cpus - spec.cpus
    free_mem_after = host.memory_mb - host.used_memory_mb - spec.memory_mb
    return (free_gpus_after, free_cpu_after, free_mem_after)


def place(spec: JobSpec, hosts: Iterable[HostCapacity]) -> Choice | Rejection:
    """Choose a host for one task of `spec`, or say why none fits."""
    best: tuple[tuple[float, ...], str, list[int]] | None = None
    reasons: Counter[str] = Counter()
    n = 0
    for host in hosts:
        n += 1
        reason, gpus = check(spec, host)
        if reason is not None:
            reasons[reason] += 1
            continue
        key = (_score(spec, host), host.id, gpus)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        return Rejection(reasons, n)
    return Choice(best[1], best[2])


def explain(spec: JobSpec, hosts: Iterable[HostCapacity]) -> Counter[str]:
    """Counted reasons every host rejects `spec` right now (empty when one fits)."""
    reasons: Counter[str] = Counter()
    for host in hosts:
        reason, _ = check(spec, host)
        if reason is not None:
            reasons[reason] += 1
    return reasons
