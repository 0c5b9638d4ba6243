"""Dead-letter analysis and bulk tasks (resubmit, purge), one chunk per transaction."""

from __future__ import annotations

from typing import Any

from poisonq.engine.base import EngineBase
from poisonq.engine.targets import Target, check_text, holds_dead_letters
from poisonq.errors import (
    EntityDisabledError,
    InvalidOptionError,
    TaskNotFoundError,
    TaskRunningError,
)
from poisonq.limits import check_count
from poisonq.model import ReceivedMessage
from poisonq.store.base import DeadLetterGroup, MessageFilter, TaskRecord, Transaction


class Tasks(EngineBase):
    async def dead_letter_groups(self, address: str, by: str) -> list[DeadLetterGroup]:
        return await self.housekeeper.read(
            address,
            lambda tx, t: tx.dead_letter_groups(t.entity.id, by, holds_dead_letters(t)),
        )

    async def find(
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

        async def read(tx: Transaction, target: Target) -> list[ReceivedMessage]:
            entity = target.entity
            seqs = await tx.select(entity.id, where, after_seq, limit, newest_first)
            found = await tx.messages(entity.id, entity.name, seqs)
            return found[::-1] if newest_first else found

        return await self.housekeeper.read(address, read)

    async def count_matching(self, address: str, where: MessageFilter) -> int:
        """How many unlocked held messages of ``address`` match ``where``."""
        return await self.housekeeper.read(
            address,
            lambda tx, target: tx.count_matching(
                target.entity.id, where, holds_dead_letters(target)
            ),
        )

    async def start_task(
        self,
        kind: str,
        address: str,
        where: MessageFilter,
        spec: dict[str, Any],
        started_by: str | None,
    ) -> TaskRecord:
        """Record a bulk task over the messages of ``address`` matching ``where``; or
        :class:`TaskRunningError` while another task works there (one at a time, as SQS
        allows one move task per queue, so two never take the same messages)."""
        check_text(started_by, "an operator's name")
        now = self.clock.now()
        async with self.store.transaction() as tx:
            entity = (await self._housekept(tx, address)).entity
            if (running := await self._running(tx, entity.id, now)) is not None:
                raise TaskRunningError(entity.name, running.id, running.started_by)
            total = await tx.count_matching(entity.id, where)
            task_id = await tx.insert_task(kind, entity.id, spec, total, now, started_by)
            task = await tx.task(task_id)
            assert task is not None
            return task

    async def running_task(self, address: str) -> TaskRecord | None:
        """The task working on ``address``'s messages, which a new one would wait for."""
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, address)).entity
            return await self._running(tx, entity.id, self.clock.now())

    @staticmethod
    async def _running(tx: Transaction, entity_id: int, now: float) -> TaskRecord | None:
        alive = await _ended_if_dead(tx, await tx.tasks(entity_id, None, 10, running=True), now)
        running = [t for t in alive if t.status == "running"]
        return running[0] if running else None

    async def tasks(
        self, address: str | None, before_id: int | None = None, limit: int = 50
    ) -> list[TaskRecord]:
        """The tasks, newest first: of ``address``'s entity, or all."""
        check_count(limit, "limit")
        if before_id is not None:
            check_count(before_id, "before", minimum=0)
        async with self.store.transaction() as tx:
            entity_id = (
                None if address is None else (await self.resolver.resolve(tx, address)).entity.id
            )
            return await _ended_if_dead(
                tx, await tx.tasks(entity_id, before_id, limit), self.clock.now()
            )

    async def task(self, task_id: int) -> TaskRecord:
        check_count(task_id, "a task id", minimum=0)
        async with self.store.transaction() as tx:
            task = await tx.task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            [task] = await _ended_if_dead(tx, [task], self.clock.now())
            return task

    async def finish_task(
        self, task_id: int, status: str, error: str | None = None, by: str | None = None
    ) -> TaskRecord:
        """Mark a running task completed, cancelled (``by`` whom) or failed (a finished one
        stays as it is)."""
        check_count(task_id, "a task id", minimum=0)
        check_text(by, "an operator's name")
        async with self.store.transaction() as tx:
            task = await tx.task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            if task.status == "running":
                await tx.update_task(task_id, task.done, status, error, self.clock.now(), by)
            return await tx.task(task_id)  # type: ignore[return-value]

    async def task_step(
        self, task_id: int, address: str, where: MessageFilter, after_seq: int, limit: int
    ) -> list[int]:
        """Run the next chunk of a task: move (resubmit) or drop (purge) up to ``limit``
        matching messages after ``after_seq``, and record the progress in the same
        transaction. Returns the sequence numbers handled; none once the task is cancelled
        or nothing is left."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            task = await tx.task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            if task.status != "running":
                return []
            source = await self._housekept(tx, address)
            seqs = await tx.select(source.entity.id, where, after_seq, limit)
            if not seqs:
                return []
            if task.kind == "resubmit":
                to = task.spec.get("to")
                target = (
                    await self.resolver.main(tx, to)
                    if to
                    else await self.resolver.resolve(tx, source.queue.name)
                )
                if not target.entity.status.can_send:
                    raise EntityDisabledError(target.entity.name, target.entity.status, "resubmit")
                ttl = target.options.default_message_ttl
                expires_at = None if ttl is None else now + ttl
                done = await tx.resubmit(source.entity.id, seqs, target.entity.id, now, expires_at)
            else:
                done = await tx.drop(source.entity.id, seqs)
            await tx.update_task(task_id, task.done + done, "running", None, now)
            return seqs

    async def _housekept(self, tx: Transaction, address: str) -> Target:
        """``address`` resolved, its expired locks counted first: a message whose lock ran
        out is back where it was held (a dead letter received and never settled is a dead
        letter again), and so among what a task selects."""
        target = await self.resolver.resolve(tx, address)
        await self.poisoner.housekeep(tx, target, self.clock.now())
        return target


QUIET = 60.0  # seconds a running task may go without progress before it counts as dead
DIED = (
    f"no progress for {QUIET:.0f} s: the process running it stopped (a server or a command"
    " killed or restarted); what it moved stays moved, and a new task takes the rest"
)


async def _ended_if_dead(tx: Transaction, tasks: list[TaskRecord], now: float) -> list[TaskRecord]:
    """``tasks``, each one marked running whose process died ended as ``failed`` (saying
    so) in this transaction: otherwise it would show running for ever, its page following
    a count that never moves, and tell whoever starts another task to wait for it."""
    ended = []
    for task in tasks:
        if task.status == "running" and not _alive(task, now):
            await tx.update_task(task.id, task.done, "failed", DIED, now)
            task = await tx.task(task.id) or task
        ended.append(task)
    return ended


def _alive(task: TaskRecord, now: float) -> bool:
    """Whether a task marked running is still worked on: it records progress every chunk (a
    resubmit paced to ``rate`` takes at least ``1 / rate`` seconds a chunk); one whose
    process died stays marked running, and must not hold its queue for ever."""
    rate = task.spec.get("rate")
    pause = 1.0 / rate if isinstance(rate, int | float) and rate > 0 else 0.0
    return now - task.updated_at <= QUIET + 3 * pause
