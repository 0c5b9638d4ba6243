"""The application factory: ``create_app(broker_or_url, token=..., open_reads=...)``.

One process serves the JSON API (``/api``, OpenAPI at ``/api/openapi.json``), the web UI
(``/ui``) and ``/metrics``. Every answer carries a Content-Security-Policy that allows no
script at all (the UI has none), so even a body that slipped past escaping could not run,
and framing by this server's own pages only (a running task's page shows its progress in a
frame that reloads itself, so the page around it, and the keyboard's place, stay still).
Answers of the API and ``/metrics`` (message bodies, counts) are ``Cache-Control: no-store``:
no browser or proxy keeps a copy. Every body is read within its limits before any route
runs (:mod:`poisonq.server.guard`), and HEAD is answered wherever GET is.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from poisonq.client import Broker, connect
from poisonq.errors import (
    EntityDisabledError,
    EntityExistsError,
    InvalidOperationError,
    MessageLockLostError,
    MessageTooLargeError,
    PoisonqError,
    QuotaExceededError,
    StoreError,
)
from poisonq.server import api, login, ui
from poisonq.server.auth import Auth, new_token
from poisonq.server.guard import BodyGuard, RequestLimits
from poisonq.server.metrics import ScrapeConnection, registry
from poisonq.server.pages import error_page
from poisonq.server.state import ServerState
from poisonq.server.throttle import Throttled

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self';"
    " form-action 'self'; frame-src 'self'; frame-ancestors 'self'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "SAMEORIGIN",
    "Referrer-Policy": "no-referrer",
}


# What an error page of the UI is titled, by status (its error's type is shown below).
UI_TITLES = {404: "Not found", 409: "Not possible now", 413: "Too large", 503: "The store failed"}


class AsciiJSONResponse(JSONResponse):
    """JSON with every character past ASCII escaped. An error answer echoes what the client
    sent, and JSON may carry a lone surrogate (``"\\ud800"``) that UTF-8 cannot encode: the
    plain response failed to render it, a 500 for a bad request."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def status_for(exc: PoisonqError) -> int:
    """The HTTP status of a broker error: the caller's mistake (4xx) or the store's (503)."""
    match exc:
        case LookupError():  # entity, message or task not found
            return 404
        case EntityExistsError() | EntityDisabledError() | InvalidOperationError():
            return 409
        case MessageLockLostError():
            return 409
        case MessageTooLargeError() | QuotaExceededError():
            return 413
        case StoreError():
            return 503
        case _:
            return 400


class HeadAsGet:
    """ASGI middleware: HEAD is GET without the body (uptime checks use HEAD), with GET's
    status and headers, ``Content-Length`` included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


def create_app(
    broker_or_url: Broker | str,
    *,
    token: str | None = None,
    open_reads: bool = False,
    limits: RequestLimits | None = None,
    secure_cookies: bool = False,
    public_url: str | None = None,
) -> FastAPI:
    """The server for a broker (or a store URL, opened here and closed at shutdown).

    ``token`` guards writes, and reads unless ``open_reads``; without one a random token is
    made: read it from ``app.state.poisonq.auth.token`` or, with ``poisonq serve``, from the
    file it names at start. ``limits`` are the largest bodies and the read timeout
    (:class:`~poisonq.server.guard.RequestLimits`); ``secure_cookies`` marks the session
    cookie ``Secure`` (it is anyway on a request that came over HTTPS, as the server or a
    trusted proxy says). ``public_url`` is where operators reach the server (behind a
    proxy, its address there): ``/metrics`` says it, for absolute links in alerts.
    """
    owns = isinstance(broker_or_url, str)
    broker = connect(broker_or_url) if isinstance(broker_or_url, str) else broker_or_url
    auth = Auth(token or new_token(), open_reads, broker.clock, secure_cookies)
    state = ServerState(broker, auth, owns_broker=owns)
    scrapes = ScrapeConnection(broker)
    metrics = registry(scrapes, public_url)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state.close()
        scrapes.close()

    app = FastAPI(
        title="poisonq",
        summary="Queues, dead-letters, resubmit and purge of a poisonq store.",
        version="0.1.0",
        openapi_url=None,  # served below, behind the read rule
        docs_url=None,  # the interactive docs load scripts from a CDN; the CSP forbids both
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.poisonq = state
    app.state.request_limits = limits or RequestLimits()
    app.include_router(api.reads)
    app.include_router(api.writes)
    app.include_router(ui.router)
    app.include_router(login.router)
    app.mount("/ui/static", StaticFiles(packages=[("poisonq.server", "static")]), name="static")

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if request.url.path.startswith(("/api/", "/metrics")):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.exception_handler(PoisonqError)
    async def broker_error(request: Request, exc: PoisonqError) -> Response:
        status = status_for(exc)
        if request.url.path.startswith("/ui"):
            title = UI_TITLES.get(status, "Not accepted")
            return error_page(request, status, title, str(exc), type(exc).__name__)
        return AsciiJSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """A page of the UI that does not exist is a page, not a line of JSON; anywhere else
        the answer has the shape of every other error (``error``: ``Unauthorized``,
        ``NotFound``, …; ``detail``), its headers (``WWW-Authenticate``) kept."""
        if request.url.path.startswith("/ui") and exc.status_code == 404:
            return error_page(request, 404, "Not found", f"No page at {request.url.path}.")
        name = HTTPStatus(exc.status_code).phrase.title().replace(" ", "").replace("-", "")
        body = {"error": name, "detail": str(exc.detail)}
        return AsciiJSONResponse(body, exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        """A request that does not parse, in the shape of every other error (``error``,
        ``detail``: what was wrong with which field, in one line)."""
        problems = "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in exc.errors())
        if request.url.path.startswith("/ui"):
            return error_page(request, 400, "Not accepted", problems, "RequestValidationError")
        return AsciiJSONResponse({"error": "RequestValidationError", "detail": problems}, 422)

    @app.exception_handler(Throttled)
    async def throttled(request: Request, exc: Throttled) -> Response:
        return JSONResponse(
            {"error": "Throttled", "detail": str(exc)},
            429,
            headers={"Retry-After": str(exc.retry_after)},
        )

    app.add_exception_handler(login.LoginNeeded, login.login_redirect)  # type: ignore[arg-type]
    app.add_exception_handler(login.Unauthorized, login.unauthorized_page)  # type: ignore[arg-type]

    @app.get("/", include_in_schema=False)
    def root() -> Response:
        return RedirectResponse("/ui/", 307)

    @app.get("/metrics", tags=["read"], summary="Prometheus metrics", response_class=Response)
    def prometheus(request: Request) -> Response:
        """Depth per entity, subqueue and state, dead-letters by reason, and the lifetime
        counters of every entity, read from the store at each scrape (through a connection
        of its own: :class:`~poisonq.server.metrics.ScrapeConnection`)."""
        state.auth.require_read(request)
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> Response:
        """The API's OpenAPI document, read like the API."""
        state.auth.require_read(request)
        return JSONResponse(app.openapi())

    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyGuard, limits=app.state.request_limits, auth=auth)  # the outermost
    return app


__all__ = ["create_app"]
