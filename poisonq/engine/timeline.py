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
    async def _record_batch(
        self, tx: Transaction, target: Target, lease: Lease, run: BatchRun, completed: int
    ) -> None:
        """Record the lease's batch as it is completed (in that transaction). The lease's
        dead-lettered messages are those of its range that the dead-letter queue took while
        its job ran: the jobs of one consumer run one after another, so no other batch of
        it settled a message then; what failed and was not dead-lettered or completed went
        back to be retried."""
        check_count(run.keep, "the batches to keep")
        dead_letters = await self.resolver.child(tx, target, SubQueue.DEADLETTER)
        dead = await tx.dead_lettered_between(
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
        await tx.record_batch(target.entity.id, batch, run.keep)

    async def pipelines(self) -> list[PipelineSummary]:
        """Every consumer with a recorded timeline, with its last batch."""
        async with self.store.transaction() as tx:
            return await tx.pipelines()

    async def pipeline_batches(
        self, consumer: str, queue: str | None = None
    ) -> list[PipelineBatch]:
        """The recorded batches of ``consumer`` (on ``queue``: needed only when the consumer
        runs on more than one), oldest first."""
        async with self.store.transaction() as tx:
            found = await self._pipeline(tx, consumer, queue)
            entity = (await self.resolver.resolve(tx, found.queue)).entity
            return await tx.pipeline_batches(entity.id, consumer)

    async def forget_pipeline(
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
        async with self.store.transaction() as tx:
            found = await self._pipeline(tx, consumer, queue)
            target = await self.resolver.resolve(tx, found.queue)
            entity = target.entity
            lease = await tx.lease(entity.id, entity.name, consumer, None)
            if lease is not None:
                span = (lease.min_sequence, lease.max_sequence)
                held = await tx.lease_seqs(entity.id, lease.lock_token, *span, now)
                if held and not force:
                    raise PipelineLeaseHeldError(consumer, entity.name, lease.number, len(held))
                if held:
                    await tx.release(entity.id, lease.lock_token, *span, None, target.ready, now)
                # Every lease of the consumer is settled now (one that still covers
                # messages, its lock run out, stays until housekeeping closes it).
                await tx.delete_leases(entity.id, consumer, lease.number + 1)
            await tx.forget_pipeline(entity.id, consumer)
            return found

    async def _pipeline(self, tx: Transaction, consumer: str, queue: str | None) -> PipelineSummary:
        """The one consumer named (on ``queue``), or why not: none has that name (with the
        nearest names), or it runs on several queues and ``queue`` is not given."""
        if queue is not None:
            queue = (await self.resolver.resolve(tx, queue)).entity.name
        known = await tx.pipelines()
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
