"""Who may read and who may write.

The API takes a bearer token (``Authorization: Bearer <token>``): always for writes, and for
reads unless the server was started with open reads. The web UI has no JavaScript, so it
cannot send that header; a login form checks the token once and opens a session
(:mod:`poisonq.server.sessions`) whose random id is the cookie. Every form that changes
something also carries the session's CSRF value, so a page on another site cannot post a
resubmit or purge with the operator's cookie. Token and CSRF comparisons are
``hmac.compare_digest``, so timing tells nothing about them, and wrong tokens are throttled
per client (:mod:`poisonq.server.throttle`), so guessing is slow too.
"""

from __future__ import annotations

import hmac
import secrets

from fastapi import HTTPException, Request

from poisonq.clock import Clock
from poisonq.server.sessions import SESSION_COOKIE, LoginSessions, Session
from poisonq.server.throttle import Throttle


def new_token() -> str:
    """A random token for a server started without one (printed at start)."""
    return secrets.token_urlsafe(24)


class Auth:
    """The token, what it unlocks, and the UI sessions opened with it."""

    def __init__(self, token: str, open_reads: bool, clock: Clock) -> None:
        if not token:
            raise ValueError("the token cannot be empty")
        self.token = token
        self.open_reads = open_reads
        self.sessions = LoginSessions(clock)
        self.throttle = Throttle(clock)

    def token_matches(self, request: Request, given: str) -> bool:
        """Whether ``given`` is the token; a wrong one counts against the request's client.
        Raises :class:`~poisonq.server.throttle.Throttled` while that client is refused."""
        client = request.client.host if request.client else ""
        self.throttle.check(client)
        if hmac.compare_digest(given.encode(), self.token.encode()):
            self.throttle.succeeded(client)
            return True
        self.throttle.failed(client)
        return False

    def bearer_ok(self, request: Request) -> bool:
        """Whether the request carries the token as a bearer (no header is not a guess)."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return self.token_matches(request, given.strip())

    def session(self, request: Request) -> Session | None:
        """The UI session the request's cookie names, if it is open."""
        return self.sessions.get(request.cookies.get(SESSION_COOKIE, ""))

    @staticmethod
    def csrf_ok(session: Session, given: str) -> bool:
        return hmac.compare_digest(given.encode(), session.csrf.encode())

    # API dependencies ---------------------------------------------------------------------
    def require_read(self, request: Request) -> None:
        if not self.open_reads:
            self.require_write(request)

    def require_write(self, request: Request) -> None:
        if not self.bearer_ok(request):
            raise HTTPException(
                status_code=401,
                detail="a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="poisonq"'},
            )
