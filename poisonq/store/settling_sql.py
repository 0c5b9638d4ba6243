"""Settling in both stores, where the dialects agree: renewing and deferring locked messages
(and those a lease's cover holds), and scheduling the redelivery of abandoned ones.
Completing, abandoning and dead-lettering are hot paths each store writes its own way."""

from __future__ import annotations

from collections.abc import Sequence

from poisonq.store.leases_sql import LeaseStatements


class SettlingStatements(LeaseStatements):
    """The settlement methods of both stores' transactions."""

    async def renew(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float, locked_until: float
    ) -> int:
        renewed = await self._update(
            "UPDATE messages SET locked_until = :until WHERE entity_id = :entity"
            " AND state = 'locked' AND lock_token = :token AND locked_until > :now"
            f" AND seq {self._in_list('seqs')}",
            {
                "until": locked_until,
                "entity": entity_id,
                "token": token,
                "now": now,
                "seqs": self._list(seqs),
            },
        )
        if renewed < len(seqs):  # a covered message leaves its lease's cover for a lock of its own
            covered = await self._covered_of(entity_id, token, seqs, now)
            renewed += await self._update(
                "UPDATE messages SET state = 'locked', lock_token = :token,"
                " locked_until = :until, delivery_count = delivery_count + 1, leasable = 0"
                f" WHERE seq {self._in_list('seqs')}",
                {"token": token, "until": locked_until, "seqs": self._list(covered)},
            )
        return renewed

    async def defer(self, entity_id: int, token: str, seqs: Sequence[int], now: float) -> list[int]:
        rows = await self._query(
            "UPDATE messages SET state = 'deferred', lock_token = NULL, locked_until = NULL"
            " WHERE entity_id = :entity AND state = 'locked' AND lock_token = :token"
            f" AND locked_until > :now AND seq {self._in_list('seqs')} RETURNING seq",
            {"entity": entity_id, "token": token, "now": now, "seqs": self._list(seqs)},
        )
        deferred = [row[0] for row in rows]
        if len(deferred) < len(seqs):
            covered = await self._covered_of(entity_id, token, seqs, now)
            if covered:
                await self._execute(
                    "UPDATE messages SET state = 'deferred', delivery_count = delivery_count + 1,"
                    f" leasable = 0 WHERE seq {self._in_list('seqs')}",
                    {"seqs": self._list(covered)},
                )
            deferred += covered
        return deferred

    async def reschedule(self, entity_id: int, seqs: Sequence[int], visible_at: float) -> int:
        return await self._update(
            "UPDATE messages SET state = 'scheduled', visible_at = :visible"
            f" WHERE entity_id = :entity AND state = 'active' AND seq {self._in_list('seqs')}",
            {"visible": visible_at, "entity": entity_id, "seqs": self._list(seqs)},
        )
