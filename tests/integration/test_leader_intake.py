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


async def test_one_subject_cannot_fill_the_submit_stream_and_its_client_is_told_so(store: Store) -> None:
    """Found by exploring: one user's runaway script filled SUBMIT (100,000 messages) and
    every other submitter was refused, with a bare 503 tried again for 10 s. Each subject
    now holds at most SUBMIT_PER_SUBJECT messages not yet taken (the others' still pass),
    and submit_over_nats raises SubmissionsWaiting at once. Shown with the cap lowered to 3."""
    import dataclasses

    from server.state.streams import SUBMIT_PER_SUBJECT, stream_configs
    from wire.errors import SubmissionsWaiting
    from wire.submit import submit_over_nats

    info = await store.js.stream_info(subjects.SUBMIT_STREAM)
    assert info.config.max_msgs_per_subject == SUBMIT_PER_SUBJECT and info.config.discard_new_per_subject
    cfg = next(c for c in stream_configs(1) if c.name == subjects.SUBMIT_STREAM)
    await store.js.update_stream(dataclasses.replace(cfg, max_msgs_per_subject=3))
    job = {"name": "t", "command": ["true"]}
    for _ in range(3):
        await submit_over_nats(store.js, [job], user="alice", within_s=3)
    with pytest.raises(SubmissionsWaiting, match="muster.submit.alice holds as many submissions") as refused:
        await submit_over_nats(store.js, [job], user="alice", within_s=3)
    assert len(refused.value.job_ids) == 1  # type: ignore[attr-defined]
    await submit_over_nats(store.js, [job], user="bob", within_s=3)
    await submit_over_nats(store.js, [job], user="alice", queue="research", within_s=3)  # another subject
    assert (await store.js.stream_info(subjects.SUBMIT_STREAM)).state.messages == 5


async def test_a_submit_stream_made_by_an_earlier_version_gets_the_per_subject_cap_at_start(nats_url: str) -> None:
    """ensure_streams (a server's start) updates a SUBMIT stream made without the cap, and
    keeps what it holds."""
    import dataclasses

    from server.state.streams import SUBMIT_PER_SUBJECT, stream_configs

    nc = await connect(nats_url, name="old")
    try:
        s = Store(nc)
        cfg = next(c for c in stream_configs(1) if c.name == subjects.SUBMIT_STREAM)
        await s.js.add_stream(dataclasses.replace(cfg, max_msgs_per_subject=-1, discard_new_per_subject=False))
        await s.js.publish(subjects.submit_subject("alice"), b"{}")
        await ensure_streams(s)
        info = await s.js.stream_info(subjects.SUBMIT_STREAM)
        assert info.config.max_msgs_per_subject == SUBMIT_PER_SUBJECT and info.config.discard_new_per_subject
        assert info.state.messages == 1
    finally:
        await nc.close()


async def test_a_list_past_max_payload_is_stored_in_messages_that_fit(store: Store) -> None:
    """Found by exploring: 500 jobs of a few KiB each were one message past the server's
    max_payload (1 MiB here), refused whole; now they are split to fit and stored."""
    from wire.messages import SubmitRequest as Request
    from wire.submit import submit_over_nats

    jobs = [{"name": "t", "command": ["true"], "env": {"DATA": "x" * 4000}} for _ in range(500)]
    ids = await submit_over_nats(store.js, jobs, user="alice", within_s=0)
    info = await store.js.stream_info(subjects.SUBMIT_STREAM)
    assert info.state.messages >= 2
    stored = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await store.js.get_msg(subjects.SUBMIT_STREAM, seq)
        assert len(msg.data) <= store.nc.max_payload
        stored += [j["id"] for j in Request.model_validate_json(msg.data).jobs]
    assert stored == ids
