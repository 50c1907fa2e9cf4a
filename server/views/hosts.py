"""The host read model: one row per host, the same for GraphQL and the console.

`HostTable` belongs to a ClusterState, which tells it whenever a host's shape (its last
decoded heartbeat), allocation or settings change (`changed`); the row is rebuilt from
them when it is next read. What changes with every heartbeat (health, last seen, GPU
utilisation, CPU and memory in use) is read live: health by `server.health.rules` at the
read clock, usage from the newest heartbeat, which the cluster view keeps undecoded when
its shape is unchanged (`HostEntry.raw`) and which is parsed here only when it changed.

Filtering (`HostQuery`), ordering (`ORDERS`) and the fleet's totals (`summary`) are
defined here once. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from server.health.rules import Health, host_health
from wire.messages import GpuUsage, Heartbeat, host_gpus_held

if TYPE_CHECKING:
    from server.state.cluster import ClusterState, HostEntry

T = TypeVar("T")

# A pass over the hosts is a generator of steps: it yields after every STEP_ROWS hosts and
# returns its result. `finish` runs one through at once; the API and the console run them
# a step at a time with the event loop's other work (the scheduler) between the steps.
Steps = Generator[None, None, T]
STEP_ROWS = 2000


def finish(steps: Steps[T]) -> T:
    """Run a pass through and return its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def finish_stepwise(steps: Steps[T], pause: Callable[[], Awaitable[object]]) -> T:
    """Run a pass through, awaiting `pause()` between its steps (the event loop's other work
    then runs; the API's reads pace theirs more: server.api.reads.Reads.run)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await pause()


HEALTH_RANK = {Health.LOST.value: 0, Health.SUSPECT.value: 1, Health.HEALTHY.value: 2}
NO_RACK = "-"


@dataclass(slots=True)
class HostRow:
    """One host as shown. `gpus_by_model` is (model, GPUs, allocated, unhealthy)."""

    id: str
    health: str
    present: bool
    cordoned: bool  # no new placements (a draining host is cordoned too)
    draining: bool  # a drain has begun (one scheduled ahead: from its start)
    simulated: bool
    # The labels placement reads (ClusterState.labels_of), those of them the operator set,
    # and what its agent reports (some of which may be ignored: scheduling.hostlabels).
    labels: dict[str, str]
    rack: str
    zone: str
    gpus: int
    gpu_model: str  # the models, comma-separated, or "-"
    models: tuple[str, ...]
    gpus_by_model: tuple[tuple[str, int, int, int], ...]
    gpus_allocated: int
    gpus_unhealthy: int
    gpus_free: int  # healthy and not allocated
    # The mean utilisation of its GPUs whose utilisation its latest heartbeat read (None:
    # no GPUs, or none read: GpuUsage.unread).
    gpu_util_pct: float | None
    cpus: int
    cpu_pct: float
    cpu_allocated: float
    memory_mb: int
    mem_used_mb: int
    mem_allocated: int
    last_seen: float
    tasks: int
    # Whether the agent confines its tasks (cgroup and a user of their own), and how; None
    # from an agent that does not say (wire.messages.Heartbeat.isolated).
    isolated: bool | None = None
    isolation: str = ""
    # The agent's self-fences since it started (wire.messages.Heartbeat.fences).
    fences: int = 0
    last_fence_s: float = 0.0
    fence_continued: int = 0
    fence_stopped: int = 0
    # The agent is shutting down (wire.messages.Heartbeat.leaving): nothing new is placed.
    leaving: bool = False
    # Why its agent asks for no new work (wire.messages.Heartbeat.pressure), "" none.
    pressure: str = ""
    # A drain scheduled ahead that has not begun: when it begins, and when what still runs
    # is stopped (scheduling.maintenance); 0 when none. `drain_deadline` of a drain begun.
    drain_at: float = 0.0
    drain_deadline: float = 0.0
    operator_labels: dict[str, str] = field(default_factory=dict)
    agent_labels: dict[str, str] = field(default_factory=dict)
    # What the row was built from (identity), and the raw heartbeat its usage came from.
    _heartbeat: object = None
    _alloc: object = None
    _cfg: object = None
    _raw: object = None


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    profile: str
    memory_mb: int
    allocated: bool


@dataclass(frozen=True)
class GpuUse:
    """Some GPUs of a host as its latest heartbeat reports them: a figure is None when it
    was not read for every one of them (GpuUsage.unread)."""

    util_pct: float | None  # the mean of theirs
    mem_used_mb: int | None  # in all
    at: float  # the heartbeat's time (the agent's clock)


@dataclass(frozen=True)
class GpuDevice:
    """One GPU of a host as placement holds it: `share_allocated` thousandths of it are
    allocated (1000 when a task holds it whole), `mem_allocated_mb` of its memory to
    shared tasks, by `tasks` tasks; a GPU in MIG mode (`mig_mode`) lists its instances."""

    index: int
    model: str
    memory_mb: int
    uuid: str
    healthy: bool
    share_allocated: int
    mem_allocated_mb: int
    tasks: int
    whole: bool
    mig: tuple[MigDevice, ...]
    fault: str | None = None  # what its agent reported when it faulted (healthy False)
    mig_mode: bool = False
    # Its telemetry in the host's latest heartbeat; None: not read (GpuUsage.unread), or
    # not reported.
    util_pct: float | None = None
    mem_used_mb: int | None = None
    temp_c: float | None = None
    power_w: float | None = None


def gpu_devices(hb: Heartbeat, tasks: Iterable[Any]) -> list[GpuDevice]:
    """Every GPU of a host with what its allocation's `tasks` hold of it."""
    share: dict[int, int] = {}
    mem: dict[int, int] = {}
    count: dict[int, int] = {}
    whole: set[int] = set()
    mig_used: set[str] = set()
    for t in tasks:
        mig_used.update(t.mig)
        for i in t.gpu_indices:
            count[i] = count.get(i, 0) + 1
            if t.gpu_share:
                share[i] = share.get(i, 0) + t.gpu_share
                mem[i] = mem.get(i, 0) + t.gpu_memory_mb
            else:
                whole.add(i)
    usage = {u.index: u for u in hb.gpu_usage}
    bad = {u.index: u.fault for u in hb.gpu_usage if not u.healthy}
    mig_parent = {m.uuid: g.index for g in hb.gpus for m in g.mig}
    for u in mig_used:
        if u in mig_parent:
            count[mig_parent[u]] = count.get(mig_parent[u], 0) + 1
    return [GpuDevice(index=g.index, model=g.model, memory_mb=g.memory_mb, uuid=g.uuid, healthy=g.index not in bad,
                      share_allocated=1000 if g.index in whole else share.get(g.index, 0),
                      mem_allocated_mb=mem.get(g.index, 0), tasks=count.get(g.index, 0), whole=g.index in whole,
                      mig=tuple(MigDevice(m.uuid, m.profile, m.memory_mb, m.uuid in mig_used) for m in g.mig),
                      fault=(bad[g.index] or "unhealthy") if g.index in bad else None,
                      mig_mode=g.in_mig_mode(), **_telemetry(usage.get(g.index)))
            for g in sorted(hb.gpus, key=lambda g: g.index)]


def _telemetry(u: GpuUsage | None) -> dict[str, Any]:
    if u is None:
        return {}
    return {"util_pct": u.util_read, "mem_used_mb": u.mem_used_read, "temp_c": u.temp_read, "power_w": u.power_read}


def mean_util(utils: Iterable[float | None]) -> float | None:
    """The mean of the utilisations read, to 0.1 %; None when none was (an unread one is
    unknown, not 0: it is left out)."""
    read = [u for u in utils if u is not None]
    return round(sum(read) / len(read), 1) if read else None


@dataclass(frozen=True)
class HostQuery:
    """Hosts matching every given field. `search` is a case-insensitive part of the id;
    `label` is `key` (any value) or `key=value`; `cordoned` counts draining hosts as
    cordoned; `gpu_faults`: hosts with (True) or without (False) a faulted GPU; `pressure`:
    hosts whose agent asks for no new work (True: `Heartbeat.pressure`) or not."""

    search: str | None = None
    health: frozenset[str] | None = None
    rack: str | None = None
    zone: str | None = None
    model: str | None = None
    label: str | None = None
    cordoned: bool | None = None
    draining: bool | None = None
    drain_scheduled: bool | None = None
    gpu_faults: bool | None = None
    pressure: bool | None = None

    def matches_static(self, r: HostRow) -> bool:
        if self.search and self.search.lower() not in r.id.lower():
            return False
        if self.rack is not None and r.labels.get("rack") != self.rack:
            return False
        if self.zone is not None and r.labels.get("zone") != self.zone:
            return False
        if self.model is not None and self.model not in r.models:
            return False
        if self.label is not None:
            k, eq, v = self.label.partition("=")
            if k not in r.labels or (eq and r.labels[k] != v):
                return False
        if self.cordoned is not None and r.cordoned != self.cordoned:
            return False
        if self.gpu_faults is not None and (r.gpus_unhealthy > 0) != self.gpu_faults:
            return False
        if self.pressure is not None and bool(r.pressure) != self.pressure:
            return False
        if self.drain_scheduled is not None and bool(r.drain_at) != self.drain_scheduled:
            return False
        return self.draining is None or r.draining == self.draining


@dataclass(frozen=True)
class Order:
    """A host ordering: rows in id order, then stably sorted by `key` (so ties stay in id
    order), reversed when `reverse`. `live` when the key reads live figures."""

    key: Callable[[HostRow], Any]
    reverse: bool = False
    live: bool = False


ORDERS: dict[str, Order] = {
    "id": Order(lambda r: r.id),
    "-id": Order(lambda r: r.id, reverse=True),
    "health": Order(lambda r: HEALTH_RANK.get(r.health, 3), live=True),
    "-health": Order(lambda r: HEALTH_RANK.get(r.health, 3), reverse=True, live=True),
    "util": Order(lambda r: r.gpu_util_pct if r.gpus and r.gpu_util_pct is not None else -1.0, live=True),
    "-util": Order(lambda r: r.gpu_util_pct if r.gpus and r.gpu_util_pct is not None else -1.0, reverse=True,
                   live=True),
    "alloc": Order(lambda r: (r.gpus_allocated, r.gpus)),
    "-alloc": Order(lambda r: (r.gpus_allocated, r.gpus), reverse=True),
    "free": Order(lambda r: -r.gpus_free),
    "last_seen": Order(lambda r: -round(r.last_seen, 6), live=True),
}


@dataclass
class RackSummary:
    rack: str
    hosts: int = 0
    gpu_hosts: int = 0
    util_hosts: int = 0  # GPU hosts with a mean utilisation (HostRow.gpu_util_pct)
    util_sum: float = 0.0
    gpus: int = 0
    gpus_allocated: int = 0
    gpus_unhealthy: int = 0
    lost: int = 0
    suspect: int = 0
    cordoned: int = 0

    @property
    def util(self) -> float | None:
        return self.util_sum / self.util_hosts if self.util_hosts else None


@dataclass
class FleetSummary:
    """The fleet's totals in one pass over the rows. GPU, CPU and memory totals and
    utilization count hosts whose heartbeat key is live (a LOST host counts for nothing
    but its health and `gpus_allocated_lost`; a rack's cell likewise), utilization only
    those with a mean (`util_hosts`: a host none of whose GPUs' utilization was read has
    none); `by_model` and `by_gpu_rack` are [GPUs, allocated, healthy] (healthy: on a
    HEALTHY host, no fault);
    `racks` (every host, by its `rack` label, "" without one) feed the heat map.
    `gpus_free` counts only what a job could be given now: GPUs with no fault and nothing
    allocated on HEALTHY hosts that are not cordoned, draining, leaving or under pressure."""

    health: dict[str, int] = field(default_factory=lambda: {h.value: 0 for h in Health})
    hosts: int = 0
    cordoned: int = 0
    draining: int = 0
    simulated: int = 0
    gpus_total: int = 0
    gpus_allocated: int = 0
    gpus_unhealthy: int = 0
    gpus_free: int = 0
    gpus_unavailable: int = 0  # neither allocated nor free, on hosts whose key is live
    gpus_allocated_lost: int = 0  # allocated on LOST hosts (their work not yet replaced)
    gpu_hosts: int = 0
    util_hosts: int = 0  # GPU hosts with a mean utilisation (HostRow.gpu_util_pct)
    util_sum: float = 0.0
    cpus: int = 0
    cpu_used: float = 0.0
    cpu_allocated: float = 0.0
    memory_mb: int = 0
    mem_used_mb: int = 0
    mem_allocated: int = 0
    by_model: dict[str, list[int]] = field(default_factory=dict)
    by_gpu_rack: dict[str, list[int]] = field(default_factory=dict)
    racks: dict[str, RackSummary] = field(default_factory=dict)
    zones: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    @property
    def gpu_util(self) -> float | None:
        return self.util_sum / self.util_hosts if self.util_hosts else None

    @property
    def hosts_total(self) -> int:
        return self.hosts


@dataclass
class HostCounts:
    """Hosts by health and GPUs present and allocated, kept as records arrive (the health
    index, ClusterState's GPU counters): no pass over the hosts."""

    health: dict[str, int]
    gpus_total: int
    gpus_allocated: int

    @property
    def total(self) -> int:
        return sum(self.health.values())


class HostTable:
    """Every host's row, kept by its ClusterState (see the module docstring)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._rows: dict[str, HostRow] = {}
        self._stale: set[str] = set()

    def changed(self, host_id: str) -> None:
        """The host's heartbeat shape, allocation or settings changed."""
        self._stale.add(host_id)

    # ------------------------------------------------------------ rows

    def row(self, host_id: str, now: float) -> HostRow | None:
        """The host's row, its live figures as of local time `now`; None for a host never
        heard of (or whose key expired before any heartbeat was read)."""
        entry = self.state.hosts.get(host_id)
        if entry is None or entry.heartbeat is None:
            self._rows.pop(host_id, None)
            return None
        at = self.state.health_time(now)
        r = self._static(entry, at)
        self._live(r, entry, at)
        return r

    def gpu_use(self, host_id: str, indices: Iterable[int]) -> GpuUse | None:
        """How busy the GPUs `indices` of the host are in its latest heartbeat (a running
        attempt's, for its job's page: is it using what it holds?); None for no GPUs, a
        host never heard of or lost (its last heartbeat's figures are not now's: found by
        exploring), or a GPU its heartbeat does not report. A figure not read for one of
        them is None (a mean of the others would pass for theirs all)."""
        wanted = list(indices)
        entry = self.state.hosts.get(host_id)
        if not wanted or entry is None or entry.heartbeat is None or not entry.present:
            return None
        hb = entry.latest()
        assert hb is not None
        by_index = {u.index: u for u in hb.gpu_usage}
        got = [by_index[i] for i in wanted if i in by_index]
        if len(got) != len(wanted):
            return None
        utils = [x for u in got if (x := u.util_read) is not None]
        mems = [x for u in got if (x := u.mem_used_read) is not None]
        return GpuUse(sum(utils) / len(utils) if len(utils) == len(got) else None,
                      sum(mems) if len(mems) == len(got) else None, hb.ts)

    def devices(self, host_id: str) -> list[GpuDevice]:
        """The host's GPUs with what is allocated of each (empty for a host never heard of)."""
        entry = self.state.hosts.get(host_id)
        if entry is None or entry.heartbeat is None:
            return []
        hb = entry.latest()  # the newest telemetry, also from a heartbeat kept undecoded
        assert hb is not None
        alloc = self.state.allocs.get(host_id)
        return gpu_devices(hb, alloc.tasks if alloc is not None else ())

    def rows(self, now: float, *, live: bool = True) -> list[HostRow]:
        """Every host's row in id order; without `live`, health and usage are as last read."""
        return finish(self.rows_steps(now, live=live))

    def rows_steps(self, now: float, *, live: bool = True) -> Steps[list[HostRow]]:
        """`rows` as steps (see `Steps`)."""
        at = self.state.health_time(now)
        out: list[HostRow] = []
        hosts = self.state.hosts
        for n, host_id in enumerate(sorted(hosts), start=1):
            entry = hosts.get(host_id)
            if entry is None or entry.heartbeat is None:
                continue
            r = self._static(entry, at)
            if live:
                self._live(r, entry, at)
            out.append(r)
            if n % STEP_ROWS == 0:
                yield
        if len(self._rows) > len(hosts):
            self._rows = {k: v for k, v in self._rows.items() if k in hosts}
        return out

    def select(self, query: HostQuery | None, order: str, now: float) -> list[HostRow]:
        """The rows matching `query`, ordered by `order` (a key of ORDERS). Live figures
        are read only for what the query or the order needs, and for the rows returned
        the caller asks `refresh` of."""
        return finish(self.select_steps(query, order, now))

    def select_steps(self, query: HostQuery | None, order: str, now: float) -> Steps[list[HostRow]]:
        """`select` as steps (see `Steps`)."""
        o = ORDERS[order]
        q = query or HostQuery()
        at = self.state.health_time(now)
        hosts = self.state.hosts
        need_live = o.live or q.health is not None
        out: list[HostRow] = []
        for n, host_id in enumerate(sorted(hosts), start=1):
            if n % STEP_ROWS == 0:
                yield
            entry = hosts.get(host_id)
            if entry is None or entry.heartbeat is None:
                continue
            r = self._static(entry, at)
            if not q.matches_static(r):
                continue
            if need_live:
                self._live(r, entry, at)
                if q.health is not None and r.health not in q.health:
                    continue
            out.append(r)
        if order != "id":
            out.sort(key=o.key, reverse=o.reverse)
        return out

    def refresh(self, rows: Iterable[HostRow], now: float) -> None:
        """Bring the live figures of `rows` up to `now` (a page about to be shown)."""
        at = self.state.health_time(now)
        for r in rows:
            entry = self.state.hosts.get(r.id)
            if entry is not None:
                self._live(r, entry, at)

    def counts(self, now: float) -> HostCounts:
        idx = self.state.refresh_health(now)
        return HostCounts({h.value: idx.count(h) for h in Health}, self.state.gpus_present,
                          self.state.gpus_allocated)

    def summary(self, now: float) -> FleetSummary:
        return finish(self.summary_steps(now))

    def summary_steps(self, now: float) -> Steps[FleetSummary]:
        """`summary` as steps (see `Steps`)."""
        rows = yield from self.rows_steps(now)
        s = FleetSummary()
        zones: set[str] = set()
        models: set[str] = set()
        for r in rows:
            s.hosts += 1
            s.health[r.health] = s.health.get(r.health, 0) + 1
            s.cordoned += r.cordoned
            s.draining += r.draining
            s.simulated += r.simulated
            if r.zone:
                zones.add(r.zone)
            models.update(r.models)
            cell = s.racks.get(r.rack)
            if cell is None:
                cell = s.racks[r.rack] = RackSummary(r.rack)
            cell.hosts += 1
            cell.cordoned += r.cordoned
            if r.health == Health.LOST.value:
                # Its GPUs, their use and its last utilization count for nothing (found by
                # exploring: the overview said "8 of 4 GPUs allocated" while work stayed
                # allocated on a lost host); what its work still holds is said apart.
                cell.lost += 1
                s.gpus_allocated_lost += r.gpus_allocated
                continue
            if r.health == Health.SUSPECT.value:
                cell.suspect += 1
            # A host whose key is live:
            if r.gpus:
                s.gpu_hosts += 1
                cell.gpu_hosts += 1
                if r.gpu_util_pct is not None:  # (none of its GPUs' utilisation read: left out)
                    s.util_hosts += 1
                    s.util_sum += r.gpu_util_pct
                    cell.util_hosts += 1
                    cell.util_sum += r.gpu_util_pct
            s.gpus_allocated += r.gpus_allocated
            s.gpus_unhealthy += r.gpus_unhealthy
            cell.gpus += r.gpus
            cell.gpus_allocated += r.gpus_allocated
            cell.gpus_unhealthy += r.gpus_unhealthy
            s.gpus_total += r.gpus
            s.cpus += r.cpus
            s.cpu_used += r.cpus * r.cpu_pct / 100
            s.cpu_allocated += r.cpu_allocated
            s.memory_mb += r.memory_mb
            s.mem_used_mb += r.mem_used_mb
            s.mem_allocated += r.mem_allocated
            healthy_host = r.health == Health.HEALTHY.value
            free = r.gpus_free if healthy_host and not (r.cordoned or r.draining or r.leaving or r.pressure) else 0
            s.gpus_free += free
            s.gpus_unavailable += r.gpus - r.gpus_allocated - free
            by_rack = s.by_gpu_rack.get(r.rack or NO_RACK)
            if by_rack is None:
                by_rack = s.by_gpu_rack[r.rack or NO_RACK] = [0, 0, 0]
            for model, n, allocated, unhealthy in r.gpus_by_model:
                m = s.by_model.get(model)
                if m is None:
                    m = s.by_model[model] = [0, 0, 0]
                healthy = n - unhealthy if healthy_host else 0
                m[0] += n
                m[1] += allocated
                m[2] += healthy
                by_rack[0] += n
                by_rack[1] += allocated
                by_rack[2] += healthy
        s.zones = sorted(zones)
        s.models = sorted(models)
        return s

    # ------------------------------------------------------------ building

    def _static(self, entry: HostEntry, at: float) -> HostRow:
        """The host's row as its records make it, at `at` (a row made before a scheduled
        drain began is made again once it has)."""
        host_id = entry.host_id
        state = self.state
        alloc = state.allocs.get(host_id)
        cfg = state.hostcfg.get(host_id)
        r = self._rows.get(host_id)
        if (r is not None and host_id not in self._stale and r._heartbeat is entry.heartbeat
                and r._alloc is alloc and r._cfg is cfg and not (r.drain_at and at >= r.drain_at)):
            return r
        self._stale.discard(host_id)
        hb = entry.heartbeat
        assert hb is not None
        # A GPU counts as allocated when any task holds it, whole, a share of it or one of
        # its MIG instances (GpuDevice says how much).
        used = host_gpus_held(alloc, hb)
        cpu_allocated, mem_allocated = 0.0, 0
        for t in alloc.tasks if alloc is not None else ():
            cpu_allocated += t.cpus
            mem_allocated += t.memory_mb
        bad = {u.index for u in hb.gpu_usage if not u.healthy}
        per_model: dict[str, list[int]] = {}
        for g in hb.gpus:
            m = per_model.get(g.model)
            if m is None:
                m = per_model[g.model] = [0, 0, 0]
            m[0] += 1
            m[1] += g.index in used
            m[2] += g.index in bad
        labels = dict(state.labels_of(host_id))
        models = tuple(sorted(per_model))
        row = HostRow(
            id=host_id, health=Health.LOST.value, present=entry.present,
            cordoned=bool(cfg and cfg.cordoned_at(at)), draining=bool(cfg and cfg.drain_begun(at)),
            drain_at=cfg.drain_at if cfg and cfg.draining and not cfg.drain_begun(at) else 0.0,
            drain_deadline=cfg.drain_deadline if cfg and cfg.draining else 0.0,
            simulated=hb.simulated, labels=labels, rack=labels.get("rack", ""), zone=labels.get("zone", ""),
            gpus=len(hb.gpus), gpu_model=",".join(models) or "-", models=models,
            gpus_by_model=tuple((k, v[0], v[1], v[2]) for k, v in per_model.items()),
            gpus_allocated=len(used), gpus_unhealthy=len(bad),
            gpus_free=sum(1 for g in hb.gpus if g.index not in used and g.index not in bad),
            gpu_util_pct=None, cpus=hb.cpus, cpu_pct=0.0, cpu_allocated=cpu_allocated, memory_mb=hb.memory_mb,
            mem_used_mb=0, mem_allocated=mem_allocated, last_seen=entry.seen_at,
            tasks=len(alloc.tasks) if alloc is not None else 0,
            isolated=hb.isolated, isolation=hb.isolation,
            fences=hb.fences, last_fence_s=hb.last_fence_s, fence_continued=hb.fence_continued,
            fence_stopped=hb.fence_stopped, leaving=hb.leaving, pressure=hb.pressure,
            operator_labels=dict(cfg.labels) if cfg is not None else {}, agent_labels=dict(hb.labels),
            _heartbeat=hb, _alloc=alloc, _cfg=cfg,
        )
        _usage_from(row, hb)
        self._rows[host_id] = row
        return row

    def _live(self, r: HostRow, entry: HostEntry, at: float) -> None:
        r.present = entry.present
        r.last_seen = entry.seen_at
        r.health = host_health(present=entry.present, last_seen=entry.seen_at, now=at,
                               interval_s=self.state.heartbeat_interval_s).value
        raw = entry.raw
        if raw is not None and raw is not r._raw:
            # Heartbeats of an unchanged shape are kept undecoded by the cluster view; their
            # usage figures are read without building models (at 50,000 hosts that churn
            # filled the collector's oldest generation). One that does not parse as this
            # host's heartbeat is decoded the validated way.
            if not _usage_from_raw(r, raw):
                hb = entry.latest()
                if hb is not None:
                    _usage_from(r, hb)
            r._raw = raw


def _usage_from(r: HostRow, hb: Heartbeat) -> None:
    r.gpu_util_pct = mean_util(u.util_read for u in hb.gpu_usage)
    r.cpu_pct = round(hb.cpu_pct, 1)
    r.mem_used_mb = hb.mem_used_mb


def _number(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"not a number: {v!r}")
    return float(v)


def _unread_util(u: dict[str, Any]) -> bool:
    """Whether a GPU usage entry of an undecoded heartbeat marks its utilisation unread
    (GpuUsage.unread; absent from older agents'); TypeError when the mark is malformed."""
    unread = u.get("unread", [])  # an older agent's has none (a review: all of theirs were decoded whole)
    if not isinstance(unread, list):
        raise TypeError(f"not a list: {unread!r}")
    return "util" in unread


def _usage_from_raw(r: HostRow, raw: bytes) -> bool:
    """Copy GPU utilisation, CPU % and memory in use from an undecoded heartbeat into `r`;
    False when it does not parse as one of this host's heartbeats."""
    try:
        d = json.loads(raw)
        if d["host_id"] != r.id:
            return False
        utils = [None if _unread_util(u) else _number(u.get("util_pct", 0.0)) for u in d.get("gpu_usage", ())]
        cpu_pct = _number(d.get("cpu_pct", 0.0))
        mem_used = d.get("mem_used_mb", 0)
        if isinstance(mem_used, bool) or not isinstance(mem_used, int):
            return False
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return False
    r.gpu_util_pct = mean_util(utils)
    r.cpu_pct = round(cpu_pct, 1)
    r.mem_used_mb = mem_used
    return True
