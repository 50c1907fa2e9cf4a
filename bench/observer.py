"""Watches the `state` bucket during a bench run: correctness and placement quality.

A watch (wire.kv.Watch, every revision) reads every committed revision of the bucket from
the start of the stream (only committed records: an atomic batch that was rejected is never
seen); its consumer is recreated within seconds when the NATS node serving it is lost:
  * every `alloc.<host>` revision is checked against the host's capacity from the fleet file:
    GPUs, CPU and memory within capacity, no GPU index used twice, every index exists;
  * every `job.<id>` revision updates the job's state and the host of each attempt; the
    store's own timestamp of the first RUNNING revision is the "running" time (the control
    plane knows it is running); for a gang, of the first revision in which every task of
    one try has reported RUNNING;
  * once a second it samples GPUs allocated and the GPU demand still queued (fragmentation:
    the share of GPUs left unallocated while GPU jobs wait).
On `finish` (request on `bench.ctl.observer`) it first reads every record stored until then
(`read_every_record` in `--out` says whether it could within CATCH_UP_S), then re-reads the
final `alloc.*` record of every host, checks those again, and writes `--out`.
It runs at nice +10 (`--nice`): a checker with no deadline gives way to the system it
checks on a saturated machine, as the server's historian does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import nats.errors

from bench.preload import BACKLOG_PREFIX
from bench.preload import PREFIX as PRELOAD_PREFIX
from bench.workload import DEFAULT_GPU_MEMORY_MB, GPU_MEMORY_MB, read_fleet
from wire import natsclient, subjects
from wire.kv import Store, Watch
from wire.messages import AttemptState
from wire.records import Record

log = logging.getLogger("bench.observer")
# A checker with no deadline: it reads every record eventually, and on a saturated machine
# it gives way to the system it checks (like the server's historian).
OBSERVER_NICE = 10
ENDED = {s.value for s in AttemptState if s.terminal}
CATCH_UP_S = 60.0  # on finish, how long the watch may take to read what is stored
EPS = 1e-6


def check_alloc(d: dict, cap: tuple[int, float, int] | tuple[int, float, int, int]) -> list[str]:
    """Problems with one HostAlloc record against (gpus, cpus, memory_mb[, GPU memory MB]):
    GPUs counted in integer thousandths (a GPU held whole is 1000; shares add up; never
    more than 1000, never shared and held whole), shared GPU memory, MIG instances once."""
    gpus, cpus, mem = cap[:3]
    gpu_mem = cap[3] if len(cap) > 3 else None
    problems = []
    whole: set[int] = set()
    milli: dict[int, int] = {}
    shared_mem: dict[int, int] = {}
    mig: set[str] = set()
    used_cpu = 0.0
    used_mem = 0
    for t in d.get("tasks", []):
        share = int(t.get("gpu_share") or 0)
        for i in t.get("gpu_indices", []):
            if i in whole or (not share and i in milli):
                problems.append(f"GPU {i} used twice")
            if not 0 <= i < gpus:
                problems.append(f"GPU {i} does not exist (host has {gpus})")
            milli[i] = milli.get(i, 0) + (share or 1000)
            if share:
                shared_mem[i] = shared_mem.get(i, 0) + int(t.get("gpu_memory_mb") or 0)
            else:
                whole.add(i)
        for u in t.get("mig") or ():
            if u in mig:
                problems.append(f"MIG instance {u} used twice")
            mig.add(u)
        used_cpu += float(t.get("cpus", 0))
        used_mem += int(t.get("memory_mb", 0))
    for i, n in sorted(milli.items()):
        if n > 1000 and i not in whole:
            problems.append(f"GPU {i} shared {n}/1000")
        if gpu_mem is not None and shared_mem.get(i, 0) > gpu_mem:
            problems.append(f"GPU {i} gives its shares {shared_mem[i]} MB of {gpu_mem} MB")
    if used_cpu > cpus + EPS:
        problems.append(f"CPU {used_cpu:g} > {cpus}")
    if used_mem > mem:
        problems.append(f"memory {used_mem} > {mem} MB")
    return problems


def _running(state: str, attempts: list[dict], replicas: int) -> bool:
    """A single job runs once its record says RUNNING (or later); a gang once every task of
    one try has reported RUNNING (the record says RUNNING from its first task on)."""
    if replicas <= 1:
        return state in ("RUNNING", "SUCCEEDED", "FAILED")
    tries: dict[int, int] = {}
    for a in attempts:
        if a.get("started_at") is not None:
            tries[a.get("number", 1)] = tries.get(a.get("number", 1), 0) + 1
    return any(n >= replicas for n in tries.values())


class Observer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.caps = {h.id: (h.gpus, float(h.cpus), h.memory_mb, GPU_MEMORY_MB.get(h.model, DEFAULT_GPU_MEMORY_MB))
                     for h in read_fleet(Path(args.fleet))}
        self.total_gpus = sum(c[0] for c in self.caps.values())
        self.alloc_gpus: dict[str, int] = {}
        self.allocated = 0
        self.jobs: dict[str, dict] = {}
        self.queued_gpus: dict[str, int] = {}
        self.alloc_revisions = 0
        self.job_revisions = 0
        self.preloaded_revisions = 0
        self.overcommit: list[dict] = []
        self.overcommitted_hosts: set[str] = set()
        self.samples: list[dict] = []
        self.lag_s = 0.0
        self.pending = 0
        self.stop = asyncio.Event()
        self.nc: nats.NATS | None = None
        self.store: Store | None = None
        self.watch: Watch | None = None

    def on_record(self, rec: Record) -> None:
        kind, _, name = rec.key.partition(".")
        self.pending = rec.behind
        self.lag_s = max(0.0, time.time() - rec.stamp)
        seq = rec.revision
        if kind == "alloc":
            self.alloc_revisions += 1
            d: dict[str, Any] = {"tasks": []} if rec.value is None else json.loads(rec.value)
            self._check(name, d, seq)
            # GPUs allocated, in thousandths: shares count what they hold.
            n = sum(int(t.get("gpu_share") or 0) or 1000 * len(t.get("gpu_indices", []))
                    for t in d.get("tasks", []))
            self.allocated += n - self.alloc_gpus.get(name, 0)
            self.alloc_gpus[name] = n
        elif kind == "job":
            self.job_revisions += 1
            if rec.value is None:
                return
            if name.startswith(PRELOAD_PREFIX):
                self.preloaded_revisions += 1  # counted against capacity via the allocs only
                return
            if name.startswith(BACKLOG_PREFIX):
                return  # never placed (the report counts any that reached a host as a fault)
            d = json.loads(rec.value)
            st = str(d.get("state", "QUEUED"))  # stored without its defaults
            j = self.jobs.get(name)
            if j is None:
                spec = d["spec"]
                j = self.jobs[name] = {"submitted_at": d.get("submitted_at"),
                                       "gpus": spec.get("gpus", 0) + (spec.get("gpu_share") or 0) / 1000,
                                       "replicas": spec.get("replicas", 1), "priority": spec.get("priority", 0),
                                       "running_at": None, "placed_at": None, "state": st, "attempts": 0,
                                       "placed": {}}
            j["state"] = st
            atts = d.get("attempts") or []
            j["attempts"] = len(atts)
            for a in atts:
                j["placed"].setdefault(a["id"], a.get("host_id"))
                if a.get("state") in ENDED:  # how it ended, for the report's problems
                    j.setdefault("ended", {})[a["id"]] = f"{a['state']}: {a.get('reason') or '-'}"
            if atts and j["placed_at"] is None:
                j["placed_at"] = atts[0].get("placed_at")
                j["host"] = atts[0].get("host_id")
            if j["running_at"] is None and atts and _running(st, atts, j["replicas"]):
                j["running_at"] = rec.stamp
                j["running_state_seen"] = st
            if st == "QUEUED":
                self.queued_gpus[name] = j["gpus"] * j["replicas"]  # a gang: every task
            else:
                self.queued_gpus.pop(name, None)

    def _check(self, host: str, d: dict, rev: int, final: bool = False) -> None:
        cap = self.caps.get(host)
        problems = ["host not in the fleet"] if cap is None else check_alloc(d, cap)
        if d.get("host_id", host) != host:
            problems.append(f"record names host {d.get('host_id')}")
        if problems:
            self.overcommitted_hosts.add(host)
            if len(self.overcommit) < 200:
                self.overcommit.append({"host": host, "revision": rev, "final_check": final, "problems": problems})

    async def sample_loop(self) -> None:
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
            q = self.queued_gpus
            self.samples.append({"t": time.time(), "queued": len(q), "queued_gpu_jobs": sum(1 for g in q.values() if g),
                                 "queued_gpus": sum(q.values()), "gpus_allocated": round(self.allocated / 1000, 3),
                                 "gpus_total": self.total_gpus, "lag_s": round(self.lag_s, 3), "pending": self.pending})
            assert self.nc is not None
            try:
                await self.nc.publish("bench.stats.observer", json.dumps(self.samples[-1]).encode())
            except Exception:  # noqa: BLE001
                pass

    async def final_check(self) -> int:
        """Read the last `alloc.*` record of every host and check it again."""
        assert self.store is not None
        if self.alloc_revisions == 0:
            return 0
        count = 0

        def on_alloc(rec: Record) -> None:
            nonlocal count
            count += 1
            d = {"tasks": []} if rec.value is None else json.loads(rec.value)
            self._check(rec.key[len("alloc."):], d, rec.revision, final=True)

        # After a NATS node is killed (--kill-nats-leader-at) a new consumer's create can go
        # unanswered (seen: 30 s, placed on the dead node, it seems): try again, 10 s each.
        for attempt in range(6):
            try:
                watch = await self.store.watch("alloc.>", on_alloc)  # the latest of each host
                break
            except nats.errors.TimeoutError:
                log.warning("final alloc read: consumer create unanswered (try %d)", attempt + 1)
                if attempt == 5:
                    raise
        try:
            await asyncio.wait_for(watch.caught_up(), timeout=120)
        except TimeoutError:
            log.warning("final alloc read incomplete: %d records", count)
        await watch.stop()
        return count

    async def on_ctl(self, msg) -> None:
        req = json.loads(msg.data)
        if req.get("cmd") != "finish":
            return
        # Read every record stored until now first (the watch's consumer may be being
        # recreated after a NATS node's loss); a report from part of the records says so.
        assert self.watch is not None
        try:
            await asyncio.wait_for(self.watch.caught_up(), timeout=CATCH_UP_S)
            read_all = True
        except TimeoutError:
            read_all = False
            log.warning("the watch did not catch up within %.0f s", CATCH_UP_S)
        final = await self.final_check()
        out = {"read_every_record": read_all, "alloc_revisions_checked": self.alloc_revisions,
               "job_revisions": self.job_revisions,
               "preloaded_job_revisions": self.preloaded_revisions,
               "final_alloc_records_checked": final, "overcommitted_hosts": sorted(self.overcommitted_hosts),
               "overcommit_examples": self.overcommit, "samples": self.samples, "jobs": self.jobs,
               "watch_lag_s_at_end": round(self.lag_s, 3)}
        tmp = Path(self.args.out + ".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(self.args.out)
        await msg.respond(b'{"ok": true}')
        self.stop.set()

    async def run(self) -> None:
        self.nc = await natsclient.connect(self.args.nats.split(","), name="bench-observer",
                                           max_reconnect_attempts=-1, reconnect_time_wait=0.5)
        self.store = Store(self.nc, timeout=10)
        await self.nc.subscribe("bench.ctl.observer", cb=self.on_ctl)
        # Every revision from the start of the stream; the watch recreates its consumer
        # within seconds when the NATS node serving it is lost.
        self.watch = Watch(self.store, subjects.STATE_BUCKET, ">", self.on_record, every_revision=True)
        await self.watch.start()
        sampler = asyncio.create_task(self.sample_loop())
        await self.nc.publish("bench.stats.observer", b'{"ready": true}')
        await self.stop.wait()
        sampler.cancel()
        await self.watch.stop()
        await self.nc.drain()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.observer")
    ap.add_argument("--nats", required=True)
    ap.add_argument("--fleet", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--nice", type=int, default=OBSERVER_NICE,
                    help="added to this process's nice value (default %(default)s)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s observer %(levelname)s %(message)s")
    if args.nice:
        os.nice(args.nice)
    asyncio.run(Observer(args).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
