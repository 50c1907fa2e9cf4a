"""How every loop in Muster waits between rounds: for a while, or until told to stop."""

from __future__ import annotations

import asyncio


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds`, or only until `stop` is set. Returns whether `stop` is set."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass
    return stop.is_set()
