"""Leases and receives in the SQLite store: how a lease or a receive takes its batch, and which
messages a receiver may take beside the covers (the covers themselves are
:mod:`poisonq.store.leases_sql`).

One writer at a time: what a cover takes, nobody else can be taking at the same moment, and a
statement that changes rows tells a covered one by :data:`COVERED`.

A receive without a session takes its batch as a lease does: the fresh messages as a cover,
one row of ``leases`` of no consumer (``''``, which no consumer's name can be), and those that
came back locked row by row. So a receive writes one row, not one a message, and a settlement
writes each message once (its delivery counted as it leaves the cover), where a lock written
into every message wrote each twice. A receive's cover row lives while its range holds a
message: a settlement that empties it forgets it, so does the lock sweep once its lock ran
out, and each receive forgets those emptied otherwise (by abandons, renewals, releases).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from poisonq.model import Lease, MessageState
from poisonq.store.leases_sql import LeaseStatements, as_covered
from poisonq.store.sqlite_rows import COVERED, MESSAGE_COLUMNS, SEQS, seqs_json

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
# Whether the cover of a row of ``leases`` holds no message any more (or was closed).
_EMPTIED = (
    "(cover_lo IS NULL OR NOT EXISTS (SELECT 1 FROM messages m"
    " WHERE m.entity_id = leases.entity_id AND m.state IN ('active', 'dead_lettered')"
    " AND m.leasable = 1 AND m.seq BETWEEN leases.cover_lo AND leases.cover_hi))"
)
# A receive's batch as its receiver sees it, each row with its ``leasable`` last: every
# message locked under the receive's token (?5) until its lock time (?6), with the delivery
# this receive counts. Parameters: those of RECEIVABLE, then token and lock time. With no
# cover (a top of 0), every ready message is above the top, and they are read in the order
# of the index without gathering RECEIVABLE's two parts first.
_RECEIVED_COLUMNS = as_covered(MESSAGE_COLUMNS, "'locked'", "?5", "?6")
_RECEIVED = (
    f"SELECT {_RECEIVED_COLUMNS}, leasable FROM messages"
    f" WHERE seq IN (SELECT seq FROM ({RECEIVABLE}))"
)
_RECEIVED_UNCOVERED = (
    f"SELECT {_RECEIVED_COLUMNS}, leasable FROM messages WHERE entity_id = ?1 AND state = ?2"
    " AND seq > ?3 ORDER BY seq LIMIT ?4"
)


class SqliteLeases(LeaseStatements):
    """The lease methods of :class:`poisonq.store.sqlite.SqliteTransaction` that are its
    own, and its receive's batch."""

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

    def _lock_came_back(self, seqs: list[int], token: str, locked_until: float) -> None:
        """Lock messages of a batch that came back to the queue since they were sent (no
        cover can hold them: see :mod:`poisonq.store.leases_sql`) row by row."""
        self._db.execute(
            "UPDATE messages SET state = 'locked', lock_token = ?, locked_until = ?,"
            f" delivery_count = delivery_count + 1 WHERE seq IN {SEQS}",
            (token, locked_until, seqs_json(seqs)),
        )

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
        if returning:
            returned = self._db.execute(
                f"SELECT seq FROM ({RECEIVABLE}) WHERE leasable = 0", params
            ).fetchall()
            self._lock_came_back([row[0] for row in returned], token, locked_until)
        lease = Lease(name, consumer, number, token, count, first, last, now)
        await self._insert_lease(
            entity_id, lease, locked_until=locked_until, cover_lo=cover_lo, cover_hi=cover_hi
        )
        return lease

    async def _receive_batch(
        self, entity_id: int, ready: MessageState, limit: int, token: str, locked_until: float
    ) -> list[Any]:
        """Lock the ``limit`` oldest receivable messages of the entity under ``token`` until
        ``locked_until``, counting a delivery, as a lease takes its batch (see the module
        docstring); returns the rows of :data:`MESSAGE_COLUMNS` as the receiver sees them,
        in no order."""
        self._db.execute(
            f"DELETE FROM leases WHERE entity_id = ? AND consumer = '' AND {_EMPTIED}",
            (entity_id,),
        )
        top = await self.cover_top(entity_id)
        rows = self._db.execute(
            _RECEIVED if top else _RECEIVED_UNCOVERED,
            (entity_id, ready, top, limit, token, locked_until),
        ).fetchall()
        fresh = [row[0] for row in rows if row[-1]]
        if len(fresh) < len(rows):
            self._lock_came_back([row[0] for row in rows if not row[-1]], token, locked_until)
        if fresh:
            lo, hi = min(fresh), max(fresh)
            # (created_at: a receive's cover is never read as a lease; its lock time stands in)
            cover = Lease("", "", lo, token, len(fresh), lo, hi, locked_until)
            await self._insert_lease(
                entity_id, cover, locked_until=locked_until, cover_lo=lo, cover_hi=hi
            )
        return [row[:-1] for row in rows]

    def _forget_emptied(self, entity_id: int, token: str) -> None:
        """Forget the receive's cover of ``token`` if a settlement left it holding nothing."""
        self._db.execute(
            "DELETE FROM leases WHERE entity_id = ? AND consumer = '' AND lock_token = ?"
            f" AND {_EMPTIED}",
            (entity_id, token),
        )
