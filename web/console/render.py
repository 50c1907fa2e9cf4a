"""Rendering console responses: the templates and their filters, pages and error pages,
the security headers every response carries, URLs, notices and paging."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from server.replica import Muster
from server.timefmt import duration_text, iso_utc

if TYPE_CHECKING:
    from web.console.session import Session

PER_PAGE = 50

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

# Short notices a redirect may ask a page to show (never free text from the URL).
NOTICES = {
    "cancel": "Cancel requested. The leader stops the job shortly.",
    "cordoned": "Host cordoned: no new work is placed on it.",
    "uncordoned": "Host uncordoned: it takes new work again.",
    "submitted": "Job submitted.",
    "held": "Hold requested: the job stays queued and is not placed until released.",
    "released": "Release requested: the job takes its place in its queue again.",
    "priority": "Priority change requested: the job moves in its queue's order.",
    "time-limit": "Time limit change requested: the leader applies it to the job and its running try shortly.",
    "requeued": ("Requeue requested: the job's tasks are stopped and it is queued again at its place (not counted "
                 "as a try)."),
    "gpus-cleared": ("GPU fault marks cleared: the host's agent forgets them at its next assignment, and its "
                     "GPUs take work again until a new fault."),
    "draining": ("Host draining: no new work is placed on it; what still runs at the deadline is stopped and "
                 "requeued elsewhere."),
    "drain-scheduled": ("Drain scheduled: until it begins the host takes only jobs whose time limit ends them by "
                        "its deadline; from then on it drains."),
    "advres-created": ("Advance reservation made: until it opens, other jobs take its hosts only if their time "
                       "limit ends them by its start; while it is open, only its jobs are placed there."),
    "advres-deleted": "Advance reservation deleted: its hosts are every queue's again.",
}

templates = Jinja2Templates(directory=str(Path(__file__).resolve().parent / "templates"))


def utc(ts: float | None) -> str:
    """A Unix time as UTC ISO 8601 with seconds, or an em dash."""
    return iso_utc(ts) if ts else "—"


def mib(mb: int | float | None) -> str:
    if mb is None:
        return "—"
    if mb >= 1024:
        return f"{mb / 1024:.1f} GiB"
    return f"{int(mb)} MiB"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} %"


def number(value: float) -> str:
    """A number as a form's field shows it and takes it back: no exponent (`%g` wrote a
    time limit of 30 days as 2.592e+06)."""
    return f"{value:.0f}" if value == int(value) else repr(value)


# Characters a job's output may hold that are not text to read: the control characters
# (C0 but tab and newline, DEL, C1) and the bidirectional controls (embeddings, overrides,
# isolates, marks), which reorder or hide what is shown after them, and the line and
# paragraph separators. A carriage return is left, as `muster job logs` leaves it: HTML
# reads it as a newline (a progress bar's updates show one a line).
NOT_TEXT_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                         r"\u202a-\u202e\u2066-\u2069]")


def visible(text: str | None) -> Markup:
    """`text` escaped for HTML, each character of NOT_TEXT_RE shown as its code point
    (`<U+202E>`, in a span of class "ctl") instead of acting on what follows it. Found by
    exploring: a job's output with a right-to-left override showed its lines reordered."""
    if not text:
        return Markup("")
    parts: list[Markup] = []
    pos = 0
    for m in NOT_TEXT_RE.finditer(text):
        parts.append(escape(text[pos:m.start()]))
        parts.append(Markup('<span class="ctl">&lt;U+{:04X}&gt;</span>').format(ord(m.group())))
        pos = m.end()
    parts.append(escape(text[pos:]))
    return Markup("").join(parts)


templates.env.filters["utc"] = utc
templates.env.filters["mib"] = mib
templates.env.filters["pct"] = pct
templates.env.filters["duration"] = duration_text
templates.env.filters["number"] = number
templates.env.filters["visible"] = visible
templates.env.filters["shjoin"] = lambda argv: shlex.join(argv or [])
templates.env.globals["notices"] = NOTICES


def muster_of(request: Request) -> Muster:
    """The replica this app serves."""
    return request.app.state.muster


def is_htmx(request: Request) -> bool:
    """Whether htmx sent the request (it gets the `#live` fragment, or plain-text errors)."""
    return request.headers.get("hx-request", "").lower() == "true"


def wants_live_part(request: Request) -> bool:
    """Whether a page's request is htmx's refresh of its live part (`#live`), not of its
    action forms (`#actions`, live.js), which are outside it: those get the whole page."""
    return is_htmx(request) and request.headers.get("hx-target", "") != "actions"


def url(path: str, **params: Any) -> str:
    q = {k: v for k, v in params.items() if v not in (None, "") and not (k == "page" and v == 1)}
    return f"{path}?{urlencode(q)}" if q else path


def render(
    request: Request, name: str, ctx: dict[str, Any] | None = None, status_code: int = 200,
) -> Response:
    sess: Session | None = getattr(request.state, "session", None)
    csrf = sess.csrf if sess else ""
    context: dict[str, Any] = {
        "session": sess,
        "user": sess.user if sess else None,
        "can_act": bool(sess and sess.can_act),
        "can_act_on_hosts": bool(sess and sess.can_act_on_hosts),
        "is_admin": bool(sess and sess.is_admin),
        "csrf": csrf,
        "csrf_input": Markup('<input type="hidden" name="csrf" value="{}">').format(csrf),
        "path": request.url.path,
        "notice": NOTICES.get(request.query_params.get("notice", "")),
    }
    context.update(ctx or {})
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def error_page(request: Request, status: int, title: str, message: str) -> Response:
    """An error as a page, or as plain text for htmx (which shows it in place)."""
    if is_htmx(request):
        return Response(message, status_code=status, media_type="text/plain")
    return render(request, "error.html", {"title": title, "message": message}, status)


def secure(resp: Response) -> Response:
    for k, v in SECURITY_HEADERS.items():
        resp.headers[k] = v
    return resp


def page_arg(request: Request) -> int:
    """The `page` query parameter: 1 or more (1 when missing or not a number)."""
    try:
        return max(1, min(int(request.query_params.get("page", "1")), 1_000_000))
    except ValueError:
        return 1


def clamp_page(total: int, page: int) -> tuple[int, int]:
    """(page clamped to the last page, number of pages) for `total` rows of PER_PAGE."""
    count = max(1, math.ceil(total / PER_PAGE))
    return min(page, count), count
