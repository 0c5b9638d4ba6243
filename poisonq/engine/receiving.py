"""Receiving: peek-lock and receive-and-delete, deferred messages by sequence number, peek."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from poisonq.engine.settling import Settling
from poisonq.engine.targets import Lock, Target, check_sequence_numbers
from poisonq.errors import InvalidOperationError, MessageNotFoundError
from poisonq.limits import check_count
from poisonq.model import MessageState, ReceivedMessage, Settlement
from poisonq.store.base import MessageFilter, Transaction


class Receiving(Settling):
    async def receive(
        self,
        address: str,
        max_messages: int,
        delete: bool = False,
        lock_duration: float | None = None,
        complete: Sequence[Lock] = (),
        settle: Sequence[Settlement] = (),
    ) -> list[ReceivedMessage]:
        """Lock (or, with ``delete``, remove) up to ``max_messages`` messages, oldest first.

        ``complete`` names locks to complete, and ``settle`` settlements to make (as
        :meth:`settle` does), in the same transaction first, so a consumer loop commits once
        per batch instead of twice; if one of their locks is lost, nothing is settled or
        received. A faulted entity raises :class:`PoisonMessageError`; a
        session-enabled queue is received from through a session (:meth:`accept_session`).
        """
        check_count(max_messages, "max_messages")
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            entity = target.entity
            await self._settle_previous(tx, target, complete, settle, now)
            if target.sessions:
                raise InvalidOperationError(
                    f"{entity.name!r} requires sessions; accept a session to receive from it"
                )
            self.resolver.check_receivable(target)
            if not await self.poisoner.housekeep(tx, target, now):
                return []
            if delete:
                return await tx.take_ready(entity.id, entity.name, target.ready, max_messages)
            token = str(uuid.uuid4())
            until = target.lock_until(now, lock_duration)
            return await tx.lock_ready(
                entity.id, entity.name, target.ready, max_messages, token, until, last=True
            )

    async def receive_deferred(
        self,
        address: str,
        sequence_numbers: int | Sequence[int],
        lock_duration: float | None = None,
    ) -> list[ReceivedMessage]:
        """Lock deferred messages by sequence number; a missing one raises
        :class:`MessageNotFoundError` and locks nothing. A deferred message past its time to
        live is still there (Service Bus never expires one). A deferred message that has
        used every delivery is poisoned (the queue's poison action) instead of delivered
        again."""
        seqs = check_sequence_numbers(sequence_numbers)
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            entity = target.entity
            missing = await self._not_deferred(tx, target, seqs)
            if missing:  # a number that names no deferred message: nothing changes
                raise MessageNotFoundError(entity.name, missing[0])
            await self.poisoner.housekeep(tx, target, now)  # touches no deferred message
            return await self._lock_deferred(tx, target, seqs, lock_duration, now)

    @staticmethod
    async def _not_deferred(tx: Transaction, target: Target, seqs: list[int]) -> list[int]:
        held = await tx.messages(target.entity.id, target.entity.name, seqs)
        deferred = {m.sequence_number for m in held if m.state is MessageState.DEFERRED}
        return sorted(set(seqs) - deferred)

    async def _lock_deferred(
        self,
        tx: Transaction,
        target: Target,
        seqs: list[int],
        lock_duration: float | None,
        now: float,
    ) -> list[ReceivedMessage]:
        entity = target.entity
        token = str(uuid.uuid4())
        until = target.lock_until(now, lock_duration)
        got = await tx.lock_deferred(entity.id, entity.name, seqs, token, until)
        missing = sorted(set(seqs) - {m.sequence_number for m in got})
        if missing:  # taken meanwhile by another receive
            raise MessageNotFoundError(entity.name, missing[0])
        if target.subqueue is not None:
            return got  # a deferred message is poisoned in its queue only
        limit = target.options.retry.total_attempts
        spent = [m.sequence_number for m in got if m.delivery_count > limit]
        if spent:  # not delivered after all
            await tx.release(entity.id, token, min(spent), max(spent), spent, target.ready, now)
            why = f"deferred after its last delivery ({limit} attempts)"
            await self.poisoner.poison(tx, target, spent, why)
        return [m for m in got if m.delivery_count <= limit]

    async def peek(
        self, address: str, from_sequence: int, max_messages: int, where: MessageFilter
    ) -> list[ReceivedMessage]:
        """Held messages from ``from_sequence`` on that match ``where``, without locking or
        counting a delivery, once what is due of the entity is applied.
        A locked message shows when its lock ends but not its lock token: that is its
        receiver's, and whoever holds it can settle the message."""
        check_count(max_messages, "max_messages")
        check_count(from_sequence, "from_sequence", minimum=0)

        async def read(tx: Transaction, target: Target) -> list[ReceivedMessage]:
            entity = target.entity
            return _as_seen(
                await tx.peek(entity.id, entity.name, from_sequence, max_messages, where)
            )

        return await self.housekeeper.read(address, read)

    async def sequence_span(self, address: str) -> tuple[int, int, int]:
        """(count, lowest, highest) sequence number held; (0, 0, -1) when empty."""
        return await self.housekeeper.read(
            address, lambda tx, target: tx.seq_span(target.entity.id)
        )

    async def message(self, address: str, sequence_number: int) -> ReceivedMessage:
        check_count(sequence_number, "a sequence number", minimum=0)

        async def read(tx: Transaction, target: Target) -> ReceivedMessage:
            entity = target.entity
            found = await tx.message(entity.id, entity.name, sequence_number)
            if found is None:
                raise MessageNotFoundError(entity.name, sequence_number)
            return _as_seen([found])[0]

        return await self.housekeeper.read(address, read)


def _as_seen(messages: list[ReceivedMessage]) -> list[ReceivedMessage]:
    """Messages as a reader who does not hold their locks sees them (peek, message detail):
    without the lock token."""
    for message in messages:
        message.lock_token = None
    return messages
