"""The operator benchmark's history: finished jobs as the control plane leaves them
(`HistoryMaker`), their rows as `History._write` writes them (`job_rows`), bulk-inserted
with the host events and alerts the recorder would have written (`fill_history`)."""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.operator.fleet import GPU_FAULTS
from bench.workload import HostSpec
from server.history.database import AttemptRow, EventRow, History, JobRow, attempt_rows, job_events, job_row
from wire.messages import Attempt, AttemptState, Job, JobSpec, JobState

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
            out.append(
                dict(
                    ts=rng.uniform(t0, now),
                    kind="alert.gpu.unhealthy",
                    job_id=None,
                    host_id=h.id,
                    message=f"GPU {rng.randrange(h.gpus)} on {h.id} is unschedulable: {rng.choice(GPU_FAULTS)}",
                )
            )
        return out


def job_rows(job: Job, revision: int) -> tuple[dict[str, object], list[dict[str, object]], list[dict[str, object]]]:
    """The jobs, attempts and events rows of a job: what `History._write` writes for it."""
    return job_row(job, revision), attempt_rows(job), job_events(job)


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
