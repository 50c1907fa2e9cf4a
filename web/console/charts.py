"""The host page's charts: `Telemetry` (a bounded ring buffer of GPU samples per viewed
host, taken from heartbeats) and the SVG sparklines drawn from it."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from starlette.requests import Request

from server.replica import Muster
from web.console.render import muster_of

TELEMETRY_WINDOW_S = 600.0  # what the charts cover
TELEMETRY_MAX_SAMPLES = 360  # per host
TELEMETRY_MAX_HOSTS = 32  # hosts watched at once (least recently viewed dropped first)
TELEMETRY_IDLE_S = 120.0  # a host nobody viewed for this long is no longer sampled


@dataclass(slots=True)
class Sample:
    ts: float
    # index -> (util %, temp °C, power W), each None where its agent could not read it
    gpus: dict[int, tuple[float | None, float | None, float | None]]


class Telemetry:
    """Per-GPU telemetry of the hosts whose page is being viewed: a ring buffer per host
    of (ts, util, temp, power per GPU) taken from heartbeats. The sampler task starts on
    the first view and ends when no page has been viewed for TELEMETRY_IDLE_S."""

    def __init__(self, muster: Muster, every_s: float = 1.0) -> None:
        self.m = muster
        self.every_s = every_s
        self.buffers: dict[str, deque[Sample]] = {}
        self.viewed: dict[str, float] = {}  # host -> monotonic time of the last view
        self._task: asyncio.Task[None] | None = None

    def watch(self, host_id: str) -> None:
        self.viewed.pop(host_id, None)
        self.viewed[host_id] = time.monotonic()  # dict order = least recently viewed first
        while len(self.viewed) > TELEMETRY_MAX_HOSTS:
            old = next(iter(self.viewed))
            self.viewed.pop(old)
            self.buffers.pop(old, None)
        self.sample(host_id)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def sample(self, host_id: str) -> None:
        entry = self.m.state.hosts.get(host_id)
        hb = entry.latest() if entry is not None and entry.present else None
        if hb is None:
            return
        buf = self.buffers.get(host_id)
        if buf is None:
            buf = self.buffers[host_id] = deque(maxlen=TELEMETRY_MAX_SAMPLES)
        if buf and hb.ts <= buf[-1].ts:
            return  # the same heartbeat (or an older one) again
        buf.append(Sample(hb.ts, {u.index: (u.util_read, u.temp_read, u.power_read) for u in hb.gpu_usage}))
        cutoff = hb.ts - TELEMETRY_WINDOW_S
        while buf and buf[0].ts < cutoff:
            buf.popleft()

    def samples(self, host_id: str) -> list[Sample]:
        return list(self.buffers.get(host_id, ()))

    async def _run(self) -> None:
        stop: asyncio.Event | None = getattr(self.m, "_stop", None)
        while self.viewed:
            if stop is not None:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.every_s)
                    break  # the replica is shutting down
                except TimeoutError:
                    pass
            else:
                await asyncio.sleep(self.every_s)
            now = time.monotonic()
            for host_id, seen in list(self.viewed.items()):
                if now - seen > TELEMETRY_IDLE_S or host_id not in self.m.state.hosts:
                    self.viewed.pop(host_id, None)
                    self.buffers.pop(host_id, None)
                else:
                    self.sample(host_id)
        self.viewed.clear()
        self.buffers.clear()


def telemetry(request: Request) -> Telemetry:
    """The app's Telemetry (one per replica, made on the first host page)."""
    app_state = request.app.state
    tel: Telemetry | None = getattr(app_state, "console_telemetry", None)
    if tel is None or tel.m is not muster_of(request):
        tel = Telemetry(muster_of(request))
        app_state.console_telemetry = tel
    return tel


SPARK_W, SPARK_H = 120, 32


@dataclass
class Spark:
    label: str
    unit: str
    points: str  # SVG polyline points, empty when fewer than 2 samples
    now: float | None
    lo: float | None
    hi: float | None
    kind: str  # CSS class: util, temp, power

    def fmt(self, v: float | None) -> str:
        if v is None:
            return "—"
        return f"{v:.0f} {self.unit}"

    @property
    def summary(self) -> str:
        return f"{self.label}: now {self.fmt(self.now)}, min {self.fmt(self.lo)}, max {self.fmt(self.hi)}"


def _spark(label: str, unit: str, kind: str, samples: list[tuple[float, float | None]], t0: float, t1: float,
           fixed: tuple[float, float] | None = None) -> Spark:
    """A sparkline of `samples` (time, value); a value not read (None) is no point, and
    "now" is None when the latest was not read."""
    series = [(ts, v) for ts, v in samples if v is not None]
    if not series:
        return Spark(label, unit, "", None, None, None, kind)
    values = [v for _, v in series]
    lo_v, hi_v = min(values), max(values)
    if fixed is not None:
        lo, hi = fixed
    else:
        pad = max((hi_v - lo_v) * 0.1, 1.0)
        lo, hi = lo_v - pad, hi_v + pad
    span_t = max(t1 - t0, 1e-9)
    span_v = max(hi - lo, 1e-9)
    pts = []
    if len(series) >= 2:
        for ts, v in series:
            x = (ts - t0) / span_t * SPARK_W
            y = SPARK_H - 1 - (min(max(v, lo), hi) - lo) / span_v * (SPARK_H - 2)
            pts.append(f"{x:.1f},{y:.1f}")
    return Spark(label, unit, " ".join(pts), samples[-1][1], lo_v, hi_v, kind)


def gpu_charts(samples: list[Sample]) -> list[tuple[int, list[Spark]]]:
    """Per GPU index: sparklines of utilization, temperature and power over the samples."""
    if not samples:
        return []
    t0, t1 = samples[0].ts, samples[-1].ts
    indices = sorted({i for s in samples for i in s.gpus})
    out = []
    for i in indices:
        util = [(s.ts, s.gpus[i][0]) for s in samples if i in s.gpus]
        temp = [(s.ts, s.gpus[i][1]) for s in samples if i in s.gpus]
        power = [(s.ts, s.gpus[i][2]) for s in samples if i in s.gpus]
        out.append((i, [
            _spark("Utilization", "%", "util", util, t0, t1, fixed=(0.0, 100.0)),
            _spark("Temperature", "°C", "temp", temp, t0, t1),
            _spark("Power", "W", "power", power, t0, t1),
        ]))
    return out
