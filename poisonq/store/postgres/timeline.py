"""Pipeline timelines in the PostgreSQL store (the SQL is :mod:`poisonq.store.timeline_sql`,
shared with SQLite). Recording a batch waits for nothing: its two statements travel with the
lease's completion and ``COMMIT``."""

from __future__ import annotations

from poisonq.store import timeline_sql as sql
from poisonq.store.postgres.runner import StatementRunner
from poisonq.timeline import PipelineBatch, PipelineSummary


def _pg(statement: str) -> str:
    return statement.replace("?", "%b")


class TimelineQueries(StatementRunner):
    def dead_lettered_between(
        self, entity_id: int, lo: int, hi: int, since: float, until: float
    ) -> dict[str, int]:
        rows = self._all(_pg(sql.DEAD_LETTERED_BETWEEN), (entity_id, lo, hi, since, until))
        return {reason: int(count) for reason, count in rows}

    def record_batch(self, entity_id: int, batch: PipelineBatch, keep: int) -> None:
        self._run(_pg(sql.RECORD_BATCH), sql.record_params(entity_id, batch))
        self._run(_pg(sql.FORGET_BATCHES), (entity_id, batch.consumer, batch.lease - keep))

    def forget_pipeline(self, entity_id: int, consumer: str) -> None:
        self._run(_pg(sql.FORGET_PIPELINE), (entity_id, consumer))

    def pipeline_batches(self, entity_id: int, consumer: str) -> list[PipelineBatch]:
        rows = self._all(_pg(sql.PIPELINE_BATCHES), (entity_id, consumer))
        return [sql.batch_row(row) for row in rows]

    def pipelines(self) -> list[PipelineSummary]:
        return [sql.summary_row(row) for row in self._all(sql.PIPELINES)]
