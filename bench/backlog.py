"""`python -m bench backlog`: how long the leader's decision takes with a full cluster
and a long queue.

The leader's own decision code (`plan_cycle`) over a ClusterState in simulated time, no
NATS and no processes, as in the fairness run (bench/fairness.py, whose simulated fleet
and agent it uses): `--hosts` hosts of 8 GPUs, `--queues` queues in one cohort with
nominal quotas sharing the fleet out by weight, and jobs (synthetic 1-8 GPUs) submitted
until their GPUs are `--demand` times the fleet's, submitted a minute before the first
cycle (so that a job that finds no room holds a reservation, as in a backlog that has
waited: scheduling.backfill). Big cycles fill the cluster; then
`--cycles` cycles of the default size are timed, each with what the simulated agents
report. Nothing ends during the measurement, so every queued job stays queued: the
cycle looks at the whole backlog every time, the worst case for its cost.

Reports plan_cycle's time per cycle (p50, p99, max), the queued and running jobs, and
how long the fill took. `--no-shortcuts` turns off the planner's shortcuts over long
queues (QueuePolicy.shortcuts in server.scheduling.planner), for comparison;
`--time-limits` gives every job a time limit, so that a reservation for a job that waits
works out its start from the deadlines of the tasks on its hosts.
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
from server.scheduling.backfill import ends_by_host, soonest_hosts
from server.scheduling.capacity import Placer
from server.scheduling.cycle.reserving import RESERVE_SOONEST
from server.scheduling.planner import QueuePolicy, plan_cycle
from wire.messages import JobSpec, JobState


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench backlog", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=50_000, help="simulated hosts of 8 GPUs")
    ap.add_argument("--queues", type=int, default=8, help="queues in one cohort (weights 1, 2, 3, 1, ...)")
    ap.add_argument("--demand", type=float, default=1.15, help="GPUs submitted, as a multiple of the fleet's")
    ap.add_argument("--cycles", type=int, default=20, help="cycles timed once the cluster is full")
    ap.add_argument("--no-shortcuts", action="store_true", help="turn off the planner's shortcuts over long queues")
    ap.add_argument("--time-limits", action="store_true",
                    help="give every job a time limit (1-24 h, longer than the run): reservations for the jobs that "
                         "wait then have a known start, the costlier case (scheduling.backfill)")
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
        limit = 3600.0 * (1 + n % 24) if args.time_limits else 0.0
        sim.submit(-60.0, names[n % len(names)], req, n, time_limit_s=limit)
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
    reserved: list[int] = []
    for _ in range(args.cycles):
        reports = sim.agent(now)
        t = time.perf_counter()
        plan = plan_cycle(sim.state, reports=reports, commands=[], now=now, term=1, queues=measured)
        ms.append((time.perf_counter() - t) * 1000)
        if plan.reservations:
            reserved.append(sum(len(r.hosts) for r in plan.reservations))
        sim.apply(plan)
        now += sim_args.cycle
    reservation = _reservation_cost(sim, now)
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
        # Measured cycles that held hosts for a waiting job (and how many hosts, at most).
        "reservations": {"cycles": len(reserved), "hosts_max": max(reserved, default=0)},
        # One reservation worked out for an 8-GPU job on the full cluster, alone.
        "reservation_8gpu": reservation,
        "plan_cycle_ms": {"p50": round(statistics.median(ms), 1), "p99": round(ms[max(0, int(len(ms) * 0.99) - 1)], 1),
                          "max": round(ms[-1], 1), "cycles": len(ms)},
        "correctness": {"ok": not sim.violations, "violations": sim.violations[:10]},
    }


def _reservation_cost(sim: Simulation, now: float, times: int = 20) -> dict[str, Any]:
    """Time `Placer.reservation_for` for an 8-GPU job on the full cluster (the hosts with
    the most free room and those of the first deadlines compared), as a cycle would."""
    state = sim.state
    ends = ends_by_host(state.allocs.get, state.jobs.get, state.deadlines, now)

    spec = JobSpec(name="big", command=["x"], gpus=8, cpus=1, memory_mb=1)
    ms: list[float] = []
    got = None
    for _ in range(times):
        t = time.perf_counter()
        placer = Placer(state.index, lambda _h: True)
        soonest = soonest_hosts(state.deadlines, state.jobs.get, RESERVE_SOONEST)
        got = placer.reservation_for("big", spec, now, ends, soonest)
        ms.append((time.perf_counter() - t) * 1000)
    ms.sort()
    assert got is not None
    return {"ms_p50": round(statistics.median(ms), 2), "ms_max": round(ms[-1], 2), "hosts": len(got.hosts),
            "start_in_s": None if not got.known() else round(got.start - now, 1)}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return run_and_report("backlog", argv, lambda: measure(args), args.json, f"backlog-{args.hosts // 1000}k.json")
