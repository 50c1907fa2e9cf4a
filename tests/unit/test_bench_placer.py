"""The placer scenario (`python -m bench placer`, bench/placecycle.py) at a small scale,
for what it sets up only: every job of a cycle placed on a fleet with room, and no host
copy holding more than it has. Its figures come from the benchmark (docs/benchmarks.md)."""

from __future__ import annotations

from bench.placecycle import build_parser, measure


def test_a_small_run_places_every_job_and_overcommits_nothing() -> None:
    rep = measure(build_parser().parse_args(["--hosts", "200", "--jobs", "20", "--cycles", "2"]))
    assert rep["correctness"] == {"ok": True, "overcommitted_hosts": []}
    assert rep["jobs_placed_per_cycle"] == 20 and rep["cycle_ms"]["cycles"] == 2


def test_a_full_fleet_places_nothing_and_stays_correct() -> None:
    rep = measure(build_parser().parse_args(["--hosts", "3", "--jobs", "40", "--cycles", "1", "--seed", "3"]))
    assert rep["correctness"]["ok"] and rep["jobs_placed_per_cycle"] < 40


def test_pinned_jobs_wait_for_their_full_pools() -> None:
    """`--pinned N`: N more jobs a cycle, each pinned by a label to a pool of full hosts,
    find no host; the others are placed as before."""
    rep = measure(build_parser().parse_args(["--hosts", "3000", "--jobs", "10", "--cycles", "2", "--pinned", "3"]))
    assert rep["correctness"]["ok"] and rep["jobs_placed_per_cycle"] == 10
