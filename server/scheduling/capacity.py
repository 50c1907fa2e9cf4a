"""Capacity index: every host's free capacity, bucketed by GPU model and free GPU count,
kept up to date as heartbeats, allocations and host settings change. It lets a
scheduling cycle place a job by looking at a few buckets instead of every host. Each
bucket keeps its hosts in host id order, the fixed order in which hosts of equal merit
are taken.

`Placer` is one cycle's copy-on-write view: hosts it reserves on are copied, the index
itself is not modified, and its choices are the same kind as `placement.place()`'s:
feasible by `placement.check()`, ranked by the policy.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left, insort
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Set
from types import EllipsisType
from typing import Any, TypeVar

from server.scheduling.backfill import UNKNOWN, Ends, Reservation, choose, start_on
from server.scheduling.fragmentation import Fragmentation, score
from server.scheduling.placement import FULL, Choice, HostCapacity, allowed_host, check
from wire.budgets import task_bytes
from wire.messages import JobSpec

POLICIES = ("fgd", "binpack")
ANY = "*"  # bucket key over all GPUs of a host, whatever the model
SHARE_STEP = 50  # thousandths per level of the share buckets
KIND = 4  # placement_size: the items that must be equal for one failure to say anything of another
# Hosts held back from a job past which the placer reads each bucket of the index without
# them, once per bucket and set held back in a cycle (a large maintenance window or
# advance reservation is then not walked past host by host for every job).
LARGE_EXCLUDE = 256

T = TypeVar("T")
# Placer.direct_share: a job whose labels allow at most this share of the hosts looks at
# each of them (about 10 us a host) rather than walk the buckets (about 0.15 us a host
# with room, skipped for want of the labels).
DIRECT_SHARE = 1 / 64
# Placer.reservation_for: hosts with the most free room compared, per task of the job.
RESERVE_CANDIDATES = 16
# Placer.reservation_for with `sameRack`: racks looked at, the most free first, for one
# where enough hosts could ever take a task of the job.
RESERVE_RACKS = 8


def placement_size(spec: JobSpec, models: frozenset[str] | None) -> tuple[Any, ...]:
    """What a failed placement of a task of `spec` (on one of `models`) says of others: its
    kind (the first KIND items: models, MIG profile, required host labels, excluded
    hosts), then its amounts."""
    return (models, spec.mig_profile, tuple(sorted(spec.host_labels.items())), tuple(spec.exclude_hosts),
            spec.gpus, spec.gpu_share, spec.gpu_memory_mb, spec.cpus, spec.memory_mb)


def as_hard(size: tuple[Any, ...], failed: tuple[Any, ...]) -> bool:
    """Whether a task of `size` is of the same kind as one of `failed` and at least as large
    in every amount (both `placement_size`): where the one finds no host, on the same
    hosts, neither does the other."""
    return size[:KIND] == failed[:KIND] and all(a >= b for a, b in zip(size[KIND:], failed[KIND:], strict=True))


def size_class(x: float) -> int:
    """Power-of-two class of a free amount: hosts in a higher class than a request's
    surely have room for it; only the request's own class needs checking."""
    return max(0, int(x) + 1).bit_length()


def cpu_class(x: float) -> int:
    """An eighth of an octave class of free CPUs (classes 9 % apart), for the same use
    as `size_class`: CPU is what most often rules out a host whose GPUs fit (on the
    openb trace at 50,000 hosts, power-of-two classes left some forty hosts per placement
    to be checked and found short of CPU)."""
    return int(8 * math.log2(max(0.0, x) + 1))


Key = tuple[str, str]  # ("w", model): free whole GPUs; ("s", model): best free share; ("m", profile): free MIG


def _keys(cap: HostCapacity) -> list[tuple[Key, int, tuple[int, int]]]:
    """Where a host is filed: for whole GPUs, by how many of each model are free; for
    shares, by the most free share on one GPU of each model (in SHARE_STEP levels); for
    MIG, by how many instances of each profile are free; each with its CPU and memory
    class."""
    if not cap.schedulable or cap.cordoned or cap.pressure:
        return []
    whole: dict[str, int] = defaultdict(int)
    share: dict[str, int] = defaultdict(int)
    total = best = 0
    for i, m in cap.gpu_models.items():
        f = cap.free_share(i)
        if f == FULL:
            whole[m] += 1
            total += 1
        if f > share[m]:
            share[m] = f
        best = max(best, f)
    mig: dict[str, int] = defaultdict(int)
    for u, (g, profile, _mem) in cap.mig.items():
        if cap.mig_free(u, g):
            mig[profile] += 1
    room = (cpu_class(cap.cpus - cap.used_cpus), size_class(cap.memory_mb - cap.used_memory_mb))
    out: list[tuple[Key, int, tuple[int, int]]] = [(("w", m), n, room) for m, n in whole.items()]
    # Any model: by all its free GPUs (a task without GPUs goes where fewest are free; one
    # of whole GPUs of any model finds, among these, a host with as many of one model).
    out.append((("w", ANY), total, room))
    out += [(("s", m), f // SHARE_STEP, room) for m, f in share.items() if f > 0]
    if best > 0:
        out.append((("s", ANY), best // SHARE_STEP, room))
    out += [(("m", p), n, room) for p, n in mig.items()]
    return out


class _Filtered:
    """A bucket's hosts (in order) without a large set held back (`exclude`, when it holds
    LARGE_EXCLUDE hosts or more) and within `only` (None: all), filtered as far as it is
    read: each read goes over what earlier ones kept, then on through the bucket, so that a
    cycle's placements walk past the hosts left out once, not each time."""

    __slots__ = ("exclude", "only", "source", "_kept", "_pos")

    def __init__(self, source: list[str], exclude: Set[str], only: Set[str] | None) -> None:
        self.source, self.exclude, self.only = source, exclude, only
        self._kept: list[str] = []
        self._pos = 0

    def __iter__(self) -> Iterator[str]:
        kept, source = self._kept, self.source
        ex = self.exclude if len(self.exclude) >= LARGE_EXCLUDE else frozenset()
        only = self.only
        i = 0
        while True:
            if i < len(kept):
                yield kept[i]
                i += 1
                continue
            pos = self._pos
            while pos < len(source):
                h = source[pos]
                pos += 1
                if h not in ex and (only is None or h in only):
                    kept.append(h)
                    break
            self._pos = pos
            if i >= len(kept):
                return


def _wanted(spec: JobSpec, models: frozenset[str] | None) -> tuple[list[Key], int]:
    """The bucket keys a task of `spec` may find a host in, and the lowest level."""
    if spec.gpus > 0:
        return ([("w", m) for m in sorted(models)] if models else [("w", ANY)]), spec.gpus
    if spec.gpu_share > 0:
        return ([("s", m) for m in sorted(models)] if models else [("s", ANY)]), spec.gpu_share // SHARE_STEP
    if spec.mig_profile is not None:
        return [("m", spec.mig_profile)], 1
    return [("w", ANY)], 0


class CapacityIndex:
    def __init__(self) -> None:
        self.caps: dict[str, HostCapacity] = {}
        # key -> level -> (CPU class, memory class) -> hosts, sorted by id (see _keys)
        self.buckets: dict[Key, dict[int, dict[tuple[int, int], list[str]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list)))
        self._where: dict[str, list[tuple[Key, int, tuple[int, int]]]] = {}
        self._model_hosts: Counter[str] = Counter()
        # (label, value) -> the hosts that have it: a job that requires labels looks only
        # at those (a label few hosts have, or none, would otherwise cost a walk over
        # every host with room, as many times a cycle as such jobs are tried).
        self.labelled: dict[tuple[str, str], set[str]] = defaultdict(set)

    def put(self, cap: HostCapacity) -> None:
        self.remove(cap.id)
        self.caps[cap.id] = cap
        self._model_hosts.update(set(cap.gpu_models.values()))
        for kv in cap.labels.items():
            self.labelled[kv].add(cap.id)
        keys = _keys(cap)
        self._where[cap.id] = keys
        for k, n, room in keys:
            insort(self.buckets[k][n][room], cap.id)

    def remove(self, host_id: str) -> None:
        old = self.caps.pop(host_id, None)
        if old is not None:
            self._model_hosts.subtract(set(old.gpu_models.values()))
            for kv in old.labels.items():
                hosts = self.labelled.get(kv)
                if hosts is not None:
                    hosts.discard(host_id)
                    if not hosts:
                        del self.labelled[kv]
        for k, n, room in self._where.pop(host_id, []):
            by_room = self.buckets[k].get(n)
            if by_room is None:
                continue
            b = by_room.get(room)
            if b is not None:
                i = bisect_left(b, host_id)
                if i < len(b) and b[i] == host_id:
                    del b[i]
                if not b:
                    del by_room[room]
            if not by_room:
                del self.buckets[k][n]

    def with_labels(self, labels: dict[str, str]) -> Set[str] | None:
        """The hosts that have every one of `labels` (None: no labels asked, any host); the
        index's own set when one label is asked (read it, never change it)."""
        if not labels:
            return None
        sets = sorted((self.labelled.get(kv, set()) for kv in labels.items()), key=len)
        return sets[0] if len(sets) == 1 else sets[0].intersection(*sets[1:])

    def models(self) -> set[str]:
        """GPU models of every known host (schedulable or not)."""
        return {m for m, n in self._model_hosts.items() if n > 0}

    def refresh(self, host_id: str) -> None:
        cap = self.caps.get(host_id)
        if cap is not None:
            self.put(cap)


class Placer:
    """One cycle's placement over the index; reservations stay in this object.

    Hosts this cycle has touched (reserved on, or whose allocation a report changed) are
    copies kept in `touched` and filed in an overlay of their own, so a placement looks
    at a few buckets of each, never at every touched host.

    Feasible hosts are found walking the levels from the tightest (fewest free GPUs,
    least free share) up, and at one level in host id order. Policies: `binpack` takes
    the first one found; `fgd` (the default) considers the first `candidates` of them and
    takes the one with the best FGD score (scheduling.fragmentation.score: the growth of
    its expected fragmentation under the recent mix of task shapes, at the FGD paper's
    resolution), ties going to the lowest host id: hosts of equal merit fill one after
    another in a fixed order. A share goes to the GPU of that host with the best score,
    the lowest index among equals."""

    def __init__(self, index: CapacityIndex, healthy: Callable[[str], bool], *, policy: str = "fgd",
                 fragmentation: Fragmentation | None = None, candidates: int = 16,
                 direct_share: float = DIRECT_SHARE) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}: one of {', '.join(POLICIES)}")
        self.index = index
        self._is_healthy = healthy
        # Each host's health, asked once a cycle: a placement walks the tightest levels
        # first, so every job of a cycle meets the same hosts there.
        self._health: dict[str, bool] = {}
        self.policy = policy
        self.frag = fragmentation if policy == "fgd" and fragmentation is not None and fragmentation.mix.shapes \
            else None
        self.candidates = candidates if self.frag is not None else 1
        # A job whose labels allow at most this share of the hosts looks at those hosts
        # one by one (_feasible_among), not along the buckets.
        self.direct_share = direct_share
        self.touched: dict[str, HostCapacity] = {}
        # Sizes of jobs (of gangs) that found no host this cycle, each with the hosts held
        # back from it: it says a larger job finds none only among as few hosts.
        self.failed: list[tuple[tuple[Any, ...], frozenset[str]]] = []
        self.failed_gangs: list[tuple[tuple[Any, ...], frozenset[str]]] = []
        # Hosts held back from the job being placed (a reservation for another, hosts kept
        # for preemptors): it is not placed on them.
        self.exclude: Set[str] = frozenset()
        # While set (`within`): the only hosts the job may take, a preference tried first.
        self.only: Set[str] | None = None
        # ids of a bucket's list, a set held back and the only hosts -> its view without
        # the one and within the other.
        self._filtered: dict[tuple[int, int, int], _Filtered] = {}
        # Overlay: key -> level -> touched hosts.
        self._tbuckets: dict[Key, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._twhere: dict[str, list[tuple[Key, int]]] = {}
        # Touched hosts whose copy may have changed since they were filed (whoever asks
        # for `cap()` may change it).
        self._dirty: set[str] = set()
        # (keys, level) -> the touched hosts there, as a set and sorted (_touched_at).
        self._tsorted: dict[tuple[tuple[Key, ...], int], tuple[set[str], list[str]]] = {}
        # A host copy's FGD scores for a task shape, while the copy is unchanged: the
        # feasible hosts a cycle scores are mostly the same few, job after job (_scored).
        self._scores: dict[tuple[Any, ...], list[int]] = {}

    def healthy(self, host_id: str) -> bool:
        """Whether new work may go to `host_id` (the caller's judgement, kept for the cycle:
        health is judged at the cycle's one `now`)."""
        ok = self._health.get(host_id)
        if ok is None:
            ok = self._health[host_id] = self._is_healthy(host_id)
        return ok

    def fork(self) -> Placer:
        """A what-if copy: this cycle's reservations copied, further changes its own
        (scheduling.preemption asks whether a job would fit were some tasks stopped)."""
        other = Placer(self.index, self._is_healthy, policy="binpack")
        other._health = self._health
        other.touched = {h: c.copy() for h, c in self.touched.items()}
        other._dirty = set(other.touched)
        other.exclude = self.exclude
        return other

    def cap(self, host_id: str) -> HostCapacity | None:
        """This cycle's own copy of a host's capacity, free to change."""
        cap = self.touched.get(host_id)
        if cap is None:
            base = self.index.caps.get(host_id)
            if base is None:
                return None
            cap = base.copy()
            self.touched[host_id] = cap
        self._dirty.add(host_id)
        cap.version += 1  # the caller may change it: nothing memoised of it holds (_scores)
        return cap

    def _rebucket(self) -> None:
        changed: set[tuple[Key, int]] = set()
        for host_id in self._dirty:
            old = self._twhere.pop(host_id, [])
            for k, n in old:
                by_level = self._tbuckets[k]
                by_level[n].discard(host_id)
                if not by_level[n]:
                    del by_level[n]
            keys = [(k, n) for k, n, _ in _keys(self.touched[host_id])]
            self._twhere[host_id] = keys
            for k, n in keys:
                self._tbuckets[k][n].add(host_id)
            if keys != old:
                changed.update(old)
                changed.update(keys)
        self._dirty.clear()
        if changed:  # forget the sorted views of the levels that changed
            for at in [at for at in self._tsorted if any((k, at[1]) in changed for k in at[0])]:
                del self._tsorted[at]

    def _dominated(self, spec: JobSpec, models: frozenset[str] | None) -> bool:
        """A job of the same kind at least as large as one that already found no host this
        cycle, with at least the hosts held back from it held back."""
        me = placement_size(spec, models)
        for f, held in self.failed:
            if as_hard(me, f) and (held is self.exclude or held <= self.exclude):
                return True
        return False

    def _feasible(self, spec: JobSpec, models: frozenset[str] | None) -> Iterator[tuple[int, str, Choice]]:
        """(level, host, choice) of feasible hosts, tightest levels first; at one level in
        host id order, touched and untouched hosts alike."""
        keys, lowest = _wanted(spec, models)
        need_cpu, need_mem = cpu_class(spec.cpus), size_class(spec.memory_mb)
        allowed = self.index.with_labels(spec.host_labels)
        only = self.only
        if only is not None:
            allowed = only if allowed is None else set(allowed) & only
        if allowed is not None and len(allowed) <= self.direct_share * len(self.index.caps):
            yield from self._feasible_among(spec, models, allowed, keys, lowest)
            return
        levels: set[int] = set()
        for k in keys:
            levels.update(n for n in self.index.buckets.get(k, {}) if n >= lowest)
            levels.update(n for n in self._tbuckets.get(k, {}) if n >= lowest)
        seen: set[str] = set()
        filtered = only is not None or len(self.exclude) >= LARGE_EXCLUDE
        for level in sorted(levels):
            touched, ordered = self._touched_at(keys, level)
            sources: list[Iterable[str]] = [ordered] if ordered else []
            for k in keys:
                for room, hosts in self.index.buckets.get(k, {}).get(level, {}).items():
                    if room[0] >= need_cpu and room[1] >= need_mem:  # else every host in it is too small
                        sources.append(self._bucket_view(hosts) if filtered else hosts)
            for host_id in (sources[0] if len(sources) == 1 else heapq.merge(*sources)):
                if host_id in seen or host_id in self.exclude or (allowed is not None and host_id not in allowed):
                    continue
                cap = self.touched.get(host_id)
                if cap is None:
                    cap = self.index.caps[host_id]
                elif host_id not in touched:
                    continue  # the index files it where it was before this cycle changed it
                seen.add(host_id)
                if not self.healthy(host_id):
                    continue
                reason, gpus, mig = check(spec, cap, models)
                if reason is None:
                    yield level, host_id, Choice(host_id, gpus, mig)

    def _bucket_view(self, hosts: list[str]) -> _Filtered:
        """A bucket's hosts (the index does not change during a cycle) without a large set
        held back and within `only`: one view per bucket and pair of sets a cycle, read as
        far as placements have read it."""
        at = (id(hosts), id(self.exclude), id(self.only))
        got = self._filtered.get(at)
        if got is None or got.exclude is not self.exclude or got.only is not self.only or got.source is not hosts:
            got = self._filtered[at] = _Filtered(hosts, self.exclude, self.only)
        return got

    def within(self, hosts: Set[str], attempt: Callable[[], T]) -> T:
        """`attempt()` (a placement) with the placer taking only `hosts`: a preference tried
        before the whole cluster. What it learns there of failures is forgotten: it says
        nothing of the other hosts."""
        failed, gangs = len(self.failed), len(self.failed_gangs)
        self.only = hosts
        try:
            return attempt()
        finally:
            self.only = None
            del self.failed[failed:]
            del self.failed_gangs[gangs:]

    def _feasible_among(self, spec: JobSpec, models: frozenset[str] | None, hosts: Set[str], keys: list[Key],
                        lowest: int) -> Iterator[tuple[int, str, Choice]]:
        """`_feasible` over a few hosts (those a job's labels allow), each looked at
        directly: the same hosts in the same order, the level of each found as the buckets
        would file it."""
        wanted = set(keys)
        found: list[tuple[int, str, Choice]] = []
        for host_id in hosts:
            cap = self.view(host_id)
            if cap is None or host_id in self.exclude:
                continue
            levels = [n for k, n, _room in _keys(cap) if k in wanted and n >= lowest]
            if not levels or not self.healthy(host_id):
                continue
            reason, gpus, mig = check(spec, cap, models)
            if reason is None:
                found.append((min(levels), host_id, Choice(host_id, gpus, mig)))
        found.sort(key=lambda x: (x[0], x[1]))
        yield from found

    def _touched_at(self, keys: list[Key], level: int) -> tuple[set[str], list[str]]:
        """The touched hosts filed at `level` under any of `keys`, as a set and in id order
        (kept until the overlay changes: every placement of a cycle asks again)."""
        at = (tuple(keys), level)
        got = self._tsorted.get(at)
        if got is None:
            hosts = {h for k in keys for h in self._tbuckets.get(k, {}).get(level, ())}
            got = self._tsorted[at] = (hosts, sorted(hosts))
        return got

    def place(self, spec: JobSpec, models: frozenset[str] | None | EllipsisType = ...) -> Choice | None:
        """A host for one task of `spec` (of one of `models`, by default the job's), by the
        policy, among touched and untouched hosts, or None."""
        accept = spec.models() if models is ... else models
        if self._dominated(spec, accept):
            return None
        if self._dirty:
            self._rebucket()
        found: list[tuple[int, str, Choice]] = []
        for cand in self._feasible(spec, accept):
            found.append(cand)
            if len(found) >= self.candidates:
                break
        if not found:
            self.failed.append((placement_size(spec, accept), frozenset(self.exclude)))
            return None
        if self.frag is None or (len(found) == 1 and not spec.gpu_share):
            return found[0][2]
        # A task asking no GPU: among equal scores the host with the fewest free GPUs (found
        # by exploring: by host id, such a job went to an idle 8-GPU host before an idle
        # CPU-only one, and an 8-GPU job then found too few CPUs there). GPU tasks' ties go
        # by host id, the fixed order FGD's figures need (docs/benchmarks.md: ties to the
        # tightest host placed 0.25 points fewer GPUs of the openb trace).
        cpu_only = not spec.wants_gpu()
        return min((self._scored(spec, c, accept, level if cpu_only else 0) for level, _h, c in found),
                   key=lambda x: x[0])[1]

    def _scored(self, spec: JobSpec, choice: Choice, models: frozenset[str] | None,
                level: int = 0) -> tuple[tuple[int, int, str], Choice]:
        """(minus the FGD score, `level`, host) of a choice; for a share, on the GPU of the
        host with the best score (the lowest index among equals)."""
        assert self.frag is not None
        host = self.view(choice.host_id)
        assert host is not None
        options = [choice.gpu_indices]
        if spec.gpu_share > 0:
            options = [[i] for i in host.share_options(spec.gpu_share, spec.gpu_memory_mb, models)]
        memo = (id(host), host.version, tuple(map(tuple, options)), spec.gpu_share, spec.gpu_memory_mb, spec.cpus,
                spec.memory_mb, choice.mig)
        scores = self._scores.get(memo)
        if scores is None:
            grown = self.frag.growth(host, options, spec.gpu_share, spec.gpu_memory_mb, spec.cpus, spec.memory_mb,
                                     choice.mig)
            scores = self._scores[memo] = [score(g) for g in grown]
        if len(options) == 1 and spec.gpu_share == 0:
            return (-scores[0], level, choice.host_id), choice
        best: tuple[tuple[int, int, str], Choice] | None = None
        for gpus, sc in zip(options, scores, strict=True):
            rank = (-sc, level, choice.host_id)
            if best is None or rank < best[0]:
                best = (rank, Choice(choice.host_id, gpus, choice.mig))
        assert best is not None
        return best

    def reserve(self, choice: Choice, spec: JobSpec) -> None:
        cap = self.cap(choice.host_id)
        assert cap is not None
        cap.reserve(choice.gpu_indices, spec.cpus, spec.memory_mb, task_bytes(spec), spec.gpu_share,
                    spec.gpu_memory_mb, choice.mig)

    def release(self, choice: Choice, spec: JobSpec) -> None:
        cap = self.cap(choice.host_id)
        assert cap is not None
        cap.release(choice.gpu_indices, spec.cpus, spec.memory_mb, task_bytes(spec), spec.gpu_share,
                    spec.gpu_memory_mb, choice.mig)

    # ------------------------------------------------------------ gangs

    def view(self, host_id: str) -> HostCapacity | None:
        """A host as this cycle's placements have left it (read only)."""
        return self.touched.get(host_id) or self.index.caps.get(host_id)

    def _place_among(self, spec: JobSpec, host_ids: list[str], models: frozenset[str] | None) -> Choice | None:
        best: tuple[int, str, Choice] | None = None
        for host_id in host_ids:
            cap = self.view(host_id)
            if cap is None or host_id in self.exclude or (self.only is not None and host_id not in self.only) \
                    or not self.healthy(host_id):
                continue
            reason, gpus, mig = check(spec, cap, models)
            if reason is None:
                key = (len(cap.free_gpus(None)) - spec.gpus, host_id, Choice(host_id, gpus, mig))
                if best is None or key[:2] < best[:2]:
                    best = key
        return best[2] if best else None

    def _racks(self, spec: JobSpec, models: frozenset[str] | None) -> list[list[str]]:
        """Hosts grouped by `rack` label, the racks with most free matching GPUs first."""
        racks: dict[str, list[str]] = defaultdict(list)
        free: dict[str, int] = defaultdict(int)
        for host_id, cap in self.index.caps.items():
            rack = cap.labels.get("rack")
            if not rack or not cap.schedulable or cap.cordoned or cap.pressure or not allowed_host(spec, cap):
                continue
            view = self.view(host_id) or cap
            racks[rack].append(host_id)
            free[rack] += len(view.free_gpus(models))
        return [racks[r] for r in sorted(racks, key=lambda r: (-free[r], r))]

    def _try_gang(self, spec: JobSpec, among: list[str] | None, models: frozenset[str] | None) -> list[Choice] | None:
        got: list[Choice] = []
        for _ in range(spec.replicas):
            c = self._place_among(spec, among, models) if among is not None else self.place(spec, models)
            if c is None:
                break
            self.reserve(c, spec)
            got.append(c)
        for c in got:  # tentative only: the caller reserves what it keeps
            self.release(c, spec)
        return got if len(got) == spec.replicas else None

    def _model_choices(self, spec: JobSpec) -> list[frozenset[str] | None]:
        """The model sets a gang's tasks are placed under: the job's own, or, with
        `same_model`, each of its models alone (the one with most free GPUs first)."""
        models = spec.models()
        if not spec.same_model or models is None or len(models) == 1:
            return [models]
        # Free GPUs of each model as the index files them (whole GPUs on schedulable
        # hosts): a read of its buckets, not of every host.
        free = Counter[str]()
        for m in models:
            for level, rooms in self.index.buckets.get(("w", m), {}).items():
                free[m] += level * sum(len(hosts) for hosts in rooms.values())
        return [frozenset({m}) for m in sorted(models, key=lambda m: (-free[m], m))]

    def place_gang(self, spec: JobSpec) -> list[Choice] | None:
        """Hosts for all `spec.replicas` tasks at once (on one rack if asked, of one model
        if asked), or None."""
        key: tuple[Any, ...] = (placement_size(spec, spec.models()), spec.same_model, spec.replicas, spec.same_rack)
        for f, held in self.failed_gangs:
            size, same_model, n, rack = f
            if (same_model, rack) == (key[1], key[3]) and spec.replicas >= n and as_hard(key[0], size) \
                    and (held is self.exclude or held <= self.exclude):
                return None
        failed_before = len(self.failed)
        result = None
        for models in self._model_choices(spec):
            if spec.same_rack:
                for hosts in self._racks(spec, models):
                    result = self._try_gang(spec, hosts, models)
                    if result is not None:
                        break
            else:
                result = self._try_gang(spec, None, models)
            if result is not None:
                break
        del self.failed[failed_before:]  # a gang's partial failure says nothing of single jobs
        if result is None:
            self.failed_gangs.append((key, frozenset(self.exclude)))
        return result

    def reservation_for(self, job_id: str, spec: JobSpec, now: float, ends: Callable[[str], Ends],
                        soonest: Iterable[str] = ()) -> Reservation:
        """Hosts to hold for a waiting job (scheduling.backfill): with `sameRack` its best
        rack (of the RESERVE_RACKS with the most free matching GPUs, the freest with
        enough hosts that could ever take a task of it); otherwise the `replicas` hosts
        where a task of it could start soonest, among those with the most free matching
        GPUs (RESERVE_CANDIDATES of them) and `soonest` (hosts that free up first); and
        when the job could start there. `ends(host)` gives
        the expected ends of the tasks on a host. Hosts held back from this job are not
        taken. A gang of one model of several (`sameModel`) holds hosts of one model: the
        model where it could start soonest, none where no model has hosts enough."""
        models = spec.models()
        soonest = tuple(soonest)
        if spec.same_model and spec.replicas > 1 and models is not None and len(models) > 1:
            found = [r for m in sorted(models)
                     if (r := self._reservation_in(job_id, spec, frozenset({m}), now, ends, soonest)).hosts]
            # Hosts enough for every task first (a model short of hosts holds none, later),
            # then the soonest start.
            return min(found, key=lambda r: (not r.holds_all(spec.replicas), r.start),
                       default=Reservation(job_id, frozenset(), UNKNOWN))
        return self._reservation_in(job_id, spec, models, now, ends, soonest)

    def _reservation_in(self, job_id: str, spec: JobSpec, models: frozenset[str] | None, now: float,
                        ends: Callable[[str], Ends], soonest: Iterable[str]) -> Reservation:
        """`reservation_for` on hosts of `models` (None: any)."""
        if spec.same_rack:
            racks = [hosts for hosts in self._racks(spec, models) if self.exclude.isdisjoint(hosts)]
            for hosts in racks[:RESERVE_RACKS]:
                starts = self._starts(hosts, spec, models, now, ends)
                if len(starts) >= spec.replicas:  # a rack the gang could ever start in
                    return Reservation(job_id, frozenset(hosts), choose(spec, starts, self._free)[1])
            return Reservation(job_id, frozenset(), UNKNOWN)
        candidates = self._most_free(spec, models, RESERVE_CANDIDATES * spec.replicas)
        candidates.update(soonest)
        hosts, start = choose(spec, self._starts(candidates, spec, models, now, ends), self._free)
        if len(hosts) < spec.replicas and spec.gpus and not spec.gpu_share and not spec.mig_profile:
            # Too few hosts for a task each: a gang of whole GPUs may stack on one host (as
            # placement does), held for all of its tasks together.
            n = spec.replicas
            whole = spec.model_copy(update={"gpus": spec.gpus * n, "cpus": spec.cpus * n,
                                            "memory_mb": spec.memory_mb * n, "replicas": 1})
            one = self._starts(candidates, whole, models, now, ends)
            if one:
                host = min(one, key=lambda h: (one[h], -self._free(h), h))
                return Reservation(job_id, frozenset({host}), one[host], stacked=True)
        return Reservation(job_id, frozenset(hosts), start)

    def _free(self, host_id: str) -> int:
        view = self.view(host_id)
        return len(view.free_gpus(None)) if view is not None else 0

    def _starts(self, hosts: Iterable[str], spec: JobSpec, models: frozenset[str] | None, now: float,
                ends: Callable[[str], Ends]) -> dict[str, float]:
        """When a task of `spec` could start on each of `hosts` that may ever hold one
        (healthy, not held back, labels and models that fit)."""
        out: dict[str, float] = {}
        for h in hosts:
            cap = self.view(h)
            if cap is None or h in self.exclude or not cap.schedulable or cap.cordoned or cap.pressure \
                    or not self.healthy(h):
                continue
            start = start_on(cap, ends(h), spec, models, now)
            if start is not None:
                out[h] = start
        return out

    def _most_free(self, spec: JobSpec, models: frozenset[str] | None, n: int) -> set[str]:
        """About `n` hosts not held back with the most free room for `spec`, without a look
        at every host: the wanted keys' levels from the top down (hosts this cycle touched at the level
        their copy is filed at, the others where the index files them), then, where those
        hold too few (a full cluster files no host under a model with nothing free), hosts
        of a fitting model by all their free GPUs."""
        if self._dirty:
            self._rebucket()
        keys, _lowest = _wanted(spec, models)
        out: set[str] = set()

        def fits(h: str) -> bool:
            cap = self.view(h)
            return cap is not None and h not in self.exclude \
                and (models is None or not models.isdisjoint(cap.gpu_models.values())) \
                and allowed_host(spec, cap)

        for walk in (keys, [("w", ANY)]):
            levels = sorted({lv for k in walk for lv in (*self.index.buckets.get(k, {}), *self._tbuckets.get(k, {}))},
                            reverse=True)
            for level in levels:
                for k in walk:
                    touched = sorted(self._tbuckets.get(k, {}).get(level, ()))
                    untouched = (h for hosts in self.index.buckets.get(k, {}).get(level, {}).values() for h in hosts
                                 if h not in self.touched)
                    for h in itertools.chain(touched, untouched):
                        if h not in out and fits(h):
                            out.add(h)
                            if len(out) >= n:
                                return out
        return out
