"""Dead-letter analysis and bulk tasks (resubmit, purge), one chunk per transaction."""

from __future__ import annotations

from typing import Any

from poisonq.engine.base import EngineBase
from poisonq.engine.targets import Target
from poisonq.errors import EntityDisabledError, InvalidOptionError, TaskNotFoundError
from poisonq.limits import check_count
from poisonq.model import ReceivedMessage
from poisonq.store.base import DeadLetterGroup, MessageFilter, TaskRecord, Transaction


class Tasks(EngineBase):
    def dead_letter_groups(self, address: str, by: str) -> list[DeadLetterGroup]:
        with self.store.transaction() as tx:
            return tx.dead_letter_groups(self.resolver.resolve(tx, address).entity.id, by)

    def find(
        self,
        address: str,
        where: MessageFilter,
        after_seq: int,
        limit: int,
        newest_first: bool = False,
    ) -> list[ReceivedMessage]:
        """Unlocked held messages of ``address`` matching ``where`` after ``after_seq``,
        oldest first (or the newest, newest first), at most ``limit``: the messages a bulk
        task with ``where`` would take."""
        check_count(limit, "limit")
        check_count(after_seq, "after", minimum=0)
        if not isinstance(newest_first, bool):
            raise InvalidOptionError(f"newest_first must be true or false, not {newest_first!r}")
        with self.store.transaction() as tx:
            entity = self._housekept(tx, address).entity
            seqs = tx.select(entity.id, where, after_seq, limit, newest_first)
            found = tx.messages(entity.id, entity.name, seqs)
            return found[::-1] if newest_first else found

    def count_matching(self, address: str, where: MessageFilter) -> int:
        """How many unlocked held messages of ``address`` match ``where``."""
        with self.store.transaction() as tx:
            return tx.count_matching(self._housekept(tx, address).entity.id, where)

    def start_task(
        self, kind: str, address: str, where: MessageFilter, spec: dict[str, Any]
    ) -> TaskRecord:
        """Record a bulk task over the messages of ``address`` matching ``where``."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            entity = self._housekept(tx, address).entity
            total = tx.count_matching(entity.id, where)
            task_id = tx.insert_task(kind, entity.id, spec, total, now)
            task = tx.task(task_id)
            assert task is not None
            return task

    def task(self, task_id: int) -> TaskRecord:
        check_count(task_id, "a task id", minimum=0)
        with self.store.transaction() as tx:
            task = tx.task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            return task

    def finish_task(self, task_id: int, status: str, error: str | None = None) -> TaskRecord:
        """Mark a running task completed, cancelled or failed (a finished one stays as it is)."""
        check_count(task_id, "a task id", minimum=0)
        with self.store.transaction() as tx:
            task = tx.task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            if task.status == "running":
                tx.update_task(task_id, task.done, status, error, self.clock.now())
            return tx.task(task_id)  # type: ignore[return-value]

    def task_step(
        self, task_id: int, address: str, where: MessageFilter, after_seq: int, limit: int
    ) -> list[int]:
        """Run the next chunk of a task: move (resubmit) or drop (purge) up to ``limit``
        matching messages after ``after_seq``, and record the progress in the same
        transaction. Returns the sequence numbers handled; none once the task is cancelled
        or nothing is left."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            task = tx.task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            if task.status != "running":
                return []
            source = self._housekept(tx, address)
            seqs = tx.select(source.entity.id, where, after_seq, limit)
            if not seqs:
                return []
            if task.kind == "resubmit":
                to = task.spec.get("to")
                target = (
                    self.resolver.main(tx, to)
                    if to
                    else self.resolver.resolve(tx, source.queue.name)
                )
                if not target.entity.status.can_send:
                    raise EntityDisabledError(target.entity.name, target.entity.status, "resubmit")
                ttl = target.options.default_message_ttl
                expires_at = None if ttl is None else now + ttl
                done = tx.resubmit(source.entity.id, seqs, target.entity.id, now, expires_at)
            else:
                done = tx.drop(source.entity.id, seqs)
            tx.update_task(task_id, task.done + done, "running", None, now)
            return seqs

    def _housekept(self, tx: Transaction, address: str) -> Target:
        """``address`` resolved, its expired locks counted first: a message whose lock ran
        out is back where it was held (a dead letter received and never settled is a dead
        letter again), and so among what a task selects."""
        target = self.resolver.resolve(tx, address)
        self.poisoner.housekeep(tx, target, self.clock.now())
        return target
