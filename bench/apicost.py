"""What one `submitJob` costs a replica: `python -m bench api`.

    python -m bench api --clients 4 --seconds 8 --rounds 3 [--plan-share 0.5] [--json FILE]

A fresh nats-server and one `muster server` with no hosts, so that every job submitted
stays queued and the queue grows round after round (the case where every new job wakes
a scheduling cycle that walks the whole queue and places nothing). `--clients`
clients (bench.clients.run_clients: one keep-alive connection each) send `submitJob` with one job
each, closed loop (the next as soon as the last is answered), for `--seconds` per round.
Per round: requests answered, requests a second, the server process's CPU time per
request (from /proc, its historian and heartbeat ingest processes not included), the
`submitJob` answer times, and the queue's length at the round's end. `--plan-share`
sets the server's MUSTER_PLAN_SHARE (server/scheduling/cadence.py; 1 plans back to
back).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.calibration import python_speed
from bench.clients import run_clients
from bench.errors import BenchError
from bench.processes import Processes
from bench.stats import parse_metrics, summary_ms


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench api", description=__doc__.split("\n\n")[2])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0, help="length of a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--plan-share", type=float, default=None,
                   help="the server's MUSTER_PLAN_SHARE (default: the server's own)")
    p.add_argument("--json", type=Path, default=None)
    return p


async def _round(url: str, token: str, clients: int, seconds: float, first: int) -> tuple[int, list[float]]:
    """Closed-loop clients (bench.clients.run_clients, each taking the next job as soon
    as its last is answered) for `seconds`; returns the requests answered with a job
    and each request's answer time."""
    jobs: asyncio.Queue[tuple[float, dict[str, object], object] | None] = asyncio.Queue(maxsize=clients)

    async def feed() -> None:
        stop_at, i = time.monotonic() + seconds, 0
        while time.monotonic() < stop_at:
            await jobs.put((time.monotonic(), {"name": f"api-{first}-{i}", "command": ["true"], "gpus": 1}, None))
            i += 1
        for _ in range(clients):
            await jobs.put(None)

    feeder = asyncio.create_task(feed())
    res = await run_clients([url], token, clients, jobs, lambda _id, _at, _tag: None)
    await feeder
    if res.refused or res.failed:
        raise BenchError(f"submitJob refused {res.refused} and failed {res.failed} of "
                         f"{res.submitted + res.refused + res.failed} requests")
    return res.submitted, res.request_s


def _queue_depth(url: str, expected: int, wait_s: float = 10.0) -> int | None:
    """The server's own count of queued jobs (muster_queue_depth, set by each cycle):
    read until it reaches `expected` (the cycle that takes in the round's last jobs may
    not have run yet) or `wait_s` has passed; what it said last."""
    deadline = time.monotonic() + wait_s
    depth: int | None = None
    while True:
        try:
            m = parse_metrics(httpx.get(url + "/metrics", timeout=5).text)
            depth = int(m["muster_queue_depth"]) if "muster_queue_depth" in m else None
        except httpx.HTTPError:
            pass
        if depth == expected or time.monotonic() > deadline:
            return depth
        time.sleep(0.2)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    server_env = {} if args.plan_share is None else {"MUSTER_PLAN_SHARE": str(args.plan_share)}
    speed = python_speed()
    work = Path(tempfile.mkdtemp(prefix="muster-bench-api-"))
    procs = Processes(argparse.Namespace(nats_cluster=1, nats_sync="default", replicas=1, servers=1, preload=0,
                                         db_url=None), work)
    rounds: list[dict[str, Any]] = []
    try:
        procs.start_nats()
        procs.start_server(server_env)
        server = procs.servers[0][0].proc

        def cpu() -> float:
            t = server.cpu_times()
            return t.user + t.system

        queued, _ = asyncio.run(_round(procs.http, procs.token, args.clients, 1.0, -1))  # warm-up
        for r in range(args.rounds):
            before, t0 = cpu(), time.monotonic()
            done, times = asyncio.run(_round(procs.http, procs.token, args.clients, args.seconds, r))
            took, used = time.monotonic() - t0, cpu() - before
            queued += done
            rounds.append({"requests": done, "requests_per_s": round(done / took, 1),
                           "server_cpu_ms_per_request": round(1000 * used / max(1, done), 2),
                           "server_cpu_share": round(used / took, 3), "submit_ms": summary_ms(times),
                           "queued_at_end": queued,
                           "server_queue_depth": _queue_depth(procs.http, queued)})
            print(json.dumps({"round": r + 1, **rounds[-1]}), flush=True)
    finally:
        procs.stop_all()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench api " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["api"] else sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPUs; every process on one machine",
        "machine_speed": speed,
        "config": {"clients": args.clients, "seconds": args.seconds, "plan_share": args.plan_share},
        "rounds": rounds,
        "note": "queued_at_end: every job submitted so far, the warm-up round's included (none can be placed); "
                "server_queue_depth: the server's muster_queue_depth after the round",
    }


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = measure(args)
    except BenchError as exc:
        print(f"bench api: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"report: {args.json}")
    return 0
