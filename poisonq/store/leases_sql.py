"""Leases in both stores: the row each lease keeps (its number, token, range and plans), and
the locks it holds message by message.

How a lease locks its batch differs (SQLite holds the fresh part as one range, its cover;
PostgreSQL locks every row, which competing consumers skip): each store locks in its own
``lock_lease``, and SQLite adds what its covers hold to ``renew_lease``, ``revive_lease``
and ``lease_seqs``, which here cover the messages locked row by row.
"""

from __future__ import annotations

from typing import Any

from poisonq.model import Lease
from poisonq.store.shared_sql import SharedStatements


class LeaseStatements(SharedStatements):
    """The lease methods of both stores' transactions."""

    def _insert_lease(self, entity_id: int, lease: Lease, **columns: Any) -> None:
        """Record ``lease``, with the store's own ``columns`` (names are ours, never user
        input)."""
        values = {
            "entity_id": entity_id,
            "consumer": lease.consumer,
            "number": lease.number,
            "lock_token": lease.lock_token,
            "count": lease.count,
            "min_seq": lease.min_sequence,
            "max_seq": lease.max_sequence,
            "created_at": lease.created_at,
            **columns,
        }
        self._execute(
            f"INSERT INTO leases ({', '.join(values)})"
            f" VALUES ({', '.join(':' + name for name in values)})",
            values,
        )

    def lease(self, entity_id: int, name: str, consumer: str, number: int | None) -> Lease | None:
        # The cast gives PostgreSQL the type of a NULL number.
        rows = self._query(
            "SELECT consumer, number, lock_token, count, min_seq, max_seq, created_at,"
            " completed_at FROM leases WHERE entity_id = :entity AND consumer = :consumer"
            " AND (CAST(:number AS bigint) IS NULL OR number = :number)"
            " ORDER BY number DESC LIMIT 1",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )
        return Lease(name, *rows[0]) if rows else None

    def finish_lease(self, entity_id: int, consumer: str, number: int, now: float) -> None:
        self._execute(
            "UPDATE leases SET completed_at = :now WHERE entity_id = :entity"
            " AND consumer = :consumer AND number = :number",
            {"now": now, "entity": entity_id, "consumer": consumer, "number": number},
        )

    def plan_lease(self, entity_id: int, consumer: str, number: int) -> int:
        rows = self._query(
            "UPDATE leases SET planned = planned + 1 WHERE entity_id = :entity"
            " AND consumer = :consumer AND number = :number RETURNING planned",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )
        return int(rows[0][0]) if rows else 0

    def lease_plans(self, entity_id: int, consumer: str, number: int) -> int:
        rows = self._query(
            "SELECT planned FROM leases WHERE entity_id = :entity AND consumer = :consumer"
            " AND number = :number",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )
        return int(rows[0][0]) if rows else 0

    def reset_lease_plans(self, entity_id: int, consumer: str, number: int) -> None:
        self._execute(
            "UPDATE leases SET planned = 0 WHERE entity_id = :entity AND consumer = :consumer"
            " AND number = :number",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )

    def renew_lease(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, locked_until: float
    ) -> int:
        return self._update(
            "UPDATE messages SET locked_until = :until WHERE entity_id = :entity"
            " AND state = 'locked' AND lock_token = :token AND locked_until > :now"
            " AND seq BETWEEN :lo AND :hi",
            {
                "until": locked_until,
                "entity": entity_id,
                "token": token,
                "now": now,
                "lo": lo,
                "hi": hi,
            },
        )

    def revive_lease(
        self, entity_id: int, token: str, lo: int, hi: int, locked_until: float
    ) -> int:
        # As renew_lease, whether or not the locks ran out.
        return self._update(
            "UPDATE messages SET locked_until = :until WHERE entity_id = :entity"
            " AND state = 'locked' AND lock_token = :token AND seq BETWEEN :lo AND :hi",
            {"until": locked_until, "entity": entity_id, "token": token, "lo": lo, "hi": hi},
        )

    def lease_seqs(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, first_delivery: bool = False
    ) -> list[int]:
        rows = self._query(
            "SELECT seq FROM messages WHERE entity_id = :entity AND state = 'locked'"
            " AND seq BETWEEN :lo AND :hi AND lock_token = :token AND locked_until > :now"
            " AND (NOT :first OR delivery_count = 1) ORDER BY seq",
            {
                "entity": entity_id,
                "lo": lo,
                "hi": hi,
                "token": token,
                "now": now,
                "first": first_delivery,
            },
        )
        return [row[0] for row in rows]
