"""The queues page: each queue's quota beside what it uses and borrows (a bar per queue
and resource), its pending and running jobs and fair share (server.views.queues), and
the usage per queue and user over the last day, week or month (history)."""

from __future__ import annotations

import time

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from server.scheduling import advance
from server.views.queues import queue_users
from server.views.queues import rows as queue_rows
from web.console.render import is_htmx, muster_of, render
from web.console.session import console

PERIODS = {"day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}
USERS_SHOWN = 5  # per queue, in the users' fair order


@console()
async def queues(request: Request) -> Response:
    m = muster_of(request)
    now = time.time()
    period = request.query_params.get("period", "day")
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
    ctx = {
        "rows": rows,
        "users": users,
        "reservations": reservations,
        "usage": usage,
        "period": period,
        "periods": list(PERIODS),
        "live_url": f"/queues?period={period}",
        "sse_on": "job",
    }
    return render(request, "_queues.html" if is_htmx(request) else "queues.html", ctx)
