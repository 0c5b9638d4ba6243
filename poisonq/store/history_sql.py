"""The history (:mod:`poisonq.store.history`) in both stores: the charts' reads, and the
prune by age that follows a commit's writes when one is due. The writes themselves differ
(each dialect binds a batch of rows its own way: SQLite as JSON, PostgreSQL as arrays) and
stay in each store."""

from __future__ import annotations

from poisonq.store.base import DeadLetterCount, DepthChange
from poisonq.store.history import cutoffs, key_column, key_value
from poisonq.store.shared_sql import SharedStatements


def _of_entity(entity_id: int | None) -> str:
    """The clause that keeps one entity's rows (a plan of its own: by the primary key), or
    none for every entity."""
    return "" if entity_id is None else " AND entity_id = :entity"


class HistoryTables(SharedStatements):
    """The history methods of both stores' transactions."""

    async def _prune_history(self, now: float) -> None:
        """Delete the buckets older than each resolution keeps."""
        for table in ("dead_letter_history", "depth_history"):
            for span, oldest in cutoffs(now):
                await self._execute(
                    f"DELETE FROM {table} WHERE span = :span AND bucket < :oldest",
                    {"span": span, "oldest": oldest},
                )

    async def dead_letter_history(
        self, span: int, since: float, by: str | None, entity_id: int | None
    ) -> list[DeadLetterCount]:
        key = key_column(by)
        # The cast keeps PostgreSQL's sum of bigints an integer.
        rows = await self._query(
            f"SELECT entity_id, bucket, {key}, CAST(sum(count) AS bigint) FROM dead_letter_history"
            f" WHERE span = :span AND bucket >= :since{_of_entity(entity_id)}"
            f" GROUP BY entity_id, bucket, {key} ORDER BY entity_id, bucket",
            {"span": span, "since": since, "entity": entity_id},
        )
        return [DeadLetterCount(e, b, key_value(k), n) for e, b, k, n in rows]

    async def depth_history(
        self, span: int, since: float, entity_id: int | None
    ) -> list[DepthChange]:
        rows = await self._query(
            "SELECT entity_id, bucket, opened, peak FROM depth_history"
            f" WHERE span = :span AND bucket >= :since{_of_entity(entity_id)}"
            " ORDER BY entity_id, bucket",
            {"span": span, "since": since, "entity": entity_id},
        )
        return [DepthChange(*row) for row in rows]
