"""The SQL of pipeline timelines (schema 9), the same in both stores: written with SQLite's
``?`` placeholders, which the PostgreSQL store turns into its own (the statements hold no
other question mark)."""

from __future__ import annotations

import json
from typing import Any

from poisonq.timeline import PipelineBatch, PipelineSummary

_COLUMNS = "lease, started_at, seconds, size, completed, retried, dead_lettered, isolation_jobs"
_SELECTED = "e.name, b.consumer, " + ", ".join(f"b.{c}" for c in _COLUMNS.split(", "))
# The dead-letter queue's index on (entity_id, state, seq) finds a lease's range directly.
DEAD_LETTERED_BETWEEN = (
    "SELECT coalesce(dead_letter_reason, ''), count(*) FROM messages"
    " WHERE entity_id = ? AND state = 'dead_lettered' AND seq BETWEEN ? AND ?"
    " AND dead_lettered_at BETWEEN ? AND ? GROUP BY coalesce(dead_letter_reason, '')"
)
RECORD_BATCH = (
    f"INSERT INTO pipeline_batches (entity_id, consumer, {_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (entity_id, consumer, lease) DO UPDATE SET"
    " started_at = excluded.started_at, seconds = excluded.seconds, size = excluded.size,"
    " completed = excluded.completed, retried = excluded.retried,"
    " dead_lettered = excluded.dead_lettered, isolation_jobs = excluded.isolation_jobs"
)
FORGET_BATCHES = "DELETE FROM pipeline_batches WHERE entity_id = ? AND consumer = ? AND lease <= ?"
FORGET_PIPELINE = "DELETE FROM pipeline_batches WHERE entity_id = ? AND consumer = ?"
PIPELINE_BATCHES = (
    f"SELECT {_SELECTED} FROM pipeline_batches b JOIN entities e ON e.id = b.entity_id"
    " WHERE b.entity_id = ? AND b.consumer = ? ORDER BY b.lease"
)
# Each consumer's last batch, with how many it keeps.
PIPELINES = (
    f"SELECT {_SELECTED}, n.batches"
    " FROM (SELECT entity_id, consumer, count(*) AS batches, max(lease) AS last"
    "  FROM pipeline_batches GROUP BY entity_id, consumer) n"
    " JOIN pipeline_batches b"
    "  ON b.entity_id = n.entity_id AND b.consumer = n.consumer AND b.lease = n.last"
    " JOIN entities e ON e.id = b.entity_id ORDER BY e.name, b.consumer"
)


def record_params(entity_id: int, batch: PipelineBatch) -> tuple[Any, ...]:
    """The parameters of :data:`RECORD_BATCH`."""
    return (
        entity_id,
        batch.consumer,
        batch.lease,
        batch.started_at,
        batch.seconds,
        batch.size,
        batch.completed,
        batch.retried,
        json.dumps(batch.dead_lettered, sort_keys=True),
        batch.isolation_jobs,
    )


def batch_row(row: tuple[Any, ...]) -> PipelineBatch:
    """A row of :data:`PIPELINE_BATCHES` (or the start of one of :data:`PIPELINES`)."""
    queue, consumer, lease, started, seconds, size, completed, retried, dead, jobs = row[:10]
    return PipelineBatch(
        queue, consumer, lease, started, seconds, size, completed, retried, json.loads(dead), jobs
    )


def summary_row(row: tuple[Any, ...]) -> PipelineSummary:
    """A row of :data:`PIPELINES`."""
    last = batch_row(row)
    return PipelineSummary(last.queue, last.consumer, int(row[10]), last)
