"""`python -m bench backlog`: how long the leader's decision takes with a full cluster
and a long queue.

The leader's own decision code (`plan_cycle`) over a ClusterState in simulated time, no
NATS and no processes, as in the fairness run (bench/fairness.py, whose simulated fleet
and agent it uses): `--hosts` hosts of 8 GPUs, `--queues` queues in one cohort with
nominal quotas sharing the fleet out by weight, and jobs (synthetic 1-8 GPUs) submitted
until their GPUs are `--demand` times the fleet's. Big cycles fill the cluster; then
`--cycles` cycles of the default size are timed, each with what the simulated agents
report. Nothing ends during the measurement, so every queued job stays queued: the
cycle looks at the whole backlog every time, the worst case for its cost.

Reports plan_cycle's time per cycle (p50, p99, max), the queued and running jobs, and
how long the fill took. `--no-shortcuts` turns off the planner's shortcuts over long
queues (QueuePolicy.shortcuts in server.scheduling.planner), for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time
from typing import Any

from bench.fairness import Simulation
from bench.fairness import build_parser as fairness_parser
from bench.inprocess import run_and_report
from server.scheduling.planner import QueuePolicy, plan_cycle
from wire.messages import JobState


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench backlog", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=50_000, help="simulated hosts of 8 GPUs")
    ap.add_argument("--queues", type=int, default=8, help="queues in one cohort (weights 1, 2, 3, 1, ...)")
    ap.add_argument("--demand", type=float, default=1.15, help="GPUs submitted, as a multiple of the fleet's")
    ap.add_argument("--cycles", type=int, default=20, help="cycles timed once the cluster is full")
    ap.add_argument("--no-shortcuts", action="store_true", help="turn off the planner's shortcuts over long queues")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="the report (default: bench/results/backlog-<hosts>.json)")
    return ap


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sim_args = fairness_parser().parse_args(["--tenants", str(args.queues), "--hosts", str(args.hosts),
                                             "--gap", "0", "--seed", str(args.seed)])
    sim = Simulation(sim_args)
    started = time.perf_counter()
    sim.setup(0.0)
    names = [t.name for t in sim.tenants]
    n = demand = 0
    while demand < args.demand * sim.total:
        req = sim.shapes.next()
        if req.gpus == 0 or req.gpus > 8:
            continue
        req.duration_s = 1e9  # nothing ends while measured
        sim.submit(0.0, names[n % len(names)], req, n)
        n += 1
        demand += req.gpus
    policy = QueuePolicy(half_life_s=300)
    now = 0.0
    fill_cycles = 0
    while True:  # fill the cluster with big cycles
        plan = plan_cycle(sim.state, reports=sim.agent(now), commands=[], now=now, term=1, queues=policy,
                          max_keys=20_000)
        sim.apply(plan)
        now += sim_args.cycle
        fill_cycles += 1
        if plan.placed == 0 and fill_cycles > 2:
            break
    filled_s = time.perf_counter() - started
    sim.apply(plan_cycle(sim.state, reports=sim.agent(now), commands=[], now=now, term=1, queues=policy))
    now += sim_args.cycle
    gc.collect()
    gc.freeze()  # as the server does (server.memory): the state is long-lived
    measured = dataclasses.replace(policy, shortcuts=not args.no_shortcuts)
    ms: list[float] = []
    for _ in range(args.cycles):
        reports = sim.agent(now)
        t = time.perf_counter()
        plan = plan_cycle(sim.state, reports=reports, commands=[], now=now, term=1, queues=measured)
        ms.append((time.perf_counter() - t) * 1000)
        sim.apply(plan)
        now += sim_args.cycle
    queued = sum(1 for j in sim.state.jobs.values() if j.state is JobState.QUEUED)
    running = sum(1 for j in sim.state.jobs.values() if j.state is JobState.RUNNING)
    ms.sort()
    return {
        "scenario": "backlog",
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "gpus": sim.total,
        "jobs_submitted": n,
        "gpus_demanded": demand,
        "jobs_queued": queued,
        "jobs_running": running,
        "fill": {"cycles": fill_cycles, "seconds": round(filled_s, 1)},
        "plan_cycle_ms": {"p50": round(statistics.median(ms), 1), "p99": round(ms[max(0, int(len(ms) * 0.99) - 1)], 1),
                          "max": round(ms[-1], 1), "cycles": len(ms)},
        "correctness": {"ok": not sim.violations, "violations": sim.violations[:10]},
    }


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return run_and_report("backlog", argv, lambda: measure(args), args.json, f"backlog-{args.hosts // 1000}k.json")
