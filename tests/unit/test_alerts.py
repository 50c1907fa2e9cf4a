"""The leader's alerts on host health (server.health.monitor): one a host or a GPU, or
past ALERTS_ONE_BY_ONE in one check, one alert standing for them all."""

from __future__ import annotations

from server.health.alertsummary import ALERT_HOSTS_NAMED, ALERTS_ONE_BY_ONE
from server.health.monitor import gpu_alerts, host_alerts, job_failed_alerts
from wire.messages import Event, GpuUsage


def lost(host_id: str, rack: str, zone: str = "z1") -> Event:
    return Event(kind="", ts=1.0, host_id=host_id, message=f"host {host_id}: heartbeat key expired",
                 data={"labels": {"rack": rack, "zone": zone}})


def test_a_few_lost_hosts_are_alerted_one_by_one() -> None:
    events = [lost(f"h{i}", "r1") for i in range(ALERTS_ONE_BY_ONE)]
    assert host_alerts(events, 2.0, "lost") == events
    assert host_alerts([], 2.0, "lost") == []


def test_a_rack_lost_at_once_is_one_alert_counting_its_hosts_by_rack_and_zone() -> None:
    events = [lost(f"h{i:03d}", "r1" if i < 30 else "r2", "z1" if i % 2 else "z2") for i in range(40)]
    [alert] = host_alerts(events, 2.0, "lost (heartbeat keys expired)")
    assert alert.ts == 2.0 and alert.host_id is None
    assert alert.message.startswith("40 hosts lost (heartbeat keys expired): h000, h001")
    assert alert.message.endswith(f"h{ALERT_HOSTS_NAMED - 1:03d} and {40 - ALERT_HOSTS_NAMED} more")
    assert alert.data == {"hosts": 40, "host_ids": [f"h{i:03d}" for i in range(ALERT_HOSTS_NAMED)],
                          "by_rack": {"r1": 30, "r2": 10}, "by_zone": {"z1": 20, "z2": 20}}


def test_gpu_faults_are_one_alert_a_gpu_or_one_for_many_counting_each_fault() -> None:
    few = [("h1", GpuUsage(index=2, healthy=False, fault="xid 79: GPU has fallen off the bus"))]
    [one] = gpu_alerts(few, 3.0)
    assert one.kind == "gpu.unhealthy" and one.host_id == "h1" and one.data == {
        "gpu": 2, "fault": "xid 79: GPU has fallen off the bus"}
    assert one.message.startswith("GPU 2 on h1 faulted: xid 79") and "stopped and tried again elsewhere" in one.message
    many = [(f"h{i // 8}", GpuUsage(index=i % 8, healthy=False,
                                    fault="xid 79: GPU has fallen off the bus" if i < 14 else None))
            for i in range(16)]
    [alert] = gpu_alerts(many, 3.0)
    assert alert.message == "16 GPUs on 2 hosts faulted (unhealthy: 2, xid 79: 14): h0, h1"
    assert alert.data == {"hosts": 2, "host_ids": ["h0", "h1"], "gpus": 16, "faults": {"xid 79": 14, "unhealthy": 2}}


def test_jobs_failed_in_one_cycle_are_one_alert_a_job_or_one_for_many_by_queue() -> None:
    def failed(i: int) -> Event:
        return Event(kind="job.failed", ts=1.0, job_id=f"j{i:02d}", host_id="h1", message="exit code 1",
                     data={"state": "FAILED"})

    few = [failed(i) for i in range(3)]
    assert job_failed_alerts(few, {}, 2.0) == few
    many = [failed(i) for i in range(30)]
    [alert] = job_failed_alerts(many, {f"j{i:02d}": "a" if i < 25 else "b" for i in range(30)}, 2.0)
    assert alert.job_id is None and alert.host_id is None
    assert alert.message.startswith("30 jobs failed for good: j00, j01") and alert.message.endswith("and 10 more")
    assert alert.data == {"jobs": 30, "job_ids": [f"j{i:02d}" for i in range(20)], "by_queue": {"a": 25, "b": 5}}


def test_hosts_that_begin_to_take_no_new_work_are_alerted_once_each_change() -> None:
    """`host.pressure`: a host whose agent asks for no new work (its disk nearly full),
    noticed by the cluster view when its heartbeat's pressure appears or changes, not at
    each heartbeat; one alert a host, or one for many."""
    import time

    from server.health.monitor import pressure_alerts
    from server.state.cluster import ClusterState
    from tests.factories import heartbeat, heartbeat_record

    state = ClusterState(heartbeat_interval_s=5.0)
    seen: list[tuple[str, str]] = []
    state.listeners.append(lambda kind, obj: seen.append((obj[0], obj[1].pressure)) if kind == "host_pressure"
                           else None)
    t0 = time.time()
    full = "disk: less than 256 MB free in its directory for attempts"
    for rev, pressure in enumerate(("", full, full, "", full), start=1):
        hb = heartbeat("h1", seq=rev, ts=t0 + rev, labels={"rack": "r1"}).model_copy(update={"pressure": pressure})
        state.apply_host_record(heartbeat_record(hb, rev), now=t0 + rev)
    assert seen == [("h1", full), ("h1", full)]  # when it began, and began again
    [one] = pressure_alerts([("h1", state.hosts["h1"].latest())], 9.0)  # type: ignore[list-item]
    assert one.kind == "host.pressure" and one.host_id == "h1" and one.message == f"host h1 takes no new work: {full}"
    many = [(f"h{i}", heartbeat(f"h{i}", labels={"rack": "r2"}).model_copy(update={"pressure": full}))
            for i in range(ALERTS_ONE_BY_ONE + 1)]
    [alert] = pressure_alerts(many, 9.0)
    assert alert.message.startswith(f"{ALERTS_ONE_BY_ONE + 1} hosts take no new work: h0, h1")
    assert alert.data["by_rack"] == {"r2": ALERTS_ONE_BY_ONE + 1}
