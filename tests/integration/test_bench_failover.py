"""The failover benchmark's load (bench.failover.submit_load) against a nats-server that
stops answering for a while: every job it counts as submitted is in the submission
stream, and no job is there that it does not count."""

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
    Sent again with the same ids, the stored try's jobs are the resend's (the leader
    creates each id once, tests/unit/test_nats_intake.py); sent as new jobs (as the
    benchmark once did) they would run uncounted."""
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
        assert set(stored) == set(submitted)  # none stored that the benchmark does not count
    finally:
        await nc.close()


async def test_the_jobs_waiting_in_the_submission_stream_at_the_end_are_read_without_taking_them(
        nats: NatsProcess) -> None:
    """At its end the benchmark reads which submissions no leader has taken in yet
    (Bench.waiting_submissions): its backlog, not lost work. Reading takes nothing away."""
    from types import SimpleNamespace

    from bench.run import Bench
    from wire.submit import submit_over_nats

    nc = await connect(nats.url, name="test")
    try:
        await ensure_streams(Store(nc, timeout=5.0))
        js = nc.jetstream()
        await submit_over_nats(js, [{"id": f"jwait{i}", "name": "w", "command": ["true"]} for i in range(3)],
                               user="bench")
        await submit_over_nats(js, [{"id": "jwait9", "name": "w", "command": ["true"]}], user="bench")
        bench = SimpleNamespace(js=js, notes=[])
        assert await Bench.waiting_submissions(bench) == {"jwait0", "jwait1", "jwait2", "jwait9"}  # type: ignore[arg-type]
        assert (await js.stream_info(subjects.SUBMIT_STREAM)).state.messages == 2  # still there
        assert await Bench.waiting_submissions(bench, most=1) == {"jwait0", "jwait1", "jwait2"}  # type: ignore[arg-type]
        assert bench.notes == []
    finally:
        await nc.close()
