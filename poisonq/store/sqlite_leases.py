"""Leases in the SQLite store: how a lease takes its batch, and which messages a receiver
may take beside the leases' covers (the covers themselves are :mod:`poisonq.store.leases_sql`).

One writer at a time: what a lease's cover takes, nobody else can be taking at the same
moment, and a statement that changes rows tells a covered one by :data:`COVERED`.
"""

from __future__ import annotations

import sqlite3

from poisonq.model import Lease, MessageState
from poisonq.store.leases_sql import LeaseStatements
from poisonq.store.sqlite_rows import COVERED, SEQS, seqs_json

# The receivable messages of an entity in its ``ready`` state, oldest first: those above the
# top of its cover ranges, and the unleasable ones below it (in their own index). Parameters:
# entity, ready state, top of the covers, limit.
RECEIVABLE = (
    "SELECT seq, leasable FROM (SELECT seq, leasable FROM messages WHERE entity_id = ?1"
    " AND state = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4)"
    " UNION ALL SELECT seq, leasable FROM (SELECT seq, leasable FROM messages"
    " WHERE entity_id = ?1 AND state = ?2 AND leasable = 0 AND seq <= ?3 ORDER BY seq LIMIT ?4)"
    " ORDER BY seq LIMIT ?4"
)
_RECEIVABLE_SEQS = f"SELECT seq FROM ({RECEIVABLE})"
_READY_SEQS = "SELECT seq FROM messages WHERE entity_id = ?1 AND state = ?2 ORDER BY seq LIMIT ?4"


class SqliteLeases(LeaseStatements):
    """The lease methods of :class:`poisonq.store.sqlite.SqliteTransaction` that are its
    own."""

    _db: sqlite3.Connection

    async def _covered_clause(self, entity_id: int) -> str:
        """:data:`COVERED` when the entity has a lease cover, else ``0``: no row is covered,
        and the statement need not ask each row."""
        return COVERED if await self.cover_top(entity_id) else "0"

    async def receivable(self, entity_id: int) -> tuple[str, int]:
        """A statement selecting the sequence numbers of the entity's receivable messages
        (parameters: entity, ready state, the top of its covers, limit), and that top: with no
        cover, the plain oldest ready ones."""
        top = await self.cover_top(entity_id)
        return (_RECEIVABLE_SEQS if top else _READY_SEQS), top

    async def lock_lease(
        self,
        entity_id: int,
        name: str,
        consumer: str,
        number: int,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        now: float,
    ) -> Lease | None:
        params = (entity_id, ready, await self.cover_top(entity_id), limit)
        count, first, last, cover_lo, cover_hi, returning = self._db.execute(
            "SELECT count(*), min(seq), max(seq), min(CASE leasable WHEN 1 THEN seq END),"
            f" max(CASE leasable WHEN 1 THEN seq END), sum(1 - leasable) FROM ({RECEIVABLE})",
            params,
        ).fetchone()
        if not count:
            return None
        if returning:  # came back since they were sent: locked row by row
            returned = self._db.execute(
                f"SELECT seq FROM ({RECEIVABLE}) WHERE leasable = 0", params
            ).fetchall()
            self._db.execute(
                "UPDATE messages SET state = 'locked', lock_token = ?, locked_until = ?,"
                f" delivery_count = delivery_count + 1 WHERE seq IN {SEQS}",
                (token, locked_until, seqs_json([row[0] for row in returned])),
            )
        lease = Lease(name, consumer, number, token, count, first, last, now)
        await self._insert_lease(
            entity_id, lease, locked_until=locked_until, cover_lo=cover_lo, cover_hi=cover_hi
        )
        return lease
