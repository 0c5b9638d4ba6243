"""Where messages go between entities: dead-lettering (and forwarding what was
dead-lettered), auto-forwarding with its hop limit, and the namespace dead-letter queue.

Every move here runs inside the caller's transaction, so a forwarded message is never seen
in its source and a dead-lettered one is never in two places.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from poisonq.engine.resolving import Resolver
from poisonq.engine.targets import MAX_HOPS, Target
from poisonq.errors import EntityNotFoundError
from poisonq.model import DeadLetterReason, EntityKind, MessageState, SubQueue
from poisonq.names import NAMESPACE_DEADLETTER
from poisonq.options import QueueOptions
from poisonq.store.base import EntityRecord, Letter, Transaction

log = logging.getLogger(__name__)


class Router:
    """Moves between entities inside the caller's transaction."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver

    async def dead_letter(
        self,
        tx: Transaction,
        target: Target,
        seqs: Sequence[int],
        reason: str,
        description: str | None,
        failure: dict[str, object] | None,
        now: float,
        lock_token: str | None = None,
    ) -> list[int]:
        """:meth:`dead_letter_each` of messages that share one reason, description and
        failure."""
        letters = [Letter(seq, reason, description, failure) for seq in seqs]
        return await self.dead_letter_each(tx, target, letters, now, lock_token)

    async def dead_letter_each(
        self,
        tx: Transaction,
        target: Target,
        letters: Sequence[Letter],
        now: float,
        lock_token: str | None = None,
    ) -> list[int]:
        """Held messages of the target → its queue's dead-letter queue, each with its own
        reason, description and failure, in one move; then on to
        ``forward_dead_lettered_messages_to`` if the queue names one. Returns the sequence
        numbers moved (with ``lock_token``, those validly locked under it)."""
        dlq = await self.resolver.child(tx, target, SubQueue.DEADLETTER)
        entity = target.entity
        moved = await tx.dead_letter_each(entity.id, letters, dlq.id, entity.name, now, lock_token)
        destination = target.options.forward_dead_lettered_messages_to
        if moved and destination:
            hops = {
                m.sequence_number: m.hop_count for m in await tx.messages(dlq.id, dlq.name, moved)
            }
            await self.forward(tx, target, dlq, hops, destination, now, strict=False)
        return moved

    async def forward(
        self,
        tx: Transaction,
        source: Target,
        holder: EntityRecord,
        hops: dict[int, int],
        destination: str,
        now: float,
        strict: bool,
    ) -> None:
        """Move messages held by ``holder`` (the source or its dead-letter queue) to
        ``destination``, ``hop_count += 1``, and on if the destination forwards too.

        A message already forwarded :data:`MAX_HOPS` times is dead-lettered with
        ``MaxTransferHopCountExceeded``; a disabled or full destination sends the messages to
        the source's transfer dead-letter queue. A destination that does not exist fails the
        send (``strict``); forwarding a dead-letter, it leaves the message where it is.
        """
        dead_lettered = holder.subqueue is SubQueue.DEADLETTER
        over = [seq for seq, hop in hops.items() if hop >= MAX_HOPS]
        if over:
            description = f"forwarded {MAX_HOPS} times already; not forwarded to {destination}"
            await self.to_transfer_dlq(
                tx, source, holder, over, DeadLetterReason.MAX_TRANSFER_HOP_COUNT_EXCEEDED,
                description, now,
            )  # fmt: skip
        going = {seq: hop for seq, hop in hops.items() if hop < MAX_HOPS}
        if not going:
            return
        dest = await tx.entity(destination)
        if dest is None or dest.parent_id is not None:
            if strict:
                raise EntityNotFoundError(destination)
            log.warning("cannot forward to %s: no such queue", destination)
            return
        dest_target = self.resolver.of(dest)
        problem = await self._cannot_take(dest_target, holder, list(going), tx)
        if problem:
            await self.to_transfer_dlq(
                tx, source, holder, list(going), DeadLetterReason.TRANSFER_FAILED, problem, now
            )
            return
        state = MessageState.ACTIVE if dead_lettered else None
        moved = await tx.move(holder.id, list(going), dest.id, state, None, hop_count=1)
        onward = dest_target.options.forward_to
        if moved and onward:
            await self.forward(
                tx, dest_target, dest, {seq: going[seq] + 1 for seq in moved}, onward, now, strict
            )

    async def _cannot_take(
        self, dest: Target, holder: EntityRecord, seqs: list[int], tx: Transaction
    ) -> str | None:
        """Why ``dest`` cannot take these messages now, or ``None``."""
        entity = dest.entity
        if dest.kind is not EntityKind.QUEUE and dest.kind is not EntityKind.SUBSCRIPTION:
            return f"{entity.name} is a {dest.kind}, not a queue"
        if not entity.status.can_send:
            return f"destination {entity.name} is {entity.status}"
        size = sum(len(m.body) for m in await tx.messages(holder.id, holder.name, seqs))
        if entity.ledger.size_bytes + size > dest.options.max_size:
            return f"destination {entity.name} is full (max_size {dest.options.max_size} bytes)"
        return None

    async def to_transfer_dlq(
        self,
        tx: Transaction,
        source: Target,
        holder: EntityRecord,
        seqs: list[int],
        reason: str,
        description: str,
        now: float,
    ) -> None:
        transfer = await self.resolver.child(tx, source, SubQueue.TRANSFER_DEADLETTER)
        if holder.subqueue is SubQueue.DEADLETTER:
            # Already dead-lettered (with its own reason): it only changes place.
            await tx.move(holder.id, seqs, transfer.id, MessageState.DEAD_LETTERED, None)
            return
        await tx.dead_letter(
            holder.id, seqs, transfer.id, reason, description, holder.name, None, now
        )

    async def namespace_dlq(self, tx: Transaction, now: float) -> EntityRecord:
        """The namespace dead-letter queue, created the first time it is needed."""
        found = await tx.entity(NAMESPACE_DEADLETTER)
        if found is not None:
            return found
        options = json.dumps({**QueueOptions().to_json(), "kind": EntityKind.QUEUE.value})
        entity_id = await tx.insert_entity(
            NAMESPACE_DEADLETTER, None, SubQueue.DEADLETTER, options, now
        )
        return await tx.entity_by_id(entity_id)
