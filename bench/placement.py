"""Placement quality on a real cluster trace, in process, no servers: the method of the FGD
paper's Kubernetes Scheduler Simulator (hkust-adsl/kubernetes-scheduler-simulator, as its
artifact runs it; docs/benchmarks.md says step by step where each part comes from).

    muster bench placement --pods ../shared/traces/openb_pod_list_default.csv \\
        --nodes ../shared/traces/openb_node_list_gpu_node.csv [--policy fgd] [--inflate 1.3] [--seeds 10]

Each seed: the pod list sorted by name in a seeded random order (`--order shuffle`, the
artifact's `--shuffle-pod=true`; `--order creation` keeps the trace's creation order),
then tasks drawn from it (seeded) appended until the next one drawn would take the GPU
demand past `--inflate` times the cluster's GPU capacity (one GPU of a multi-GPU task
counted in that test, as the simulator's tuning does); the nodes named as the simulator
names them, a seeded permutation's index before each name, so that hosts of equal merit
(taken lowest id first) come in a random order fixed for the run. The tasks arrive one
after another and none leaves; each is placed by Muster's own placement core
(server.scheduling.capacity.Placer over an incremental CapacityIndex, a fresh Placer per
task as in a scheduling cycle, with the named policy) or left unplaced. A fraction of one
GPU is a share (thousandths), a `gpu_spec` model set is any-of models.

Reported, per policy, averaged over the seeds: the share of the cluster's GPU capacity
allocated at each level of GPU demand arrived (0-130 %; as the simulator's analysis, the
mean over the tasks at which the arrived demand rounds to that percent), the tasks left
unplaced by shape, and the fragmented GPU share at the end (FGD's measure: free GPU
capacity the typical tasks could not use, weighted by how often each arrives, as a share
of the free capacity and of all capacity). The typical-task mix is the pod list's own,
as the simulator's "typical pods"; the live scheduler uses its recent submissions instead.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.plot import plot_placement
from server.scheduling.capacity import POLICIES, CapacityIndex, Placer
from server.scheduling.fragmentation import Fragmentation, Shape, ShapeMix
from server.scheduling.placement import FULL, HostCapacity
from wire.budgets import task_bytes
from wire.messages import JobSpec

LEVELS = list(range(0, 131, 5))  # arrived GPU demand, % of capacity
# The FGD paper's published figures (mean of 10 seeds; the simulator's
# experiments/analysis/expected_results/analysis_allo_discrete.csv), GPU capacity
# allocated at 100 % and 130 % of it arrived, default openb pod list.
PAPER = {"FGD": (95.2, 95.4), "BestFit": (92.9, 93.1), "GpuPacking": (91.8, 92.0), "DotProd": (90.6, 90.8),
         "Random": (86.3, 87.5)}


@dataclass(frozen=True)
class Task:
    name: str
    spec: JobSpec

    @property
    def gpu_milli(self) -> int:
        return self.spec.gpus * FULL + self.spec.gpu_share


def read_nodes(path: Path, names: list[str] | None = None) -> list[HostCapacity]:
    """The node list (openb format: sn, cpu_milli, memory_mib, gpu, model) as capacities,
    named `names` (in the file's order) if given."""
    nodes = []
    with path.open() as f:
        for k, row in enumerate(csv.DictReader(f)):
            n = int(row["gpu"] or 0)
            model = row["model"] or "GPU"
            nodes.append(HostCapacity(
                id=names[k] if names else row["sn"], schedulable=True, cordoned=False,
                gpu_models={i: model for i in range(n)},
                unhealthy_gpus=frozenset(), cpus=int(row["cpu_milli"]) / 1000, memory_mb=int(row["memory_mib"]),
                gpu_memory={i: 0 for i in range(n)}))
    return nodes


def read_pods(path: Path) -> list[Task]:
    """The pod list (openb format) in creation order, each task as a job spec: whole GPUs,
    or a share of one GPU in thousandths, with its CPU, memory and any-of GPU models."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: (int(r.get("creation_time") or 0), r["name"]))  # some variants have no times
    out = []
    for r in rows:
        n, milli = int(r["num_gpu"] or 0), int(r["gpu_milli"] or 0)
        models = sorted({m for m in (r.get("gpu_spec") or "").split("|") if m})
        share = milli if n == 1 and 0 < milli < FULL else 0
        spec = JobSpec(name="t", command=["x"], gpus=0 if share else n, gpu_share=share,
                       cpus=max(0.001, int(r["cpu_milli"]) / 1000), memory_mb=int(r["memory_mib"]),
                       gpu_models=models if models and (n or share) else None)
        out.append(Task(r["name"], spec))
    return out


def arrivals(tasks: list[Task], capacity_milli: int, factor: float, order: str, rng: random.Random) -> list[Task]:
    """The tasks in the order they arrive: the pod list (by name, shuffled; or in creation
    order), then tasks drawn from it (by name) appended until the next one drawn would
    take the GPU demand past `factor` times the capacity, that test counting one GPU of a
    multi-GPU task as the simulator's workload tuning does."""
    by_name = sorted(tasks, key=lambda t: t.name)
    out = list(by_name) if order == "shuffle" else list(tasks)
    if order == "shuffle":
        rng.shuffle(out)
    asked = sum(t.gpu_milli for t in out)
    while True:
        t = by_name[rng.randrange(len(by_name))]
        if asked + (FULL if t.spec.gpus else t.spec.gpu_share) > factor * capacity_milli:
            return out
        out.append(t)
        asked += t.gpu_milli


def node_names(path: Path, rng: random.Random) -> list[str]:
    """The simulator's node names: each node's own, sorted, prefixed with its place in a
    seeded random permutation ("0042-openb-node-0007"), so that hosts of equal merit are
    taken in a random order that is fixed for the run."""
    with path.open() as f:
        sns = [row["sn"] for row in csv.DictReader(f)]
    perm = list(range(len(sns)))
    rng.shuffle(perm)
    prefix = {sn: f"{perm[i]:04d}-" for i, sn in enumerate(sorted(sns))}
    return [prefix[sn] + sn for sn in sns]


def shape_name(spec: JobSpec) -> str:
    if spec.gpus:
        return f"{spec.gpus} GPU"
    if spec.gpu_share:
        return "GPU share"
    return "no GPU"


def typical_mix(tasks: list[Task]) -> Fragmentation:
    """FGD's measure over the pod list's own task shapes, counted over the list before any
    inflation: the most frequent first until they cover 95 % of the tasks, those without
    GPUs included, memory aside (the simulator's typical pods)."""
    shapes: Counter[Shape] = Counter()
    for t in tasks:
        s = Shape.of(t.spec)
        shapes[Shape(s.gpus, s.share, s.gpu_memory_mb, s.cpus, 0, s.models, s.mig)] += 1
    return Fragmentation(ShapeMix.of(shapes))


def replay(nodes_path: Path, tasks: list[Task], policy: str, candidates: int, seed: int, factor: float,
           order: str, frag: Fragmentation) -> dict[str, Any]:
    rng = random.Random(seed)
    with nodes_path.open() as f:
        capacity = sum(int(row["gpu"] or 0) for row in csv.DictReader(f)) * FULL
    tasks_in = arrivals(tasks, capacity, factor, order, rng)
    index = CapacityIndex()
    nodes = read_nodes(nodes_path, node_names(nodes_path, rng))
    for n in nodes:
        index.put(n)
    asked = allocated = 0
    by_level: dict[int, list[float]] = defaultdict(list)  # arrived %, rounded -> allocated % after each task
    unplaced: Counter[str] = Counter()
    arrived: Counter[str] = Counter()
    started = time.perf_counter()
    for t in tasks_in:
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
        by_level[round(100 * asked / capacity)].append(100 * allocated / capacity)
    seconds = time.perf_counter() - started
    curve: list[tuple[int, float]] = []
    for lv in LEVELS:
        near = by_level.get(lv) or by_level.get(lv - 1, []) + by_level.get(lv + 1, [])
        curve.append((lv, round(sum(near) / len(near), 3) if near else (curve[-1][1] if curve else 0.0)))
    # Correctness: no host ends with more than it has (GPUs in integer thousandths).
    overcommitted = sorted(c.id for c in index.caps.values()
                           if any(n > FULL for n in c.share_used.values()) or c.used_gpus & set(c.share_used)
                           or not c.used_gpus <= set(c.gpu_models) or c.used_cpus > c.cpus + 1e-6
                           or c.used_memory_mb > c.memory_mb)
    placed_milli = sum(FULL * len(c.used_gpus) + sum(c.share_used.values()) for c in index.caps.values())
    free = sum(c.free_share(i) for c in index.caps.values() for i in c.gpu_models)
    fragmented = sum(frag.of(c) for c in index.caps.values())
    return {"seed": seed, "tasks": len(tasks_in), "curve": curve, "unplaced": dict(unplaced),
            "arrived": dict(arrived), "allocated_pct": round(100 * allocated / capacity, 3),
            "free_pct": round(100 * free / capacity, 3),
            "fragmented_pct_of_free": round(100 * fragmented / free, 3) if free else 0.0,
            "fragmented_pct_of_capacity": round(100 * fragmented / capacity, 3),
            "overcommitted_hosts": overcommitted, "allocated_matches_hosts": placed_milli == allocated,
            "seconds": round(seconds, 2), "placements_per_s": round(len(tasks_in) / seconds, 1),
            "capacity_gpus": capacity // FULL, "hosts": len(nodes)}


def run(a: argparse.Namespace) -> dict[str, Any]:
    tasks = read_pods(Path(a.pods))
    frag = typical_mix(tasks)
    out: dict[str, Any] = {
        "scenario": "placement", "command": "muster bench placement " + " ".join(a.argv), "pods": a.pods,
        "nodes": a.nodes, "order": a.order, "inflate": a.inflate, "seeds": a.seeds, "candidates": a.candidates,
        "typical_shapes": len(frag.mix.shapes), "policies": {},
        "paper_fgd_simulator": {k: {"at_100": v[0], "at_130": v[1]} for k, v in PAPER.items()},
        "recorded": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
    }
    for policy in a.policy or list(POLICIES):
        runs = [replay(Path(a.nodes), tasks, policy, a.candidates, seed, a.inflate, a.order, frag)
                for seed in range(1, a.seeds + 1)]
        mean_curve = [(lv, round(sum(r["curve"][i][1] for r in runs) / len(runs), 2)) for i, lv in enumerate(LEVELS)]
        unplaced: Counter[str] = Counter()
        for r in runs:
            unplaced.update(r["unplaced"])

        def mean(key: str, rs: list[dict[str, Any]] = runs) -> float:
            return round(sum(r[key] for r in rs) / len(rs), 2)

        out["policies"][policy] = {
            "allocated_pct_by_arrived": mean_curve,
            "at_100": dict(mean_curve)[100], "at_130": dict(mean_curve)[130],
            "at_130_min_max": [min(r["curve"][-1][1] for r in runs), max(r["curve"][-1][1] for r in runs)],
            "unplaced_by_shape_mean": {k: round(v / len(runs), 1) for k, v in sorted(unplaced.items())},
            "fragmented_pct_of_free_mean": mean("fragmented_pct_of_free"),
            "fragmented_pct_of_capacity_mean": mean("fragmented_pct_of_capacity"),
            "seconds_per_run": mean("seconds"), "placements_per_s": mean("placements_per_s"),
            "runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs],
        }
        p = out["policies"][policy]
        print(f"{policy}: {p['at_100']} % of GPU capacity allocated at 100 % arrived, {p['at_130']} % at 130 % "
              f"({a.seeds} seeds, {a.order} order); fragmented {p['fragmented_pct_of_free_mean']} % of the free "
              f"GPU capacity at the end", flush=True)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="muster bench placement", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", required=True, help="pod list CSV (openb format)")
    ap.add_argument("--nodes", required=True, help="node list CSV (openb format)")
    ap.add_argument("--policy", action="append", choices=POLICIES, help="repeatable; default: every policy")
    ap.add_argument("--inflate", type=float, default=1.3, help="GPU demand, as a multiple of GPU capacity")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--order", choices=("shuffle", "creation"), default="shuffle",
                    help="the pod list shuffled per seed (the simulator's artifact), or in creation order")
    ap.add_argument("--candidates", type=int, default=16, help="feasible hosts the fgd policy compares per task")
    ap.add_argument("--json", default="placement.json")
    ap.add_argument("--png", default=None, help="plot (default: the JSON path with .png)")
    a = ap.parse_args(argv)
    a.argv = argv
    rep = run(a)
    jpath = Path(a.json)
    jpath.parent.mkdir(parents=True, exist_ok=True)
    jpath.write_text(json.dumps(rep, indent=1) + "\n")
    ppath = Path(a.png) if a.png else jpath.with_suffix(".png")
    try:
        plot_placement(rep, ppath)
        print(f"plot: {ppath}")
    except ImportError as exc:  # matplotlib is the `bench` extra
        print(f"no plot: {exc} (pip install 'muster[bench]'; then python -m bench plot {jpath})", file=sys.stderr)
    print(f"report: {jpath}")
    return 0
