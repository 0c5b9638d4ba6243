"""Resolving an address to its entity and the options that govern it, and what operations
read of a resolved entity: whether it can be received from, its counts, its report.

An entity's options are kept by the store as JSON text it never reads (see
:class:`~poisonq.engine.targets.Spec`); they are parsed here, once per text.
"""

from __future__ import annotations

from difflib import get_close_matches

from poisonq.clock import Clock
from poisonq.engine.targets import Spec, Target
from poisonq.errors import (
    EntityDisabledError,
    EntityNotFoundError,
    InvalidOperationError,
    PoisonMessageError,
)
from poisonq.model import (
    LIVE_STATES,
    EntityKind,
    EntityStatus,
    MessageState,
    StatusEventKind,
    SubQueue,
    from_timestamp,
)
from poisonq.names import NAMESPACE_DEADLETTER, Address, parse_address, subqueue_name
from poisonq.reports import QueueInfo, StatusEvent
from poisonq.store.base import EntityRecord, Transaction

SUBSCRIPTIONS = "subscriptions"
"""The path segment of a topic's subscriptions: ``events/subscriptions/eu``."""


class Resolver:
    """Addresses to entities and the options that govern them (cached by their text), and
    what an operation reads or checks of a resolved entity: whether it can be received
    from, its counts, its report."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._specs: dict[str, Spec] = {}

    def spec(self, queue: EntityRecord) -> Spec:
        """Parsed options, cached by their JSON text (parsing validates, which is not free)."""
        spec = self._specs.get(queue.options)
        if spec is None:
            spec = Spec.from_text(queue.options)
            self._specs[queue.options] = spec
        return spec

    async def resolve(
        self, tx: Transaction, address: str, subqueue: SubQueue | str | None = None
    ) -> Target:
        parsed = parse_address(address, subqueue)
        entity = await tx.entity(str(parsed))
        if entity is None:
            raise await self.missing(tx, parsed)
        queue = entity if entity.parent_id is None else await tx.entity_by_id(entity.parent_id)
        return Target(entity, queue, self.spec(queue))

    def of(self, queue: EntityRecord) -> Target:
        """The target of a queue (or topic) entity itself."""
        return Target(queue, queue, self.spec(queue))

    async def subscriptions(self, tx: Transaction, topic: str) -> list[Target]:
        """The targets of a topic's subscriptions."""
        prefix = f"{topic}/{SUBSCRIPTIONS}/"
        return [
            self.of(e)
            for e in await tx.entities()
            if e.parent_id is None and e.name.startswith(prefix)
        ]

    @staticmethod
    async def missing(tx: Transaction, address: Address) -> EntityNotFoundError:
        """The error for an address that names nothing. Every queue has its subqueues, so
        what is missing is the queue: it is named as the user wrote it (``ordres`` for
        ``ordres;poison``), with the queues whose names are closest."""
        names = [e.name for e in await tx.entities() if e.parent_id is None]
        if address.entity in names:
            return EntityNotFoundError(str(address))
        return EntityNotFoundError(address.entity, get_close_matches(address.entity, names))

    async def child(self, tx: Transaction, target: Target, subqueue: SubQueue) -> EntityRecord:
        """The queue's subqueue. Every queue is created with its subqueues and deleted with
        them, so one missing means that the queue was deleted since this transaction read
        it (PostgreSQL reads each statement's own snapshot): the queue is not found."""
        child = await tx.entity(subqueue_name(target.queue.name, subqueue))
        if child is None:
            raise EntityNotFoundError(target.queue.name)
        return child

    async def main(self, tx: Transaction, name: str) -> Target:
        target = await self.resolve(tx, name)
        if target.subqueue is not None:
            raise InvalidOperationError(f"{target.entity.name!r} is a subqueue, not a queue")
        return target

    @staticmethod
    def check_receivable(target: Target) -> None:
        """Raise if the entity cannot be received from: disabled, faulted on a poison
        message (:class:`PoisonMessageError` with its sequence number), or a topic."""
        entity = target.entity
        if target.kind is EntityKind.TOPIC:
            raise InvalidOperationError(
                f"{entity.name!r} is a topic; receive from one of its subscriptions"
            )
        if entity.status.can_receive:
            return
        event = StatusEvent.from_text(entity.status_cause, entity.updated_at)
        if event is not None and event.kind is StatusEventKind.FAULT:
            assert event.sequence_number is not None
            raise PoisonMessageError(entity.name, event.sequence_number)
        raise EntityDisabledError(entity.name, entity.status, "receive")

    async def disable_receive(self, tx: Transaction, target: Target, event: StatusEvent) -> None:
        """Turn the entity ``receive_disabled`` with ``event`` as its cause; an entity that
        is already disabled keeps its first cause (the one the operator must act on). The
        status is read again: an earlier step of this transaction may have changed it."""
        if (await tx.entity_by_id(target.entity.id)).status.can_receive:
            status = EntityStatus.RECEIVE_DISABLED
            await tx.set_status(target.entity.id, status, event.to_text(), event.time)

    async def counts(self, tx: Transaction, target: Target) -> dict[str, int]:
        """Held messages by state (a reader applies what is due before it counts)."""
        entity = target.entity
        held = await tx.held_counts(entity.id, target.ready, entity.ledger.held)
        counts = {state.value: held.get(state, 0) for state in LIVE_STATES}
        if target.subqueue is None and entity.name != NAMESPACE_DEADLETTER:
            counts["dead_lettered"] = (
                await self.child(tx, target, SubQueue.DEADLETTER)
            ).ledger.held
        else:
            counts["dead_lettered"] = held.get(MessageState.DEAD_LETTERED, 0)
        counts["completed"] = target.entity.ledger.completed
        counts["dropped"] = target.entity.ledger.dropped
        return counts

    async def info(self, tx: Transaction, target: Target) -> QueueInfo:
        entity = target.entity
        event = StatusEvent.from_text(entity.status_cause, entity.updated_at)
        kind = target.kind if target.subqueue is None else EntityKind.QUEUE
        rule = target.spec.filter.to_json() if kind is EntityKind.SUBSCRIPTION else None
        return QueueInfo(
            name=entity.name,
            subqueue=entity.subqueue,
            status=entity.status,
            status_cause=event.description if event else None,
            options=target.options,
            counts=await self.counts(tx, target),
            ledger=entity.ledger,
            created_at=from_timestamp(entity.created_at),  # type: ignore[arg-type]
            updated_at=from_timestamp(entity.updated_at),  # type: ignore[arg-type]
            kind=kind,
            event=event,
            filter=rule,
            dead_letter_on_filter_exceptions=target.spec.dead_letter_on_filter_exceptions,
        )
