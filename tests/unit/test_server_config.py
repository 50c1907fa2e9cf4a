"""The server's settings from the environment: the eviction pacing and partition
threshold (MUSTER_EVICTION_*, MUSTER_PARTITION_*)."""

from __future__ import annotations

import pytest

from server.replica import ServerConfig, eviction_from_env
from server.scheduling.eviction import EvictionBudget, EvictionConfig, HostLoss, disrupted_domains, host_domains
from wire.errors import ConfigError


def test_unset_variables_keep_the_defaults() -> None:
    assert eviction_from_env({}) == EvictionConfig()
    assert eviction_from_env({"MUSTER_EVICTION_RATE": " "}) == EvictionConfig()


def test_each_variable_sets_its_field() -> None:
    cfg = eviction_from_env({
        "MUSTER_EVICTION_RATE": "50", "MUSTER_EVICTION_BURST": "100", "MUSTER_DOMAIN_EVICTION_RATE": "2.5",
        "MUSTER_DOMAIN_EVICTION_BURST": "5", "MUSTER_PARTITION_SHARE": "0.25", "MUSTER_PARTITION_WINDOW": "60",
        "MUSTER_PARTITION_MIN_HOSTS": "4"})
    assert cfg == EvictionConfig(global_rate_per_s=50, global_burst=100, domain_rate_per_s=2.5, domain_burst=5,
                                 domain_share=0.25, domain_window_s=60, domain_min_hosts=4)


def test_the_server_config_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_EVICTION_BURST", "3")
    monkeypatch.setenv("MUSTER_EVICTION_RATE", "1")
    monkeypatch.setenv("MUSTER_PARTITION_SHARE", "0.2")
    cfg = ServerConfig().eviction
    budget = EvictionBudget(cfg)
    # Five racks of their own: the global burst of 3 lets three through, then one a second.
    racks = [host_domains({"rack": f"r{i}"}) for i in range(5)]
    assert [budget.allow(d, {}, 100.0) for d in racks] == [True, True, True, False, False]
    assert budget.allow(racks[3], {}, 101.0) and not budget.allow(racks[4], {}, 101.0)
    # One host of four lost is more than a share of 0.2 of its rack: a suspected
    # partition; one of five is not (the default share, 0.5, takes three of five).
    lost = [HostLoss("h1", {"rack": "r9"}, 100.0)]
    assert disrupted_domains(lost, {("rack", "r9"): 4}, 100.0, cfg) == {("rack", "r9"): 1}
    assert disrupted_domains(lost, {("rack", "r9"): 5}, 100.0, cfg) == {}


@pytest.mark.parametrize(("var", "raw", "says"), [
    ("MUSTER_EVICTION_RATE", "fast", "not a number"),
    ("MUSTER_EVICTION_RATE", "0", "at least 0.01"),
    ("MUSTER_EVICTION_BURST", "nan", "at least 1"),
    ("MUSTER_PARTITION_SHARE", "1.5", "at most 1"),
    ("MUSTER_PARTITION_MIN_HOSTS", "2.5", "not a whole number"),
    ("MUSTER_PARTITION_WINDOW", "-1", "at least 1"),
])
def test_a_bad_value_is_refused_naming_its_variable(var: str, raw: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"{var}=.*{says}"):
        eviction_from_env({var: raw})
