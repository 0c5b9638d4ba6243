"""Sessions in the PostgreSQL store: one row per session holding its lock and its state.

As in the SQLite store, ``lock_session`` takes a session only if no other token holds it with
a lock still valid, in one guarded ``INSERT ... ON CONFLICT DO UPDATE``. Under READ COMMITTED
two receivers may pick the same free session at once; the upsert locks its row and checks the
guard again on the newest version, so only one of them gets it (the other gets ``None``, as
if it had looked a moment later).
"""

from __future__ import annotations

from poisonq.store.base import SessionRecord
from poisonq.store.postgres.runner import StatementRunner


class SessionQueries(StatementRunner):
    """The session methods of :class:`~poisonq.store.postgres.transaction.PostgresTransaction`."""

    def lock_session(
        self, entity_id: int, session_id: str | None, token: str, locked_until: float, now: float
    ) -> str | None:
        if session_id is None:
            rows = self._fetch_all(
                "SELECT session_id FROM messages m WHERE entity_id = %(e)b AND state = 'active'"
                " AND session_id IS NOT NULL AND NOT EXISTS (SELECT FROM sessions s"
                "   WHERE s.entity_id = %(e)b AND s.session_id = m.session_id"
                "   AND s.lock_token IS NOT NULL AND s.locked_until > %(now)b)"
                " ORDER BY seq LIMIT 1",
                {"e": entity_id, "now": now},
            )
            if not rows:
                return None
            session_id = str(rows[0][0])
        changed = self._changed(
            "INSERT INTO sessions (entity_id, session_id, lock_token, locked_until)"
            " VALUES (%(e)b, %(s)b, %(token)b, %(until)b) ON CONFLICT (entity_id, session_id)"
            " DO UPDATE SET lock_token = %(token)b, locked_until = %(until)b"
            " WHERE sessions.lock_token IS NULL OR sessions.locked_until <= %(now)b",
            {"e": entity_id, "s": session_id, "token": token, "until": locked_until, "now": now},
        )
        return session_id if changed else None

    def session(self, entity_id: int, session_id: str) -> SessionRecord | None:
        rows = self._fetch_all(
            "SELECT session_id, lock_token, locked_until, state FROM sessions"
            " WHERE entity_id = %b AND session_id = %b",
            (entity_id, session_id),
        )
        return SessionRecord(*rows[0]) if rows else None

    def renew_session(
        self, entity_id: int, session_id: str, token: str, now: float, locked_until: float
    ) -> int:
        changed = self._changed(
            "UPDATE sessions SET locked_until = %b WHERE entity_id = %b AND session_id = %b"
            " AND lock_token = %b AND locked_until > %b",
            (locked_until, entity_id, session_id, token, now),
        )
        if changed:
            self._run(
                "UPDATE messages SET locked_until = %b WHERE entity_id = %b AND state = 'locked'"
                " AND lock_token = %b AND locked_until > %b",
                (locked_until, entity_id, token, now),
            )
        return changed

    def set_session_state(
        self, entity_id: int, session_id: str, token: str, now: float, state: bytes | None
    ) -> int:
        return self._changed(
            "UPDATE sessions SET state = %b WHERE entity_id = %b AND session_id = %b"
            " AND lock_token = %b AND locked_until > %b",
            (state, entity_id, session_id, token, now),
        )

    def release_session(self, entity_id: int, session_id: str, token: str) -> int:
        return self._changed(
            "UPDATE sessions SET lock_token = NULL, locked_until = NULL"
            " WHERE entity_id = %b AND session_id = %b AND lock_token = %b",
            (entity_id, session_id, token),
        )
