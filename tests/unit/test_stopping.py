"""wire.stopping.pause: how loops wait between rounds."""

from __future__ import annotations

import asyncio

import pytest

from wire.stopping import pause


async def test_pause_runs_out_when_not_stopped() -> None:
    assert await pause(asyncio.Event(), 0.01) is False


@pytest.mark.timeout(60)
async def test_pause_ends_when_stop_is_set() -> None:
    stop = asyncio.Event()
    waiting = asyncio.create_task(pause(stop, 3600))  # would outlast the test's timeout
    await asyncio.sleep(0)
    assert not waiting.done()
    stop.set()
    assert await waiting is True


async def test_pause_when_already_stopped() -> None:
    stop = asyncio.Event()
    stop.set()
    assert await pause(stop, 3600) is True
