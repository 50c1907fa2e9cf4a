"""Sign-in: the session cookie, CSRF tokens, the `console()` endpoint decorator (sign-in,
CSRF and role checks, errors mapped to HTTP, security headers), form reading, and the
login and logout handlers.

The cookie holds a random session id (server.api.auth.open_session), never anything a
token list shows; the session ends when it expires (MUSTER_SESSION_TTL), when its token
is revoked, or at sign-out, on every replica. The cookie is `Secure` on HTTPS, including
behind a TLS-terminating proxy the server trusts (MUSTER_TRUSTED_PROXIES: its
X-Forwarded-Proto). Failed sign-ins are limited per client address (`LoginThrottle`).

The cookie is SameSite=Lax, not Strict: a link to a console page followed from elsewhere
(a chat, a ticket) keeps the session (found by exploring: under Strict it landed on the
sign-in form). Lax sends it with another site's top-level GET only, and no GET handler
changes anything; every state-changing request is a POST that needs the CSRF token (the
sign-in form aside, which checks where it was posted from). Sent to sign in from a page,
the browser comes back to it afterwards (`next`: a path on this console only,
`local_path`)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from server.api import auth
from server.api.auth import check_token, require_cluster_wide
from server.history.database import DATABASE_DOWN, down_text
from server.state.cluster import TokenInfo
from web.console.errors import MAPPED, error_response
from web.console.render import error_page, is_htmx, muster_of, render, secure, url
from wire.errors import Forbidden

log = logging.getLogger(__name__)

COOKIE = "muster_session"
MAX_FORM_BYTES = 256 * 1024
MAX_TOKEN_CHARS = 1024
# Failed sign-ins allowed per client address and window; past that, 429 until the window
# has room again.
LOGIN_FAILURES = 10
LOGIN_WINDOW_S = 60.0

BAD_CSRF = "The form's security token is missing or wrong."


def csrf_token(session_hash: str) -> str:
    return hmac.new(session_hash.encode(), b"csrf", hashlib.sha256).hexdigest()


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

    @property
    def is_admin(self) -> bool:
        """Manage queues and advance reservations."""
        return self.info.role == "admin"

    @property
    def can_act_on_hosts(self) -> bool:
        """Cordon, drain, clear GPU faults: not a viewer's nor a team's token (one bound to queues)."""
        return self.can_act and self.info.cluster_wide

    def may_manage(self, queue: str) -> bool:
        """Cancel, and see the environment of, a job of `queue`."""
        return self.can_act and self.info.may_manage(queue)

    @property
    def csrf(self) -> str:
        return csrf_token(self.hash)


def session_of(request: Request) -> Session | None:
    """The request's session: its cookie holds the id of a live session (not expired, not
    signed out, its token not revoked)."""
    found = auth.session_of(muster_of(request).state, request.cookies.get(COOKIE, ""))
    return Session(*found) if found is not None else None


class LoginThrottle:
    """At most `failures` failed sign-ins per client address in `window_s` seconds.
    Bounded: the addresses seen longest ago are forgotten past `max_clients`."""

    def __init__(self, failures: int = LOGIN_FAILURES, window_s: float = LOGIN_WINDOW_S,
                 max_clients: int = 10_000) -> None:
        self.failures = failures
        self.window_s = window_s
        self.max_clients = max_clients
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def wait_s(self, client: str, now: float) -> float:
        """Seconds before `client` may try again (0: now)."""
        times = self._seen.get(client)
        if times is None:
            return 0.0
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) < self.failures:
            return 0.0
        return times[0] + self.window_s - now

    def failed(self, client: str, now: float) -> None:
        times = self._seen.pop(client, None) or deque()
        times.append(now)
        while len(times) > self.failures:
            times.popleft()
        self._seen[client] = times  # most recent last
        while len(self._seen) > self.max_clients:
            self._seen.popitem(last=False)


def _throttle(request: Request) -> LoginThrottle:
    state = request.app.state
    if getattr(state, "login_throttle", None) is None:
        state.login_throttle = LoginThrottle()
    throttle: LoginThrottle = state.login_throttle
    return throttle


MAX_NEXT_CHARS = 2048


def local_path(value: str | None) -> str:
    """Where to send the browser after sign-in: `value` if it is a path on this console
    (one "/" first: "//host" is another site to a browser; no scheme, no backslash,
    which browsers read as "/", and no space or control character, which they drop, so
    "/\\t/host" is "//host"), else "/". The sign-in form cannot be made to send a signed-in
    browser to another site."""
    if not value or len(value) > MAX_NEXT_CHARS or not value.startswith("/") or value.startswith("//"):
        return "/"
    if "\\" in value or any(c.isspace() or not c.isprintable() for c in value):
        return "/"
    try:
        parts = urlsplit(value)
    except ValueError:
        return "/"
    return "/" if parts.scheme or parts.netloc else value


def _login_url(request: Request) -> str:
    """The sign-in form, with the page asked for to come back to after it: a page (a GET,
    not the event stream; not the overview, where sign-in leads anyway)."""
    if request.method != "GET" or request.url.path in ("/", "/events/stream"):
        return "/login"
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1").partition("?")[0] if isinstance(raw, bytes) and raw else request.url.path
    query = request.url.query
    return url("/login", next=local_path(path + (f"?{query}" if query else "")))


def _unauthenticated(request: Request) -> Response:
    if is_htmx(request):
        resp = Response("not signed in", status_code=401, media_type="text/plain")
        resp.headers["HX-Redirect"] = _login_url(request)
        return resp
    return RedirectResponse(_login_url(request), status_code=303)


async def read_form(request: Request) -> dict[str, str]:
    form = await request.form(max_files=0, max_fields=64, max_part_size=MAX_FORM_BYTES)
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _csrf_ok(form: dict[str, str], sess: Session) -> bool:
    return hmac.compare_digest(form.get("csrf", "").encode(), sess.csrf.encode())


Handler = Callable[[Request], Awaitable[Response]]


def console(*, auth: bool = True, csrf: bool = False, action: bool = False,
            hosts: bool = False, admin: bool = False) -> Callable[[Handler], Handler]:
    """Wrap a console endpoint: sign-in check, CSRF check (POST), role check (`action`:
    not for viewers; `hosts`: an action on a host, not for a team's token, one bound to
    queues; `admin`: an admin's token only), the error hierarchy mapped to HTTP
    (errors.status_for), security headers."""

    def deco(fn: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                resp = await _guarded(fn, request, auth=auth, csrf=csrf, action=action, hosts=hosts, admin=admin)
            except MAPPED as exc:
                resp = error_response(request, exc)
            except DATABASE_DOWN as exc:
                # (found by exploring: pages that read job history were a bare 500 while its
                # database was down). The database's own words (its host and port) go to the
                # log, not to every signed-in viewer, as GraphQL's HISTORY_UNAVAILABLE.
                log.warning("history did not answer a console page: %s", down_text(exc))
                resp = error_page(request, 503, "History unavailable",
                                  "The job history database did not answer (the server's log says why). Live "
                                  "jobs and hosts can still be read, and nothing written is lost.")
            return secure(resp)

        endpoint.__name__ = fn.__name__
        endpoint.__doc__ = fn.__doc__
        return endpoint

    return deco


async def _guarded(fn: Handler, request: Request, *, auth: bool, csrf: bool, action: bool,
                   hosts: bool, admin: bool) -> Response:
    length = request.headers.get("content-length", "")
    if request.method == "POST" and length.isdigit() and int(length) > MAX_FORM_BYTES:
        return error_page(request, 413, "Too large", "The form is too large.")
    if auth:
        sess = session_of(request)
        if sess is None:
            return _unauthenticated(request)
        request.state.session = sess
        if csrf:
            try:
                form = await read_form(request)
            except Exception:  # noqa: BLE001 - malformed body
                return error_page(request, 400, "Bad request", "The form could not be read.")
            if not _csrf_ok(form, sess):
                raise Forbidden(f"{BAD_CSRF} Reload the page and try again.")
        if action and not sess.can_act:
            raise Forbidden(f"Your token's role ({sess.info.role}) may only view.")
        if hosts:
            require_cluster_wide(sess.info)
        if admin and not sess.is_admin:
            raise Forbidden(f"This needs an admin's token (yours has the {sess.info.role} role).")
    return await fn(request)


# ---------------------------------------------------------------- login / logout


@console(auth=False)
async def login_form(request: Request) -> Response:
    target = local_path(request.query_params.get("next"))
    if session_of(request) is not None:
        return RedirectResponse(target, status_code=303)
    return render(request, "login.html", {"error": None, "next": target})


def _foreign_origin(request: Request) -> bool:
    """Whether the request's Origin names another host than the one it was sent to (the
    Host header a proxy passes on; ports aside: a proxy's `Host $host` drops its port), or
    is "null"."""
    origin = request.headers.get("origin")
    if origin is None:
        return False
    if origin.strip().lower() == "null":
        return True
    try:
        return urlsplit(origin.strip()).hostname != urlsplit("//" + request.headers.get("host", "").strip()).hostname
    except ValueError:  # (a malformed one, "[" in it: refused, not a 500)
        return True


@console(auth=False)
async def login(request: Request) -> Response:
    site = request.headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site") or (site is None and _foreign_origin(request)):
        # A form on another site signing the browser in under a token of its choosing (login
        # CSRF: what the victim then submits, the token's owner sees). Browsers say where
        # a form came from: Sec-Fetch-Site, or from older browsers only Origin ("null" from
        # a sandboxed frame), read only then (a proxy that rewrites the Host header would
        # make the console's own origin look foreign); a request that says neither (a
        # script) is let in.
        return render(request, "login.html", {"error": "Sign in from this console's own page."}, 403)
    try:
        form = await read_form(request)
    except Exception:  # noqa: BLE001
        form = {}
    target = local_path(form.get("next"))  # the page that sent the browser here
    client = request.client.host if request.client else "?"
    throttle = _throttle(request)
    wait = throttle.wait_s(client, time.monotonic())
    if wait > 0:
        resp = render(request, "login.html",
                      {"error": f"Too many failed sign-ins from your address: try again in {math.ceil(wait)} s.",
                       "next": target}, 429)
        resp.headers["Retry-After"] = str(math.ceil(wait))
        return resp
    token = form.get("token", "").strip()
    m = muster_of(request)
    info = check_token(m.state, token) if 0 < len(token) <= MAX_TOKEN_CHARS else None
    if info is None:
        throttle.failed(client, time.monotonic())
        return render(request, "login.html", {"error": "That token is not valid.", "next": target}, 401)
    assert m.store is not None
    session_id = await auth.open_session(m.store, m.state, token, m.config.session_ttl_s)
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(
        COOKIE, session_id, max_age=int(m.config.session_ttl_s), httponly=True, samesite="lax", path="/",
        secure=request.url.scheme == "https",
    )
    return resp


@console(auth=False)
async def logout(request: Request) -> Response:
    sess = session_of(request)
    if sess is not None:
        try:
            form = await read_form(request)
        except Exception:  # noqa: BLE001
            form = {}
        if not _csrf_ok(form, sess):
            request.state.session = sess
            raise Forbidden(BAD_CSRF)
        m = muster_of(request)
        assert m.store is not None
        await auth.close_session(m.store, m.state, sess.hash)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="lax",
                       secure=request.url.scheme == "https")
    return resp
