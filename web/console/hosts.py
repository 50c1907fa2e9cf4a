"""Hosts: the overview (utilization meters, the heat map), the hosts table (filters,
sorts, paging over the host read model, server.views.hosts), a host's page and the
cordon, uncordon, drain and clear-GPU-faults forms."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from server.api.reads import reads_for
from server.history.database import DATABASE_DOWN, down_text
from server.replica import Muster
from server.scheduling import advance
from server.timefmt import DRAIN_DEADLINE_S, parse_time
from server.views.hosts import HEALTH_RANK, FleetSummary, HostQuery, HostRow
from web.console.charts import SPARK_H, SPARK_W, Sample, Telemetry, gpu_charts, telemetry
from web.console.errors import FORM_ERRORS, no_such_host, status_for
from web.console.render import (
    PER_PAGE,
    clamp_page,
    is_htmx,
    muster_of,
    page_arg,
    render,
    templates,
    url,
    wants_live_part,
)
from web.console.session import Session, console, read_form
from wire.errors import InvalidInput, MusterError, ValidationError
from wire.messages import JobState

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- the heat map

HEAT_PER_HOST_MAX = 200  # up to this many hosts, the heat map shows one cell per host
HEAT_MAX_CELLS = 1000  # never more cells than this (racks beyond it are counted, not drawn)
FILTER_OPTIONS_MAX = 1000  # values offered per filter dropdown


def heat_class(util: float | None) -> str:
    """CSS class of a heat-map cell: heat-0 .. heat-10 by 10 % steps, heat-none without GPUs."""
    if util is None:
        return "heat-none"
    return f"heat-{max(0, min(10, int(util // 10)))}"


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


ENDED = [st for st in JobState if st.terminal]
# How long a replica's overview reuses history's counts of ended jobs, or its failure to
# give them: each is a count over every job of that state (hundreds of ms at millions of
# jobs on PostgreSQL), and every signed-in overview refreshes itself every few seconds.
ENDED_COUNTS_MAX_AGE_S = 15.0
_ENDED_COUNTS: weakref.WeakKeyDictionary[Muster, tuple[float, dict[str, int] | None]] = weakref.WeakKeyDictionary()
_ENDED_LOCKS: weakref.WeakKeyDictionary[Muster, asyncio.Lock] = weakref.WeakKeyDictionary()


def _count_ended(m: Muster) -> dict[str, int]:
    """How many jobs history holds in each state a job ends in (as the jobs list counts
    them: `/jobs?state=...` reads history)."""
    assert m.history is not None
    return m.history.count_by_state([st.value for st in ENDED])


async def _ended_counts(m: Muster) -> dict[str, int] | None:
    """_count_ended at most ENDED_COUNTS_MAX_AGE_S old, asked by one request at a time
    (the overviews that refresh together wait for its answer); None while history does
    not give them (any error of the database's: logged, and not asked again for as long)."""
    kept = _ENDED_COUNTS.get(m)
    if kept is not None and time.monotonic() - kept[0] < ENDED_COUNTS_MAX_AGE_S:
        return kept[1]
    async with _ENDED_LOCKS.setdefault(m, asyncio.Lock()):
        kept = _ENDED_COUNTS.get(m)
        if kept is not None and time.monotonic() - kept[0] < ENDED_COUNTS_MAX_AGE_S:
            return kept[1]
        counts: dict[str, int] | None
        try:
            counts = await run_in_threadpool(_count_ended, m)
        except SQLAlchemyError as exc:  # down, or refusing (a permission, a missing table): not a 500
            log.warning("the overview's ended jobs: history did not answer: %s", down_text(exc))
            counts = None
        _ENDED_COUNTS[m] = (time.monotonic(), counts)
        return counts


async def _job_counts(m: Muster) -> tuple[list[tuple[str, int]], bool]:
    """Jobs by state for the overview, and whether history did not answer. Jobs not ended
    are counted from the live state; ended ones from history, since the live state forgets
    them MUSTER_FINISHED_JOB_TTL after they end (found by exploring: the card said "No jobs
    yet" an hour after the last job ended, and its SUCCEEDED and FAILED counts disagreed
    with the jobs list's). With history down, the ended jobs the live state still holds
    (the page says so; the database's own words only in the log)."""
    live = m.state.job_counts()
    ended = await _ended_counts(m) if m.history is not None else {}
    counts = [(st.value, (ended or {}).get(st.value, live.get(st.value, 0)) if st.terminal else
               live.get(st.value, 0)) for st in JobState]
    return counts, ended is None


@console()
async def overview(request: Request) -> Response:
    m = muster_of(request)
    now = time.time()
    snap = await reads_for(m).summary()
    jobs, history_down = await _job_counts(m)
    ctx = {
        "snap": snap,
        "jobs": jobs,
        "jobs_total": sum(n for _, n in jobs),
        "jobs_history_down": history_down,
        "gpu_meter": _meter(snap.gpus_allocated, snap.gpus_total),
        "cpu_meter": _meter(snap.cpu_used, snap.cpus),
        "mem_meter": _meter(snap.mem_used_mb, snap.memory_mb),
        "heat": _heatmap(m, snap, now),
        "heat_class": heat_class,
        "term": m.term,
        "leader": m.leader,
        "role": m.role,
        "replica": m.config.name,
        "live_url": "/",
        "sse_on": "job host stats",
    }
    return render(request, "_overview.html" if is_htmx(request) else "overview.html", ctx)


# ---------------------------------------------------------------- the hosts table

# The table's sort columns (server.views.hosts.ORDERS, "-" reversing), and its filters.
HOST_SORTS = ("id", "health", "util", "alloc")
HOST_FILTERS = ("q", "health", "rack", "zone", "model", "cordoned", "faults", "pressure", "sort")
CORDONED_CHOICES = {"yes": "Cordoned", "no": "Not cordoned", "draining": "Draining",
                    "scheduled": "Drain scheduled"}
FAULTS_CHOICES = {"yes": "With a faulted GPU", "no": "No faulted GPU"}
PRESSURE_CHOICES = {"yes": "Asking for no new work", "no": "Taking new work"}


def console_query(f: dict[str, str]) -> HostQuery:
    """The read model's query for the hosts table's filters (query-string values)."""
    cord = f.get("cordoned", "")
    return HostQuery(search=f.get("q") or None, health=frozenset({f["health"]}) if f.get("health") else None,
                     rack=f.get("rack") or None, zone=f.get("zone") or None, model=f.get("model") or None,
                     cordoned={"yes": True, "no": False}.get(cord), draining=True if cord == "draining" else None,
                     drain_scheduled=True if cord == "scheduled" else None,
                     gpu_faults={"yes": True, "no": False}.get(f.get("faults", "")),
                     pressure={"yes": True, "no": False}.get(f.get("pressure", "")))


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
    if f["faults"] not in FAULTS_CHOICES:
        f["faults"] = ""
    if f["pressure"] not in PRESSURE_CHOICES:
        f["pressure"] = ""
    sort = f["sort"]
    if sort.lstrip("-") not in HOST_SORTS or sort == "id":
        f["sort"] = ""
    for k in ("health", "cordoned", "faults", "pressure", "sort"):
        if qp.get(k) is not None and f[k] != qp.get(k):
            canonical = False
    return f, canonical


@console()
async def hosts(request: Request) -> Response:
    f, canonical = _host_filters(request)
    if not canonical and not is_htmx(request):
        return RedirectResponse(url("/hosts", **f, page=request.query_params.get("page")), status_code=303)
    m = muster_of(request)
    now = time.time()
    views = await reads_for(m).hosts(console_query(f), f["sort"] or "id")
    page, pages = clamp_page(len(views), page_arg(request))
    rows = views[(page - 1) * PER_PAGE : page * PER_PAGE]
    m.hosts.refresh(rows, now)
    snap = await reads_for(m).summary() if not is_htmx(request) else None
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
        "faults_choices": FAULTS_CHOICES,
        "pressure_choices": PRESSURE_CHOICES,
        "page": page,
        "pages": pages,
        "prev_url": url("/hosts", **f, page=page - 1) if page > 1 else None,
        "next_url": url("/hosts", **f, page=page + 1) if page < pages else None,
        "first_url": url("/hosts", **f, page=1) if page > 1 else None,
        "last_url": url("/hosts", **f, page=pages) if page < pages else None,
        "live_url": url("/hosts", **f, page=page),
        "sse_on": "host stats",
    }
    return render(request, "_hosts.html" if is_htmx(request) else "hosts.html", ctx)


# ---------------------------------------------------------------- one host


def _host_ctx(m: Muster, host_id: str, tel: Telemetry | None = None) -> dict[str, Any] | None:
    view = m.hosts.row(host_id, time.time())
    if view is None:
        return None
    entry = m.state.hosts[host_id]
    hb = entry.latest()
    assert hb is not None
    alloc = m.state.allocs.get(host_id)
    samples: list[Sample] = []
    if tel is not None:
        tel.watch(host_id)
        samples = tel.samples(host_id)
    return {
        "h": view,
        "hb": hb,
        "gpus": m.hosts.devices(host_id),
        "tasks": list(alloc.tasks) if alloc else [],
        "jobs": {t.job_id: j for t in (alloc.tasks if alloc else []) if (j := m.state.jobs.get(t.job_id)) is not None},
        "cfg": m.state.hostcfg.get(host_id),
        # What its agent reports that placement does not read (scheduling.hostlabels).
        "labels_ignored": sorted((k, v) for k, v in view.agent_labels.items() if view.labels.get(k) != v),
        "labels_disputed": host_id in m.state.label_disputes,
        "reserved_for": m.jobs.reserved_on(host_id),
        "set_aside": advance.on_host(m.state.advance.values(), host_id, time.time()),
        "now": time.time(),
        "whom": advance.whom,
        "charts": gpu_charts(samples),
        "samples": len(samples),
        "window_s": (samples[-1].ts - samples[0].ts) if len(samples) > 1 else 0.0,
        "spark_w": SPARK_W,
        "spark_h": SPARK_H,
        "live_url": f"/hosts/{host_id}",
        # What the action forms depend on (see the job page's).
        "actions_version": "|".join(map(str, (view.cordoned, view.draining, view.drain_at, view.gpus_unhealthy))),
        "sse_on": "host stats job",
        "sse_id": host_id,
    }


# Attempts listed on a host's page, the newest first, from history.
RECENT_ATTEMPTS = 20


@console()
async def host_detail(request: Request) -> Response:
    host_id = request.path_params["host_id"]
    m = muster_of(request)
    ctx = _host_ctx(m, host_id, telemetry(request))
    if ctx is None:
        raise no_such_host(host_id)
    ctx["errors"] = {}
    if wants_live_part(request):  # the live part, every few seconds: no database read
        return render(request, "_host.html", ctx)
    await _recent_attempts(m, host_id, ctx)
    return render(request, "host.html", ctx)


async def _recent_attempts(m: Muster, host_id: str, ctx: dict[str, Any]) -> None:
    """The host's latest attempts as history has them (what ran here and how it ended, for
    a host suspected of failing its jobs), and how many there are in all."""
    ctx["recent"], ctx["recent_total"], ctx["history_down"] = [], 0, ""
    if m.history is None:
        return
    try:
        ctx["recent"] = await run_in_threadpool(m.history.list_attempts, host_id=host_id, limit=RECENT_ATTEMPTS,
                                                newest_first=True)
        ctx["recent_total"] = await run_in_threadpool(m.history.count_attempts, host_id=host_id)
    except DATABASE_DOWN as exc:  # the host's live state is shown all the same
        log.warning("history did not answer the host page: %s", down_text(exc))
        ctx["history_down"] = True


async def _host_form_error(request: Request, m: Muster, host_id: str, form_name: str,
                     exc: MusterError, values: dict[str, str]) -> Response:
    """The host page again, with `exc` shown at the form that failed."""
    ctx = _host_ctx(m, host_id, telemetry(request))
    if ctx is None:
        raise no_such_host(host_id)
    ctx["errors"] = {form_name: [e.message for e in exc.details()]}
    ctx["reason_value"] = values.get("reason", "")
    ctx["form_values"] = values
    await _recent_attempts(m, host_id, ctx)
    return render(request, "host.html", ctx, status_for(exc))


async def _reasoned_action(request: Request, form_name: str, notice: str,
                           act: Callable[[Muster, str, str, str], Awaitable[object]],
                           values: dict[str, str] | None = None) -> Response:
    """A host form that needs a reason: `act(muster, host id, user, reason)`, then the
    host's page with `notice`, or the page again with the error at the form."""
    m = muster_of(request)
    host_id = request.path_params["host_id"]
    sess: Session = request.state.session
    form = await read_form(request)
    reason = form.get("reason", "").strip()
    if m.hosts.row(host_id, time.time()) is None:
        raise no_such_host(host_id)
    try:
        if not reason:
            raise ValidationError("reason", "a reason is required", "REQUIRED")
        await act(m, host_id, sess.user, reason)
    except FORM_ERRORS as exc:
        return await _host_form_error(request, m, host_id, form_name, exc, {"reason": reason, **(values or {})})
    return RedirectResponse(url(f"/hosts/{host_id}", notice=notice), status_code=303)


@console(csrf=True, action=True, hosts=True)
async def cordon(request: Request) -> Response:
    return await _reasoned_action(request, "cordon", "cordoned",
                                  lambda m, host_id, user, reason: m.set_cordon(host_id, True, user, reason))


@console(csrf=True, action=True, hosts=True)
async def uncordon(request: Request) -> Response:
    return await _reasoned_action(request, "uncordon", "uncordoned",
                                  lambda m, host_id, user, reason: m.set_cordon(host_id, False, user, reason))


@console(csrf=True, action=True, hosts=True)
async def clear_gpu_faults(request: Request) -> Response:
    form = await read_form(request)
    raw = form.get("gpus", "").strip()

    async def clear(m: Muster, host_id: str, user: str, reason: str) -> None:
        try:
            gpus = [int(x) for x in raw.replace(",", " ").split()] if raw else None
        except ValueError:
            raise ValidationError("gpus", "GPU indices are whole numbers, such as 2 or 2, 3", "INVALID") from None
        await m.clear_gpu_faults(host_id, user, reason, gpus)

    return await _reasoned_action(request, "gpus", "gpus-cleared", clear, {"gpus": raw})


DRAIN_DEFAULT_S = f"{DRAIN_DEADLINE_S:g}"
templates.env.globals["drain_default_s"] = DRAIN_DEFAULT_S  # (the form's value)


@console(csrf=True, action=True, hosts=True)
async def drain(request: Request) -> Response:
    m = muster_of(request)
    host_id = request.path_params["host_id"]
    sess: Session = request.state.session
    form = await read_form(request)
    reason = form.get("reason", "").strip()
    raw_deadline = form.get("deadline_s", "").strip() or DRAIN_DEFAULT_S
    raw_at = form.get("at", "").strip()
    values = {"reason": reason, "deadline_s": raw_deadline, "at": raw_at}
    if m.hosts.row(host_id, time.time()) is None:
        raise no_such_host(host_id)
    errors: list[ValidationError] = []
    if not reason:
        errors.append(ValidationError("reason", "a reason is required", "REQUIRED"))
    try:
        deadline = float(raw_deadline)
        if not math.isfinite(deadline):
            raise ValueError
    except ValueError:
        deadline = -1.0
        errors.append(ValidationError("deadlineSeconds", "the deadline must be a number of seconds", "INVALID"))
    at: float | None = None
    if raw_at:
        try:  # the form's date and time, in UTC
            at = parse_time(raw_at).timestamp()
        except ValueError:
            errors.append(ValidationError("at", "the start must be a date and time, such as 2026-12-24T06:00",
                                          "INVALID"))
    try:
        if errors:
            raise InvalidInput(errors)
        await m.drain(host_id, sess.user, reason, deadline, at)
    except FORM_ERRORS as exc:
        return await _host_form_error(request, m, host_id, "drain", exc, values)
    ahead = at is not None and at > time.time()
    return RedirectResponse(url(f"/hosts/{host_id}", notice="drain-scheduled" if ahead else "draining"),
                            status_code=303)
