"""Failover benchmark: leader loss to first new placement, placement latency before,
during and after a failover, and throughput on a 1-node versus a 3-node NATS cluster.

Starts NATS (1 node, or 3 with R3 state), two `muster server` replicas and two agents
(simulated GPUs, real processes running `true`), submits jobs on the NATS submission
path at --rate for --duration seconds, kills the leader with SIGKILL at --kill-at, and
reads every job record at the end (placement time from the leader, submission time from
the client).

    python -m bench.failover [--nats-cluster 1|3] [--rate 100] [--duration 30] [--kill-at 10]
                             [--json bench/results/failover-<n>node.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.foundation import summary_ms
from server.broker.natsd import free_port, start_cluster, start_nats, wait_for_port
from server.state.checker import load
from wire import natsclient
from wire.kv import Store, connect
from wire.messages import new_id
from wire.submit import submit_over_nats

ROOT = Path(__file__).resolve().parent.parent


def leader_of(servers: list[tuple[subprocess.Popen[bytes], str]], token: str) -> int | None:
    for i, (p, url) in enumerate(servers):
        if p.poll() is not None:
            continue
        try:
            r = httpx.post(url + "/graphql", json={"query": "{ cluster { leadership { role } } }"},
                           headers={"Authorization": f"Bearer {token}"}, timeout=2)
            if r.json()["data"]["cluster"]["leadership"]["role"] == "leader":
                return i
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            pass
    return None


async def submit_load(url: str, rate: float, duration: float, submitted: dict[str, float],
                      publish_timeout: float = 10.0) -> None:
    nc = await natsclient.connect(url.split(","), name="failover-bench")
    js = nc.jetstream(timeout=10)
    t0 = time.monotonic()
    n = 0
    # Batches not yet acknowledged, oldest first: their first try's time and their jobs,
    # ids included. A failed publish is sent again with the same ids, so that the jobs of a
    # try stored although its answer was lost are the resend's (the leader creates each id
    # once: no job runs uncounted, none twice); its jobs are timed from the first try.
    pending: list[tuple[float, list[dict[str, object]]]] = []
    while time.monotonic() - t0 < duration:
        due = int((time.monotonic() - t0) * rate) - n
        if due > 0:
            pending.append((time.time(), [{"id": new_id("j"), "name": f"fo-{n + i}", "command": ["true"], "gpus": 0,
                                           "cpus": 0.01, "memory_mb": 1} for i in range(due)]))
            n += due
        while pending:
            ts, jobs = pending[0]
            try:
                ids = await submit_over_nats(js, jobs, user="bench", timeout=publish_timeout, within_s=0)
            except Exception:  # noqa: BLE001 - NATS leader change: the same jobs again next tick
                break
            for jid in ids:
                submitted[jid] = ts
            pending.pop(0)
        await asyncio.sleep(0.02)
    await nc.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.failover")
    ap.add_argument("--nats-cluster", type=int, choices=[1, 3], default=1)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--kill-at", type=float, default=10)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="muster-failover-"))
    cluster = start_cluster(tmp / "nats", 3) if a.nats_cluster == 3 else None
    single = None if cluster else start_nats(tmp / "nats", port=0)
    url = cluster.url if cluster else single.url  # type: ignore[union-attr]
    env = {**os.environ, "MUSTER_REPLICAS": str(a.nats_cluster), "MUSTER_LOG_LEVEL": "WARNING"}
    exe = [sys.executable, "-m", "server.cli"]
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[tuple[subprocess.Popen[bytes], str]] = []
    log = open(tmp / "processes.log", "ab")
    try:
        for i in range(2):
            port = free_port()
            p = subprocess.Popen(exe + ["server", "--nats", url, "--http-port", str(port), "--data-dir",
                                        str(tmp / f"s{i}"), "--name", f"s{i}"], stdout=log, stderr=log, env=env,
                                 cwd=ROOT)
            wait_for_port(port, timeout=60)
            servers.append((p, f"http://127.0.0.1:{port}"))
            procs.append(p)
        for i in range(2):
            procs.append(subprocess.Popen(exe + ["agent", "--nats", url, "--host-id", f"fo-{i}", "--simulate-gpus",
                                                 "8xH100", "--cpus", "1000", "--memory-mb", "1000000"],
                                          stdout=log, stderr=log, env=env, cwd=ROOT))
        token_file = next(tmp / f"s{i}" / "token" for i in range(2) if (tmp / f"s{i}" / "token").exists())
        token = token_file.read_text().strip()
        deadline = time.monotonic() + 60
        while leader_of(servers, token) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # agents heartbeating
        submitted: dict[str, float] = {}

        async def run() -> float:
            load_task = asyncio.create_task(submit_load(url, a.rate, a.duration, submitted))
            await asyncio.sleep(a.kill_at)
            victim = leader_of(servers, token)
            killed = time.time()
            if victim is not None:
                servers[victim][0].send_signal(signal.SIGKILL)
            await load_task
            return killed

        killed = asyncio.run(run())
        time.sleep(10)

        async def records():
            nc = await connect(url, name="failover-read")
            try:
                return await load(Store(nc))
            finally:
                await nc.close()

        state = asyncio.run(records())
        placed = {j: min(att.placed_at for att in state.jobs[j].attempts)
                  for j in submitted if j in state.jobs and state.jobs[j].attempts}
        after_kill = sorted(t for t in placed.values() if t > killed)
        first_after = (after_kill[0] - killed) if after_kill else None
        phases: dict[str, list[float]] = {"before": [], "during": [], "after": []}
        for j, ts in submitted.items():
            if j not in placed:
                continue
            lat = placed[j] - ts
            key = "before" if ts < killed else ("during" if first_after is not None and ts < killed + first_after
                                                 else "after")
            phases[key].append(lat)
        steady = [t for j, t in placed.items() if submitted[j] < killed - 1 and submitted[j] > killed - a.kill_at + 2]
        report = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": "python -m bench.failover " + " ".join(argv if argv is not None else sys.argv[1:]),
            "nats_nodes": a.nats_cluster,
            "rate": a.rate,
            "jobs_submitted": len(submitted),
            "jobs_placed": len(placed),
            "leader_killed_to_first_placement_s": round(first_after, 3) if first_after is not None else None,
            "placement_latency_ms": {k: summary_ms(v) for k, v in phases.items()},
            "placements_per_s_before_kill": round(len(steady) / max(1e-6, a.kill_at - 3), 1),
        }
        print(json.dumps(report, indent=2))
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        if cluster:
            cluster.stop()
        if single:
            single.stop()


if __name__ == "__main__":
    sys.exit(main())
