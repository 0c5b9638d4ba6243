"""Pipeline timelines in the SQLite store (the SQL is :mod:`poisonq.store.timeline_sql`)."""

from __future__ import annotations

import sqlite3

from poisonq.store import timeline_sql as sql
from poisonq.timeline import PipelineBatch, PipelineSummary


class SqliteTimelines:
    """The timeline methods of :class:`poisonq.store.sqlite.SqliteTransaction`."""

    _db: sqlite3.Connection

    def dead_lettered_between(
        self, entity_id: int, lo: int, hi: int, since: float, until: float
    ) -> dict[str, int]:
        rows = self._db.execute(sql.DEAD_LETTERED_BETWEEN, (entity_id, lo, hi, since, until))
        return {reason: count for reason, count in rows}

    def record_batch(self, entity_id: int, batch: PipelineBatch, keep: int) -> None:
        self._db.execute(sql.RECORD_BATCH, sql.record_params(entity_id, batch))
        self._db.execute(sql.FORGET_BATCHES, (entity_id, batch.consumer, batch.lease - keep))

    def forget_pipeline(self, entity_id: int, consumer: str) -> None:
        self._db.execute(sql.FORGET_PIPELINE, (entity_id, consumer))

    def pipeline_batches(self, entity_id: int, consumer: str) -> list[PipelineBatch]:
        rows = self._db.execute(sql.PIPELINE_BATCHES, (entity_id, consumer))
        return [sql.batch_row(row) for row in rows]

    def pipelines(self) -> list[PipelineSummary]:
        return [sql.summary_row(row) for row in self._db.execute(sql.PIPELINES)]
