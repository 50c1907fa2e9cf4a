"""`muster bench` end to end at small scale: correctness only, no timing assertions.

Real nats-server, a real `muster server`, 2,000 simulated hosts in one simulator process,
100 jobs/s for 10 s. Asserts every submitted job reached a host exactly once, no host was
overcommitted, the report has every required key, and the plot was written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main

REQUIRED = ["dispatch_latency_ms", "running_latency_ms", "heartbeats_per_s", "submissions_per_s",
            "placements_per_s", "max_concurrent_tasks", "overcommitted_hosts", "jobs_submitted",
            "jobs_dispatched", "processes"]


@pytest.mark.timeout(170)
def test_bench_small_run_is_correct(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rc = main(["--hosts", "2000", "--rate", "100", "--duration", "10", "--drain", "60",
               "--lose-host-at", "-1", "--json", str(out), "--work-dir", str(tmp_path / "work")])
    assert out.exists(), "no report written"
    rep = json.loads(out.read_text())
    for key in REQUIRED:
        assert key in rep, key
    for key in ("dispatch_latency_ms", "running_latency_ms"):
        for p in ("p50", "p95", "p99", "max"):
            assert p in rep[key], (key, p)
    for name, proc in rep["processes"].items():
        assert "cpu_s" in proc and "peak_rss_mb" in proc, name
    assert {"nats-server", "server", "observer", "sim0"} <= set(rep["processes"])
    assert Path(rep["plot"]).exists() and Path(rep["plot"]).stat().st_size > 0
    c = rep["correctness"]
    assert rep["jobs_submitted"] > 0
    assert c["observer_ran"]
    assert c["alloc_revisions_checked"] > 0
    assert c["jobs_dispatched_more_than_once"] == 0, c["examples_dispatched_twice"]
    assert c["dispatches_of_unknown_jobs"] == 0
    assert rep["overcommitted_hosts"] == 0, c["overcommit_examples"]
    assert c["simulator_gpu_collisions"] == 0
    assert c["jobs_never_dispatched"] == 0, c["examples_never_dispatched"]
    assert rep["jobs_dispatched"] == rep["jobs_submitted"]
    assert rc == 0
