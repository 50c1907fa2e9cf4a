"""GPU fragmentation as the tasks a cluster sees would find it (FGD: Weng et al., "Beware
of Fragmentation", USENIX ATC '23), for fragmentation-aware placement.

A host's fragmentation for one task shape is the free GPU capacity (in thousandths of a
GPU) that shape could not use there:

- all of it, when the shape does not fit on the host at all (too little CPU or memory,
  none of its GPU models, not enough free GPUs, no MIG instance of its profile), and for
  a shape without GPUs (it uses none of it);
- otherwise, the free part of each GPU too small for the shape: for a share, GPUs with
  less free than the share; for whole GPUs, GPUs partly taken by shares.

Its expected fragmentation is that amount weighted by how often each shape arrives
(`ShapeMix`, from the recent submissions). Placing a task where the expected
fragmentation grows least keeps the cluster's free GPU capacity usable by what comes
next. As in the FGD paper's scheduler, growths are compared at its score's resolution
(`score`: about 40 thousandths near zero), not exactly: among hosts whose growth is that
close, the placement takes the first in a fixed host order, which fills hosts one after
another instead of spreading tasks over every host of equal merit. Values are memoised by
the host's free state (identical hosts share one entry). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from server.scheduling.placement import EPS, FULL, HostCapacity
from wire.messages import JobSpec

# The mix keeps the most frequent shapes covering this share of the arrivals, at most
# MIX_MAX of them (FGD's "typical pods": the simulator keeps adding shapes, most frequent
# first, until they cover 95 % of the pod list; 35 shapes on the openb default list).
MIX_COVERAGE = 0.95
MIX_MAX = 64


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

    def order_key(self) -> tuple[object, ...]:
        """A total order of shapes that is the same in every process (a frozenset's repr
        follows the string hash seed, which differs between replicas and restarts)."""
        return (self.gpus, self.share, self.gpu_memory_mb, self.cpus, self.memory_mb,
                self.models is not None, sorted(self.models or ()), self.mig or "")


@dataclass(frozen=True)
class ShapeMix:
    """Typical shapes with their probabilities (summing to 1)."""

    shapes: tuple[tuple[Shape, float], ...]

    @staticmethod
    def of(counts: Counter[Shape] | Iterable[tuple[Shape, float]]) -> ShapeMix:
        items = sorted(dict(counts).items(), key=lambda kv: (-kv[1], kv[0].order_key()))
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


# A host's free state, all fragmentation depends on: its GPUs with something free, as
# (model, free thousandths, free GPU memory MB), sorted; free CPU (rounded to 1/1000)
# and memory; its free MIG instances as (profile, model), sorted. Hosts in the same
# state share one memoised value.
GpuFree = tuple[str, int, int]
State = tuple[tuple[GpuFree, ...], float, int, tuple[tuple[str, str], ...]]


def gpus_free(host: HostCapacity) -> dict[int, GpuFree]:
    """Each GPU of `host` with free thousandths (not held whole, healthy, not in MIG mode)."""
    out: dict[int, GpuFree] = {}
    for i, model in host.gpu_models.items():
        f = host.free_share(i)
        if f:
            out[i] = (model, f, host.gpu_memory.get(i, 0) - host.share_memory_used.get(i, 0))
    return out


def mig_free(host: HostCapacity, taken: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    if not host.mig:
        return ()
    return tuple(sorted((p, host.gpu_models.get(g, "")) for u, (g, p, _m) in host.mig.items()
                        if u not in taken and host.mig_free(u, g)))


def state(gpus: Iterable[GpuFree], cpus_free: float, memory_free: int, mig: tuple[tuple[str, str], ...]) -> State:
    return tuple(sorted(gpus)), round(cpus_free, 3), memory_free, mig


def state_of(host: HostCapacity) -> State:
    return state(gpus_free(host).values(), host.cpus - host.used_cpus, host.memory_mb - host.used_memory_mb,
                 mig_free(host))


def frag_in(st: State, s: Shape) -> int:
    """Free GPU thousandths in host state `st` that shape `s` could not use: all of them
    when `s` asks for no GPU or does not fit at all, else those on GPUs too small for it
    or of a model it does not accept."""
    gpus, cpus, memory, mig = st
    total = sum(f for _m, f, _fm in gpus)
    if total == 0:
        return 0
    if (s.gpus == 0 and s.share == 0 and s.mig is None) or cpus + EPS < s.cpus or memory < s.memory_mb:
        return total
    models = s.models
    if s.gpus > 0:
        # A task's whole GPUs are of one model (placement.check): those of the models it
        # accepts with enough free GPUs.
        full = [m for m, f, _fm in gpus if f == FULL and (models is None or m in models)]
        if len(full) < s.gpus:
            return total
        first = full[0]
        if all(m == first for m in full):  # (one model: most hosts)
            return sum(f for m, f, _fm in gpus if f < FULL or m != first)
        free: dict[str, int] = {}
        for m in full:
            free[m] = free.get(m, 0) + 1
        fit = {m for m, n in free.items() if n >= s.gpus}
        if not fit:
            return total
        return sum(f for m, f, _fm in gpus if f < FULL or m not in fit)
    if s.share > 0:
        if not any(f >= s.share and fm >= s.gpu_memory_mb and (models is None or m in models) for m, f, fm in gpus):
            return total
        return sum(f for m, f, _fm in gpus if f < s.share or (models is not None and m not in models))
    assert s.mig is not None
    return 0 if any(p == s.mig and (models is None or m in models) for p, m in mig) else total


def score(growth: float) -> int:
    """FGD's score of a placement whose expected fragmentation grows by `growth`
    thousandths: 100 * sigmoid(-growth / 1000), truncated to an integer (0-100, higher is
    better). Growths within about 40 thousandths of each other score the same."""
    if growth > 50_000:
        return 0
    return int(100.0 * (1.0 / (1.0 + math.exp(growth / 1000.0))))


def frag_for(host: HostCapacity, s: Shape) -> int:
    """Free GPU thousandths on `host` that shape `s` could not use."""
    return frag_in(state_of(host), s)


class Fragmentation:
    """Expected fragmentation of hosts under a mix, memoised by each host's free state."""

    def __init__(self, mix: ShapeMix) -> None:
        self.mix = mix
        self._memo: dict[State, float] = {}

    def value(self, st: State) -> float:
        """The expected fragmentation of a host in state `st`."""
        v = self._memo.get(st)
        if v is None:
            if len(self._memo) > 200_000:
                self._memo.clear()
            v = self._memo[st] = sum(p * frag_in(st, s) for s, p in self.mix.shapes) if self.mix.shapes else 0.0
        return v

    def of(self, host: HostCapacity) -> float:
        return self.value(state_of(host))

    def growth(self, host: HostCapacity, options: list[list[int]], share: int, gpu_memory_mb: int, cpus: float,
               memory_mb: int, mig: tuple[str, ...]) -> list[float]:
        """How much the host's expected fragmentation grows if a task takes `cpus`,
        `memory_mb`, the MIG instances `mig` and, for each option, those GPUs (whole, or
        `share` thousandths and `gpu_memory_mb` of the one GPU given)."""
        free = gpus_free(host)
        cpus_free, memory_free = host.cpus - host.used_cpus, host.memory_mb - host.used_memory_mb
        mig_now = mig_free(host)
        before = self.value(state(free.values(), cpus_free, memory_free, mig_now))
        mig_after = mig_free(host, mig) if mig else mig_now
        out = []
        for gpus in options:
            after = dict(free)
            for i in gpus:
                if share and i in after:
                    m, f, fm = after[i]
                    if f > share:
                        after[i] = (m, f - share, fm - gpu_memory_mb)
                    else:
                        del after[i]
                else:
                    after.pop(i, None)
            out.append(self.value(state(after.values(), cpus_free - cpus, memory_free - memory_mb, mig_after))
                       - before)
        return out


class RecentShapes:
    """The shapes of the last `window` tasks submitted, and the fragmentation measure of
    their mix, remade after every `refresh_every` new ones (its memo lives as long), and
    sooner while the mix was made from fewer: after as many new ones as it was made from
    (found by exploring: the first mix after a start, of the one task seen then, stood for
    the next 500, and placement spread small jobs over the hosts bigger ones needed)."""

    def __init__(self, window: int = 5000, refresh_every: int = 500) -> None:
        self.window = window
        self.refresh_every = refresh_every
        self._recent: deque[Shape] = deque()
        self._counts: Counter[Shape] = Counter()
        self._since = 0
        self._made_from = 0  # tasks in the window when the measure was made
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
        if self._frag is None or self._since >= min(self.refresh_every, max(1, self._made_from)):
            self._since = 0
            self._made_from = len(self._recent)
            self._frag = Fragmentation(ShapeMix.of(self._counts)) if self._counts else None
        return self._frag
