"""Live updates: the server-sent event stream (`/events/stream`) that tells a page's
`#live` element when something it shows changed (static/live.js listens)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from server.api.auth import session_alive
from server.replica import Muster
from web.console.render import muster_of
from web.console.session import Session, console
from wire.messages import Job

SSE_QUEUE_MAX = 256  # events buffered per client; past that the client is told to resync
SSE_STATS_MAX_S = 5.0  # a `stats` event at least this often (also keeps proxies from idling out)
SSE_RETRY_MS = 3000


def _sse(event: str, data: object) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _state_event(kind: str, obj: object) -> tuple[str, dict[str, Any]] | None:
    """A cluster-state change as a (SSE event, data) pair, or None if the console shows
    nothing of it."""
    if kind == "job" and isinstance(obj, Job):
        return "job", {"id": obj.id, "state": obj.state.value}
    if kind in ("host_up", "host_lost"):
        return "host", {"id": getattr(obj, "host_id", ""), "change": kind}
    if kind in ("gpu_unhealthy", "host_fenced") and isinstance(obj, tuple) and obj:
        return "host", {"id": str(obj[0]), "change": kind}
    if kind == "hostcfg":
        return "host", {"id": str(obj), "change": kind}
    return None


class _Client:
    """One event-stream client: a listener on the cluster state that feeds a bounded queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=SSE_QUEUE_MAX)
        self.overflow = False
        self.wake = asyncio.Event()

    def _put(self, item: tuple[str, dict[str, Any]]) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflow = True
        self.wake.set()

    def listener(self, kind: str, obj: object) -> None:
        item = _state_event(kind, obj)
        if item is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self._put(item)
        else:  # called from another thread: hand over to the stream's loop
            self.loop.call_soon_threadsafe(self._put, item)


def _stats(m: Muster) -> dict[str, Any]:
    counts = m.state.job_counts()
    return {"ts": round(time.time(), 3), "hosts": len(m.state.hosts), "jobs": dict(counts),
            "term": m.term}


@console()
async def event_stream(request: Request) -> Response:
    """Server-sent events for the console: `job` and `host` when one changes (data: its id),
    `stats` periodically, `resync` when this client fell behind and should reload."""
    m = muster_of(request)
    sess: Session = request.state.session
    client = _Client(asyncio.get_running_loop())
    every = max(1.0, min(SSE_STATS_MAX_S, m.config.heartbeat_interval_s))

    async def stream() -> AsyncIterator[bytes]:
        m.state.listeners.append(client.listener)  # removed below, however the stream ends
        try:
            yield f"retry: {SSE_RETRY_MS}\n: muster console events\n\n".encode()
            yield _sse("stats", _stats(m))
            next_stats = time.monotonic() + every
            while True:
                timeout = next_stats - time.monotonic()
                if timeout > 0 and client.queue.empty() and not client.overflow:
                    client.wake.clear()
                    try:
                        await asyncio.wait_for(client.wake.wait(), timeout)
                    except TimeoutError:
                        pass
                if not session_alive(m.state, sess.hash):
                    yield _sse("signout", {})
                    return  # signed out, expired, or its token revoked: stop streaming to this browser
                if client.overflow:
                    client.overflow = False
                    while not client.queue.empty():
                        client.queue.get_nowait()
                    yield _sse("resync", {})
                seen: set[tuple[str, str]] = set()
                out: list[bytes] = []
                while not client.queue.empty() and len(out) < 64:
                    event, data = client.queue.get_nowait()
                    key = (event, str(data.get("id", "")))
                    if key not in seen:  # a burst of changes to one object: send it once
                        seen.add(key)
                        out.append(_sse(event, data))
                if out:
                    yield b"".join(out)
                if time.monotonic() >= next_stats:
                    yield _sse("stats", _stats(m))
                    next_stats = time.monotonic() + every
        finally:
            try:
                m.state.listeners.remove(client.listener)
            except ValueError:
                pass

    resp = StreamingResponse(stream(), media_type="text/event-stream")
    resp.headers["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return resp
