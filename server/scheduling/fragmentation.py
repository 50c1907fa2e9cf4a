"""GPU fragmentation as the tasks a cluster sees would find it (FGD: Weng et al., "Beware
of Fragmentation", USENIX ATC '23), for fragmentation-aware placement.

A host's fragmentation for one task shape is the free GPU capacity (in thousandths of a
GPU) that shape could not use there:

- all of it, when the shape does not fit on the host at all (too little CPU or memory,
  none of its GPU models, not enough free GPUs, no MIG instance of its profile);
- otherwise, the free part of each GPU too small for the shape: for a share, GPUs with
  less free than the share; for whole GPUs, GPUs partly taken by shares; nothing for a
  task without GPUs.

Its expected fragmentation is that amount weighted by how often each shape arrives
(`ShapeMix`, from the recent submissions). Placing a task where the expected
fragmentation grows least keeps the cluster's free GPU capacity usable by what comes
next. Values are memoised by the host's free state (identical hosts share one entry).
Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from server.scheduling.placement import EPS, FULL, HostCapacity
from wire.messages import JobSpec

# The mix keeps the most frequent shapes covering this share of the arrivals, at most
# MIX_MAX of them (FGD's "typical pods").
MIX_COVERAGE = 0.95
MIX_MAX = 24


@dataclass(frozen=True)
class Shape:
    """What placement needs of a task: its GPU demand, CPU and memory."""

    gpus: int
    share: int
    gpu_memory_mb: int
    cpus: float
    memory_mb: int
    models: frozenset[str] | None
    mig: str | None

    @staticmethod
    def of(spec: JobSpec) -> Shape:
        return Shape(spec.gpus, spec.gpu_share, spec.gpu_memory_mb, spec.cpus, spec.memory_mb, spec.models(),
                     spec.mig_profile)


@dataclass(frozen=True)
class ShapeMix:
    """Typical shapes with their probabilities (summing to 1)."""

    shapes: tuple[tuple[Shape, float], ...]

    @staticmethod
    def of(counts: Counter[Shape] | Iterable[tuple[Shape, float]]) -> ShapeMix:
        items = sorted(dict(counts).items(), key=lambda kv: (-kv[1], repr(kv[0])))
        total = sum(w for _, w in items)
        if total <= 0:
            return ShapeMix(())
        kept: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, w in items:
            if covered >= MIX_COVERAGE * total or len(kept) >= MIX_MAX:
                break
            kept.append((shape, w))
            covered += w
        return ShapeMix(tuple((s, w / covered) for s, w in kept))


EMPTY = ShapeMix(())


def _fits(host: HostCapacity, s: Shape) -> bool:
    if host.used_cpus + s.cpus > host.cpus + EPS or host.used_memory_mb + s.memory_mb > host.memory_mb:
        return False
    if s.gpus > 0:
        return len(host.free_gpus(s.models)) >= s.gpus
    if s.share > 0:
        return bool(host.share_options(s.share, s.gpu_memory_mb, s.models))
    if s.mig is not None:
        return bool(host.free_mig(s.mig, s.models))
    return True


def frag_for(host: HostCapacity, s: Shape) -> int:
    """Free GPU thousandths on `host` that shape `s` could not use."""
    free = {i: host.free_share(i) for i in host.gpu_models}
    total = sum(free.values())
    if total == 0:
        return 0
    if not _fits(host, s):
        return total
    if s.share > 0:
        return sum(f for i, f in free.items()
                   if f < s.share or (s.models is not None and host.gpu_models[i] not in s.models))
    if s.gpus > 0:
        return sum(f for i, f in free.items()
                   if f < FULL or (s.models is not None and host.gpu_models[i] not in s.models))
    return 0


class Fragmentation:
    """Expected fragmentation of hosts under a mix, memoised by each host's free state."""

    def __init__(self, mix: ShapeMix) -> None:
        self.mix = mix
        self._memo: dict[tuple[object, ...], float] = {}

    def of(self, host: HostCapacity) -> float:
        if not self.mix.shapes:
            return 0.0
        key = (tuple(sorted((host.gpu_models[i], host.free_share(i),
                             host.gpu_memory.get(i, 0) - host.share_memory_used.get(i, 0))
                            for i in host.gpu_models)),
               round(host.cpus - host.used_cpus, 3), host.memory_mb - host.used_memory_mb,
               tuple(sorted(u for u in host.mig if u not in host.used_mig)) if host.mig else ())
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) > 200_000:
                self._memo.clear()
            value = self._memo[key] = sum(p * frag_for(host, s) for s, p in self.mix.shapes)
        return value


class RecentShapes:
    """The shapes of the last `window` tasks submitted, and the fragmentation measure of
    their mix, remade after every `refresh_every` new ones (its memo lives as long)."""

    def __init__(self, window: int = 5000, refresh_every: int = 500) -> None:
        self.window = window
        self.refresh_every = refresh_every
        self._recent: deque[Shape] = deque()
        self._counts: Counter[Shape] = Counter()
        self._since = 0
        self._frag: Fragmentation | None = None

    def saw(self, shape: Shape) -> None:
        self._recent.append(shape)
        self._counts[shape] += 1
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._since += 1

    def fragmentation(self) -> Fragmentation | None:
        """The measure for the current mix (None before any task was seen)."""
        if self._frag is None or self._since >= self.refresh_every:
            self._since = 0
            self._frag = Fragmentation(ShapeMix.of(self._counts)) if self._counts else None
        return self._frag
