"""The queues page: each queue's quota beside what it uses and borrows (a bar per queue
and resource), its pending and running jobs and fair share (server.views.queues), the
advance reservations (an admin makes and deletes them here), and the usage per queue and
user over the last day, week or month (history)."""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from server.scheduling import advance
from server.timefmt import duration_s, parse_time
from server.views.hosts import HostQuery
from server.views.queues import fairness as queue_fairness
from server.views.queues import queue_users
from server.views.queues import rows as queue_rows
from web.console.errors import FORM_ERRORS, status_for
from web.console.render import is_htmx, muster_of, render, url
from web.console.session import Session, console, read_form
from wire.errors import InvalidInput, MusterError, ValidationError

PERIODS = {"day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}
USERS_SHOWN = 5  # per queue, in the users' fair order


RESERVATION_FIELDS = ("name", "hosts", "rack", "label", "queues", "users", "start", "duration", "description")
# The reservation form's labels, by the field an error names (the form's own, and those of
# wire.validation and the operation: its end is the start and the duration together).
RESERVATION_LABELS = {"name": "Name", "hosts": "Hosts", "rack": "Rack", "label": "Label", "queues": "For queues",
                      "users": "For users", "start": "Opens", "starts": "Opens", "startsAt": "Opens",
                      "duration": "For", "ends": "For", "endsAt": "For", "description": "Description"}


def reservation_error(exc: MusterError) -> str:
    """An error of the reservation form, prefixed with the label of the field it is about
    (found by exploring: "no host has it" did not say it was the rack, or the label)."""
    label = RESERVATION_LABELS.get(exc.field, exc.field)  # (one the form has no input for: its name)
    return f"{label}: {exc.message}" if label else exc.message


@console()
async def queues(request: Request) -> Response:
    return render(request, "_queues.html" if is_htmx(request) else "queues.html",
                  await _queues_ctx(request, request.query_params.get("period", "day")))


async def _queues_ctx(request: Request, period: str) -> dict[str, Any]:
    m = muster_of(request)
    now = time.time()
    if period not in PERIODS:
        period = "day"
    rows = queue_rows(m.state, now, m.jobs.half_life_s)
    usage = []
    if m.history is not None:
        usage = await run_in_threadpool(m.history.usage, since=now - PERIODS[period], now=now)
    reservations = [{"name": r.name, "description": r.description, "whom": advance.whom(r), "hosts": r.hosts,
                     "starts": r.starts, "ends": r.ends, "by": r.by,
                     "state": "open" if advance.active(r, now) else "over" if advance.over(r, now) else "upcoming"}
                    for r in sorted(m.state.advance.values(), key=lambda r: (r.starts, r.name))]
    users = {r.queue.name: queue_users(m.state, r.queue.name, now, m.jobs.half_life_s)[:USERS_SHOWN] for r in rows}
    fairness, waiting = queue_fairness(m.state, time.time())
    ctx = {
        "fairness": fairness,
        "waiting": waiting,
        "rows": rows,
        "users": users,
        "reservations": reservations,
        "usage": usage,
        "period": period,
        "periods": list(PERIODS),
        "live_url": f"/queues?period={period}",
        "sse_on": "job",
        "reservation_errors": [],
        "reservation_values": {},
    }
    return ctx


def _names(text: str) -> list[str]:
    return [x for x in re.split(r"[\s,]+", text) if x]


@console(csrf=True, admin=True)
async def create_reservation(request: Request) -> Response:
    """Set hosts aside (Muster.create_advance_reservation): hosts by id, rack or label,
    for queues and users, from a start (none: now) for a duration."""
    m = muster_of(request)
    sess: Session = request.state.session
    form = await read_form(request)
    values = {k: form.get(k, "").strip()[:200_000 if k == "hosts" else 512] for k in RESERVATION_FIELDS}
    errors: list[ValidationError] = []
    now = time.time()
    hosts = _names(values["hosts"])
    if values["rack"] or values["label"]:
        picked = m.hosts.select(HostQuery(rack=values["rack"] or None, label=values["label"] or None), "id", now)
        if not picked:
            errors.append(ValidationError("rack" if values["rack"] else "label", "no host has it", "NOT_FOUND"))
        hosts += [r.id for r in picked]
    if not hosts and not errors:
        errors.append(ValidationError("hosts", "name the hosts to set aside: ids, a rack or a label", "REQUIRED"))
    start = now
    if values["start"]:
        try:  # the form's date and time, in UTC
            start = parse_time(values["start"]).timestamp()
        except ValueError:
            errors.append(ValidationError("start", "the start must be a date and time, such as 2026-12-24T06:00",
                                          "INVALID"))
    length = duration_s(values["duration"])
    if length is None or length <= 0:
        errors.append(ValidationError("duration", "a duration such as 8h or 2d", "INVALID"))
    try:
        if errors:
            raise InvalidInput(errors)
        assert length is not None
        await m.create_advance_reservation(
            {"name": values["name"], "hosts": list(dict.fromkeys(hosts)), "queues": _names(values["queues"]),
             "users": _names(values["users"]), "starts": start, "ends": max(start, now) + length,
             "description": values["description"]}, sess.user)
    except FORM_ERRORS as exc:
        ctx = await _queues_ctx(request, "day")
        ctx["reservation_errors"] = [reservation_error(e) for e in exc.details()]
        ctx["reservation_values"] = values
        return render(request, "queues.html", ctx, status_for(exc))
    return RedirectResponse(url("/queues", notice="advres-created") + "#advance-reservations", status_code=303)


@console(csrf=True, admin=True)
async def delete_reservation(request: Request) -> Response:
    """Give a reservation's hosts back to every queue (Muster.delete_advance_reservation)."""
    m = muster_of(request)
    sess: Session = request.state.session
    await m.delete_advance_reservation(request.path_params["name"], sess.user)
    return RedirectResponse(url("/queues", notice="advres-deleted") + "#advance-reservations", status_code=303)
