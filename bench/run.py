"""Orchestration of one `muster bench` run.

Starts nats-server (one node, or a 3-node cluster from copies of nats/cluster/n*.conf on
free ports), one `muster server`, the state observer (bench/observer.py) and K host
simulator processes (bench/simhosts.py, ~20,000 hosts each), waits until the server sees
every host healthy, then submits jobs for --duration seconds (Poisson arrivals, batched
and published on the NATS submission subject, or sent as `submitJobs` requests with
--submit-via graphql; the submit time of a job is taken just before its publish/request),
silences one host's heartbeats part-way to time loss detection, drains, collects every
process's results and writes the JSON report and a PNG plot.

With --burst N it submits N jobs at once instead (as fast as the submission path takes
them) and measures the time until every one has reached its hosts: the maximum placement
throughput, for comparing one NATS node with three.

A gang (a trace job of more than 8 GPUs) is one job of `replicas` tasks. It counts as
dispatched when every task of one try has reached a host; its dispatch latency is that
moment minus its submit time, counted once per gang (see `judge`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.preload import PREFIX as PRELOAD_PREFIX
from bench.preload import preload
from bench.workload import (JobReq, Synthetic, Trace, arrivals, synthetic_fleet, trace_fleet, write_fleet)
from wire import natsclient
from wire.submit import submit_over_nats
from server.history.database import DB_FILE as HISTORY_DB_FILE
from server.broker.natsd import free_port, nats_server_binary, start_nats, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
SUBMIT = """mutation($input: [SubmitJobInput!]!) { submitJobs(input: $input) { job { id } userErrors { message } } }"""
HOST = "query($id: ID!) { host(id: $id) { id health } }"
# Jobs per submission: submitJobs takes up to 1,000; on NATS the leader takes a submission
# message only when all its jobs fit in what one commit leaves for inputs (900 keys less
# 258, server/planner.py plan_cycle), so a message of more than 642 jobs would never be
# taken and would hold up every later one.
MAX_BATCH = {"graphql": 1000, "nats": 500}


class BenchError(Exception):
    pass


# ---------------------------------------------------------------- statistics


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))
    return xs[k]


def summary_ms(xs: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in xs]
    r = lambda v: None if v is None else round(v, 1)  # noqa: E731
    return {"n": len(ms), "p50": r(pct(ms, 50)), "p95": r(pct(ms, 95)), "p99": r(pct(ms, 99)),
            "max": r(max(ms)) if ms else None, "mean": r(statistics.fmean(ms)) if ms else None}


SUSPECT_GAUGE = 'muster_hosts{health="SUSPECT"}'


def max_in(samples: list[tuple[float, dict[str, float]]], name: str) -> float | None:
    """The largest value of metric `name` in scraped `samples`; None if it never appeared."""
    values = [m[name] for _, m in samples if name in m]
    return max(values) if values else None


# The window starts once the observer has this many state records or fewer left to read.
OBSERVER_CAUGHT_UP = 2000


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def _histogram(first: dict[str, float], end: dict[str, float], name: str
               ) -> tuple[list[tuple[float, float]], float, float]:
    """A Prometheus histogram between two scrapes (`first` empty: since the start),
    summed over its labels: (cumulative count by bucket bound, ascending), count, sum."""
    by_le: dict[float, float] = defaultdict(float)
    total = sum_s = 0.0
    for k, v in end.items():
        if not k.startswith(name):
            continue
        mm = re.match(rf'{name}_bucket\{{(?:[^}}]*,)?le="([^"]+)"\}}', k)
        if mm:
            by_le[float("inf") if mm.group(1) == "+Inf" else float(mm.group(1))] += v - first.get(k, 0.0)
        elif re.match(rf"{name}_count(\{{|$)", k):
            total += v - first.get(k, 0.0)
        elif re.match(rf"{name}_sum(\{{|$)", k):
            sum_s += v - first.get(k, 0.0)
    return sorted(by_le.items()), total, sum_s


def histogram_quantiles(m: dict[str, float], name: str) -> dict[str, Any]:
    """p50/p95/p99 upper bounds from a Prometheus histogram's cumulative buckets."""
    buckets, total, sum_s = _histogram({}, m, name)
    out: dict[str, Any] = {"count": int(total), "sum_s": round(sum_s, 3)}
    for p in (50, 95, 99):
        le = None
        for b, c in buckets:
            if total and c >= total * p / 100:
                le = b
                break
        out[f"p{p}_le_s"] = le if le != float("inf") else "+Inf"
    return out


def histogram_window(first: dict[str, float], end: dict[str, float], name: str) -> dict[str, Any]:
    """Observations of a Prometheus histogram between two scrapes: how many, how many
    longer than 0.1, 0.5 and 1 s, and the bucket the longest fell in."""
    cum, total, sum_s = _histogram(first, end, name)
    out: dict[str, Any] = {"count": int(total), "sum_s": round(sum_s, 3)}
    for limit in (0.1, 0.5, 1.0):
        within = max((c for b, c in cum if b <= limit), default=0.0)
        out[f"over_{limit:g}_s"] = int(total - within)
    longest = next((b for b, c in cum if c >= total), None) if total else None
    out["max_le_s"] = "+Inf" if longest == float("inf") else longest
    return out


# ---------------------------------------------------------------- dispatch checks


@dataclass
class Verdict:
    """How one submitted job (single or gang) reached the simulated hosts."""

    dispatched_at: float | None = None  # when the last task of its first complete try arrived
    tasks_seen: int = 0  # distinct task indices that reached a host, over all tries
    tries: int = 0
    twice: bool = False  # an attempt or a task reached hosts more than once, or a retry without cause
    partial: bool = False  # a try of which some tasks reached hosts and others never did
    shared_host: bool = False  # two tasks of one try on one host, where they cannot both fit
    problems: list[str] = field(default_factory=list)


def attempt_id(job_id: str, number: int, task: int, replicas: int) -> str:
    """The server's attempt id (server/planner.py): `<job>.<try>`, or `<job>.<try>.<task>` in a gang."""
    return f"{job_id}.{number}.{task}" if replicas > 1 else f"{job_id}.{number}"


def try_number(job_id: str, aid: str) -> int:
    """The try an attempt id belongs to (0 if it is not one of this job's)."""
    try:
        return int(aid[len(job_id) + 1:].split(".")[0]) if aid.startswith(job_id + ".") else 0
    except ValueError:
        return 0


def judge(job_id: str, replicas: int, arrivals: list[tuple[str, str, float, int]], placed: dict[str, str],
          lost_host: str | None, exclusive: bool) -> Verdict:
    """Check one job's arrivals: (attempt id, host, wall time, task index) for each first
    sighting of an attempt on a host. `placed` maps attempt id -> host from the job's
    records (may be empty), `lost_host` is the host the benchmark killed, and `exclusive`
    says a gang's tasks cannot share a host (each needs more than half of the largest).

    All-or-nothing: every try that reached any host reached it with all `replicas` tasks,
    unless the missing tasks were placed on the killed host (which ignores assignments).
    A second try is right only when the first one touched the killed host."""
    v = Verdict()
    by_attempt: dict[str, list[tuple[str, float, int]]] = defaultdict(list)
    for aid, host, ts, task in arrivals:
        by_attempt[aid].append((host, ts, task))
    tries: dict[int, dict[int, list[tuple[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for aid, seen in by_attempt.items():
        if len(seen) > 1:
            v.twice = True
            v.problems.append(f"attempt {aid} reached hosts {len(seen)} times ({sorted(h for h, _, _ in seen)})")
        host, ts, task = min(seen, key=lambda x: x[1])
        tries[try_number(job_id, aid)][task].append((host, ts))
    v.tries = len(tries)
    want = set(range(replicas))
    v.tasks_seen = len({t for tasks in tries.values() for t in tasks} & want)
    for number in sorted(tries):
        tasks = tries[number]
        if set(tasks) - want:
            v.twice = True
            v.problems.append(f"try {number}: task indices {sorted(set(tasks) - want)} outside 0..{replicas - 1}")
        for t, hs in tasks.items():
            if len(hs) > 1:
                v.twice = True
                v.problems.append(f"try {number}: task {t} dispatched {len(hs)} times")
        hosts = [h for hs in tasks.values() for h, _ in hs]
        if exclusive and len(set(hosts)) < len(hosts):
            v.shared_host = True
            v.problems.append(f"try {number}: {len(hosts)} tasks on only {len(set(hosts))} hosts")
        missing = want - set(tasks)
        if not missing:
            if v.dispatched_at is None:
                v.dispatched_at = max(ts for hs in tasks.values() for _, ts in hs)
        elif not (lost_host and all(placed.get(attempt_id(job_id, number, i, replicas)) == lost_host
                                    for i in missing)):
            v.partial = True
            v.problems.append(f"try {number}: {len(want & set(tasks))} of {replicas} tasks dispatched")
    if len(tries) > 1:
        first = min(tries)
        first_hosts = {h for hs in tries[first].values() for h, _ in hs}
        first_hosts |= {h for aid, h in placed.items() if try_number(job_id, aid) == first}
        if len(tries) > 2 or lost_host not in first_hosts:
            v.twice = True
            v.problems.append(f"{len(tries)} tries reached hosts; the first did not touch the killed host")
    return v


# ---------------------------------------------------------------- processes


@dataclass
class Child:
    name: str
    popen: subprocess.Popen | None
    proc: psutil.Process
    log: Path | None = None
    peak_rss: int = 0
    cpu: float = 0.0
    cpu_at_start: float | None = None
    cpu_at_end: float | None = None

    def sample(self) -> None:
        try:
            t = self.proc.cpu_times()
            self.cpu = t.user + t.system
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass

    def alive(self) -> bool:
        return self.popen.poll() is None if self.popen is not None else self.proc.is_running()

    def stop(self, timeout: float = 15) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@dataclass
class Bench:
    args: argparse.Namespace
    work: Path
    children: list[Child] = field(default_factory=list)
    nats_url: str = ""
    http: str = ""
    token: str = ""
    stats: dict[str, dict] = field(default_factory=dict)
    live_dispatch: dict[str, float] = field(default_factory=dict)  # job -> when its last task arrived
    live_tasks: dict[str, dict[int, float]] = field(default_factory=dict)  # job -> task -> first arrival
    live_tasks_n: int = 0
    submitted: dict[str, tuple[float, JobReq]] = field(default_factory=dict)
    tasks_submitted: int = 0
    replication: dict[str, Any] = field(default_factory=dict)
    burst_started: float | None = None
    burst_submitted: float | None = None
    submit_errors: int = 0
    submit_requests: int = 0
    ticks: list[dict] = field(default_factory=list)
    metrics: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    lost: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    preloaded: dict[str, float] = field(default_factory=dict)
    observer_behind_at_start: int | None = None  # state records the observer had left to read
    machine_cpu_at_start: Any = None  # psutil.cpu_times() at the window's start and end
    machine_cpu_at_end: Any = None

    # ------------------------------------------------------------ start and stop

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.work / f"{name}.log"
        out = open(log, "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        out.close()
        c = Child(name, p, psutil.Process(p.pid), log)
        self.children.append(c)
        return c

    def start_nats(self) -> None:
        if self.args.nats_cluster == 1:
            conf = None
            if self.args.nats_sync == "always":
                conf = self.work / "sync.conf"
                conf.write_text("jetstream { sync_interval: always }\n")
            n = start_nats(self.work / "nats", port=0, config=conf)
            self.children.append(Child("nats-server", n.proc, psutil.Process(n.proc.pid), n.log_path))
            self.nats_url = n.url
            return
        if self.args.nats_cluster != 3:
            raise BenchError("--nats-cluster must be 1 or 3")
        src = ROOT / "nats" / "cluster"
        confs = [src / f"n{i}.conf" for i in (1, 2, 3)]
        missing = [str(c) for c in confs if not c.exists()]
        if missing:
            raise BenchError(f"--nats-cluster 3 needs {', '.join(missing)} (not in this checkout)")
        ports = {old: free_port() for old in (4222, 4223, 4224, 6222, 6223, 6224, 8222, 8223, 8224)}
        urls, monitors = [], []
        for i, c in enumerate(confs, start=1):
            text = c.read_text()
            for old, new in ports.items():
                text = text.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
            text = text.replace(f'"./data/n{i}"', json.dumps(str(self.work / "nats" / f"n{i}")))
            if self.args.nats_sync == "default":
                text = re.sub(r"^\s*sync_interval:\s*always\s*$", "", text, flags=re.M)
            if f"127.0.0.1:{ports[4221 + i]}" not in text or str(self.work) not in text:
                raise BenchError(f"{c} does not have the expected listen/store_dir lines; cannot relocate it")
            conf = self.work / f"n{i}.conf"
            conf.write_text(text)
            log = self.work / f"nats-n{i}.log"
            out = open(log, "ab")
            p = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                                 cwd=self.work, start_new_session=True)
            out.close()
            self.children.append(Child(f"nats-server-n{i}", p, psutil.Process(p.pid), log))
            urls.append(f"nats://127.0.0.1:{ports[4221 + i]}")
            monitors.append(ports[8221 + i])
        for (i, u), c in zip(enumerate(urls), self.children[-3:]):
            wait_for_port(int(u.rsplit(":", 1)[1]), timeout=30, proc=c.popen)
        deadline = time.monotonic() + 60
        for m in monitors:
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{m}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise BenchError("the 3-node NATS cluster did not become ready (JetStream) within 60 s")
                time.sleep(0.5)
        self.nats_url = ",".join(urls)

    @property
    def server_data_dir(self) -> Path:
        """The server's --data-dir (its history database lives there)."""
        return self.work / "server"

    def preloaded_in_history(self) -> int:
        """How many preloaded jobs the historian has written (its SQLite file, read only)."""
        db = self.server_data_dir / HISTORY_DB_FILE
        if not db.exists():
            return 0
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            try:
                # GLOB (case-sensitive) with a literal prefix is answered from the key's index.
                return int(con.execute("SELECT count(*) FROM jobs WHERE id GLOB ?",
                                       (PRELOAD_PREFIX + "*",)).fetchone()[0])
            finally:
                con.close()
        except sqlite3.Error:
            return 0  # not created yet, or busy

    def start_server(self) -> None:
        port = free_port()
        # Set either way, so that a MUSTER_REPLICAS in the caller's environment cannot leak in.
        env = {"MUSTER_REPLICAS": str(self.args.replicas)}
        data = self.server_data_dir
        c = self.spawn("server", [sys.executable, "-m", "server.cli", "server", "--nats", self.nats_url,
                                  "--http-port", str(port), "--data-dir", str(data), "--name", "bench-server"], env)
        try:
            # A server loads the whole state before it listens (about 90 s for 500,000 jobs).
            wait_for_port(port, timeout=90 + getattr(self.args, "preload", 0) / 2000, proc=c.popen)
        except Exception as exc:
            raise BenchError(f"muster server did not start: {exc}; see {c.log}") from exc
        self.http = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            tf = data / "token"
            if tf.exists() and tf.read_text().strip():
                self.token = tf.read_text().strip()
                return
            time.sleep(0.1)
        raise BenchError("muster server wrote no token")

    def stop_all(self) -> None:
        for c in reversed(self.children):
            c.stop()

    # ------------------------------------------------------------ the run

    async def gql(self, client: httpx.AsyncClient, q: str, v: dict | None = None) -> dict:
        r = await client.post("/graphql", json={"query": q, "variables": v or {}})
        r.raise_for_status()
        body = r.json()
        if body.get("errors"):
            raise BenchError(f"GraphQL error: {body['errors']}")
        return body["data"]

    async def on_stats(self, msg) -> None:  # type: ignore[no-untyped-def]
        d = json.loads(msg.data)
        who = msg.subject.rsplit(".", 1)[1]
        for job_id, task, ts in d.pop("arrivals", []):
            seen = self.live_tasks.setdefault(job_id, {})
            if task not in seen:
                seen[task] = ts
                self.live_tasks_n += 1
                self.live_complete(job_id)
        self.stats[who] = d

    def live_complete(self, job_id: str) -> None:
        """Mark a job dispatched (live view) once every one of its tasks has reached a host."""
        if job_id in self.live_dispatch or job_id not in self.submitted:
            return
        seen = self.live_tasks.get(job_id)
        if seen and len(seen) >= self.submitted[job_id][1].replicas:
            self.live_dispatch[job_id] = max(seen.values())

    def sims(self) -> list[dict]:
        return [v for k, v in self.stats.items() if k != "observer"]

    async def sample_loop(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        me = psutil.Process()
        self.children.append(Child("bench (submitter, orchestrator)", None, me))
        while not stop.is_set():
            for c in self.children:
                c.sample()
            try:
                r = await client.get("/metrics", timeout=10)
                self.metrics.append((time.time(), parse_metrics(r.text)))
            except httpx.HTTPError:
                pass
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass

    def tick(self, t0: float, phase: str) -> None:
        now = time.time()
        sims = self.sims()
        m = self.metrics[-1][1] if self.metrics else {}
        row = {"t": now, "phase": phase, "submitted": len(self.submitted), "dispatched_live": len(self.live_dispatch),
               "tasks_submitted": self.tasks_submitted, "tasks_dispatched_live": self.live_tasks_n,
               "running": sum(s.get("running", 0) for s in sims), "hb_sent": sum(s.get("hb_sent", 0) for s in sims),
               "hb_received": m.get("muster_heartbeats_received_total", 0.0),
               "placements": m.get("muster_placements_total", 0.0), "queue_depth": m.get("muster_queue_depth", 0.0),
               "suspect": m.get(SUSPECT_GAUGE, 0.0),
               "hb_pending": m.get("muster_heartbeats_pending", 0.0),
               "reports_pending": sum(s.get("reports_pending", 0) for s in sims),
               "sim_loop_lag_max_ms": max((s.get("loop_lag_max_ms", 0) for s in sims), default=0)}
        prev = self.ticks[-1] if self.ticks else row
        dt = max(1e-6, row["t"] - prev["t"])
        recent = [self.live_dispatch[j] - self.submitted[j][0] for j in list(self.live_dispatch)[-2000:]
                  if j in self.submitted and self.live_dispatch[j] > now - 1.0]
        self.ticks.append(row)
        srv = next((c for c in self.children if c.name == "server"), None)
        print(f"[{phase} {now - t0:6.1f}s] sub {row['submitted']:>7} ({(row['submitted'] - prev['submitted']) / dt:5.0f}/s)"
              f" disp {row['dispatched_live']:>7} ({(row['dispatched_live'] - prev['dispatched_live']) / dt:5.0f}/s)"
              f" run {row['running']:>6} queue {row['queue_depth']:>6.0f} suspect {row['suspect']:>5.0f}"
              f" | hb sent {(row['hb_sent'] - prev['hb_sent']) / dt:6.0f}/s recv {(row['hb_received'] - prev['hb_received']) / dt:6.0f}/s"
              f" | placed {(row['placements'] - prev['placements']) / dt:5.0f}/s"
              f" | disp p50/max {(pct(recent, 50) or 0) * 1000:6.0f}/{(max(recent) if recent else 0) * 1000:6.0f} ms"
              f" | server cpu {srv.cpu if srv else 0:6.1f}s", flush=True)

    def record_submitted(self, job_id: str, ts: float, req: JobReq) -> None:
        self.submitted[job_id] = (ts, req)
        self.tasks_submitted += req.replicas
        self.live_complete(job_id)  # its tasks may have been seen before the reply came

    async def submit_batch(self, client: httpx.AsyncClient, batch: list[JobReq]) -> None:
        ts = time.time()
        self.last_submit_ts = ts
        self.submit_requests += 1
        if self.args.submit_via == "nats":
            try:
                ids = await submit_over_nats(self.js, [j.nats_input() for j in batch], user="bench")
                for jid, req in zip(ids, batch):
                    self.record_submitted(jid, ts, req)
            except Exception as exc:  # noqa: BLE001 - counted, not retried (the load is open-loop)
                self.submit_errors += len(batch)
                print(f"submit publish failed ({len(batch)} jobs): {exc}", file=sys.stderr)
            return
        try:
            r = await client.post("/graphql", json={"query": SUBMIT, "variables": {
                "input": [j.graphql_input() for j in batch]}}, timeout=120)
            r.raise_for_status()
            body = r.json()
            if body.get("errors"):
                raise BenchError(str(body["errors"])[:300])
            for req, res in zip(batch, body["data"]["submitJobs"]):
                if res["job"]:
                    self.record_submitted(res["job"]["id"], ts, req)
                else:
                    self.submit_errors += 1
                    if self.submit_errors <= 3:
                        print(f"submit refused: {res['userErrors']}", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - counted, not retried (the load is open-loop)
            self.submit_errors += len(batch)
            print(f"submit request failed ({len(batch)} jobs): {exc}", file=sys.stderr)

    def generator(self) -> Trace | Synthetic:
        a = self.args
        return Trace(seed=a.seed, gang_fraction=a.gang_fraction) if a.trace else \
            Synthetic(seed=a.seed, mean_duration_s=a.mean_duration)

    async def burst_submitter(self, client: httpx.AsyncClient) -> None:
        """--burst: every job at once, in batches (MAX_BATCH) with --max-submit-inflight in flight."""
        a = self.args
        gen = self.generator()
        jobs = [gen.next() for _ in range(a.burst)]
        self.arrivals_planned = len(jobs)
        inflight: set[asyncio.Task] = set()
        self.burst_started = time.time()
        size = MAX_BATCH[a.submit_via]
        for i in range(0, len(jobs), size):
            while len(inflight) >= a.max_submit_inflight:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            t = asyncio.create_task(self.submit_batch(client, jobs[i:i + size]))
            inflight.add(t)
            t.add_done_callback(inflight.discard)
        if inflight:
            await asyncio.gather(*inflight)
        self.burst_submitted = time.time()

    async def submitter(self, client: httpx.AsyncClient, t0: float) -> None:
        a = self.args
        gen = self.generator()
        offsets = arrivals(a.rate, a.duration, seed=a.seed + 1)
        self.arrivals_planned = len(offsets)
        i = 0
        pending: list[JobReq] = []
        inflight: set[asyncio.Task] = set()
        while i < len(offsets) or pending:
            now = time.monotonic() - t0
            while i < len(offsets) and offsets[i] <= now:
                pending.append(gen.next())
                i += 1
            if pending and len(inflight) < a.max_submit_inflight:
                size = MAX_BATCH[a.submit_via]
                batch, pending = pending[:size], pending[size:]
                t = asyncio.create_task(self.submit_batch(client, batch))
                inflight.add(t)
                t.add_done_callback(inflight.discard)
            await asyncio.sleep(a.batch_window)
        if inflight:
            await asyncio.gather(*inflight)

    async def lose_host(self, nc, client: httpx.AsyncClient, delay: float, host: str) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(delay)
        # The leader's own record of the loss and of the requeues it caused.
        seen: dict[str, list[tuple[str, float]]] = {"lost": [], "requeued": [], "failed": []}

        async def on_lost(msg) -> None:  # type: ignore[no-untyped-def]
            ev = json.loads(msg.data)
            seen["lost"].append((ev.get("host_id"), ev.get("ts")))

        async def on_requeued(msg) -> None:  # type: ignore[no-untyped-def]
            ev = json.loads(msg.data)
            seen["requeued"].append((ev.get("host_id"), ev.get("ts")))

        async def on_failed(msg) -> None:  # type: ignore[no-untyped-def]
            ev = json.loads(msg.data)
            seen["failed"].append((ev.get("host_id"), ev.get("ts")))

        subs = [await nc.subscribe("alerts.host.lost", cb=on_lost),
                await nc.subscribe("muster.events.job.requeued", cb=on_requeued),
                await nc.subscribe("muster.events.job.failed", cb=on_failed)]
        try:
            r = await nc.request("bench.ctl.0", json.dumps({"cmd": "silence", "host": "busiest"}).encode(),
                                 timeout=10)
            reply = json.loads(r.data)
            last, host = reply["last_heartbeat"], reply["host"]
        except Exception as exc:  # noqa: BLE001
            self.lost = {"host": host, "error": f"could not silence: {exc}"}
            return
        self.lost = {"host": host, "tasks_on_host": reply.get("running"), "last_heartbeat": last,
                     "suspect_after_s": None, "lost_after_s": None}

        def leader_view() -> None:
            lost_ts = [ts for h, ts in seen["lost"] if h == host]
            req_ts = sorted(ts for h, ts in seen["requeued"] if h == host)
            self.lost["failed_for_good"] = sum(1 for h, _ in seen["failed"] if h == host)
            if lost_ts:
                self.lost["leader_lost_after_s"] = round(lost_ts[0] - last, 2)
            if req_ts:
                self.lost["first_requeue_after_s"] = round(req_ts[0] - last, 2)
                self.lost["requeued"] = len(req_ts)
                if lost_ts:
                    self.lost["lost_to_first_requeue_s"] = round(req_ts[0] - lost_ts[0], 3)
        deadline = last + 3 * 5.0 + self.args.lost_timeout
        print(f"silenced host {host}: polling host(id:) health until LOST", flush=True)
        while time.time() < deadline:
            try:
                h = (await self.gql(client, HOST, {"id": host}))["host"]
            except Exception:  # noqa: BLE001
                h = None
            now = time.time()
            health = h["health"] if h else "LOST"
            if health == "SUSPECT" and self.lost["suspect_after_s"] is None:
                self.lost["suspect_after_s"] = round(now - last, 2)
            if health == "LOST" and self.lost["lost_after_s"] is None:
                self.lost["lost_after_s"] = round(now - last, 2)
                print(f"host {host} LOST {now - last:.1f} s after its last heartbeat", flush=True)
            if self.lost["lost_after_s"] is not None and (
                    not self.lost.get("tasks_on_host") or any(h == host for h, _ in seen["requeued"])):
                await asyncio.sleep(1.0)  # let the rest of the requeue events arrive
                break
            await asyncio.sleep(0.25)
        leader_view()
        for s in subs:
            await s.unsubscribe()

    async def main(self) -> dict:
        a = self.args
        fleet = trace_fleet(a.hosts) if a.trace else synthetic_fleet(a.hosts, seed=a.seed)
        fleet_file = self.work / "fleet.json"
        write_fleet(fleet, fleet_file)
        k = a.sim_procs or max(1, math.ceil(a.hosts / 20000))
        load = f"a burst of {a.burst} jobs" if a.burst else f"{a.rate}/s for {a.duration}s"
        print(f"bench: {a.hosts} hosts in {k} simulator process(es), {load}, "
              f"{'trace' if a.trace else 'synthetic'} workload, {a.nats_cluster} NATS node(s), "
              f"MUSTER_REPLICAS={a.replicas}; work dir {self.work}", flush=True)
        self.start_nats()
        if a.preload:
            print(f"preloading {a.preload} running tasks into the state bucket ...", flush=True)
            self.preloaded = await preload(self.nats_url, fleet, a.preload, replicas=a.replicas)
            print(f"preloaded {self.preloaded['jobs']} jobs on {self.preloaded['hosts']} hosts "
                  f"({self.preloaded['bytes'] / 2**20:.0f} MB) in {self.preloaded['seconds']} s", flush=True)
        else:
            self.start_server()
        nc = await natsclient.connect(self.nats_url.split(","), name="bench-orchestrator")
        self.js = nc.jetstream(timeout=30)
        await nc.subscribe("bench.stats.>", cb=self.on_stats, pending_msgs_limit=100_000)
        self.spawn("observer", [sys.executable, "-m", "bench.observer", "--nats", self.nats_url,
                                "--fleet", str(fleet_file), "--out", str(self.work / "observer.json")])
        bounds = [round(i * a.hosts / k) for i in range(k + 1)]
        for i in range(k):
            argv = [sys.executable, "-m", "bench.simhosts", "--nats", self.nats_url, "--fleet", str(fleet_file),
                    "--start", str(bounds[i]), "--end", str(bounds[i + 1]), "--idx", str(i),
                    "--out", str(self.work / f"sim{i}.json")]
            if a.wildcard:
                argv.append("--wildcard")
            self.spawn(f"sim{i}", argv)
        if a.preload:
            # The preloaded cluster's hosts are up before the control plane starts (as after
            # a restart of the servers alone): a leader that found allocations for hosts
            # with no heartbeat would take them for lost and move their work.
            wait_until = time.monotonic() + a.startup_timeout
            while sum(1 for key, st in self.stats.items() if key != "observer" and st.get("ready")) < k:
                if time.monotonic() > wait_until:
                    raise BenchError("simulators not ready before the server start")
                self.check_children()
                await asyncio.sleep(0.5)
            await asyncio.sleep(6.0)  # one heartbeat interval: every host has written its key
            self.start_server()
        client = httpx.AsyncClient(base_url=self.http, headers={"Authorization": f"Bearer {self.token}"},
                                   timeout=60, limits=httpx.Limits(max_connections=32))
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(self.sample_loop(client, stop_sampling))
        t_boot = time.time()
        # Wait for every simulator, the observer, and the server seeing every host healthy.
        deadline = time.monotonic() + a.startup_timeout + a.hosts / 500 + a.preload / 5000
        while True:
            self.check_children()
            # From the metrics the sampler scrapes anyway: a GraphQL `cluster` query walks every
            # host on the server, and polling it would load the server being measured.
            m = self.metrics[-1][1] if self.metrics else {}
            c = {"hosts": {"healthy": int(m.get('muster_hosts{health="HEALTHY"}', 0)),
                           "suspect": int(m.get(SUSPECT_GAUGE, 0)),
                           "lost": int(m.get('muster_hosts{health="LOST"}', 0))},
                 "leadership": {"role": "leader" if m.get("muster_leader", 0) >= 1 else "follower"}}
            ready = sum(1 for s in self.sims() if s.get("ready"))
            # Health is judged on what the server has read (server/readclock.py), so every
            # host can look healthy while the server is still reading a backlog: also wait
            # until it is within about a second of heartbeats of the stream's end.
            pending = m.get("muster_heartbeats_pending")
            caught_up = pending is None or pending <= max(100, a.hosts / 5)
            # A preloaded cluster's history would have been written as its jobs arrived;
            # here the historian writes them all at start. Wait for it, so the window
            # measures a cluster that has been running, not the historian catching up.
            history = self.preloaded_in_history() if a.preload else None
            history_done = history is None or history >= self.preloaded.get("jobs", 0)
            # Likewise the observer (a checker at nice +10, like the historian), which reads
            # every record of the state bucket from the first, the preloaded ones included:
            # within about a second of state writes of the stream's end.
            obs_pending = self.stats.get("observer", {}).get("pending")
            observer_done = obs_pending is not None and obs_pending <= OBSERVER_CAUGHT_UP
            if ready == k and "observer" in self.stats and c["hosts"]["healthy"] >= a.hosts \
                    and c["leadership"]["role"] == "leader" and caught_up and history_done and observer_done:
                break
            if time.monotonic() > deadline:
                if ready < k or "observer" not in self.stats:
                    raise BenchError(f"not ready after {a.startup_timeout + a.hosts / 500 + a.preload / 5000:.0f} s: "
                                     f"{ready}/{k} "
                                     f"simulators, observer {'up' if 'observer' in self.stats else 'missing'}")
                msg = (f"started the run anyway after {time.time() - t_boot:.0f} s: the server saw only "
                       f"{c['hosts']['healthy']} of {a.hosts} hosts healthy (role {c['leadership']['role']}), "
                       f"{pending} heartbeats pending, the observer {obs_pending} records behind"
                       + (f", {history} preloaded jobs in history" if history is not None else ""))
                print("WARNING: " + msg, flush=True)
                self.notes.append(msg)
                break
            print(f"[startup {time.time() - t_boot:5.1f}s] simulators ready {ready}/{k}, server sees "
                  f"{c['hosts']['healthy']}/{a.hosts} hosts healthy, role {c['leadership']['role']}, "
                  f"heartbeats pending {pending if pending is not None else '?'}, "
                  f"observer behind {obs_pending if obs_pending is not None else '?'}"
                  + (f", preloaded jobs in history {history}" if history is not None else ""), flush=True)
            await asyncio.sleep(2.0)
        startup_s = time.time() - t_boot
        if a.preload and history_done:
            self.preloaded["in_history_after_s"] = round(startup_s, 1)
        self.observer_behind_at_start = obs_pending
        self.adopt_server_children()
        for c in self.children:
            c.sample()
            c.cpu_at_start = c.cpu
        self.machine_cpu_at_start = psutil.cpu_times()
        # The measured window.
        t0m = time.monotonic()
        t0 = time.time()
        self.window_start = t0
        self.tick(t0, "run")
        lost_task = None
        if a.lose_host_at is not None and a.lose_host_at >= 0:
            lost_task = asyncio.create_task(self.lose_host(nc, client, a.lose_host_at, fleet[bounds[1] - 1].id))
        sub_task = asyncio.create_task(self.burst_submitter(client) if a.burst else self.submitter(client, t0m))
        while not sub_task.done():
            await asyncio.wait({sub_task}, timeout=1.0)
            self.check_children()
            self.tick(t0, "run")
        await sub_task
        if a.burst:
            # The window lasts until every job of the burst has reached its hosts (or --drain).
            deadline = time.monotonic() + a.drain
            last_tick = time.monotonic()
            while len(self.live_dispatch) < len(self.submitted) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                if time.monotonic() - last_tick >= 1.0:
                    last_tick = time.monotonic()
                    self.check_children()
                    self.tick(t0, "run")
            done = len(self.live_dispatch) == len(self.submitted)
            self.window_end = max(self.live_dispatch.values()) if done and self.live_dispatch else time.time()
            self.tick(t0, "run")
        else:
            self.window_end = max(t0 + a.duration, getattr(self, "last_submit_ts", 0.0))
        for c in self.children:
            c.sample()
            c.cpu_at_end = c.cpu
        self.machine_cpu_at_end = psutil.cpu_times()
        # Drain: until every submitted job has reached a host, or the drain timeout.
        drain_deadline = time.monotonic() + a.drain
        while time.monotonic() < drain_deadline:
            missing = sum(1 for j in self.submitted if j not in self.live_dispatch)
            if missing == 0 and (lost_task is None or lost_task.done()):
                break
            await asyncio.sleep(1.0)
            self.check_children()
            self.tick(t0, "drain")
        if lost_task is not None:
            if not lost_task.done():
                print("waiting for the silenced host to be reported LOST", flush=True)
            try:
                await asyncio.wait_for(lost_task, timeout=3 * 5.0 + a.lost_timeout + 5)
            except asyncio.TimeoutError:
                pass
        # Let in-flight heartbeats land, then take the last metrics and process samples.
        await asyncio.sleep(1.5)
        self.tick(t0, "end")
        for c in self.children:
            c.sample()
        # Collect results.
        replies = await asyncio.gather(*(nc.request(f"bench.ctl.{i}", b'{"cmd": "finish"}', timeout=60)
                                         for i in range(k)), return_exceptions=True)
        for i, r in enumerate(replies):
            if isinstance(r, Exception):
                self.notes.append(f"simulator {i} did not finish cleanly: {r}")
        try:
            await nc.request("bench.ctl.observer", b'{"cmd": "finish"}', timeout=180)
        except Exception as exc:  # noqa: BLE001
            self.notes.append(f"observer did not finish cleanly: {exc}")
        self.replication = await self.stream_replication()
        stop_sampling.set()
        await sampler
        for c in self.children:
            c.sample()
        await client.aclose()
        await nc.close()
        return self.report(fleet, k, startup_s)

    async def stream_replication(self) -> dict[str, Any]:
        """What replication the state actually got: each JetStream stream's replica count."""
        out: dict[str, Any] = {"nats_nodes": self.args.nats_cluster, "muster_replicas": self.args.replicas,
                               "sync_interval": "always" if self.args.nats_sync == "always" else "default (2 min)"}
        try:
            infos = await self.js.streams_info()
            out["stream_replicas"] = {i.config.name: i.config.num_replicas for i in infos}
            state = next((i for i in infos if i.config.name == "KV_state"), None)
            if state is not None and state.cluster is not None:
                out["KV_state_cluster"] = {"leader": state.cluster.leader,
                                           "followers": len(state.cluster.replicas or []),
                                           "followers_current": sum(1 for r in state.cluster.replicas or []
                                                                    if r.current)}
        except Exception as exc:  # noqa: BLE001 - recorded; the run itself is still reported
            out["error"] = f"could not read stream info: {exc}"
        return out

    def state_load(self) -> dict[str, float] | None:
        """How long the server took to load the state bucket before it served (its
        `muster_state_load_*` gauges)."""
        m = self.metrics[-1][1] if self.metrics else {}
        secs = m.get('muster_state_load_seconds{bucket="state"}')
        recs = m.get('muster_state_load_records{bucket="state"}')
        return {"records": int(recs or 0), "seconds": secs} if secs is not None else None

    def adopt_server_children(self) -> None:
        """Processes the server started itself (historian, heartbeat ingest) count too."""
        for srv in [c for c in self.children if c.name.startswith("server")]:
            try:
                kids = srv.proc.children(recursive=True)
            except psutil.Error:
                continue
            known = {c.proc.pid for c in self.children}
            for p in (k for k in kids if k.pid not in known):
                try:
                    cmd = " ".join(p.cmdline())
                    name = p.name()
                except psutil.Error:
                    continue
                # The server names its helper processes (wire.logs.name_this_process).
                what = ("historian" if name == "muster-history" else
                        "heartbeat ingest" if name == "muster-ingest" else
                        "multiprocessing resource tracker" if "resource_tracker" in cmd else f"child {p.pid}")
                self.children.append(Child(f"{srv.name}: {what}", None, p))

    def machine_busy_pct(self) -> float | None:
        """Share of all CPUs busy (not idle or waiting for I/O) in the measured window:
        every process counts, ours and the kernel's."""
        a, b = self.machine_cpu_at_start, self.machine_cpu_at_end
        if a is None or b is None:
            return None
        total = sum(b) - sum(a)
        idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
        return round(100 * (total - idle) / total, 1) if total > 0 else None

    def check_children(self) -> None:
        for c in self.children:
            if c.popen is not None and c.popen.poll() is not None:
                raise BenchError(f"{c.name} exited with {c.popen.returncode}; see {c.log}")

    # ------------------------------------------------------------ the report

    def report(self, fleet: list, k: int, startup_s: float) -> dict:
        a = self.args
        sims = []
        for i in range(k):
            p = self.work / f"sim{i}.json"
            if p.exists():
                sims.append(json.loads(p.read_text()))
        obs_p = self.work / "observer.json"
        obs = json.loads(obs_p.read_text()) if obs_p.exists() else {}
        per_job: dict[str, list[tuple[str, str, float, int]]] = defaultdict(list)
        for s in sims:
            for job_id, aid, host, ts, task in s["arrivals"]:
                per_job[job_id].append((aid, host, ts, task))
        window = self.window_end - self.window_start
        dispatch, running, never, twice, partial, shared = [], [], [], [], [], []
        by_class: dict[str, list[float]] = defaultdict(list)
        gang_waits: list[float] = []
        ojobs = obs.get("jobs", {})
        lost_host = (self.lost or {}).get("host")
        max_host_gpus = max((h.gpus for h in fleet), default=0)
        verdicts: dict[str, Verdict] = {}
        for job_id, (ts, req) in self.submitted.items():
            v = verdicts[job_id] = judge(job_id, req.replicas, per_job.get(job_id, []),
                                         (ojobs.get(job_id) or {}).get("placed") or {}, lost_host,
                                         exclusive=req.gang and 2 * req.gpus > max_host_gpus)
            if v.dispatched_at is None:
                never.append(job_id)
            else:
                dispatch.append(v.dispatched_at - ts)
                by_class[req.qos].append(v.dispatched_at - ts)
                if req.gang:
                    gang_waits.append(v.dispatched_at - ts)
            if v.twice:
                twice.append(job_id)
            if v.partial:
                partial.append(job_id)
            if v.shared_host:
                shared.append(job_id)
            ra = (ojobs.get(job_id) or {}).get("running_at")
            if ra is not None:
                running.append(ra - ts)
        # Preloaded jobs rerun after their host was lost are expected; anything else
        # that reached a host without being submitted is a fault.
        reruns = sorted(j for j in set(per_job) - set(self.submitted) if j.startswith(PRELOAD_PREFIX))
        unknown = sorted(set(per_job) - set(self.submitted) - set(reruns))
        gangs = [j for j, (_, r) in self.submitted.items() if r.gang]
        tasks_dispatched = sum(v.tasks_seen for v in verdicts.values())
        # Rates over the measured window, each from its own first and last sample inside it.
        m_in = [(t, m) for t, m in self.metrics if self.window_start <= t <= self.window_end + 0.5]
        (mt0, m_first), (mt1, m_end) = (m_in[0], m_in[-1]) if len(m_in) > 1 else ((0.0, {}), (1.0, {}))
        m_dt = max(1e-6, mt1 - mt0)
        m_final = self.metrics[-1][1] if self.metrics else {}
        # For the histograms of the window: the last scrape before it and the first after
        # it, so a window shorter than the scrape interval (a burst) is covered too.
        h_first = next((m for t, m in reversed(self.metrics) if t <= self.window_start), {})
        h_end = next((m for t, m in self.metrics if t >= self.window_end), m_final)
        hb = "muster_heartbeats_received_total"
        hb_recv_rate = (m_end.get(hb, 0) - m_first.get(hb, 0)) / m_dt
        t_in = [r for r in self.ticks if r["phase"] == "run"]
        hb_sent_rate = (t_in[-1]["hb_sent"] - t_in[0]["hb_sent"]) / max(1e-6, t_in[-1]["t"] - t_in[0]["t"]) \
            if len(t_in) > 1 else 0.0
        backlog = [r["hb_sent"] - r["hb_received"] for r in self.ticks]
        sent_total = sum(s["counters"]["hb_sent"] for s in sims)
        placements_window = m_end.get("muster_placements_total", 0) - m_first.get("muster_placements_total", 0)
        samples = obs.get("samples", [])
        waiting = [s for s in samples if s.get("queued_gpus", 0) > 0 and self.window_start <= s["t"]]
        free_share = [1 - s["gpus_allocated"] / s["gpus_total"] for s in waiting if s["gpus_total"]]
        counters = defaultdict(int)
        for s in sims:
            for key, v in s["counters"].items():
                counters[key] += v
        overcommitted = obs.get("overcommitted_hosts", [])
        gang_tasks = sum(r.replicas for _, r in self.submitted.values() if r.gang)
        frac = sum(1 for _, r in self.submitted.values() if r.fractional_gpu)
        procs = {}
        for c in self.children:
            procs[c.name] = {"cpu_s": round(c.cpu, 2), "peak_rss_mb": round(c.peak_rss / 2**20, 1),
                             "cpu_s_in_window": round(c.cpu_at_end - c.cpu_at_start, 2)
                             if c.cpu_at_start is not None and c.cpu_at_end is not None else None,
                             "cpu_pct_in_window": round(100 * (c.cpu_at_end - c.cpu_at_start) / window, 1)
                             if c.cpu_at_start is not None and c.cpu_at_end is not None and window > 0 else None}
        correct = {
            "ok": not never and not twice and not partial and not shared and not unknown and not overcommitted
                  and counters["gpu_collisions"] == 0 and bool(obs),
            "jobs_never_dispatched": len(never),
            "jobs_dispatched_more_than_once": len(twice),
            "gangs_partially_dispatched": len(partial),
            "gangs_with_tasks_sharing_a_host": len(shared),
            "dispatches_of_unknown_jobs": len(unknown),
            "preloaded_jobs_rerun": len(reruns),
            "overcommitted_hosts": len(overcommitted),
            "overcommit_examples": obs.get("overcommit_examples", [])[:10],
            "simulator_gpu_collisions": counters["gpu_collisions"],
            "alloc_revisions_checked": obs.get("alloc_revisions_checked", 0),
            "final_alloc_records_checked": obs.get("final_alloc_records_checked", 0),
            "observer_ran": bool(obs),
            "examples_never_dispatched": never[:5],
            "examples_dispatched_twice": {j: verdicts[j].problems for j in twice[:5]},
            "examples_gang_problems": {j: verdicts[j].problems for j in (partial + shared)[:5]},
        }
        gpus_total = sum(h.gpus for h in fleet)
        # Submissions per second over the time spent submitting (a burst is over long before the window).
        submit_s = window
        if a.burst and self.burst_started and self.burst_submitted:
            submit_s = self.burst_submitted - self.burst_started
        rep = {
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m bench " + " ".join(sys.argv[1:]) if a.argv is None else
                       "python -m bench " + " ".join(a.argv),
            "machine": f"{os.cpu_count()} CPUs, {round(psutil.virtual_memory().total / 2**30)} GiB; every process on one machine",
            "config": {"hosts": a.hosts, "gpus": gpus_total,
                       "rate": None if a.burst else a.rate, "duration_s": None if a.burst else a.duration,
                       "burst": a.burst or None, "submit_via": a.submit_via,
                       "workload": "trace" if a.trace else "synthetic", "nats_cluster": a.nats_cluster,
                       "muster_replicas": a.replicas, "nats_sync": a.nats_sync,
                       "simulator_processes": k, "seed": a.seed, "batch_window_s": a.batch_window,
                       "assign_subscription": "wildcard muster.assign.>" if a.wildcard else "one per host"},
            "replication": self.replication,
            "startup_s": round(startup_s, 1),
            "window_s": round(window, 2),
            "jobs_submitted": len(self.submitted),
            "jobs_dispatched": len(self.submitted) - len(never),
            "tasks_submitted": self.tasks_submitted,
            "tasks_dispatched": tasks_dispatched,
            "submit_errors": self.submit_errors,
            "submit_requests": self.submit_requests,
            "submissions_per_s": round(len(self.submitted) / submit_s, 1) if submit_s else None,
            "placements_per_s": round(placements_window / m_dt, 1),
            "placements_per_s_source": "server metric muster_placements_total (jobs placed; a gang counts "
                                       "once) over the measured window, sampled once a second",
            "placements_total": m_final.get("muster_placements_total"),
            "dispatch_latency_ms": summary_ms(dispatch),
            "running_latency_ms": summary_ms(running),
            "server_placement_latency": histogram_quantiles(m_final, "muster_placement_latency_seconds"),
            # A commit, from sending its batch until the leader has read the acknowledgement.
            "server_commit_seconds": histogram_quantiles(m_final, "muster_commit_seconds"),
            # How late the server's event loop woke for a 0.1 s timer, in the window.
            "server_loop_lag": histogram_window(h_first, h_end, "muster_event_loop_lag_seconds"),
            "server_gc_pauses": histogram_window(h_first, h_end, "muster_gc_pause_seconds"),
            # Each scheduling cycle's planning (decisions and encoding), in the window.
            "server_plan_seconds": histogram_window(h_first, h_end, "muster_plan_seconds"),
            "server_commits_in_window": histogram_window(h_first, h_end, "muster_commit_seconds"),
            "heartbeats_per_s": round(hb_recv_rate, 1),
            "heartbeats_sent_per_s": round(hb_sent_rate, 1),
            "heartbeats": {"sent_total": sent_total, "received_total_at_end": m_final.get(hb),
                           "backlog_at_end": sent_total - m_final.get(hb, 0) if m_final else None,
                           "backlog_max_during_run": max(backlog) if backlog else None,
                           # The server's heartbeat ingest process (server.health.ingest): how old
                           # the newest batch was when the server applied it.
                           "ingest_lag_s_max_in_window": max_in(m_in, "muster_heartbeat_ingest_lag_seconds"),
                           # Hosts the server saw as SUSPECT (no heartbeat applied for two
                           # intervals, so unschedulable) at the worst sample in the window.
                           # Heartbeat records the server had not applied yet (unread in
                           # the stream or waiting in the ingest process), its own count.
                           "pending_max_in_window": max_in(m_in, "muster_heartbeats_pending"),
                           "suspect_hosts_max_in_window": max_in(m_in, SUSPECT_GAUGE),
                           "note": "received counts every record the server's hosts watch saw (expiry markers "
                                   "included); backlog_* = sent - received, sampled once a second (a rough "
                                   "figure: expiry markers count as received, and heartbeats sent before the "
                                   "server started never are); pending_max_in_window is the server's own count "
                                   "of records not yet applied"},
            "max_concurrent_tasks": max((r["running"] for r in self.ticks), default=0),
            "max_concurrent_tasks_upper_bound": sum(s["max_running"] for s in sims),
            # What the control plane itself tracked: live (PLACED or RUNNING) jobs in its
            # state, preloaded ones included, the most seen in any one-second sample.
            "max_live_jobs_tracked_by_server": max(
                (sum(v for k, v in m.items() if k.startswith("muster_jobs{") and
                     ('state="RUNNING"' in k or 'state="PLACED"' in k)) for _, m in self.metrics), default=0),
            "preloaded": self.preloaded or None,
            "server_state_load": self.state_load(),
            "max_queue_depth": max((r["queue_depth"] for r in self.ticks), default=0),
            "overcommitted_hosts": len(overcommitted),
            "lost_host_detection": self.lost or {"skipped": True},
            "processes": procs,
            "machine_cpu_busy_pct_in_window": self.machine_busy_pct(),
            "simulators": {"counters": dict(counters), "reports_pending_at_end": sum(s["reports_pending_at_end"] for s in sims),
                           "loop_lag_max_ms": max((s["loop_lag_max_ms"] for s in sims), default=None),
                           "gc_pause_max_ms": max((s.get("gc_pause_max_ms", 0.0) for s in sims), default=None),
                           "gc_full_pauses": sum(s.get("gc_full_pauses", 0) for s in sims)},
            "observer": {"records_behind_at_start": self.observer_behind_at_start,
                         "watch_lag_s_at_end": obs.get("watch_lag_s_at_end"),
                         "max_watch_lag_s": max((s.get("lag_s", 0) for s in samples), default=None)},
            "quality": {
                "gpus_unallocated_share_while_gpu_jobs_wait": {
                    "seconds_with_gpu_jobs_waiting": len(waiting),
                    "mean": round(statistics.fmean(free_share), 4) if free_share else None,
                    "max": round(max(free_share), 4) if free_share else None},
                "wait_ms_by_priority_class": {q: summary_ms(v) for q, v in sorted(by_class.items())},
                "gangs_submitted": len(gangs),
                "gang_tasks_submitted": gang_tasks,
                "gang_sizes": dict(sorted(Counter(self.submitted[j][1].replicas for j in gangs).items())),
                "gang_wait_ms": summary_ms(gang_waits),
                "gangs_not_fully_dispatched": len(gangs) - len(gang_waits),
                "fractional_gpu_jobs_rounded_up": frac,
            },
            "correctness": correct,
            "notes": self.notes + [
                "dispatch = a simulated host received its assignment (first sighting of the attempt on the host); "
                f"submit time = just before the {'NATS publish on muster.submit' if a.submit_via == 'nats' else 'submitJobs request'}; "
                "wait per priority class uses dispatch latency",
                "running = the store's timestamp of the job record's first RUNNING (or later) revision",
                "a gang is one job with replicas = ceil(n/8) tasks of 8 GPUs (jobs_* count it once, tasks_* "
                "count its tasks); it is dispatched when every task of one try has reached its host, and its "
                "dispatch latency (= gang wait) runs from its submit time to that moment; its running time is "
                "when every task of one try had reported RUNNING",
            ] + (["trace: fractional GPU requests are rounded up to one whole GPU; durations capped at 7 days "
                  "and divided by 80; qos -> priority LS 300, Guaranteed 200, Burstable 100, BE 0"] if a.trace else []),
            "work_dir": str(self.work),
        }
        if a.burst:
            rep["burst"] = self.burst_report(verdicts, ojobs, gpus_total)
            if rep["burst"]["placements_per_s"] is not None:
                rep["placements_per_s"] = rep["burst"]["placements_per_s"]
                rep["placements_per_s_source"] = "burst: jobs / (last job fully dispatched - first submit)"
        rep["_series"] = {"ticks": self.ticks, "dispatch": [(self.submitted[j][0], v.dispatched_at)
                                                            for j, v in verdicts.items()
                                                            if v.dispatched_at is not None],
                          "running": [(self.submitted[j][0], ojobs[j]["running_at"]) for j in self.submitted
                                      if (ojobs.get(j) or {}).get("running_at") is not None],
                          "samples": samples, "t0": self.window_start}
        return rep

    def burst_report(self, verdicts: dict[str, Verdict], ojobs: dict[str, dict], gpus_total: int) -> dict[str, Any]:
        """--burst: how long the whole burst took to reach its hosts, and the rate that makes."""
        t0 = self.burst_started or self.window_start
        n = len(self.submitted)
        done = [v.dispatched_at for v in verdicts.values() if v.dispatched_at is not None]
        all_done = bool(n) and len(done) == n
        span = max(done) - t0 if all_done else None
        placed = [p for j in self.submitted if (p := (ojobs.get(j) or {}).get("placed_at"))]
        placed_span = max(placed) - t0 if n and len(placed) == n else None
        r = lambda v, k=3: None if v is None else round(v, k)  # noqa: E731
        gpus = sum(q.gpus * q.replicas for _, q in self.submitted.values())
        return {
            "jobs": n, "tasks": self.tasks_submitted, "jobs_dispatched": len(done),
            "gpus_requested": gpus, "gpus_total": gpus_total,
            "submit_s": r(self.burst_submitted - t0) if self.burst_submitted else None,
            "time_to_dispatch_all_s": r(span),
            "placements_per_s": r(n / span, 1) if span else None,
            "tasks_per_s": r(self.tasks_submitted / span, 1) if span else None,
            "server_placed_all_s": r(placed_span),
            "server_placements_per_s": r(n / placed_span, 1) if placed_span else None,
            "note": ("the burst asks for more GPUs than the fleet has, so part of it waited for others to "
                     "finish; " if gpus > gpus_total else "") +
                    "t=0 just before the first batch was published; time_to_dispatch_all = until the last task "
                    "of the last job reached its simulated host; server_placed_all = until the leader planned "
                    "the last placement (the job record's placed_at, the same machine's clock)",
        }


# ---------------------------------------------------------------- the plot


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


# ---------------------------------------------------------------- entry


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
    ap.add_argument("--json", default=None, help="write the report here (default bench/results/bench-<time>.json)")
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
    ap.add_argument("--drain", type=float, default=None,
                    help="seconds to wait for undispatched jobs after the run (default 30; with --burst, 300 "
                         "after the burst was submitted)")
    ap.add_argument("--lose-host-at", type=float, default=None,
                    help="seconds into the run to stop one host's heartbeats (default: a quarter of --duration; "
                         "none with --burst); negative disables")
    ap.add_argument("--lost-timeout", type=float, default=20.0, help="extra seconds to wait for LOST beyond the TTL")
    ap.add_argument("--startup-timeout", type=float, default=90.0)
    ap.add_argument("--preload", type=int, default=0,
                    help="start with this many long-running tasks already in the cluster (bench/preload.py)")
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
    if args.lose_host_at is None:
        args.lose_host_at = -1.0 if args.burst else args.duration / 4
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="muster-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    jpath = Path(args.json) if args.json else ROOT / "bench" / "results" / f"bench-{stamp}.json"
    ppath = Path(args.png) if args.png else jpath.with_suffix(".png")
    b = Bench(args, work)
    try:
        rep = asyncio.run(b.main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        b.stop_all()
    ppath.parent.mkdir(parents=True, exist_ok=True)
    plot(rep, ppath)
    rep["plot"] = str(ppath)
    series = rep.pop("_series")
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
    print(f"report: {jpath}\nplot:   {ppath}")
    if not rep["correctness"]["ok"]:
        print("CORRECTNESS CHECK FAILED: see 'correctness' in the report", file=sys.stderr)
        return 1
    return 0
