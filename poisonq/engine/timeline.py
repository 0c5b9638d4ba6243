"""Pipeline timelines: the record of each batch a pipeline completes, kept per consumer."""

from __future__ import annotations

from difflib import get_close_matches

from poisonq.engine.base import EngineBase
from poisonq.engine.targets import Target
from poisonq.errors import (
    InvalidOperationError,
    InvalidOptionError,
    PipelineLeaseHeldError,
    PipelineNotFoundError,
)
from poisonq.limits import check_count
from poisonq.model import Lease, SubQueue
from poisonq.store.base import Transaction
from poisonq.timeline import BatchRun, PipelineBatch, PipelineSummary


class Timelines(EngineBase):
    def _record_batch(
        self, tx: Transaction, target: Target, lease: Lease, run: BatchRun, completed: int
    ) -> None:
        """Record the lease's batch as it is completed (in that transaction). The lease's
        dead-lettered messages are those of its range that the dead-letter queue took while
        its job ran: the jobs of one consumer run one after another, so no other batch of
        it settled a message then; what failed and was not dead-lettered or completed went
        back to be retried."""
        check_count(run.keep, "the batches to keep")
        dead_letters = self.resolver.child(tx, target, SubQueue.DEADLETTER)
        dead = tx.dead_lettered_between(
            dead_letters.id,
            lease.min_sequence,
            lease.max_sequence,
            run.started_at,
            run.started_at + run.seconds,
        )
        batch = PipelineBatch(
            target.entity.name,
            lease.consumer,
            lease.number,
            run.started_at,
            run.seconds,
            lease.count,
            completed,
            max(0, lease.count - completed - sum(dead.values())),
            dead,
            run.isolation_jobs,
        )
        tx.record_batch(target.entity.id, batch, run.keep)

    def pipelines(self) -> list[PipelineSummary]:
        """Every consumer with a recorded timeline, with its last batch."""
        with self.store.transaction() as tx:
            return tx.pipelines()

    def pipeline_batches(self, consumer: str, queue: str | None = None) -> list[PipelineBatch]:
        """The recorded batches of ``consumer`` (on ``queue``: needed only when the consumer
        runs on more than one), oldest first."""
        with self.store.transaction() as tx:
            found = self._pipeline(tx, consumer, queue)
            entity = self.resolver.resolve(tx, found.queue).entity
            return tx.pipeline_batches(entity.id, consumer)

    def forget_pipeline(
        self, consumer: str, queue: str | None = None, force: bool = False
    ) -> PipelineSummary:
        """Forget a retired consumer: its timeline and its settled leases, so no metric
        (nor alert) speaks of it any more. A consumer whose latest lease still holds
        messages under a live lock looks alive: refused with
        :class:`PipelineLeaseHeldError` unless ``force``, which first gives those messages
        back to the queue as :meth:`release_lease` does. Returns what was forgotten."""
        if not isinstance(force, bool):
            raise InvalidOptionError(f"force must be true or false, not {force!r}")
        now = self.clock.now()
        with self.store.transaction() as tx:
            found = self._pipeline(tx, consumer, queue)
            target = self.resolver.resolve(tx, found.queue)
            entity = target.entity
            lease = tx.lease(entity.id, entity.name, consumer, None)
            if lease is not None:
                span = (lease.min_sequence, lease.max_sequence)
                held = tx.lease_seqs(entity.id, lease.lock_token, *span, now)
                if held and not force:
                    raise PipelineLeaseHeldError(consumer, entity.name, lease.number, len(held))
                if held:
                    tx.release(entity.id, lease.lock_token, *span, None, target.ready, now)
                # Every lease of the consumer is settled now (one that still covers
                # messages, its lock run out, stays until housekeeping closes it).
                tx.delete_leases(entity.id, consumer, lease.number + 1)
            tx.forget_pipeline(entity.id, consumer)
            return found

    def _pipeline(self, tx: Transaction, consumer: str, queue: str | None) -> PipelineSummary:
        """The one consumer named (on ``queue``), or why not: none has that name (with the
        nearest names), or it runs on several queues and ``queue`` is not given."""
        if queue is not None:
            queue = self.resolver.resolve(tx, queue).entity.name
        known = tx.pipelines()
        found = [s for s in known if s.consumer == consumer and queue in (None, s.queue)]
        if not found:
            names = sorted({s.consumer for s in known})
            raise PipelineNotFoundError(consumer, queue, get_close_matches(consumer, names))
        if len(found) > 1:
            queues = ", ".join(repr(s.queue) for s in found)
            raise InvalidOperationError(
                f"consumer {consumer!r} has batches on queues {queues}: name the queue"
            )
        return found[0]
