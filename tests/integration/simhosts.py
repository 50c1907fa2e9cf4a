"""Simulated hosts for tests: heartbeats published straight to the `hosts` bucket.

`SimHosts` runs one asyncio loop in a background thread. It publishes one Heartbeat per
simulated host on `$KV.hosts.<host_id>` (core NATS publish, header `Nats-TTL`), in
batches followed by `flush()`, and keeps republishing every `interval_s` seconds, as
real agents do, so the keys do not expire while a test looks at them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import nats
from agent.agent import AgentConfig
from tests.factories import heartbeat
from wire import subjects
from wire.messages import Heartbeat, encode


def sim_host_id(i: int) -> str:
    return f"sim-{i:05d}"


def sim_heartbeat(i: int, seq: int, boot_id: str, gpus: int = 8) -> Heartbeat:
    return heartbeat(sim_host_id(i), boot_id=boot_id, seq=seq, ts=time.time(),
                     labels={"rack": f"r{i % 50:02d}", "zone": f"z{i % 4}"}, gpus=gpus, gpu_memory_mb=81559,
                     uuids=[f"SIM-{i:05d}-{g}" for g in range(gpus)], temp_c=35.0, power_w=70.0, cpus=64,
                     memory_mb=512 * 1024, cpu_pct=1.0, mem_used_mb=8192, simulated=True, agent_version="sim")


class SimHosts:
    """Publish heartbeats of hosts sim-00001 .. sim-<count> until stopped, every
    `interval_s`, each key living as many intervals as an agent's does."""

    def __init__(self, nats_url: str, count: int, *, interval_s: float = 5.0, batch: int = 500) -> None:
        self.nats_url = nats_url
        self.count = count
        self.ttl = f"{int(interval_s * AgentConfig.ttl_intervals)}s"
        self.interval_s = interval_s
        self.batch = batch
        self.boot_id = uuid.uuid4().hex[:16]
        self.rounds = 0
        self.first_round = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="simhosts", daemon=True)

    def start(self) -> SimHosts:
        self._thread.start()
        return self

    def wait_published(self, timeout: float = 60) -> None:
        """Block until every host has been published once (or raise the thread's error)."""
        if not self.first_round.wait(timeout):
            raise AssertionError(f"simulated heartbeats not all published after {timeout}s")
        if self.error is not None:
            raise AssertionError(f"publishing simulated heartbeats failed: {self.error!r}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def __enter__(self) -> SimHosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ the thread

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self.first_round.set()

    async def _run(self) -> None:
        nc = await nats.connect(self.nats_url, name="simhosts", max_reconnect_attempts=5)
        try:
            headers = {"Nats-TTL": self.ttl}
            while not self._stop.is_set():
                started = time.monotonic()
                self.rounds += 1
                for i in range(1, self.count + 1):
                    hb = sim_heartbeat(i, self.rounds, self.boot_id)
                    await nc.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, hb.host_id), encode(hb),
                                     headers=headers)
                    if i % self.batch == 0:
                        await nc.flush()
                await nc.flush()
                self.first_round.set()
                rest = self.interval_s - (time.monotonic() - started)
                while rest > 0 and not self._stop.is_set():
                    await asyncio.sleep(min(rest, 0.2))
                    rest -= 0.2
        finally:
            await nc.drain()
