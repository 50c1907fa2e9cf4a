"""Idle-cluster figures: submit-to-running latency and placements per second for a burst.

Starts a real nats-server, one `muster server` and two `muster agent` processes with
simulated GPUs, then:
  1. submits N jobs one after another; each job prints its own start time as its first
     instruction (`date +%s.%N`), so dispatch latency runs from just before the submit
     call to the job's first instruction;
  2. submits 1,000 jobs in one `submitJobs` request and measures placements per second
     from the committed placement times.

    python -m bench.foundation [--jobs 200] [--burst 1000] [--json bench/results/foundation.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from server.broker.natsd import free_port, start_nats, wait_for_port

ROOT = Path(__file__).resolve().parent.parent


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def summary_ms(xs: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in xs]
    return {"n": len(ms), "p50": round(pct(ms, 50), 1), "p95": round(pct(ms, 95), 1),
            "p99": round(pct(ms, 99), 1), "max": round(max(ms), 1) if ms else float("nan"),
            "mean": round(statistics.fmean(ms), 1) if ms else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="muster-bench-"))
    nats = start_nats(tmp / "nats", port=0)
    procs: list[subprocess.Popen[bytes]] = []
    port = free_port()
    exe = [sys.executable, "-m", "server.cli"]
    try:
        log = open(tmp / "server.log", "ab")
        procs.append(subprocess.Popen(exe + ["server", "--nats", nats.url, "--http-port", str(port),
                                             "--data-dir", str(tmp / "srv")], stdout=log, stderr=log, cwd=ROOT))
        wait_for_port(port, timeout=60)
        for i in (1, 2):
            procs.append(subprocess.Popen(exe + ["agent", "--nats", nats.url, "--host-id", f"bench-{i}",
                                                 "--simulate-gpus", "8xH100", "--cpus", "1024",
                                                 "--memory-mb", "1048576"],
                                          stdout=log, stderr=log, cwd=ROOT))
        token = (tmp / "srv" / "token").read_text().strip()
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                            timeout=60)

        def gql(q: str, v: dict | None = None) -> dict:
            r = http.post("/graphql", json={"query": q, "variables": v or {}})
            r.raise_for_status()
            body = r.json()
            if body.get("errors"):
                raise RuntimeError(body["errors"])
            return body["data"]

        while gql("{ cluster { hosts { healthy } } }")["cluster"]["hosts"]["healthy"] < 2:
            time.sleep(0.1)
        submit = (
            """mutation($input: SubmitJobInput!) { submitJob(input: $input) { job { id } userErrors { message } } }"""
        )
        job_q = """query($id: ID!) { job(id: $id) { state attempts { placedAt startedAt outputTail } } }"""

        def wait_done(jid: str) -> dict:
            while True:
                j = gql(job_q, {"id": jid})["job"]
                if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    return j
                time.sleep(0.005)

        # 1. one job at a time on an idle cluster
        dispatch: list[float] = []
        running: list[float] = []
        for i in range(args.jobs):
            t0 = time.time()
            jid = gql(submit, {"input": {"name": f"idle-{i}", "command": ["date", "+%s.%N"], "gpus": 1,
                                          "cpus": 1, "memoryMb": 64}})["submitJob"]["job"]["id"]
            j = wait_done(jid)
            started = float(j["attempts"][0]["outputTail"].strip())
            dispatch.append(started - t0)
            running.append(datetime.fromisoformat(j["attempts"][0]["startedAt"]).timestamp() - t0)

        # 2. a burst of jobs in one request
        inputs = [{"name": f"burst-{i}", "command": ["sleep", "1"], "gpus": 0, "cpus": 0.5, "memoryMb": 16}
                  for i in range(args.burst)]
        t0 = time.time()
        res = gql("""mutation($input: [SubmitJobInput!]!) { submitJobs(input: $input) { job { id } } }""",
                  {"input": inputs})["submitJobs"]
        t_submitted = time.time()
        ids = [r["job"]["id"] for r in res]
        placed: list[float] = []
        for jid in ids:
            j = wait_done(jid)
            placed.append(datetime.fromisoformat(j["attempts"][0]["placedAt"]).timestamp())
        span = max(placed) - t0
        report = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()} CPUs, every process on one machine",
            "idle_submit_to_first_instruction_ms": summary_ms(dispatch),
            "idle_submit_to_running_reported_ms": summary_ms(running),
            "burst_jobs": args.burst,
            "burst_submit_request_s": round(t_submitted - t0, 3),
            "burst_all_placed_after_s": round(span, 3),
            "burst_placements_per_s": round(args.burst / span, 1),
        }
        print(json.dumps(report, indent=2))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        nats.stop()


if __name__ == "__main__":
    main()
