"""The operator console: server-rendered jinja2 pages, refreshed in place by htmx.

    render    the templates and their filters (utc, mib, pct, shjoin), `render()`,
              `error_page()`, `url()`, NOTICES, the security headers, `is_htmx`, paging
    errors    the error hierarchy (wire.errors) mapped to HTTP, once: `status_for`
    session   the session cookie, CSRF tokens, the `console()` endpoint decorator
              (sign-in, CSRF, role, errors, security headers), forms, login and logout
    hosts     the overview (meters, heat map), the hosts table (`console_query`),
              a host's page, cordon, uncordon, drain and clear GPU faults
    charts    `Telemetry` (per-host ring buffers of GPU samples) and the SVG sparklines
    jobs      the jobs list (cancel what it matches), a job's page, cancel, hold, release,
              priority and requeue, the submit form
    queues    the queues page (quota against use, fair share) and usage per queue and user
    alerts    the alerts page
    sse       the server-sent event stream
    (here)    `console_routes()`: the route table, static files and htmx

Sign-in takes an API token and opens a console session of its own: the `muster_session`
cookie holds a random session id (never the token or its hash), and a page is served
only while the session is live and its token is not revoked, so a revoked token logs the
browser out at its next request. Every POST except the login form carries a `csrf`
field (HMAC-SHA256 of "csrf" keyed by the session's hash).

Pages never use inline scripts or styles (see CSP, render.SECURITY_HEADERS): CSS, htmx
and the console's own script (`/static/live.js`) come from /static. The live parts of a
page sit in one element (`#live`); an htmx request (header `HX-Request`) gets only that
fragment back. `#live` is refreshed when the server-sent event stream (`/events/stream`)
says something it shows changed; while that stream is not connected (no EventSource, a
proxy that buffers, a restart) it polls its own URL every 2 s instead, and so does a job's
page while a try of it runs (`data-poll`: its output so far changes with no event). A
hidden tab holds no stream (browsers allow six connections per host) and is not polled;
shown again, it reopens the stream and refreshes `#live` once.

Errors: an operation's error (wire.errors) becomes a status in one place,
`errors.status_for`; a form shows it next to its fields with that status, anything else
gets an error page (plain text for htmx).

Scale: the overview and the hosts table read the host read model (`server.views.hosts`,
`muster.hosts`): rows the cluster view keeps and rebuilds only when a host's shape,
allocation or settings change, filtered and sorted by one query (`HostQuery`, `ORDERS`),
and the fleet's totals (`FleetSummary`); there is no console snapshot any more. The jobs
list and a job's page read the job view (`server.views.jobs`, `muster.jobs`). The host
page's charts come from `Telemetry`, a bounded in-memory ring buffer per host that is
filled only while someone views that host.

Imports: `server` (replica, views, api.auth, state.cluster) and `wire`; nothing in
`server` but its composition root (`server.cli`) imports this package.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from web.console import alerts, hosts, jobs, queues, session, sse
from web.console.hosts import console_query
from web.console.render import SECURITY_HEADERS
from web.console.session import COOKIE, csrf_token


async def no_icon(request: Request) -> Response:
    """`/favicon.ico`, which every browser asks for: none (a 404 was logged as an error in
    the browser's console on every page)."""
    return Response(status_code=204)


def console_routes() -> list[BaseRoute]:
    """The console's pages, its static files and htmx (served from the installed
    django-js-lib-htmx package: no CDN)."""
    return [
        Mount("/static/htmx", StaticFiles(packages=[("js_lib_htmx", "static/htmx")]), name="htmx"),
        Mount("/static", StaticFiles(packages=[("web.console", "static")]), name="static"),
        Route("/favicon.ico", no_icon, methods=["GET"]),
        Route("/login", session.login_form, methods=["GET"]),
        Route("/login", session.login, methods=["POST"]),
        Route("/logout", session.logout, methods=["POST"]),
        Route("/", hosts.overview, methods=["GET"]),
        Route("/hosts", hosts.hosts, methods=["GET"]),
        Route("/alerts", alerts.alerts, methods=["GET"]),
        Route("/queues", queues.queues, methods=["GET"]),
        Route("/queues/reservations", queues.create_reservation, methods=["POST"]),
        Route("/queues/reservations/{name}/delete", queues.delete_reservation, methods=["POST"]),
        Route("/hosts/{host_id}", hosts.host_detail, methods=["GET"]),
        Route("/hosts/{host_id}/cordon", hosts.cordon, methods=["POST"]),
        Route("/hosts/{host_id}/uncordon", hosts.uncordon, methods=["POST"]),
        Route("/hosts/{host_id}/drain", hosts.drain, methods=["POST"]),
        Route("/hosts/{host_id}/clear-gpu-faults", hosts.clear_gpu_faults, methods=["POST"]),
        Route("/jobs", jobs.jobs, methods=["GET"]),
        Route("/jobs/cancel", jobs.cancel_matching, methods=["POST"]),
        Route("/jobs/hold", jobs.hold_matching, methods=["POST"]),
        Route("/jobs/release", jobs.release_matching, methods=["POST"]),
        Route("/jobs/{job_id}", jobs.job_detail, methods=["GET"]),
        Route("/jobs/{job_id}/cancel", jobs.cancel_job, methods=["POST"]),
        Route("/jobs/{job_id}/hold", jobs.hold_job, methods=["POST"]),
        Route("/jobs/{job_id}/release", jobs.release_job, methods=["POST"]),
        Route("/jobs/{job_id}/priority", jobs.set_priority, methods=["POST"]),
        Route("/jobs/{job_id}/time-limit", jobs.set_time_limit, methods=["POST"]),
        Route("/jobs/{job_id}/requeue", jobs.requeue_job, methods=["POST"]),
        Route("/submit", jobs.submit_form, methods=["GET"]),
        Route("/submit", jobs.submit, methods=["POST"]),
        Route("/events/stream", sse.event_stream, methods=["GET"]),
    ]


__all__ = ["COOKIE", "SECURITY_HEADERS", "console_query", "console_routes", "csrf_token"]
