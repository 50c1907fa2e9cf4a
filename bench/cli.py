"""The command line of `python -m bench` (also `muster bench` and `muster-bench`).

    python -m bench [options]                 one run (bench/run.py); --help lists the options
    python -m bench plot REPORT.json [-o PNG] redraw a run's plot from its report

A run writes its report (JSON) and its plot (PNG, when matplotlib, the `bench` extra, is
installed); the report keeps what the plot draws, so the PNG need not be kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from bench.errors import BenchError
from bench.plot import plot, plot_placement, plot_series
from bench.run import Bench


def results_dir() -> Path:
    """Where a report goes by default: bench/results/ in a checkout; an installed
    package has none, and writes to the current directory."""
    d = Path(__file__).resolve().parent / "results"
    return d if d.is_dir() else Path.cwd()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="muster bench", description="Load-test Muster with simulated hosts.")
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=100.0, help="job arrivals per second (Poisson)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of submissions")
    ap.add_argument("--trace", action="store_true", help="replay shapes from ../shared/traces (openb + Philly gangs)")
    ap.add_argument("--nats-cluster", type=int, choices=[1, 3], default=1)
    ap.add_argument("--replicas", type=int, choices=[1, 3], default=None,
                    help="MUSTER_REPLICAS for the server's streams and buckets (default: --nats-cluster)")
    ap.add_argument("--nats-sync", choices=["always", "default"], default=None,
                    help="JetStream fsync: `always` (every write fsynced before its ack; the default with 3 "
                         "nodes, as in nats/cluster) or nats-server's `default` (every 2 min; the default "
                         "with 1 node)")
    ap.add_argument("--burst", type=int, default=0,
                    help="submit this many jobs at once instead of --rate/--duration and time until all are "
                         "dispatched (maximum placement throughput)")
    ap.add_argument(
        "--json",
        default=None,
        help="write the report here (default bench/results/bench-<time>.json in a checkout, "
        "else bench-<time>.json in the current directory)",
    )
    ap.add_argument("--png", default=None, help="plot file (default: the JSON path with .png)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mean-duration", type=float, default=8.0, help="synthetic: mean task seconds")
    ap.add_argument("--gang-fraction", type=float, default=0.02, help="trace: share of arrivals that are gangs")
    ap.add_argument("--sim-procs", type=int, default=0, help="simulator processes (default hosts/20,000)")
    ap.add_argument("--wildcard", action="store_true", help="simulators subscribe muster.assign.> once")
    ap.add_argument("--batch-window", type=float, default=0.05, help="seconds of arrivals per submitJobs request")
    ap.add_argument("--submit-via", choices=["nats", "graphql"], default="nats",
                    help="submission path: NATS (muster.submit, the high-rate path) or GraphQL submitJobs")
    ap.add_argument("--max-submit-inflight", type=int, default=4)
    ap.add_argument("--one-per-request", action="store_true",
                    help="with --submit-via graphql: --clients clients each send submitJob with one job "
                         "(bench/clients.py) instead of batched submitJobs")
    ap.add_argument("--clients", type=int, default=4, help="clients of --one-per-request")
    ap.add_argument("--queues", type=int, default=0,
                    help="create this many queues (q0, q1, ...; equal weights, each a fair part of every GPU "
                         "model's capacity as nominal quota) and submit each job to one of them, in turn")
    ap.add_argument("--cohorts", type=int, default=1,
                    help="cohorts the --queues are spread over (queue i in c<i %% N>)")
    ap.add_argument("--drain", type=float, default=None,
                    help="seconds to wait for undispatched jobs after the run (default 30; with --burst, 300 "
                         "after the burst was submitted)")
    ap.add_argument("--history-wait", type=float, default=60.0,
                    help="seconds to wait after the drain for the history database to hold every job that "
                         "ended in the window (history lag counts only rows written)")
    ap.add_argument("--lose-host-at", type=float, default=None,
                    help="seconds into the run to stop one host's heartbeats (default: a quarter of --duration; "
                         "none with --burst); negative disables")
    ap.add_argument("--lost-timeout", type=float, default=20.0, help="extra seconds to wait for LOST beyond the TTL")
    ap.add_argument("--startup-timeout", type=float, default=90.0)
    ap.add_argument("--preload", type=int, default=0,
                    help="start with this many long-running tasks already in the cluster (bench/preload.py)")
    ap.add_argument("--backlog", type=int, default=0,
                    help="start with this many jobs queued in a queue whose quota admits none of them, in front "
                         "of the measured jobs (bench/preload.py)")
    ap.add_argument("--read-flood", type=int, default=0,
                    help="clients sending the heaviest GraphQL reads back to back during the window (bench/readers.py)")
    ap.add_argument("--browse", type=int, default=0,
                    help="operators browsing the console during the window, a page a second (bench/readers.py)")
    ap.add_argument("--servers", type=int, choices=[1, 2], default=1,
                    help="muster server replicas (one leads; --one-per-request clients are spread over all)")
    ap.add_argument("--follower-heartbeats-every", type=float, default=None, metavar="S",
                    help="the servers' MUSTER_FOLLOWER_HEARTBEATS_EVERY: a follower reads every host's last heartbeat "
                         "every S seconds, nothing between (default: the servers' own, 0: as they are stored)")
    ap.add_argument("--db-url", default=None, help="the servers' history database (SQLAlchemy URL; default SQLite "
                    "in each server's data directory)")
    ap.add_argument("--postgres", action="store_true",
                    help="start a PostgreSQL server (fsync and synchronous_commit on) for the history")
    ap.add_argument("--kill-leader-at", type=float, default=None,
                    help="seconds into the window: SIGKILL the leading muster server (needs --servers 2)")
    ap.add_argument("--kill-nats-leader-at", type=float, default=None,
                    help="seconds into the window: SIGKILL the NATS node leading the state stream "
                    "(needs --nats-cluster 3)")
    ap.add_argument("--kill-nats-leader-of", choices=("state", "hosts"), default="state",
                    help="which stream's leading NATS node --kill-nats-leader-at kills (the report says which "
                    "streams it led)")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    return ap


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv
    if args.drain is None:
        args.drain = 300.0 if args.burst else 30.0
    if args.replicas is None:
        args.replicas = args.nats_cluster
    if args.nats_sync is None:
        args.nats_sync = "always" if args.nats_cluster == 3 else "default"
    if args.replicas > args.nats_cluster:
        print("bench failed: --replicas 3 needs --nats-cluster 3", file=sys.stderr)
        return 1
    if args.queues < 0 or args.cohorts < 1 or (args.queues and args.cohorts > args.queues):
        print("bench failed: --queues must be 0 or more and --cohorts from 1 to --queues", file=sys.stderr)
        return 1
    if args.one_per_request and (args.submit_via != "graphql" or args.burst or args.clients < 1):
        print("bench failed: --one-per-request needs --submit-via graphql, --clients 1 or more, and no --burst",
              file=sys.stderr)
        return 1
    if args.kill_leader_at is not None and args.servers < 2:
        print("bench failed: --kill-leader-at needs --servers 2", file=sys.stderr)
        return 1
    if args.kill_nats_leader_at is not None and args.nats_cluster != 3:
        print("bench failed: --kill-nats-leader-at needs --nats-cluster 3", file=sys.stderr)
        return 1
    if args.postgres and args.db_url:
        print("bench failed: --postgres starts a database of its own; leave out --db-url", file=sys.stderr)
        return 1
    if args.lose_host_at is None:
        args.lose_host_at = -1.0 if args.burst else args.duration / 4
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="muster-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    jpath = Path(args.json) if args.json else results_dir() / f"bench-{stamp}.json"
    ppath = Path(args.png) if args.png else jpath.with_suffix(".png")
    b = Bench(args, work)
    try:
        rep = asyncio.run(b.main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        b.stop_all()
    series = rep.pop("_series")
    rep["plot"] = str(ppath)
    rep["series"] = plot_series(series)
    ppath.parent.mkdir(parents=True, exist_ok=True)
    try:
        plot(rep, ppath)
    except ImportError as exc:  # matplotlib is the `bench` extra
        print(f"no plot: {exc} (pip install 'muster[bench]'; then python -m bench plot {jpath})", file=sys.stderr)
        rep["plot"] = None
    if args.keep or args.work_dir or not rep["correctness"]["ok"]:
        (work / "series.json").write_text(json.dumps(series))
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
        rep["work_dir"] = None
    jpath.parent.mkdir(parents=True, exist_ok=True)
    jpath.write_text(json.dumps(rep, indent=2) + "\n")
    show = {k: rep[k] for k in ("jobs_submitted", "jobs_dispatched", "tasks_submitted", "tasks_dispatched",
                                "submissions_per_s", "placements_per_s",
                                "heartbeats_per_s", "heartbeats_sent_per_s", "dispatch_latency_ms",
                                "running_latency_ms", "max_concurrent_tasks", "overcommitted_hosts",
                                "lost_host_detection")}
    show["correct"] = rep["correctness"]["ok"]
    show["replication"] = rep["replication"].get("stream_replicas")
    if "burst" in rep:
        show["burst"] = {k: rep["burst"][k] for k in ("jobs", "tasks", "submit_s", "time_to_dispatch_all_s",
                                                      "placements_per_s", "server_placements_per_s")}
    show["processes"] = {k: (v["cpu_s"], v["cpu_pct_in_window"], v["peak_rss_mb"]) for k, v in rep["processes"].items()}
    print(json.dumps(show, indent=1))
    print(f"report: {jpath}\nplot:   {rep['plot'] or '(not drawn)'}")
    if not rep["correctness"]["ok"]:
        print("CORRECTNESS CHECK FAILED: see 'correctness' in the report", file=sys.stderr)
        return 1
    return 0


def build_plot_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="muster bench plot", description="Draw a run's plot from its report.")
    ap.add_argument("report", help="a report written by `python -m bench` (bench/results/*.json)")
    ap.add_argument("-o", "--out", default=None, help="the PNG to write (default: the report's path with .png)")
    return ap


def plot_command(argv: list[str]) -> int:
    a = build_plot_parser().parse_args(argv)
    src = Path(a.report)
    try:
        rep = json.loads(src.read_text())
    except (OSError, ValueError) as exc:
        print(f"bench plot: cannot read {src}: {exc}", file=sys.stderr)
        return 1
    if isinstance(rep, dict) and "policies" in rep:  # a `bench placement` report
        out = Path(a.out) if a.out else src.with_suffix(".png")
        try:
            plot_placement(rep, out)
        except ImportError as exc:
            print(f"bench plot: {exc} (matplotlib is the `bench` extra: pip install 'muster[bench]')",
                  file=sys.stderr)
            return 1
        print(f"plot: {out}")
        return 0
    if not isinstance(rep, dict) or "series" not in rep or "config" not in rep:
        print(f"bench plot: {src} has no `series` (not a `python -m bench` report, or one written before "
              "reports kept what the plot draws; see bench/results/README.md)", file=sys.stderr)
        return 1
    out = Path(a.out) if a.out else src.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        plot(rep, out)
    except ImportError as exc:
        print(f"bench plot: {exc} (matplotlib is the `bench` extra: pip install 'muster[bench]')", file=sys.stderr)
        return 1
    print(f"plot: {out}")
    return 0
