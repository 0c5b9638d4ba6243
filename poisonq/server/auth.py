"""Who may read and who may write.

The API takes a bearer token (``Authorization: Bearer <token>``): always for writes, and for
reads unless the server was started with open reads. The web UI has no JavaScript, so it
cannot send that header; a login form checks the token once and opens a session
(:mod:`poisonq.server.sessions`) whose random id is the cookie. Every form that changes
something also carries the session's CSRF value, so a page on another site cannot post a
resubmit or purge with the operator's cookie. Token and CSRF comparisons are
``hmac.compare_digest`` (the token's of two SHA-256 digests, so not even its length shows in
the timing), and wrong tokens are throttled per client (:mod:`poisonq.server.throttle`); the
right token is never refused, whoever guessed wrong from the same address.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import HTTPException, Request

from poisonq.clock import Clock
from poisonq.server.sessions import SESSION_COOKIE, LoginSessions, Session
from poisonq.server.throttle import Throttle


def new_token() -> str:
    """A random token for a server started without one (``serve`` writes it to a file only
    its user reads, and prints the file's path)."""
    return secrets.token_urlsafe(24)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None for another kind."""
    scheme, _, given = authorization.partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None


class Auth:
    """The token, what it unlocks, and the UI sessions opened with it."""

    def __init__(
        self, token: str, open_reads: bool, clock: Clock, secure_cookies: bool = False
    ) -> None:
        if not token:
            raise ValueError("the token cannot be empty")
        self.token = token
        self._digest = _digest(token)
        self.open_reads = open_reads
        self.secure_cookies = secure_cookies
        self.sessions = LoginSessions(clock)
        self.throttle = Throttle(clock)

    def token_matches(self, request: Request, given: str) -> bool:
        """Whether ``given`` is the token. The right one is always let through; a wrong one
        counts against the request's client, and raises
        :class:`~poisonq.server.throttle.Throttled` while that client is refused."""
        if self.is_token(given):
            return True
        self.throttle.failed(request.client.host if request.client else "")
        return False

    def is_token(self, given: str) -> bool:
        """Whether ``given`` is the token, counting nothing (the caller counts a wrong one)."""
        return hmac.compare_digest(_digest(given), self._digest)

    def bearer_ok(self, request: Request) -> bool:
        """Whether the request carries the token as a bearer (no header is not a guess)."""
        given = bearer(request.headers.get("authorization", ""))
        return given is not None and self.token_matches(request, given)

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
