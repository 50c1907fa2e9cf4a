"""bench.leaders: one series of metrics over several server replicas, and the figures of
a kill, from made-up scrapes and records."""

from __future__ import annotations

import pytest

from bench.leaders import LeaderScrapes, failover_figures

P = "muster_placements_total"
H = "muster_heartbeats_received_total"


def scrape(leader: bool, placed: float, hb: float, depth: float = 0) -> dict[str, float]:
    return {"muster_leader": 1.0 if leader else 0.0, P: placed, H: hb, "muster_queue_depth": depth}


def test_counters_continue_across_a_change_of_leader() -> None:
    s = LeaderScrapes()
    order = ["server", "server-2"]
    # The first leader's counts since it started.
    assert s.add(1, {"server": scrape(True, 100, 1000), "server-2": scrape(False, 0, 900)}, order) == \
        ("server", scrape(True, 100, 1000))
    follow, m = s.add(2, {"server": scrape(True, 150, 1500), "server-2": scrape(False, 0, 1400)}, order)
    assert (follow, m[P], m[H]) == ("server", 150, 1500)
    # The leader dies; the survivor is not leader yet: followed, its own increase added.
    follow, m = s.add(3, {"server-2": scrape(False, 0, 1900, depth=7)}, order)
    assert (follow, m[P], m[H], m["muster_queue_depth"]) == ("server-2", 150, 2000, 7)
    # It takes over: still only its own increase since its previous scrape counts.
    follow, m = s.add(4, {"server-2": scrape(True, 20, 2400)}, order)
    assert (follow, m[P], m[H]) == ("server-2", 170, 2500)
    follow, m = s.add(5, {"server-2": scrape(True, 70, 2900)}, order)
    assert (m[P], m[H]) == (220, 3000)
    assert s.changes == [(4, "server", "server-2")]


def test_a_single_server_series_is_its_own_scrapes() -> None:
    s = LeaderScrapes()
    for t, (placed, hb) in enumerate([(0, 0), (5, 50), (9, 120)]):
        follow, m = s.add(t, {"server": scrape(True, placed, hb)}, ["server"])
        assert (follow, m[P], m[H]) == ("server", placed, hb)
    assert s.changes == []
    with pytest.raises(ValueError):
        s.add(4, {}, ["server"])


def test_failover_figures_split_the_jobs_by_the_kill_and_the_first_placement_after_it() -> None:
    submitted = {"a": 1.0, "b": 9.0, "c": 10.5, "d": 12.0, "e": 13.0}
    placed = {"a": 1.1, "b": 9.1, "c": 12.0, "d": 12.1, "e": 13.1}
    dispatched = {"a": 1.2, "b": 9.2, "c": 12.2, "d": 12.3, "e": 13.3}  # e: never placed is left out below
    f = failover_figures(10.0, "leader server", submitted, dispatched, placed)
    assert f["kill_to_first_placement_s"] == 2.0
    lat = f["dispatch_latency_ms"]
    assert (lat["before"]["n"], lat["during"]["n"], lat["after"]["n"]) == (2, 1, 2)
    assert lat["during"]["max"] == pytest.approx(1700.0)
    assert f["placements_in_5_s_after_the_first"] == 3
    none = failover_figures(20.0, "x", submitted, dispatched, placed)
    assert none["kill_to_first_placement_s"] is None and none["dispatch_latency_ms"]["before"]["n"] == 5
