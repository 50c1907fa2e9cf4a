"""Fleets and job streams for `muster bench`.

Two sources:
  * synthetic: a fixed mix of host shapes, and jobs drawn from a fixed resource mix with
    log-normal durations (mean `mean_duration_s`);
  * trace (`--trace`): hosts tiled from the Alibaba openb GPU node list (each copy of the
    1,213-node list is its own zone, 32 hosts per rack), job shapes resampled from the openb
    pod list (qos column = priority class; a fraction of one GPU asked as that share of a
    GPU, `gpu_share` in thousandths; the `gpu_spec` model set, where given, as any-of
    `gpu_models`), Philly jobs needing more than 8 GPUs added as gangs. Durations are the
    trace's, capped at 7 days, divided by 80.

A Philly job of n > 8 GPUs is submitted as ONE gang job: `replicas = ceil(n/8)` tasks of
8 GPUs each (32 CPUs, 128 GiB), which the server places all at once or not at all (every
openb host has at most 8 GPUs, so its tasks land on distinct hosts). It counts as one job
and `replicas` tasks.

Arrivals are Poisson at `rate` per second (a gang is one arrival); `burst` gives the
same jobs all at once. Every job's command is `sleep <seconds>`: the simulated hosts run
it as a timer.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic.alias_generators import to_camel

ROOT = Path(__file__).resolve().parent.parent
# Read in place, never copied into the project (see their README); MUSTER_TRACES points
# elsewhere when the checkout does not sit beside shared/.
TRACES = Path(os.environ.get("MUSTER_TRACES") or ROOT.parent / "shared" / "traces")

SEVEN_DAYS_S = 7 * 24 * 3600
TRACE_SCALE = 80.0
GPU_MEMORY_MB = {"H100": 81920, "A100": 81920, "L40S": 46068, "P100": 16384, "T4": 15360,
                 "V100M16": 16384, "V100M32": 32768, "A10": 24576, "G2": 32768, "G3": 49152}
DEFAULT_GPU_MEMORY_MB = 16384
# qos class -> job priority (higher is scheduled first).
QOS_PRIORITY = {"LS": 300, "Guaranteed": 200, "Burstable": 100, "BE": 0}
RACK_SIZE = 32


@dataclass
class HostSpec:
    id: str
    gpus: int
    model: str
    cpus: int
    memory_mb: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class JobReq:
    """One job to submit: a single task, or a gang of `replicas` tasks (each with these
    resources)."""

    name: str
    gpus: int
    cpus: float
    memory_mb: int
    duration_s: float
    priority: int = 0
    qos: str = "synthetic"
    replicas: int = 1  # > 1: a gang, placed all at once or not at all
    same_rack: bool = False
    gpu_share: int = 0  # thousandths of ONE GPU (the trace's fraction; gpus is then 0)
    gpu_models: list[str] = field(default_factory=list)  # any of these models (the trace's gpu_spec)
    queue: str | None = None  # the queue it is submitted to (None: the default queue)

    @property
    def fractional_gpu(self) -> bool:
        return self.gpu_share > 0

    @property
    def gang(self) -> bool:
        return self.replicas > 1

    def nats_input(self) -> dict[str, object]:
        """The same job for the NATS submission path (snake_case, see wire.submit)."""
        d: dict[str, object] = {"name": self.name, "command": ["sleep", f"{self.duration_s:.3f}"],
                                "gpus": self.gpus, "cpus": self.cpus, "memory_mb": self.memory_mb,
                                "priority": self.priority, "max_attempts": 3}
        if self.gang:
            d.update(replicas=self.replicas, same_rack=self.same_rack)
        if self.gpu_share:
            d["gpu_share"] = self.gpu_share
        if self.gpu_models:
            d["gpu_models"] = self.gpu_models
        if self.queue:
            d["queue"] = self.queue
        return d

    def graphql_input(self) -> dict[str, object]:
        """The same job as SubmitJobInput (the NATS fields in camelCase)."""
        return {to_camel(k): v for k, v in self.nats_input().items()}


# ---------------------------------------------------------------- fleets

SYNTHETIC_SHAPES = [  # (weight, gpus, model, cpus, memory_mb)
    (0.55, 8, "H100", 192, 2 * 1024 * 1024),
    (0.20, 8, "A100", 128, 1024 * 1024),
    (0.15, 4, "L40S", 64, 512 * 1024),
    (0.10, 0, "", 64, 256 * 1024),
]


def _host_id(i: int) -> str:
    return f"sim-{i:06d}"


def synthetic_fleet(n: int, seed: int = 1) -> list[HostSpec]:
    rng = random.Random(seed)
    weights = [s[0] for s in SYNTHETIC_SHAPES]
    out = []
    for i in range(n):
        _, g, model, cpus, mem = rng.choices(SYNTHETIC_SHAPES, weights)[0]
        out.append(HostSpec(_host_id(i), g, model, cpus, mem,
                            {"rack": f"r{i // RACK_SIZE}", "zone": f"z{i // 1000}"}))
    return out


def trace_fleet(n: int, traces: Path = TRACES) -> list[HostSpec]:
    rows = list(csv.DictReader(open(traces / "openb_node_list_gpu_node.csv")))
    out = []
    for i in range(n):
        copy, k = divmod(i, len(rows))
        r = rows[k]
        out.append(HostSpec(_host_id(i), int(r["gpu"]), r["model"] or "", int(r["cpu_milli"]) // 1000,
                            int(r["memory_mib"]),
                            {"rack": f"c{copy}-r{k // RACK_SIZE}", "zone": f"c{copy}"}))
    return out


def heartbeat_static(h: HostSpec) -> dict[str, object]:
    """The parts of a host's heartbeat that never change."""
    return {
        "labels": h.labels,
        "gpus": [{"index": i, "model": h.model, "memory_mb": GPU_MEMORY_MB.get(h.model, DEFAULT_GPU_MEMORY_MB),
                  "uuid": f"GPU-{h.id}-{i}"} for i in range(h.gpus)],
        "cpus": h.cpus,
        "memory_mb": h.memory_mb,
        "gpu_usage": [{"index": i, "util_pct": 0.0, "mem_used_mb": 0, "temp_c": 40.0, "power_w": 60.0,
                       "healthy": True, "fault": None} for i in range(h.gpus)],
    }


def write_fleet(hosts: list[HostSpec], path: Path) -> None:
    path.write_text(json.dumps([asdict(h) for h in hosts]))


def read_fleet(path: Path) -> list[HostSpec]:
    return [HostSpec(**d) for d in json.loads(path.read_text())]


# ---------------------------------------------------------------- jobs


class Synthetic:
    """Jobs from a fixed mix: GPUs 0/1/2/4/8, CPU and memory per GPU, log-normal durations."""

    MIX = [(0.10, 0), (0.45, 1), (0.15, 2), (0.15, 4), (0.15, 8)]

    def __init__(self, seed: int = 2, mean_duration_s: float = 8.0) -> None:
        self.rng = random.Random(seed)
        self.mean = mean_duration_s
        self.n = 0

    def next(self) -> JobReq:
        self.n += 1
        g = self.rng.choices([m[1] for m in self.MIX], [m[0] for m in self.MIX])[0]
        cpus = float(max(1, 8 * g)) if g else float(self.rng.choice([1, 2, 4, 8]))
        mem = 16384 * max(1, g)
        sigma = 0.8
        dur = self.rng.lognormvariate(math.log(self.mean) - sigma * sigma / 2, sigma)
        return JobReq(f"syn-{self.n}", g, cpus, mem, round(max(0.05, dur), 3))


class Trace:
    """Job shapes from the openb pod list, plus Philly gangs (> 8 GPUs)."""

    def __init__(self, seed: int = 2, gang_fraction: float = 0.02, traces: Path = TRACES) -> None:
        self.rng = random.Random(seed)
        self.gang_fraction = gang_fraction
        self.n = 0
        self.pods = []
        for r in csv.DictReader(open(traces / "openb_pod_list_default.csv")):
            start = float(r["scheduled_time"] or r["creation_time"] or 0)
            end = float(r["deletion_time"] or start)
            dur = min(max(0.0, end - start), SEVEN_DAYS_S) / TRACE_SCALE
            models = sorted({m for m in (r.get("gpu_spec") or "").split("|") if m})
            self.pods.append((int(r["num_gpu"]), int(r["gpu_milli"] or 0), int(r["cpu_milli"]),
                              int(r["memory_mib"]), r["qos"] or "BE", dur, models))
        self.gangs = []
        for j in json.load(open(traces / "philly_multigpu_jobs.json")):
            if int(j["num_gpus"]) > 8:
                dur = min(float(j["runtime"]) * 60, SEVEN_DAYS_S) / TRACE_SCALE
                self.gangs.append((int(j["num_gpus"]), dur))

    def next(self) -> JobReq:
        self.n += 1
        if self.gangs and self.rng.random() < self.gang_fraction:
            n_gpus, dur = self.rng.choice(self.gangs)
            return JobReq(f"gang-{self.n}", 8, 32.0, 128 * 1024, round(max(0.05, dur), 3), 0, "gang",
                          replicas=math.ceil(n_gpus / 8))
        g, milli, cpu_milli, mem, qos, dur, models = self.rng.choice(self.pods)
        # The trace's own demand: a fraction of one GPU as a share (thousandths), its
        # model set as any-of models.
        share = milli if g == 1 and 0 < milli < 1000 else 0
        return JobReq(f"pod-{self.n}", 0 if share else g, max(0.1, cpu_milli / 1000), max(1, mem),
                      round(max(0.05, dur), 3), QOS_PRIORITY.get(qos, 0), qos, gpu_share=share,
                      gpu_models=models if g else [])


class Queued:
    """Another generator's jobs, each sent to the next of `queues` in turn."""

    def __init__(self, gen: Trace | Synthetic, queues: list[str]) -> None:
        self.gen = gen
        self.queues = queues
        self.n = 0

    def next(self) -> JobReq:
        job = self.gen.next()
        job.queue = self.queues[self.n % len(self.queues)]
        self.n += 1
        return job


def arrivals(rate: float, duration_s: float, seed: int = 3) -> list[float]:
    """Poisson arrival offsets (seconds from the start) at `rate` per second."""
    rng = random.Random(seed)
    t = 0.0
    out: list[float] = []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(t)
