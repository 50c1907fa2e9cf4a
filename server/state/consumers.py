"""Reading a durable JetStream pull consumer with a callback.

nats-py's `fetch()` hands over a batch one `asyncio.wait_for(next_msg())` at a time,
which costs an event-loop turn per message: on a busy leader (thousands of heartbeats
and watch records a second sharing the loop) that held status reports to ~300/s while
1,000/s arrived. `PullFeed` keeps one pull request of up to `batch` messages outstanding
(a long poll that ends after `expires_s`) and receives the messages on a plain
subscription whose callback sees each one as soon as it is parsed. Acknowledgement stays
with whoever handles the message (`Msg.ack()` works on these as on fetched ones).

`read_to` says how far the stream has been handed over: every message the store stored
before that time (its clock, seconds) has been given to `on_msg`. A message moves it to
when it was stored (the stream delivers in order); a pull request that ends with 404 or 408 having
found nothing more moves it to when the server answered so, at the latest: when the
request was sent, plus its wait for a 408 (the local clock, which must be kept close to
the store's, as for host health), or when the answer is read if that is sooner. Not when
the answer is read: a reader behind on the messages before it reads it late, and the
messages stored meanwhile, for the next request, were said read (found by a test that
failed now and then on a loaded machine). The consumer must not be paused: a
paused consumer lets requests expire with messages waiting. A message handed to an
earlier reader (a leader that died) and not acknowledged comes back only after the
consumer's `ack_wait`, so a new reader learns nothing from what it reads before then:
`read_to` stays 0 until `trust_after` (local time; the scheduler passes its start plus
`ack_wait`).

A reader that handles messages later than it receives them (the scheduler queues them
for its cycles and acknowledges each once its cycle committed) passes a `Held`: the
messages it was handed and has not settled yet. The feed then asks for no more than
`Held.room()` (back-pressure: what is held is taken by the reader well within the
consumer's `ack_wait`, and the rest waits in the stream), and marks each message held
for half the `ack_wait` in progress, which starts its `ack_wait` again. A message held
past its `ack_wait` all the same (the event loop blocked) is delivered again: `Held.add`
tells the reader it holds that one already, by its stream sequence, and the reader
drops the second delivery (acknowledging the first delivery settles the message).
Found by exploring: with 30,000 submissions waiting, the leader pulled them all, held
them past the 6 s `ack_wait`, and queued 69,105 deliveries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js.errors import NotFoundError

from wire.records import ack_position
from wire.stopping import pause

log = logging.getLogger(__name__)

# Status codes that end a pull request: 404 no messages, 408 request expired, 409
# (leadership change, consumer deleted, too many waiting requests...).
_IDLE_HEARTBEAT = "100"
# A pull request that ends with these found nothing more to deliver (no wait / expired).
_NOTHING_MORE = ("404", "408")


async def ensure_consumer(js: JetStreamContext, stream: str, durable: str, subject: str,
                          config: jsapi.ConsumerConfig) -> None:
    """Create the durable pull consumer unless it exists (as `pull_subscribe` does)."""
    try:
        await js.consumer_info(stream, durable)
        return
    except NotFoundError:
        pass
    config.filter_subject = subject
    config.name = durable
    config.durable_name = durable
    await js.add_consumer(stream, config=config)


def stream_sequence(msg: Msg) -> int | None:
    """A delivered message's sequence in its stream (from its reply subject); None if not
    a JetStream delivery."""
    pos = ack_position(msg.reply)
    return pos[0] if pos is not None else None


class Held:
    """The messages a feed's reader was handed and has not settled (acknowledged, or given
    back to the stream), by stream sequence, with when each was handed or last marked in
    progress (the caller's monotonic clock). No I/O: the feed sends what `due` returns."""

    def __init__(self, limit: int, ack_wait_s: float) -> None:
        self.limit = limit  # the most held at once: the feed pulls no more
        self.ack_wait_s = ack_wait_s  # the consumer's
        self._held: dict[int, tuple[Msg, float]] = {}
        self.again = 0  # deliveries of a message held already, dropped

    def __len__(self) -> int:
        return len(self._held)

    def add(self, msg: Msg, now: float) -> bool:
        """Hold a delivered message; False if it is held already (delivered again after its
        ack_wait: the reader drops this delivery and settles the first)."""
        seq = stream_sequence(msg)
        if seq is None:
            return True
        if seq in self._held:
            self.again += 1
            return False
        self._held[seq] = (msg, now)
        return True

    def settle(self, msg: Msg) -> None:
        """The message was acknowledged or given back: no longer held."""
        seq = stream_sequence(msg)
        if seq is not None:
            self._held.pop(seq, None)

    def room(self) -> int:
        """How many more messages the feed may ask for."""
        return max(0, self.limit - len(self._held))

    def due(self, now: float) -> list[Msg]:
        """The messages held for half the ack_wait or more since they were handed or last
        marked in progress: to mark in progress now (taken as marked at `now`)."""
        since = now - self.ack_wait_s / 2
        out = [m for m, at in self._held.values() if at <= since]
        for m in out:
            seq = stream_sequence(m)
            assert seq is not None
            self._held[seq] = (m, now)
        return out


class PullFeed:
    def __init__(self, nc: NATS, stream: str, consumer: str, on_msg: Callable[[Msg], Awaitable[None]],
                 batch: int = 500, expires_s: float = 2.0, trust_after: float = 0.0,
                 redelivered_after_s: float = 0.0, held: Held | None = None) -> None:
        self.nc = nc
        self.stream = stream
        self.consumer = consumer
        self.on_msg = on_msg
        self.batch = batch
        self.expires_s = expires_s
        self.delivered = 0
        self.requests = 0
        self._n = 0
        self._ended = asyncio.Event()
        self._status: str | None = None
        self.read_to = 0.0
        self.trust_after = trust_after
        # The consumer's ack_wait: what a feed that starts again had been handed and not
        # acknowledged (in its old inbox) comes back only after it.
        self.redelivered_after_s = redelivered_after_s
        # What the reader holds (module docstring): the feed pulls at most its room, and
        # marks what it has held for half the ack_wait in progress.
        self.held = held
        self._want = batch  # the batch of the pull request outstanding
        self._asked_at = 0.0  # when it was sent (local clock)
        self.waited = 0  # pull requests held back for want of room

    async def _cb(self, msg: Msg) -> None:
        status = msg.headers.get(jsapi.Header.STATUS) if msg.headers else None
        if status:
            if status != _IDLE_HEARTBEAT:
                self._status = status
                self._ended.set()
            if status in _NOTHING_MORE and (now := time.time()) >= self.trust_after:
                answered = self._asked_at + (self.expires_s if status == "408" else 0.0)
                self.read_to = max(self.read_to, min(now, answered))
            return
        self._n += 1
        self.delivered += 1
        try:
            await self.on_msg(msg)
        except Exception:  # noqa: BLE001 - one bad message must not stop the feed
            log.exception("pull feed %s/%s: handling a message failed", self.stream, self.consumer)
        pos = ack_position(msg.reply)
        if pos is not None and pos[2] > self.read_to and time.time() >= self.trust_after:
            self.read_to = pos[2]
        if self._n >= self._want:
            self._ended.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Pull until `stop` is set (or the task is cancelled); then unsubscribe.
        Messages delivered but not acknowledged return after the consumer's ack_wait. An
        error it did not foresee is logged and the feed starts again a second later: a
        feed that died would leave the leader reading no more of its stream (status
        reports: no try would be seen to end) while it went on leading."""
        failed = ""
        keeper = asyncio.create_task(self._keep_in_progress(stop)) if self.held is not None else None
        try:
            while not stop.is_set():
                try:
                    await self._run(stop)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    if repr(exc) != failed:  # (a traceback once, not every second)
                        failed = repr(exc)
                        log.exception("pull feed %s/%s failed: starting it again", self.stream, self.consumer)
                    else:
                        log.warning("pull feed %s/%s failed again: %s", self.stream, self.consumer, exc)
                    # Until what the old feed was handed comes back, how far the stream has been
                    # read cannot be told (a review: the new feed's "nothing more" said so at once).
                    self.trust_after = max(self.trust_after, time.time() + self.redelivered_after_s)
                    await pause(stop, 1.0)
        finally:
            if keeper is not None:
                keeper.cancel()
                await asyncio.gather(keeper, return_exceptions=True)

    async def _keep_in_progress(self, stop: asyncio.Event) -> None:
        """Mark the messages held for half the ack_wait in progress (`+WPI`), looking a few
        times per ack_wait, until `stop`."""
        held = self.held
        assert held is not None
        every = max(0.05, min(1.0, held.ack_wait_s / 6))
        while not await pause(stop, every):
            for m in held.due(time.monotonic()):
                try:
                    await m.in_progress()
                except Exception as exc:  # noqa: BLE001 - it comes back after ack_wait, and is dropped then
                    log.debug("in progress %s: %s", m.reply, exc)

    async def _room(self, stop: asyncio.Event) -> int:
        """How many messages the next pull request asks for: the batch, or what the reader
        has room for, waiting while it has none (0 once `stop` is set)."""
        if self.held is None:
            return self.batch
        waited = False
        while not stop.is_set():
            room = min(self.batch, self.held.room())
            if room > 0:
                return room
            if not waited:
                waited = True
                self.waited += 1
            await pause(stop, 0.05)
        return 0

    async def _run(self, stop: asyncio.Event) -> None:
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=self._cb, pending_msgs_limit=4 * self.batch + 100,
                                      pending_bytes_limit=256 * 1024 * 1024)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
        stop_wait = asyncio.ensure_future(stop.wait())
        ended: asyncio.Future[Literal[True]] | None = None
        try:
            while not stop.is_set():
                want = await self._room(stop)
                if not want:
                    break
                request = json.dumps({"batch": want, "expires": int(self.expires_s * 1e9)}).encode()
                self._want = want
                self._asked_at = time.time()
                self._n = 0
                self._status = None
                self._ended.clear()
                try:
                    await self.nc.publish(subject, request, reply=inbox)
                    self.requests += 1
                except Exception as exc:  # noqa: BLE001 - reconnecting: try again shortly
                    log.debug("pull request %s: %s", subject, exc)
                    await asyncio.sleep(0.2)
                    continue
                ended = waiting = asyncio.ensure_future(self._ended.wait())
                await asyncio.wait({waiting, stop_wait}, timeout=self.expires_s + 1.0,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if self._status not in (None, "404", "408"):
                    # e.g. 409 while the stream's leader changes: do not spin.
                    log.debug("pull %s ended with status %s", subject, self._status)
                    await asyncio.sleep(0.2)
        finally:
            stop_wait.cancel()
            if ended is not None:
                ended.cancel()  # cancelled mid-wait: do not leave it pending
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001
                pass
