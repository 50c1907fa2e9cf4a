"""The plot of a `muster bench` run, drawn from its report's `series`.

Three panels over the measured window: dispatch latency (p50, p99, max) and running
latency (p50) by second of submission; submitted, dispatched and placed jobs per second
with the heartbeats the server received; tasks running, queue depth and the server's
heartbeat backlog. `plot_series` reduces a run's raw samples to what the plot draws (a
few kB, kept in the report), so `python -m bench plot REPORT.json` redraws it later.

matplotlib is the `bench` extra (`pip install 'muster[bench]'`) and is imported only
when a plot is drawn.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.stats import pct

# The columns of a tick (bench.run.Bench.tick) the plot uses.
TICK_KEYS = ("t", "submitted", "dispatched_live", "placements", "hb_received", "running", "queue_depth",
             "hb_pending")


def plot_series(raw: dict[str, Any]) -> dict[str, Any]:
    """What the plot draws, from a run's raw series (its ticks, each job's submit and
    dispatch times, each job's submit and running times, and `t0`, the window's start):
    dispatch latency in ms by second of submission as [second, jobs, p50, p99, max],
    running latency as [second, p50], and the ticks' columns in TICK_KEYS."""
    t0 = raw["t0"]
    by_sec: dict[int, list[float]] = defaultdict(list)
    for sub, disp in raw["dispatch"]:
        by_sec[int(sub - t0)].append((disp - sub) * 1000)
    run_sec: dict[int, list[float]] = defaultdict(list)
    for sub, ra in raw["running"]:
        run_sec[int(sub - t0)].append((ra - sub) * 1000)
    r = lambda v: round(v, 2)  # noqa: E731
    return {
        "note": "what the plot draws (`python -m bench plot` redraws it from this): dispatch latency (ms) by "
                "second of submission [second, jobs, p50, p99, max], running latency [second, p50], and the "
                "once-a-second ticks; t0 = the window's start (seconds since the epoch)",
        "t0": t0,
        "dispatch_ms_by_second": [[x, len(v), r(pct(v, 50)), r(pct(v, 99)), r(max(v))]
                                  for x, v in sorted(by_sec.items())],
        "running_ms_by_second": [[x, r(pct(v, 50))] for x, v in sorted(run_sec.items())],
        "ticks": [{k: round(row.get(k, 0.0), 3) for k in TICK_KEYS} for row in raw["ticks"]],
    }


def plot(rep: dict[str, Any], path: Path) -> None:
    """Draw the report's `series` (see plot_series) into the PNG `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = rep["series"]
    t0 = s["t0"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    # 1. latency by second of submission
    disp = s["dispatch_ms_by_second"]
    ax = axes[0]
    if disp:
        xs = [row[0] for row in disp]
        ax.plot(xs, [row[2] for row in disp], label="dispatch p50")
        ax.plot(xs, [row[3] for row in disp], label="dispatch p99")
        ax.plot(xs, [row[4] for row in disp], label="dispatch max", alpha=0.5)
    running = s["running_ms_by_second"]
    if running:
        ax.plot([row[0] for row in running], [row[1] for row in running], label="running p50", linestyle="--")
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms)")
    cfg = rep["config"]
    load = f"burst of {cfg['burst']}" if cfg.get("burst") else f"{cfg['rate']}/s"
    ax.set_title(f"muster bench: {cfg['hosts']} hosts, {load}, {cfg['workload']}, "
                 f"{cfg['nats_cluster']} NATS node(s) (by second of submission)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, alpha=0.3)
    # 2. throughput
    ticks = s["ticks"]
    ax = axes[1]
    ax2 = ax.twinx()
    tx, sub_r, disp_r, pl_r, hb_r = [], [], [], [], []
    for p, q in zip(ticks, ticks[1:], strict=False):
        dt = max(1e-6, q["t"] - p["t"])
        tx.append(q["t"] - t0)
        sub_r.append((q["submitted"] - p["submitted"]) / dt)
        disp_r.append((q["dispatched_live"] - p["dispatched_live"]) / dt)
        pl_r.append((q["placements"] - p["placements"]) / dt)
        hb_r.append((q["hb_received"] - p["hb_received"]) / dt)
    ax.plot(tx, sub_r, label="submitted/s")
    ax.plot(tx, disp_r, label="dispatched/s")
    ax.plot(tx, pl_r, label="placements/s (server)", linestyle="--")
    ax2.plot(tx, hb_r, label="heartbeats received/s", color="grey", alpha=0.6)
    ax.set_ylabel("jobs per second")
    ax2.set_ylabel("heartbeats per second")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax.grid(True, alpha=0.3)
    # 3. concurrency
    ax = axes[2]
    ax.plot([r["t"] - t0 for r in ticks], [r["running"] for r in ticks], label="tasks running")
    ax.plot([r["t"] - t0 for r in ticks], [r["queue_depth"] for r in ticks], label="queue depth")
    # The server's own count of heartbeat records not yet applied (unread in the stream
    # or waiting in its ingest process). Sent minus received is no backlog: received
    # counts expiry markers, and simulators may heartbeat before the server exists.
    ax.plot([r["t"] - t0 for r in ticks], [r.get("hb_pending", 0.0) for r in ticks],
            label="heartbeat backlog (server: records not yet applied)", alpha=0.6)
    ax.set_xlabel("seconds since the first submission")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_placement(rep: dict[str, Any], path: Path) -> None:
    """Draw a `muster bench placement` report (bench.placement): the share of the cluster's
    GPU capacity allocated against the GPU demand arrived, one line per policy, with the
    FGD paper's published figures at 100 % and 130 % as marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, r in rep["policies"].items():
        curve = r["allocated_pct_by_arrived"]  # [arrived %, allocated %]
        ax.plot([lv for lv, _ in curve], [v for _, v in curve], label=f"Muster {policy}")
    paper = sorted(rep.get("paper_fgd_simulator", {}).items(), key=lambda kv: -kv[1]["at_130"])
    for k, (name, fig_) in enumerate(paper):
        ax.scatter([100, 130], [fig_["at_100"], fig_["at_130"]], marker="x", s=20, color="grey")
        ax.annotate(f"paper {name} {fig_['at_130']}", (133, 97 - 4 * k), fontsize=7, va="center")
    ax.set_xlabel("GPU demand arrived (% of capacity)")
    ax.set_ylabel("GPU capacity allocated (%)")
    ax.set_title(f"placement replay: {Path(rep['pods']).name} ({rep['order']} order, {rep['seeds']} seeds)",
                 fontsize=9)
    ax.set_xlim(0, 165)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
