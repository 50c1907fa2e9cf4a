"""server.state.consumers.Held: what a feed's reader holds, by stream sequence, and what
it tells the feed (room to pull, messages to mark in progress). No NATS: messages are
stood in for by their reply subjects."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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
