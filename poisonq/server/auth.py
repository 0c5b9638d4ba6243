"""Who may read and who may write.

The API takes a bearer token (``Authorization: Bearer <token>``): always for writes, and for
reads unless the server was started with open reads. The web UI has no JavaScript, so it
cannot send that header; a login form instead sets a session cookie that holds a value
derived from the token (never the token itself), HttpOnly and ``SameSite=Strict``. Every
form that changes something also carries a CSRF value derived from the token, so a page on
another site cannot post a resubmit or purge with the operator's cookie. Every comparison is
``hmac.compare_digest``, so timing tells nothing about the token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import HTTPException, Request

SESSION_COOKIE = "poisonq_session"


def new_token() -> str:
    """A random token for a server started without one (printed at start)."""
    return secrets.token_urlsafe(24)


class Auth:
    """The token and what it unlocks."""

    def __init__(self, token: str, open_reads: bool) -> None:
        if not token:
            raise ValueError("the token cannot be empty")
        self._token = token.encode()
        self.open_reads = open_reads
        self.session_value = self._derive("session")
        self.csrf_value = self._derive("csrf")

    def _derive(self, purpose: str) -> str:
        return hmac.new(self._token, purpose.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def bearer_ok(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(given.strip())

    def session_ok(self, request: Request) -> bool:
        """Whether the request carries the UI's session cookie."""
        return hmac.compare_digest(request.cookies.get(SESSION_COOKIE, ""), self.session_value)

    def csrf_ok(self, given: str) -> bool:
        return hmac.compare_digest(given, self.csrf_value)

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
