"""Host health, ClusterState feeding, retry policy, and config validation."""

from __future__ import annotations

from typing import Any

import pytest

from agent.agent import AgentConfig, fence_timing, parse_labels
from server.health.rules import Health, host_health
from server.scheduling import retry
from server.scheduling.placement import NOT_HEALTHY, check
from server.state.cluster import ClusterState, HostConfig
from server.state.lease import LeaseConfig
from server.views.hosts import HostTable
from tests.factories import T0, heartbeat_record, host_alloc, job, job_spec, task
from wire.errors import ConfigError
from wire.messages import Attempt, AttemptState, Job, JobState, encode
from wire.records import Record


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __call__(self, kind: str, obj: object) -> None:
        self.calls.append((kind, obj))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.calls]


# ---------------------------------------------------------------- host_health


@pytest.mark.parametrize(
    "present, age, expected",
    [
        (True, 0.0, Health.HEALTHY),
        (True, 5.0, Health.HEALTHY),
        (True, 10.0, Health.HEALTHY),  # exactly two intervals: not yet suspect
        (True, 10.01, Health.SUSPECT),
        (True, 1000.0, Health.SUSPECT),
        (False, 0.0, Health.LOST),
        (False, 1000.0, Health.LOST),
    ],
)
def test_host_health(present: bool, age: float, expected: Health) -> None:
    assert host_health(present=present, last_seen=T0, now=T0 + age, interval_s=5.0) is expected


def test_host_health_transitions_over_time() -> None:
    seen = [host_health(present=True, last_seen=T0, now=T0 + dt, interval_s=2.0) for dt in (0, 3, 4, 4.5, 9)]
    assert seen == [Health.HEALTHY, Health.HEALTHY, Health.HEALTHY, Health.SUSPECT, Health.SUSPECT]
    # A fresh heartbeat makes it healthy again; only absence makes it LOST.
    assert host_health(present=True, last_seen=T0 + 9, now=T0 + 9, interval_s=2.0) is Health.HEALTHY
    assert host_health(present=False, last_seen=T0 + 9, now=T0 + 9, interval_s=2.0) is Health.LOST


# ---------------------------------------------------------------- ClusterState: hosts


def test_heartbeat_apply_makes_host_healthy() -> None:
    s = ClusterState(heartbeat_interval_s=5.0)
    lis = Listener()
    s.listeners.append(lis)
    s.apply_host_record(heartbeat_record("h1", 1, shape=False, labels={"rack": "r1"}), now=T0)
    assert s.health("h1", now=T0) is Health.HEALTHY
    assert s.hosts["h1"].heartbeat is not None and s.hosts["h1"].heartbeat.labels == {"rack": "r1"}
    assert s.hosts["h1"].revision == 1 and s.hosts["h1"].present
    assert lis.kinds() == ["host_up"]
    assert lis.calls[0][1].host_id == "h1"
    # Further heartbeats do not announce the host again.
    s.apply_host_record(heartbeat_record("h1", 2, shape=False, seq=2), now=T0 + 5)
    assert lis.kinds() == ["host_up"]
    assert s.hosts["h1"].heartbeat.seq == 2


def test_a_host_whose_agent_reported_its_shutdown_takes_no_work_until_a_later_agent_says_otherwise() -> None:
    """ClusterState.mark_leaving (a status report with `shutdown`): the host is not
    schedulable before its leaving heartbeat is read; a heartbeat sent before the report
    does not undo it, one from an agent started again (sent after it, not leaving) does."""
    s = ClusterState(heartbeat_interval_s=5.0)
    s.apply_host_record(heartbeat_record("h1", 1, ts=T0), now=T0)
    assert s.index.caps["h1"].schedulable
    s.mark_leaving("h1", T0 + 10)
    assert not s.index.caps["h1"].schedulable and check(job_spec("j"), s.index.caps["h1"])[0] == NOT_HEALTHY
    s.apply_host_record(heartbeat_record("h1", 2, ts=T0 + 5, seq=2, boot_id="boot-1"), now=T0 + 11)  # sent before
    assert not s.index.caps["h1"].schedulable
    s.apply_host_record(heartbeat_record("h1", 3, ts=T0 + 20, seq=1, boot_id="boot-2"), now=T0 + 20)  # a new agent
    assert s.index.caps["h1"].schedulable and s.hosts["h1"].leaving_reported is None
    s.mark_leaving("nobody", T0)  # a host never heard of: nothing to mark
    # A report stamped by an agent clock far ahead (found by exploring: the host took no work
    # until its clock passed the stamp, across restarts and a LOST): another agent's
    # heartbeat (instance or boot), or one after the key expired, ends the mark; a
    # heartbeat of the same agent, with the same shape as before, does not.
    for change in ({"instance": "another"}, {"boot_id": "boot-9"}, "expired"):
        s = ClusterState(heartbeat_interval_s=5.0)
        s.apply_host_record(heartbeat_record("h1", 1, ts=T0, instance="first"), now=T0)
        s.mark_leaving("h1", T0 + 86_400)
        s.apply_host_record(heartbeat_record("h1", 2, ts=T0 + 1, seq=2, instance="first"), now=T0 + 1)
        assert not s.index.caps["h1"].schedulable
        if change == "expired":
            s.apply_host_record(Record("h1", 3, None), now=T0 + 20)  # the key expired
            s.apply_host_record(heartbeat_record("h1", 4, ts=T0 + 60, instance="first"), now=T0 + 60)
        else:
            s.apply_host_record(heartbeat_record("h1", 3, ts=T0 + 60, **{"instance": "first", **change}),
                                now=T0 + 60)
        assert s.index.caps["h1"].schedulable and s.hosts["h1"].leaving_reported is None, change


def test_unknown_host_is_lost() -> None:
    assert ClusterState().health("nobody", now=T0) is Health.LOST


def test_stale_seen_at_makes_host_suspect() -> None:
    s = ClusterState(heartbeat_interval_s=5.0)
    s.apply_host_record(heartbeat_record("h1", 1, shape=False), now=T0)
    assert s.health("h1", now=T0 + 10) is Health.HEALTHY
    assert s.health("h1", now=T0 + 11) is Health.SUSPECT
    caps = s.capacities(now=T0 + 11)
    assert caps["h1"].schedulable is False
    # A new heartbeat refreshes seen_at.
    s.apply_host_record(heartbeat_record("h1", 2, shape=False), now=T0 + 11)
    assert s.health("h1", now=T0 + 11) is Health.HEALTHY
    assert s.capacities(now=T0 + 11)["h1"].schedulable is True


def test_a_host_whose_agent_is_leaving_takes_no_new_work_and_is_shown_leaving() -> None:
    """The agent's shutdown heartbeat (`leaving`) changes the heartbeat's shape, so the
    server decodes it although its GPUs, CPU and memory are unchanged; the host stays
    HEALTHY (it still heartbeats) but nothing is placed on it."""
    s = ClusterState(heartbeat_interval_s=5.0)
    s.apply_host_record(heartbeat_record("h1", 1), now=T0)
    assert s.capacities(now=T0)["h1"].schedulable is True
    s.apply_host_record(heartbeat_record("h1", 2, seq=2, leaving=True), now=T0 + 1)
    assert s.health("h1", now=T0 + 1) is Health.HEALTHY
    cap = s.capacities(now=T0 + 1)["h1"]
    assert cap.schedulable is False and check(job_spec(), cap)[0] == NOT_HEALTHY
    row = HostTable(s).row("h1", T0 + 1)
    assert row is not None and row.leaving
    # The agent started again: a heartbeat without the mark.
    s.apply_host_record(heartbeat_record("h1", 3, seq=1, boot_id="b2"), now=T0 + 2)
    assert s.capacities(now=T0 + 2)["h1"].schedulable is True
    row = HostTable(s).row("h1", T0 + 2)
    assert row is not None and not row.leaving


def test_tombstone_makes_host_lost_and_notifies() -> None:
    s = ClusterState()
    lis = Listener()
    s.listeners.append(lis)
    s.apply_host_record(heartbeat_record("h1", 1, shape=False), now=T0)
    s.apply_host_record(Record("h1", 2, None), now=T0 + 15)
    assert s.health("h1", now=T0 + 15) is Health.LOST
    entry = s.hosts["h1"]
    assert entry.present is False and entry.lost_at == T0 + 15 and entry.revision == 2
    assert lis.kinds() == ["host_up", "host_lost"]
    assert lis.calls[1][1] is entry
    # The last heartbeat is kept; the host is unschedulable.
    cap = s.capacities(now=T0 + 15)["h1"]
    assert cap.schedulable is False
    assert check(job_spec("j", command=["x"]), cap)[0] == NOT_HEALTHY
    # A second tombstone does not notify again.
    s.apply_host_record(Record("h1", 3, None), now=T0 + 16)
    assert lis.kinds() == ["host_up", "host_lost"]


def test_tombstone_for_unknown_host_is_harmless() -> None:
    s = ClusterState()
    lis = Listener()
    s.listeners.append(lis)
    s.apply_host_record(Record("ghost", 5, None), now=T0)
    # Recorded as lost (its revision is kept, so an older heartbeat cannot revive it),
    # without a notification and without counting as a schedulable host.
    assert s.hosts["ghost"].present is False and lis.calls == []
    assert "ghost" not in s.capacities(now=T0)
    s.apply_host_record(Record("ghost", 4, b"{}"), now=T0)
    assert s.hosts["ghost"].present is False
    assert s.health("ghost", now=T0) is Health.LOST


def test_reregistering_after_loss_is_healthy_and_host_up() -> None:
    s = ClusterState()
    lis = Listener()
    s.listeners.append(lis)
    s.apply_host_record(heartbeat_record("h1", 1, shape=False), now=T0)
    s.apply_host_record(Record("h1", 2, None), now=T0 + 15)
    s.apply_host_record(heartbeat_record("h1", 3, shape=False, seq=1), now=T0 + 20)
    assert s.health("h1", now=T0 + 20) is Health.HEALTHY
    assert s.hosts["h1"].present is True and s.hosts["h1"].lost_at is None
    assert lis.kinds() == ["host_up", "host_lost", "host_up"]


def test_absent_hosts_and_domain_sizes_follow_heartbeats() -> None:
    """What the planner's lost-host pass reads instead of walking every host: the set of
    expired hosts, and hosts per failure domain (recounted when labels change)."""
    s = ClusterState()
    s.apply_host_record(heartbeat_record("h1", 1, shape=False, labels={"rack": "r1", "zone": "z1"}), now=T0)
    s.apply_host_record(heartbeat_record("h2", 2, shape=False, labels={"rack": "r1", "zone": "z1"}), now=T0)
    s.apply_host_record(heartbeat_record("h3", 3, shape=False, labels={"rack": "r2", "zone": "z1"}), now=T0)
    s.apply_host_record(Record("gone", 4, None), now=T0)  # expired before we heard of it
    assert s.absent == {"gone"}
    assert s.domain_sizes() == {("rack", "r1"): 2, ("rack", "r2"): 1, ("zone", "z1"): 3}
    s.apply_host_record(Record("h2", 5, None), now=T0 + 15)
    assert s.absent == {"gone", "h2"}
    assert s.domain_sizes()[("rack", "r1")] == 2  # a lost host still belongs to its domains
    s.apply_host_record(heartbeat_record("h2", 6, shape=False, labels={"rack": "r2", "zone": "z1"}), now=T0 + 20)
    assert s.absent == {"gone"}
    assert s.domain_sizes() == {("rack", "r1"): 1, ("rack", "r2"): 2, ("zone", "z1"): 3}
    s.apply_host_record(heartbeat_record("h3", 7, shape=False, labels={"rack": "r2", "zone": "z1"}, seq=2),
                        now=T0 + 21)
    assert s.domain_sizes()[("rack", "r2")] == 2


def test_unheard_hosts_are_allocs_without_any_host_record() -> None:
    """The planner's other lost-host source: hosts with work but no heartbeat record at
    all (expired and removed before this server started), kept as records arrive."""
    s = ClusterState()

    def alloc(host: str, rev: int, tasks: int = 1) -> None:
        a = host_alloc(host, [task(f"j{i}", command=["x"], cpus=1, memory_mb=10) for i in range(tasks)], term=1)
        s.apply_state_record(Record(f"alloc.{host}", rev, encode(a)))

    s.apply_host_record(heartbeat_record("h1", 1, shape=False), now=T0)
    alloc("h1", 1)
    alloc("ghost", 2)
    alloc("late", 3)
    alloc("gone", 4)
    assert s.unheard == {"ghost", "late", "gone"}
    s.apply_host_record(Record("late", 5, b"{not json"), now=T0)  # dropped: still nothing heard
    assert s.unheard == {"ghost", "late", "gone"}
    s.apply_host_record(heartbeat_record("late", 6, shape=False), now=T0)
    s.apply_host_record(Record("gone", 7, None), now=T0)  # an expiry marker is a record: absent now
    assert s.unheard == {"ghost"} and s.absent == {"gone"}
    s.apply_state_record(Record("alloc.ghost", 8, None))
    assert s.unheard == set()
    alloc("h1", 9, tasks=2)  # a host already heard of never becomes unheard
    assert s.unheard == set()


def test_heartbeat_with_other_host_id_is_dropped() -> None:
    s = ClusterState()
    lis = Listener()
    s.listeners.append(lis)
    s.apply_host_record(heartbeat_record("h2", 1, key="h1", shape=False), now=T0)
    assert "h1" not in s.hosts and "h2" not in s.hosts
    assert s.dropped["heartbeat"] == 1
    assert lis.calls == []
    # Also for a known host: the held heartbeat stays (its key counts as heard: it is alive,
    # not to be taken as expired by its age).
    s.apply_host_record(heartbeat_record("h1", 2, shape=False, cpus=16), now=T0)
    s.apply_host_record(heartbeat_record("evil", 3, key="h1", shape=False, cpus=4096), now=T0 + 1)
    assert s.dropped["heartbeat"] == 2
    assert s.hosts["h1"].heartbeat.cpus == 16 and s.hosts["h1"].revision == 3 and s.hosts["h1"].seen_at == T0 + 1


def test_undecodable_heartbeat_is_dropped() -> None:
    s = ClusterState()
    s.apply_host_record(Record("h1", 1, b"{not json"), now=T0)
    s.apply_host_record(Record("h1", 2, b'{"v": 2}'), now=T0)
    assert "h1" not in s.hosts
    assert s.dropped["heartbeat"] == 2


def test_older_host_revisions_are_ignored() -> None:
    s = ClusterState()
    s.apply_host_record(heartbeat_record("h1", 5, shape=False, cpus=32), now=T0)
    s.apply_host_record(heartbeat_record("h1", 4, shape=False, cpus=8), now=T0 + 1)
    s.apply_host_record(heartbeat_record("h1", 5, shape=False, cpus=8), now=T0 + 1)
    assert s.hosts["h1"].heartbeat.cpus == 32
    assert s.hosts["h1"].seen_at == T0
    # An old tombstone does not make the host lost either.
    s.apply_host_record(Record("h1", 3, None), now=T0 + 2)
    assert s.hosts["h1"].present is True
    assert s.health("h1", now=T0 + 2) is Health.HEALTHY


def test_older_state_revisions_are_ignored() -> None:
    s = ClusterState()
    lis = Listener()
    s.listeners.append(lis)
    s.apply_state_record(Record("job.j1", 10, encode(job("j1", state=JobState.RUNNING))))
    s.apply_state_record(Record("job.j1", 9, encode(job("j1", state=JobState.QUEUED))))
    s.apply_state_record(Record("job.j1", 10, encode(job("j1", state=JobState.QUEUED))))
    assert s.jobs["j1"].state is JobState.RUNNING
    assert s.revisions["job.j1"] == 10
    assert lis.kinds() == ["job"]
    # apply_job shares the revision bookkeeping.
    s.apply_job(job("j1", spec=job_spec("j1", command=["x"]), submitted_at=0), 7)
    assert s.jobs["j1"].state is JobState.RUNNING
    s.apply_state_record(Record("job.j1", 11, None))
    assert "j1" not in s.jobs
    s.apply_state_record(Record("job.j1", 11, encode(job("j1"))))
    assert "j1" not in s.jobs


def test_state_records_alloc_hostcfg_term_lease() -> None:
    s = ClusterState()
    lis = Listener()
    s.listeners.append(lis)
    s.apply_host_record(heartbeat_record("h1", 1, shape=False, gpus=4, unhealthy=(1,), cpus=16, memory_mb=8000),
                        now=T0)
    alloc = host_alloc("h1", [task("j", command=["x"], gpu_indices=[0, 2], cpus=4, memory_mb=1000)], term=3)
    s.apply_state_record(Record("alloc.h1", 1, encode(alloc)))
    s.apply_state_record(Record("hostcfg.h1", 2, HostConfig(cordoned=True, reason="maint").model_dump_json().encode()))
    s.apply_state_record(Record("term", 42, b""))
    s.apply_state_record(Record("lease", 43, b"server-a"))
    assert s.allocs["h1"] == alloc
    assert s.hostcfg["h1"].cordoned is True
    assert s.term == 42 and s.leader == "server-a"
    assert ("hostcfg", "h1") in lis.calls
    cap = s.capacities(now=T0)["h1"]
    assert cap.cordoned is True and cap.schedulable is True
    assert cap.used_gpus == {0, 2} and cap.used_cpus == 4.0 and cap.used_memory_mb == 1000
    assert cap.unhealthy_gpus == frozenset({1})
    assert cap.free_gpus(None) == [3]
    assert (cap.cpus, cap.memory_mb) == (16.0, 8000)
    s.apply_state_record(Record("alloc.h1", 4, None))
    s.apply_state_record(Record("hostcfg.h1", 5, None))
    cap = s.capacities(now=T0)["h1"]
    assert cap.used_gpus == set() and cap.cordoned is False


def test_undecodable_state_record_is_dropped_and_counted() -> None:
    s = ClusterState()
    s.apply_state_record(Record("job.j1", 1, encode(job("j1"))))
    s.apply_state_record(Record("job.j1", 2, b"garbage"))
    s.apply_state_record(Record("alloc.h1", 3, b'{"v": 2, "host_id": "h1"}'))
    assert s.jobs["j1"].state is JobState.QUEUED
    assert "h1" not in s.allocs
    assert s.dropped["job"] == 1 and s.dropped["alloc"] == 1


def test_listener_exceptions_do_not_break_feeding() -> None:
    s = ClusterState()
    lis = Listener()

    def boom(kind: str, obj: object) -> None:
        raise RuntimeError("listener bug")

    s.listeners.extend([boom, lis])
    s.apply_host_record(heartbeat_record("h1", 1, shape=False), now=T0)
    assert "h1" in s.hosts and lis.kinds() == ["host_up"]


def test_queued_and_job_counts() -> None:
    s = ClusterState()
    s.apply_state_record(Record("job.a", 1, encode(job("a"))))
    s.apply_state_record(Record("job.b", 2, encode(job("b", state=JobState.RUNNING))))
    s.apply_state_record(Record("job.c", 3, encode(job("c"))))
    assert sorted(j.id for j in s.queued()) == ["a", "c"]
    assert s.job_counts() == {"QUEUED": 2, "RUNNING": 1}


# ---------------------------------------------------------------- retry


def test_backoff_schedule() -> None:
    assert [retry.backoff_s(n) for n in range(0, 10)] == [0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert retry.backoff_s(1000) == retry.MAX_BACKOFF_S == 60.0


def job_with_attempts(n: int, max_attempts: int = 3) -> Job:
    return job(
        "j",
        spec=job_spec("j", command=["x"], max_attempts=max_attempts),
        submitted_at=0,
        attempts=[Attempt(id=f"j.{i}", number=i, host_id="h1", state=AttemptState.LOST) for i in range(1, n + 1)],
    )


@pytest.mark.parametrize("ended", [AttemptState.LOST, AttemptState.KILLED])
def test_decide_retries_infrastructure_endings(ended: AttemptState) -> None:
    d = retry.decide(job_with_attempts(1), ended, T0)
    assert d.retry is True and d.not_before == T0
    assert d.why == f"attempt 1 {ended.value.lower()}"
    d = retry.decide(job_with_attempts(2), ended, T0)
    assert d.retry is True and d.not_before == T0 + 1
    d = retry.decide(job_with_attempts(3), ended, T0)
    assert d.retry is False and "all 3 attempts used" in d.why
    d = retry.decide(job_with_attempts(6, max_attempts=10), ended, T0)
    assert d.retry is True and d.not_before == T0 + 16


@pytest.mark.parametrize("ended", [AttemptState.FAILED, AttemptState.SUCCEEDED])
def test_decide_does_not_retry_own_endings(ended: AttemptState) -> None:
    d = retry.decide(job_with_attempts(1, max_attempts=100), ended, T0)
    assert d.retry is False and d.why == "the attempt itself failed"


def test_decide_single_attempt_job() -> None:
    assert retry.decide(job_with_attempts(1, max_attempts=1), AttemptState.LOST, T0).retry is False


# ---------------------------------------------------------------- LeaseConfig


def test_lease_config_defaults_are_valid() -> None:
    cfg = LeaseConfig()
    assert cfg.validate() is cfg
    assert LeaseConfig(ttl_s=1, renew_every_s=0.4, retry_every_s=0.1).validate().ttl_s == 1


@pytest.mark.parametrize(
    "kw",
    [
        {"ttl_s": 0},
        {"ttl_s": -5},
        {"ttl_s": 2.5},
        {"ttl_s": 3, "renew_every_s": 1.5},  # TTL must exceed twice the renew interval
        {"ttl_s": 5, "renew_every_s": 2.5},
        {"ttl_s": 5, "renew_every_s": 0},
        {"ttl_s": 5, "renew_every_s": -1},
        {"retry_every_s": 0},
        {"retry_every_s": -0.5},
    ],
)
def test_lease_config_rejects_bad_settings(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        LeaseConfig(**kw).validate()


# ---------------------------------------------------------------- agent config and labels


def agent_config(**kw: Any) -> AgentConfig:
    return AgentConfig(nats_url="nats://127.0.0.1:4222", host_id="h1", **kw)


def test_agent_config_defaults_are_valid() -> None:
    cfg = agent_config()
    assert cfg.validate() is cfg and cfg.fence_after_s == 10.0
    assert agent_config(heartbeat_interval_s=1, ttl_intervals=3, fence_after_s=2.9).validate()
    # The default delay follows the interval: an agent heartbeating every 30 s does not
    # fence itself between two heartbeats.
    assert agent_config(heartbeat_interval_s=30).validate().fence_after_s == 60.0


@pytest.mark.parametrize(
    "fence_after, ttl, grace, expected",
    [
        (10.0, 15.0, 10.0, (13.0, 14.0)),  # the defaults: frozen from 10 s, SIGTERM at 13, dead by 14
        (10.0, 15.0, 0.5, (13.5, 14.0)),  # a shorter kill grace leaves the freeze longer
        (2.0, 3.0, 2.0, (2.0, 2.2)),  # no room to freeze: SIGTERM at the fence, as before freezing
        (2.0, 10.0, 2.0, (8.0, 9.0)),
    ],
)
def test_fence_timing(fence_after: float, ttl: float, grace: float, expected: tuple[float, float]) -> None:
    """Frozen attempts get SIGTERM no earlier than the fence and are dead a second before
    the heartbeat key can expire."""
    assert fence_timing(fence_after, ttl, grace) == pytest.approx(expected)


def test_the_heartbeat_keys_ttl_is_never_shorter_than_the_agent_assumes() -> None:
    """NATS takes whole seconds: found by exploring, 0.5 s x 3 was sent as 1 s, and the key
    expired before the watchdog had stopped a frozen agent's tries."""
    from types import SimpleNamespace

    from agent.agent import Agent

    def ttl(interval: float, intervals: int) -> str:
        me = SimpleNamespace(config=SimpleNamespace(heartbeat_interval_s=interval, ttl_intervals=intervals))
        return Agent._heartbeat_ttl(me)  # type: ignore[arg-type]

    assert [ttl(5.0, 3), ttl(0.5, 3), ttl(0.2, 3), ttl(1.0, 3), ttl(0.1, 2)] == ["15s", "2s", "1s", "3s", "1s"]


def test_the_watchdog_acts_after_the_agent_and_before_the_key_expires() -> None:
    """The watchdog's SIGTERM (for an agent that is not awake) comes after the agent's own
    fence, its SIGKILL and its deadline for an awake agent after the agent's own deadline,
    and all before the key can expire."""
    from agent.agent import fence_timing, watchdog_timing

    for kw in ({}, {"heartbeat_interval_s": 1.0, "fence_after_s": 2.0, "kill_grace_s": 2.0},
               {"heartbeat_interval_s": 1.0, "ttl_intervals": 10, "fence_after_s": 2.0}):
        cfg = agent_config(**kw).validate()
        ttl = cfg.heartbeat_interval_s * cfg.ttl_intervals
        stale_after, grace, deadline = watchdog_timing(cfg.fence_after_s, ttl, cfg.kill_grace_s)
        _, kill_at = fence_timing(cfg.fence_after_s, ttl, cfg.kill_grace_s)
        assert cfg.fence_after_s < stale_after and kill_at < deadline < ttl, (kw, stale_after, deadline)
        assert stale_after + grace <= deadline + 1e-9, kw


@pytest.mark.parametrize(
    "kw",
    [
        {"fence_after_s": 15.0},  # == TTL (5 s x 3)
        {"fence_after_s": 20.0},
        {"heartbeat_interval_s": 1.0, "fence_after_s": 3.0},
        {"ttl_intervals": 1, "fence_after_s": 5.0},
        {"heartbeat_interval_s": 0.0},
        {"heartbeat_interval_s": -1.0},
        {"ttl_intervals": 2},  # the default delay, two intervals, is the whole TTL
    ],
)
def test_agent_config_rejects_bad_settings(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        agent_config(**kw).validate()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("rack=r1,zone=z1", {"rack": "r1", "zone": "z1"}),
        (" rack = r1 , zone=z1 ,", {"rack": "r1", "zone": "z1"}),
        ("", {}),
        (None, {}),
        (",,", {}),
        ("empty=", {"empty": ""}),
        ("a.b-c_d=X.Y-Z_1", {"a.b-c_d": "X.Y-Z_1"}),
    ],
)
def test_parse_labels_accepts(text: str | None, expected: dict[str, str]) -> None:
    assert parse_labels(text) == expected


@pytest.mark.parametrize(
    "text",
    ["rack", "rack=r1,zone", "Rack=r1", "1rack=r1", "=r1", "rack=has space", "rack=a=b", "rack=r/1",
     ",".join(f"k{i}=v" for i in range(33))],
)
def test_parse_labels_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_labels(text)


def test_a_new_leader_announces_the_host_transitions_it_saw_while_following(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host lost, and one back, while this replica followed and the old leader was gone:
    the new leader publishes their events and alerts (found by exploring: a host lost, then
    back across a takeover, had neither a recovered alert nor its event); older ones, from
    before TAKEOVER_WINDOW_S, are not announced again."""
    import asyncio
    from types import SimpleNamespace

    from server.health.monitor import TAKEOVER_WINDOW_S, HealthMonitor

    sent: list[str] = []
    queued: list[list[tuple[str, Health | None, Health]]] = []

    class Nc:
        async def publish(self, subject: str, data: bytes = b"") -> None:
            sent.append(subject)

    index = SimpleNamespace(take_changes=lambda: queued.pop(0) if queued else [])
    state = SimpleNamespace(listeners=[], hosts={}, refresh_health=lambda now: index, labels_of=lambda host: {},
                            label_disputes={})
    lead = SimpleNamespace(leading=False, term=0)
    mon = HealthMonitor(Nc(), state, lead)  # type: ignore[arg-type]
    clock = [1000.0]
    import server.health.monitor as monitor

    monkeypatch.setattr(monitor.time, "time", lambda: clock[0])
    queued.append([("old", Health.HEALTHY, Health.LOST)])
    asyncio.run(mon.check())
    clock[0] += TAKEOVER_WINDOW_S + 5
    queued.append([("h1", Health.SUSPECT, Health.LOST), ("h2", Health.LOST, Health.HEALTHY),
                   ("new", None, Health.HEALTHY)])
    asyncio.run(mon.check())
    assert sent == []  # a follower publishes nothing
    lead.leading, lead.term = True, 7
    clock[0] += 3
    asyncio.run(mon.check())
    assert sorted(sent) == ["alerts.host.lost", "alerts.host.recovered", "muster.events.host.HEALTHY",
                            "muster.events.host.LOST"], sent
    sent.clear()
    asyncio.run(mon.check())
    assert sent == []  # once
    # A longer lease: the window is three of its TTLs.
    lead.config = SimpleNamespace(ttl_s=10.0)  # type: ignore[attr-defined]
    assert mon._takeover_window_s() == 30.0


def test_hosts_not_heard_again_after_the_bucket_was_renumbered_expire() -> None:
    """The hosts bucket came back empty, numbering its records from 1 (every NATS node
    restarted with it in memory): a heartbeat at a revision below those read before is
    applied, and a host not heard again within a TTL and an interval is taken as expired
    (its expiry marker went with the bucket; found by a review: it stayed SUSPECT for good
    and its work was never replaced)."""
    import time

    from tests.factories import heartbeat_record
    from wire.records import Record

    state = ClusterState(heartbeat_interval_s=5.0)
    lost: list[str] = []
    state.listeners.append(lambda kind, obj: lost.append(obj.host_id) if kind == "host_lost" else None)
    t0 = time.time()
    for rev, host in ((40, "h1"), (41, "h2")):
        state.apply_host_record(heartbeat_record(host, rev, shape=False, boot_id="b", seq=1, ts=t0), now=t0)
    state.hosts_renumbered()
    state.apply_host_record(heartbeat_record("h2", 1, shape=False, boot_id="b", seq=2, ts=t0), now=t0 + 1)
    assert state.hosts["h2"].revision == 1 and state.hosts["h2"].latest().seq == 2
    state.refresh_health(t0 + 10)
    assert state.hosts["h1"].present and not lost  # a TTL not over yet
    state.refresh_health(t0 + 25)
    assert not state.hosts["h1"].present and state.hosts["h2"].present and lost == ["h1"]
    # Its agent back, at any revision: present again.
    state.apply_host_record(heartbeat_record("h1", 2, shape=False, boot_id="b", seq=5, ts=t0 + 30), now=t0 + 30)
    assert state.hosts["h1"].present
    state.apply_host_record(Record("h1", 3, None), now=t0 + 60)  # an expiry as usual
    assert not state.hosts["h1"].present


def test_hosts_expire_after_a_renumbering_when_no_record_at_all_is_read_after_it() -> None:
    """Every agent gone when the bucket was renumbered: no record comes after it. A reader
    that is caught up counts the wait from when it learns of the renumbering (a review:
    every host stayed SUSPECT for good, its work never replaced)."""
    import dataclasses
    import time

    from tests.factories import heartbeat_record

    state = ClusterState(heartbeat_interval_s=5.0)
    t0 = time.time()
    for rev, host in ((40, "h1"), (41, "h2")):
        rec = heartbeat_record(host, rev, shape=False, boot_id="b", seq=1, ts=t0)
        state.apply_host_record(dataclasses.replace(rec, stamp=t0), now=t0)
    assert state.clock.caught_up
    state.hosts_renumbered()
    state.refresh_health(t0 + 1)
    state.refresh_health(t0 + 20)
    assert state.hosts["h1"].present and state.hosts["h2"].present  # within a TTL and an interval
    state.refresh_health(t0 + 22)
    assert not state.hosts["h1"].present and not state.hosts["h2"].present


def test_a_follower_reading_now_and_then_takes_no_host_as_expired_before_a_reading() -> None:
    """A follower reads the hosts bucket only now and then (its read clock stands at the
    last reading), and learns of a renumbering with the first reading after it: a host is
    taken as expired only once the readings a TTL and an interval past the first record
    read after the renumbering have not brought it (a review: counted from the clock as it
    stood, the last reading, hosts not yet handed over were taken as expired at once)."""
    import time

    from tests.factories import heartbeat_record

    state = ClusterState(heartbeat_interval_s=5.0)
    t0 = time.time()
    for rev, host in ((40, "h1"), (41, "h2")):
        state.apply_host_record(heartbeat_record(host, rev, shape=False, boot_id="b", seq=1, ts=t0), now=t0)
    state.clock.advance(t0, 0, t0, live=False)  # a reading, then nothing read until the next
    # 30 s on, a reading after the renumbering: its first records, then its position.
    state.hosts_renumbered()
    state.apply_host_record(heartbeat_record("h2", 1, shape=False, boot_id="b", seq=2, ts=t0 + 29), now=t0 + 29)
    state.clock.advance(t0 + 30, 0, t0 + 30, live=False)
    state.refresh_health(t0 + 60)
    assert state.hosts["h1"].present and state.hosts["h2"].present  # h1 may come in the next reading
    state.clock.advance(t0 + 55, 0, t0 + 61, live=False)  # the next reading, without h1
    state.refresh_health(t0 + 61)
    assert not state.hosts["h1"].present and state.hosts["h2"].present


def test_a_report_from_an_agent_not_heard_from_yet_keeps_its_host_from_work_until_one_of_its_heartbeats() -> None:
    """Found by exploring: an agent restarted without a label; its report (LOST, read at
    once) came before its heartbeat (read through the ingest), and the leader placed the
    job requiring the label straight back on the host as it was. A report from an agent
    process the last heartbeat is not from, sent after it, keeps the host from placement
    until that process's heartbeat (or one sent since) is read."""
    s = ClusterState(heartbeat_interval_s=5.0)
    s.apply_host_record(heartbeat_record("h1", 1, ts=T0, instance="old", labels={"zone": "z8"}), now=T0)
    needs = job_spec("j", host_labels={"zone": "z8"})
    assert check(needs, s.index.caps["h1"])[0] is None
    s.heard_from("h1", "new", T0 + 3)
    assert not s.index.caps["h1"].schedulable and check(needs, s.index.caps["h1"])[0] == NOT_HEALTHY
    # The new agent's heartbeat (stored before its report): the host as it is now.
    s.apply_host_record(heartbeat_record("h1", 2, ts=T0 + 2, instance="new", labels={"zone": "z1"}), now=T0 + 4)
    assert s.index.caps["h1"].schedulable and s.hosts["h1"].unheard_agent is None
    assert check(needs, s.index.caps["h1"])[0] is not None  # no longer has the label
    # A report of the agent heard, one sent before the last heartbeat (an earlier agent's
    # delivered late), or one without an instance (an older agent) marks nothing.
    for instance, ts in (("new", T0 + 9), ("old", T0 + 1), ("", T0 + 9)):
        s.heard_from("h1", instance, ts)
        assert s.index.caps["h1"].schedulable, (instance, ts)
    # A heartbeat sent after the report ends the mark too (its agent restarted again).
    s.heard_from("h1", "third", T0 + 10)
    assert not s.index.caps["h1"].schedulable
    s.apply_host_record(heartbeat_record("h1", 3, ts=T0 + 11, instance="fourth"), now=T0 + 11)
    assert s.index.caps["h1"].schedulable
    # The leader takes note as it reads each report, before the cycle it goes into.
    from types import SimpleNamespace

    from server.scheduling.scheduler import Scheduler
    from wire import subjects
    from wire.messages import AttemptState, StatusReport, encode

    class Lease:
        leading, term, changed = True, 1, None

    sched = Scheduler(None, s, Lease())  # type: ignore[arg-type]
    report = StatusReport(host_id="h1", attempt_id="j.1", job_id="j", state=AttemptState.LOST, ts=T0 + 20,
                          instance="fifth")
    msg = SimpleNamespace(data=encode(report), subject=subjects.status_subject("h1"))
    assert sched._decode_report(msg) == report  # type: ignore[arg-type]
    assert s.hosts["h1"].unheard_agent == ("fifth", T0 + 20) and not s.index.caps["h1"].schedulable


def _beat(host: str, rev: int, stamp: float, ttl: str | None = "15s", **headers: str) -> Record:
    """A heartbeat record as the watch yields it: stored at `stamp` (the store's clock)
    with the TTL an agent gives it."""
    import dataclasses

    rec = heartbeat_record(host, rev, shape=False, boot_id="b", seq=rev, ts=stamp)
    extra = {"Nats-TTL": ttl} if ttl is not None else {}
    return dataclasses.replace(rec, stamp=stamp, headers={**(rec.headers or {}), **extra, **headers})


def test_a_host_whose_key_was_purged_without_a_marker_is_lost_a_ttl_and_an_interval_after_its_last_heartbeat() -> None:
    """A heartbeat published with `Nats-Rollup: all` (an agent's credentials suffice, on
    its own key) removes every other host's heartbeat, and a purged record gets no expiry
    marker: a host dead then stayed SUSPECT for good, its work never replaced (found by
    exploring). A host whose last heartbeat is older, on the store's clock, than the TTL it
    was stored with and an interval (and the store's one-second tick) is taken as expired,
    as of when its key would have expired; the hosts that heartbeat on are not."""
    state = ClusterState(heartbeat_interval_s=5.0)
    seen = Listener()
    state.listeners.append(seen)
    t0 = 1_000_000.0
    state.apply_host_record(_beat("h1", 1, t0), now=t0)
    state.apply_host_record(_beat("h2", 2, t0), now=t0)
    rev = 2
    # h2's agent purges the bucket and heartbeats on; h1's agent died.
    for k in range(1, 6):
        rev += 1
        state.apply_host_record(_beat("h2", rev, t0 + 5 * k, **({"Nats-Rollup": "all"} if k == 1 else {})),
                                now=t0 + 5 * k)
        state.refresh_health(t0 + 5 * k)
        if 5 * k <= 15 + 5 + 1:
            assert state.hosts["h1"].present, k  # SUSPECT from 10 s on, not LOST yet
    assert not state.hosts["h1"].present and state.hosts["h2"].present
    assert state.hosts["h1"].lost_at == t0 + 15 and state.hosts["h1"].lost_unmarked  # when its key would have gone
    assert "h1" in state.absent
    assert [obj.host_id for kind, obj in seen.calls if kind == "host_lost"] == ["h1"]
    assert [obj for kind, obj in seen.calls if kind == "host_rollup"] == [("h2", t0 + 5)]
    assert state.health_index.health["h1"] is Health.LOST and state.health_index.health["h2"] is Health.HEALTHY
    # Its agent back: present again, and HEALTHY.
    state.apply_host_record(_beat("h1", rev + 1, t0 + 30), now=t0 + 30)
    assert state.hosts["h1"].present and not state.hosts["h1"].lost_unmarked


def test_a_host_whose_heartbeats_this_server_cannot_decode_is_not_taken_as_expired_by_its_age() -> None:
    """Found by a review: a heartbeat the store held but this server could not decode (an
    agent newer than it, sending a value it refuses) was dropped without moving the host's
    last heartbeat; a TTL and an interval later the host was taken as expired by its age
    and its work replaced, while its agent, whose heartbeats were stored, ran it on. Its
    key is alive: the host stays present (with what it reported last)."""
    import dataclasses

    state = ClusterState(heartbeat_interval_s=5.0)
    t0 = 1_000_000.0
    state.apply_host_record(_beat("h1", 1, t0), now=t0)
    first = state.hosts["h1"].heartbeat
    for k in range(1, 7):
        bad = dataclasses.replace(_beat("h1", 1 + k, t0 + 5 * k), value=b'{"host_id": "h1", "ts": "not a time"}')
        state.apply_host_record(bad, now=t0 + 5 * k)
        state.refresh_health(t0 + 5 * k)
    assert state.hosts["h1"].present and not state.hosts["h1"].lost_unmarked
    assert state.hosts["h1"].heartbeat is first and state.hosts["h1"].revision == 7
    assert state.dropped["heartbeat"] == 6


def test_a_host_is_not_taken_as_expired_by_its_age_on_what_the_server_has_not_read() -> None:
    """What a host's key is judged overdue at is the store's time every host's heartbeats
    have been read up to: never the local clock run on (a server cut off from NATS, or
    whose reader stalled, sees no heartbeat and must not take live hosts as expired), nor
    a position reached while the reader is reading each key's latest (a follower's
    reading, a leader that just took over: a host's newer heartbeat may not have been
    handed over yet). A heartbeat stored without a TTL never expires in the store, nor
    here; hosts present before the bucket was renumbered wait for their own window."""
    t0 = 1_000_000.0

    def cluster() -> ClusterState:
        s = ClusterState(heartbeat_interval_s=5.0)
        s.apply_host_record(_beat("h1", 1, t0), now=t0)
        s.apply_host_record(_beat("h2", 2, t0), now=t0)
        return s

    # The local clock runs on (caught up), nothing more is read: SUSPECT, never LOST.
    s = cluster()
    assert s.clock.caught_up and s.health_time(t0 + 600) == t0 + 600 and s.clock.heard_to() == t0
    for at in (t0 + 10, t0 + 30, t0 + 600):
        s.refresh_health(at)
    assert s.hosts["h1"].present and s.hosts["h2"].present
    assert s.health("h1", t0 + 600) is Health.SUSPECT
    # A reading of each key's latest under way (not whole): its position does not count.
    s = cluster()
    s.refresh_health(t0 + 11)  # both SUSPECT
    s.apply_heartbeat("h2", 3, _beat("h2", 3, t0 + 40).value, None, t0 + 40, 15.0)
    s.clock.advance(t0 + 40, 500, t0 + 40, whole=False)
    s.refresh_health(t0 + 41)
    assert s.hosts["h1"].present  # h1's latest may be among the 500 not read yet
    s.apply_heartbeat("h1", 4, _beat("h1", 4, t0 + 39).value, None, t0 + 39, 15.0)  # ... and it was
    s.clock.advance(t0 + 40, 0, t0 + 41, whole=True)
    s.refresh_health(t0 + 42)
    assert s.hosts["h1"].present and s.hosts["h2"].present
    # Without a TTL: kept as the store keeps it.
    s = ClusterState(heartbeat_interval_s=5.0)
    s.apply_host_record(_beat("h1", 1, t0, ttl=None), now=t0)
    s.refresh_health(t0 + 11)
    s.apply_host_record(_beat("h2", 2, t0 + 100), now=t0 + 100)
    s.refresh_health(t0 + 101)
    assert s.hosts["h1"].present
    # Renumbered: a host not heard since waits a TTL and an interval from the first record
    # read after it (_expire_unconfirmed), not from its last heartbeat.
    s = cluster()
    s.refresh_health(t0 + 11)
    s.hosts_renumbered()
    s.apply_host_record(_beat("h2", 1, t0 + 60), now=t0 + 60)
    s.refresh_health(t0 + 60)
    assert s.hosts["h1"].present
    s.apply_host_record(_beat("h2", 2, t0 + 81), now=t0 + 81)
    s.refresh_health(t0 + 81)
    assert not s.hosts["h1"].present  # its own window over


def test_a_heartbeat_that_purged_the_bucket_is_alerted_and_a_host_lost_so_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader alerts `host.rollup` naming the host whose heartbeat carried
    `Nats-Rollup: all` (its NATS credentials are misused), and the `host.lost` of a host
    taken as expired by its age says that its key went without an expiry marker."""
    import asyncio
    import json
    from types import SimpleNamespace

    from server.health.monitor import HealthMonitor

    sent: list[tuple[str, dict[str, Any]]] = []

    class Nc:
        async def publish(self, subject: str, data: bytes = b"") -> None:
            sent.append((subject, json.loads(data)))

    state = ClusterState(heartbeat_interval_s=5.0)
    mon = HealthMonitor(Nc(), state, SimpleNamespace(leading=True, term=1))  # type: ignore[arg-type]
    t0 = 1_000_000.0
    state.apply_host_record(_beat("h1", 1, t0), now=t0)
    state.apply_host_record(_beat("h2", 2, t0), now=t0)
    import server.health.monitor as monitor

    clock = [t0 + 1]
    monkeypatch.setattr(monitor.time, "time", lambda: clock[0])
    asyncio.run(mon.check())
    state.apply_host_record(_beat("h2", 3, t0 + 5, **{"Nats-Rollup": "all"}), now=t0 + 5)
    state.apply_host_record(_beat("h2", 4, t0 + 25), now=t0 + 25)
    sent.clear()
    clock[0] = t0 + 25
    asyncio.run(mon.check())
    alerts = {subject: ev for subject, ev in sent if subject.startswith("alerts.")}
    assert alerts["alerts.host.rollup"]["host_id"] == "h2" and "Nats-Rollup: all" in \
        alerts["alerts.host.rollup"]["message"]
    assert alerts["alerts.host.lost"]["host_id"] == "h1" and "without an expiry marker" in \
        alerts["alerts.host.lost"]["message"]
    # Sent again and again (each heartbeat): alerted once a minute, not once a heartbeat.
    sent.clear()
    for k in range(1, 4):
        state.apply_host_record(_beat("h2", 4 + k, t0 + 25 + 5 * k, **{"Nats-Rollup": "all"}), now=t0 + 25 + 5 * k)
        clock[0] = t0 + 25 + 5 * k
        asyncio.run(mon.check())
    assert [subject for subject, _ in sent] == []
    clock[0] = t0 + 90
    state.apply_host_record(_beat("h2", 9, t0 + 90, **{"Nats-Rollup": "all"}), now=t0 + 90)
    asyncio.run(mon.check())
    assert [subject for subject, _ in sent] == ["alerts.host.rollup"]
