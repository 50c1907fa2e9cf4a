"""The operator benchmark's run: the five steps of bench/operator/__init__.py in order
(fill the history, start nats-server and the server, publish the fleet, submit live
jobs, measure), and its command line (`python -m bench.operator --help`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

import bench.operator
from bench.errors import BenchError
from bench.operator.fleet import build_fleet, publish_once, simulate
from bench.operator.history import TOPICS, fill_history
from bench.operator.measure import Sampler, measure
from bench.operator.queries import Plan, requests_for
from bench.operator.report import build_report, print_report
from bench.processes import Child, Processes
from bench.stats import parse_metrics
from bench.workload import write_fleet
from server.api.graphql.cursors import encode_cursor
from server.history.database import DB_FILE


class OperatorProcesses(Processes):
    """bench.processes' handling (spawn, nats-server, server, stop_all), the server
    started on the filled database with this benchmark's heartbeat interval."""

    db_url = ""

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        if name == "server":
            argv = [*argv, "--db-url", self.db_url, "--heartbeat-interval", str(self.args.heartbeat_interval)]
        return super().spawn(name, argv, env)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.operator", description=(bench.operator.__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("--hosts", type=int, default=50_000)
    ap.add_argument("--jobs", type=int, default=500_000, help="finished jobs in the history database")
    ap.add_argument("--days", type=float, default=30.0, help="history spans this many days")
    ap.add_argument("--reps", type=int, default=30, help="timed requests of each kind")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    ap.add_argument("--live-jobs", type=int, default=300, help="real jobs submitted through the API")
    ap.add_argument("--heartbeat-interval", type=float, default=30.0,
                    help="seconds between a host's heartbeats (the server is told the same); TTL = 3x")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (database, logs)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:
        return simulate(argv[1:])
    a = build_parser().parse_args(argv)
    a.nats_cluster = a.replicas = 1  # bench.processes reads these: one NATS node, R1,
    a.nats_sync = "default"  # and nats-server's default fsync
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="muster-operator-"))
    if work.exists() and any(work.iterdir()):
        print(f"bench.operator: --work-dir {work} is not empty (a fresh database and NATS store go there)",
              file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    procs = OperatorProcesses(a, work)
    try:
        rep = run(a, argv, procs)
    except BenchError as exc:
        print(f"bench.operator failed: {exc} (work dir {work})", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
    if not (a.keep or a.work_dir):
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rep, indent=2) + "\n")
        print(f"report: {a.json}")
    return 0 if rep["ok"] else 1


def run(a: argparse.Namespace, argv: list[str], procs: OperatorProcesses) -> dict[str, Any]:
    def say(msg: str) -> None:
        print(f"[operator {time.monotonic() - t_begin:6.1f}s] {msg}", flush=True)

    t_begin = time.monotonic()
    work = procs.work
    now = time.time()
    fleet = build_fleet(a.hosts, a.seed)
    say(f"{a.hosts:,} hosts ({len(fleet.live):,} heartbeating, {len(fleet.suspect)} to turn SUSPECT, "
        f"{len(fleet.lost)} LOST), {a.jobs:,} history jobs; work dir {work}")

    # 1. history
    (work / "server").mkdir(parents=True, exist_ok=True)
    procs.db_url = f"sqlite:///{work / 'server' / DB_FILE}"
    filled = fill_history(procs.db_url, fleet.hosts, a.jobs, seed=a.seed, days=a.days, now=now, progress=say)
    say(f"history filled in {filled.seconds:.1f} s: {filled.jobs:,} jobs, {filled.attempts:,} attempts, "
        f"{filled.events:,} events ({filled.alerts:,} alerts), {filled.db_bytes / 2**20:.0f} MiB")

    # 2. nats-server and the server
    t_start = time.monotonic()
    procs.start_nats()
    procs.start_server()
    server = next(c for c in procs.children if c.name == "server")
    write_fleet(fleet.live, work / "fleet.json")
    procs.spawn(
        "sim",
        [
            sys.executable,
            "-m",
            "bench.operator",
            "simulate",
            "--nats",
            procs.nats_url,
            "--fleet",
            str(work / "fleet.json"),
            "--out",
            str(work / "sim.json"),
            "--wildcard",
            "--heartbeat-interval",
            str(a.heartbeat_interval),
        ],
    )
    once = [(h, f"{int(max(3600, 20 * a.heartbeat_interval))}s") for h in fleet.suspect] + [
        (h, "2s") for h in fleet.lost
    ]
    asyncio.run(publish_once(procs.nats_url, once))
    sampler = Sampler(procs.children)
    sampler.start()
    api = httpx.Client(base_url=procs.http, headers={"Authorization": f"Bearer {procs.token}"}, timeout=300)
    console = httpx.Client(base_url=procs.http, timeout=300, follow_redirects=False)
    try:
        deadline = time.monotonic() + a.startup_timeout + 3 * a.heartbeat_interval
        want = {"HEALTHY": len(fleet.live), "SUSPECT": len(fleet.suspect), "LOST": len(fleet.lost)}
        while True:
            for c in procs.children:
                if c.popen is not None and c.popen.poll() is not None:
                    raise BenchError(f"{c.name} exited with {c.popen.returncode}; see {c.log}")
            m = parse_metrics(api.get("/metrics").text)
            seen = {k: int(m.get(f'muster_hosts{{health="{k}"}}', 0)) for k in want}
            # Every host seen; the one-shot hosts SUSPECT and LOST; heartbeating ones HEALTHY (1 %
            # may lag into SUSPECT on a loaded machine).
            if (
                sum(seen.values()) == a.hosts
                and seen["LOST"] >= want["LOST"]
                and seen["SUSPECT"] >= want["SUSPECT"]
                and seen["HEALTHY"] >= 0.99 * want["HEALTHY"]
            ):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"hosts not in place after {a.startup_timeout + 3 * a.heartbeat_interval:.0f} s: "
                                 f"server sees {seen}, wanted {want}")
            say(f"waiting for hosts: server sees {seen}, wants {want}")
            time.sleep(3)
        for p in psutil.Process(server.proc.pid).children():
            # The server names its helper processes (wire.logs.name_this_process).
            role = {"muster-history": "historian", "muster-ingest": "heartbeat ingest"}.get(p.name())
            if role:
                procs.children.append(Child(role, None, p))
        say("hosts in place; cordoning and draining")
        cordon = """mutation($input: HostActionInput!) { cordonHost(input: $input) { userErrors { message } } }"""
        drain = """mutation($input: DrainHostInput!) { drainHost(input: $input) { userErrors { message } } }"""
        for hid in fleet.cordoned:
            _ok(
                api.post(
                    "/graphql", json={"query": cordon, "variables": {"input": {"id": hid, "reason": "bench: RMA"}}}
                )
            )
        for hid in fleet.drained:
            _ok(api.post("/graphql", json={"query": drain, "variables": {
                "input": {"id": hid, "reason": "bench: kernel upgrade", "deadlineSeconds": 86400}}}))

        # 4. live jobs
        queued_job, live = submit_live(api, a.live_jobs, a.seed, say)
        want_total = filled.jobs + a.live_jobs
        deadline = time.monotonic() + 120
        while True:
            d = _ok(api.post("/graphql", json={"query": "{ jobs(first: 1) { totalCount } cluster { jobs { "
                                                        "queued placed running succeeded } } }"}))
            js = d["cluster"]["jobs"]
            if (d["jobs"]["totalCount"] == want_total and js["running"] == live["running"]
                    and js["succeeded"] >= live["short"]):
                break
            if time.monotonic() > deadline:
                raise BenchError(
                    f"live jobs not in place: totalCount {d['jobs']['totalCount']} (want {want_total}), "
                    f"{js} (want {live})"
                )
            time.sleep(1)
        startup_s = time.monotonic() - t_start
        say(f"{want_total:,} jobs in history; live jobs {js}; cursors for the deep pages")
        counts_q = "{ cluster { hosts { total healthy suspect lost } } }"
        hosts_at_start = _ok(api.post("/graphql", json={"query": counts_q}))
        host_cursor = _ok(api.post("/graphql", json={"query": "query($a: String) { hosts(first: 1, after: $a) { "
                                                               "edges { cursor } } }",
                                                      "variables": {"a": encode_cursor(a.hosts // 2 - 1)}}))
        job_cursor = _ok(api.post("/graphql", json={"query": "query($a: String) { jobs(first: 1, after: $a) { "
                                                              "edges { cursor } } }",
                                                     "variables": {"a": encode_cursor(want_total // 2 - 1)}}))
        plan = Plan(fleet, filled, want_total, queued_job, host_cursor["hosts"]["edges"][0]["cursor"],
                    job_cursor["jobs"]["edges"][0]["cursor"])
        reqs = requests_for(plan)

        # 5. measure
        r = console.post("/login", data={"token": procs.token})
        if r.status_code != 303 or r.headers.get("location") != "/":
            raise BenchError(f"console login failed: HTTP {r.status_code}")
        for c in procs.children:
            c.sample()
            c.cpu_at_start = c.cpu
        t_measure = time.monotonic()
        say(f"measuring {len(reqs)} requests x ({a.warmup} warm-up + {a.reps}) rounds")
        measure(reqs, console, api, server.proc, a.warmup, a.reps, say)
        window = time.monotonic() - t_measure
        for c in procs.children:
            c.sample()
            c.cpu_at_end = c.cpu
        hosts_at_end = _ok(api.post("/graphql", json={"query": "{ cluster { hosts { total healthy suspect lost } } }"}))
    finally:
        sampler.stop.set()
        api.close()
        console.close()

    rep = build_report(a, argv, fleet=fleet, filled=filled, live=live, jobs_total=want_total,
                       hosts_at_start=hosts_at_start, hosts_at_end=hosts_at_end, startup_s=startup_s, window=window,
                       reqs=reqs, children=procs.children)
    print_report(rep)
    return rep


def _ok(r: httpx.Response) -> dict[str, Any]:
    if r.status_code != 200:
        raise BenchError(f"GraphQL HTTP {r.status_code}: {r.text[:300]}")
    body = r.json()
    if body.get("errors"):
        raise BenchError(f"GraphQL errors: {str(body['errors'])[:300]}")
    for v in body["data"].values():
        errs = v.get("userErrors") if isinstance(v, dict) else None
        if errs:
            raise BenchError(f"GraphQL userErrors: {errs}")
    return body["data"]


def submit_live(api: httpx.Client, n: int, seed: int, say: Callable[[str], None]) -> tuple[str, dict[str, int]]:
    """Real jobs through `submitJobs`: long ones that run on the simulated hosts, ones that
    wait for a GPU model no host has, short ones that finish. Returns a queued job's id."""
    rng = random.Random(seed + 3)
    n_queued = max(1, n // 5)
    n_short = max(1, n // 5)
    n_run = max(1, n - n_queued - n_short)
    inputs: list[dict[str, Any]] = []
    for i in range(n_run):
        g = rng.choice((1, 2, 4, 8))
        inputs.append({"name": f"live-train-{rng.choice(TOPICS)}-{i}", "command": ["sleep", "86400"], "gpus": g,
                       "cpus": float(4 * g), "memoryMb": 8192 * g, "priority": rng.choice((0, 0, 0, 100))})
    for i in range(n_queued):
        inputs.append({"name": f"live-b200-{i}", "command": ["sleep", "3600"], "gpus": 8, "gpuModel": "B200",
                       "cpus": 32.0, "memoryMb": 65536})
    for i in range(n_short):
        inputs.append({"name": f"live-short-{i}", "command": ["sleep", "0.2"], "gpus": 0, "cpus": 1.0, "memoryMb": 512})
    q = """mutation($input: [SubmitJobInput!]!) { submitJobs(input: $input) { job { id } userErrors { message } } }"""
    ids: list[str] = []
    for i in range(0, len(inputs), 1000):
        res = _ok(api.post("/graphql", json={"query": q, "variables": {"input": inputs[i: i + 1000]}}))["submitJobs"]
        for r in res:
            if not r["job"]:
                raise BenchError(f"live job refused: {r['userErrors']}")
            ids.append(r["job"]["id"])
    say(f"submitted {len(ids)} live jobs ({n_run} long, {n_queued} waiting for B200, {n_short} short)")
    return ids[n_run], {"running": n_run, "queued": n_queued, "short": n_short}


if __name__ == "__main__":
    sys.exit(main())
