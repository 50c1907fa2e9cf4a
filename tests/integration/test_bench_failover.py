"""The failover benchmark's load (bench.failover.submit_load) against a nats-server that
stops answering for a while: every job it counts as submitted is in the submission
stream once, and no job is there that it does not count."""

from __future__ import annotations

import asyncio

from bench.failover import submit_load
from server.broker.natsd import NatsProcess
from server.state.streams import ensure_streams
from tests.conftest import frozen
from wire import subjects
from wire.kv import Store, connect
from wire.messages import SubmitRequest


async def test_a_failed_batch_is_sent_again_with_its_ids(nats: NatsProcess) -> None:
    """Frozen (SIGSTOP) for longer than a publish's timeout: the tries sent meanwhile
    reach the server when it runs again, so a batch whose publish failed may be stored.
    Sent again with the same ids it is stored once; sent as new jobs (as the benchmark
    once did) the stored try's jobs would run uncounted."""
    nc = await connect(nats.url, name="test")
    try:
        await ensure_streams(Store(nc, timeout=1.0))
        submitted: dict[str, float] = {}
        load = asyncio.create_task(submit_load(nats.url, rate=50, duration=6, submitted=submitted,
                                               publish_timeout=0.5))
        await asyncio.sleep(1.5)
        with frozen(nats.proc.pid):
            await asyncio.sleep(2.0)  # several publishes time out meanwhile
        await asyncio.wait_for(load, timeout=60)
        js = nc.jetstream()
        info = await js.stream_info(subjects.SUBMIT_STREAM)
        stored: list[str] = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(subjects.SUBMIT_STREAM, seq)
            stored += [str(j["id"]) for j in SubmitRequest.model_validate_json(msg.data).jobs]
        assert len(submitted) > 100  # the load ran before and after the freeze
        assert len(stored) == len(set(stored))  # no job stored twice
        assert set(stored) == set(submitted)  # none stored that the benchmark does not count
    finally:
        await nc.close()
