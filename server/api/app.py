"""The HTTP face of a replica: GraphQL at /graphql, health and metrics; the caller adds
the rest (`muster server` adds the console, web.console.console_routes).

Behind a TLS-terminating proxy listed in MUSTER_TRUSTED_PROXIES, the request's scheme and
client address are the proxy's X-Forwarded-Proto and X-Forwarded-For (uvicorn's
ProxyHeadersMiddleware); an HTTPS response carries Strict-Transport-Security."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.types.unset import UNSET, UnsetType
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from server import metrics
from server.api.auth import bearer, check_token, token_hash
from server.api.graphql import build_schema
from server.replica import Muster

MAX_BODY_BYTES = 1024 * 1024
HSTS = b"max-age=31536000"


def _revoked(view: Any, context: Any) -> bool:
    """Whether the token a WebSocket was opened with has been revoked (or has expired) since."""
    h = context.get("token_hash") if isinstance(context, dict) else None
    if h is None:
        return False
    info = view.muster.state.tokens.get(h)
    return info is None or info.expired()


async def _closed_if_revoked(handler: Any) -> bool:
    """Close a WebSocket whose token was revoked since it was opened (4403, as a new one
    would be: found by exploring, its queries and mutations went on under the revoked
    token's role); whether it did."""
    if handler.connection_acknowledged and _revoked(handler.view, handler.context):
        await handler.websocket.close(code=4403, reason="the token was revoked")
        return True
    return False


class _TransportWS(BaseGraphQLTransportWSHandler[dict[str, Any], None]):
    """graphql-transport-ws: every operation on the socket is refused once its token is revoked."""

    async def handle_subscribe(self, message: Any) -> None:
        if not await _closed_if_revoked(self):
            await super().handle_subscribe(message)


class _LegacyWS(BaseGraphQLWSHandler[dict[str, Any], None]):
    """graphql-ws (legacy): as `_TransportWS`."""

    async def handle_start(self, message: Any) -> None:
        if not await _closed_if_revoked(self):
            await super().handle_start(message)


class MusterGraphQL(GraphQL[dict[str, Any], None]):
    """GraphQL over HTTP, and subscriptions over WebSockets (graphql-transport-ws, and the
    legacy graphql-ws). A WebSocket is authenticated at `connection_init`: its payload
    carries `{"Authorization": "Bearer <token>"}` (or `authorization`, or `token`); an
    `Authorization` header on the handshake is accepted too. Otherwise it is closed
    (4403 Forbidden)."""

    graphql_transport_ws_handler_class = _TransportWS
    graphql_ws_handler_class = _LegacyWS

    def __init__(self, muster: Muster, **kw: Any) -> None:
        kw.setdefault("connection_init_wait_timeout", timedelta(seconds=10))
        super().__init__(build_schema(production=muster.config.production), **kw)
        self.muster = muster

    def decode_json(self, data: str | bytes) -> object:
        """A request body or WebSocket message: JSON nested past what the parser recurses
        into is refused as JSON that does not parse (400, or the socket closed 4400), not
        an internal error with a traceback (found by exploring: 500s, and an
        unauthenticated socket's `connection_init` logged one per message)."""
        try:
            return json.loads(data)
        except RecursionError:
            raise json.JSONDecodeError("nested too deeply", "", 0) from None

    async def get_context(self, request: Request | WebSocket, response: Response | WebSocket | None = None,
                          ) -> dict[str, Any]:
        return {"muster": self.muster, "token": request.scope.get("muster.token"),
                "token_hash": request.scope.get("muster.token_hash"), "request": request}

    async def on_ws_connect(self, context: dict[str, Any]) -> UnsetType | dict[str, object] | None:
        params = context.get("connection_params") or {}
        token = None
        if isinstance(params, dict):
            auth = params.get("Authorization") or params.get("authorization")
            token = bearer(auth) if isinstance(auth, str) else None
            if token is None and isinstance(params.get("token"), str):
                token = params["token"]
        if token is None:
            request = context.get("request")
            headers = {k.decode().lower(): v.decode() for k, v in request.scope.get("headers", [])} if request else {}
            token = bearer(headers.get("authorization"))
        info = check_token(self.muster.state, token)
        if info is None:
            raise ConnectionRejectionError({"message": "missing or invalid bearer token"})
        context["token"] = info
        context["token_hash"] = token_hash(token or "")  # subscriptions end once it is revoked
        return UNSET


class RequireToken:
    """ASGI guard: every GraphQL HTTP request needs `Authorization: Bearer <token>`.
    WebSockets pass through: MusterGraphQL.on_ws_connect checks them at connection_init."""

    def __init__(self, app: ASGIApp, muster: Muster) -> None:
        self.app = app
        self.muster = muster

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
            info = check_token(self.muster.state, bearer(headers.get("authorization")))
            if info is None:
                resp = JSONResponse(
                    {"errors": [{"message": "missing or invalid bearer token"}]},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="muster"'},
                )
                await resp(scope, receive, send)
                return
            scope["muster.token"] = info
            scope["muster.token_hash"] = token_hash(bearer(headers.get("authorization")) or "")
        await self.app(scope, receive, send)


class _TooLarge(BaseException):
    """A body past the limit: raised from the request's `receive`, and not an Exception, so
    that a handler's own `except Exception` (the sign-in form's, for one) does not take it
    for a bad body and answer as if it were read."""


class BodyLimit:
    """ASGI: no HTTP request body over MAX_BODY_BYTES, however it comes: a Content-Length
    over it is answered 413 at once, and a body sent without one (chunked) is counted as
    it is read and refused 413 once past it (it used to be read whole: a 50 MB chunked
    body reached the GraphQL endpoint)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = JSONResponse({"errors": [{"message": "request body too large"}]}, status_code=413)
        length = dict(scope.get("headers", [])).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await too_large(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except _TooLarge:
            if not started:
                await too_large(scope, receive, send)


class StrictTransportSecurity:
    """ASGI: HSTS on every HTTPS response (the scheme as the trusted proxy said, if any)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_hsts(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"strict-transport-security", HSTS)]
            await send(message)

        await self.app(scope, receive, send_hsts)


def build_app(muster: Muster, routes: Sequence[BaseRoute] = (), manage_lifecycle: bool = True) -> Starlette:
    async def livez(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        """Ready to serve. `?role=follower` also asks that this replica not lead: a health
        check for a pool of readers (dashboards, the console), which the leader serves
        at a quarter of its loop (server.api.reads)."""
        if not muster.ready:
            return PlainTextResponse("NATS connection down", status_code=503)
        why = await muster.store_ready()
        if why:
            return PlainTextResponse(why, status_code=503)
        if request.query_params.get("role") == "follower" and muster.role == "leader":
            return PlainTextResponse("leader", status_code=503)
        return PlainTextResponse("ready")

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_lifecycle:
            await muster.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await muster.shutdown()

    graphql = RequireToken(MusterGraphQL(muster), muster)
    app = Starlette(
        routes=[
            Route("/livez", livez),
            Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint),
            Route("/graphql", graphql, methods=["GET", "POST"]),
            WebSocketRoute("/graphql", graphql),
            *routes,
        ],
        lifespan=lifespan,
        middleware=_middleware(muster.config.trusted_proxies),
    )
    app.state.muster = muster
    return app


def _middleware(trusted_proxies: str) -> list[Middleware]:
    out = []
    if trusted_proxies.strip():
        out.append(Middleware(ProxyHeadersMiddleware, trusted_hosts=trusted_proxies))
    out.append(Middleware(StrictTransportSecurity))
    out.append(Middleware(BodyLimit))
    return out
