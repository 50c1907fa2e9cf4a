"""The alerts page: alerts as recorded in history (server.history), newest first."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from web.console.render import PER_PAGE, clamp_page, muster_of, page_arg, render, url
from web.console.session import console
from wire import subjects

# Every kind the control plane publishes (wire.subjects), each a filter.
ALERT_KINDS = subjects.ALERT_KINDS


@console()
async def alerts(request: Request) -> Response:
    """Alerts as recorded in history, newest first (also published on `alerts.>`)."""

    m = muster_of(request)
    kind = request.query_params.get("kind", "").strip()
    if kind not in ALERT_KINDS:
        kind = ""
    page = page_arg(request)
    assert m.history is not None
    rows, total = await run_in_threadpool(m.history.list_alerts, kind or None, PER_PAGE, (page - 1) * PER_PAGE)
    asked = page
    page, pages = clamp_page(total, page)
    if page != asked and total:
        # Past the last page: the last one, as the jobs and hosts pages show it (found by
        # exploring: it said "No alerts yet." with no pager).
        rows, total = await run_in_threadpool(m.history.list_alerts, kind or None, PER_PAGE, (page - 1) * PER_PAGE)
        page, pages = clamp_page(total, page)
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
        "live_url": url("/alerts", kind=kind),
    }
    return render(request, "alerts.html", ctx)
