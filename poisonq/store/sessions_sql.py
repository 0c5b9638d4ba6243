"""Sessions in both stores: one row per session holding its lock and its state.

``lock_session`` takes a session only if no other token holds it with a lock still valid, in
one guarded ``INSERT ... ON CONFLICT DO UPDATE``, so two receivers never hold one session at
once. SQLite runs one writer at a time; under PostgreSQL's READ COMMITTED two receivers may
pick the same free session at once, and the upsert locks its row and checks the guard again
on the newest version, so only one of them gets it (the other tries the next free session;
PostgreSQL's look passes by a session another look is taking: see
:attr:`SessionStatements._PICK_FREE`). The messages a session receiver locks
carry the session's token.

A session given up or poisoned as a whole takes its locked messages back from their locks
(:meth:`SessionStatements.unlock_session`): settling one of them afterwards finds its lock
lost, never a silent success.
"""

from __future__ import annotations

from poisonq.model import MessageState
from poisonq.store.base import SessionRecord
from poisonq.store.rows import LIVE
from poisonq.store.shared_sql import SharedStatements

_NEXT_SESSION_TRIES = 8
"""Free sessions a look for the next one tries when each, picked at once by another
receiver, is taken first; then it finds none, and its receiver looks again later."""


class SessionStatements(SharedStatements):
    """The session methods of both stores' transactions."""

    _PICK_FREE = "{candidates} LIMIT 1"
    """How a look for the next free session picks one from ``candidates`` (the messages of
    free sessions, oldest first). SQLite, one writer at a time, takes the first. PostgreSQL's
    looks run at once, and pass by a session another look is taking (an advisory lock on the
    session's key, held until the look commits), so that they mostly pick different ones at
    their first try; the look locks no message row, which the session's holder would pass
    by (it receives with ``SKIP LOCKED``) and so deliver the messages after it first."""

    async def lock_session(
        self, entity_id: int, session_id: str | None, token: str, locked_until: float, now: float
    ) -> str | None:
        if session_id is not None:
            taken = await self._take_session(entity_id, session_id, token, locked_until, now)
            return session_id if taken else None
        tried: list[str] = []
        for _ in range(_NEXT_SESSION_TRIES):
            picked = await self._next_free_session(entity_id, now, tried)
            if picked is None:
                return None
            if await self._take_session(entity_id, picked, token, locked_until, now):
                return picked
            tried.append(picked)
        return None

    async def _next_free_session(self, entity_id: int, now: float, tried: list[str]) -> str | None:
        """The session of the oldest waiting message that nobody holds, but those ``tried``."""
        passed = {f"tried{n}": session_id for n, session_id in enumerate(tried)}
        but = (
            f" AND m.session_id NOT IN ({', '.join(':' + name for name in passed)})"
            if tried
            else ""
        )
        candidates = (
            "SELECT m.session_id FROM messages m WHERE m.entity_id = :entity"
            " AND m.state = 'active' AND m.session_id IS NOT NULL"
            f"{but} AND NOT EXISTS (SELECT 1 FROM sessions s"
            "   WHERE s.entity_id = :entity AND s.session_id = m.session_id"
            "   AND s.lock_token IS NOT NULL AND s.locked_until > :now)"
            " ORDER BY m.seq"
        )
        rows = await self._query(
            self._PICK_FREE.format(candidates=candidates),
            {"entity": entity_id, "now": now, **passed},
        )
        return str(rows[0][0]) if rows else None

    async def _take_session(
        self, entity_id: int, session_id: str, token: str, locked_until: float, now: float
    ) -> bool:
        """Lock the session under ``token`` unless another token holds it: one guarded
        upsert (under READ COMMITTED it waits for a transaction that took it meanwhile, then
        checks the guard again on the newest version)."""
        changed = await self._update(
            "INSERT INTO sessions (entity_id, session_id, lock_token, locked_until)"
            " VALUES (:entity, :session, :token, :until) ON CONFLICT (entity_id, session_id)"
            " DO UPDATE SET lock_token = :token, locked_until = :until"
            " WHERE sessions.lock_token IS NULL OR sessions.locked_until <= :now",
            {
                "entity": entity_id,
                "session": session_id,
                "token": token,
                "until": locked_until,
                "now": now,
            },
        )
        return bool(changed)

    async def session(self, entity_id: int, session_id: str) -> SessionRecord | None:
        rows = await self._query(
            "SELECT session_id, lock_token, locked_until, state FROM sessions"
            " WHERE entity_id = :entity AND session_id = :session",
            {"entity": entity_id, "session": session_id},
        )
        return SessionRecord(*rows[0]) if rows else None

    async def renew_session(
        self, entity_id: int, session_id: str, token: str, now: float, locked_until: float
    ) -> int:
        params = {
            "entity": entity_id,
            "session": session_id,
            "token": token,
            "now": now,
            "until": locked_until,
        }
        changed = await self._update(
            "UPDATE sessions SET locked_until = :until WHERE entity_id = :entity"
            " AND session_id = :session AND lock_token = :token AND locked_until > :now",
            params,
        )
        if changed:
            await self._execute(
                "UPDATE messages SET locked_until = :until WHERE entity_id = :entity"
                " AND state = 'locked' AND lock_token = :token AND locked_until > :now",
                params,
            )
        return changed

    async def set_session_state(
        self, entity_id: int, session_id: str, token: str, now: float, state: bytes | None
    ) -> int:
        return await self._update(
            "UPDATE sessions SET state = :state, state_updated_at = :now WHERE entity_id = :entity"
            " AND session_id = :session AND lock_token = :token AND locked_until > :now",
            {
                "entity": entity_id,
                "session": session_id,
                "token": token,
                "now": now,
                "state": state,
            },
        )

    async def session_ids(self, entity_id: int, state_updated_after: float | None) -> list[str]:
        if state_updated_after is not None:
            rows = await self._query(
                "SELECT session_id FROM sessions WHERE entity_id = :entity"
                " AND state_updated_at > :after ORDER BY session_id",
                {"entity": entity_id, "after": state_updated_after},
            )
        else:
            rows = await self._query(
                "SELECT session_id FROM messages WHERE entity_id = :entity"
                f" AND session_id IS NOT NULL AND state IN {LIVE}"
                " UNION SELECT session_id FROM sessions WHERE entity_id = :entity"
                " AND state IS NOT NULL ORDER BY session_id",
                {"entity": entity_id},
            )
        return [str(row[0]) for row in rows]

    async def release_session(self, entity_id: int, session_id: str, token: str) -> int:
        return await self._update(
            "UPDATE sessions SET lock_token = NULL, locked_until = NULL"
            " WHERE entity_id = :entity AND session_id = :session AND lock_token = :token",
            {"entity": entity_id, "session": session_id, "token": token},
        )

    async def session_locks(
        self, entity_id: int, session_id: str, token: str, now: float
    ) -> list[int]:
        rows = await self._query(
            "SELECT seq FROM messages WHERE entity_id = :entity AND session_id = :session"
            " AND state = 'locked' AND lock_token = :token AND locked_until > :now ORDER BY seq",
            {"entity": entity_id, "session": session_id, "token": token, "now": now},
        )
        return [row[0] for row in rows]

    async def unlock_session(
        self, entity_id: int, session_id: str, ready: MessageState
    ) -> list[int]:
        rows = await self._query(
            "UPDATE messages SET state = :ready, lock_token = NULL, locked_until = NULL"
            " WHERE entity_id = :entity AND session_id = :session AND state = 'locked'"
            " RETURNING seq",
            {"entity": entity_id, "session": session_id, "ready": ready.value},
        )
        return sorted(row[0] for row in rows)
