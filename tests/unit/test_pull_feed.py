"""server.state.consumers without NATS: `Held`, what a feed's reader holds, by stream
sequence, and what it tells the feed (room to pull, messages to mark in progress); and how
far a feed says it has read after a pull request that found nothing more. Messages are
stood in for by their reply subjects and status headers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from server.state.consumers import Held


def _msg(seq: int, delivered: int = 1) -> Any:
    return SimpleNamespace(reply=f"$JS.ACK.SUBMIT.scheduler-submit.{delivered}.{seq}.{seq}.1700000000000000000.0")


def test_a_message_delivered_again_while_held_is_dropped_and_settling_frees_room() -> None:
    held = Held(limit=3, ack_wait_s=6.0)
    assert held.room() == 3
    assert held.add(_msg(1), 0.0) and held.add(_msg(2), 0.0)
    assert not held.add(_msg(1, delivered=2), 7.0)  # its ack_wait passed: delivered again
    assert (len(held), held.again, held.room()) == (2, 1, 1)
    assert held.add(_msg(3), 1.0) and held.room() == 0
    held.settle(_msg(1, delivered=2))  # whichever delivery settles it
    assert held.room() == 1 and held.add(_msg(1, delivered=3), 8.0)  # settled: a new delivery is new
    held.settle(_msg(99))  # one not held: nothing
    assert len(held) == 3
    # A message that is no JetStream delivery cannot be told apart: taken, never held.
    assert held.add(SimpleNamespace(reply=None), 0.0) and len(held) == 3


def test_what_was_held_half_the_ack_wait_is_marked_in_progress_once_per_half() -> None:
    held = Held(limit=10, ack_wait_s=6.0)
    held.add(_msg(1), 0.0)
    held.add(_msg(2), 2.0)
    assert held.due(2.9) == []
    assert [m.reply for m in held.due(3.0)] == [_msg(1).reply]
    assert held.due(4.9) == []
    assert sorted(m.reply for m in held.due(6.0)) == sorted([_msg(1).reply, _msg(2).reply])
    held.settle(_msg(1))
    assert [m.reply for m in held.due(9.0)] == [_msg(2).reply]


async def test_a_pull_request_that_found_nothing_more_says_read_only_up_to_when_it_was_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`read_to` after a 408 (a request that waited its `expires` for nothing more) or a 404:
    the messages stored up to the server's answer were handed over, not those stored until
    the answer is read (found by a test that failed now and then on a loaded machine: a
    reader behind on the request's messages read the 408 late, and said read messages
    stored meanwhile). The answer's time is bounded by the request's sending plus its wait."""
    import time

    from server.state.consumers import PullFeed

    async def on_msg(m: Any) -> None:
        pass

    feed = PullFeed(None, "STATUS", "c", on_msg, expires_s=2.0)  # type: ignore[arg-type]
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    feed._asked_at = 1000.0
    clock[0] = 1009.0  # read 7 s after the server's answer
    await feed._cb(SimpleNamespace(headers={"Status": "408"}, reply=""))  # type: ignore[arg-type]
    assert feed.read_to == 1002.0
    feed._asked_at = 1009.0
    clock[0] = 1009.5
    await feed._cb(SimpleNamespace(headers={"Status": "408"}, reply=""))  # read sooner than the wait's end
    assert feed.read_to == 1009.5
    feed._asked_at = 1010.0
    clock[0] = 1011.0
    await feed._cb(SimpleNamespace(headers={"Status": "404"}, reply=""))
    assert feed.read_to == 1010.0
