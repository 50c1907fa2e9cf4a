"""A lost assignment is sent again (scheduling.delivery), against a real nats-server and a
real replica: the host is played by the test, which heartbeats, drops the first
republish of its assignment record as a lost core NATS message would be, and expects the
leader to send the same record again; once it reports the task running, nothing more
comes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server.replica import Muster, ServerConfig
from tests.conftest import eventually
from tests.factories import heartbeat
from wire import subjects
from wire.messages import AttemptState, HostAlloc, StatusReport, decode, encode


@pytest.fixture
async def replica(nats_url: str, tmp_path: Path) -> AsyncIterator[Muster]:
    mu = Muster(ServerConfig(nats_url=nats_url, data_dir=tmp_path / "data", name="delivery-test",
                             heartbeat_interval_s=1.0))
    await mu.start()
    try:
        yield mu
    finally:
        await mu.shutdown()


async def test_an_assignment_the_agent_never_got_is_sent_again_until_the_task_runs(replica: Muster) -> None:
    mu = replica
    assert mu.store is not None
    nc = mu.store.nc
    host = "deaf-1"
    got: list[tuple[int, HostAlloc]] = []

    async def on_assign(msg) -> None:  # type: ignore[no-untyped-def]
        got.append((int((msg.headers or {}).get("Nats-Sequence", "0")), decode(HostAlloc, msg.data)))

    sub = await nc.subscribe(subjects.assign_subject(host), cb=on_assign)
    stop = asyncio.Event()

    async def heartbeats() -> None:
        while not stop.is_set():
            hb = heartbeat(host, seq=0, ts=time.time(), gpus=2)
            await mu.store.put(host, encode(hb), bucket=subjects.HOSTS_BUCKET, ttl="10s")
            await asyncio.sleep(0.5)

    beat = asyncio.create_task(heartbeats())
    try:
        await eventually(lambda: host in mu.state.hosts, timeout=30, what="the host seen")
        job = await mu.submit({"name": "one", "command": ["true"], "gpus": 1}, "op")
        await eventually(lambda: len(got) >= 1, timeout=30, what="the first republish")
        first_seq, first = got[0]
        assert [t.job_id for t in first.tasks] == [job.id]
        # The first copy is "lost": the host does nothing. The leader sends the same
        # record again (redeliver_after_s: two heartbeat intervals, 2 s here).
        await eventually(lambda: len(got) >= 2, timeout=60, what="the assignment sent again")
        seq, again = got[1]
        assert seq == first_seq == mu.state.revisions[subjects.alloc_key(host)]
        assert again == first
        # The host starts the task and says so: nothing more is sent.
        task = first.tasks[0]
        report = StatusReport(host_id=host, attempt_id=task.attempt_id, job_id=job.id, state=AttemptState.RUNNING,
                              ts=time.time())
        await mu.store.js.publish(f"{subjects.STATUS_PREFIX}.{host}", encode(report))
        await eventually(lambda: job.id not in mu.state.placed_ids and mu.state.jobs[job.id].state.value == "RUNNING",
                         timeout=30, what="the task running")
        sent = len(got)
        # Three more redelivery periods: nothing is sent for a running task.
        await asyncio.sleep(6)
        assert len(got) == sent
    finally:
        stop.set()
        await beat
        await sub.unsubscribe()
