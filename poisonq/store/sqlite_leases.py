"""Leases in the SQLite store: the numbered batches a Spark query or pipeline locks at once,
and the executors' read path over them.

A lease locks the fresh part of its batch as one range (its *cover*): the ready messages in
it that are still leasable (never back in the queue since they were sent) are held by the
lease, under its token and its lock time, with one delivery more than their rows say, and
nothing is written per message. The rest of the batch (messages that came back after an
abandon, a lock expiry, a move) is locked row by row under the same token, as a receiver
locks. So taking and renewing a lease is one row's write; settling a message apart from its
batch writes that message (and counts its delivery in its row); completing the batch deletes
the rows it holds.

Readers see a covered message as locked through the ``held_messages`` view; statements that
change rows tell a covered one by :data:`COVERED`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

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
_LEASE_COLUMNS = (
    "seq, message_id, body, content_type, subject, properties, session_id, correlation_id,"
    " enqueued_at"
)


class SqliteLeases(LeaseStatements):
    """The lease methods of :class:`poisonq.store.sqlite.SqliteTransaction`: the covers'
    part of each."""

    _db: sqlite3.Connection

    def cover_top(self, entity_id: int) -> int:
        """The highest sequence number any lease of the entity covers (0: none)."""
        (top,) = self._db.execute(
            "SELECT coalesce(max(cover_hi), 0) FROM leases WHERE entity_id = ?"
            " AND cover_lo IS NOT NULL",
            (entity_id,),
        ).fetchone()
        return int(top)

    def _covered_clause(self, entity_id: int) -> str:
        """:data:`COVERED` when the entity has a lease cover, else ``0``: no row is covered,
        and the statement need not ask each row."""
        return COVERED if self.cover_top(entity_id) else "0"

    def receivable(self, entity_id: int) -> tuple[str, int]:
        """A statement selecting the sequence numbers of the entity's receivable messages
        (parameters: entity, ready state, the top of its covers, limit), and that top: with no
        cover, the plain oldest ready ones."""
        top = self.cover_top(entity_id)
        return (_RECEIVABLE_SEQS if top else _READY_SEQS), top

    def lock_lease(
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
        params = (entity_id, ready, self.cover_top(entity_id), limit)
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
        self._insert_lease(
            entity_id, lease, locked_until=locked_until, cover_lo=cover_lo, cover_hi=cover_hi
        )
        return lease

    def renew_lease(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, locked_until: float
    ) -> int:
        renewed = super().renew_lease(entity_id, token, lo, hi, now, locked_until)
        cover = self._cover(entity_id, token, now)
        if cover is None:
            return renewed
        self._db.execute(
            "UPDATE leases SET locked_until = ? WHERE entity_id = ? AND lock_token = ?",
            (locked_until, entity_id, token),
        )
        (covered,) = self._db.execute(
            "SELECT count(*) FROM messages WHERE entity_id = ? AND leasable = 1"
            " AND state IN ('active', 'dead_lettered') AND seq BETWEEN ? AND ?",
            (entity_id, *cover),
        ).fetchone()
        return renewed + int(covered)

    def revive_lease(
        self, entity_id: int, token: str, lo: int, hi: int, locked_until: float
    ) -> int:
        revived = super().revive_lease(entity_id, token, lo, hi, locked_until)
        row = self._db.execute(
            "UPDATE leases SET locked_until = ? WHERE entity_id = ? AND lock_token = ?"
            " AND cover_lo IS NOT NULL RETURNING cover_lo, cover_hi",
            (locked_until, entity_id, token),
        ).fetchone()
        if row is None:
            return revived
        (covered,) = self._db.execute(
            "SELECT count(*) FROM messages WHERE entity_id = ? AND leasable = 1"
            " AND state IN ('active', 'dead_lettered') AND seq BETWEEN ? AND ?",
            (entity_id, max(lo, row[0]), min(hi, row[1])),
        ).fetchone()
        return revived + int(covered)

    def close_expired_leases(self, entity_id: int, now: float) -> None:
        self._db.execute(
            "UPDATE leases SET cover_lo = NULL, cover_hi = NULL WHERE entity_id = ?"
            " AND cover_lo IS NOT NULL AND locked_until <= ?",
            (entity_id, now),
        )

    def _cover(self, entity_id: int, token: str, now: float) -> tuple[int, int] | None:
        """The cover range of the lease with ``token``, if it has one and its lock holds."""
        row = self._db.execute(
            "SELECT cover_lo, cover_hi FROM leases WHERE entity_id = ? AND lock_token = ?"
            " AND cover_lo IS NOT NULL AND locked_until > ?",
            (entity_id, token, now),
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def _forget_cover(self, entity_id: int, token: str) -> None:
        """The lease with ``token`` holds nothing more by its cover."""
        self._db.execute(
            "UPDATE leases SET cover_lo = NULL, cover_hi = NULL WHERE entity_id = ?"
            " AND lock_token = ?",
            (entity_id, token),
        )

    def _covered(
        self, entity_id: int, token: str, seqs: list[int] | None, lo: int, hi: int, now: float
    ) -> list[int]:
        """The messages in ``[lo, hi]`` (and in ``seqs``, if given) that the lease with
        ``token`` validly holds by its cover, ascending."""
        return self._in_cover(entity_id, self._cover(entity_id, token, now), seqs, lo, hi)

    def _covered_of(self, entity_id: int, token: str, seqs: Sequence[int], now: float) -> list[int]:
        """Those of ``seqs`` (some) that the lease with ``token`` validly holds by its cover:
        a settlement's messages that no lock of their own held."""
        return self._covered(entity_id, token, list(seqs), min(seqs), max(seqs), now)

    def _in_cover(
        self,
        entity_id: int,
        cover: tuple[int, int] | None,
        seqs: list[int] | None,
        lo: int,
        hi: int,
    ) -> list[int]:
        """The messages in ``[lo, hi]`` (and in ``seqs``, if given) that ``cover`` holds."""
        span = within(cover, lo, hi)
        if span is None:
            return []
        # Listed, they are found by sequence number (+entity_id keeps the planner off the
        # entity's index, which would walk the whole range); else the range is walked.
        which = "entity_id" if seqs is None else f"seq IN {SEQS} AND +entity_id"
        rows = self._db.execute(
            f"SELECT seq FROM messages WHERE {which} = ? AND leasable = 1"
            " AND state IN ('active', 'dead_lettered') AND seq BETWEEN ? AND ? ORDER BY seq",
            (*_listed(seqs), entity_id, *span),
        )
        return [row[0] for row in rows]

    def delete_leases(self, entity_id: int, consumer: str, before: int) -> None:
        # A lease that still covers messages stays until it is completed or its lock runs
        # out and is closed: without it they would be held by nothing.
        self._db.execute(
            "DELETE FROM leases WHERE entity_id = ? AND consumer = ? AND number < ?"
            " AND cover_lo IS NULL",
            (entity_id, consumer, before),
        )

    def lease_seqs(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, first_delivery: bool = False
    ) -> list[int]:
        locked = super().lease_seqs(entity_id, token, lo, hi, now, first_delivery)
        if first_delivery:  # a covered message is on its first delivery if its row has none
            cover = self._cover(entity_id, token, now)
            covered = [] if cover is None else self._first_covered(entity_id, cover, lo, hi)
        else:
            covered = self._covered(entity_id, token, None, lo, hi, now)
        return sorted(locked + covered)

    def _first_covered(self, entity_id: int, cover: tuple[int, int], lo: int, hi: int) -> list[int]:
        rows = self._db.execute(
            "SELECT seq FROM messages WHERE entity_id = ? AND leasable = 1"
            " AND state IN ('active', 'dead_lettered') AND seq BETWEEN ? AND ?"
            " AND delivery_count = 0",
            (entity_id, max(lo, cover[0]), min(hi, cover[1])),
        )
        return [row[0] for row in rows]

    def lease_rows(
        self, entity_id: int, token: str, lo: int, hi: int, now: float
    ) -> list[tuple[Any, ...]]:
        rows = self._db.execute(
            f"SELECT {_LEASE_COLUMNS}, delivery_count FROM messages WHERE entity_id = ?"
            " AND state = 'locked' AND seq BETWEEN ? AND ? AND lock_token = ?"
            " AND locked_until > ?",
            (entity_id, lo, hi, token, now),
        ).fetchall()
        span = within(self._cover(entity_id, token, now), lo, hi)
        if span is not None:
            rows += self._db.execute(
                f"SELECT {_LEASE_COLUMNS}, delivery_count + 1 FROM messages WHERE entity_id = ?"
                " AND leasable = 1 AND state IN ('active', 'dead_lettered')"
                " AND seq BETWEEN ? AND ?",
                (entity_id, *span),
            ).fetchall()
            rows.sort(key=_first)
        return rows


def within(cover: tuple[int, int] | None, lo: int, hi: int) -> tuple[int, int] | None:
    """The part of ``[lo, hi]`` that ``cover`` spans, if any."""
    if cover is None or max(lo, cover[0]) > min(hi, cover[1]):
        return None
    return max(lo, cover[0]), min(hi, cover[1])


def _first(row: tuple[Any, ...]) -> Any:
    return row[0]


def _listed(seqs: list[int] | None) -> tuple[str, ...]:
    return () if seqs is None else (seqs_json(seqs),)
