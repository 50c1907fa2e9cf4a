"""The store's pure parts, without a nats-server: how a starting server waits for its
watches, and the fast read of a JetStream delivery's position from its reply subject."""

from __future__ import annotations

import asyncio

import pytest


async def test_server_waits_for_a_watch_while_it_makes_progress_and_gives_up_when_it_stalls() -> None:
    """A server loads its whole state before serving: a big state (500,000 live jobs take
    about a minute) is waited for as long as records keep coming; a stalled watch is
    given up on instead of blocking the start for ever."""
    from types import SimpleNamespace

    from server.replica import Muster

    w = SimpleNamespace(bucket="state", synced=asyncio.Event(), received=0)

    async def feed() -> None:
        for _ in range(8):  # records keep arriving for longer than the stall limit
            await asyncio.sleep(0.05)
            w.received += 1000
        w.synced.set()

    feeder = asyncio.create_task(feed())
    await Muster._wait_synced(w, stall_s=0.2, every_s=0.04)  # type: ignore[arg-type]
    await feeder
    assert w.synced.is_set() and w.received == 8000

    stalled = SimpleNamespace(bucket="hosts", synced=asyncio.Event(), received=5)
    await Muster._wait_synced(stalled, stall_s=0.2, every_s=0.04)  # type: ignore[arg-type]
    assert not stalled.synced.is_set()  # returned without it: gave up


@pytest.mark.parametrize("reply", [
    "$JS.ACK.KV_hosts.abc123.1.4711.4711.1764500000000000000.0",
    "$JS.ACK.KV_hosts.abc123.3.18446744073709.2.1764500000000000000.917",
    "$JS.ACK._.ACCHASH.KV_hosts.abc123.1.4711.9.1764500000000000000.12",
    "$JS.ACK.hub.ACCHASH.KV_hosts.abc123.1.4711.9.1764500000000000000.0.xyz",
])
def test_ack_position_reads_what_nats_py_reads(reply: str) -> None:
    """The watch's fast read of a delivery's stream sequence and pending count agrees
    with nats-py's Msg.metadata on both reply subject forms."""
    from nats.aio.msg import Msg

    from wire.records import ack_position

    meta = Msg.Metadata._from_reply(reply)
    seq, pending, stamp = ack_position(reply)  # type: ignore[misc]
    assert (seq, pending) == (meta.sequence.stream, meta.num_pending)
    assert stamp == pytest.approx(meta.timestamp.timestamp(), abs=1e-6)


@pytest.mark.parametrize("reply", [None, "", "_INBOX.abc.1", "$JS.ACK.too.short", "$JS.ACK.a.b.c.x.y.z.w"])
def test_ack_position_refuses_what_is_not_a_delivery(reply: str | None) -> None:
    from wire.records import ack_position

    assert ack_position(reply) is None


def test_delivery_position_falls_back_to_nats_py_and_refuses_the_rest() -> None:
    """delivery_position reads both reply forms as nats-py does, and what is no
    JetStream delivery raises nats-py's own error (from the metadata fallback)."""
    from nats.aio.msg import Msg
    from nats.errors import NotJSMessageError

    from wire.kv import delivery_position

    fast = "$JS.ACK.KV_hosts.abc123.1.4711.9.1764500000000000000.12"
    assert delivery_position(Msg(None, subject="x", reply=fast)) == (4711, 12, 1764500000.0)  # type: ignore[arg-type]
    odd = "$JS.ACK.hub.ACCHASH.KV_hosts.abc123.1.4711.9.1764500000000000000.3.xyz.more"
    meta = Msg.Metadata._from_reply(odd)
    assert delivery_position(Msg(None, subject="x", reply=odd)) == (  # type: ignore[arg-type]
        meta.sequence.stream, meta.num_pending, meta.timestamp.timestamp())
    with pytest.raises(NotJSMessageError):
        delivery_position(Msg(None, subject="x", reply="_INBOX.abc.1"))  # type: ignore[arg-type]
