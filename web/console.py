"""The operator console: server-rendered jinja2 pages, refreshed in place by htmx.

Sign-in takes an API token and keeps only its SHA-256 hash in the `muster_session`
cookie; a page is served only while `muster.state.tokens` still holds that hash, so a
revoked token logs the browser out at its next request. Every POST except the login
form carries a `csrf` field (HMAC-SHA256 of "csrf" keyed by the session hash).

Pages never use inline scripts or styles (see CSP below): CSS and htmx come from
/static. The live parts of a page sit in one element (`#live`) that polls its own URL
every 2 s; an htmx request (header `HX-Request`) gets only that fragment back.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.templating import Jinja2Templates

from server.auth import check_token, token_hash
from server.cluster import TokenInfo
from server.errors import StoreError
from server.messages import Job, JobState
from server.runtime import Muster, UserError
from server.validation import KNOWN_GPU_MODELS

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

# Field names used by server.validation -> names of the submit form's inputs.
SUBMIT_FIELDS = {"name": "name", "command": "command", "gpus": "gpus", "gpuModel": "gpu_model",
                 "gpu_model": "gpu_model", "cpus": "cpus", "memoryMb": "memory_mb",
                 "memory_mb": "memory_mb"}

# Short notices a redirect may ask a page to show (never free text from the URL).
NOTICES = {
    "cancel": "Cancel requested. The leader stops the job shortly.",
    "cordoned": "Host cordoned: no new work is placed on it.",
    "uncordoned": "Host uncordoned: it takes new work again.",
    "submitted": "Job submitted.",
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
    return request.app.state.muster  # type: ignore[no-any-return]


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


@console()
async def overview(request: Request) -> Response:
    m = _muster(request)
    s = m.summary()
    views = m.host_views()
    ctx = {
        "s": s,
        "jobs": [(st.value, s.jobs.get(st.value, 0)) for st in JobState],
        "jobs_total": sum(s.jobs.values()),
        "simulated": sum(1 for v in views if v.simulated),
        "cordoned": sum(1 for v in views if v.cordoned),
        "term": m.state.term,
        "leader": m.state.leader,
        "role": m.role,
        "replica": m.config.name,
        "live_url": "/",
    }
    return render(request, "_overview.html" if _is_htmx(request) else "overview.html", ctx)


# ---------------------------------------------------------------- hosts


@console()
async def hosts(request: Request) -> Response:
    m = _muster(request)
    q = request.query_params.get("q", "").strip()[:64]
    views = m.host_views()
    if q:
        views = [v for v in views if q.lower() in v.id.lower()]
    page, pages = _pages(len(views), _page_arg(request))
    rows = views[(page - 1) * PER_PAGE : page * PER_PAGE]
    ctx = {
        "rows": rows,
        "total": len(views),
        "any_hosts": bool(m.state.hosts),
        "q": q,
        "page": page,
        "pages": pages,
        "prev_url": url("/hosts", q=q, page=page - 1) if page > 1 else None,
        "next_url": url("/hosts", q=q, page=page + 1) if page < pages else None,
        "first_url": url("/hosts", q=q, page=1) if page > 1 else None,
        "last_url": url("/hosts", q=q, page=pages) if page < pages else None,
        "live_url": url("/hosts", q=q, page=page),
    }
    return render(request, "_hosts.html" if _is_htmx(request) else "hosts.html", ctx)


def _host_ctx(m: Muster, host_id: str) -> dict[str, Any] | None:
    view = m.host_view(host_id)
    if view is None:
        return None
    entry = m.state.hosts[host_id]
    hb = entry.latest()
    assert hb is not None
    usage = {u.index: u for u in hb.gpu_usage}
    alloc = m.state.allocs.get(host_id)
    return {
        "h": view,
        "hb": hb,
        "gpus": [(g, usage.get(g.index)) for g in sorted(hb.gpus, key=lambda g: g.index)],
        "tasks": list(alloc.tasks) if alloc else [],
        "cfg": m.state.hostcfg.get(host_id),
        "live_url": f"/hosts/{host_id}",
    }


@console()
async def host_detail(request: Request) -> Response:
    host_id = request.path_params["host_id"]
    ctx = _host_ctx(_muster(request), host_id)
    if ctx is None:
        return error_page(request, 404, "No such host", f"No host {host_id!r} has reported to this cluster.")
    ctx["errors"] = {}
    return render(request, "_host.html" if _is_htmx(request) else "host.html", ctx)


async def _cordon(request: Request, cordoned: bool) -> Response:
    m = _muster(request)
    host_id = request.path_params["host_id"]
    sess: Session = request.state.session
    form = await _form(request)
    reason = form.get("reason", "").strip()
    if m.host_view(host_id) is None:
        return error_page(request, 404, "No such host", f"No host {host_id!r} has reported to this cluster.")
    errors: list[UserError] = []
    if not reason:
        errors = [UserError("reason", "a reason is required", "REQUIRED")]
    else:
        errors = await m.set_cordon(host_id, cordoned, sess.user, reason)
    if errors:
        ctx = _host_ctx(m, host_id)
        if ctx is None:
            return error_page(request, 404, "No such host", f"No host {host_id!r} has reported to this cluster.")
        ctx["errors"] = {("uncordon" if not cordoned else "cordon"): [e.message for e in errors]}
        ctx["reason_value"] = reason
        return render(request, "host.html", ctx, 422)
    return RedirectResponse(url(f"/hosts/{host_id}", notice="cordoned" if cordoned else "uncordoned"),
                            status_code=303)


@console(csrf=True, action=True)
async def cordon(request: Request) -> Response:
    return await _cordon(request, True)


@console(csrf=True, action=True)
async def uncordon(request: Request) -> Response:
    return await _cordon(request, False)


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
    shown = _overlay(m, rows, state, first_page=page == 1)
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
    }
    return render(request, "_jobs.html" if _is_htmx(request) else "jobs.html", ctx)


def _overlay(m: Muster, rows: list[Job], state: str, *, first_page: bool) -> list[Job]:
    """History rows replaced by the live records (fresher); on the first page, live jobs
    newer than anything history has written yet are added on top."""
    live = m.state.jobs
    out = [live.get(j.id, j) for j in rows]
    if state:
        out = [j for j in out if j.state.value == state]
    if first_page:
        seen = {j.id for j in rows}
        newest = max(((j.submitted_at, j.id) for j in rows), default=None)
        extra = [
            j for j in list(live.values())
            if j.id not in seen and (not state or j.state.value == state)
            and (newest is None or (j.submitted_at, j.id) > newest)
        ]
        if extra:
            out = sorted(extra + out, key=lambda j: (j.submitted_at, j.id), reverse=True)[:PER_PAGE]
    return out


async def _job_ctx(m: Muster, job_id: str) -> dict[str, Any] | None:
    if not ID_RE.fullmatch(job_id):
        return None
    job = await run_in_threadpool(m.get_job, job_id)
    if job is None:
        return None
    live = m.state.jobs.get(job_id)
    if live is not None:
        job = live
    why = sorted(m.why_pending(job).items(), key=lambda kv: (-kv[1], kv[0]))
    events: list[Any] = []
    if m.history is not None:
        try:
            events = await run_in_threadpool(m.history.events_for_job, job_id)
        except Exception:  # noqa: BLE001 - history is a convenience here
            events = []
    return {
        "job": job,
        "why": why,
        "hosts_known": len(m.state.hosts),
        "position": m.queue_position(job),
        "queued_total": len(m.state.queued()),
        "events": events,
        "live_url": f"/jobs/{job_id}",
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
    errors = await m.cancel(job_id, by=sess.user, reason=reason)
    if errors:
        ctx["errors"] = [e.message for e in errors]
        ctx["reason_value"] = reason
        return render(request, "job.html", ctx, 409 if errors[0].code == "ALREADY_FINISHED" else 422)
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
    job, problems = await m.submit(data, sess.user)
    if job is not None:
        return RedirectResponse(url(f"/jobs/{job.id}", notice="submitted"), status_code=303)
    errors: dict[str, list[str]] = dict(local)
    other: list[str] = []
    for p in problems:
        field = SUBMIT_FIELDS.get(p.field)
        if field is None:
            other.append(f"{p.field}: {p.message}")
        elif field not in local:
            errors.setdefault(field, []).append(p.message)
    return render(request, "submit.html", _submit_ctx(m, values, errors, other), 422)


# ---------------------------------------------------------------- routes


def console_routes() -> list[BaseRoute]:
    return [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview, methods=["GET"]),
        Route("/hosts", hosts, methods=["GET"]),
        Route("/hosts/{host_id}", host_detail, methods=["GET"]),
        Route("/hosts/{host_id}/cordon", cordon, methods=["POST"]),
        Route("/hosts/{host_id}/uncordon", uncordon, methods=["POST"]),
        Route("/jobs", jobs, methods=["GET"]),
        Route("/jobs/{job_id}", job_detail, methods=["GET"]),
        Route("/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
        Route("/submit", submit_form, methods=["GET"]),
        Route("/submit", submit, methods=["POST"]),
    ]


__all__ = ["COOKIE", "SECURITY_HEADERS", "console_routes", "csrf_token"]
