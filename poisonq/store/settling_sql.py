"""Settling in both stores, where the dialects agree: renewing and deferring locked messages,
and scheduling the redelivery of abandoned ones. SQLite adds the messages its lease covers
hold to renewing and deferring; completing, abandoning and dead-lettering are hot paths each
store writes its own way."""

from __future__ import annotations

from collections.abc import Sequence

from poisonq.store.shared_sql import SharedStatements


class SettlingStatements(SharedStatements):
    """The settlement methods of both stores' transactions."""

    def renew(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float, locked_until: float
    ) -> int:
        return self._update(
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

    def defer(self, entity_id: int, token: str, seqs: Sequence[int], now: float) -> int:
        return self._update(
            "UPDATE messages SET state = 'deferred', lock_token = NULL, locked_until = NULL"
            " WHERE entity_id = :entity AND state = 'locked' AND lock_token = :token"
            f" AND locked_until > :now AND seq {self._in_list('seqs')}",
            {"entity": entity_id, "token": token, "now": now, "seqs": self._list(seqs)},
        )

    def reschedule(self, entity_id: int, seqs: Sequence[int], visible_at: float) -> int:
        return self._update(
            "UPDATE messages SET state = 'scheduled', visible_at = :visible"
            f" WHERE entity_id = :entity AND state = 'active' AND seq {self._in_list('seqs')}",
            {"visible": visible_at, "entity": entity_id, "seqs": self._list(seqs)},
        )
