"""The scheduler's loop when leading is interrupted, in-process with a stand-in for the
leadership: expected errors (a fenced commit, a NATS timeout) are one warning line, any
other is logged with its traceback, and the loop keeps going until told to stop."""

from __future__ import annotations

import asyncio

import pytest

from server.scheduling.scheduler import Scheduler
from server.state.cluster import ClusterState


def test_interrupted_leading_logs_expected_errors_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """A fenced commit or a NATS timeout is part of a cluster's life: one warning line,
    then the scheduler leads again. Anything else is a bug: logged with its traceback.
    The scheduler keeps going either way, and stops when told."""
    import logging

    import nats.errors

    from wire.errors import FencedError

    class Leading:
        leading = True
        term = 1
        changed = asyncio.Event()

    async def main() -> list[logging.LogRecord]:
        stop = asyncio.Event()
        sched = Scheduler(None, ClusterState(), Leading())  # type: ignore[arg-type]
        errors = [FencedError("term 1 superseded by 2"), nats.errors.TimeoutError(), ValueError("a bug")]

        async def lead(_stop: asyncio.Event) -> None:
            if not errors:
                stop.set()
                return
            raise errors.pop(0)

        sched._lead = lead  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="server.scheduling.scheduler"):
            await asyncio.wait_for(sched.run(stop), timeout=30)
        return [r for r in caplog.records if r.name == "server.scheduling.scheduler"]

    records = asyncio.run(main())
    assert [(r.levelno, r.exc_info is not None) for r in records] == [
        (logging.WARNING, False), (logging.WARNING, False), (logging.ERROR, True)]
    assert "FencedError: term 1 superseded by 2" in records[0].getMessage()
    assert "TimeoutError" in records[1].getMessage()
