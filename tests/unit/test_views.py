"""The read models (server.views): one host table and one job view behind GraphQL and the
console. In-process, over a replica that was never started (its ClusterState fed by hand)."""

from __future__ import annotations

import gc
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from server.api.graphql import build_schema
from server.api.graphql.inputs import HostFilter, HostSort
from server.api.graphql.queries import HOST_ORDERS, host_key, host_query
from server.replica import Muster, ServerConfig
from server.scheduling.placement import CORDONED, NO_FREE_GPUS, NOT_HEALTHY, WRONG_MODEL, explain
from server.state.cluster import HostConfig
from server.views import jobs as job_views
from server.views.hosts import HostQuery, HostTable, finish
from tests.factories import T0, heartbeat, heartbeat_record, host_alloc, job, job_spec, task
from web.console.hosts import console_query
from wire.messages import (
    SHAPE_HEADER,
    GpuUsage,
    Heartbeat,
    JobState,
    MigInstance,
    Queue,
    ResourceQuota,
    encode,
    shape_digest,
)
from wire.records import Record


def _muster(tmp_path: Path, hosts: int, memory_mb: int = 2 * 1024 * 1024) -> tuple[Muster, list[Heartbeat]]:
    """A replica that was never started: its in-memory state holds `hosts` decoded heartbeats."""
    mu = Muster(ServerConfig(data_dir=tmp_path / "mu", heartbeat_interval_s=5.0))
    hbs = []
    for i in range(hosts):
        hb = heartbeat(f"h-{i:03d}", boot_id="b", seq=0, ts=time.time(), labels={"rack": f"r{i % 3}"}, gpus=8,
                       model="H100" if i % 2 else "A100", gpu_memory_mb=81920, util=[10.0 * g for g in range(8)],
                       cpus=192, memory_mb=memory_mb, cpu_pct=5.0, mem_used_mb=1024)
        mu.state.apply_host_record(heartbeat_record(hb, i + 1))
        hbs.append(hb)
    return mu, hbs


def _cfg(mu: Muster, host_id: str, rev: int, cfg: HostConfig) -> None:
    mu.state.apply_state_record(Record(f"hostcfg.{host_id}", rev, cfg.model_dump_json().encode()))


async def test_cluster_memory_passes_32_bit_int(tmp_path: Path) -> None:
    """Found at 2,000 simulated hosts: `cluster { memoryMb { total } }` overflowed GraphQL's Int."""
    mu, hbs = _muster(tmp_path, 1100)  # 1,100 hosts of 2 TiB: 2,306,867,200 MB > 2^31
    res = await build_schema().execute("{ cluster { memoryMb { total allocated } } }",
                                       context_value={"muster": mu, "token": None})
    assert res.errors is None, res.errors
    assert res.data["cluster"]["memoryMb"] == {"total": sum(h.memory_mb for h in hbs), "allocated": 0}
    assert sum(h.memory_mb for h in hbs) > 2**31


def test_host_cursor_keys_are_untracked_by_the_garbage_collector(tmp_path: Path) -> None:
    """A hosts query must not fill the collector's oldest generation (a full collection
    took ~2 s at 50,000 hosts): its per-host cursor keys are tuples of strings and numbers."""
    mu, _ = _muster(tmp_path, 40)
    for sort in HostSort:
        order = HOST_ORDERS[sort]
        keys = [host_key(r, order) for r in mu.hosts.select(host_query(None), order, time.time())]
        assert len(keys) == 40 and all(isinstance(k, tuple) and isinstance(k[-1], str) for k in keys)
        gc.collect()
        assert not any(gc.is_tracked(k) for k in keys), sort


def test_fleet_summary_follows_heartbeats_allocations_and_health(tmp_path: Path) -> None:
    """The table's rows are kept by the cluster view: after every change its summary equals
    that of a table built from scratch over the same state."""
    mu, hbs = _muster(tmp_path, 30)
    st = mu.state

    def fresh(now: float) -> object:
        return HostTable(st).summary(now)

    now = time.time()
    first = mu.hosts.summary(now)
    assert first == fresh(now) and first.by_model["H100"] == [120, 0, 120]
    # a GPU fault arrives (a new shape: decoded), then work is placed on a host
    bad = hbs[1].model_copy(update={"gpu_usage": [GpuUsage(index=g, healthy=g != 3) for g in range(8)]})
    st.apply_host_record(heartbeat_record(bad, 100))
    st.apply_alloc(host_alloc("h-002", [task("j", command=["x"], gpu_indices=[0, 1], cpus=4, memory_mb=100)]), 101)
    now = time.time()
    got = mu.hosts.summary(now)
    assert got == fresh(now)
    assert got.by_model["H100"][2] == 119 and got.by_model["A100"][1] == 2 and got.cpu_allocated == 4
    # Free: what a job could be given now (the faulted GPU and the 2 allocated are not).
    assert (got.gpus_free, got.gpus_unavailable) == (240 - 3, 1)
    assert mu.hosts.row("h-002", now).gpus_allocated == 2  # type: ignore[union-attr]
    # Two shares of one GPU and a whole one: the cluster's count is the hosts' (found by
    # exploring: `cluster.gpus.allocated` counted a shared GPU once per share).
    st.apply_alloc(host_alloc("h-003", [task("s1", command=["x"], gpu_indices=[5], gpu_share=300),
                                         task("s2", command=["x"], gpu_indices=[5], gpu_share=250),
                                         task("w", command=["x"], gpu_indices=[6])]), 102)
    assert mu.hosts.row("h-003", now).gpus_allocated == 2  # type: ignore[union-attr]
    assert mu.hosts.counts(now).gpus_allocated == 4 == sum(
        mu.hosts.row(h, now).gpus_allocated for h in ("h-002", "h-003"))  # type: ignore[union-attr]
    # a minute later every host is SUSPECT: none of their GPUs counts as healthy
    later = mu.hosts.summary(now + 60)
    assert later == fresh(now + 60) and later.by_model["H100"][2] == 0
    assert (later.gpus_free, later.gpus_unavailable) == (0, 240 - 4)  # none is given work while SUSPECT
    assert later.health["SUSPECT"] == 30
    # a host's key expires: it counts for nothing in the totals, but is still listed
    st.apply_host_record(Record("h-004", 102, None), now=now)
    gone = mu.hosts.summary(now)
    assert gone == fresh(now) and gone.health["LOST"] == 1 and gone.hosts == 30
    assert gone.gpus_total == 29 * 8
    # ... nor does the work still allocated there (found by exploring: "8 of 4 GPUs
    # allocated" while a lost host's work waited to be replaced), nor its last utilization.
    st.apply_alloc(host_alloc("h-004", [task("l", command=["x"], gpu_indices=[0, 1, 2])]), 103)
    held = mu.hosts.summary(now)
    assert held == fresh(now) and held.gpus_allocated == 4 and held.gpus_allocated_lost == 3
    assert mu.hosts.counts(now).gpus_allocated == 4
    lost_rack = held.racks[mu.hosts.row("h-004", now).rack]  # type: ignore[union-attr]
    assert lost_rack.lost == 1 and lost_rack.gpus_allocated == gone.racks[lost_rack.rack].gpus_allocated
    assert held.gpu_hosts == 29 and lost_rack.gpu_hosts == gone.racks[lost_rack.rack].gpu_hosts
    st.apply_host_record(heartbeat_record(hbs[4].model_copy(update={"seq": 9}), 104))  # heard again
    back = mu.hosts.summary(now)
    assert back == fresh(now) and back.gpus_allocated == 7 and back.gpus_allocated_lost == 0
    assert mu.hosts.counts(now).gpus_allocated == 7
    # A MIG instance's task holds its GPU (found by exploring: `cluster.gpus.allocated`
    # counted none): as the host's row counts it.
    migged = hbs[5].model_copy(update={"seq": 9, "gpus": [
        g.model_copy(update={"mig": [MigInstance(uuid=f"MIG-{g.index}-{k}", profile="1g.10gb", memory_mb=10_000)
                                     for k in range(3)] if g.index == 2 else []}) for g in hbs[5].gpus]})
    st.apply_host_record(heartbeat_record(migged, 105))
    st.apply_alloc(host_alloc("h-005", [task(f"m{k}", command=["x"], mig=[f"MIG-2-{k}"]) for k in range(2)]), 106)
    assert mu.hosts.row("h-005", now).gpus_allocated == 1  # type: ignore[union-attr]
    assert mu.hosts.counts(now).gpus_allocated == 8 == mu.hosts.summary(now).gpus_allocated
    # Cordoned and draining hosts' GPUs are not free (the overview said total - allocated:
    # found by exploring); a drain scheduled ahead that has not begun leaves them free.
    before = mu.hosts.summary(now)
    _cfg(mu, "h-010", 200, HostConfig(cordoned=True, reason="maint"))
    _cfg(mu, "h-011", 201, HostConfig(draining=True, drain_deadline=now + 60, reason="r"))
    _cfg(mu, "h-012", 202, HostConfig(draining=True, drain_at=now + 30, drain_deadline=now + 60, reason="r"))
    cordoned = mu.hosts.summary(now)
    assert cordoned == fresh(now)
    assert cordoned.gpus_free == before.gpus_free - 16
    assert cordoned.gpus_unavailable == before.gpus_unavailable + 16
    assert cordoned.racks["r1"].cordoned == 1 and cordoned.racks["r2"].cordoned == 1  # h-010, h-011


def test_host_rows_read_raw_heartbeats_without_decoding_them(tmp_path: Path) -> None:
    mu, hbs = _muster(tmp_path, 3)
    now = time.time()
    mu.hosts.rows(now)
    entry = mu.state.hosts["h-001"]
    decoded = entry.heartbeat
    # same shape, new figures: the server keeps it raw; the row reads its usage
    busy = hbs[1].model_copy(update={"seq": 2, "cpu_pct": 77.0, "mem_used_mb": 4096,
                                     "gpu_usage": [GpuUsage(index=g, util_pct=55.0) for g in range(8)]})
    mu.state.apply_host_record(heartbeat_record(busy, 10))
    assert entry.raw is not None
    row = mu.hosts.row("h-001", now)
    assert row is not None and (row.gpu_util_pct, row.cpu_pct, row.mem_used_mb) == (55.0, 77.0, 4096)
    assert entry.heartbeat is decoded and entry.raw is not None  # not decoded by the read model
    # one that does not parse is decoded the validated way instead: dropped, the last good one kept
    mu.state.apply_host_record(Record("h-001", 11, b'{"host_id": "h-001", "gpu_usage": 7}',
                                      {SHAPE_HEADER: shape_digest(busy)}))
    row = mu.hosts.row("h-001", now)
    assert row is not None and entry.raw is None and entry.heartbeat is decoded and row.gpu_util_pct == 35.0


def test_a_running_attempts_gpus_are_read_from_its_hosts_newest_heartbeat(tmp_path: Path) -> None:
    """HostTable.gpu_use (Attempt.gpuUtilPct, the job page): the mean utilisation of the
    GPUs asked for and their memory in use, from the newest heartbeat also when it is kept
    undecoded; none for no GPUs, an unknown host or a GPU the heartbeat does not report."""
    mu, hbs = _muster(tmp_path, 2)
    busy = hbs[1].model_copy(update={"seq": 2, "ts": hbs[1].ts + 5, "gpu_usage": [
        GpuUsage(index=g, util_pct=10.0 * g, mem_used_mb=1000 * g) for g in range(8)]})
    mu.state.apply_host_record(heartbeat_record(busy, 10))
    assert mu.state.hosts["h-001"].raw is not None  # same shape: kept raw
    use = mu.hosts.gpu_use("h-001", [2, 6])
    assert use is not None and (use.util_pct, use.mem_used_mb, use.at) == (40.0, 8000, busy.ts)
    assert mu.hosts.gpu_use("h-001", []) is None
    assert mu.hosts.gpu_use("h-001", [8]) is None
    assert mu.hosts.gpu_use("nowhere", [0]) is None
    # Lost (its key expired): its last figures are not now's (found by exploring).
    mu.state.apply_host_record(Record("h-001", 12, None), now=busy.ts + 20)
    assert not mu.state.hosts["h-001"].present and mu.hosts.gpu_use("h-001", [2, 6]) is None


async def test_each_gpus_telemetry_is_the_newest_heartbeats_also_when_kept_raw(tmp_path: Path) -> None:
    """The first version of these fields, run on a real H200, read the last heartbeat whose
    shape changed, not the newest one (kept undecoded), and showed the busy GPU idle."""
    mu, hbs = _muster(tmp_path, 2)
    busy = hbs[1].model_copy(update={"seq": 2, "gpu_usage": [
        GpuUsage(index=g, util_pct=97.0, mem_used_mb=70000 + g, temp_c=61.0, power_w=650.0) for g in range(8)]})
    mu.state.apply_host_record(heartbeat_record(busy, 10))
    assert mu.state.hosts["h-001"].raw is not None  # same shape: kept raw
    devices = mu.hosts.devices("h-001")
    assert [(d.util_pct, d.mem_used_mb, d.temp_c, d.power_w) for d in devices] == [
        (97.0, 70000 + g, 61.0, 650.0) for g in range(8)]
    res = await build_schema().execute('{ host(id: "h-001") { gpuDevices { index utilPct memUsedMb tempC powerW } } }',
                                       context_value={"muster": mu, "token": None})
    assert res.errors is None, res.errors
    assert res.data["host"]["gpuDevices"][3] == {"index": 3, "utilPct": 97.0, "memUsedMb": 70003, "tempC": 61.0,
                                                 "powerW": 650.0}


def test_an_unread_utilisation_is_left_out_of_every_mean(tmp_path: Path) -> None:
    """A GPU whose utilisation its agent could not read (GpuUsage.unread: in MIG mode) is
    unknown, not idle: the host's mean is over the others, decoded or kept raw; a host
    with none read has no mean, nor counts in its rack's and the fleet's; an attempt on it
    has no utilisation, and the GPU none of the figures not read."""
    mu, _ = _muster(tmp_path, 3)  # GPUs at 0, 10, ..., 70 %: a mean of 35
    now = time.time()
    half = heartbeat("h-000", boot_id="b", seq=1, ts=now, labels={"rack": "r0"}, gpus=8, model="A100",
                     gpu_memory_mb=81920, util=[97.0] * 4 + [0.0] * 4, cpus=192, memory_mb=2 * 1024 * 1024,
                     unread={g: ["util"] for g in range(4, 8)})
    mu.state.apply_host_record(heartbeat_record(half, 10))
    row = mu.hosts.row("h-000", now)
    assert row is not None and row.gpu_util_pct == 97.0
    raw = half.model_copy(update={"seq": 2, "gpu_usage": [u.model_copy(update={"util_pct": 90.0}) if u.index < 4
                                                          else u for u in half.gpu_usage]})
    mu.state.apply_host_record(heartbeat_record(raw, 11))
    assert mu.state.hosts["h-000"].raw is not None  # same shape: kept raw, read without decoding
    row = mu.hosts.row("h-000", now)
    assert row is not None and row.gpu_util_pct == 90.0
    none = heartbeat("h-001", boot_id="b", seq=1, ts=now, labels={"rack": "r1"}, gpus=8, model="H100",
                     gpu_memory_mb=81920, cpus=192, memory_mb=2 * 1024 * 1024,
                     unread={g: ["util", "memory", "temperature", "power"] for g in range(8)})
    mu.state.apply_host_record(heartbeat_record(none, 12))
    row = mu.hosts.row("h-001", now)
    assert row is not None and row.gpu_util_pct is None
    s = mu.hosts.summary(now)
    assert (s.gpu_hosts, s.util_hosts, s.gpu_util) == (3, 2, (90.0 + 35.0) / 2)
    assert s.racks["r1"].util is None and s.racks["r1"].gpu_hosts == 1 and s.racks["r0"].util == 90.0
    assert mu.hosts.select(None, "-util", now)[-1].id == "h-001"  # sorted as a host without GPUs
    use = mu.hosts.gpu_use("h-000", [3, 4])
    assert use is not None and use.util_pct is None and use.mem_used_mb == 0  # one of them not read
    use = mu.hosts.gpu_use("h-000", [2, 3])
    assert use is not None and use.util_pct == 90.0
    d = mu.hosts.devices("h-001")[0]
    assert (d.util_pct, d.mem_used_mb, d.temp_c, d.power_w) == (None, None, None, None)
    d = mu.hosts.devices("h-000")[5]
    assert (d.util_pct, d.mem_used_mb, d.temp_c, d.power_w) == (None, 0, 0.0, 0.0)


def test_graphql_and_console_filters_mean_the_same(tmp_path: Path) -> None:
    """Both read one table with one query type: a case-insensitive part of the id, a
    draining host counts as cordoned, a host with a faulted GPU is one with GPU faults, a
    host whose agent asks for no new work is one under pressure."""
    mu, hbs = _muster(tmp_path, 12)
    _cfg(mu, "h-003", 50, HostConfig(cordoned=True, reason="maint"))
    _cfg(mu, "h-004", 51, HostConfig(cordoned=True, draining=True, drain_deadline=time.time() + 60, reason="r"))
    _cfg(mu, "h-005", 52, HostConfig(draining=True, reason="only draining"))
    faulted = hbs[7].model_copy(update={"seq": 2, "gpu_usage": [
        GpuUsage(index=g, healthy=g != 3, fault="xid 79: GPU has fallen off the bus" if g == 3 else None)
        for g in range(8)]})
    mu.state.apply_host_record(heartbeat_record(faulted, 53))
    pressed = hbs[9].model_copy(update={"seq": 2, "pressure": "disk: less than 256 MB free in its state directory"})
    mu.state.apply_host_record(heartbeat_record(pressed, 54))
    now = time.time()

    def ids(q: HostQuery) -> list[str]:
        return [r.id for r in mu.hosts.select(q, "id", now)]

    cases = [
        (HostFilter(search="H-01"), {"q": "H-01"}),
        (HostFilter(search="-00"), {"q": "-00"}),
        (HostFilter(cordoned=True), {"cordoned": "yes"}),
        (HostFilter(cordoned=False), {"cordoned": "no"}),
        (HostFilter(rack="r1", gpu_model="H100"), {"rack": "r1", "model": "H100"}),
        (HostFilter(gpu_faults=True), {"faults": "yes"}),
        (HostFilter(gpu_faults=False, cordoned=True), {"faults": "no", "cordoned": "yes"}),
        (HostFilter(pressure=True), {"pressure": "yes"}),
        (HostFilter(pressure=False, rack="r1"), {"pressure": "no", "rack": "r1"}),
    ]
    for gql, console in cases:
        assert ids(host_query(gql)) == ids(console_query(console)), (gql, console)
    assert ids(host_query(HostFilter(search="H-01"))) == ["h-010", "h-011"]
    assert ids(host_query(HostFilter(cordoned=True))) == ["h-003", "h-004", "h-005"]
    assert ids(console_query({"cordoned": "draining"})) == ["h-004", "h-005"]
    assert ids(host_query(HostFilter(gpu_faults=True))) == ["h-007"]
    assert "h-007" not in ids(host_query(HostFilter(gpu_faults=False))) and len(ids(HostQuery(gpu_faults=False))) == 11
    assert ids(host_query(HostFilter(pressure=True))) == ["h-009"] and len(ids(HostQuery(pressure=False))) == 11


def test_why_pending_reads_the_index_and_counts_what_fresh_capacities_would(tmp_path: Path) -> None:
    """why_pending reads the capacity index in place (no copy of every host's capacity per
    request: 1.1 s p50 at 50,000 hosts); its counts are exactly those of `explain` over
    fresh capacities."""
    mu, hbs = _muster(tmp_path, 12)
    st = mu.state
    # h-001 full, h-003 cordoned, h-005 silent for a minute (SUSPECT), evens are A100.
    st.apply_alloc(host_alloc("h-001", [task("x", command=["x"], gpu_indices=list(range(8)), cpus=8, memory_mb=100)]),
                   50)
    _cfg(mu, "h-003", 51, HostConfig(cordoned=True))
    old = hbs[5].model_copy(update={"ts": time.time() - 60})
    st.apply_host_record(heartbeat_record(old, 52))
    st.hosts["h-005"].seen_at = time.time() - 60
    now = time.time()
    for spec in (job_spec("a", command=["x"], gpus=8, gpu_model="H100"),
                 job_spec("b", command=["x"], gpus=2, gpu_model="A100"),
                 job_spec("c", command=["x"], gpus=0, cpus=1000)):
        queued = job(f"q-{spec.name}", spec=spec, state=JobState.QUEUED, submitted_at=1.0)
        assert mu.jobs.why_pending(queued, now) == dict(explain(spec, st.capacities(now).values())), spec
    got = Counter(mu.jobs.why_pending(job("q", spec=job_spec("q", command=["x"], gpus=8, gpu_model="H100"),
                                          state=JobState.QUEUED, submitted_at=1.0), now))
    assert got[WRONG_MODEL] == 6 and got[NO_FREE_GPUS] == 1 and got[CORDONED] == 1 and got[NOT_HEALTHY] == 1


def test_a_job_that_could_never_run_is_told_apart_from_one_that_waits(tmp_path: Path, monkeypatch: Any) -> None:
    """The warnings a submission gets (JobView.queue_never, hosts_never_steps): a host
    busy, cordoned, silent or with a faulted GPU could still take the job once idle and
    well, and says nothing; hosts too small, of another model or without its labels do,
    counted; a gang needs as many such hosts as it has tasks; a queue whose own limits
    refuse the job on every model it could run on says so."""
    mu, hbs = _muster(tmp_path, 12)  # odd hosts H100, even A100; racks r0, r1, r2 in turn
    st = mu.state
    # The only H100 hosts of rack r1 are h-001 and h-007: one full, one cordoned with a faulted GPU.
    st.apply_alloc(host_alloc("h-001", [task("x", command=["x"], gpu_indices=list(range(8)), cpus=8, memory_mb=100)]),
                   50)
    _cfg(mu, "h-007", 51, HostConfig(cordoned=True))
    st.apply_host_record(heartbeat_record(hbs[7].model_copy(update={"gpu_usage": [
        u.model_copy(update={"healthy": u.index != 0}) for u in hbs[7].gpu_usage]}), 52))
    now = time.time()

    def warnings(name: str, queue: str = "default", **spec: Any) -> list[str]:
        j = job(name, spec=job_spec(name, command=["x"], queue=queue, **spec), state=JobState.QUEUED, submitted_at=1.0)
        return mu.jobs.queue_never(j) + finish(mu.jobs.hosts_never_steps(j, time.monotonic()))

    r1 = {"rack": "r1"}
    waiting = job("w", spec=job_spec("w", command=["x"], gpus=8, gpu_model="H100", host_labels=r1),
                  state=JobState.QUEUED, submitted_at=1.0)
    assert mu.jobs.why_pending(waiting, now).get(NO_FREE_GPUS) == 1  # busy now, and h-007 is cordoned
    assert warnings("fits-idle", gpus=8, gpu_model="H100", host_labels=r1) == []
    assert warnings("too-big", gpus=16) == [
        "no host could run it even idle (of 12 known: 12 hosts: not enough GPUs on host); it waits for one that can"]
    assert warnings("cpus", cpus=1000) == [
        "no host could run it even idle (of 12 known: 12 hosts: not enough CPUs on host); it waits for one that can"]
    assert warnings("gang", gpus=8, gpu_model="H100", host_labels=r1, replicas=3) == [
        "the 12 hosts known could run at most 2 of its 3 tasks even idle (on 2 of them; the others take none: 8 "
        "hosts: host lacks a required label, 2 hosts: wrong GPU model); it waits for more"]
    assert warnings("gang2", gpus=8, gpu_model="H100", host_labels=r1, replicas=2) == []
    # Hosts the job excludes are counted as hosts that never take it: a gang of two on r1's
    # two H100 hosts that excludes one of them could never run whole.
    assert warnings("gang2-x", gpus=8, gpu_model="H100", host_labels=r1, replicas=2, exclude_hosts=["h-007"]) == [
        "the 12 hosts known could run at most 1 of its 2 tasks even idle (on 1 of them; the others take none: 8 "
        "hosts: host lacks a required label, 2 hosts: wrong GPU model, 1 host: host excluded by the job); it waits "
        "for more"]
    assert warnings("fits-idle-x", gpus=8, gpu_model="H100", host_labels=r1, exclude_hosts=["h-001"]) == []
    # A gang's tasks share a host where they fit, as they are placed: 8 of 2 GPUs on the two.
    assert warnings("gang8", gpus=2, gpu_model="H100", host_labels=r1, replicas=8) == []
    assert warnings("gang9", gpus=2, gpu_model="H100", host_labels=r1, replicas=9) == [
        "the 12 hosts known could run at most 8 of its 9 tasks even idle (on 2 of them; the others take none: 8 "
        "hosts: host lacks a required label, 2 hosts: wrong GPU model); it waits for more"]
    # In one rack (sameRack): rack r1 has 2 H100 hosts, r0 and r2 2 each as well; 4 tasks
    # of 8 GPUs fit no rack, and the best rack is told.
    assert warnings("racked", gpus=8, gpu_model="H100", replicas=4, same_rack=True) == [
        "the 12 hosts known could run at most 2 of its 4 tasks in rack r2 even idle (on 2 of them; the others "
        "take none: 6 hosts: wrong GPU model); it waits for more"]
    assert warnings("racked2", gpus=8, gpu_model="H100", replicas=2, same_rack=True) == []
    # Of one model (sameModel): 6 hosts of each, so 7 tasks of 8 GPUs fit neither alone.
    assert warnings("mixed", gpus=8, gpu_models=["A100", "H100"], replicas=7) == []
    assert warnings("one-model", gpus=8, gpu_models=["A100", "H100"], replicas=7, same_model=True) == [
        "the 12 hosts known could run at most 6 of its 7 tasks of model H100 even idle (on 6 of them); it waits "
        "for more"]
    # A queue whose own limits refuse the job on every model it could run on.
    st.apply_state_record(Record("queue.t", 60, encode(Queue(name="t", quota={
        "gpu:H100": ResourceQuota(nominal=8.0), "gpu:A100": ResourceQuota(nominal=2.0)}))))
    assert warnings("q-ok", "t", gpus=4) == []  # on H100
    assert warnings("q-big", "t", gpus=9) == [
        "queue t can never admit it: gpu:H100: 0 held + 9 wanted > 8, its nominal quota (no cohort)",
        "no host could run it even idle (of 12 known: 12 hosts: not enough GPUs on host); it waits for one that can"]
    st.apply_state_record(Record("queue.u", 61, encode(Queue(name="u", cohort="c", quota={
        "gpu:H100": ResourceQuota(nominal=4.0, borrowing_limit=2.0)}))))
    assert warnings("u-ok", "u", gpus=6, gpu_model="H100") == []
    assert warnings("u-big", "u", gpus=7, gpu_model="H100") == [
        "queue u can never admit it: gpu:H100: 0 held + 7 wanted > 6, its nominal quota 4 + borrowing limit 2"]
    # What the hosts said is kept per shape of job while the hosts known are as many; a
    # host that could take it, joining, is heard of at once.
    big = heartbeat("h-big", gpus=16, model="H100", cpus=192, memory_mb=2 * 1024 * 1024, ts=time.time())
    st.apply_host_record(heartbeat_record(big, 70))
    assert warnings("too-big", gpus=16) == []
    # A pass over many hosts is made in steps: it yields after the first ones.
    monkeypatch.setattr(job_views, "NEVER_FIRST_ROWS", 2)
    steps = mu.jobs.hosts_never_steps(job("z", spec=job_spec("z", command=["x"], gpus=32), state=JobState.QUEUED,
                                          submitted_at=1.0), time.monotonic())
    next(steps)
    assert finish(steps) == [
        "no host could run it even idle (of 13 known: 13 hosts: not enough GPUs on host); it waits for one that can"]


async def test_warnings_asked_for_a_batch_of_one_shape_cost_one_pass(tmp_path: Path, monkeypatch: Any) -> None:
    """Reads.never_runs: a pass that goes past its first step is one at a time, so the
    many jobs of one request (`submitJobs`, an array) that no host can take pay for one
    pass over the hosts; the others read what it found."""
    import asyncio

    from server.api.reads import Reads

    mu, _hbs = _muster(tmp_path, 12)
    monkeypatch.setattr(job_views, "NEVER_FIRST_ROWS", 2)
    reads = Reads(mu)
    jobs = [job(f"b{i}", spec=job_spec(f"b{i}", command=["x"], gpus=16), state=JobState.QUEUED, submitted_at=1.0)
            for i in range(20)]
    said = await asyncio.gather(*(reads.never_runs(j) for j in jobs))
    assert said == [["no host could run it even idle (of 12 known: 12 hosts: not enough GPUs on host); it waits for "
                     "one that can"]] * 20
    assert reads.passes == 1
    # A job a host can take is answered in the first step, without a pass.
    assert await reads.never_runs(job("s", spec=job_spec("s", command=["x"], gpus=1), state=JobState.QUEUED,
                                      submitted_at=1.0)) == []
    assert reads.passes == 1


async def test_a_fence_shows_in_the_host_row_and_graphql_and_is_noticed_once(tmp_path: Path) -> None:
    """The agent's fence counters are part of the heartbeat's shape only once it fenced
    (a host that never did keeps its digest), so the server decodes the heartbeat that
    first carries a fence and notices it once; an agent restarted (counters from zero) is
    no fence, and its next fence is noticed against the zeros."""
    from server.health.monitor import fence_alert

    mu, hbs = _muster(tmp_path, 1)
    notices: list[object] = []
    mu.state.listeners.append(lambda kind, obj: notices.append(obj) if kind == "host_fenced" else None)
    hb0 = hbs[0]
    assert shape_digest(hb0.model_copy(update={"seq": 5, "cpu_pct": 50.0})) == shape_digest(hb0)
    fenced = hb0.model_copy(update={"seq": 6, "fences": 1, "last_fence_s": 6.5, "fence_continued": 2})
    assert shape_digest(fenced) != shape_digest(hb0)
    mu.state.apply_host_record(heartbeat_record(fenced, 10))
    mu.state.apply_host_record(heartbeat_record(fenced.model_copy(update={"seq": 7}), 11))  # same counters
    assert len(notices) == 1
    host_id, hb, before = notices[0]  # type: ignore[misc]
    ev = fence_alert(host_id, hb, before, now=1.0)
    assert ev.kind == "host.fenced" and ev.host_id == "h-000"
    assert ev.data == {"labels": {"rack": "r0"}, "fences": 1, "last_fence_s": 6.5, "continued": 2, "stopped": 0}
    row = mu.hosts.row("h-000", time.time())
    assert row is not None and (row.fences, row.last_fence_s, row.fence_continued, row.fence_stopped) == (1, 6.5, 2, 0)
    res = await build_schema().execute('{ host(id: "h-000") { fences lastFenceSeconds fenceContinued fenceStopped } }',
                                       context_value={"muster": mu, "token": None})
    assert res.errors is None, res.errors
    assert res.data["host"] == {"fences": 1, "lastFenceSeconds": 6.5, "fenceContinued": 2, "fenceStopped": 0}

    restarted = hb0.model_copy(update={"seq": 1})
    mu.state.apply_host_record(heartbeat_record(restarted, 12))
    again = restarted.model_copy(update={"seq": 2, "fences": 1, "last_fence_s": 20.0, "fence_stopped": 3})
    mu.state.apply_host_record(heartbeat_record(again, 13))
    assert len(notices) == 2
    ev = fence_alert(*notices[1], now=2.0)  # type: ignore[misc]
    assert (ev.data["fences"], ev.data["continued"], ev.data["stopped"]) == (1, 0, 3)
    assert "20.0 s" in ev.message


def test_many_fences_noticed_together_make_one_alert() -> None:
    """A NATS node's loss can fence most of the fleet at once: past a handful of fences
    in one check, one alert stands for them all, naming the first hosts."""
    from server.health.alertsummary import ALERT_HOSTS_NAMED, ALERTS_ONE_BY_ONE
    from server.health.monitor import fence_alerts, fences_alert

    before = heartbeat("h", boot_id="b")
    fenced = [(f"h-{i:02d}", before.model_copy(update={"host_id": f"h-{i:02d}", "fences": 1, "last_fence_s": 5.0 + i,
                                                        "fence_continued": 2, "fence_stopped": i % 2}), before)
              for i in range(30)]
    ev = fences_alert(fenced, now=1.0)
    assert ev.kind == "host.fenced" and ev.host_id is None
    assert ev.data["hosts"] == 30 and ev.data["host_ids"] == [f"h-{i:02d}" for i in range(ALERT_HOSTS_NAMED)]
    assert (ev.data["fences"], ev.data["continued"], ev.data["stopped"], ev.data["last_fence_s"]) == (30, 60, 15, 34.0)
    assert ev.message.startswith("30 hosts fenced") and "and 10 more" in ev.message
    assert fence_alerts(fenced, now=1.0) == [ev]
    few = fence_alerts(fenced[:ALERTS_ONE_BY_ONE], now=1.0)
    assert [e.host_id for e in few] == [f"h-{i:02d}" for i in range(ALERTS_ONE_BY_ONE)]


async def test_a_job_is_listed_before_history_has_written_it(tmp_path: Path) -> None:
    """Found by hand: `muster job submit` then `muster job list` did not show the job, for
    lists were history's rows only and the historian writes a moment later. The first
    page newest first (GraphQL `jobs`, the console's jobs list) puts the live jobs
    history has not written yet on top, filtered like the rows."""
    from server.history.database import History
    from web.console.jobs import PER_PAGE

    mu = Muster(ServerConfig(data_dir=tmp_path / "mu"))
    mu.history = mu.jobs.history = History(f"sqlite:///{tmp_path / 'h.db'}")
    # Recorded: three older jobs; live only: two newer (one in queue b), and a recorded
    # one whose live record is newer (it is shown once, as live).
    for i in range(3):
        j = job(f"old{i}", submitted_at=T0 + i, spec=job_spec(f"old{i}", user="u"))
        mu.history.record(j, i + 1)
        mu.state.apply_job(j, i + 1)
    mu.history.flush()
    mu.state.apply_job(job("old2", state=JobState.RUNNING, submitted_at=T0 + 2, spec=job_spec("old2", user="u")), 9)
    mu.state.apply_job(job("new0", submitted_at=T0 + 10, spec=job_spec("new0", user="u")), 10)
    mu.state.apply_job(job("new1", submitted_at=T0 + 11, spec=job_spec("new1", user="v", queue="b")), 11)

    async def ids(args: str = "") -> tuple[list[str], int, bool]:
        res = await build_schema().execute(
            f"{{ jobs{args} {{ totalCount edges {{ node {{ id state }} }} pageInfo {{ hasNextPage }} }} }}",
            context_value={"muster": mu, "token": None})
        assert res.errors is None, res.errors
        conn = res.data["jobs"]
        return [e["node"]["id"] for e in conn["edges"]], conn["totalCount"], conn["pageInfo"]["hasNextPage"]

    assert await ids() == (["new1", "new0", "old2", "old1", "old0"], 5, False)
    assert await ids("(first: 2)") == (["new1", "new0"], 5, True)
    assert await ids('(filter: {user: "u"})') == (["new0", "old2", "old1", "old0"], 4, False)
    assert await ids('(filter: {queue: "b"})') == (["new1"], 1, False)
    # History's row of old2 says QUEUED yet; its live record says RUNNING: it is listed among
    # the RUNNING jobs, and not among the QUEUED ones, where history still counts it.
    assert await ids("(state: QUEUED)") == (["new1", "new0", "old1", "old0"], 4, False)
    assert await ids("(state: RUNNING)") == (["old2"], 1, False)
    assert await ids('(filter: {namePrefix: "new"})') == (["new1", "new0"], 2, False)
    # A later page (a cursor) is history's alone: the next page after the fresh ones goes on
    # with the rows.
    first, _, _ = await ids("(first: 2)")
    res = await build_schema().execute("{ jobs(first: 2) { pageInfo { endCursor } } }",
                                       context_value={"muster": mu, "token": None})
    cursor = res.data["jobs"]["pageInfo"]["endCursor"]
    assert (await ids(f'(first: 2, after: "{cursor}")'))[0] == ["old2", "old1"]
    # Every page, one job a page: each job once, the unrecorded ones included wherever they
    # fall (past the first page they used to be left out: a page after an unrecorded job's
    # cursor went on with history's rows alone, and the first page said there was no next).
    walked: list[str] = []
    after = ""
    for _ in range(10):
        res = await build_schema().execute(
            f"{{ jobs(first: 1{after}) {{ edges {{ node {{ id }} }} pageInfo {{ hasNextPage endCursor }} }} }}",
            context_value={"muster": mu, "token": None})
        assert res.errors is None, res.errors
        page = res.data["jobs"]
        walked += [e["node"]["id"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = f', after: "{page["pageInfo"]["endCursor"]}"'
    assert walked == ["new1", "new0", "old2", "old1", "old0"], walked
    mu.state.apply_job(job("new2", submitted_at=T0 + 12, spec=job_spec("new2", user="u")), 12)
    assert await ids("(first: 2)") == (["new2", "new1"], 6, True)  # three unrecorded, two shown: more
    # The console's list: the same jobs on its first page.
    shown = mu.jobs.unrecorded(mu.history.list_jobs(limit=PER_PAGE)[0], PER_PAGE)
    assert [j.id for j in shown[0]] == ["new2", "new1", "new0"] and shown[1] == 3
    mu.history.close()


async def test_a_page_whose_rows_are_all_left_out_still_leads_to_the_next(tmp_path: Path) -> None:
    """Found by exploring: a page of `jobs(state: QUEUED)` whose history rows' live records
    had all moved on (RUNNING, history not written yet) had no edges and said
    `hasNextPage: true` with `endCursor: null`, so a client could not go on. The rows after
    them fill the page; past a few reads, the page ends at the last row read."""
    from server.api.graphql.queries import JOB_PAGE_READS
    from server.history.database import History

    mu = Muster(ServerConfig(data_dir=tmp_path / "mu"))
    mu.history = mu.jobs.history = History(f"sqlite:///{tmp_path / 'h.db'}")
    stale = 2 * JOB_PAGE_READS + 1  # more than one page's reads of `first: 1` can pass
    total = stale + 3
    for i in range(total):
        j = job(f"j{i:02d}", submitted_at=T0 + i, spec=job_spec(f"j{i:02d}", user="u", priority=i % 2))
        mu.history.record(j, i + 1)
        mu.state.apply_job(j, i + 1)
    mu.history.flush()
    # The newest were placed since; history has not written that yet.
    for i in range(total - stale, total):
        mu.state.apply_job(job(f"j{i:02d}", state=JobState.RUNNING, submitted_at=T0 + i,
                               spec=job_spec(f"j{i:02d}", user="u", priority=i % 2)), 100 + i)
    queued = {"j00", "j01", "j02"}
    for sort in ("SUBMITTED_AT_DESC", "SUBMITTED_AT_ASC", "PRIORITY_DESC", "PRIORITY_ASC"):
        for first in (1, 2, 5):
            walked: list[str] = []
            after = ""
            for _ in range(total + 2):
                res = await build_schema().execute(
                    f"{{ jobs(state: QUEUED, first: {first}, sort: {sort}{after}) {{ edges {{ node {{ id }} }} "
                    "pageInfo { hasNextPage endCursor } } }", context_value={"muster": mu, "token": None})
                assert res.errors is None, res.errors
                page = res.data["jobs"]
                walked += [e["node"]["id"] for e in page["edges"]]
                if not page["pageInfo"]["hasNextPage"]:
                    break
                assert page["pageInfo"]["endCursor"], (sort, first, walked)
                after = f', after: "{page["pageInfo"]["endCursor"]}"'
            else:
                raise AssertionError(f"{sort} first {first}: no last page")
            assert sorted(walked) == sorted(queued), (sort, first, walked)
    # Newest first, a page of 5 reads past every row left out at once.
    res = await build_schema().execute(
        "{ jobs(state: QUEUED, first: 5) { edges { node { id } } pageInfo { hasNextPage } } }",
        context_value={"muster": mu, "token": None})
    assert [e["node"]["id"] for e in res.data["jobs"]["edges"]] == ["j02", "j01", "j00"]
    assert res.data["jobs"]["pageInfo"]["hasNextPage"] is False
    mu.history.close()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["H100", "A100"]), st.sampled_from([8, 32, 64]),
                          st.sampled_from([16_000, 256_000]), st.sampled_from(["r0", "r1", ""])),
                min_size=1, max_size=6),
       st.integers(0, 8), st.sampled_from([None, ("H100",), ("A100",), ("A100", "H100")]),
       st.sampled_from([1.0, 12.0, 40.0]), st.sampled_from([1_000, 100_000]), st.integers(1, 6), st.booleans(),
       st.booleans())
def test_warned_exactly_when_an_idle_fleet_could_not_place_it(hosts: list[tuple[int, str, int, int, str]], gpus: int,
                                                             models: tuple[str, ...] | None, cpus: float,
                                                             memory_mb: int, replicas: int, same_rack: bool,
                                                             same_model: bool) -> None:
    """On a fleet running nothing, the hosts' warning (hosts_never_steps) is given exactly
    when the planner's Placer cannot place the job (a gang: all its tasks at once, in one
    rack with sameRack, of one model of several with sameModel)."""
    from server.scheduling.capacity import Placer
    from server.state.cluster import ClusterState
    from server.views.jobs import JobView

    state = ClusterState(heartbeat_interval_s=1e9)
    for i, (n, m, c, mem, rack) in enumerate(hosts):
        state.apply_host_record(heartbeat_record(f"h{i}", i + 1, shape=False, ts=T0, gpus=n, model=m, cpus=c,
                                                 memory_mb=mem, labels={"rack": rack} if rack else {}), now=T0)
    spec = job_spec("p", command=["x"], gpus=gpus, gpu_models=list(models) if gpus and models else None, cpus=cpus,
                    memory_mb=memory_mb, replicas=replicas, same_rack=same_rack, same_model=same_model)
    queued = job("p", spec=spec, state=JobState.QUEUED, submitted_at=T0)
    warned = finish(JobView(state, None).hosts_never_steps(queued, 0.0)) != []
    placer = Placer(state.index, lambda h: True)
    placed = placer.place_gang(spec) if replicas > 1 else placer.place(spec)
    event(f"warned={warned} gang={replicas > 1}")
    assert warned == (placed is None), (hosts, spec)


async def test_leadership_names_no_leader_once_the_lease_has_not_been_renewed_within_its_ttl(tmp_path: Path) -> None:
    """While no replica led (a leader frozen, NATS without a quorum), `leadership.leader`
    and the console went on naming the last holder (found by exploring an HA cluster)."""
    mu, _ = _muster(tmp_path, 1)
    query = "{ cluster { leadership { leader role } } }"

    async def leader() -> str:
        res = await build_schema().execute(query, context_value={"muster": mu, "token": None})
        assert res.errors is None, res.errors
        return res.data["cluster"]["leadership"]["leader"]

    mu.state.apply_state_record(Record("lease", 7, b"replica-a"))
    assert mu.leader == "replica-a" and await leader() == "replica-a"
    seen, ttl = mu.state.lease_seen_at, mu.config.lease_ttl_s
    assert mu.leader_at(seen + ttl + 0.9) == "replica-a"  # within the TTL and a second: still named
    assert mu.leader_at(seen + ttl + 1.1) == ""
    mu.state.lease_seen_at -= ttl + 60.0  # long past it (the clock is real here: no boundary)
    assert mu.leader == "" and await leader() == ""
    mu.state.apply_state_record(Record("lease", 8, b"replica-b"))  # a renewal, or a new holder
    assert await leader() == "replica-b"
    mu.state.apply_state_record(Record("lease", 9, None))  # the key expired: its marker
    assert await leader() == ""


async def test_a_host_under_pressure_is_shown_so_and_its_gpus_are_not_free(tmp_path: Path) -> None:
    """Heartbeat.pressure (its disk nearly full): a new shape (decoded, not taken as
    liveness alone), the host's capacity passed over by placement, its row and GraphQL say
    why, and its GPUs are not counted free."""
    mu, hbs = _muster(tmp_path, 2)
    before = mu.hosts.summary(time.time())
    pressed = hbs[1].model_copy(update={"seq": 2, "pressure": "disk: 12 MB free in its work directory /w"})
    assert shape_digest(pressed) != shape_digest(hbs[1])
    mu.state.apply_host_record(heartbeat_record(pressed, 10))
    now = time.time()
    assert mu.state.index.caps["h-001"].pressure and not mu.state.index.caps["h-000"].pressure
    row = mu.hosts.row("h-001", now)
    assert row is not None and row.pressure == "disk: 12 MB free in its work directory /w"
    assert mu.hosts.summary(now).gpus_free == before.gpus_free - 8
    res = await build_schema().execute('{ host(id: "h-001") { pressure } other: host(id: "h-000") { pressure } }',
                                       context_value={"muster": mu, "token": None})
    assert res.errors is None and res.data == {"host": {"pressure": "disk: 12 MB free in its work directory /w"},
                                               "other": {"pressure": ""}}
    # Relieved: placed on again.
    mu.state.apply_host_record(heartbeat_record(hbs[1].model_copy(update={"seq": 3}), 11))
    assert not mu.state.index.caps["h-001"].pressure


def test_an_older_agents_heartbeat_without_unread_marks_is_read_raw() -> None:
    """Found by a review: the raw read of a heartbeat (a server's fast path, no decode)
    refused every heartbeat of an agent older than GpuUsage.unread, so a fleet of them,
    as a server-first upgrade has, was decoded whole on every read."""
    import json

    from server.views.hosts import HostRow, _usage_from_raw

    hb = heartbeat("h-old", boot_id="b", seq=1, ts=1.0, gpus=2, util=[40.0, 60.0])
    d = json.loads(hb.to_json())
    for u in d["gpu_usage"]:
        del u["unread"]  # as an older agent sends it
    r = HostRow.__new__(HostRow)
    r.id = "h-old"
    assert _usage_from_raw(r, json.dumps(d).encode()) and r.gpu_util_pct == 50.0

