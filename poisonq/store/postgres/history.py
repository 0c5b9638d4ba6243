"""The charts' reads of the PostgreSQL store's history (poisonq/store/history.py; the runner
writes it with each commit). The statements follow the SQLite store's."""

from __future__ import annotations

from poisonq.store.base import DeadLetterCount, DepthChange
from poisonq.store.history import key_column, key_value
from poisonq.store.postgres.runner import StatementRunner


class HistoryQueries(StatementRunner):
    def dead_letter_history(
        self, span: int, since: float, by: str | None, entity_id: int | None
    ) -> list[DeadLetterCount]:
        key = key_column(by)
        rows = self._all(
            f"SELECT entity_id, bucket, {key}, sum(count)::bigint FROM dead_letter_history"
            " WHERE span = %(span)b AND bucket >= %(since)b"
            " AND (%(entity)b::bigint IS NULL OR entity_id = %(entity)b)"
            f" GROUP BY entity_id, bucket, {key} ORDER BY entity_id, bucket",
            {"span": span, "since": since, "entity": entity_id},
        )
        return [DeadLetterCount(e, b, key_value(k), n) for e, b, k, n in rows]

    def depth_history(self, span: int, since: float, entity_id: int | None) -> list[DepthChange]:
        rows = self._all(
            "SELECT entity_id, bucket, opened FROM depth_history"
            " WHERE span = %(span)b AND bucket >= %(since)b"
            " AND (%(entity)b::bigint IS NULL OR entity_id = %(entity)b)"
            " ORDER BY entity_id, bucket",
            {"span": span, "since": since, "entity": entity_id},
        )
        return [DepthChange(*row) for row in rows]
