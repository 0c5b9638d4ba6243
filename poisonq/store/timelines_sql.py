"""Pipeline timelines (schema 9) in both stores: a record per batch a pipeline completes,
written in the lease's completing transaction (PostgreSQL sends both statements with the
completion and ``COMMIT``), the oldest beyond what the consumer keeps removed."""

from __future__ import annotations

import json
from typing import Any

from poisonq.store.shared_sql import SharedStatements
from poisonq.timeline import PipelineBatch, PipelineSummary

_COLUMNS = "lease, started_at, seconds, size, completed, retried, dead_lettered, isolation_jobs"
_SELECTED = "e.name, b.consumer, " + ", ".join(f"b.{c}" for c in _COLUMNS.split(", "))
# The dead-letter queue's index on (entity_id, state, seq) finds a lease's range directly.
_DEAD_LETTERED_BETWEEN = (
    "SELECT coalesce(dead_letter_reason, ''), count(*) FROM messages"
    " WHERE entity_id = :entity AND state = 'dead_lettered' AND seq BETWEEN :lo AND :hi"
    " AND dead_lettered_at BETWEEN :since AND :until GROUP BY coalesce(dead_letter_reason, '')"
)
_RECORD_BATCH = (
    f"INSERT INTO pipeline_batches (entity_id, consumer, {_COLUMNS})"
    " VALUES (:entity, :consumer, :lease, :started_at, :seconds, :size, :completed, :retried,"
    " :dead_lettered, :isolation_jobs)"
    " ON CONFLICT (entity_id, consumer, lease) DO UPDATE SET"
    " started_at = excluded.started_at, seconds = excluded.seconds, size = excluded.size,"
    " completed = excluded.completed, retried = excluded.retried,"
    " dead_lettered = excluded.dead_lettered, isolation_jobs = excluded.isolation_jobs"
)
_FORGET_BATCHES = (
    "DELETE FROM pipeline_batches WHERE entity_id = :entity AND consumer = :consumer"
    " AND lease <= :last"
)
_FORGET_PIPELINE = "DELETE FROM pipeline_batches WHERE entity_id = :entity AND consumer = :consumer"
_PIPELINE_BATCHES = (
    f"SELECT {_SELECTED} FROM pipeline_batches b JOIN entities e ON e.id = b.entity_id"
    " WHERE b.entity_id = :entity AND b.consumer = :consumer ORDER BY b.lease"
)
# Each consumer's last batch, with how many it keeps.
_PIPELINES = (
    f"SELECT {_SELECTED}, n.batches"
    " FROM (SELECT entity_id, consumer, count(*) AS batches, max(lease) AS last"
    "  FROM pipeline_batches GROUP BY entity_id, consumer) n"
    " JOIN pipeline_batches b"
    "  ON b.entity_id = n.entity_id AND b.consumer = n.consumer AND b.lease = n.last"
    " JOIN entities e ON e.id = b.entity_id ORDER BY e.name, b.consumer"
)


def _record_params(entity_id: int, batch: PipelineBatch) -> dict[str, Any]:
    """The parameters of :data:`_RECORD_BATCH`."""
    return {
        "entity": entity_id,
        "consumer": batch.consumer,
        "lease": batch.lease,
        "started_at": batch.started_at,
        "seconds": batch.seconds,
        "size": batch.size,
        "completed": batch.completed,
        "retried": batch.retried,
        "dead_lettered": json.dumps(batch.dead_lettered, sort_keys=True),
        "isolation_jobs": batch.isolation_jobs,
    }


def _batch_row(row: tuple[Any, ...]) -> PipelineBatch:
    """A row of :data:`_PIPELINE_BATCHES` (or the start of one of :data:`_PIPELINES`)."""
    queue, consumer, lease, started, seconds, size, completed, retried, dead, jobs = row[:10]
    return PipelineBatch(
        queue, consumer, lease, started, seconds, size, completed, retried, json.loads(dead), jobs
    )


def _summary_row(row: tuple[Any, ...]) -> PipelineSummary:
    """A row of :data:`_PIPELINES`."""
    last = _batch_row(row)
    return PipelineSummary(last.queue, last.consumer, int(row[10]), last)


class TimelineStatements(SharedStatements):
    """The timeline methods of both stores' transactions."""

    async def dead_lettered_between(
        self, entity_id: int, lo: int, hi: int, since: float, until: float
    ) -> dict[str, int]:
        rows = await self._query(
            _DEAD_LETTERED_BETWEEN,
            {"entity": entity_id, "lo": lo, "hi": hi, "since": since, "until": until},
        )
        return {reason: int(count) for reason, count in rows}

    async def record_batch(self, entity_id: int, batch: PipelineBatch, keep: int) -> None:
        await self._execute(_RECORD_BATCH, _record_params(entity_id, batch))
        last = batch.lease - keep
        await self._execute(
            _FORGET_BATCHES, {"entity": entity_id, "consumer": batch.consumer, "last": last}
        )

    async def forget_pipeline(self, entity_id: int, consumer: str) -> None:
        await self._execute(_FORGET_PIPELINE, {"entity": entity_id, "consumer": consumer})

    async def pipeline_batches(self, entity_id: int, consumer: str) -> list[PipelineBatch]:
        rows = await self._query(_PIPELINE_BATCHES, {"entity": entity_id, "consumer": consumer})
        return [_batch_row(row) for row in rows]

    async def pipelines(self) -> list[PipelineSummary]:
        return [_summary_row(row) for row in await self._query(_PIPELINES, {})]
