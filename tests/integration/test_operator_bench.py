"""`python -m bench.operator` at small scale: correctness only, no timing assertions.

2,000 hosts, 5,000 history jobs, 50 live jobs, two timed rounds: every console page and
GraphQL query the benchmark times must have answered 200 with what it should hold (the
benchmark checks each response: rows listed, totalCount equal to the jobs inserted, ...)
and the report must be complete. (Its history rows and schema: tests/unit/test_operator_bench.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.operator.run import main

# Starts many processes for a long time: runs on one test worker, one heavy test at a time.
pytestmark = pytest.mark.heavy

KINDS = {"console": 16, "graphql": 20}


@pytest.mark.timeout(150)
def test_operator_bench_small_run_answers_everything(tmp_path: Path) -> None:
    out = tmp_path / "operator.json"
    rc = main(["--hosts", "2000", "--jobs", "5000", "--reps", "2", "--warmup", "1", "--heartbeat-interval", "5",
               "--live-jobs", "50", "--json", str(out), "--work-dir", str(tmp_path / "work")])
    assert out.exists(), "no report written"
    rep = json.loads(out.read_text())
    bad = {k: v["first_failure"] for k, v in rep["requests"].items() if v["failures"]}
    assert not bad, bad
    assert rc == 0 and rep["ok"] is True
    for key in ("when", "command", "machine", "config", "counts", "fill", "startup_s", "measure_window_s",
                "requests", "processes", "notes", "markdown"):
        assert key in rep, key
    kinds = [v["kind"] for v in rep["requests"].values()]
    assert {k: kinds.count(k) for k in KINDS} == KINDS
    for name, r in rep["requests"].items():
        assert r["n"] == 2 and r["ok"] == 2, name
        for p in ("p50", "p95", "p99", "max", "server_cpu_ms_mean"):
            assert r[p] is not None and r[p] >= 0, (name, p)
        assert f"| {name} |" in rep["markdown"], name
    c = rep["counts"]
    assert c["history_jobs_inserted"] == 5000
    assert c["jobs_total_count"] == 5000 + 50  # GraphQL jobs totalCount, checked on every request
    assert sum(c["history_jobs_by_state"].values()) == 5000
    assert c["attempts_inserted"] > 4000 and c["events_inserted"] > 5 * 4000 and c["alerts_inserted"] > 0
    assert c["live_jobs"] == {"running": 30, "queued": 10, "short": 10}
    assert c["hosts_at_end"]["total"] == 2000
    assert c["hosts_at_end"]["lost"] == c["hosts_published_once_lost"] > 0
    assert c["hosts_at_end"]["suspect"] >= c["hosts_published_once_suspect"] > 0
    assert rep["fill"]["seconds"] > 0 and rep["fill"]["database_mib"] > 0
    assert {"nats-server", "server", "historian", "sim"} <= set(rep["processes"])
    for name, p in rep["processes"].items():
        assert p["cpu_s"] >= 0 and p["peak_rss_mb"] > 0, name
