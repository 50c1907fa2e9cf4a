"""The backlog scenario (`python -m bench backlog`, bench/backlog.py) at a small scale,
for what it sets up only: a full fleet, a backlog that stays queued, no GPU held twice,
the same outcome with the planner's shortcuts off, and the reservation it times. Its figures come from the
benchmark itself (docs/benchmarks.md), never from a test."""

from __future__ import annotations

from bench.backlog import build_parser, measure


def test_small_backlog_run_fills_the_fleet_and_keeps_a_backlog() -> None:
    args = build_parser().parse_args(["--hosts", "40", "--queues", "4", "--demand", "1.3", "--cycles", "3"])
    rep = measure(args)
    assert rep["correctness"] == {"ok": True, "violations": []}
    assert rep["gpus_demanded"] >= 1.3 * rep["gpus"]
    assert rep["jobs_queued"] > 0 and rep["jobs_running"] > 0
    assert rep["jobs_queued"] + rep["jobs_running"] == rep["jobs_submitted"]
    assert rep["plan_cycle_ms"]["cycles"] == 3
    off = measure(build_parser().parse_args(["--hosts", "40", "--queues", "4", "--demand", "1.3", "--cycles", "3",
                                             "--no-shortcuts"]))
    assert (off["jobs_queued"], off["jobs_running"]) == (rep["jobs_queued"], rep["jobs_running"])


def test_the_reservation_it_times_has_a_start_only_with_time_limits() -> None:
    """`reservation_8gpu` times a reservation on the full fleet: its start is unknown when
    no job has a time limit, and known (within the longest limit, 24 h) with `--time-limits`."""
    base = ["--hosts", "40", "--queues", "4", "--demand", "1.3", "--cycles", "2"]
    without = measure(build_parser().parse_args(base))["reservation_8gpu"]
    assert without["hosts"] == 1 and without["start_in_s"] is None
    timed = measure(build_parser().parse_args([*base, "--time-limits"]))["reservation_8gpu"]
    assert timed["hosts"] == 1 and 0 < timed["start_in_s"] <= 24 * 3600
