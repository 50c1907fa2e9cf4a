"""Start a benchmark with N long-running tasks already in the cluster (`--preload N`).

Placing 500,000 tasks one by one at a few hundred a second would take most of an hour,
so the state bucket is filled before the server starts, as if the cluster had been
running for a while: N RUNNING jobs (`preload-<n>`, CPU only: 0.1 CPU and 64 MB each,
`sleep 86400`), spread round-robin over the fleet, and every host's allocation record
listing its share. The server then loads them like any restart would (watch replay),
counts them against capacity, and carries them through the measured window; the
simulated hosts adopt attempt 1 of each (`preload-*.1`) as already running, as an agent
that restarts and finds its processes alive does, and never report on it. A preloaded
job whose host is lost is requeued and run again like any other (those reruns are real
simulated tasks).

`--backlog N` writes, the same way, N QUEUED jobs (`backlog-<n>`, 1-8 GPUs, 1-32 CPUs and
4-64 GB each, drawn with the run's seed) to a queue `backlog` whose quota admits no GPU
of any model: a long queue that never moves, which every scheduling cycle finds in front
of the measured jobs (it holds nothing, so fair share puts it first). The measured jobs'
dispatch latency then includes what that queue costs a cycle. None of them may ever run.
"""

from __future__ import annotations

import random
import time

from bench.workload import HostSpec
from server.state.streams import ensure_streams
from wire import subjects
from wire.kv import Store, Write, connect
from wire.messages import (
    Attempt,
    AttemptState,
    HostAlloc,
    Job,
    JobSpec,
    JobState,
    Queue,
    ResourceQuota,
    Task,
    encode,
)

PREFIX = "preload-"
BACKLOG_PREFIX = "backlog-"
BACKLOG_QUEUE = "backlog"
CPUS = 0.1
MEMORY_MB = 64
COMMAND = ["sleep", "86400"]


def is_preloaded_attempt(attempt_id: str) -> bool:
    """Attempt 1 of a preloaded job: adopted by the simulated hosts, never simulated."""
    return attempt_id.startswith(PREFIX) and attempt_id.endswith(".1")


def plan(fleet: list[HostSpec], n: int, now: float) -> tuple[list[Job], list[HostAlloc]]:
    """N RUNNING jobs spread round-robin over the hosts (each host's share must fit)."""
    tasks: dict[str, list[Task]] = {h.id: [] for h in fleet}
    jobs: list[Job] = []
    if not fleet:
        return jobs, []
    for i in range(n):
        host = fleet[i % len(fleet)]
        job_id = f"{PREFIX}{i:07d}"
        attempt_id = f"{job_id}.1"
        spec = JobSpec(name=job_id, command=COMMAND, cpus=CPUS, memory_mb=MEMORY_MB, user="preload")
        jobs.append(Job(id=job_id, spec=spec, state=JobState.RUNNING, submitted_at=now, updated_at=now,
                        attempts=[Attempt(id=attempt_id, number=1, task=0, host_id=host.id, gpu_indices=[],
                                          state=AttemptState.RUNNING, term=0, placed_at=now, started_at=now)]))
        tasks[host.id].append(Task(attempt_id=attempt_id, job_id=job_id, number=1, command=COMMAND,
                                   cpus=CPUS, memory_mb=MEMORY_MB, term=0))
    per_host = -(-n // len(fleet))
    small = [h.id for h in fleet if h.cpus < per_host * CPUS or h.memory_mb < per_host * MEMORY_MB]
    if small:
        raise ValueError(f"{len(small)} hosts (e.g. {small[0]}) cannot hold {per_host} preloaded tasks")
    return jobs, [HostAlloc(host_id=h, term=0, tasks=t) for h, t in tasks.items() if t]


def backlog_plan(fleet: list[HostSpec], n: int, now: float, seed: int = 1) -> tuple[Queue, list[Job]]:
    """The `backlog` queue (a nominal quota of 0 for every GPU model of the fleet, no
    cohort: it may never hold a GPU) and its N queued jobs, in submission order."""
    models = sorted({h.model for h in fleet if h.gpus and h.model})
    queue = Queue(name=BACKLOG_QUEUE, description="bench --backlog: a queue that never moves",
                  quota={f"gpu:{m}": ResourceQuota(nominal=0.0) for m in models},
                  created_at=now, updated_at=now, by="bench")
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        job_id = f"{BACKLOG_PREFIX}{i:07d}"
        spec = JobSpec(name=job_id, command=["sleep", "60"], gpus=rng.choice((1, 1, 2, 4, 8)),
                       cpus=float(rng.randint(1, 32)), memory_mb=rng.choice((4096, 16384, 65536)),
                       queue=BACKLOG_QUEUE, user="backlog")
        jobs.append(Job(id=job_id, spec=spec, submitted_at=now - n + i, updated_at=now))
    return queue, jobs


async def preload_backlog(nats_url: str, fleet: list[HostSpec], n: int, replicas: int = 1,
                          seed: int = 1) -> dict[str, float]:
    """Write the backlog queue and its jobs; returns what it took."""
    started = time.monotonic()
    queue, jobs = backlog_plan(fleet, n, time.time(), seed)
    writes = [Write(subjects.queue_key(queue.name), encode(queue), expected=0)] + \
             [Write(subjects.job_key(j.id), encode(j), expected=0) for j in jobs]
    await _write(nats_url, writes, replicas)
    return {"jobs": len(jobs), "bytes": sum(len(w.value) for w in writes),
            "seconds": round(time.monotonic() - started, 1)}


async def preload(nats_url: str, fleet: list[HostSpec], n: int, replicas: int = 1) -> dict[str, float]:
    """Write the records (creating the buckets first) with the store's own atomic,
    create-only commits; returns what it took."""
    started = time.monotonic()
    jobs, allocs = plan(fleet, n, time.time())
    writes = [Write(subjects.job_key(j.id), encode(j), expected=0) for j in jobs] + \
             [Write(subjects.alloc_key(a.host_id), encode(a), expected=0) for a in allocs]
    await _write(nats_url, writes, replicas)
    return {"jobs": len(jobs), "hosts": len(allocs), "bytes": sum(len(w.value) for w in writes),
            "seconds": round(time.monotonic() - started, 1)}


async def _write(nats_url: str, writes: list[Write], replicas: int, batch_keys: int = 900,
                 batch_bytes: int = 2 * 1024 * 1024) -> None:
    """Create the buckets, then commit `writes` in atomic, create-only batches."""
    nc = await connect(nats_url.split(",")[0], name="bench-preload")
    try:
        store = Store(nc, replicas=replicas)
        await ensure_streams(store)
        chunk: list[Write] = []
        size = 0
        for w in writes:
            if chunk and (len(chunk) >= batch_keys or size + len(w.value) > batch_bytes):
                await store.commit(chunk)
                chunk, size = [], 0
            chunk.append(w)
            size += len(w.value)
        if chunk:
            await store.commit(chunk)
    finally:
        await nc.close()
