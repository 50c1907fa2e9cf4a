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
"""

from __future__ import annotations

import asyncio
import time

from bench.workload import HostSpec
from server import subjects
from server.messages import Attempt, AttemptState, HostAlloc, Job, JobSpec, JobState, Task, encode
from server.store import Store, connect

PREFIX = "preload-"
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


async def preload(nats_url: str, fleet: list[HostSpec], n: int, replicas: int = 1,
                  inflight: int = 2_000) -> dict[str, float]:
    """Write the records (creating the buckets first); returns what it took."""
    started = time.monotonic()
    jobs, allocs = plan(fleet, n, time.time())
    nc = await connect(nats_url.split(",")[0], name="bench-preload")
    try:
        store = Store(nc, replicas=replicas)
        await store.ensure()
        js = nc.jetstream(timeout=60)
        sem = asyncio.Semaphore(inflight)
        pending: set[asyncio.Future] = set()
        nbytes = 0

        async def put(key: str, value: bytes) -> None:
            await sem.acquire()
            fut = await js.publish_async(subjects.kv_subject(subjects.STATE_BUCKET, key), value)
            fut.add_done_callback(lambda _f: sem.release())
            pending.add(fut)

        for job in jobs:
            body = encode(job)
            nbytes += len(body)
            await put(subjects.job_key(job.id), body)
        for alloc in allocs:
            body = encode(alloc)
            nbytes += len(body)
            await put(subjects.alloc_key(alloc.host_id), body)
        results = await asyncio.gather(*pending, return_exceptions=True)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise RuntimeError(f"{len(failed)} preload writes failed, e.g. {failed[0]!r}")
    finally:
        await nc.close()
    return {"jobs": len(jobs), "hosts": len(allocs), "bytes": nbytes,
            "seconds": round(time.monotonic() - started, 1)}
