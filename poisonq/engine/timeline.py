"""Pipeline timelines: the record of each batch a pipeline completes, kept per consumer."""

from __future__ import annotations

from difflib import get_close_matches

from poisonq.engine.base import Target, check_count
from poisonq.engine.common import EngineBase
from poisonq.errors import InvalidOperationError, PipelineNotFoundError
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
            entity = self.resolver.resolve(tx, found[0].queue).entity
            return tx.pipeline_batches(entity.id, consumer)
