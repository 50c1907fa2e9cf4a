"""The plot of a `muster bench` run: dispatch and running latency by second of
submission, throughput, and concurrency over the measured window. matplotlib is imported
only when a plot is drawn."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.stats import pct


def plot(rep: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = rep["_series"]
    t0 = s["t0"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    # 1. latency by second of submission
    by_sec: dict[int, list[float]] = defaultdict(list)
    for sub, disp in s["dispatch"]:
        by_sec[int(sub - t0)].append((disp - sub) * 1000)
    run_sec: dict[int, list[float]] = defaultdict(list)
    for sub, ra in s["running"]:
        run_sec[int(sub - t0)].append((ra - sub) * 1000)
    xs = sorted(by_sec)
    ax = axes[0]
    if xs:
        ax.plot(xs, [pct(by_sec[x], 50) for x in xs], label="dispatch p50")
        ax.plot(xs, [pct(by_sec[x], 99) for x in xs], label="dispatch p99")
        ax.plot(xs, [max(by_sec[x]) for x in xs], label="dispatch max", alpha=0.5)
    rx = sorted(run_sec)
    if rx:
        ax.plot(rx, [pct(run_sec[x], 50) for x in rx], label="running p50", linestyle="--")
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
    for p, q in zip(ticks, ticks[1:]):
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
