"""What a request may cost the server before anyone knows who sent it: its size and its time.

The login form carries the token in its body, so the body is read before anyone is known:
an unauthenticated client decides how much the server reads, and for how long. So every
body is read here, before any route runs, into a buffer of at most its limit
(:class:`RequestLimits`): a ``Content-Length`` past it is refused with 413 before a byte of
the body is read, a body that grows past it while it streams in (chunked) is refused as soon
as it does, and the connection is closed, so the rest is never read. A body that has not
arrived within the read timeout is refused with 408; headers that have not arrived within it
end the connection (:func:`header_deadline`, for uvicorn, which waits for them for ever). A
client that goes away mid-body is one line in the log at INFO, not a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from poisonq.limits import FORM_BYTES, READ_TIMEOUT, SEND_BYTES
from poisonq.server.auth import Auth, bearer
from poisonq.server.throttle import Throttled

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """How large a request's body may be and how long its headers and body may take.

    ``send_bytes`` is for the API's send (``POST /api/queues/{queue}/messages``: a batch of
    up to 1,000 messages, their bodies in JSON) with the right bearer token; ``form_bytes``
    for every other request (the UI's forms, login, resubmit and purge filters, which are
    small), and for a send without the token, which is refused anyway once its body is in."""

    form_bytes: int = FORM_BYTES
    send_bytes: int = SEND_BYTES
    read_timeout: float = READ_TIMEOUT

    def body_limit(self, method: str, path: str, authorized: bool) -> int:
        sends = path.startswith("/api/queues/") and path.endswith("/messages")
        return self.send_bytes if method == "POST" and sends and authorized else self.form_bytes


class _TooLarge(Exception):
    pass


class _Refused(Exception):
    def __init__(self, status: int, error: str, detail: str) -> None:
        self.status, self.error, self.detail = status, error, detail


class _Gone(Exception):
    pass


class BodyGuard:
    """ASGI middleware: the request's body, whole and within its limits, before the app runs
    (module docstring). The app then reads the buffered body as if it were streaming in.

    An API send has its larger limit only with the right bearer token, so the limit a body
    meets says whether the token was right: a request refused here with a wrong token
    counts against its client as the route would have counted it (and is answered 429
    while that client is refused); one let through is counted by the route, once."""

    def __init__(self, app: ASGIApp, limits: RequestLimits, auth: Auth) -> None:
        self.app = app
        self.limits = limits
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = bearer(_header(scope, b"authorization") or "")
        authorized = given is not None and self.auth.is_token(given)
        limit = self.limits.body_limit(scope["method"], scope["path"], authorized)
        try:
            body = await self._body(scope, receive, limit)
        except _Refused as refused:
            if given is not None and not authorized:
                try:
                    self.auth.token_matches(Request(scope), given)
                except Throttled as exc:
                    await _answer(send, 429, "Throttled", str(exc), exc.retry_after)
                    return
            await _answer(send, refused.status, refused.error, refused.detail)
            return
        except _Gone:
            client = scope.get("client") or ("?", 0)
            logger.info(
                "%s:%s went away before its body arrived (%s %s)",
                client[0],
                client[1],
                scope["method"],
                scope["path"],
            )
            return
        await self.app(scope, _replay(body, receive), send)

    async def _body(self, scope: Scope, receive: Receive, limit: int) -> bytes:
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            raise _Refused(413, "RequestTooLarge", f"the body is {declared} bytes; at most {limit}")
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                return await _read_body(receive, limit)
        except TimeoutError:
            seconds = f"{self.limits.read_timeout:g}"
            raise _Refused(408, "RequestTimeout", f"the body took over {seconds} s") from None
        except _TooLarge:
            raise _Refused(413, "RequestTooLarge", f"the body is over {limit} bytes") from None


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the client's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def _content_length(scope: Scope) -> int | None:
    try:
        return int(_header(scope, b"content-length") or "")
    except ValueError:
        return None  # none, or one the HTTP parser refuses first; the count still applies


async def _answer(
    send: Send, status: int, error: str, detail: str, retry_after: int | None = None
) -> None:
    """An error in the API's shape; ``Connection: close``, so the rest of the body is never
    read."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def header_deadline(seconds: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request headers have not all
    arrived ``seconds`` after it opened or after its last answer. (uvicorn's keep-alive
    timeout stops counting at the first byte of the next request, so headers sent a byte at
    a time would hold the connection for ever.)"""

    class HeaderDeadline(H11Protocol):
        _armed = 0  # which deadline counts: the latest

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self._armed += 1
            # A new request replaces the cycle once its headers are in.
            self.loop.call_later(seconds, self._expire, self._armed, self.cycle)

        def _expire(self, armed: int, waiting_after: Any) -> None:
            idle = waiting_after is None or waiting_after.response_complete
            current = armed == self._armed and self.cycle is waiting_after
            if current and idle and not self.transport.is_closing():
                with contextlib.suppress(h11.LocalProtocolError):
                    self.conn.send(h11.ConnectionClosed())
                self.transport.close()

    return HeaderDeadline


def server_config(
    app: FastAPI, forwarded_allow_ips: str | None = None, **options: Any
) -> uvicorn.Config:
    """uvicorn's configuration for an app made by ``create_app``: its read timeout for
    headers, and proxy headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) believed only
    from the addresses in ``forwarded_allow_ips`` (comma-separated addresses or networks,
    ``*`` for any): by default from none, so a client cannot claim another address to the
    wrong-token throttle. ``options`` go to ``uvicorn.Config`` as they are."""
    limits: RequestLimits = app.state.request_limits
    return uvicorn.Config(
        app,
        http=header_deadline(limits.read_timeout),
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips or "",
        **options,
    )
