"""Trying an operation again while NATS cannot take it, for up to a window: the one loop
behind `Store.create`, `Store.commit` and `submit_over_nats` waiting out a stream's
election (a node lost). Which failures are worth another try is the caller's to say: a
refusal that trying again cannot change (a conflict, a record past `max_payload`) is
raised at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# How long a submission waits out NATS not taking writes (a stream electing its leader
# after a node was lost: 5-10 s): the API's (server.replica) and submit_over_nats'.
SUBMIT_RETRY_S = 10.0


async def within(op: Callable[[], Awaitable[T]], within_s: float, every_s: float,
                 again: Callable[[Exception], bool]) -> T:
    """`op()`'s result; a failure that `again` accepts is tried again every `every_s`
    until `within_s` has passed (0: never), then raised; any other is raised at once."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await op()
        except Exception as exc:
            if not again(exc) or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(every_s)
