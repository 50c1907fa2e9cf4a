"""`muster bench --tenants N`: the fairness scenario. N queues with different weights and
nominal quotas (one cohort, reclaim on) arrive in waves on a simulated fleet; each wave
submits jobs at `--rate` per second for `--wave` seconds, job shapes from the traces
(`--trace`) or the synthetic mix.

It drives the leader's own decision code (server.scheduling.planner.plan_cycle: fair
share, quotas, preemption, time limits) over a ClusterState in simulated time, with a
simulated agent: a placed task starts at once and ends after its duration; a task told
to stop checkpoints for `--ckpt` seconds (at most its grace) and ends KILLED. A share of
the jobs (`--checkpointing`, 0 by default) keep what they saved: their next try runs only
the rest of their duration; the others start again from nothing. Those that keep it say
so (`JobSpec.checkpoints`: preemption counts them as losing the grace at most), unless
`--checkpoints-unsaid`. No NATS,
no processes: the figures are the policy's, and the planning time is real CPU time of
plan_cycle on this machine. Dispatch latency through NATS is what `muster bench`
without --tenants measures.

Reported:
- time from a queue becoming active until it holds 90 % of its entitlement (its weight's
  part of the GPUs among the backlogged queues), and until it holds 90 % of its nominal
  quota (what reclaim restores; the rest of a weighted share comes from other queues' jobs
  ending, or from fair-share preemption, off by default), per wave;
- Jain's fairness index of allocation / entitlement, sampled every cycle while every
  queue is backlogged;
- GPU-seconds lost to preemption as a share of GPU-seconds delivered: the whole runtime of
  a preempted try of a job that keeps no checkpoint, the stop-to-exit time of one that
  does; and, per queue's arrival, a lower bound on what any choice of victims must lose
  when no job keeps a checkpoint (`lower_bound` in the report);
- the share of GPUs idle while a waiting job would fit on their host, outside and inside
  preemption graces, and apart from them those held idle on hosts reserved for a job that
  waits (scheduling.backfill: kept from jobs that may not run past the reserved start);
- plan_cycle's time per cycle (p50, p99, mean) and queueing delay (submission to placement,
  simulated seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workload import ROOT, TRACES, JobReq, Synthetic, Trace
from server.scheduling.fairshare import jain as jain_index
from server.scheduling.fragmentation import Shape
from server.scheduling.placement import check
from server.scheduling.planner import QueuePolicy, plan_cycle
from server.scheduling.queues import queue_usage
from server.state.cluster import ClusterState
from wire.messages import (
    AttemptState,
    GpuInfo,
    Heartbeat,
    Job,
    JobSpec,
    JobState,
    Queue,
    Reserved,
    ResourceQuota,
    StatusReport,
    encode,
)

GPUS_PER_HOST = 8
MODEL = "H100"


@dataclass
class Tenant:
    name: str
    weight: float
    start_s: float
    nominal: float


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="muster bench --tenants", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", type=int, required=True, help="queues (weights 1, 2, 3, 1, 2, 3, ...)")
    ap.add_argument("--hosts", type=int, default=200, help=f"simulated hosts of {GPUS_PER_HOST} GPUs")
    ap.add_argument("--rate", type=float, default=500.0, help="job arrivals per second during a wave")
    ap.add_argument("--wave", type=float, default=10.0, help="seconds each queue's wave of submissions lasts")
    ap.add_argument("--gap", type=float, default=60.0, help="seconds between the waves' starts")
    ap.add_argument("--tail", type=float, default=120.0, help="seconds simulated after the last wave began")
    ap.add_argument("--cycle", type=float, default=0.25, help="simulated seconds between scheduling cycles")
    ap.add_argument("--grace", type=float, default=10.0, help="the queues' preemption grace")
    ap.add_argument("--ckpt", type=float, default=2.0, help="seconds a stopped task takes to exit")
    ap.add_argument("--checkpointing", type=float, default=0.0,
                    help="share of jobs whose next try resumes from what they saved when stopped (0-1); they "
                         "say so (JobSpec.checkpoints), and preemption counts them as losing the grace at most")
    ap.add_argument("--checkpoints-unsaid", action="store_true",
                    help="the jobs of --checkpointing keep what they saved but do not say so (preemption ranks "
                         "them as any other)")
    ap.add_argument("--min-runtime", type=float, default=0.0, help="the queues' minimum runtime before preemption")
    ap.add_argument("--mean-duration", type=float, default=120.0, help="synthetic: mean task seconds")
    ap.add_argument("--trace", action="store_true", help="job shapes from ../shared/traces (openb + Philly gangs)")
    ap.add_argument("--half-life", type=float, default=300.0, help="fair-share half-life (s)")
    ap.add_argument("--fair-share-preemption", action="store_true",
                    help="turn on the queues' fair-share preemption (off by default, as in a queue's defaults)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="the report (default: bench/results/fairness-<tenants>q.json)")
    return ap


class Simulation:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.state = ClusterState(heartbeat_interval_s=1e9)  # simulated hosts never fall silent
        self.rev = 0
        self.total = float(args.hosts * GPUS_PER_HOST)
        weights = [1.0 + (i % 3) for i in range(args.tenants)]
        self.tenants = [Tenant(f"t{i}", w, i * args.gap, 0.0) for i, w in enumerate(weights)]
        # Nominal quotas share the whole fleet out by weight: each its floor, and the GPUs
        # the floors leave over one each to the largest remainders (earlier queues first
        # on a tie), so that no GPU is left that no queue owns (the cohort lends only
        # what its queues own).
        exact = [self.total * t.weight / sum(weights) for t in self.tenants]
        for t, x in zip(self.tenants, exact, strict=True):
            t.nominal = math.floor(x)
        left = int(self.total) - sum(int(t.nominal) for t in self.tenants)
        for i in sorted(range(len(exact)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))[:left]:
            self.tenants[i].nominal += 1
        self.shapes = Trace(seed=args.seed) if args.trace else Synthetic(seed=args.seed,
                                                                         mean_duration_s=args.mean_duration)
        self.durations: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.placed_at: dict[str, float] = {}
        self.violations: list[str] = []
        self.ends: dict[str, int] = {}
        # Which jobs keep a checkpoint: a draw of their own per job, so that the arrivals
        # are the same whatever --checkpointing says.
        self.keep_rng = random.Random(args.seed + 1_000_003)
        self.keeps: set[str] = set()
        self.credited: set[tuple[str, int]] = set()  # (job, try) whose saved work counts

    def _next_rev(self) -> int:
        self.rev += 1
        return self.rev

    def setup(self, now: float) -> None:
        for i in range(self.args.hosts):
            hb = Heartbeat(host_id=f"sim-{i:05d}", boot_id="b", ts=now, cpus=256, memory_mb=4 * 1024 * 1024,
                           labels={"rack": f"r{i // 32}"},
                           gpus=[GpuInfo(index=g, model=MODEL, memory_mb=81920) for g in range(GPUS_PER_HOST)])
            self.state.apply_heartbeat(hb.host_id, self._next_rev(), encode(hb), None, now)
        for t in self.tenants:
            q = Queue(name=t.name, weight=t.weight, cohort="all", min_runtime_s=self.args.min_runtime,
                      preempt_grace_s=self.args.grace, max_preemptions=64,
                      fair_share_preemption=self.args.fair_share_preemption,
                      quota={f"gpu:{MODEL}": ResourceQuota(nominal=t.nominal)})
            from wire.records import Record

            self.state.apply_state_record(Record(f"queue.{t.name}", self._next_rev(), encode(q)))

    def arrivals(self) -> list[tuple[float, str, JobReq]]:
        out = []
        for t in self.tenants:
            at = t.start_s
            while True:
                at += self.rng.expovariate(self.args.rate)
                if at >= t.start_s + self.args.wave:
                    break
                req = self.shapes.next()
                if req.gpus == 0 or req.gpus > GPUS_PER_HOST:
                    continue
                out.append((at, t.name, req))
        return sorted(out, key=lambda x: x[0])

    def submit(self, at: float, queue: str, req: JobReq, n: int, time_limit_s: float = 0.0) -> None:
        keeps = self.keep_rng.random() < self.args.checkpointing
        spec = JobSpec(name=req.name, command=["sleep", f"{req.duration_s:.3f}"], gpus=req.gpus,
                       cpus=min(req.cpus, 32.0), memory_mb=min(req.memory_mb, 256 * 1024), queue=queue,
                       replicas=req.replicas, max_attempts=3, time_limit_s=time_limit_s,
                       checkpoints=keeps and not self.args.checkpoints_unsaid)
        job = Job(id=f"j{n:08d}x", spec=spec, submitted_at=at, updated_at=at)
        self.durations[job.id] = max(1.0, req.duration_s)
        if keeps:
            self.keeps.add(job.id)
        self.state.apply_job(job, self._next_rev())

    def agent(self, now: float) -> list[StatusReport]:
        """What the simulated agents report by `now`."""
        out: list[StatusReport] = []
        ckpt = min(self.args.ckpt, self.args.grace)
        for host_id, alloc in self.state.allocs.items():
            held: set[int] = set()
            for t in alloc.tasks:
                if held & set(t.gpu_indices):
                    self.violations.append(f"overcommit on {host_id} at {now:.2f}")
                held |= set(t.gpu_indices)
                job = self.state.jobs.get(t.job_id)
                a = next((x for x in job.current_tasks() if x.id == t.attempt_id), None) if job else None
                if a is None or a.state.terminal:
                    continue
                if a.state is AttemptState.PLACED:
                    out.append(StatusReport(host_id=host_id, attempt_id=a.id, job_id=t.job_id,
                                            state=AttemptState.RUNNING, ts=now))
                    self.started[a.id] = now
                elif t.stop and a.stop_at is not None and now >= a.stop_at + ckpt:
                    out.append(StatusReport(host_id=host_id, attempt_id=a.id, job_id=t.job_id,
                                            state=AttemptState.KILLED, ts=now, reason="stopped"))
                    if t.job_id in self.keeps and a.started_at is not None \
                            and (t.job_id, a.number) not in self.credited:
                        # It saved its work up to the stop: the next try runs the rest.
                        self.credited.add((t.job_id, a.number))
                        done = max(0.0, a.stop_at - a.started_at)
                        self.durations[t.job_id] = max(1.0, self.durations[t.job_id] - done)
                elif a.started_at is not None and now >= a.started_at + self.durations[t.job_id]:
                    out.append(StatusReport(host_id=host_id, attempt_id=a.id, job_id=t.job_id,
                                            state=AttemptState.SUCCEEDED, exit_code=0, ts=now))
        return out

    def loss_lower_bound(self, queue: str, nominal: float, now: float) -> dict[str, float]:
        """At `queue`'s arrival, the least GPU-seconds any choice of victims must lose for
        it to hold 90 % of its nominal quota one grace later, when no job keeps a
        checkpoint. Relaxed, so a lower bound: GPUs free now and every running task that
        ends by itself within the grace count as the queue's; any lender (a queue of the
        cohort above its nominal quota) gives up to its excess, its youngest GPUs first,
        one GPU at a time, wherever it is; each GPU taken loses its runtime so far."""
        grace = self.args.grace
        free = sum(len(cap.free_gpus(None)) for cap in self.state.index.caps.values())
        ending = 0
        held: dict[str, int] = {}
        ages: dict[str, list[float]] = {}
        for alloc in self.state.allocs.values():
            for t in alloc.tasks:
                job = self.state.jobs.get(t.job_id)
                if job is None or t.stop:
                    continue
                a = next((x for x in job.current_tasks() if x.id == t.attempt_id), None)
                if a is None or a.state.terminal:
                    continue
                n = len(t.gpu_indices)
                q = job.spec.queue
                held[q] = held.get(q, 0) + n
                started = a.started_at if a.started_at is not None else now
                if started + self.durations[t.job_id] <= now + grace:
                    ending += n
                    continue
                ages.setdefault(q, []).extend([now - started] * n)
        need = max(0, math.ceil(0.9 * nominal) - free - ending)
        nominals = {t.name: t.nominal for t in self.tenants}
        pool: list[float] = []
        for q, xs in ages.items():
            if q != queue:
                pool.extend(sorted(xs)[:max(0, held.get(q, 0) - int(nominals.get(q, 0)))])
        pool.sort()
        return {"gpus_to_take": need, "gpus_takeable": len(pool), "gpu_s": round(sum(pool[:need]), 1)}

    def apply(self, plan: Any) -> None:
        for job in plan.jobs.values():
            self.state.apply_job(job, self._next_rev())
        for alloc in plan.allocs.values():
            self.state.apply_alloc(alloc, self._next_rev())
        for u in plan.usage.values():
            self.state.apply_queue_usage(u, self._next_rev())

    def check_quotas(self, now: float) -> None:
        """No queue holds more than nominal + borrowing (unlimited here: the cohort's
        pool, i.e. the fleet) counting only tasks not told to stop."""
        held: dict[str, int] = {}
        for alloc in self.state.allocs.values():
            for t in alloc.tasks:
                if not t.stop:
                    q = self.state.jobs[t.job_id].spec.queue
                    held[q] = held.get(q, 0) + len(t.gpu_indices)
        if sum(held.values()) > self.total:
            self.violations.append(f"cohort over its pool at {now:.2f}: {held}")


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    rep = simulate(args)
    path = Path(args.json) if args.json else Path(__file__).resolve().parent / "results" / \
        f"fairness-{args.tenants}q.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rep, indent=2) + "\n")
    print(json.dumps({k: v for k, v in rep.items() if k not in ("args", "series")}, indent=1))
    print(f"report: {path}")
    return 0 if rep["correctness"]["ok"] else 1


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    sim = Simulation(args)
    t0 = 0.0
    sim.setup(t0)
    arrivals = sim.arrivals()
    end = sim.tenants[-1].start_s + args.tail
    policy = QueuePolicy(half_life_s=args.half_life)
    plan_s: list[float] = []
    samples: list[dict[str, Any]] = []
    reached: dict[str, float | None] = {t.name: None for t in sim.tenants}
    nominal_at: dict[str, float | None] = {t.name: None for t in sim.tenants}
    jain: list[float] = []
    idle_outside: list[float] = []
    idle_grace: list[float] = []
    reserved_idle: list[float] = []
    i = 0
    now = t0
    n = 0
    bounds: dict[str, dict[str, float]] = {}
    while now <= end:
        while i < len(arrivals) and arrivals[i][0] <= now:
            at, q, req = arrivals[i]
            sim.submit(at, q, req, n)
            n += 1
            i += 1
        for t in sim.tenants:
            if t.start_s > t0 and t.name not in bounds and now >= t.start_s:
                bounds[t.name] = sim.loss_lower_bound(t.name, t.nominal, now)
        reports = sim.agent(now)
        started = time.perf_counter()
        plan = plan_cycle(sim.state, reports=reports, commands=[], now=now, term=1, queues=policy)
        plan_s.append(time.perf_counter() - started)
        for ev in plan.events:
            if ev.kind == "job.placed" and ev.job_id:
                sim.placed_at.setdefault(ev.job_id, now)
            if ev.kind in ("job.succeeded", "job.failed", "job.cancelled", "job.timeout") and ev.job_id:
                sim.ends[ev.job_id] = sim.ends.get(ev.job_id, 0) + 1
        sim.apply(plan)
        sim.check_quotas(now)
        # Figures of this moment.
        usage = queue_usage(sim.state.jobs.values())
        alloc = {t.name: usage.get(t.name, {}).get(f"gpu:{MODEL}", 0.0) for t in sim.tenants}
        backlogged = [t for t in sim.tenants if sim.state.backlog.count(t.name) > 0]
        wsum = sum(t.weight for t in backlogged) or 1.0
        entitled = {t.name: sim.total * t.weight / wsum for t in backlogged}
        for t in backlogged:
            if reached[t.name] is None and now >= t.start_s and alloc[t.name] >= 0.9 * entitled[t.name]:
                reached[t.name] = now - t.start_s
            if nominal_at[t.name] is None and now >= t.start_s and alloc[t.name] >= 0.9 * t.nominal:
                nominal_at[t.name] = now - t.start_s
        active = [t for t in sim.tenants if now >= t.start_s]
        if len(active) == len(sim.tenants) and len(backlogged) == len(sim.tenants):
            x = [alloc[t.name] / entitled[t.name] for t in sim.tenants]
            jain.append(jain_index(x) if any(x) else 0.0)
        waiting = [j for j in sim.state.queued() if j.not_before <= now]
        if waiting:
            kept = {h for j in sim.state.reserved for h in (sim.state.jobs[j].reserved or _NONE).hosts}
            idle, held = idle_gpus(sim.state, waiting, kept)
            stopping = any(t.stop for a in sim.state.allocs.values() for t in a.tasks)
            (idle_grace if stopping else idle_outside).append(idle / sim.total)
            reserved_idle.append(held / sim.total)
        if int(now / args.cycle) % int(max(1, 1.0 / args.cycle)) == 0:
            samples.append({"t": round(now, 2), "alloc": alloc, "queued": sim.state.backlog.counts()})
            if int(now) % 30 == 0:
                print(f"t={now:.0f}/{end:.0f} s: GPUs held {alloc}, queued {sim.state.backlog.counts()}",
                      file=sys.stderr, flush=True)
        now = round(now + args.cycle, 6)
    delivered = lost = 0.0
    preempted = 0
    by: dict[str, dict[str, float]] = {}  # "<kind> by <queue> from <victims' queue>"
    # Whether the stop came within the goal window after its preempting queue's arrival
    # (one grace plus one cycle: the reclaim the goal asks for) or later (churn).
    arrived = {t.name: t.start_s for t in sim.tenants}
    window = args.grace + args.cycle
    by_window: dict[str, dict[str, float]] = {k: {"tries": 0, "gpu_s_lost": 0.0} for k in ("arrival", "later")}
    # Whether the stopped job kept a checkpoint.
    by_keeping: dict[str, dict[str, float]] = {k: {"tries": 0, "gpu_s_lost": 0.0} for k in ("kept", "none")}
    delays = []
    for job in sim.state.jobs.values():
        for a in job.attempts:
            if a.started_at is None:
                continue
            ran = ((a.finished_at if a.finished_at is not None else now) - a.started_at) * len(a.gpu_indices)
            delivered += ran
            if a.state is AttemptState.PREEMPTED:
                wasted = ran
                if job.id in sim.keeps and a.stop_at is not None:
                    # Saved at the stop: only the time from the stop to its exit is lost.
                    wasted = max(0.0, (a.finished_at or now) - max(a.stop_at, a.started_at)) * len(a.gpu_indices)
                lost += wasted
                preempted += 1
                m = _PREEMPTED_BY.search(a.reason or "")
                key = f"{m.group(1)} by {m.group(2)} from {job.spec.queue}" if m else f"? from {job.spec.queue}"
                b = by.setdefault(key, {"tries": 0, "gpus": 0, "gpu_s_lost": 0.0, "gpu_s_run": 0.0})
                b["tries"] += 1
                b["gpus"] += len(a.gpu_indices)
                b["gpu_s_lost"] += wasted
                b["gpu_s_run"] += ran
                stopped = a.stop_at if a.stop_at is not None else now
                w = by_window["arrival" if m and stopped - arrived.get(m.group(2), -1e9) <= window else "later"]
                w["tries"] += 1
                w["gpu_s_lost"] += wasted
                k = by_keeping["kept" if job.id in sim.keeps else "none"]
                k["tries"] += 1
                k["gpu_s_lost"] += wasted
        if job.id in sim.placed_at:
            delays.append(sim.placed_at[job.id] - job.submitted_at)
    twice = [j for j, k in sim.ends.items() if k > 1]
    ended_wrong = [j.id for j in sim.state.jobs.values() if j.state.terminal and j.id not in sim.ends]
    ok = not sim.violations and not twice and not ended_wrong
    return {
        "scenario": "fairness",
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "hosts": args.hosts,
        "gpus": sim.total,
        "tenants": [{"queue": t.name, "weight": t.weight, "nominal": t.nominal, "active_from_s": t.start_s}
                    for t in sim.tenants],
        "jobs_submitted": n,
        "jobs_finished": sum(1 for j in sim.state.jobs.values() if j.state is JobState.SUCCEEDED),
        "time_to_90pct_entitled_s": {k: (round(v, 2) if v is not None else None) for k, v in reached.items()},
        "time_to_90pct_nominal_s": {k: (round(v, 2) if v is not None else None) for k, v in nominal_at.items()},
        "goal_time_to_90pct_s": args.grace + args.cycle,
        "jain_index_all_backlogged": _dist(jain),
        "preemption": {"preempted_tries": preempted, "gpu_s_lost": round(lost, 1),
                       "gpu_s_delivered": round(delivered, 1),
                       "lost_share": round(lost / delivered, 5) if delivered else 0.0,
                       # Who took from whom, and how long the victims had run (GPU-weighted).
                       "by": {k: {"tries": int(v["tries"]), "gpus": int(v["gpus"]),
                                  "gpu_s_lost": round(v["gpu_s_lost"], 1),
                                  "mean_runtime_s": round(v["gpu_s_run"] / v["gpus"], 1) if v["gpus"] else 0.0}
                              for k, v in sorted(by.items())},
                       # Stopped within one grace plus one cycle of the preempting queue's
                       # arrival, or later.
                       "by_window": {k: {"tries": int(v["tries"]), "gpu_s_lost": round(v["gpu_s_lost"], 1)}
                                     for k, v in by_window.items()},
                       "jobs_keeping_checkpoints": len(sim.keeps),
                       "jobs_saying_they_checkpoint": sum(1 for j in sim.state.jobs.values() if j.spec.checkpoints),
                       "by_checkpoint": {k: {"tries": int(v["tries"]), "gpu_s_lost": round(v["gpu_s_lost"], 1)}
                                         for k, v in by_keeping.items()},
                       # What reclaim within the goal must lose at each later queue's arrival
                       # with no checkpoints (Simulation.loss_lower_bound), and its share.
                       "lower_bound": {"by_queue_arrival": bounds,
                                       "gpu_s": round(sum(b["gpu_s"] for b in bounds.values()), 1),
                                       "share": round(sum(b["gpu_s"] for b in bounds.values()) / delivered, 5)
                                       if delivered else 0.0}},
        "idle_while_waiting_share": {"outside_grace": _dist(idle_outside), "during_grace": _dist(idle_grace),
                                     "held_by_reservations": _dist(reserved_idle)},
        "plan_cycle_ms": {"p50": round(_pct(plan_s, 50) * 1000, 2), "p99": round(_pct(plan_s, 99) * 1000, 2),
                          "mean": round(sum(plan_s) / len(plan_s) * 1000, 2) if plan_s else 0.0,
                          "cycles": len(plan_s)},
        "queueing_delay_s": {"p50": round(_pct(delays, 50), 2), "p99": round(_pct(delays, 99), 2)},
        "correctness": {"ok": ok, "violations": sim.violations[:20], "ended_twice": twice[:20],
                        "terminal_without_end_event": ended_wrong[:20]},
        # Where the traces were read, from the repository's root (not this machine's path).
        "traces": os.path.relpath(TRACES, ROOT) if args.trace else None,
        "series": samples,
    }


_NONE = Reserved()
_PREEMPTED_BY = re.compile(r"preempted \(([^)]+)\) by \S+ of queue (\S+)")


def idle_gpus(state: ClusterState, waiting: list[Job], kept: set[str]) -> tuple[int, int]:
    """Whole GPUs free (idle) on hosts where some waiting job would fit, each task as
    placement checks it (GPUs of its models, its share, CPUs, memory; a gang: on as many
    hosts as it has tasks), whatever its queue's quota; and whole GPUs free on `kept`
    hosts (reserved). A GPU free on a host whose CPUs or memory no waiting job fits in
    is stranded, not idle for want of a decision."""
    free = {c.id: (c, n) for c in state.index.caps.values() if (n := len(c.free_gpus(None)))}
    held = sum(n for h, (_c, n) in free.items() if h in kept)
    open_caps = [c for h, (c, _n) in free.items() if h not in kept]
    if not open_caps:
        return 0, held
    specs: dict[tuple[Shape, int, tuple[tuple[str, str], ...]], JobSpec] = {}
    for j in waiting:
        specs.setdefault((Shape.of(j.spec), j.spec.replicas, tuple(sorted(j.spec.host_labels.items()))), j.spec)
    fits = {c.id: [k for k, spec in specs.items() if check(spec, c)[0] is None] for c in open_caps}
    room = Counter(k for keys in fits.values() for k in keys)
    idle = sum(free[c.id][1] for c in open_caps if any(room[k] >= k[1] for k in fits[c.id]))
    return idle, held


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def _dist(xs: list[float]) -> dict[str, float | int]:
    if not xs:
        return {"samples": 0}
    return {"samples": len(xs), "min": round(min(xs), 4), "p5": round(_pct(xs, 5), 4),
            "mean": round(statistics.fmean(xs), 4), "max": round(max(xs), 4)}
