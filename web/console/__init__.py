"""The operator console: server-rendered jinja2 pages, refreshed in place by htmx.

Sign-in takes an API token and keeps only its SHA-256 hash in the `muster_session`
cookie; a page is served only while `muster.state.tokens` still holds that hash, so a
revoked token logs the browser out at its next request. Every POST except the login
form carries a `csrf` field (HMAC-SHA256 of "csrf" keyed by the session hash).

Pages never use inline scripts or styles (see CSP below): CSS, htmx and the console's
own script (`/static/live.js`) come from /static. The live parts of a page sit in one
element (`#live`); an htmx request (header `HX-Request`) gets only that fragment back.
`#live` is refreshed when the server-sent event stream (`/events/stream`) says something
it shows changed; while that stream is not connected (no EventSource, a proxy that
buffers, a restart) it polls its own URL every 2 s instead.

Scale: the overview and the hosts table read one shared snapshot of every host (`Fleet`),
built in one pass, in chunks that yield to the event loop, and reused for a time that
grows with its cost, so 50,000 hosts cost one pass per ~second however many browsers
look. The host page's charts come from `Telemetry`, a bounded in-memory ring buffer per
host that is filled only while someone views that host.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import re
import shlex
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from server.api.auth import check_token, token_hash
from server.state.cluster import TokenInfo
from wire.errors import AuthError, ConflictError, MusterError, NotFound, StoreError, ValidationError
from wire.messages import Job, JobState
from server.replica import Muster
from server.views.hosts import HEALTH_RANK, FleetSummary, HostQuery, HostRow
from wire.validation import KNOWN_GPU_MODELS

log = logging.getLogger(__name__)

# The errors a form shows next to its fields (wire.errors); anything else is a fault.
CLIENT_ERRORS = (ValidationError, NotFound, AuthError, ConflictError)

COOKIE = "muster_session"
PER_PAGE = 50
MAX_FORM_BYTES = 256 * 1024
MAX_TOKEN_CHARS = 1024
HEX64 = re.compile(r"^[0-9a-f]{64}$")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

# Field names used by wire.validation -> names of the submit form's inputs.
SUBMIT_FIELDS = {"name": "name", "command": "command", "gpus": "gpus", "gpuModel": "gpu_model",
                 "gpu_model": "gpu_model", "cpus": "cpus", "memoryMb": "memory_mb",
                 "memory_mb": "memory_mb"}

# Short notices a redirect may ask a page to show (never free text from the URL).
NOTICES = {
    "cancel": "Cancel requested. The leader stops the job shortly.",
    "cordoned": "Host cordoned: no new work is placed on it.",
    "uncordoned": "Host uncordoned: it takes new work again.",
    "submitted": "Job submitted.",
    "draining": "Host draining: no new work is placed on it; what still runs at the deadline is stopped and requeued elsewhere.",
}

templates = Jinja2Templates(directory=str(Path(__file__).resolve().parent / "templates"))


# ---------------------------------------------------------------- template helpers


def utc(ts: float | None) -> str:
    """A Unix time as UTC ISO 8601 with seconds, or an em dash."""
    if not ts:
        return "—"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def mib(mb: int | float | None) -> str:
    if mb is None:
        return "—"
    if mb >= 1024:
        return f"{mb / 1024:.1f} GiB"
    return f"{int(mb)} MiB"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} %"


templates.env.filters["utc"] = utc
templates.env.filters["mib"] = mib
templates.env.filters["pct"] = pct
templates.env.filters["shjoin"] = lambda argv: shlex.join(argv or [])
templates.env.globals["notices"] = NOTICES


def csrf_token(session_hash: str) -> str:
    return hmac.new(session_hash.encode(), b"csrf", hashlib.sha256).hexdigest()


def url(path: str, **params: Any) -> str:
    q = {k: v for k, v in params.items() if v not in (None, "") and not (k == "page" and v == 1)}
    return f"{path}?{urlencode(q)}" if q else path


@dataclass
class Session:
    hash: str
    info: TokenInfo

    @property
    def user(self) -> str:
        return self.info.name

    @property
    def can_act(self) -> bool:
        return self.info.role != "viewer"


def _muster(request: Request) -> Muster:
    return request.app.state.muster


def _session(request: Request) -> Session | None:
    h = request.cookies.get(COOKIE, "")
    if not HEX64.fullmatch(h):
        return None
    info = _muster(request).state.tokens.get(h)
    return Session(h, info) if info is not None else None


def _is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request", "").lower() == "true"


def render(
    request: Request, name: str, ctx: dict[str, Any] | None = None, status_code: int = 200,
) -> Response:
    sess: Session | None = getattr(request.state, "session", None)
    context: dict[str, Any] = {
        "session": sess,
        "user": sess.user if sess else None,
        "can_act": bool(sess and sess.can_act),
        "csrf": csrf_token(sess.hash) if sess else "",
        "csrf_input": Markup('<input type="hidden" name="csrf" value="{}">').format(
            csrf_token(sess.hash) if sess else ""
        ),
        "path": request.url.path,
        "notice": NOTICES.get(request.query_params.get("notice", "")),
    }
    context.update(ctx or {})
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def error_page(request: Request, status: int, title: str, message: str) -> Response:
    if _is_htmx(request):
        return Response(message, status_code=status, media_type="text/plain")
    return render(request, "error.html", {"title": title, "message": message}, status)


def _secure(resp: Response) -> Response:
    for k, v in SECURITY_HEADERS.items():
        resp.headers[k] = v
    return resp


def _unauthenticated(request: Request) -> Response:
    if _is_htmx(request):
        resp = Response("not signed in", status_code=401, media_type="text/plain")
        resp.headers["HX-Redirect"] = "/login"
        return resp
    return RedirectResponse("/login", status_code=303)


async def _form(request: Request) -> dict[str, str]:
    form = await request.form(max_files=0, max_fields=64, max_part_size=MAX_FORM_BYTES)
    return {k: v for k, v in form.items() if isinstance(v, str)}


Handler = Callable[[Request], Awaitable[Response]]


def console(*, auth: bool = True, csrf: bool = False, action: bool = False) -> Callable[[Handler], Handler]:
    """Wrap a console endpoint: sign-in check, CSRF check (POST), security headers."""

    def deco(fn: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                resp = await _guarded(fn, request, auth=auth, csrf=csrf, action=action)
            except StoreError as exc:
                resp = error_page(request, 503, "Store unavailable", f"The cluster store did not answer: {exc}")
            return _secure(resp)

        endpoint.__name__ = fn.__name__
        endpoint.__doc__ = fn.__doc__
        return endpoint

    return deco


async def _guarded(fn: Handler, request: Request, *, auth: bool, csrf: bool, action: bool) -> Response:
    length = request.headers.get("content-length", "")
    if request.method == "POST" and length.isdigit() and int(length) > MAX_FORM_BYTES:
        return error_page(request, 413, "Too large", "The form is too large.")
    if auth:
        sess = _session(request)
        if sess is None:
            return _unauthenticated(request)
        request.state.session = sess
        if csrf:
            try:
                form = await _form(request)
            except Exception:  # noqa: BLE001 - malformed body
                return error_page(request, 400, "Bad request", "The form could not be read.")
            sent = form.get("csrf", "")
            if not hmac.compare_digest(sent.encode(), csrf_token(sess.hash).encode()):
                return error_page(request, 403, "Forbidden",
                                  "The form's security token is missing or wrong. Reload the page and try again.")
        if action and not sess.can_act:
            return error_page(request, 403, "Forbidden", f"Your token's role ({sess.info.role}) may only view.")
    return await fn(request)


def _page_arg(request: Request) -> int:
    try:
        return max(1, min(int(request.query_params.get("page", "1")), 1_000_000))
    except ValueError:
        return 1


def _pages(total: int, page: int) -> tuple[int, int]:
    pages = max(1, math.ceil(total / PER_PAGE))
    return min(page, pages), pages


# ---------------------------------------------------------------- fleet

HEAT_PER_HOST_MAX = 200  # up to this many hosts, the heat map shows one cell per host
HEAT_MAX_CELLS = 1000  # never more cells than this (racks beyond it are counted, not drawn)
FILTER_OPTIONS_MAX = 1000  # values offered per filter dropdown


def heat_class(util: float | None) -> str:
    """CSS class of a heat-map cell: heat-0 .. heat-10 by 10 % steps, heat-none without GPUs."""
    if util is None:
        return "heat-none"
    return f"heat-{max(0, min(10, int(util // 10)))}"


# ---------------------------------------------------------------- telemetry


TELEMETRY_WINDOW_S = 600.0  # what the charts cover
TELEMETRY_MAX_SAMPLES = 360  # per host
TELEMETRY_MAX_HOSTS = 32  # hosts watched at once (least recently viewed dropped first)
TELEMETRY_IDLE_S = 120.0  # a host nobody viewed for this long is no longer sampled


@dataclass(slots=True)
class Sample:
    ts: float
    gpus: dict[int, tuple[float, float, float]]  # index -> (util %, temp °C, power W)


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
        buf.append(Sample(hb.ts, {u.index: (u.util_pct, u.temp_c, u.power_w) for u in hb.gpu_usage}))
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
                except asyncio.TimeoutError:
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


def _telemetry(request: Request) -> Telemetry:
    app_state = request.app.state
    tel: Telemetry | None = getattr(app_state, "console_telemetry", None)
    if tel is None or tel.m is not _muster(request):
        tel = Telemetry(_muster(request))
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


def _spark(label: str, unit: str, kind: str, series: list[tuple[float, float]], t0: float, t1: float,
           fixed: tuple[float, float] | None = None) -> Spark:
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
    return Spark(label, unit, " ".join(pts), values[-1], lo_v, hi_v, kind)


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


# ---------------------------------------------------------------- login / logout


@console(auth=False)
async def login_form(request: Request) -> Response:
    if _session(request) is not None:
        return RedirectResponse("/", status_code=303)
    return render(request, "login.html", {"error": None})


@console(auth=False)
async def login(request: Request) -> Response:
    try:
        form = await _form(request)
    except Exception:  # noqa: BLE001
        form = {}
    token = form.get("token", "").strip()
    info = check_token(_muster(request).state, token) if 0 < len(token) <= MAX_TOKEN_CHARS else None
    if info is None:
        return render(request, "login.html", {"error": "That token is not valid."}, 401)
    resp = RedirectResponse("/", status_code=303)
    resp.set_cookie(
        COOKIE, token_hash(token), httponly=True, samesite="strict", path="/",
        secure=request.url.scheme == "https",
    )
    return resp


@console(auth=False)
async def logout(request: Request) -> Response:
    sess = _session(request)
    if sess is not None:
        try:
            form = await _form(request)
        except Exception:  # noqa: BLE001
            form = {}
        if not hmac.compare_digest(form.get("csrf", "").encode(), csrf_token(sess.hash).encode()):
            request.state.session = sess
            return error_page(request, 403, "Forbidden", "The form's security token is missing or wrong.")
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                       secure=request.url.scheme == "https")
    return resp


# ---------------------------------------------------------------- overview


def _meter(used: float, total: float) -> dict[str, Any]:
    return {"used": used, "total": total, "pct": (100.0 * used / total) if total else None}


def _heatmap(m: Muster, snap: FleetSummary, now: float) -> dict[str, Any]:
    """Heat-map cells: one per host (grouped by rack) for small fleets, else one per rack;
    never more than HEAT_MAX_CELLS."""
    racks = sorted(snap.racks.values(), key=lambda c: (c.rack == "", c.rack))
    if snap.hosts <= HEAT_PER_HOST_MAX:
        by_rack: dict[str, list[HostRow]] = {}
        for r in m.hosts.rows(now, live=False):
            by_rack.setdefault(r.rack, []).append(r)
        groups = [(c, by_rack.get(c.rack, [])) for c in racks]
        return {"mode": "hosts", "groups": groups, "shown": len(racks), "racks": len(racks)}
    shown = racks[:HEAT_MAX_CELLS]
    return {"mode": "racks", "cells": shown, "shown": len(shown), "racks": len(racks)}


@console()
async def overview(request: Request) -> Response:
    m = _muster(request)
    now = time.time()
    snap = m.hosts.summary(now)
    counts = m.state.job_counts()
    ctx = {
        "snap": snap,
        "jobs": [(st.value, counts.get(st.value, 0)) for st in JobState],
        "jobs_total": sum(counts.values()),
        "gpu_meter": _meter(snap.gpus_allocated, snap.gpus_total),
        "cpu_meter": _meter(snap.cpu_used, snap.cpus),
        "mem_meter": _meter(snap.mem_used_mb, snap.memory_mb),
        "heat": _heatmap(m, snap, now),
        "heat_class": heat_class,
        "term": m.state.term,
        "leader": m.state.leader,
        "role": m.role,
        "replica": m.config.name,
        "live_url": "/",
        "sse_on": "job host stats",
    }
    return render(request, "_overview.html" if _is_htmx(request) else "overview.html", ctx)


# ---------------------------------------------------------------- hosts

# The table's sort columns (server.views.hosts.ORDERS, "-" reversing), and its filters.
HOST_SORTS = ("id", "health", "util", "alloc")
HOST_FILTERS = ("q", "health", "rack", "zone", "model", "cordoned", "sort")
CORDONED_CHOICES = {"yes": "Cordoned", "no": "Not cordoned", "draining": "Draining"}


def console_query(f: dict[str, str]) -> HostQuery:
    """The read model's query for the hosts table's filters (query-string values)."""
    cord = f.get("cordoned", "")
    return HostQuery(search=f.get("q") or None, health=frozenset({f["health"]}) if f.get("health") else None,
                     rack=f.get("rack") or None, zone=f.get("zone") or None, model=f.get("model") or None,
                     cordoned={"yes": True, "no": False}.get(cord), draining=True if cord == "draining" else None)


def _host_filters(request: Request) -> tuple[dict[str, str], bool]:
    """The hosts table's filters from the query string, and whether it was not canonical
    (empty or unknown values: the caller redirects to the canonical URL)."""
    qp = request.query_params
    f = {k: qp.get(k, "").strip()[:64] for k in HOST_FILTERS}
    canonical = all(qp.get(k) is None or (qp.get(k) == f[k] and f[k]) for k in HOST_FILTERS)
    if f["health"]:
        f["health"] = f["health"].upper() if f["health"].upper() in HEALTH_RANK else ""
    if f["cordoned"] not in CORDONED_CHOICES:
        f["cordoned"] = ""
    sort = f["sort"]
    if sort.lstrip("-") not in HOST_SORTS or sort == "id":
        f["sort"] = ""
    for k in ("health", "cordoned", "sort"):
        if qp.get(k) is not None and f[k] != qp.get(k):
            canonical = False
    return f, canonical


@console()
async def hosts(request: Request) -> Response:
    f, canonical = _host_filters(request)
    if not canonical and not _is_htmx(request):
        page = request.query_params.get("page")
        return RedirectResponse(url("/hosts", **f, page=page), status_code=303)
    m = _muster(request)
    now = time.time()
    views = m.hosts.select(console_query(f), f["sort"] or "id", now)
    page, pages = _pages(len(views), _page_arg(request))
    rows = views[(page - 1) * PER_PAGE : page * PER_PAGE]
    m.hosts.refresh(rows, now)
    snap = m.hosts.summary(now) if not _is_htmx(request) else None
    filtered = any(f[k] for k in HOST_FILTERS if k != "sort")
    sort = f["sort"] or "id"

    def sort_url(col: str) -> str:
        # First click sorts the natural way (busiest / most allocated / worst health first
        # would surprise for ids); a second click on the same column reverses it.
        new = f"-{col}" if sort == col else col
        return url("/hosts", **{**f, "sort": "" if new == "id" else new})

    racks = sorted(snap.racks) if snap else []
    ctx = {
        "rows": rows,
        "total": len(views),
        "any_hosts": bool(m.state.hosts),
        "f": f,
        "q": f["q"],
        "filtered": filtered,
        "sort": sort,
        "sort_urls": {c: sort_url(c) for c in HOST_SORTS},
        "racks": [r for r in racks if r][:FILTER_OPTIONS_MAX],
        "zones": snap.zones[:FILTER_OPTIONS_MAX] if snap else [],
        "models": snap.models[:FILTER_OPTIONS_MAX] if snap else [],
        "healths": list(HEALTH_RANK),
        "cordoned_choices": CORDONED_CHOICES,
        "page": page,
        "pages": pages,
        "prev_url": url("/hosts", **f, page=page - 1) if page > 1 else None,
        "next_url": url("/hosts", **f, page=page + 1) if page < pages else None,
        "first_url": url("/hosts", **f, page=1) if page > 1 else None,
        "last_url": url("/hosts", **f, page=pages) if page < pages else None,
        "live_url": url("/hosts", **f, page=page),
        "sse_on": "host stats",
    }
    return render(request, "_hosts.html" if _is_htmx(request) else "hosts.html", ctx)


def _host_ctx(m: Muster, host_id: str, tel: Telemetry | None = None) -> dict[str, Any] | None:
    view = m.hosts.row(host_id, time.time())
    if view is None:
        return None
    entry = m.state.hosts[host_id]
    hb = entry.latest()
    assert hb is not None
    usage = {u.index: u for u in hb.gpu_usage}
    alloc = m.state.allocs.get(host_id)
    samples: list[Sample] = []
    if tel is not None:
        tel.watch(host_id)
        samples = tel.samples(host_id)
    return {
        "h": view,
        "hb": hb,
        "gpus": [(g, usage.get(g.index)) for g in sorted(hb.gpus, key=lambda g: g.index)],
        "tasks": list(alloc.tasks) if alloc else [],
        "cfg": m.state.hostcfg.get(host_id),
        "charts": gpu_charts(samples),
        "samples": len(samples),
        "window_s": (samples[-1].ts - samples[0].ts) if len(samples) > 1 else 0.0,
        "spark_w": SPARK_W,
        "spark_h": SPARK_H,
        "live_url": f"/hosts/{host_id}",
        "sse_on": "host stats job",
        "sse_id": host_id,
    }


@console()
async def host_detail(request: Request) -> Response:
    host_id = request.path_params["host_id"]
    ctx = _host_ctx(_muster(request), host_id, _telemetry(request))
    if ctx is None:
        return error_page(request, 404, "No such host", f"No host {host_id!r} has reported to this cluster.")
    ctx["errors"] = {}
    return render(request, "_host.html" if _is_htmx(request) else "host.html", ctx)


async def _host_form_error(request: Request, m: Muster, host_id: str, form_name: str,
                           errors: list[MusterError], values: dict[str, str]) -> Response:
    ctx = _host_ctx(m, host_id, _telemetry(request))
    if ctx is None:
        return error_page(request, 404, "No such host", f"No host {host_id!r} has reported to this cluster.")
    ctx["errors"] = {form_name: [e.message for e in errors]}
    ctx["reason_value"] = values.get("reason", "")
    ctx["form_values"] = values
    return render(request, "host.html", ctx, 422)


async def _cordon(request: Request, cordoned: bool) -> Response:
    m = _muster(request)
    host_id = request.path_params["host_id"]
    sess: Session = request.state.session
    form = await _form(request)
    reason = form.get("reason", "").strip()
    if m.hosts.row(host_id, time.time()) is None:
        return error_page(request, 404, "No such host", f"No host {host_id!r} has reported to this cluster.")
    errors: list[MusterError] = []
    try:
        if not reason:
            raise ValidationError("reason", "a reason is required", "REQUIRED")
        await m.set_cordon(host_id, cordoned, sess.user, reason)
    except CLIENT_ERRORS as exc:
        errors = exc.details()
    if errors:
        return await _host_form_error(request, m, host_id, "cordon" if cordoned else "uncordon", errors,
                                      {"reason": reason})
    return RedirectResponse(url(f"/hosts/{host_id}", notice="cordoned" if cordoned else "uncordoned"),
                            status_code=303)


@console(csrf=True, action=True)
async def cordon(request: Request) -> Response:
    return await _cordon(request, True)


@console(csrf=True, action=True)
async def uncordon(request: Request) -> Response:
    return await _cordon(request, False)


DRAIN_DEFAULT_S = "600"


@console(csrf=True, action=True)
async def drain(request: Request) -> Response:
    m = _muster(request)
    host_id = request.path_params["host_id"]
    sess: Session = request.state.session
    form = await _form(request)
    reason = form.get("reason", "").strip()
    raw_deadline = form.get("deadline_s", "").strip() or DRAIN_DEFAULT_S
    values = {"reason": reason, "deadline_s": raw_deadline}
    if m.hosts.row(host_id, time.time()) is None:
        return error_page(request, 404, "No such host", f"No host {host_id!r} has reported to this cluster.")
    errors: list[MusterError] = []
    if not reason:
        errors.append(ValidationError("reason", "a reason is required", "REQUIRED"))
    try:
        deadline = float(raw_deadline)
        if not math.isfinite(deadline):
            raise ValueError
    except ValueError:
        deadline = -1.0
        errors.append(ValidationError("deadline", "the deadline must be a number of seconds", "INVALID"))
    if not errors:
        try:
            await m.drain(host_id, sess.user, reason, deadline)
        except CLIENT_ERRORS as exc:
            errors = exc.details()
    if errors:
        return await _host_form_error(request, m, host_id, "drain", errors, values)
    return RedirectResponse(url(f"/hosts/{host_id}", notice="draining"), status_code=303)


# ---------------------------------------------------------------- jobs


@console()
async def jobs(request: Request) -> Response:
    m = _muster(request)
    states = [s.value for s in JobState]
    state = request.query_params.get("state", "").strip().upper()
    bad_state = bool(state) and state not in states
    if bad_state:
        state = ""
    page = _page_arg(request)
    assert m.history is not None
    rows, total = await run_in_threadpool(
        m.history.list_jobs, state=state or None, limit=PER_PAGE, offset=(page - 1) * PER_PAGE
    )
    if not rows and total and page > 1:
        page, _ = _pages(total, page)
        rows, total = await run_in_threadpool(
            m.history.list_jobs, state=state or None, limit=PER_PAGE, offset=(page - 1) * PER_PAGE
        )
    shown = m.jobs.overlay(rows, state, newest_live=page == 1, limit=PER_PAGE)
    total += max(0, len(shown) - len(rows)) if page == 1 else 0
    page, pages = _pages(total, page)
    ctx = {
        "rows": shown,
        "total": total,
        "state": state,
        "states": states,
        "bad_state": bad_state,
        "page": page,
        "pages": pages,
        "prev_url": url("/jobs", state=state, page=page - 1) if page > 1 else None,
        "next_url": url("/jobs", state=state, page=page + 1) if page < pages else None,
        "first_url": url("/jobs", state=state, page=1) if page > 1 else None,
        "last_url": url("/jobs", state=state, page=pages) if page < pages else None,
        "live_url": url("/jobs", state=state, page=page),
        "sse_on": "job",
    }
    return render(request, "_jobs.html" if _is_htmx(request) else "jobs.html", ctx)


# ---------------------------------------------------------------- alerts


ALERT_KINDS = ("host.lost", "host.recovered", "domain.disrupted", "gpu.unhealthy", "job.failed")


@console()
async def alerts(request: Request) -> Response:
    """Alerts as recorded in history, newest first (also published on `alerts.>`)."""

    m = _muster(request)
    kind = request.query_params.get("kind", "").strip()
    if kind not in ALERT_KINDS:
        kind = ""
    page = _page_arg(request)
    assert m.history is not None
    rows, total = await run_in_threadpool(m.history.list_alerts, kind or None, PER_PAGE, (page - 1) * PER_PAGE)
    page, pages = _pages(total, page)
    ctx = {
        "rows": [{"id": r.id, "kind": r.kind.removeprefix("alert."), "ts": r.ts, "host_id": r.host_id,
                  "job_id": r.job_id, "message": r.message} for r in rows],
        "total": total,
        "kind": kind,
        "kinds": ALERT_KINDS,
        "page": page,
        "pages": pages,
        "prev_url": url("/alerts", kind=kind, page=page - 1) if page > 1 else None,
        "next_url": url("/alerts", kind=kind, page=page + 1) if page < pages else None,
        "first_url": url("/alerts", kind=kind, page=1) if page > 1 else None,
        "last_url": url("/alerts", kind=kind, page=pages) if page < pages else None,
    }
    return render(request, "alerts.html", ctx)


async def _job_ctx(m: Muster, job_id: str) -> dict[str, Any] | None:
    if not ID_RE.fullmatch(job_id):
        return None
    job = m.state.jobs.get(job_id)
    if job is None:
        job = await run_in_threadpool(m.jobs.get, job_id)
    if job is None:
        return None
    why = sorted(m.jobs.why_pending(job, time.time()).items(), key=lambda kv: (-kv[1], kv[0]))
    recorded: list[Any] = []
    history_error = False
    if m.history is not None:
        try:
            recorded = await run_in_threadpool(m.history.list_events, job_id=job_id, limit=500)
        except Exception:  # noqa: BLE001 - history is a convenience here
            history_error = True
    return {
        "job": job,
        "why": why,
        "last_try": sorted(job.pending_reasons.items(), key=lambda kv: (-kv[1], kv[0])),
        "hosts_known": len(m.state.hosts),
        "position": m.jobs.queue_position(job),
        "queued_total": len(m.state.queued_ids),
        "events": m.jobs.timeline(job, recorded),
        "history_error": history_error,
        "gang": job.spec.replicas > 1,
        "live_url": f"/jobs/{job_id}",
        "sse_on": "job",
        "sse_id": job_id,
    }


@console()
async def job_detail(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    ctx = await _job_ctx(_muster(request), job_id)
    if ctx is None:
        return error_page(request, 404, "No such job", f"There is no job {job_id!r}.")
    ctx["errors"] = []
    return render(request, "_job.html" if _is_htmx(request) else "job.html", ctx)


@console(csrf=True, action=True)
async def cancel_job(request: Request) -> Response:
    m = _muster(request)
    job_id = request.path_params["job_id"]
    sess: Session = request.state.session
    form = await _form(request)
    reason = form.get("reason", "").strip()[:512]
    ctx = await _job_ctx(m, job_id)
    if ctx is None:
        return error_page(request, 404, "No such job", f"There is no job {job_id!r}.")
    try:
        if not reason:
            raise ValidationError("reason", "a reason is required", "REQUIRED")
        await m.cancel(job_id, by=sess.user, reason=reason)
    except CLIENT_ERRORS as exc:
        ctx["errors"] = [e.message for e in exc.details()]
        ctx["reason_value"] = reason
        return render(request, "job.html", ctx, 409 if exc.code == "ALREADY_FINISHED" else 422)
    return RedirectResponse(url(f"/jobs/{job_id}", notice="cancel"), status_code=303)


# ---------------------------------------------------------------- submit


def _submit_ctx(m: Muster, values: dict[str, str], errors: dict[str, list[str]],
                other: list[str] | None = None) -> dict[str, Any]:
    return {
        "values": values,
        "errors": errors,
        "other_errors": other or [],
        "models": sorted(KNOWN_GPU_MODELS | m.known_gpu_models()),
    }


SUBMIT_DEFAULTS = {"name": "", "command": "", "gpus": "0", "gpu_model": "", "cpus": "1", "memory_mb": "512"}


@console()
async def submit_form(request: Request) -> Response:
    m = _muster(request)
    return render(request, "submit.html", _submit_ctx(m, dict(SUBMIT_DEFAULTS), {}))


def _number(raw: str, kind: type) -> Any:
    """The parsed number, or the raw text (which validation then rejects)."""
    try:
        return kind(raw)
    except (TypeError, ValueError):
        return raw


@console(csrf=True, action=True)
async def submit(request: Request) -> Response:
    m = _muster(request)
    sess: Session = request.state.session
    form = await _form(request)
    values = {k: form.get(k, "").strip() for k in SUBMIT_DEFAULTS}
    data: dict[str, Any] = {"name": values["name"]}
    local: dict[str, list[str]] = {}
    try:
        data["command"] = shlex.split(values["command"])
        if not data["command"]:
            local["command"] = ["is required: the program to run and its arguments"]
    except ValueError as exc:
        data["command"] = None
        local["command"] = [f"cannot be split into arguments: {exc}"]
    if values["gpus"]:
        data["gpus"] = _number(values["gpus"], int)
    if values["cpus"]:
        cpus = _number(values["cpus"], float)
        data["cpus"] = cpus if not isinstance(cpus, float) or math.isfinite(cpus) else values["cpus"]
    if values["memory_mb"]:
        data["memory_mb"] = _number(values["memory_mb"], int)
    if values["gpu_model"]:
        data["gpu_model"] = values["gpu_model"]
    try:
        job = await m.submit(data, sess.user)
        return RedirectResponse(url(f"/jobs/{job.id}", notice="submitted"), status_code=303)
    except ValidationError as exc:
        problems = exc.details()
    errors: dict[str, list[str]] = dict(local)
    other: list[str] = []
    for p in problems:
        field = SUBMIT_FIELDS.get(p.field)
        if field is None:
            other.append(f"{p.field}: {p.message}")
        elif field not in local:
            errors.setdefault(field, []).append(p.message)
    return render(request, "submit.html", _submit_ctx(m, values, errors, other), 422)


# ---------------------------------------------------------------- live updates (SSE)

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
    if kind == "gpu_unhealthy" and isinstance(obj, tuple) and obj:
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
            "term": m.state.term}


@console()
async def event_stream(request: Request) -> Response:
    """Server-sent events for the console: `job` and `host` when one changes (data: its id),
    `stats` periodically, `resync` when this client fell behind and should reload."""
    m = _muster(request)
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
                    except asyncio.TimeoutError:
                        pass
                if m.state.tokens.get(sess.hash) is None:
                    yield _sse("signout", {})
                    return  # the token was revoked: stop streaming to this browser
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


# ---------------------------------------------------------------- routes


def console_routes() -> list[BaseRoute]:
    """The console's pages, its static files and htmx (served from the installed
    django-js-lib-htmx package: no CDN)."""
    return [
        Mount("/static/htmx", StaticFiles(packages=[("js_lib_htmx", "static/htmx")]), name="htmx"),
        Mount("/static", StaticFiles(packages=[("web.console", "static")]), name="static"),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview, methods=["GET"]),
        Route("/hosts", hosts, methods=["GET"]),
        Route("/alerts", alerts, methods=["GET"]),
        Route("/hosts/{host_id}", host_detail, methods=["GET"]),
        Route("/hosts/{host_id}/cordon", cordon, methods=["POST"]),
        Route("/hosts/{host_id}/uncordon", uncordon, methods=["POST"]),
        Route("/hosts/{host_id}/drain", drain, methods=["POST"]),
        Route("/jobs", jobs, methods=["GET"]),
        Route("/jobs/{job_id}", job_detail, methods=["GET"]),
        Route("/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
        Route("/submit", submit_form, methods=["GET"]),
        Route("/submit", submit, methods=["POST"]),
        Route("/events/stream", event_stream, methods=["GET"]),
    ]


__all__ = ["COOKIE", "SECURITY_HEADERS", "console_routes", "csrf_token"]
