"""Host labels the operators set (`HostConfig.labels`) and the keys only they set
(server.scheduling.hostlabels): an agent, whose NATS credentials are on its host, cannot
claim a team's label and take that team's jobs, nor move its host to another rack to
escape the per-domain eviction budget."""

from __future__ import annotations

import pytest

from server.health.monitor import labels_disputed_alerts
from server.replica import operator_label_keys_from_env
from server.scheduling.hostlabels import Dispute, LabelTrust, disputes, effective_labels, parse_keys
from server.scheduling.placement import NO_LABELS
from server.scheduling.planner import plan_cycle
from server.state.cluster import ClusterState, HostConfig
from server.views.jobs import JobView
from tests.factories import heartbeat_record, job, job_spec
from tests.unit.test_gangs import NOW, World
from wire import subjects
from wire.errors import ConfigError
from wire.messages import JobState, Queue, encode
from wire.records import Record

TEAM = LabelTrust(frozenset({"team", "rack"}))


def test_a_trusted_key_is_the_operators_alone_and_others_are_the_agents_unless_the_operator_set_them() -> None:
    reported = {"team": "vision", "rack": "r9", "net": "ib", "gpu": "h100", "muster.pool": "x"}
    operator = {"rack": "r1", "gpu": "a100"}
    assert effective_labels(reported, operator, TEAM) == {"rack": "r1", "net": "ib", "gpu": "a100"}
    # Without trusted keys, as before: the agent's, the operator's winning; `muster.*`
    # keys are the operators' whatever the setting.
    assert effective_labels(reported, operator, LabelTrust()) == {"team": "vision", "rack": "r1", "net": "ib",
                                                                  "gpu": "a100"}
    assert effective_labels(reported, {"muster.pool": "p1"}, LabelTrust())["muster.pool"] == "p1"
    assert disputes(reported, operator, TEAM) == (Dispute("muster.pool", "x", None), Dispute("rack", "r9", "r1"),
                                                  Dispute("team", "vision", None))
    assert disputes({"rack": "r1"}, operator, TEAM) == ()  # the same value: no dispute
    assert parse_keys(" team, rack,,zone ") == frozenset({"team", "rack", "zone"})


def test_the_setting_is_read_and_a_bad_key_refused() -> None:
    assert operator_label_keys_from_env({}) == frozenset()
    assert operator_label_keys_from_env({"MUSTER_OPERATOR_LABEL_KEYS": "team,rack"}) == frozenset({"team", "rack"})
    with pytest.raises(ConfigError, match="MUSTER_OPERATOR_LABEL_KEYS=.*'Team' is not a label key"):
        operator_label_keys_from_env({"MUSTER_OPERATOR_LABEL_KEYS": "Team"})


def _hostcfg(state: ClusterState, host_id: str, revision: int, **labels: str) -> None:
    state.apply_state_record(Record(subjects.hostcfg_key(host_id), revision,
                                    HostConfig(labels=labels).model_dump_json().encode()))


def test_the_cluster_view_keeps_each_hosts_labels_and_notes_a_dispute_once_a_change() -> None:
    state = ClusterState(heartbeat_interval_s=1e9, label_trust=TEAM)
    notices: list[object] = []
    state.listeners.append(lambda kind, obj: notices.append(obj) if kind == "host_labels_disputed" else None)
    state.apply_host_record(heartbeat_record("h1", 1, labels={"team": "vision", "rack": "r1", "net": "ib"}), now=NOW)
    assert state.labels_of("h1") == {"net": "ib"}
    assert state.index.caps["h1"].labels == {"net": "ib"}
    assert notices == [("h1", (Dispute("rack", "r1", None), Dispute("team", "vision", None)))]
    # The same labels again (another heartbeat, another shape): no new notice.
    state.apply_host_record(heartbeat_record("h1", 2, labels={"team": "vision", "rack": "r1", "net": "ib"},
                                             cpus=8), now=NOW + 1)
    assert len(notices) == 1
    # The operator sets the rack the agent says, and another team: one dispute left.
    _hostcfg(state, "h1", 3, rack="r1", team="nlp")
    assert state.labels_of("h1") == {"net": "ib", "rack": "r1", "team": "nlp"}
    assert state.index.caps["h1"].labels == state.labels_of("h1")
    assert notices[-1] == ("h1", (Dispute("team", "vision", "nlp"),)) and len(notices) == 2
    _hostcfg(state, "h1", 4, rack="r1", team="vision")
    assert state.label_disputes == {} and len(notices) == 2  # settled: nothing to alert
    # A cordon written by this version keeps the labels (HostConfig.labels is kept).
    assert state.hostcfg["h1"].labels == {"rack": "r1", "team": "vision"}


def test_failure_domains_are_the_operators_racks() -> None:
    """An agent claiming another rack neither enlarges that rack's domain nor leaves its own."""
    state = ClusterState(heartbeat_interval_s=1e9, label_trust=TEAM)
    for n, (host, claimed) in enumerate((("a", "r1"), ("b", "r1"), ("c", "r2")), start=1):
        state.apply_host_record(heartbeat_record(host, n, labels={"rack": claimed}), now=NOW)
        _hostcfg(state, host, 10 + n, rack="r1")
    assert state.domain_sizes() == {("rack", "r1"): 3}
    state.set_label_trust(LabelTrust())  # without trust: the operator's still win where set
    assert state.domain_sizes() == {("rack", "r1"): 3}
    _hostcfg(state, "c", 20)  # the operator's rack removed: the agent's is taken again
    assert state.domain_sizes() == {("rack", "r1"): 2, ("rack", "r2"): 1}


def _team_queue(w: World) -> None:
    w.state.apply_state_record(Record("queue.vision", next(w.rev),
                                      encode(Queue(name="vision", host_labels={"team": "vision"}))))
    rec = job("jv", spec=job_spec("jv", command=["x"], gpus=1, cpus=1, memory_mb=1, queue="vision"), submitted_at=NOW)
    w.state.apply_state_record(Record("job.jv", next(w.rev), encode(rec)))


def _claiming_host(w: World) -> None:
    rec = heartbeat_record("rogue", next(w.rev), shape=False, labels={"team": "vision", "rack": "r1"}, gpus=8,
                           gpu_memory_mb=1, cpus=64, memory_mb=10**6)
    w.state.apply_host_record(rec, now=NOW)


def test_an_agent_claiming_a_teams_label_gets_none_of_its_jobs_until_the_operator_labels_its_host() -> None:
    w = World()
    w.state.set_label_trust(LabelTrust(frozenset({"team"})))
    _claiming_host(w)
    _team_queue(w)
    w.cycle()
    assert w.job("jv").state is JobState.QUEUED
    assert JobView(w.state, None).why_pending(w.job("jv"), NOW) == {NO_LABELS: 1}
    _hostcfg(w.state, "rogue", next(w.rev), team="vision")
    w.cycle(now=NOW + 1)
    assert w.job("jv").state is JobState.PLACED and w.job("jv").attempts[0].host_id == "rogue"


def test_without_trusted_keys_the_agents_label_places_as_before() -> None:
    """The default (no MUSTER_OPERATOR_LABEL_KEYS): existing deployments' `--labels` keep working."""
    w = World()
    _claiming_host(w)
    _team_queue(w)
    plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=1)
    assert plan.jobs["jv"].state is JobState.PLACED


def test_a_trust_set_later_takes_the_hosts_label_away_from_placement() -> None:
    w = World()
    _claiming_host(w)
    assert w.state.index.caps["rogue"].labels == {"team": "vision", "rack": "r1"}
    w.state.set_label_trust(LabelTrust(frozenset({"team"})))
    assert w.state.index.caps["rogue"].labels == {"rack": "r1"}
    assert w.state.label_disputes["rogue"] == (Dispute("team", "vision", None),)


def test_the_host_row_says_which_labels_are_the_operators() -> None:
    state = ClusterState(heartbeat_interval_s=1e9, label_trust=TEAM)
    state.apply_host_record(heartbeat_record("h1", 1, labels={"team": "vision", "net": "ib"}), now=NOW)
    _hostcfg(state, "h1", 2, rack="r1")
    row = state.host_table.row("h1", NOW)
    assert row is not None
    assert row.labels == {"net": "ib", "rack": "r1"} and row.rack == "r1"
    assert row.operator_labels == {"rack": "r1"} and row.agent_labels == {"team": "vision", "net": "ib"}


def test_disputes_are_alerted_one_a_host_or_one_for_many() -> None:
    one = labels_disputed_alerts([("h1", (Dispute("team", "vision", None),))], NOW)
    assert [e.kind for e in one] == [subjects.ALERT_HOST_LABELS_DISPUTED]
    assert "team=vision (the operator's: none)" in one[0].message and "muster host label h1" in one[0].message
    many = labels_disputed_alerts([(f"h{i}", (Dispute("rack", "r9", "r1"),)) for i in range(8)], NOW)
    assert len(many) == 1 and many[0].data["by_key"] == {"rack": 8} and many[0].data["hosts"] == 8
