"""The web UI's sessions, kept in this process's memory.

A session is a random id in an HttpOnly, ``SameSite=Lax`` cookie; what it stands for (who
logged in, the CSRF value of its forms, when it ends) stays on the server. So a session ends
when it expires or logs out even if the browser kept the cookie, and a cookie says nothing
about the token. A restart of the server logs everyone out, which is the price of keeping no
session in the store.

``Lax``, not ``Strict``: a link from an alert, a chat or a mail is a navigation from another
site, and with ``Strict`` it arrived without the cookie, at the login page, while the session
was open. ``Lax`` sends it on such a navigation (a GET, which changes nothing here) and never
on another site's POST, which the forms' CSRF value and the login's origin check refuse anyway.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass

from poisonq.clock import Clock

SESSION_COOKIE = "poisonq_session"
SESSION_LIFETIME = 12 * 3600.0  # seconds: a working day, then the token again


@dataclass(frozen=True, slots=True)
class Session:
    """Who logged in (the name they gave), the CSRF value their forms carry, and when the
    session ends (seconds since the epoch on the server's clock)."""

    operator: str
    csrf: str
    expires_at: float


class LoginSessions:
    """Open sessions by id. Thread-safe: uvicorn runs sync routes in a thread pool."""

    def __init__(self, clock: Clock, lifetime: float = SESSION_LIFETIME) -> None:
        self._clock = clock
        self.lifetime = lifetime
        self._open: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, operator: str) -> str:
        """A new session for ``operator``; returns its id, the cookie's value."""
        now = self._clock.now()
        session_id = secrets.token_urlsafe(32)
        session = Session(operator, secrets.token_hex(32), now + self.lifetime)
        with self._lock:
            # Forget the expired ones here, so sessions nobody logs out of do not pile up.
            self._open = {k: s for k, s in self._open.items() if s.expires_at > now}
            self._open[session_id] = session
        return session_id

    def get(self, session_id: str) -> Session | None:
        """The session with this id, or None when there is none or it has expired. (A dict
        lookup by a random 256-bit id: its timing tells nothing useful.)"""
        with self._lock:
            session = self._open.get(session_id)
            if session is not None and session.expires_at <= self._clock.now():
                del self._open[session_id]
                return None
            return session

    def close(self, session_id: str) -> None:
        """End a session (log out); its cookie opens nothing any more."""
        with self._lock:
            self._open.pop(session_id, None)
