"""Operator latency at scale: console pages and GraphQL `hosts`/`jobs` queries with
50,000 hosts in the `hosts` bucket and 500,000 jobs in the history database.

    python -m bench.operator [--hosts 50000] [--jobs 500000] [--reps 30] [--warmup 3]
                             [--heartbeat-interval 30] [--live-jobs 300]
                             [--json bench/results/operator-50k-500k.json]

In order:
  1. Fills a fresh SQLite history database (schema at Alembic head, made by
     `server.history.database.History`) with --jobs finished jobs submitted over the last --days
     days: their rows, attempts and the events `job_events` derives, built exactly as
     `History._write` builds them, plus the host events and alerts the recorder would have
     written (one `job.failed` alert per failed job, host incidents, GPU faults). Rows go
     in with executemany, the secondary indexes dropped first and rebuilt after.
  2. Starts nats-server and one `muster server` on that database (bench.run's process
     helpers), the server's --heartbeat-interval set to the simulated hosts' interval.
  3. Publishes the fleet (bench.workload's synthetic fleet: H100/A100/L40S/CPU-only hosts,
     32 per rack, 1,000 per zone): a bench.simhosts simulator keeps 98.5 % of the hosts
     heartbeating, with varied GPU utilisation, temperature, power, memory and a few
     faulty GPUs; 1 % are published once with a long TTL (they turn SUSPECT) and 0.5 %
     once with a 2 s TTL (they turn LOST); 1 % are cordoned and 0.2 % drained through
     the API.
  4. Submits --live-jobs real jobs with `submitJobs` (60 % run on the simulated hosts for
     a day, 20 % wait for a GPU model no host has, 20 % finish at once) and waits until
     history holds them all.
  5. Signs in to the console and times --warmup + --reps sequential requests of every
     kind below, round-robin (wall time to the last byte of the body; each response is
     checked), sampling the server's CPU time and RSS throughout.

It prints a table, the same table as Markdown for the README, and writes the JSON
report. `python -m bench.operator simulate ...` is the simulator process it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.run import Bench, BenchError, Child, parse_metrics, summary_ms
from bench.simhosts import SimHost
from bench.workload import GPU_MEMORY_MB, HostSpec, heartbeat_static, synthetic_fleet, write_fleet
from wire import natsclient
from server.history.database import DB_FILE, AttemptRow, EventRow, History, JobRow, job_events
from wire.messages import SHAPE_HEADER, Attempt, AttemptState, Job, JobSpec, JobState
from server.api.graphql.cursors import encode_cursor

PER_PAGE = 50  # console page size (web.console.PER_PAGE) and the GraphQL page asked for

# ---------------------------------------------------------------- the fleet

SUSPECT_SHARE = 0.01
LOST_SHARE = 0.005
CORDONED_SHARE = 0.01
DRAINED_SHARE = 0.002
FAULTY_SHARE = 0.003
GPU_FAULTS = ("xid 79: GPU has fallen off the bus", "xid 48: double-bit ECC error",
              "ecc (uncorrectable): uncorrectable ECC errors increased")


def varied_usage(spec: HostSpec) -> tuple[dict[str, object], float, int]:
    """The static part of a host's heartbeat with lifelike GPU usage (busy or idle,
    temperature and power following utilisation, now and then a faulty GPU), its CPU %
    and used memory; the same for a host every time (seeded by its id)."""
    rng = random.Random(spec.id)
    static = heartbeat_static(spec)
    busy = 0.0 if rng.random() < 0.3 else rng.uniform(20.0, 100.0)
    bad = rng.randrange(spec.gpus) if spec.gpus and rng.random() < FAULTY_SHARE else -1
    mem = GPU_MEMORY_MB.get(spec.model, 16384)
    for u in static["gpu_usage"]:  # type: ignore[union-attr]
        util = round(min(100.0, max(0.0, busy + rng.uniform(-15.0, 15.0))), 1) if busy else 0.0
        u.update(util_pct=util, mem_used_mb=int(mem * util / 110), temp_c=round(33 + util * 0.45 + rng.uniform(-2, 2), 1),
                 power_w=round(60 + util * 6.4 + rng.uniform(-5, 5), 1))
        if u["index"] == bad:
            u.update(healthy=False, fault=rng.choice(GPU_FAULTS))
    cpu_pct = round(min(100.0, busy * 0.6 + rng.uniform(1.0, 10.0)), 1)
    mem_used = int(spec.memory_mb * min(0.95, 0.05 + busy / 150))
    return static, cpu_pct, mem_used


class VariedSimHost(SimHost):
    """bench.simhosts.SimHost with the usage of `varied_usage` in every heartbeat."""

    def __init__(self, spec: HostSpec, boot_id: str, ttl: str = "15s") -> None:
        super().__init__(spec, boot_id, ttl)
        static, cpu_pct, mem_used = varied_usage(spec)
        body = json.dumps(static, separators=(",", ":"))[1:-1]
        self.set_tail((f',{body},"cpu_pct":{cpu_pct},"mem_used_mb":{mem_used},"simulated":true,'
                       f'"agent_version":"bench-sim","term":').encode())


def simulate(argv: list[str]) -> int:
    """`python -m bench.operator simulate <bench.simhosts options>`: the simulator with
    varied heartbeats (bench.simhosts builds its hosts from the module's `SimHost`)."""
    import bench.simhosts as simhosts

    simhosts.SimHost = VariedSimHost  # type: ignore[misc]
    return simhosts.main(argv)


@dataclass
class FleetPlan:
    """The fleet and what becomes of each host: heartbeating, SUSPECT, LOST, cordoned, drained."""

    hosts: list[HostSpec]
    live: list[HostSpec]
    suspect: list[HostSpec]
    lost: list[HostSpec]
    cordoned: list[str]
    drained: list[str]


def build_fleet(n: int, seed: int) -> FleetPlan:
    hosts = synthetic_fleet(n, seed=seed)
    rng = random.Random(seed + 101)
    live: list[HostSpec] = []
    suspect: list[HostSpec] = []
    lost: list[HostSpec] = []
    for h in hosts:
        h.labels["pool"] = "cpu" if not h.gpus else ("inference" if h.model == "L40S" else "training")
        r = rng.random()
        (lost if r < LOST_SHARE else suspect if r < LOST_SHARE + SUSPECT_SHARE else live).append(h)
    ids = [h.id for h in live]
    picked = rng.sample(ids, max(1, round(n * CORDONED_SHARE)) + max(1, round(n * DRAINED_SHARE)))
    k = max(1, round(n * CORDONED_SHARE))
    return FleetPlan(hosts, live, suspect, lost, sorted(picked[:k]), sorted(picked[k:]))


async def publish_once(nats_url: str, hosts: list[tuple[HostSpec, str]]) -> None:
    """One heartbeat per host with the given TTL, then no more (SUSPECT, then LOST)."""
    nc = await natsclient.connect(nats_url.split(","), name="bench-operator-once")
    try:
        boot = os.urandom(8).hex()
        for spec, ttl in hosts:
            h = VariedSimHost(spec, boot)
            await nc.publish(h.subject, h.heartbeat(time.time()), headers={"Nats-TTL": ttl, SHAPE_HEADER: h.shape})
        await nc.flush(timeout=30)
    finally:
        await nc.close()


# ---------------------------------------------------------------- history

FIRST = ("ana", "ben", "chen", "dara", "eli", "fatima", "gus", "hana", "ivan", "jo", "kai", "lena", "mo", "nia",
         "omar", "pia", "quinn", "ravi", "sara", "tom")
USERS = [f"{a}.{b}" for a in FIRST for b in "abcdefghij"]
TOPICS = ("llama-7b", "llama-70b", "resnet50", "vit-l", "whisper", "bert-base", "diffusion", "moe-8x7b",
          "rl-ppo", "asr-conformer")
# prefix, GPU counts to pick from, median run time (s), weight
KINDS = (("train", (8, 8, 4, 2), 3 * 3600, 0.25), ("finetune", (1, 2, 4, 8), 1800, 0.20),
         ("eval", (1, 1, 2), 600, 0.20), ("sweep", (1,), 900, 0.15), ("preprocess", (0,), 300, 0.12),
         ("notebook", (1,), 7200, 0.05), ("render", (0, 1), 120, 0.03))
CANCEL_REASONS = ("no longer needed", "wrong config", "superseded by a newer run", "queue too long")
FAIL_TAILS = (
    "Traceback (most recent call last):\n  File \"train.py\", line 212, in <module>\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    "Traceback (most recent call last):\n  File \"data.py\", line 88, in load\n"
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-00417.parquet'\n",
    "ValueError: loss is NaN at step 1200\n",
    "Killed\n",
)
EVENT_SEQ_BASE = 100_000_000  # recorded host events/alerts: ids far from a fresh stream's


def _cum(weights: list[float]) -> list[float]:
    out, s = [], 0.0
    for w in weights:
        s += w
        out.append(s)
    return out


class HistoryMaker:
    """Finished jobs as the control plane leaves them: spec, tries (retries after a lost
    host, gangs of tasks), output tails, cancel reasons; deterministic from the seed."""

    def __init__(self, fleet: list[HostSpec], seed: int) -> None:
        self.rng = random.Random(seed)
        users = USERS[:]
        random.Random(seed + 1).shuffle(users)
        self.users = users
        self.user_cum = _cum([1.0 / (k + 1) for k in range(len(users))])
        self.kind_cum = _cum([k[3] for k in KINDS])
        self.by_gpus = {g: [h for h in fleet if h.gpus >= g] for g in (0, 1, 2, 4, 8)}
        self.by_model: dict[tuple[str, int], list[HostSpec]] = {}
        for g in (1, 2, 4, 8):
            for m in ("H100", "A100", "L40S"):
                hs = [h for h in fleet if h.model == m and h.gpus >= g]
                if hs:
                    self.by_model[(m, g)] = hs
        self.revision = 1000
        self.alerts: list[dict[str, object]] = []

    def job(self, ts: float, now: float) -> Job:
        rng = self.rng
        user = rng.choices(self.users, cum_weights=self.user_cum)[0]
        prefix, gpu_choices, median_s, _ = rng.choices(KINDS, cum_weights=self.kind_cum)[0]
        topic = rng.choice(TOPICS)
        run = rng.randrange(1, 5000)
        g = rng.choice(gpu_choices)
        model = None
        if g:
            r = rng.random()
            model = "H100" if r < 0.25 else "A100" if r < 0.37 else "L40S" if r < 0.40 and g <= 4 else None
        replicas = rng.choice((2, 4, 8)) if prefix == "train" and g == 8 and rng.random() < 0.08 else 1
        r = rng.random()
        priority = 0 if r < 0.80 else 100 if r < 0.90 else 200 if r < 0.94 else -100
        spec = JobSpec(
            name=f"{prefix}-{topic}-{run}", command=["python", f"{prefix}.py", "--config", f"configs/{topic}.yaml",
                                                    "--seed", str(run)],
            env={"WANDB_PROJECT": topic} if prefix in ("train", "finetune") and rng.random() < 0.5 else {},
            cwd=f"/home/{user}/work" if rng.random() < 0.3 else None, gpus=g, gpu_model=model,
            cpus=float(8 * g) if g else float(rng.choice((2, 4, 8))), memory_mb=16384 * max(1, g),
            priority=priority, user=user, replicas=replicas, same_rack=replicas > 1 and rng.random() < 0.5)
        job_id = f"j{int(ts * 1000):012x}{rng.getrandbits(40):010x}"  # as wire.messages.new_id
        # How it ended, and the tries on the way.
        r = rng.random()
        lost_first = [AttemptState.LOST] if rng.random() < 0.05 else []
        if r < 0.78:
            final, tries = JobState.SUCCEEDED, lost_first + [AttemptState.SUCCEEDED]
        elif r < 0.90:
            final = JobState.FAILED
            tries = [AttemptState.LOST] * 3 if rng.random() < 0.1 else lost_first + [AttemptState.FAILED]
        else:
            final = JobState.CANCELLED
            tries = [] if rng.random() < 0.4 else lost_first + [AttemptState.KILLED]
        cancel_reason = rng.choice(CANCEL_REASONS + (f"cancelled by {user}",)) if final is JobState.CANCELLED else ""
        attempts: list[Attempt] = []
        not_before = 0.0
        t = ts
        term = 1000 + int(ts / 86400 * 3) % 100000
        for n, ended in enumerate(tries, start=1):
            t += rng.expovariate(1 / 20.0) + (rng.uniform(600, 7200) if rng.random() < 0.05 else 0.0)
            placed, started = t, t + rng.uniform(0.3, 3.0)
            full = rng.lognormvariate(math.log(median_s), 0.8)
            if ended is AttemptState.SUCCEEDED:
                run_s = full
            elif ended is AttemptState.FAILED:
                run_s = full * rng.uniform(0.01, 0.5)
            else:  # lost (its heartbeat key expired 15 s later), or killed by the cancel
                run_s = full * rng.uniform(0.05, 0.9) + (15.0 if ended is AttemptState.LOST else 0.0)
            finished = min(started + run_s, now - 1.0)
            hosts = self._hosts(spec)
            for task, host in enumerate(hosts):
                state = ended
                reason = ""
                if ended is AttemptState.LOST:
                    reason = f"host {hosts[0].id} lost" if task == 0 else "gang task 0 ended LOST"
                    state = AttemptState.LOST if task == 0 else AttemptState.KILLED
                elif ended is AttemptState.KILLED:
                    reason = cancel_reason
                start = rng.randrange(0, host.gpus - g + 1) if g else 0
                attempts.append(Attempt(
                    id=f"{job_id}.{n}" if replicas == 1 else f"{job_id}.{n}.{task}", number=n, task=task,
                    host_id=host.id, gpu_indices=list(range(start, start + g)), state=state, term=term,
                    placed_at=placed, started_at=started, finished_at=finished,
                    exit_code=0 if state is AttemptState.SUCCEEDED else (rng.choice((1, 1, 2, 137))
                                                                         if state is AttemptState.FAILED else None),
                    output_tail=self._tail(state, spec.name, run_s), reason=reason))
            t = finished
            if ended is AttemptState.LOST and n < len(tries):
                not_before = t = t + (0.0 if n <= 1 else min(60.0, 2.0 ** (n - 2)))  # server.scheduling.retry.backoff_s
        job = Job(id=job_id, spec=spec, state=final, submitted_at=ts,
                  updated_at=t if tries else min(ts + rng.uniform(10, 7200), now - 1.0), attempts=attempts,
                  not_before=not_before, cancel_reason=cancel_reason)
        self.revision += rng.randrange(2, 9)
        if final is JobState.FAILED:
            a = job.current
            assert a is not None
            self.alerts.append(dict(ts=job.updated_at, kind="alert.job.failed", job_id=job.id, host_id=a.host_id,
                                    message=f"exit code {a.exit_code}" if a.state is AttemptState.FAILED
                                    else f"all {spec.max_attempts} attempts used"))
        return job

    def _hosts(self, spec: JobSpec) -> list[HostSpec]:
        pool = self.by_model.get((spec.gpu_model, spec.gpus)) if spec.gpu_model else None
        pool = pool or self.by_gpus[spec.gpus]
        if spec.replicas == 1:
            return [self.rng.choice(pool)]
        i = self.rng.randrange(0, max(1, len(pool) - spec.replicas))
        return pool[i: i + spec.replicas]

    def _tail(self, state: AttemptState, name: str, run_s: float) -> str:
        rng = self.rng
        step = int(run_s * rng.uniform(0.5, 3.0))
        if state is AttemptState.SUCCEEDED:
            return (f"epoch {step // 1000} step {step} loss {rng.uniform(0.05, 2.5):.4f}\n"
                    f"saved checkpoint to /ckpt/{name}/step-{step}\ndone in {run_s:.0f}s\n")
        if state is AttemptState.FAILED:
            return rng.choice(FAIL_TAILS)
        if state is AttemptState.KILLED:
            return f"step {step} loss {rng.uniform(0.05, 2.5):.4f}\nreceived SIGTERM, exiting\n"
        return ""

    def host_events(self, fleet: list[HostSpec], t0: float, now: float, incidents: int) -> list[dict[str, object]]:
        """Host health transitions and their alerts (`server.health.monitor`), GPU faults."""
        rng = self.rng
        out: list[dict[str, object]] = []
        for _ in range(incidents):
            h = rng.choice(fleet)
            t = rng.uniform(t0, now - 3600)
            back = t + rng.uniform(15, 3600)
            for ts, kind, msg in ((t, "host.suspect", "HEALTHY -> SUSPECT"), (t + 5, "host.lost", "SUSPECT -> LOST"),
                                  (back, "host.healthy", "LOST -> HEALTHY")):
                out.append(dict(ts=ts, kind=kind, job_id=None, host_id=h.id, message=f"{h.id}: {msg}"))
            out.append(dict(ts=t + 5, kind="alert.host.lost", job_id=None, host_id=h.id,
                            message=f"host {h.id}: heartbeat key expired"))
            out.append(dict(ts=back, kind="alert.host.recovered", job_id=None, host_id=h.id,
                            message=f"host {h.id}: heartbeats resumed"))
        gpu_hosts = self.by_gpus[1]
        for _ in range(max(1, incidents // 10)):
            h = rng.choice(gpu_hosts)
            out.append(dict(ts=rng.uniform(t0, now), kind="alert.gpu.unhealthy", job_id=None, host_id=h.id,
                            message=f"GPU {rng.randrange(h.gpus)} on {h.id} is unschedulable: {rng.choice(GPU_FAULTS)}"))
        return out


def job_rows(job: Job, revision: int) -> tuple[dict[str, object], list[dict[str, object]], list[dict[str, object]]]:
    """The jobs, attempts and events rows of a job: what `History._write` writes for it."""
    row = dict(id=job.id, name=job.spec.name, user=job.spec.user, state=job.state.value,
               priority=job.spec.priority, gpus=job.spec.gpus, gpu_model=job.spec.gpu_model,
               submitted_at=job.submitted_at, updated_at=job.updated_at, revision=revision,
               doc=job.model_dump_json())
    attempts = [dict(id=a.id, job_id=job.id, number=a.number, host_id=a.host_id, state=a.state.value,
                     term=a.term, exit_code=a.exit_code, placed_at=a.placed_at, started_at=a.started_at,
                     finished_at=a.finished_at) for a in job.attempts]
    return row, attempts, job_events(job)


@dataclass
class Filled:
    jobs: int = 0
    attempts: int = 0
    events: int = 0
    alerts: int = 0
    by_state: Counter[str] = field(default_factory=Counter)
    by_user: Counter[str] = field(default_factory=Counter)
    window: tuple[float, float] = (0.0, 0.0)
    in_window: int = 0
    retried_job: str = ""
    retried_attempts: int = 0
    seconds: float = 0.0
    db_bytes: int = 0


def fill_history(db_url: str, fleet: list[HostSpec], n_jobs: int, *, seed: int, days: float, now: float,
                 chunk: int = 10_000, progress: Callable[[str], None] = print) -> Filled:
    """Bulk-insert `n_jobs` finished jobs (and their attempts, events, alerts) into a fresh
    SQLite history database: executemany with the secondary indexes dropped, then rebuilt
    from their own DDL, so the schema ends exactly as Alembic made it."""
    if not db_url.startswith("sqlite"):
        raise BenchError("the history fill supports SQLite only")
    t_start = time.perf_counter()
    hist = History(db_url)
    engine = hist.engine
    tables = ("jobs", "attempts", "events")
    with engine.begin() as conn:
        indexes = conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL AND tbl_name IN "
            f"({', '.join(repr(t) for t in tables)})").all()
        for name, _ in indexes:
            conn.exec_driver_sql(f'DROP INDEX "{name}"')
    maker = HistoryMaker(fleet, seed)
    t0 = now - days * 86400.0
    rng = random.Random(seed + 2)
    times = sorted(rng.uniform(t0, now - 600.0) for _ in range(n_jobs))
    mid = t0 + (now - t0) / 2
    out = Filled(window=(mid, mid + 86400.0))
    jobs_t, att_t, ev_t = (JobRow.__table__, AttemptRow.__table__, EventRow.__table__)  # type: ignore[attr-defined]
    for i in range(0, n_jobs, chunk):
        jrows: list[dict[str, object]] = []
        arows: list[dict[str, object]] = []
        erows: list[dict[str, object]] = []
        for ts in times[i: i + chunk]:
            job = maker.job(ts, now)
            row, atts, evs = job_rows(job, maker.revision)
            jrows.append(row)
            arows.extend(atts)
            erows.extend(evs)
            out.by_state[job.state.value] += 1
            out.by_user[job.spec.user] += 1
            out.in_window += out.window[0] <= ts < out.window[1]
            if len(job.attempts) > out.retried_attempts and job.spec.replicas == 1:
                out.retried_job, out.retried_attempts = job.id, len(job.attempts)
        with engine.begin() as conn:
            for table, rows in ((jobs_t, jrows), (att_t, arows), (ev_t, erows)):
                _insert(conn, table, rows)
        out.jobs += len(jrows)
        out.attempts += len(arows)
        out.events += len(erows)
        if (i // chunk) % 10 == 9:
            progress(f"history: {out.jobs:,} jobs, {out.attempts:,} attempts, {out.events:,} events "
                     f"({time.perf_counter() - t_start:.0f} s)")
    recorded = maker.alerts + maker.host_events(fleet, t0, now, incidents=max(10, n_jobs // 100))
    recorded.sort(key=lambda e: float(e["ts"]))  # type: ignore[arg-type]
    seq = Counter[str]()
    for e in recorded:
        stream = "ALERTS" if str(e["kind"]).startswith("alert.") else "EVENTS"
        seq[stream] += 1
        e["id"] = f"{stream}:{EVENT_SEQ_BASE + seq[stream]}"
    with engine.begin() as conn:
        _insert(conn, ev_t, recorded)
    out.alerts = seq["ALERTS"]
    out.events += len(recorded)
    progress(f"history: rebuilding {len(indexes)} indexes ({time.perf_counter() - t_start:.0f} s)")
    with engine.begin() as conn:
        for _, sql in indexes:
            conn.exec_driver_sql(sql)
    hist.close()
    out.seconds = time.perf_counter() - t_start
    db = Path(engine.url.database or "")
    out.db_bytes = sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())
    return out


def _insert(conn: Any, table: Any, rows: list[dict[str, object]]) -> None:
    """executemany straight to the driver: the table's own columns, rows as tuples
    (SQLAlchemy's per-row parameter processing cost more than SQLite's insert)."""
    if not rows:
        return
    cols = [c.name for c in table.columns]
    names = ", ".join(f'"{c}"' for c in cols)
    sql = f'INSERT INTO "{table.name}" ({names}) VALUES ({", ".join("?" * len(cols))})'
    conn.exec_driver_sql(sql, [tuple(r[c] for c in cols) for r in rows])


# ---------------------------------------------------------------- processes


class Processes(Bench):
    """bench.run's process handling (spawn, nats-server, server, stop_all), the server
    started on the filled database with this benchmark's heartbeat interval."""

    db_url = ""

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        if name == "server":
            argv = [*argv, "--db-url", self.db_url, "--heartbeat-interval", str(self.args.heartbeat_interval)]
        return super().spawn(name, argv, env)


class Sampler(threading.Thread):
    """Samples the processes' CPU time and RSS twice a second (for peak RSS)."""

    def __init__(self, children: list[Child]) -> None:
        super().__init__(name="operator-bench-sampler", daemon=True)
        self.children = children
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for c in list(self.children):
                c.sample()


# ---------------------------------------------------------------- requests

HOSTS_Q = """query($first: Int, $after: String, $filter: HostFilter, $sort: HostSort) {
  hosts(first: $first, after: $after, filter: $filter, sort: $sort) { totalCount pageInfo { hasNextPage endCursor }
    edges { cursor node { id health cordoned draining simulated gpus gpuModel gpusAllocated gpusUnhealthy gpuUtilPct
      cpus cpuPct memoryMb memUsedMb lastSeen tasks labels { key value } } } } }"""
JOBS_Q = """query($first: Int, $after: String, $filter: JobFilter, $sort: JobSort) {
  jobs(first: $first, after: $after, filter: $filter, sort: $sort) { totalCount pageInfo { hasNextPage endCursor }
    edges { cursor node { id name user state priority gpus gpuModel replicas submittedAt updatedAt } } } }"""
CLUSTER_Q = """{ cluster { hosts { total healthy suspect lost } gpus { total allocated }
  gpusByModel { model total allocated healthy } gpusByRack { rack total allocated healthy }
  cpu { total allocated } memoryMb { total allocated } jobsByState { state count } } }"""
JOB_Q = """query($id: ID!) { job(id: $id) { id name user state priority submittedAt updatedAt cancelReason
  attempts { id number task state host { id health } gpuIndices exitCode placedAt startedAt finishedAt
  outputTail reason } } }"""
WHY_Q = """query($id: ID!) { job(id: $id) { id state queuePosition pendingReasons { reason hosts } } }"""


@dataclass
class Req:
    name: str
    kind: str  # "console" (GET path) or "graphql" (POST query)
    target: str
    check: Callable[[httpx.Response], str | None]
    variables: dict[str, Any] | None = None
    times: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    ok: int = 0
    failures: int = 0
    first_failure: str | None = None

    def label(self) -> str:
        if self.kind == "console":
            return f"GET {self.target}"
        return "POST /graphql " + json.dumps(self.variables or {}, separators=(",", ":"))[:160]


def _html(*needles: str, rows: tuple[str, int] | None = None) -> Callable[[httpx.Response], str | None]:
    def check(r: httpx.Response) -> str | None:
        if r.status_code != 200:
            return f"HTTP {r.status_code} {r.headers.get('location', '')}"
        for s in needles:
            if s not in r.text:
                return f"missing {s!r}"
        if rows is not None and r.text.count(rows[0]) != rows[1]:
            return f"{r.text.count(rows[0])} rows ({rows[0]!r}), expected {rows[1]}"
        return None

    return check


def _gql(pick: Callable[[dict[str, Any]], str | None]) -> Callable[[httpx.Response], str | None]:
    def check(r: httpx.Response) -> str | None:
        if r.status_code != 200:
            return f"HTTP {r.status_code}"
        body = r.json()
        if body.get("errors"):
            return str(body["errors"])[:300]
        try:
            return pick(body["data"])
        except (KeyError, TypeError, IndexError) as exc:
            return f"unexpected data: {exc!r}"

    return check


def _conn(key: str, total: int | None = None, edges: int | None = PER_PAGE,
          each: Callable[[dict[str, Any]], bool] | None = None) -> Callable[[httpx.Response], str | None]:
    def pick(d: dict[str, Any]) -> str | None:
        c = d[key]
        if total is not None and c["totalCount"] != total:
            return f"totalCount {c['totalCount']}, expected {total}"
        n = len(c["edges"])
        if (edges is not None and n != edges) or n == 0:
            return f"{n} edges, expected {edges}"
        if each is not None and not all(each(e["node"]) for e in c["edges"]):
            return "an edge does not match the filter"
        return None

    return _gql(pick)


@dataclass
class Plan:
    """What the requests ask for and what their answers must hold."""

    fleet: FleetPlan
    filled: Filled
    jobs_total: int
    queued_job: str
    host_cursor: str
    job_cursor: str


def requests_for(p: Plan) -> list[Req]:
    f, h = p.fleet, p.filled
    n_hosts = len(f.hosts)
    mid = f.live[len(f.live) // 2]
    rack, zone = mid.labels["rack"], mid.labels["zone"]
    in_rack = sum(1 for x in f.hosts if x.labels["rack"] == rack)
    a100_in_zone = sum(1 for x in f.hosts if x.labels["zone"] == zone and x.model == "A100")
    prefix = mid.id[:-2]
    matching = sum(1 for x in f.hosts if x.id.startswith(prefix))
    cordoned = len(f.cordoned) + len(f.drained)
    user = min(h.by_user, key=lambda u: (abs(h.by_user[u] - h.jobs / 100), u))  # about 1 % of the jobs
    w0, w1 = (datetime.fromtimestamp(t, timezone.utc).isoformat() for t in h.window)
    hosts_page = max(1, n_hosts // PER_PAGE // 2)
    jobs_page = max(1, p.jobs_total // PER_PAGE // 2)
    first_rows = min(PER_PAGE, n_hosts)
    host_row = 'id="host-'
    job_row = 'id="job-'
    console = [
        Req("console / (overview, heat map)", "console", "/",
            _html("Cluster overview", "heat-", f"<dd>{n_hosts}</dd>")),
        Req("console /hosts", "console", "/hosts", _html(f"{n_hosts} hosts", rows=(host_row, first_rows))),
        Req("console /hosts?health=SUSPECT", "console", "/hosts?health=SUSPECT", _html("health SUSPECT", host_row)),
        Req("console /hosts?rack=", "console", f"/hosts?rack={rack}",
            _html(f"{in_rack} host", rows=(host_row, min(PER_PAGE, in_rack)))),
        Req("console /hosts?model=A100&zone=", "console", f"/hosts?zone={zone}&model=A100",
            _html(f"{a100_in_zone} host", rows=(host_row, min(PER_PAGE, a100_in_zone)))),
        Req("console /hosts?q= (search)", "console", f"/hosts?q={prefix}",
            _html(f"{matching} host", rows=(host_row, min(PER_PAGE, matching)))),
        Req("console /hosts?sort=-util", "console", "/hosts?sort=-util", _html(rows=(host_row, first_rows))),
        Req(f"console /hosts?page={hosts_page}", "console", f"/hosts?page={hosts_page}",
            _html(f"{n_hosts} hosts", rows=(host_row, PER_PAGE if n_hosts >= 2 * PER_PAGE else first_rows))),
        Req("console /hosts/{id}", "console", f"/hosts/{mid.id}", _html(mid.id, "GPU")),
        Req("console /jobs", "console", "/jobs", _html(f"{p.jobs_total} jobs", rows=(job_row, PER_PAGE))),
        Req("console /jobs?state=FAILED", "console", "/jobs?state=FAILED",
            _html(f"{h.by_state['FAILED']} jobs FAILED", rows=(job_row, PER_PAGE))),
        Req("console /jobs?state=RUNNING", "console", "/jobs?state=RUNNING", _html("jobs RUNNING", job_row)),
        Req(f"console /jobs?page={jobs_page}", "console", f"/jobs?page={jobs_page}",
            _html(f"{p.jobs_total} jobs", rows=(job_row, PER_PAGE))),
        Req("console /jobs/{id} (history, retried)", "console", f"/jobs/{h.retried_job}",
            _html(h.retried_job, f"{h.retried_job}.{h.retried_attempts}")),
        Req("console /jobs/{id} (queued, why pending)", "console", f"/jobs/{p.queued_job}", _html(p.queued_job)),
        Req("console /alerts", "console", "/alerts", _html("alerts, newest first", "<td>")),
    ]
    graphql = [
        Req("graphql hosts first:50", "graphql", HOSTS_Q, _conn("hosts", n_hosts), {"first": PER_PAGE}),
        Req("graphql hosts health SUSPECT", "graphql", HOSTS_Q,
            _conn("hosts", None, None, lambda n: n["health"] == "SUSPECT"),
            {"first": PER_PAGE, "filter": {"health": ["SUSPECT"]}}),
        Req("graphql hosts zone + gpuModel", "graphql", HOSTS_Q, _conn("hosts", a100_in_zone, min(PER_PAGE, a100_in_zone)),
            {"first": PER_PAGE, "filter": {"zone": zone, "gpuModel": "A100"}}),
        Req("graphql hosts rack", "graphql", HOSTS_Q, _conn("hosts", in_rack, min(PER_PAGE, in_rack)),
            {"first": PER_PAGE, "filter": {"rack": rack}}),
        Req("graphql hosts search", "graphql", HOSTS_Q, _conn("hosts", matching, min(PER_PAGE, matching)),
            {"first": PER_PAGE, "filter": {"search": prefix}}),
        Req("graphql hosts cordoned", "graphql", HOSTS_Q, _conn("hosts", cordoned, min(PER_PAGE, cordoned)),
            {"first": PER_PAGE, "filter": {"cordoned": True}}),
        Req("graphql hosts sort GPUS_FREE_DESC", "graphql", HOSTS_Q, _conn("hosts", n_hosts, first_rows),
            {"first": PER_PAGE, "sort": "GPUS_FREE_DESC"}),
        Req("graphql hosts sort HEALTH", "graphql", HOSTS_Q, _conn("hosts", n_hosts, first_rows),
            {"first": PER_PAGE, "sort": "HEALTH"}),
        Req(f"graphql hosts after cursor at {n_hosts // 2:,}", "graphql", HOSTS_Q,
            _conn("hosts", n_hosts, PER_PAGE if n_hosts >= 2 * PER_PAGE else None),
            {"first": PER_PAGE, "after": p.host_cursor}),
        Req("graphql jobs first:50", "graphql", JOBS_Q, _conn("jobs", p.jobs_total), {"first": PER_PAGE}),
        Req("graphql jobs state FAILED", "graphql", JOBS_Q,
            _conn("jobs", h.by_state["FAILED"], each=lambda n: n["state"] == "FAILED"),
            {"first": PER_PAGE, "filter": {"state": ["FAILED"]}}),
        Req("graphql jobs state RUNNING", "graphql", JOBS_Q, _conn("jobs", None, None, lambda n: n["state"] == "RUNNING"),
            {"first": PER_PAGE, "filter": {"state": ["RUNNING"]}}),
        Req("graphql jobs user", "graphql", JOBS_Q, _conn("jobs", h.by_user[user], min(PER_PAGE, h.by_user[user]),
                                                         lambda n: n["user"] == user),
            {"first": PER_PAGE, "filter": {"user": user}}),
        Req("graphql jobs submitted in one day", "graphql", JOBS_Q, _conn("jobs", h.in_window, min(PER_PAGE, h.in_window)),
            {"first": PER_PAGE, "filter": {"submittedAfter": w0, "submittedBefore": w1}}),
        Req("graphql jobs namePrefix", "graphql", JOBS_Q,
            _conn("jobs", None, None, lambda n: n["name"].startswith("train-llama-70b")),
            {"first": PER_PAGE, "filter": {"namePrefix": "train-llama-70b"}}),
        Req("graphql jobs sort PRIORITY_DESC", "graphql", JOBS_Q, _conn("jobs", p.jobs_total),
            {"first": PER_PAGE, "sort": "PRIORITY_DESC"}),
        Req(f"graphql jobs after cursor at {p.jobs_total // 2:,}", "graphql", JOBS_Q, _conn("jobs", p.jobs_total),
            {"first": PER_PAGE, "after": p.job_cursor}),
        Req("graphql cluster aggregates", "graphql", CLUSTER_Q, _gql(lambda d: None if (
            d["cluster"]["hosts"]["total"] == n_hosts and d["cluster"]["gpusByModel"] and d["cluster"]["gpusByRack"])
            else f"cluster: {str(d)[:200]}")),
        Req("graphql job with attempts", "graphql", JOB_Q, _gql(lambda d: None if len(
            d["job"]["attempts"]) == h.retried_attempts else f"{len(d['job']['attempts'])} attempts"),
            {"id": h.retried_job}),
        Req("graphql job pendingReasons, queuePosition", "graphql", WHY_Q, _gql(lambda d: None if (
            d["job"]["state"] == "QUEUED" and d["job"]["pendingReasons"]) else f"job: {d['job']}"),
            {"id": p.queued_job}),
    ]
    return console + graphql


def measure(reqs: list[Req], console: httpx.Client, api: httpx.Client, server: psutil.Process | None,
            warmup: int, reps: int, progress: Callable[[str], None]) -> None:
    """Round-robin over the requests; the first `warmup` rounds are not counted."""
    for rnd in range(warmup + reps):
        for q in reqs:
            c0 = _cpu(server)
            t0 = time.perf_counter()
            if q.kind == "console":
                r = console.get(q.target)
            else:
                r = api.post("/graphql", json={"query": q.target, "variables": q.variables or {}})
            dt = time.perf_counter() - t0
            c1 = _cpu(server)
            err = q.check(r)
            if rnd >= warmup:
                q.times.append(dt)
                q.server_cpu.append(c1 - c0)
                q.ok += err is None
            if err is not None:
                q.failures += 1
                q.first_failure = q.first_failure or err
        if rnd + 1 == warmup or (rnd + 1 - warmup) % 5 == 0:
            progress(f"measure: round {rnd + 1} of {warmup + reps}")


def _cpu(p: psutil.Process | None) -> float:
    if p is None:
        return 0.0
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


# ---------------------------------------------------------------- report


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    out = ["| request | p50 | p95 | p99 | max | server CPU / request |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        out.append(f"| {name} | {r['p50']} | {r['p95']} | {r['p99']} | {r['max']} | {r['server_cpu_ms_mean']} |")
    return "\n".join(out)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


# ---------------------------------------------------------------- the run


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.operator", description=__doc__.split("\n\n")[0])
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
    a.nats_cluster = a.replicas = 1  # bench.run's process helpers read these: one NATS node, R1,
    a.nats_sync = "default"  # and nats-server's default fsync
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="muster-operator-"))
    if work.exists() and any(work.iterdir()):
        print(f"bench.operator: --work-dir {work} is not empty (a fresh database and NATS store go there)",
              file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    procs = Processes(a, work)
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


def run(a: argparse.Namespace, argv: list[str], procs: Processes) -> dict[str, Any]:
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
    procs.spawn("sim", [sys.executable, "-m", "bench.operator", "simulate", "--nats", procs.nats_url,
                        "--fleet", str(work / "fleet.json"), "--out", str(work / "sim.json"), "--wildcard",
                        "--heartbeat-interval", str(a.heartbeat_interval)])
    once = [(h, f"{int(max(3600, 20 * a.heartbeat_interval))}s") for h in fleet.suspect] + [(h, "2s") for h in fleet.lost]
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
            if (sum(seen.values()) == a.hosts and seen["LOST"] >= want["LOST"] and seen["SUSPECT"] >= want["SUSPECT"]
                    and seen["HEALTHY"] >= 0.99 * want["HEALTHY"]):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"hosts not in place after {a.startup_timeout + 3 * a.heartbeat_interval:.0f} s: "
                                 f"server sees {seen}, wanted {want}")
            say(f"waiting for hosts: server sees {seen}, wants {want}")
            time.sleep(3)
        for c in psutil.Process(server.proc.pid).children():
            # The server names its helper processes (wire.logs.name_this_process).
            role = {"muster-history": "historian", "muster-ingest": "heartbeat ingest"}.get(c.name())
            if role:
                procs.children.append(Child(role, None, c))
        say("hosts in place; cordoning and draining")
        cordon = """mutation($input: HostActionInput!) { cordonHost(input: $input) { userErrors { message } } }"""
        drain = """mutation($input: DrainHostInput!) { drainHost(input: $input) { userErrors { message } } }"""
        for hid in fleet.cordoned:
            _ok(api.post("/graphql", json={"query": cordon, "variables": {"input": {"id": hid, "reason": "bench: RMA"}}}))
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
                raise BenchError(f"live jobs not in place: totalCount {d['jobs']['totalCount']} (want {want_total}), "
                                 f"{js} (want {live})")
            time.sleep(1)
        startup_s = time.monotonic() - t_start
        say(f"{want_total:,} jobs in history; live jobs {js}; cursors for the deep pages")
        hosts_at_start = _ok(api.post("/graphql", json={"query": "{ cluster { hosts { total healthy suspect lost } } }"}))
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

    rows: dict[str, dict[str, Any]] = {}
    for q in reqs:
        s = summary_ms(q.times)
        rows[q.name] = {"kind": q.kind, "request": q.label(), **s, "ok": q.ok, "failures": q.failures, "first_failure": q.first_failure,
                        "server_cpu_ms_mean": round(1000 * sum(q.server_cpu) / len(q.server_cpu), 1)
                        if q.server_cpu else None}
    table = markdown(rows)
    failures = sum(q.failures for q in reqs)
    rep: dict[str, Any] = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
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
            "live_jobs": live, "jobs_total_count": want_total, "users": len(filled.by_user),
        },
        "fill": {"seconds": round(filled.seconds, 1), "database_mib": round(filled.db_bytes / 2**20, 1)},
        "startup_s": round(startup_s, 1),
        "measure_window_s": round(window, 1),
        "requests": rows,
        "processes": {c.name: {"cpu_s": round(c.cpu, 2), "peak_rss_mb": round(c.peak_rss / 2**20, 1),
                               "cpu_s_in_window": round(c.cpu_at_end - c.cpu_at_start, 2)
                               if c.cpu_at_start is not None and c.cpu_at_end is not None else None}
                      for c in procs.children},
        "notes": [
            "latency = wall time of one request from the bench process, to the last byte of the body; requests "
            "sequential, round-robin over the kinds; p-values are nearest-rank over the timed requests",
            "server CPU / request = the server process's CPU time during the request (ms), heartbeat ingestion "
            "included; the historian is a process of its own",
            "the console pages' host lists come from a shared snapshot rebuilt in the background (web.console.Fleet)",
            "the console's /jobs has a state filter and offset paging only (no user filter); GraphQL `jobs` "
            "pages with keyset cursors",
        ],
        "markdown": table,
    }
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
    return body["data"]  # type: ignore[no-any-return]


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
