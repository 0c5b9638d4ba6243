"""The history of the SQLite store (poisonq/store/history.py): written with a commit,
pruned by age, read by the charts."""

from __future__ import annotations

import json
import sqlite3

from poisonq.store.base import DeadLetterCount, DepthChange
from poisonq.store.history import (
    HistoryBuffer,
    HistoryKeeper,
    buckets,
    cutoffs,
    key_column,
    key_value,
)

_HELD = "sent + moved_in - completed - dropped - moved_out"
# ?1: [[entity, change], ...]; ?2: [[span, bucket], ...]. The first change of a bucket
# records the depth before it, and the peak so far (the higher of that and the depth after);
# later ones raise the peak when they pass it, and otherwise leave the row unwritten.
_RECORD_DEPTHS = (
    "INSERT INTO depth_history (entity_id, span, bucket, opened, peak)"
    f" SELECT e.id, b.value ->> 0, b.value ->> 1, {_HELD} - (c.value ->> 1),"
    f" max({_HELD} - (c.value ->> 1), {_HELD})"
    " FROM json_each(?1) c JOIN entities e ON e.id = c.value ->> 0, json_each(?2) b"
    " WHERE true ON CONFLICT DO UPDATE SET peak = excluded.peak"
    " WHERE peak IS NULL OR excluded.peak > peak"
)
# ?1: [[entity, reason, subject, fingerprint, count], ...] (keys as JSON text); ?2 as above.
_RECORD_DEAD_LETTERS = (
    "INSERT INTO dead_letter_history"
    " (entity_id, span, bucket, reason, subject, fingerprint, count)"
    " SELECT d.value ->> 0, b.value ->> 0, b.value ->> 1, d.value ->> 1, d.value ->> 2,"
    " d.value ->> 3, d.value ->> 4 FROM json_each(?1) d, json_each(?2) b"
    " WHERE true ON CONFLICT DO UPDATE SET count = count + excluded.count"
)


class SqliteHistory:
    """The history methods of :class:`poisonq.store.sqlite.SqliteTransaction`."""

    _db: sqlite3.Connection
    history: HistoryBuffer

    def write_history(self, keeper: HistoryKeeper) -> None:
        """Write what this transaction added (called just before its commit), and prune
        when a prune is due."""
        now, prune = keeper.stamp()
        spans = json.dumps(buckets(now))
        if depths := self.history.depth_rows():
            self._db.execute(_RECORD_DEPTHS, (json.dumps(depths), spans))
        if dead := self.history.dead_rows():
            self._db.execute(_RECORD_DEAD_LETTERS, (json.dumps(dead), spans))
        if prune:
            for table in ("dead_letter_history", "depth_history"):
                for span, oldest in cutoffs(now):
                    self._db.execute(
                        f"DELETE FROM {table} WHERE span = ? AND bucket < ?", (span, oldest)
                    )

    def dead_letter_history(
        self, span: int, since: float, by: str | None, entity_id: int | None
    ) -> list[DeadLetterCount]:
        key = key_column(by)
        one, params = _of_entity(entity_id)
        rows = self._db.execute(
            f"SELECT entity_id, bucket, {key}, sum(count) FROM dead_letter_history"
            f" WHERE span = ? AND bucket >= ?{one}"
            f" GROUP BY entity_id, bucket, {key} ORDER BY entity_id, bucket",
            (span, since, *params),
        )
        return [DeadLetterCount(e, b, key_value(k), n) for e, b, k, n in rows]

    def depth_history(self, span: int, since: float, entity_id: int | None) -> list[DepthChange]:
        one, params = _of_entity(entity_id)
        rows = self._db.execute(
            "SELECT entity_id, bucket, opened, peak FROM depth_history"
            f" WHERE span = ? AND bucket >= ?{one} ORDER BY entity_id, bucket",
            (span, since, *params),
        )
        return [DepthChange(*row) for row in rows]


def _of_entity(entity_id: int | None) -> tuple[str, list[int]]:
    """The clause (and its parameter) that keeps one entity's rows; none for every entity."""
    return ("", []) if entity_id is None else (" AND entity_id = ?", [entity_id])
