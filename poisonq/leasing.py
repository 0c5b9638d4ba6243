"""The part of the :class:`~poisonq.Broker` the Spark runtime and the pipeline runner use:
leases (a numbered batch of messages locked under one token, settled by range) and the
pipelines' timelines (the batches a consumer recorded as it completed its leases)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import partial
from typing import Any

from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.messaging import held_only
from poisonq.model import Duration, Lease, Settlement
from poisonq.options import lock_seconds
from poisonq.timeline import BatchRun, PipelineBatch, PipelineSummary


class Leasing:
    """Leases and pipeline timelines, on the engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def acquire_lease(
        self,
        address: str,
        consumer: str,
        number: int,
        max_messages: int,
        lock_duration: Duration | None = None,
    ) -> Lease | None:
        """Lock up to ``max_messages`` messages as lease ``number`` of ``consumer``, or get
        that lease again (renewed) if it exists. ``None`` when nothing is receivable."""
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        return drive(self.engine.acquire_lease(address, consumer, number, max_messages, seconds))

    def lease(self, address: str, consumer: str, number: int | None = None) -> Lease | None:
        """The consumer's lease ``number`` (its latest by default), if it still exists."""
        return drive(self.engine.lease(address, consumer, number))

    def lease_sequence_numbers(
        self,
        lease: Lease,
        lo: int | None = None,
        hi: int | None = None,
        *,
        first_delivery: bool = False,
    ) -> list[int]:
        """The sequence numbers in ``[lo, hi]`` the lease still holds under a valid lock;
        with ``first_delivery``, only the messages delivered for the first time."""
        return drive(self.engine.lease_sequence_numbers(lease, lo, hi, first_delivery))

    def lease_rows(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> list[tuple[Any, ...]]:
        """The messages the lease still holds, as tuples of
        :data:`poisonq.store.base.LEASE_COLUMNS` (what Spark executors read)."""
        return drive(self.engine.lease_rows(lease, lo, hi))

    def retry_in_lease(
        self,
        lease: Lease,
        settlements: Sequence[Settlement],
        again: Collection[int] | None = None,
    ) -> tuple[list[tuple[Any, ...]], list[int]]:
        """Settle messages the lease holds and take back into it, each counting a
        delivery, the abandoned ones in ``again`` (default: all) that the queue's retry
        policy returned to it at once (one transaction: see
        :meth:`poisonq.engine.leases.Leasing.retry_in_lease`). Settlements whose locks ran
        out are left out, as :meth:`~poisonq.Broker.settle_held` leaves them. Returns the
        messages taken back (as :meth:`lease_rows` does) and the lost sequence numbers."""
        retry = partial(self.engine.retry_in_lease, lease, again=again)
        return drive(held_only(retry, settlements))

    def renew_lease(self, lease: Lease, lock_duration: Duration | None = None) -> int:
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        return drive(self.engine.renew_lease(lease, seconds))

    def resume_lease(self, lease: Lease, lock_duration: Duration | None = None) -> int:
        """Renew the lease's locks, reviving those that ran out if nothing reclaimed their
        messages since (a replay after a restart); returns how many messages it holds."""
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        return drive(self.engine.resume_lease(lease, seconds))

    def complete_lease(self, lease: Lease, run: BatchRun | None = None) -> int:
        """Complete what the lease still holds; returns how many were completed. With
        ``run`` (its job's start, duration and isolation jobs), the batch is recorded in the
        consumer's timeline in the same transaction (see :meth:`pipeline_batches`)."""
        return drive(self.engine.complete_lease(lease, run))

    def plan_lease(self, lease: Lease) -> int:
        """Count a planning of the lease's batch; returns how many times it was planned
        (more than once: a replay)."""
        return drive(self.engine.plan_lease(lease))

    def lease_plans(self, lease: Lease) -> int:
        """How many times the lease's batch was planned (without counting one more)."""
        return drive(self.engine.lease_plans(lease))

    def reset_lease_plans(self, lease: Lease) -> None:
        """Count the lease's batch as not planned yet (a handler that isolates its own
        failures took it up: a later planning is a restart's replay, not narrowed)."""
        drive(self.engine.reset_lease_plans(lease))

    def release_lease(self, lease: Lease, lo: int | None = None, hi: int | None = None) -> int:
        """Give back what the lease still holds in ``[lo, hi]`` (all of it by default) as if
        never delivered: no delivery counted, no failure recorded. Returns how many."""
        return drive(self.engine.release_lease(lease, lo, hi))

    def pipelines(self) -> list[PipelineSummary]:
        """Every consumer with recorded pipeline batches, with its last batch."""
        return drive(self.engine.pipelines())

    def forget_pipeline(
        self, consumer: str, queue: str | None = None, *, force: bool = False
    ) -> PipelineSummary:
        """Forget a retired pipeline consumer: its timeline (so its metrics, and the
        ``PoisonqPipelineStalled`` alert, go) and its settled leases. Refused with
        :class:`~poisonq.errors.PipelineLeaseHeldError` while its latest lease holds
        messages under a live lock, unless ``force`` (they go back to the queue, no delivery
        counted). Returns the consumer's summary as it was."""
        return drive(self.engine.forget_pipeline(consumer, queue, force))

    def pipeline_batches(self, consumer: str, queue: str | None = None) -> list[PipelineBatch]:
        """The batches recorded for ``consumer``, oldest first (its last ``keep``: see
        :class:`~poisonq.spark.Pipeline`). ``queue`` is needed only when the consumer runs
        on several queues; :class:`PipelineNotFoundError` when nothing is recorded."""
        return drive(self.engine.pipeline_batches(consumer, queue))
