"""The history writes of the SQLite store (poisonq/store/history.py), with a commit; the
reads and the prune are :mod:`poisonq.store.history_sql`."""

from __future__ import annotations

import json
import sqlite3

from poisonq.store.history import HistoryBuffer, HistoryKeeper, buckets
from poisonq.store.history_sql import HistoryTables
from poisonq.store.rows import HELD_COUNT

# ?1: [[entity, change], ...]; ?2: [[span, bucket], ...]. The first change of a bucket
# records the depth before it, and the peak so far (the higher of that and the depth after);
# later ones raise the peak when they pass it, and otherwise leave the row unwritten.
_RECORD_DEPTHS = (
    "INSERT INTO depth_history (entity_id, span, bucket, opened, peak)"
    f" SELECT e.id, b.value ->> 0, b.value ->> 1, {HELD_COUNT} - (c.value ->> 1),"
    f" max({HELD_COUNT} - (c.value ->> 1), {HELD_COUNT})"
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


class SqliteHistory(HistoryTables):
    """The history writes of :class:`poisonq.store.sqlite.SqliteTransaction`."""

    _db: sqlite3.Connection
    history: HistoryBuffer

    async def write_history(self, keeper: HistoryKeeper) -> None:
        """Write what this transaction added (called just before its commit), and prune
        when a prune is due."""
        now, prune = keeper.stamp()
        spans = json.dumps(buckets(now))
        if depths := self.history.depth_rows():
            self._db.execute(_RECORD_DEPTHS, (json.dumps(depths), spans))
        if dead := self.history.dead_rows():
            self._db.execute(_RECORD_DEAD_LETTERS, (json.dumps(dead), spans))
        if prune:
            await self._prune_history(now)
