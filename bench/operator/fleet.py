"""The operator benchmark's fleet: bench.workload's synthetic fleet with pools, and what
becomes of each host (heartbeating, SUSPECT, LOST, cordoned, drained); the simulated
hosts' heartbeats with lifelike GPU usage (`VariedSimHost`, run by `python -m
bench.operator simulate`), and the one-shot heartbeats of the hosts that go silent."""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass

from bench.simhosts import SimHost
from bench.workload import GPU_MEMORY_MB, HostSpec, heartbeat_static, synthetic_fleet
from wire import natsclient
from wire.messages import SHAPE_HEADER

SUSPECT_SHARE = 0.01
LOST_SHARE = 0.005
CORDONED_SHARE = 0.01
DRAINED_SHARE = 0.002
FAULTY_SHARE = 0.003
GPU_FAULTS = ("xid 79: GPU has fallen off the bus", "xid 48: double-bit ECC error",
              "ecc (uncorrectable): uncorrectable ECC errors increased")


def varied_usage(spec: HostSpec) -> tuple[dict[str, object], float, int]:
    """The static part of a host's heartbeat with lifelike GPU usage (busy or idle,
    temperature and power following utilisation, now and then a faulty GPU), its CPU %
    and used memory; the same for a host every time (seeded by its id)."""
    rng = random.Random(spec.id)
    static = heartbeat_static(spec)
    busy = 0.0 if rng.random() < 0.3 else rng.uniform(20.0, 100.0)
    bad = rng.randrange(spec.gpus) if spec.gpus and rng.random() < FAULTY_SHARE else -1
    mem = GPU_MEMORY_MB.get(spec.model, 16384)
    usage = static["gpu_usage"]
    assert isinstance(usage, list)
    for u in usage:
        util = round(min(100.0, max(0.0, busy + rng.uniform(-15.0, 15.0))), 1) if busy else 0.0
        u.update(
            util_pct=util,
            mem_used_mb=int(mem * util / 110),
            temp_c=round(33 + util * 0.45 + rng.uniform(-2, 2), 1),
            power_w=round(60 + util * 6.4 + rng.uniform(-5, 5), 1),
        )
        if u["index"] == bad:
            u.update(healthy=False, fault=rng.choice(GPU_FAULTS))
    cpu_pct = round(min(100.0, busy * 0.6 + rng.uniform(1.0, 10.0)), 1)
    mem_used = int(spec.memory_mb * min(0.95, 0.05 + busy / 150))
    return static, cpu_pct, mem_used


class VariedSimHost(SimHost):
    """bench.simhosts.SimHost with the usage of `varied_usage` in every heartbeat."""

    def __init__(self, spec: HostSpec, boot_id: str, ttl: str = "15s") -> None:
        super().__init__(spec, boot_id, ttl)
        static, cpu_pct, mem_used = varied_usage(spec)
        body = json.dumps(static, separators=(",", ":"))[1:-1]
        self.set_tail((f',{body},"cpu_pct":{cpu_pct},"mem_used_mb":{mem_used},"simulated":true,'
                       f'"agent_version":"bench-sim","term":').encode())


def simulate(argv: list[str]) -> int:
    """`python -m bench.operator simulate <bench.simhosts options>`: the simulator with
    varied heartbeats (bench.simhosts builds its hosts from the module's `SimHost`)."""
    import bench.simhosts as simhosts

    simhosts.SimHost = VariedSimHost  # type: ignore[misc]
    return simhosts.main(argv)


@dataclass
class FleetPlan:
    """The fleet and what becomes of each host: heartbeating, SUSPECT, LOST, cordoned, drained."""

    hosts: list[HostSpec]
    live: list[HostSpec]
    suspect: list[HostSpec]
    lost: list[HostSpec]
    cordoned: list[str]
    drained: list[str]


def build_fleet(n: int, seed: int) -> FleetPlan:
    hosts = synthetic_fleet(n, seed=seed)
    rng = random.Random(seed + 101)
    live: list[HostSpec] = []
    suspect: list[HostSpec] = []
    lost: list[HostSpec] = []
    for h in hosts:
        h.labels["pool"] = "cpu" if not h.gpus else ("inference" if h.model == "L40S" else "training")
        r = rng.random()
        (lost if r < LOST_SHARE else suspect if r < LOST_SHARE + SUSPECT_SHARE else live).append(h)
    ids = [h.id for h in live]
    picked = rng.sample(ids, max(1, round(n * CORDONED_SHARE)) + max(1, round(n * DRAINED_SHARE)))
    k = max(1, round(n * CORDONED_SHARE))
    return FleetPlan(hosts, live, suspect, lost, sorted(picked[:k]), sorted(picked[k:]))


async def publish_once(nats_url: str, hosts: list[tuple[HostSpec, str]]) -> None:
    """One heartbeat per host with the given TTL, then no more (SUSPECT, then LOST)."""
    nc = await natsclient.connect(nats_url.split(","), name="bench-operator-once")
    try:
        boot = os.urandom(8).hex()
        for spec, ttl in hosts:
            h = VariedSimHost(spec, boot)
            await nc.publish(h.subject, h.heartbeat(time.time()), headers={"Nats-TTL": ttl, SHAPE_HEADER: h.shape})
        await nc.flush(timeout=30)
    finally:
        await nc.close()
