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
        rows = self._fetch_all(
            f"SELECT entity_id, bucket, {key}, sum(count)::bigint FROM dead_letter_history"
            f" WHERE span = %(span)b AND bucket >= %(since)b{_of_entity(entity_id)}"
            f" GROUP BY entity_id, bucket, {key} ORDER BY entity_id, bucket",
            {"span": span, "since": since, "entity": entity_id},
        )
        return [DeadLetterCount(e, b, key_value(k), n) for e, b, k, n in rows]

    def depth_history(self, span: int, since: float, entity_id: int | None) -> list[DepthChange]:
        rows = self._fetch_all(
            "SELECT entity_id, bucket, opened, peak FROM depth_history"
            f" WHERE span = %(span)b AND bucket >= %(since)b{_of_entity(entity_id)}"
            " ORDER BY entity_id, bucket",
            {"span": span, "since": since, "entity": entity_id},
        )
        return [DepthChange(*row) for row in rows]


def _of_entity(entity_id: int | None) -> str:
    """The clause that keeps one entity's rows (a plan of its own: by the primary key), or
    none for every entity."""
    return "" if entity_id is None else " AND entity_id = %(entity)b"
