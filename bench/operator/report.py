"""The operator benchmark's report: per request kind the latency summary (nearest-rank
p50/p95/p99/max over the timed requests), the server's CPU time per request and the
checks' outcome; the counts of what was set up; the processes' CPU and peak RSS; the
same table as Markdown for the README."""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from typing import Any

import psutil

from bench.operator.fleet import FleetPlan
from bench.operator.history import Filled
from bench.operator.queries import PER_PAGE, Req
from bench.processes import Child
from bench.stats import summary_ms


def build_report(a: argparse.Namespace, argv: list[str], *, fleet: FleetPlan, filled: Filled, live: dict[str, int],
                 jobs_total: int, hosts_at_start: dict[str, Any], hosts_at_end: dict[str, Any], startup_s: float,
                 window: float, reqs: list[Req], children: list[Child]) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for q in reqs:
        s = summary_ms(q.times)
        rows[q.name] = {
            "kind": q.kind,
            "request": q.label(),
            **s,
            "ok": q.ok,
            "failures": q.failures,
            "first_failure": q.first_failure,
            "server_cpu_ms_mean": round(1000 * sum(q.server_cpu) / len(q.server_cpu), 1) if q.server_cpu else None,
        }
    table = markdown(rows)
    failures = sum(q.failures for q in reqs)
    rep: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.operator " + " ".join(argv),
        "machine": f"{os.cpu_count()} CPUs, {round(psutil.virtual_memory().total / 2**30)} GiB; every process on "
                   f"one machine; load average at the end {', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "ok": failures == 0,
        "config": {"hosts": a.hosts, "jobs": a.jobs, "days": a.days, "reps": a.reps, "warmup": a.warmup,
                   "live_jobs": a.live_jobs, "heartbeat_interval_s": a.heartbeat_interval, "seed": a.seed,
                   "history_database": "SQLite (WAL), the server's default", "page_size": PER_PAGE},
        "counts": {
            "hosts_in_bucket": a.hosts, "hosts_heartbeating": len(fleet.live), "hosts_published_once_suspect":
                len(fleet.suspect), "hosts_published_once_lost": len(fleet.lost),
            "hosts_cordoned": len(fleet.cordoned), "hosts_drained": len(fleet.drained),
            "hosts_at_start": hosts_at_start["cluster"]["hosts"], "hosts_at_end": hosts_at_end["cluster"]["hosts"],
            "history_jobs_inserted": filled.jobs, "history_jobs_by_state": dict(filled.by_state),
            "attempts_inserted": filled.attempts, "events_inserted": filled.events, "alerts_inserted": filled.alerts,
            "live_jobs": live, "jobs_total_count": jobs_total, "users": len(filled.by_user),
        },
        "fill": {"seconds": round(filled.seconds, 1), "database_mib": round(filled.db_bytes / 2**20, 1)},
        "startup_s": round(startup_s, 1),
        "measure_window_s": round(window, 1),
        "requests": rows,
        "processes": {c.name: {"cpu_s": round(c.cpu, 2), "peak_rss_mb": round(c.peak_rss / 2**20, 1),
                               "cpu_s_in_window": round(c.cpu_at_end - c.cpu_at_start, 2)
                               if c.cpu_at_start is not None and c.cpu_at_end is not None else None}
                      for c in children},
        "notes": [
            "latency = wall time of one request from the bench process, to the last byte of the body; requests "
            "sequential, round-robin over the kinds; p-values are nearest-rank over the timed requests",
            "server CPU / request = the server process's CPU time during the request (ms), heartbeat ingestion "
            "included; the historian is a process of its own",
            "the console pages and GraphQL read one host read model kept by the cluster view (server.views.hosts)",
            "the console's /jobs has a state filter and offset paging only (no user filter); GraphQL `jobs` "
            "pages with keyset cursors",
        ],
        "markdown": table,
    }
    return rep


def print_report(rep: dict[str, Any]) -> None:
    """The table on the terminal, then its Markdown and the run's totals."""
    rows = rep["requests"]
    table = rep["markdown"]
    print()
    print(f"{'request':<46} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8} {'cpu/req':>8}  ok")
    for name, r in rows.items():
        print(f"{name:<46} {_ms(r['p50']):>8} {_ms(r['p95']):>8} {_ms(r['p99']):>8} {_ms(r['max']):>8} "
              f"{_ms(r['server_cpu_ms_mean']):>8}  {r['ok']}/{r['n']}"
              + (f"  FAILED: {r['first_failure']}" if r["failures"] else ""))
    print()
    print(table)
    print()
    print(json.dumps({k: rep[k] for k in ("fill", "startup_s", "measure_window_s", "processes")}, indent=1))


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    out = ["| request | p50 | p95 | p99 | max | server CPU / request |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        out.append(f"| {name} | {r['p50']} | {r['p95']} | {r['p99']} | {r['max']} | {r['server_cpu_ms_mean']} |")
    return "\n".join(out)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"
