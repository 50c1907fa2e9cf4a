"""Placement quality on a real cluster trace, in process, no servers: the method of the FGD
paper's Kubernetes Scheduler Simulator (hkust-adsl/kubernetes-scheduler-simulator).

    python -m bench placement --pods ../shared/traces/openb_pod_list_default.csv \\
        --nodes ../shared/traces/openb_node_list_all_node.csv --policy fgd --inflate 1.3 --seeds 10

The trace's tasks arrive one after another in creation order and none leaves; the list
is inflated by sampling tasks from it (seeded) until the GPUs asked for reach `--inflate`
times the cluster's GPU capacity. Each task is placed by Muster's own placement core
(server.scheduling.capacity.Placer over a CapacityIndex, with the named policy) or left
unplaced. Reported, averaged over the seeds: the share of the cluster's GPU capacity
allocated at each level of GPU demand arrived (0-130 %), the tasks left unplaced by
shape, and the share of free GPU capacity fragmented (FGD's measure) at the end.

The fragmentation measure's task mix is the trace's own (its most frequent shapes), as
the simulator's "typical pods"; the live scheduler uses the recent submissions instead.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.plot import plot_placement
from server.scheduling.capacity import POLICIES, CapacityIndex, Placer
from server.scheduling.fragmentation import Fragmentation, Shape, ShapeMix
from server.scheduling.placement import FULL, HostCapacity
from wire.budgets import task_bytes
from wire.messages import JobSpec

LEVELS = [round(x / 100, 2) for x in range(0, 131, 5)]
# The FGD paper's published figures (mean of 10 seeds; the simulator's
# experiments/analysis/expected_results/analysis_allo_discrete.csv), GPU capacity
# allocated at 100 % and 130 % of it arrived, default openb trace.
PAPER = {"FGD": (95.2, 95.4), "BestFit": (92.9, 93.1), "GpuPacking": (91.8, 92.0), "DotProd": (90.6, 90.8),
         "Random": (86.3, 87.5)}


@dataclass(frozen=True)
class Task:
    name: str
    spec: JobSpec

    @property
    def gpu_milli(self) -> int:
        return self.spec.gpus * FULL + self.spec.gpu_share


def read_nodes(path: Path) -> list[HostCapacity]:
    nodes = []
    with path.open() as f:
        for row in csv.DictReader(f):
            n = int(row["gpu"] or 0)
            model = row["model"] or "GPU"
            nodes.append(HostCapacity(
                id=row["sn"], schedulable=True, cordoned=False, gpu_models={i: model for i in range(n)},
                unhealthy_gpus=frozenset(), cpus=int(row["cpu_milli"]) / 1000, memory_mb=int(row["memory_mib"]),
                gpu_memory={i: 0 for i in range(n)}))
    return nodes


def read_pods(path: Path) -> list[Task]:
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            rows.append(row)
    rows.sort(key=lambda r: (int(r["creation_time"] or 0), r["name"]))
    out = []
    for r in rows:
        n, milli = int(r["num_gpu"] or 0), int(r["gpu_milli"] or 0)
        models = sorted(m for m in (r.get("gpu_spec") or "").split("|") if m)
        share = milli if n == 1 and 0 < milli < FULL else 0
        spec = JobSpec(name="t", command=["x"], gpus=0 if share else n, gpu_share=share,
                       cpus=max(0.001, int(r["cpu_milli"]) / 1000), memory_mb=int(r["memory_mib"]),
                       gpu_models=models or None)
        out.append(Task(r["name"], spec))
    return out


def inflate(tasks: list[Task], capacity_milli: int, factor: float, rng: random.Random) -> list[Task]:
    """The trace in order, then tasks sampled from it until the GPUs asked for reach
    `factor` times the capacity."""
    out = list(tasks)
    asked = sum(t.gpu_milli for t in out)
    gpu_tasks = [t for t in tasks if t.gpu_milli]
    while asked < factor * capacity_milli and gpu_tasks:
        t = rng.choice(tasks)
        out.append(t)
        asked += t.gpu_milli
    return out


def shape_name(spec: JobSpec) -> str:
    if spec.gpus:
        return f"{spec.gpus} GPU"
    if spec.gpu_share:
        return "GPU share"
    return "no GPU"


def replay(nodes_path: Path, tasks: list[Task], policy: str, candidates: int, seed: int,
           factor: float) -> dict[str, Any]:
    index = CapacityIndex()
    nodes = read_nodes(nodes_path)
    for n in nodes:
        index.put(n)
    capacity = sum(len(n.gpu_models) for n in nodes) * FULL
    rng = random.Random(seed)
    arrivals = inflate(tasks, capacity, factor, rng)
    mix = ShapeMix.of(Counter(Shape.of(t.spec) for t in arrivals))
    frag = Fragmentation(mix)
    asked = allocated = 0
    curve: list[tuple[float, float]] = []
    unplaced: Counter[str] = Counter()
    arrived: Counter[str] = Counter()
    next_level = 0
    started = time.perf_counter()
    for t in arrivals:
        asked += t.gpu_milli
        arrived[shape_name(t.spec)] += 1
        choice = Placer(index, lambda _h: True, policy=policy, fragmentation=frag, candidates=candidates).place(t.spec)
        if choice is None:
            unplaced[shape_name(t.spec)] += 1
        else:
            cap = index.caps[choice.host_id]
            cap.reserve(choice.gpu_indices, t.spec.cpus, t.spec.memory_mb, task_bytes(t.spec), t.spec.gpu_share,
                        t.spec.gpu_memory_mb, choice.mig)
            index.put(cap)
            allocated += t.gpu_milli
        while next_level < len(LEVELS) and asked >= LEVELS[next_level] * capacity:
            curve.append((LEVELS[next_level], allocated / capacity))
            next_level += 1
    while next_level < len(LEVELS):
        curve.append((LEVELS[next_level], allocated / capacity))
        next_level += 1
    free = sum(c.free_share(i) for c in index.caps.values() for i in c.gpu_models)
    fragmented = sum(frag.of(c) for c in index.caps.values())
    return {"seed": seed, "tasks": len(arrivals), "curve": curve, "unplaced": dict(unplaced),
            "arrived": dict(arrived), "allocated_share": allocated / capacity,
            "free_share": free / capacity, "fragmented_share_of_free": fragmented / free if free else 0.0,
            "seconds": round(time.perf_counter() - started, 2), "capacity_gpus": capacity // FULL}


def at(curve: list[tuple[float, float]], level: float) -> float:
    return next(v for lv, v in curve if lv >= level - 1e-9)


def run(a: argparse.Namespace) -> dict[str, Any]:
    tasks = read_pods(Path(a.pods))
    out: dict[str, Any] = {"order": "creation", "pods": a.pods, "nodes": a.nodes, "inflate": a.inflate, "seeds": a.seeds,
                           "candidates": a.candidates, "policies": {},
                           "paper_fgd_simulator": {k: {"at_100": v[0], "at_130": v[1]} for k, v in PAPER.items()}}
    for policy in a.policy or list(POLICIES):
        runs = [replay(Path(a.nodes), tasks, policy, a.candidates, seed, a.inflate) for seed in range(1, a.seeds + 1)]
        mean_curve = [(lv, round(100 * sum(r["curve"][i][1] for r in runs) / len(runs), 2))
                      for i, (lv, _v) in enumerate(runs[0]["curve"])]
        unplaced: Counter[str] = Counter()
        for r in runs:
            unplaced.update(r["unplaced"])
        out["policies"][policy] = {
            "allocated_pct_by_arrived": mean_curve,
            "at_100": at(mean_curve, 1.0), "at_130": at(mean_curve, 1.3),
            "unplaced_by_shape_mean": {k: round(v / len(runs), 1) for k, v in sorted(unplaced.items())},
            "fragmented_pct_of_free_mean": round(100 * sum(r["fragmented_share_of_free"] for r in runs) / len(runs), 2),
            "seconds_per_run": round(sum(r["seconds"] for r in runs) / len(runs), 2),
            "runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs],
        }
        print(f"{policy}: {out['policies'][policy]['at_100']} % at 100 % arrived, "
              f"{out['policies'][policy]['at_130']} % at 130 % ({a.seeds} seeds)", flush=True)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="muster bench placement", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", required=True, help="pod list CSV (openb format)")
    ap.add_argument("--nodes", required=True, help="node list CSV (openb format)")
    ap.add_argument("--policy", action="append", choices=POLICIES, help="repeatable; default: every policy")
    ap.add_argument("--inflate", type=float, default=1.3)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=16, help="hosts the fgd policy compares per task")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args(argv)
    rep = run(a)
    jpath = Path(a.json) if a.json else Path("placement.json")
    jpath.write_text(json.dumps(rep, indent=1) + "\n")
    ppath = Path(a.png) if a.png else jpath.with_suffix(".png")
    try:
        plot_placement(rep, ppath)
        print(f"plot: {ppath}")
    except ImportError as exc:
        print(f"no plot: {exc}", file=sys.stderr)
    print(f"report: {jpath}")
    return 0
