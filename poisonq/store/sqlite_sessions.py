"""Sessions in the SQLite store: one row per session holding its lock and its state.

A session lock is a row lock in spirit: ``lock_session`` takes it only if no other token holds
it with a lock still valid, in one guarded ``UPDATE``/``INSERT``, so two receivers can never
hold one session at once. The messages a session receiver locks carry the session's token.
"""

from __future__ import annotations

import sqlite3

from poisonq.store.base import SessionRecord


class SqliteSessions:
    """The session methods of :class:`poisonq.store.sqlite.SqliteTransaction`."""

    _db: sqlite3.Connection

    def lock_session(
        self, entity_id: int, session_id: str | None, token: str, locked_until: float, now: float
    ) -> str | None:
        if session_id is None:
            row = self._db.execute(
                "SELECT session_id FROM messages m WHERE entity_id = ?1 AND state = 'active'"
                " AND session_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM sessions s"
                "   WHERE s.entity_id = ?1 AND s.session_id = m.session_id"
                "   AND s.lock_token IS NOT NULL AND s.locked_until > ?2)"
                " ORDER BY seq LIMIT 1",
                (entity_id, now),
            ).fetchone()
            if row is None:
                return None
            session_id = str(row[0])
        changed = self._db.execute(
            "INSERT INTO sessions (entity_id, session_id, lock_token, locked_until)"
            " VALUES (?1, ?2, ?3, ?4) ON CONFLICT (entity_id, session_id) DO UPDATE"
            " SET lock_token = ?3, locked_until = ?4"
            " WHERE sessions.lock_token IS NULL OR sessions.locked_until <= ?5",
            (entity_id, session_id, token, locked_until, now),
        ).rowcount
        return session_id if changed else None

    def session(self, entity_id: int, session_id: str) -> SessionRecord | None:
        row = self._db.execute(
            "SELECT session_id, lock_token, locked_until, state FROM sessions"
            " WHERE entity_id = ? AND session_id = ?",
            (entity_id, session_id),
        ).fetchone()
        return None if row is None else SessionRecord(*row)

    def renew_session(
        self, entity_id: int, session_id: str, token: str, now: float, locked_until: float
    ) -> int:
        changed = self._db.execute(
            "UPDATE sessions SET locked_until = ? WHERE entity_id = ? AND session_id = ?"
            " AND lock_token = ? AND locked_until > ?",
            (locked_until, entity_id, session_id, token, now),
        ).rowcount
        if changed:
            self._db.execute(
                "UPDATE messages SET locked_until = ? WHERE entity_id = ? AND state = 'locked'"
                " AND lock_token = ? AND locked_until > ?",
                (locked_until, entity_id, token, now),
            )
        return changed

    def set_session_state(
        self, entity_id: int, session_id: str, token: str, now: float, state: bytes | None
    ) -> int:
        return self._db.execute(
            "UPDATE sessions SET state = ? WHERE entity_id = ? AND session_id = ?"
            " AND lock_token = ? AND locked_until > ?",
            (state, entity_id, session_id, token, now),
        ).rowcount

    def release_session(self, entity_id: int, session_id: str, token: str) -> int:
        return self._db.execute(
            "UPDATE sessions SET lock_token = NULL, locked_until = NULL"
            " WHERE entity_id = ? AND session_id = ? AND lock_token = ?",
            (entity_id, session_id, token),
        ).rowcount
