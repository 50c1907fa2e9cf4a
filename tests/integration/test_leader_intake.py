"""The leader's intake of its input streams against a real nats-server: what a backlog of
submissions becomes (each message handled once, the leader holding only a few cycles'
worth), and what a flood by one submitter leaves to the others."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from server.scheduling import scheduler as scheduler_module
from server.scheduling.scheduler import Scheduler, SchedulerConfig
from server.state.cluster import ClusterState
from server.state.lease import Leadership, LeaseConfig
from server.state.streams import ensure_streams
from tests.conftest import eventually
from wire import subjects
from wire.kv import Store, connect
from wire.messages import SubmitRequest, encode


@pytest.fixture
async def store(nats_url: str):  # type: ignore[no-untyped-def]
    nc = await connect(nats_url, name="test")
    s = Store(nc)
    await ensure_streams(s)
    yield s
    await nc.close()


async def test_a_backlog_of_submissions_is_handled_once_each_and_held_a_few_cycles_at_a_time(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: the leader pulled every waiting submission at once, its cycles
    take 100 a time, and those it held past the consumer's ack_wait (lease TTL + 1 s) were
    delivered again and queued a second time (30,000 submissions: 69,105 deliveries). Now
    it pulls no more than a few cycles take, marks what it holds in progress, and drops a
    delivery of a message it holds already."""
    n = 1_500
    for i in range(0, n, 250):
        await asyncio.gather(*(store.js.publish(subjects.submit_subject("alice"), encode(SubmitRequest(
            user="alice", jobs=[{"id": f"backlog-{k:06d}", "name": "b", "command": ["true"], "held": True}])))
            for k in range(i, i + 250)))
    state = ClusterState(heartbeat_interval_s=60)
    await store.watch(">", state.apply_state_record)
    lead = Leadership(store, "a", LeaseConfig(ttl_s=1, renew_every_s=0.3))  # ack_wait 2 s
    sched = Scheduler(store, state, lead, SchedulerConfig(tick_s=0.2))
    handled: list[int] = []  # stream sequences of the submissions decoded
    decode = sched._decode_submission

    def counting(m: Any) -> SubmitRequest | None:
        handled.append(m.metadata.sequence.stream)
        return decode(m)

    monkeypatch.setattr(sched, "_decode_submission", counting)
    real_plan = scheduler_module.plan_cycle

    def slow_plan(*args: Any, **kw: Any) -> Any:
        time.sleep(0.15)  # a busy leader: the backlog takes several ack_waits to work off
        return real_plan(*args, **kw)

    monkeypatch.setattr(scheduler_module, "plan_cycle", slow_plan)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(lead.run(stop)), asyncio.create_task(sched.run(stop))]
    most = 0
    try:
        def done() -> bool:
            nonlocal most
            most = max(most, len(sched._submissions))
            return sum(1 for j in state.jobs if j.startswith("backlog-")) == n

        await eventually(done, timeout=120, what="every job created")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert sorted(handled) == sorted(set(handled)) and len(handled) == n
    # At most what five cycles take (three commits in flight, one planned, one more).
    assert most <= 5 * 100, most
    assert (await store.js.stream_info(subjects.SUBMIT_STREAM)).state.messages == 0
