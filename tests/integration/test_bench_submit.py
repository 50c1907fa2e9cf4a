"""The benchmark's NATS submitter sends a failed submission again, as a client would."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.run import Bench
from bench.workload import JobReq
from server.broker.natsd import start_nats
from server.state.streams import ensure_streams
from tests.conftest import eventually
from wire import subjects
from wire.kv import Store, connect


async def test_a_failed_nats_submission_is_sent_again_with_the_same_ids_and_stored_once(tmp_path: Path) -> None:
    """No SUBMIT stream yet: the publish finds no responders and the batch is not counted.
    Once the stream exists, the retry stores it; its jobs count from the first try, and
    the stream holds one message (a further retry of the same ids would be dropped)."""
    natsd = start_nats(tmp_path / "n", port=0)
    nc = await connect(natsd.url, name="bench-submit")
    try:
        b = Bench(argparse.Namespace(submit_via="nats"), tmp_path / "work")
        b.js = nc.jetstream(timeout=2)
        batch = [JobReq(name=f"r{i}", gpus=1, cpus=1, memory_mb=64, duration_s=1.0) for i in range(3)]
        await b.submit_batch(None, batch)  # type: ignore[arg-type]  # the NATS path needs no HTTP client
        assert len(b.retrying) == 1 and not b.submitted and b.submit_errors == 0
        first_try = b.last_submit_ts
        await ensure_streams(Store(nc))
        await eventually(lambda: not b.retrying, timeout=30, what="the retry to end")
        assert b.submit_retried_ok == 3 and b.submit_errors == 0 and not b.in_doubt
        assert [req.name for _, req in b.submitted.values()] == ["r0", "r1", "r2"]
        assert {ts for ts, _ in b.submitted.values()} == {first_try}
        info = await nc.jetstream().stream_info(subjects.SUBMIT_STREAM)
        assert info.state.messages == 1
    finally:
        await nc.close()
        natsd.stop()


async def test_a_submission_never_stored_is_given_up_in_doubt(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No stream ever: after the retry period the jobs count as errors, and are kept as
    in doubt (a publish that timed out may have been stored, so such a job may still run)."""
    import bench.run

    monkeypatch.setattr(bench.run, "SUBMIT_RETRY_S", 2.5)
    natsd = start_nats(tmp_path / "n", port=0)
    nc = await connect(natsd.url, name="bench-submit")
    try:
        b = Bench(argparse.Namespace(submit_via="nats"), tmp_path / "work")
        b.js = nc.jetstream(timeout=1)
        await b.submit_batch(None, [JobReq(name="x", gpus=0, cpus=1, memory_mb=64, duration_s=1.0)])  # type: ignore[arg-type]
        await eventually(lambda: not b.retrying, timeout=30, what="the retry to give up")
        assert b.submit_errors == 1 and len(b.in_doubt) == 1 and not b.submitted and b.submit_retried_ok == 0
    finally:
        await nc.close()
        natsd.stop()
