"""Dead-letter analysis in both stores: the groups of a dead-letter queue (by reason, subject
or fingerprint) and the causes a reason hides, for the explorer and the command line."""

from __future__ import annotations

from poisonq.store.base import DeadLetterCause, DeadLetterGroup
from poisonq.store.rows import GROUP_KEYS
from poisonq.store.shared_sql import SharedStatements


class DeadLetterAnalysis(SharedStatements):
    """The dead-letter analysis methods of both stores' transactions."""

    def dead_letter_groups(self, entity_id: int, by: str) -> list[DeadLetterGroup]:
        key, label = GROUP_KEYS[by]  # column names, never user text
        rows = self._query(
            f"SELECT {key}, max({label}), count(*),"
            " min(coalesce(dead_lettered_at, enqueued_at)),"
            " max(coalesce(dead_lettered_at, enqueued_at))"
            f" FROM messages WHERE entity_id = :entity GROUP BY {key}"
            f" ORDER BY count(*) DESC, {key} NULLS FIRST",
            {"entity": entity_id},
        )
        return [DeadLetterGroup(*row) for row in rows]

    def dead_letter_causes(self, entity_id: int) -> list[DeadLetterCause]:
        rows = self._query(
            "SELECT dead_letter_reason, last_error_type, count(*), min(seq) FROM messages"
            " WHERE entity_id = :entity GROUP BY dead_letter_reason, last_error_type"
            " ORDER BY dead_letter_reason, count(*) DESC, last_error_type NULLS FIRST",
            {"entity": entity_id},
        )
        return [DeadLetterCause(*row) for row in rows]
