"""Orchestration of one `muster bench` run (`python -m bench`; options in bench/cli.py).

Starts nats-server (one node, or a 3-node cluster rendered by bench/natscluster.py on
free ports), one `muster server`, the state observer (bench/observer.py) and K host
simulator processes (bench/simhosts.py, ~20,000 hosts each), waits until the server sees
every host healthy, then submits jobs for --duration seconds (Poisson arrivals, batched
and published on the NATS submission subject, or sent as `submitJobs` requests with
--submit-via graphql; the submit time of a job is taken just before its publish/request),
silences one host's heartbeats part-way to time loss detection, drains and collects every
process's results; bench/report.py makes the report of them, bench/plot.py the plot.

With --burst N it submits N jobs at once instead (as fast as the submission path takes
them) and measures the time until every one has reached its hosts: the maximum placement
throughput, for comparing one NATS node with three.

A gang (a trace job of more than 8 GPUs) is one job of `replicas` tasks. It counts as
dispatched when every task of one try has reached a host; its dispatch latency is that
moment minus its submit time, counted once per gang (see bench/verdict.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from bench.calibration import python_speed
from bench.clients import run_clients
from bench.errors import BenchError
from bench.historylag import HistoryLag, ended_jobs, sqlite_read_only
from bench.leaders import LeaderScrapes
from bench.postgres import PostgresServer, find_pg_bin, start_postgres, stop_postgres
from bench.preload import PREFIX as PRELOAD_PREFIX
from bench.preload import preload, preload_backlog
from bench.processes import Child, Processes
from bench.report import build_report
from bench.stats import SUSPECT_GAUGE, parse_metrics, pct
from bench.workload import (
    HostSpec,
    JobReq,
    Queued,
    Synthetic,
    Trace,
    arrivals,
    synthetic_fleet,
    trace_fleet,
    write_fleet,
)
from server.history.database import DB_FILE as HISTORY_DB_FILE
from wire import natsclient, subjects
from wire.messages import new_id
from wire.stopping import pause
from wire.submit import submit_over_nats

SUBMIT = """mutation($input: [SubmitJobInput!]!) { submitJobs(input: $input) { job { id } userErrors { message } } }"""
HOST = "query($id: ID!) { host(id: $id) { id health } }"
# Jobs per submission: submitJobs takes up to 1,000; on NATS the leader takes a submission
# message only when all its jobs fit in what one commit leaves for inputs (900 keys less
# 258, server/scheduling/planner.py plan_cycle), so a message of more than 642 jobs would never be
# taken and would hold up every later one.
MAX_BATCH = {"graphql": 1000, "nats": 500}
# How long a failed NATS submission is sent again (with the same job ids: the leader
# skips the jobs a stored try made).
SUBMIT_RETRY_S = 60.0
# The window starts once the observer has this many state records or fewer left to read.
OBSERVER_CAUGHT_UP = 2000


@dataclass
class Bench(Processes):
    """One run: the processes (bench.processes), what the run collected while it went,
    and the steps (`main`)."""

    stats: dict[str, dict] = field(default_factory=dict)
    live_dispatch: dict[str, float] = field(default_factory=dict)  # job -> when its last task arrived
    live_tasks: dict[str, dict[int, float]] = field(default_factory=dict)  # job -> task -> first arrival
    live_tasks_n: int = 0
    submitted: dict[str, tuple[float, JobReq]] = field(default_factory=dict)
    tasks_submitted: int = 0
    replication: dict[str, Any] = field(default_factory=dict)
    # Jobs whose submissions still waited in the SUBMIT stream at the end (waiting_submissions).
    submissions_waiting: set[str] = field(default_factory=set)
    burst_started: float | None = None
    burst_submitted: float | None = None
    submit_errors: int = 0
    submit_requests: int = 0
    # NATS submissions whose publish failed, sent again with the same ids (the leader
    # creates each id once, so that is safe): jobs accepted on a later try, retry tasks still
    # running, and jobs given up while in doubt (a publish that timed out may have been
    # stored: such a job may still run, and is not counted as an unknown dispatch).
    submit_retried_ok: int = 0
    retrying: set[asyncio.Task] = field(default_factory=set)
    in_doubt: set[str] = field(default_factory=set)
    request_s: list[float] = field(default_factory=list)  # --one-per-request: each request's time
    queue_names: list[str] = field(default_factory=list)  # --queues: the queues jobs go to, in turn
    ticks: list[dict] = field(default_factory=list)
    metrics: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # the leader's (bench.leaders)
    metrics_from: list[str] = field(default_factory=list)  # which replica each of `metrics` came from
    scrapes: LeaderScrapes = field(default_factory=LeaderScrapes)
    kills: list[dict[str, Any]] = field(default_factory=list)  # --kill-*-at: what was killed, when
    # The `host.fenced` alerts the leader published (monitor.fence_alerts): each one's
    # number of hosts (one, or many in one alert) and frozen tasks continued and stopped.
    fence_alerts: list[tuple[int, int, int]] = field(default_factory=list)
    history_lag: dict[str, Any] | None = None
    pg: PostgresServer | None = None  # --postgres
    lost: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reads: dict[str, Any] | None = None  # what the readers saw (--read-flood, --browse)
    preloaded: dict[str, float] = field(default_factory=dict)
    backlogged: dict[str, float] = field(default_factory=dict)
    observer_behind_at_start: int | None = None  # state records the observer had left to read
    machine_speed: dict[str, Any] | None = None  # bench.calibration, just before the run
    machine_cpu_at_start: Any = None  # psutil.cpu_times() at the window's start and end
    machine_cpu_at_end: Any = None

    @property
    def history_url(self) -> str:
        """The history database the servers write: --db-url / --postgres, or the first
        server's SQLite file, opened read only."""
        return self.args.db_url or sqlite_read_only(str(self.server_data_dir / HISTORY_DB_FILE))

    def preloaded_in_history(self) -> int:
        """How many preloaded jobs the historian has written."""
        from sqlalchemy import create_engine, text

        # A key range, not LIKE: answered from the primary key's index on both dialects.
        upper = PRELOAD_PREFIX[:-1] + chr(ord(PRELOAD_PREFIX[-1]) + 1)
        try:
            engine = create_engine(self.history_url)
            try:
                with engine.connect() as conn:
                    return int(conn.execute(text("SELECT count(*) FROM jobs WHERE id >= :lo AND id < :hi"),
                                            {"lo": PRELOAD_PREFIX, "hi": upper}).scalar_one())
            finally:
                engine.dispose()
        except Exception:  # noqa: BLE001 - not created yet, or busy
            return 0

    # ------------------------------------------------------------ the run

    async def gql(self, client: httpx.AsyncClient, q: str, v: dict | None = None) -> dict:
        r = await client.post("/graphql", json={"query": q, "variables": v or {}})
        r.raise_for_status()
        body = r.json()
        if body.get("errors"):
            raise BenchError(f"GraphQL error: {body['errors']}")
        return body["data"]

    async def on_fence_alert(self, msg) -> None:
        data = json.loads(msg.data).get("data") or {}
        self.fence_alerts.append((int(data.get("hosts", 1)), int(data.get("continued", 0)),
                                  int(data.get("stopped", 0))))

    async def on_stats(self, msg) -> None:
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

        async def scrape(url: str) -> dict[str, float] | None:
            try:
                r = await client.get(url + "/metrics", timeout=10)
                return parse_metrics(r.text)
            except httpx.HTTPError:
                return None

        while not stop.is_set():
            for c in self.children:
                c.sample()
            live = [(c.name, url) for c, url in self.servers if not c.killed]
            got = await asyncio.gather(*(scrape(url) for _, url in live))
            scrapes = {name: m for (name, _), m in zip(live, got, strict=True) if m is not None}
            if scrapes:
                follow, m = self.scrapes.add(time.time(), scrapes, [c.name for c, _ in self.servers])
                self.metrics.append((time.time(), m))
                self.metrics_from.append(follow)
            await pause(stop, 1.0)

    def stop_all(self) -> None:
        super().stop_all()
        # The servers' helpers (a historian's last flush) may outlive them a moment: let
        # them finish before their database goes.
        helpers = [c.proc for c in self.children if c.popen is None and c.name.startswith("server")]
        psutil.wait_procs(helpers, timeout=20)
        if self.pg is not None:
            stop_postgres(self.pg)
            self.pg = None

    def start_postgres(self) -> None:
        """--postgres: a PostgreSQL server as production runs one (every commit fsync'd
        before it is acknowledged) for the servers' history; its backends count in its CPU."""
        bindir = find_pg_bin()
        if bindir is None:
            raise BenchError("--postgres: no PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH, "
                             "in /usr/lib/postgresql/*/bin or $MUSTER_PG_BIN")
        self.pg = start_postgres(bindir, durable=True)
        self.args.db_url = self.pg.url
        pid = self.pg.postmaster_pid()
        if pid is not None:
            self.children.append(Child("postgres", None, psutil.Process(pid), self.pg.datadir.parent / "server.log",
                                       tree=True))

    async def kill_at(self, delay: float, what: str, nc: Any, client: httpx.AsyncClient) -> None:
        """--kill-leader-at / --kill-nats-leader-at: SIGKILL the leading `muster server`, or
        the NATS node that leads the state stream (the hosts stream with
        `--kill-nats-leader-of hosts`), `delay` seconds into the window."""
        await asyncio.sleep(delay)
        led: list[str] = []
        if what == "leader server":
            name = self.scrapes.leader
            victim = next((c for c, _ in self.servers if c.name == name), None)
        else:
            js = nc.jetstream(timeout=10)
            leaders = {}
            for stream in (subjects.STATE_STREAM, subjects.HOSTS_STREAM):
                info = await js.stream_info(stream)
                leaders[stream] = info.cluster.leader if info.cluster else None
            name = leaders[subjects.HOSTS_STREAM if self.args.kill_nats_leader_of == "hosts" else subjects.STATE_STREAM]
            led = sorted(s for s, n in leaders.items() if n == name)
            victim = next((c for c in self.children if c.name == f"nats-server-{name}"), None)
        if victim is None or victim.popen is None:
            self.notes.append(f"--kill: found no {what} to kill (leader {name!r})")
            return
        victim.killed = True
        victim.popen.kill()
        killed_at = time.time()
        self.kills.append({"what": what, "process": victim.name, "at": killed_at, **({"led": led} if led else {})})
        print(f"killed {what} {victim.name} (SIGKILL)", flush=True)
        if what == "leader server":
            # The bench's own GraphQL calls (the lost host's polling) go to a replica alive.
            alive = next(url for c, url in self.servers if not c.killed)
            client.base_url = httpx.URL(alive)

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
        print(
            f"[{phase} {now - t0:6.1f}s] sub {row['submitted']:>7} "
            f"({(row['submitted'] - prev['submitted']) / dt:5.0f}/s)"
            f" disp {row['dispatched_live']:>7} ({(row['dispatched_live'] - prev['dispatched_live']) / dt:5.0f}/s)"
            f" run {row['running']:>6} queue {row['queue_depth']:>6.0f} suspect {row['suspect']:>5.0f}"
            f" | hb sent {(row['hb_sent'] - prev['hb_sent']) / dt:6.0f}/s"
            f" recv {(row['hb_received'] - prev['hb_received']) / dt:6.0f}/s"
            f" | placed {(row['placements'] - prev['placements']) / dt:5.0f}/s"
            f" | disp p50/max {(pct(recent, 50) or 0) * 1000:6.0f}/{(max(recent) if recent else 0) * 1000:6.0f} ms"
            f" | server cpu {srv.cpu if srv else 0:6.1f}s",
            flush=True,
        )

    def record_submitted(self, job_id: str, ts: float, req: JobReq) -> None:
        self.submitted[job_id] = (ts, req)
        self.tasks_submitted += req.replicas
        self.live_complete(job_id)  # its tasks may have been seen before the reply came

    async def submit_batch(self, client: httpx.AsyncClient, batch: list[JobReq]) -> None:
        ts = time.time()
        self.last_submit_ts = ts
        self.submit_requests += 1
        if self.args.submit_via == "nats":
            jobs = [{**j.nats_input(), "id": new_id("j")} for j in batch]
            try:
                ids = await submit_over_nats(self.js, jobs, user="bench", within_s=0)
                for jid, req in zip(ids, batch, strict=True):
                    self.record_submitted(jid, ts, req)
            except Exception as exc:  # noqa: BLE001 - sent again by a task of its own (the load is open-loop)
                print(f"submit publish failed ({len(batch)} jobs): {exc}; trying again", file=sys.stderr)
                t = asyncio.create_task(self.submit_again(jobs, batch, ts))
                self.retrying.add(t)
                t.add_done_callback(self.retrying.discard)
            return
        try:
            r = await client.post("/graphql", json={"query": SUBMIT, "variables": {
                "input": [j.graphql_input() for j in batch]}}, timeout=120)
            r.raise_for_status()
            body = r.json()
            if body.get("errors"):
                raise BenchError(str(body["errors"])[:300])
            for req, res in zip(batch, body["data"]["submitJobs"], strict=True):
                if res["job"]:
                    self.record_submitted(res["job"]["id"], ts, req)
                else:
                    self.submit_errors += 1
                    if self.submit_errors <= 3:
                        print(f"submit refused: {res['userErrors']}", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - counted, not retried (the load is open-loop)
            self.submit_errors += len(batch)
            print(f"submit request failed ({len(batch)} jobs): {exc}", file=sys.stderr)

    async def submit_again(self, jobs: list[dict[str, Any]], batch: list[JobReq], ts: float) -> None:
        """A NATS submission whose publish failed, sent again once a second with the same
        ids, as a client would: the leader creates each id once (the same user's job sent
        again is skipped), so a publish that timed out after being stored creates nothing
        twice. Its jobs count from the first try. Given up after
        SUBMIT_RETRY_S (or when the run ends): then counted as errors, and in doubt."""
        try:
            await asyncio.sleep(1.0)
            left = max(0.0, ts + SUBMIT_RETRY_S - time.time())
            ids = await submit_over_nats(self.js, jobs, user="bench", within_s=left, every_s=1.0)
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the run ended, or NATS never took it
            pass
        else:
            for jid, req in zip(ids, batch, strict=True):
                self.record_submitted(jid, ts, req)
            self.submit_retried_ok += len(batch)
            return
        self.submit_errors += len(batch)
        self.in_doubt.update(str(j["id"]) for j in jobs)

    def generator(self) -> Trace | Synthetic | Queued:
        a = self.args
        gen: Trace | Synthetic = Trace(seed=a.seed, gang_fraction=a.gang_fraction) if a.trace else \
            Synthetic(seed=a.seed, mean_duration_s=a.mean_duration)
        return Queued(gen, self.queue_names) if self.queue_names else gen

    async def create_queues(self, client: httpx.AsyncClient, fleet: list[HostSpec]) -> None:
        """--queues N --cohorts M: N queues of equal weight, queue i in cohort c<i % M>,
        each with a nominal quota of 1/N of every GPU model's GPUs (borrowing unlimited
        within its cohort), created through GraphQL before the window."""
        a = self.args
        gpus: dict[str, int] = {}
        for h in fleet:
            if h.gpus and h.model:
                gpus[h.model] = gpus.get(h.model, 0) + h.gpus
        q = ("mutation($in: QueueInput!) { createQueue(input: $in) { queue { name } "
             "userErrors { code message } } }")
        for i in range(a.queues):
            name = f"q{i}"
            inp = {"name": name, "cohort": f"c{i % max(1, a.cohorts)}", "weight": 1.0,
                   "quota": [{"resource": f"gpu:{m}", "nominal": n // a.queues} for m, n in sorted(gpus.items())]}
            r = await client.post("/graphql", json={"query": q, "variables": {"in": inp}}, timeout=60)
            r.raise_for_status()
            body = r.json()
            errs = body.get("errors") or (body.get("data") or {}).get("createQueue", {}).get("userErrors")
            if errs:
                raise BenchError(f"cannot create queue {name}: {errs}")
            self.queue_names.append(name)

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
        if a.one_per_request:
            await self.one_per_request_submitter(t0)
            return
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

    async def one_per_request_submitter(self, t0: float) -> None:
        """--one-per-request: --clients clients, one submitJob with one job per request
        (bench/clients.py); a job's submit time is its arrival, so time it waits for a
        free client counts in its dispatch latency."""
        a = self.args
        gen = self.generator()
        offsets = arrivals(a.rate, a.duration, seed=a.seed + 1)
        self.arrivals_planned = len(offsets)
        jobs: asyncio.Queue = asyncio.Queue()

        def submitted(job_id: str, arrived: float, req: object) -> None:
            assert isinstance(req, JobReq)
            self.last_submit_ts = time.time()
            self.record_submitted(job_id, arrived, req)

        clients = asyncio.create_task(run_clients([url for _, url in self.servers], self.token, a.clients, jobs,
                                                  submitted))
        for offset in offsets:
            delay = offset - (time.monotonic() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            job = gen.next()
            jobs.put_nowait((time.time(), job.graphql_input(), job))
            self.submit_requests += 1
        for _ in range(a.clients):
            jobs.put_nowait(None)
        res = await clients
        self.submit_errors += res.refused + res.failed
        self.request_s = res.request_s

    async def lose_host(self, nc, client: httpx.AsyncClient, delay: float, host: str) -> None:
        await asyncio.sleep(delay)
        # The leader's own record of the loss and of the requeues it caused.
        seen: dict[str, list[tuple[str, float]]] = {"lost": [], "requeued": [], "failed": []}

        async def on_lost(msg) -> None:
            ev = json.loads(msg.data)
            # One alert a host, or one for many lost in one check (its first 20 named).
            for host_id in [ev.get("host_id")] if ev.get("host_id") else (ev.get("data") or {}).get("host_ids", []):
                seen["lost"].append((host_id, ev.get("ts")))

        async def on_requeued(msg) -> None:
            ev = json.loads(msg.data)
            seen["requeued"].append((ev.get("host_id"), ev.get("ts")))

        async def on_failed(msg) -> None:
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
        self.machine_speed = speed = python_speed()
        print(f"machine: {speed['python_workload_ms']} ms for {speed['workload']}", flush=True)
        self.start_nats()
        if a.postgres:
            self.start_postgres()
            print(f"history in PostgreSQL {self.args.db_url} (fsync and synchronous_commit on)", flush=True)
        if a.backlog:
            self.backlogged = await preload_backlog(self.nats_url, fleet, a.backlog, replicas=a.replicas, seed=a.seed)
            print(f"queued {self.backlogged['jobs']} jobs in queue backlog, which admits none of them "
                  f"({self.backlogged['bytes'] / 2**20:.0f} MB in {self.backlogged['seconds']} s)", flush=True)
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
        await nc.subscribe(f"alerts.{subjects.ALERT_HOST_FENCED}", cb=self.on_fence_alert)
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
            view: dict[str, dict[str, Any]] = {"hosts": {"healthy": int(m.get('muster_hosts{health="HEALTHY"}', 0)),
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
            if ready == k and "observer" in self.stats and view["hosts"]["healthy"] >= a.hosts \
                    and view["leadership"]["role"] == "leader" and caught_up and history_done and observer_done:
                break
            if time.monotonic() > deadline:
                if ready < k or "observer" not in self.stats:
                    raise BenchError(f"not ready after {a.startup_timeout + a.hosts / 500 + a.preload / 5000:.0f} s: "
                                     f"{ready}/{k} "
                                     f"simulators, observer {'up' if 'observer' in self.stats else 'missing'}")
                msg = (f"started the run anyway after {time.time() - t_boot:.0f} s: the server saw only "
                       f"{view['hosts']['healthy']} of {a.hosts} hosts healthy (role {view['leadership']['role']}), "
                       f"{pending} heartbeats pending, the observer {obs_pending} records behind"
                       + (f", {history} preloaded jobs in history" if history is not None else ""))
                print("WARNING: " + msg, flush=True)
                self.notes.append(msg)
                break
            print(f"[startup {time.time() - t_boot:5.1f}s] simulators ready {ready}/{k}, server sees "
                  f"{view['hosts']['healthy']}/{a.hosts} hosts healthy, role {view['leadership']['role']}, "
                  f"heartbeats pending {pending if pending is not None else '?'}, "
                  f"observer behind {obs_pending if obs_pending is not None else '?'}"
                  + (f", preloaded jobs in history {history}" if history is not None else ""), flush=True)
            await asyncio.sleep(2.0)
        if a.queues:
            await self.create_queues(client, fleet)
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
        ended_at_start = ended_jobs(self.metrics[-1][1]) if self.metrics else None
        self.tick(t0, "run")
        readers = None
        if (a.read_flood or a.browse) and not a.burst:
            readers = self.spawn("readers", [sys.executable, "-m", "bench.readers", "--url", self.http, "--token",
                                             self.token, "--flood", str(a.read_flood), "--browse", str(a.browse),
                                             "--duration", str(a.duration), "--out", str(self.work / "reads.json")])
            readers.finite = True
        kill_tasks = [asyncio.create_task(self.kill_at(delay, what, nc, client))
                      for delay, what in ((a.kill_leader_at, "leader server"),
                                          (a.kill_nats_leader_at, f"NATS {a.kill_nats_leader_of} stream leader"))
                      if delay is not None]
        lag = HistoryLag(self.history_url, since=t0)
        stop_lag = asyncio.Event()
        lag_task = asyncio.create_task(lag.run(stop_lag))
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
        if readers is not None:
            assert readers.popen is not None
            try:
                await asyncio.wait_for(asyncio.to_thread(readers.popen.wait), timeout=120)
                self.reads = json.loads((self.work / "reads.json").read_text())
            except (TimeoutError, OSError, ValueError) as exc:
                self.notes.append(f"readers did not report: {exc}")
        # Drain: until every submitted job has reached a host, or the drain timeout.
        drain_deadline = time.monotonic() + a.drain
        while time.monotonic() < drain_deadline:
            missing = sum(1 for j in self.submitted if j not in self.live_dispatch)
            if missing == 0 and not self.retrying and (lost_task is None or lost_task.done()):
                break
            await asyncio.sleep(1.0)
            self.check_children()
            self.tick(t0, "drain")
        for t in list(self.retrying):  # still not accepted: given up, in doubt
            t.cancel()
        await asyncio.gather(*self.retrying, return_exceptions=True)
        if lost_task is not None:
            if not lost_task.done():
                print("waiting for the silenced host to be reported LOST", flush=True)
            try:
                await asyncio.wait_for(lost_task, timeout=3 * 5.0 + a.lost_timeout + 5)
            except TimeoutError:
                pass
        for t in kill_tasks:
            if not t.done():
                t.cancel()
            try:
                await t
            except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - reported, the run goes on
                if not isinstance(exc, asyncio.CancelledError):
                    self.notes.append(f"--kill failed: {exc!r}")
        # Let in-flight heartbeats land, then take the last metrics and process samples.
        await asyncio.sleep(1.5)
        ended_now = ended_jobs(self.metrics[-1][1]) if self.metrics else None
        if ended_at_start is not None and ended_now is not None:
            expected = ended_now - ended_at_start
            if len(lag.lag) < expected:
                print(f"waiting for the history database: {len(lag.lag)} of {expected} ended jobs' rows read",
                      flush=True)
            await lag.catch_up(expected, a.history_wait)
        stop_lag.set()
        await lag_task
        self.history_lag = await asyncio.to_thread(lag.finish)
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
        self.submissions_waiting = await self.waiting_submissions()
        stop_sampling.set()
        await sampler
        for c in self.children:
            c.sample()
        await client.aclose()
        await nc.close()
        return build_report(self, fleet, k, startup_s)

    async def waiting_submissions(self, most: int = 50_000) -> set[str]:
        """The ids of the jobs whose submissions still wait in the SUBMIT stream when the
        run ends (stored, acknowledged, not yet taken in by the leader: its backlog),
        read without consuming them; at most `most` messages."""
        out: set[str] = set()
        try:
            info = await self.js.stream_info(subjects.SUBMIT_STREAM)
        except Exception as exc:  # noqa: BLE001 - reported; the run's other figures stand
            self.notes.append(f"the SUBMIT stream could not be read at the end: {exc}")
            return out
        if not info.state.messages:
            return out
        first, last = info.state.first_seq, info.state.last_seq
        for seq in range(first, min(last, first + most - 1) + 1):
            try:
                msg = await self.js.get_msg(subjects.SUBMIT_STREAM, seq)
                jobs = json.loads(msg.data or b"{}").get("jobs") or []
            except Exception:  # noqa: BLE001 - taken in and removed meanwhile, or not a submission
                continue
            out.update(str(j["id"]) for j in jobs if isinstance(j, dict) and j.get("id"))
        return out

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

    def machine_busy_pct(self) -> float | None:
        """Share of all CPUs busy (not idle or waiting for I/O) in the measured window:
        every process counts, ours and the kernel's."""
        a, b = self.machine_cpu_at_start, self.machine_cpu_at_end
        if a is None or b is None:
            return None
        total = sum(b) - sum(a)
        idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
        return round(100 * (total - idle) / total, 1) if total > 0 else None
