"""Leases in the SQLite store: the numbered batches a Spark query or pipeline locks at once,
and the executors' read path over them."""

from __future__ import annotations

import sqlite3
from typing import Any

from poisonq.model import Lease, MessageState


class SqliteLeases:
    """The lease methods of :class:`poisonq.store.sqlite.SqliteTransaction`."""

    _db: sqlite3.Connection

    def lock_ready_seqs(
        self, entity_id: int, ready: MessageState, limit: int, token: str, locked_until: float
    ) -> list[int]:
        rows = self._db.execute(
            "UPDATE messages SET state = 'locked', lock_token = ?, locked_until = ?,"
            " delivery_count = delivery_count + 1"
            " WHERE seq IN (SELECT seq FROM messages WHERE entity_id = ? AND state = ?"
            " ORDER BY seq LIMIT ?) RETURNING seq",
            (token, locked_until, entity_id, ready, limit),
        ).fetchall()
        return sorted(row[0] for row in rows)

    def insert_lease(self, entity_id: int, lease: Lease) -> None:
        self._db.execute(
            "INSERT INTO leases (entity_id, consumer, number, lock_token, count, min_seq,"
            " max_seq, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entity_id,
                lease.consumer,
                lease.number,
                lease.lock_token,
                lease.count,
                lease.min_sequence,
                lease.max_sequence,
                lease.created_at,
            ),
        )

    def lease(self, entity_id: int, name: str, consumer: str, number: int | None) -> Lease | None:
        row = self._db.execute(
            "SELECT consumer, number, lock_token, count, min_seq, max_seq, created_at,"
            " completed_at FROM leases WHERE entity_id = ? AND consumer = ?"
            " AND (? IS NULL OR number = ?)"
            " ORDER BY number DESC LIMIT 1",
            (entity_id, consumer, number, number),
        ).fetchone()
        return None if row is None else Lease(name, *row)

    def finish_lease(self, entity_id: int, consumer: str, number: int, now: float) -> None:
        self._db.execute(
            "UPDATE leases SET completed_at = ? WHERE entity_id = ? AND consumer = ?"
            " AND number = ?",
            (now, entity_id, consumer, number),
        )

    def plan_lease(self, entity_id: int, consumer: str, number: int) -> int:
        row = self._db.execute(
            "UPDATE leases SET planned = planned + 1 WHERE entity_id = ? AND consumer = ?"
            " AND number = ? RETURNING planned",
            (entity_id, consumer, number),
        ).fetchone()
        return 0 if row is None else int(row[0])

    def delete_leases(self, entity_id: int, consumer: str, before: int) -> None:
        self._db.execute(
            "DELETE FROM leases WHERE entity_id = ? AND consumer = ? AND number < ?",
            (entity_id, consumer, before),
        )

    def lease_seqs(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, first_delivery: bool = False
    ) -> list[int]:
        rows = self._db.execute(
            "SELECT seq FROM messages WHERE entity_id = ? AND state = 'locked'"
            " AND seq BETWEEN ? AND ? AND lock_token = ? AND locked_until > ?"
            " AND (NOT ? OR delivery_count = 1) ORDER BY seq",
            (entity_id, lo, hi, token, now, first_delivery),
        )
        return [row[0] for row in rows]

    def lease_rows(
        self, entity_id: int, token: str, lo: int, hi: int, now: float
    ) -> list[tuple[Any, ...]]:
        return self._db.execute(
            "SELECT seq, message_id, body, content_type, subject, properties, session_id,"
            " correlation_id, enqueued_at, delivery_count"
            " FROM messages JOIN bodies ON bodies.id = messages.body_id"
            " WHERE entity_id = ? AND state = 'locked' AND seq BETWEEN ? AND ?"
            " AND lock_token = ? AND locked_until > ? ORDER BY seq",
            (entity_id, lo, hi, token, now),
        ).fetchall()
