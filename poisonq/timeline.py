"""A pipeline run's timeline: one record per batch, kept by the store for operators.

The runner (:mod:`poisonq.spark.pipeline`) knows when a batch's job started, how long it ran
and how many isolation jobs it took; the engine adds what became of the lease's messages when
it completes the lease, in the same transaction, and keeps only the consumer's last
``keep`` batches. The CLI (``poisonq pipeline show``), the web UI and ``/metrics`` read them
back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_KEEP = 1_000  # batches kept per consumer unless the pipeline says otherwise


@dataclass(frozen=True, slots=True)
class BatchRun:
    """What the runner knows of a batch as it completes the batch's lease: its job's start
    (epoch seconds) and duration, the isolation jobs it took, and how many of the consumer's
    batches to keep."""

    started_at: float
    seconds: float
    isolation_jobs: int = 0
    keep: int = DEFAULT_KEEP


@dataclass(frozen=True, slots=True)
class PipelineBatch:
    """One batch of a pipeline: lease ``lease`` of ``consumer`` on ``queue``, its ``size``
    messages completed, retried (given back to the queue's retry policy) or dead-lettered
    (by reason, counted)."""

    queue: str
    consumer: str
    lease: int
    started_at: float
    seconds: float
    size: int
    completed: int
    retried: int
    dead_lettered: dict[str, int]
    isolation_jobs: int

    @property
    def dead_lettered_total(self) -> int:
        return sum(self.dead_lettered.values())

    @property
    def messages_per_second(self) -> float:
        return self.size / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "consumer": self.consumer,
            "lease": self.lease,
            "started_at": self.started_at,
            "seconds": self.seconds,
            "size": self.size,
            "completed": self.completed,
            "retried": self.retried,
            "dead_lettered": dict(self.dead_lettered),
            "isolation_jobs": self.isolation_jobs,
            "messages_per_second": self.messages_per_second,
        }


@dataclass(frozen=True, slots=True)
class PipelineSummary:
    """A consumer of a queue with a timeline: how many batches are kept, and the last."""

    queue: str
    consumer: str
    batches: int
    last: PipelineBatch

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "consumer": self.consumer,
            "batches": self.batches,
            "last": self.last.to_json(),
        }


def per_second(rate: float) -> str:
    """A rate as tables show it: whole numbers from 10 up, two figures below (a batch of 4
    messages in 8.7 s is 0.46/s, not 0)."""
    return f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"
