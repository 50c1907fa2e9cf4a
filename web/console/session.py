"""Sign-in: the session cookie, CSRF tokens, the `console()` endpoint decorator (sign-in,
CSRF and role checks, errors mapped to HTTP, security headers), form reading, and the
login and logout handlers."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from server.api.auth import check_token, token_hash
from server.state.cluster import TokenInfo
from web.console.errors import MAPPED, error_response
from web.console.render import error_page, is_htmx, muster_of, render, secure
from wire.errors import Forbidden

COOKIE = "muster_session"
MAX_FORM_BYTES = 256 * 1024
MAX_TOKEN_CHARS = 1024
HEX64 = re.compile(r"^[0-9a-f]{64}$")

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
    def csrf(self) -> str:
        return csrf_token(self.hash)


def session_of(request: Request) -> Session | None:
    """The request's session: its cookie names a token hash the cluster still holds."""
    h = request.cookies.get(COOKIE, "")
    if not HEX64.fullmatch(h):
        return None
    info = muster_of(request).state.tokens.get(h)
    return Session(h, info) if info is not None else None


def _unauthenticated(request: Request) -> Response:
    if is_htmx(request):
        resp = Response("not signed in", status_code=401, media_type="text/plain")
        resp.headers["HX-Redirect"] = "/login"
        return resp
    return RedirectResponse("/login", status_code=303)


async def read_form(request: Request) -> dict[str, str]:
    form = await request.form(max_files=0, max_fields=64, max_part_size=MAX_FORM_BYTES)
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _csrf_ok(form: dict[str, str], sess: Session) -> bool:
    return hmac.compare_digest(form.get("csrf", "").encode(), sess.csrf.encode())


Handler = Callable[[Request], Awaitable[Response]]


def console(*, auth: bool = True, csrf: bool = False, action: bool = False) -> Callable[[Handler], Handler]:
    """Wrap a console endpoint: sign-in check, CSRF check (POST), role check (`action`:
    not for viewers), the error hierarchy mapped to HTTP (errors.status_for), security
    headers."""

    def deco(fn: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                resp = await _guarded(fn, request, auth=auth, csrf=csrf, action=action)
            except MAPPED as exc:
                resp = error_response(request, exc)
            return secure(resp)

        endpoint.__name__ = fn.__name__
        endpoint.__doc__ = fn.__doc__
        return endpoint

    return deco


async def _guarded(fn: Handler, request: Request, *, auth: bool, csrf: bool, action: bool) -> Response:
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
    return await fn(request)


# ---------------------------------------------------------------- login / logout


@console(auth=False)
async def login_form(request: Request) -> Response:
    if session_of(request) is not None:
        return RedirectResponse("/", status_code=303)
    return render(request, "login.html", {"error": None})


@console(auth=False)
async def login(request: Request) -> Response:
    try:
        form = await read_form(request)
    except Exception:  # noqa: BLE001
        form = {}
    token = form.get("token", "").strip()
    info = check_token(muster_of(request).state, token) if 0 < len(token) <= MAX_TOKEN_CHARS else None
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
    sess = session_of(request)
    if sess is not None:
        try:
            form = await read_form(request)
        except Exception:  # noqa: BLE001
            form = {}
        if not _csrf_ok(form, sess):
            request.state.session = sess
            raise Forbidden(BAD_CSRF)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                       secure=request.url.scheme == "https")
    return resp
