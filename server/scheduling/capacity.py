"""Capacity index: every host's free capacity, bucketed by GPU model and free GPU count,
kept up to date as heartbeats, allocations and host settings change. It lets a
scheduling cycle place a job by looking at a few buckets instead of every host.

`Placer` is one cycle's copy-on-write view: hosts it reserves on are copied, the index
itself is not modified, and its choices are the same kind as `placement.place()`'s:
feasible by `placement.check()`, bin-packed by free GPUs left.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from server.scheduling.placement import Choice, HostCapacity, check
from wire.budgets import task_bytes
from wire.messages import JobSpec

ANY = "*"  # bucket key over all GPUs of a host, whatever the model


def size_class(x: float) -> int:
    """Power-of-two class of a free amount: hosts in a higher class than a request's
    surely have room for it; only the request's own class needs checking."""
    return max(0, int(x) + 1).bit_length()


def _keys(cap: HostCapacity) -> list[tuple[str, int, tuple[int, int]]]:
    if not cap.schedulable or cap.cordoned:
        return []
    per_model: dict[str, int] = defaultdict(int)
    total = 0
    for i, m in cap.gpu_models.items():
        if i not in cap.used_gpus and i not in cap.unhealthy_gpus:
            per_model[m] += 1
            total += 1
    room = (size_class(cap.cpus - cap.used_cpus), size_class(cap.memory_mb - cap.used_memory_mb))
    return [(m, n, room) for m, n in per_model.items()] + [(ANY, total, room)]


class CapacityIndex:
    def __init__(self) -> None:
        self.caps: dict[str, HostCapacity] = {}
        # model -> free GPUs of that model -> (CPU class, memory class) -> hosts
        self.buckets: dict[str, dict[int, dict[tuple[int, int], set[str]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(set)))
        self._where: dict[str, list[tuple[str, int, tuple[int, int]]]] = {}
        self._model_hosts: Counter[str] = Counter()

    def put(self, cap: HostCapacity) -> None:
        self.remove(cap.id)
        self.caps[cap.id] = cap
        self._model_hosts.update(set(cap.gpu_models.values()))
        keys = _keys(cap)
        self._where[cap.id] = keys
        for k, n, room in keys:
            self.buckets[k][n][room].add(cap.id)

    def remove(self, host_id: str) -> None:
        old = self.caps.pop(host_id, None)
        if old is not None:
            self._model_hosts.subtract(set(old.gpu_models.values()))
        for k, n, room in self._where.pop(host_id, []):
            by_room = self.buckets[k].get(n)
            if by_room is None:
                continue
            b = by_room.get(room)
            if b is not None:
                b.discard(host_id)
                if not b:
                    del by_room[room]
            if not by_room:
                del self.buckets[k][n]

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
    copies kept in `touched` and bucketed by free GPUs in an overlay of their own, so a
    placement looks at a few buckets of each, never at every touched host."""

    def __init__(self, index: CapacityIndex, healthy: Callable[[str], bool]) -> None:
        self.index = index
        self.healthy = healthy
        self.touched: dict[str, HostCapacity] = {}
        self.failed: list[tuple[str | None, int, float, int]] = []
        self.failed_gangs: list[tuple[str | None, int, float, int, int, bool]] = []
        # Hosts held back for a waiting gang: nothing else is placed on them.
        self.exclude: set[str] = set()
        # Overlay: model -> free GPUs of that model -> touched hosts.
        self._tbuckets: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._twhere: dict[str, list[tuple[str, int]]] = {}
        # Touched hosts whose copy may have changed since they were bucketed (whoever
        # asks for `cap()` may change it).
        self._dirty: set[str] = set()

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
        return cap

    def _rebucket(self) -> None:
        for host_id in self._dirty:
            for k, n in self._twhere.pop(host_id, ()):
                by_free = self._tbuckets[k]
                by_free[n].discard(host_id)
                if not by_free[n]:
                    del by_free[n]
            keys = [(k, n) for k, n, _ in _keys(self.touched[host_id])]
            self._twhere[host_id] = keys
            for k, n in keys:
                self._tbuckets[k][n].add(host_id)
        self._dirty.clear()

    def _dominated(self, spec: JobSpec) -> bool:
        """A job at least as large as one that already found no host this cycle."""
        for model, gpus, cpus, mem in self.failed:
            if model == spec.gpu_model and spec.gpus >= gpus and spec.cpus >= cpus and spec.memory_mb >= mem:
                return True
        return False

    def place(self, spec: JobSpec) -> Choice | None:
        """The feasible host left with the fewest free GPUs of the job's kind (bin
        packing), among touched and untouched hosts, or None."""
        if self._dominated(spec):
            return None
        if self._dirty:
            self._rebucket()
        key = spec.gpu_model or ANY
        buckets = self.index.buckets.get(key, {})
        tbuckets = self._tbuckets.get(key, {})
        need_cpu, need_mem = size_class(spec.cpus), size_class(spec.memory_mb)
        levels = sorted({n for n in buckets if n >= spec.gpus} | {n for n in tbuckets if n >= spec.gpus})
        for free in levels:
            found: tuple[str, list[int]] | None = None
            for host_id in tbuckets.get(free, ()):
                if host_id in self.exclude or not self.healthy(host_id):
                    continue
                reason, gpus = check(spec, self.touched[host_id])
                if reason is None and (found is None or host_id < found[0]):
                    found = (host_id, gpus)
            if found is None:
                for room, hosts in buckets.get(free, {}).items():
                    if room[0] < need_cpu or room[1] < need_mem:
                        continue  # every host in this class is too small
                    for host_id in hosts:
                        if host_id in self.touched or host_id in self.exclude or not self.healthy(host_id):
                            continue
                        reason, gpus = check(spec, self.index.caps[host_id])
                        if reason is None:
                            found = (host_id, gpus)
                            break
                    if found is not None:
                        break
            if found is not None:
                return Choice(found[0], found[1])
        self.failed.append((spec.gpu_model, spec.gpus, spec.cpus, spec.memory_mb))
        return None

    def reserve(self, choice: Choice, spec: JobSpec) -> None:
        cap = self.cap(choice.host_id)
        assert cap is not None
        cap.reserve(choice.gpu_indices, spec.cpus, spec.memory_mb, task_bytes(spec))

    # ------------------------------------------------------------ gangs

    def _view(self, host_id: str) -> HostCapacity | None:
        return self.touched.get(host_id) or self.index.caps.get(host_id)

    def _place_among(self, spec: JobSpec, host_ids: list[str]) -> Choice | None:
        best: tuple[int, str, list[int]] | None = None
        for host_id in host_ids:
            cap = self._view(host_id)
            if cap is None or host_id in self.exclude or not self.healthy(host_id):
                continue
            reason, gpus = check(spec, cap)
            if reason is None:
                key = (len(cap.free_gpus(None)) - spec.gpus, host_id, gpus)
                if best is None or key[:2] < best[:2]:
                    best = key
        return Choice(best[1], best[2]) if best else None

    def _racks(self, spec: JobSpec) -> list[list[str]]:
        """Hosts grouped by `rack` label, the racks with most free matching GPUs first."""
        racks: dict[str, list[str]] = defaultdict(list)
        free: dict[str, int] = defaultdict(int)
        for host_id, cap in self.index.caps.items():
            rack = cap.labels.get("rack")
            if not rack or not cap.schedulable or cap.cordoned:
                continue
            view = self._view(host_id) or cap
            racks[rack].append(host_id)
            free[rack] += len(view.free_gpus(spec.gpu_model))
        return [racks[r] for r in sorted(racks, key=lambda r: (-free[r], r))]

    def _try_gang(self, spec: JobSpec, among: list[str] | None) -> list[Choice] | None:
        got: list[Choice] = []
        for _ in range(spec.replicas):
            c = self._place_among(spec, among) if among is not None else self.place(spec)
            if c is None:
                break
            self.reserve(c, spec)
            got.append(c)
        for c in got:  # tentative only: the caller reserves what it keeps
            cap = self.cap(c.host_id)
            assert cap is not None
            cap.release(c.gpu_indices, spec.cpus, spec.memory_mb, task_bytes(spec))
        return got if len(got) == spec.replicas else None

    def place_gang(self, spec: JobSpec) -> list[Choice] | None:
        """Hosts for all `spec.replicas` tasks at once (on one rack if asked), or None."""
        key = (spec.gpu_model, spec.gpus, spec.cpus, spec.memory_mb, spec.replicas, spec.same_rack)
        for m, g, c, mem, n, rack in self.failed_gangs:
            if (m, rack) == (key[0], key[5]) and spec.gpus >= g and spec.cpus >= c \
                    and spec.memory_mb >= mem and spec.replicas >= n:
                return None
        failed_before = len(self.failed)
        if spec.same_rack:
            result = None
            for hosts in self._racks(spec):
                result = self._try_gang(spec, hosts)
                if result is not None:
                    break
        else:
            result = self._try_gang(spec, None)
        del self.failed[failed_before:]  # a gang's partial failure says nothing of single jobs
        if result is None:
            self.failed_gangs.append(key)
        return result

    def reservation_for(self, spec: JobSpec) -> set[str]:
        """The hosts a waiting gang would want: its best rack, or the hosts with the most
        free matching GPUs; held back from other jobs while the reservation lasts."""
        if spec.same_rack:
            racks = self._racks(spec)
            return set(racks[0]) if racks else set()
        ranked = sorted(
            (h for h, c in self.index.caps.items() if c.schedulable and not c.cordoned
             and (spec.gpu_model is None or spec.gpu_model in c.gpu_models.values())),
            key=lambda h: (-len((self._view(h) or self.index.caps[h]).free_gpus(spec.gpu_model)), h),
        )
        return set(ranked[: spec.replicas])
