"""Entity administration: queues, topics and their subscriptions, status, counts, audit, and
the operator's way out of a fault."""

from __future__ import annotations

import dataclasses
import logging
from difflib import get_close_matches
from typing import Any

from poisonq.engine.base import EngineBase
from poisonq.engine.resolving import SUBSCRIPTIONS
from poisonq.engine.targets import Spec, Target
from poisonq.errors import (
    EntityExistsError,
    EntityNotFoundError,
    InvalidOperationError,
    InvalidOptionError,
    MessageNotFoundError,
)
from poisonq.filters import Filter, Rule, RuleSet, TrueFilter
from poisonq.limits import check_count
from poisonq.model import (
    DeadLetterReason,
    EntityKind,
    EntityStatus,
    FaultAction,
    MessageState,
    StatusEventKind,
    SubQueue,
)
from poisonq.names import NAMESPACE_DEADLETTER, parse_address, subqueue_name, validate_name
from poisonq.options import QueueOptions
from poisonq.reports import DELETED_ENTITIES, AuditEntry, AuditReport, QueueInfo, StatusEvent
from poisonq.store.base import EntityRecord, Transaction

log = logging.getLogger(__name__)


class Admin(EngineBase):
    async def create_queue(
        self, name: str, options: QueueOptions, kind: EntityKind = EntityKind.QUEUE
    ) -> QueueInfo:
        """Create a queue (or a topic) with its dead-letter, retry and transfer dead-letter
        subqueues."""
        validate_name(name)
        if f"/{SUBSCRIPTIONS}/" in f"/{name}/":
            raise InvalidOptionError(
                f"{name!r}: '{SUBSCRIPTIONS}' is reserved for subscription paths"
            )
        return await self._create(name, Spec(kind, options, TrueFilter(), False))

    async def create_subscription(
        self,
        topic: str,
        name: str,
        options: QueueOptions,
        rule: Filter,
        dead_letter_on_filter_exceptions: bool = False,
    ) -> QueueInfo:
        """Create subscription ``topic/subscriptions/name`` with its own subqueues: it gets a
        copy of every message sent to the topic that ``rule`` matches."""
        validate_name(name)
        if "/" in name:
            raise InvalidOptionError(f"a subscription name has no '/': {name!r}")
        spec = Spec(EntityKind.SUBSCRIPTION, options, rule, dead_letter_on_filter_exceptions)
        return await self._create(f"{topic}/{SUBSCRIPTIONS}/{name}", spec, topic)

    async def _create(self, name: str, spec: Spec, topic: str | None = None) -> QueueInfo:
        """The entity and its subqueues, in one transaction with the checks (a subscription's
        ``topic`` is a topic, in the same transaction, so none is made for a topic that was
        deleted meanwhile)."""
        self._check_forwarding(spec.options, name)
        now = self.clock.now()
        async with self.store.transaction() as tx:
            if (
                topic is not None
                and (await self.resolver.main(tx, topic)).kind is not EntityKind.TOPIC
            ):
                raise InvalidOperationError(f"{topic!r} is not a topic")
            await self._check_destinations(tx, spec.options)
            queue_id = await tx.insert_entity(name, None, None, spec.to_text(), now)
            for sub in SubQueue:
                await tx.insert_entity(subqueue_name(name, sub), queue_id, sub, "{}", now)
            return await self.resolver.info(tx, await self.resolver.resolve(tx, name))

    @staticmethod
    def _check_forwarding(options: QueueOptions, name: str) -> None:
        if name in (options.forward_to, options.forward_dead_lettered_messages_to):
            raise InvalidOptionError(f"{name!r} cannot forward to itself")

    async def _check_destinations(self, tx: Transaction, options: QueueOptions) -> None:
        """A forwarding destination must exist when it is configured (Service Bus), and be
        a queue or a subscription: a message moves, it is not copied to a topic's
        subscriptions."""
        for destination in (options.forward_to, options.forward_dead_lettered_messages_to):
            if destination is None:
                continue
            found = await tx.entity(destination)
            if found is None:
                raise await self.resolver.missing(tx, parse_address(destination))
            if found.parent_id is not None or self.resolver.spec(found).kind is EntityKind.TOPIC:
                raise InvalidOptionError(
                    f"forward to a queue or a subscription, not {destination!r}"
                )

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        """Change options of a queue, topic or subscription; the rest keep their values."""
        async with self.store.transaction() as tx:
            target = await self.resolver.main(tx, name)
            options = QueueOptions.build(target.options, **changes)
            if options.requires_session != target.options.requires_session:
                # As in Service Bus: messages already held were sent for the other mode.
                raise InvalidOptionError("requires_session is fixed when the queue is created")
            self._check_forwarding(options, name)
            await self._check_destinations(tx, options)
            spec = dataclasses.replace(target.spec, options=options)
            await tx.set_options(target.entity.id, spec.to_text(), self.clock.now())
            return await self.resolver.info(tx, await self.resolver.resolve(tx, name))

    async def rules(self, topic: str, name: str) -> list[tuple[str, Rule]]:
        """A subscription's rules by name (its filter is its one rule ``$Default``)."""
        async with self.store.transaction() as tx:
            return list(RuleSet.of((await self._subscription(tx, topic, name)).spec.filter).rules)

    async def change_rule(
        self, topic: str, name: str, rule_name: str, rule: Rule | None, new: bool
    ) -> None:
        """Add rule ``rule_name`` to a subscription (``new``), replace it, or remove it
        (``rule`` None), in one transaction. A new rule with a name the subscription has
        raises :class:`EntityExistsError`; replacing or removing a rule it does not have,
        :class:`EntityNotFoundError`. A subscription left without rules receives nothing."""
        async with self.store.transaction() as tx:
            target = await self._subscription(tx, topic, name)
            rules = dict(RuleSet.of(target.spec.filter).rules)
            path = f"{target.entity.name}/rules/{rule_name}"
            if new and rule_name in rules:
                raise EntityExistsError(path)
            if not new and rule_name not in rules:
                raise EntityNotFoundError(path, get_close_matches(rule_name, rules, 3))
            if rule is None:
                del rules[rule_name]
            else:
                rules[rule_name] = rule
            spec = dataclasses.replace(target.spec, filter=RuleSet(tuple(rules.items())))
            await tx.set_options(target.entity.id, spec.to_text(), self.clock.now())

    async def _subscription(self, tx: Transaction, topic: str, name: str) -> Target:
        target = await self.resolver.main(tx, f"{topic}/{SUBSCRIPTIONS}/{name}")
        if target.kind is not EntityKind.SUBSCRIPTION:
            raise InvalidOperationError(f"{target.entity.name!r} is not a subscription")
        return target

    async def set_status(
        self, address: str, status: EntityStatus, cause: str | None = None
    ) -> None:
        """Set the status; making an entity active also clears its run of rollbacks (an
        operator enabling it after an auto-disable starts the count again)."""
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            await tx.set_status(target.entity.id, EntityStatus(status), cause, self.clock.now())
            if status is EntityStatus.ACTIVE:
                await tx.reset_rollbacks(target.entity.id)

    async def delete_queue(self, name: str) -> None:
        """Delete a queue (or topic, with its subscriptions), its subqueues and messages;
        what their ledgers held stays in the audit (:meth:`audit`). The namespace dead-letter
        queue is the store's own: it is purged, not deleted."""
        if isinstance(name, str) and name.startswith(NAMESPACE_DEADLETTER):  # or a subqueue's
            raise InvalidOperationError(
                f"the namespace dead-letter queue {NAMESPACE_DEADLETTER} cannot be deleted;"
                " purge it instead"
            )
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.main(tx, name)
            if target.kind is EntityKind.TOPIC:
                for sub in await self.resolver.subscriptions(tx, name):
                    await tx.delete_entity(sub.entity.id, now)
            await tx.delete_entity(target.entity.id, now)

    # The reads: each sees what is due on the store's clock applied first (Housekeeper).
    async def get_queue(self, address: str) -> QueueInfo:
        return await self.housekeeper.read(address, self.resolver.info)

    async def list_queues(self) -> list[QueueInfo]:
        """Queues, topics and subscriptions (not their subqueues)."""

        async def read(tx: Transaction) -> list[QueueInfo]:
            return [
                await self.resolver.info(tx, await self.resolver.resolve(tx, e.name))
                for e in await tx.entities()
                if e.parent_id is None and e.subqueue is None
            ]

        return await self.housekeeper.read_all(read)

    async def list_entities(self) -> list[QueueInfo]:
        """Every queue, topic, subscription and subqueue, by name, read in one transaction."""

        async def read(tx: Transaction) -> list[QueueInfo]:
            return [
                await self.resolver.info(tx, await self.resolver.resolve(tx, e.name))
                for e in await tx.entities()
            ]

        return await self.housekeeper.read_all(read)

    async def counts(self, address: str) -> dict[str, int]:
        return await self.housekeeper.read(address, self.resolver.counts)

    async def audit(self) -> AuditReport:
        """Check every entity's ledger against the messages it holds, and every dead-letter
        queue's kept aggregates against a recount."""

        async def read(tx: Transaction) -> AuditReport:
            entries = []
            drifted = await tx.dead_letter_drift()
            rows, deleted = await tx.audit_rows()
            for entity, held in rows:
                ledger = entity.ledger
                entries.append(
                    AuditEntry(
                        name=entity.name,
                        sent=ledger.sent,
                        moved_in=ledger.moved_in,
                        completed=ledger.completed,
                        dropped=ledger.dropped,
                        moved_out=ledger.moved_out,
                        held=held,
                        aggregates_match=entity.id not in drifted,
                    )
                )
            gone = AuditEntry(
                name=DELETED_ENTITIES,
                sent=deleted.sent,
                moved_in=deleted.moved_in,
                completed=deleted.completed,
                dropped=deleted.dropped + deleted.discarded,
                moved_out=deleted.moved_out,
                held=0,
            )
            return AuditReport(entries, gone)

        return await self.housekeeper.read_all(read)

    async def housekeep(self) -> list[str]:
        """Apply what is due on the store's clock everywhere, one transaction per entity
        (``poisonq housekeep``, the server's loop); the names of the entities where
        something was. Every read does as much for what it reads."""
        return await self.housekeeper.run()

    # The operator's way out of a fault ----------------------------------------------------
    async def resolve_poison(
        self, address: str, sequence_number: int, action: FaultAction, enable: bool = True
    ) -> QueueInfo:
        """Act on message ``sequence_number`` of a faulted entity, in one transaction:
        ``move`` it to the dead-letter queue (``MaxDeliveryCountExceeded``), ``drop`` it, or
        ``resubmit`` it (a new sequence number at the back, a fresh delivery count); then,
        with ``enable``, make the entity active again."""
        if action not in ("move", "drop", "resubmit"):
            raise InvalidOptionError(f"action must be move, drop or resubmit, not {action!r}")
        check_count(sequence_number, "a sequence number", minimum=0)
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            entity = target.entity
            found = await tx.message(entity.id, entity.name, sequence_number)
            if found is None or found.state is MessageState.LOCKED:
                raise MessageNotFoundError(entity.name, sequence_number)
            match action:
                case "move":
                    if target.subqueue is not None:
                        raise InvalidOperationError(
                            f"{entity.name!r} is a subqueue; drop or resubmit the message"
                        )
                    reason = DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
                    why = "moved by an operator after a fault"
                    await self.router.dead_letter(
                        tx, target, [sequence_number], reason, why, None, now
                    )
                case "drop":
                    await tx.drop(entity.id, [sequence_number])
                case "resubmit":
                    home = target.queue if target.subqueue is not None else entity
                    ttl = target.options.default_message_ttl
                    expires = None if ttl is None else now + ttl
                    await tx.resubmit(entity.id, [sequence_number], home.id, now, expires)
            left = await self._still_poisoned(tx, entity, sequence_number, now)
            if left:
                why = f"poison message {left[0]} (message {sequence_number} was {action}d)"
                event = StatusEvent(
                    StatusEventKind.FAULT, now, why, sequence_number=left[0], pending=left[1:]
                )
                await tx.set_status(entity.id, EntityStatus.RECEIVE_DISABLED, event.to_text(), now)
            elif enable:
                await tx.set_status(entity.id, EntityStatus.ACTIVE, None, now)
                await tx.reset_rollbacks(entity.id)
            log.warning("%s message %d of %s by an operator", action, sequence_number, entity.name)
            return await self.resolver.info(tx, await self.resolver.resolve(tx, address))

    async def _still_poisoned(
        self, tx: Transaction, entity: EntityRecord, resolved: int, now: float
    ) -> tuple[int, ...]:
        """The poison messages of the entity's fault that wait for the operator after
        ``resolved``: those still held there and not locked."""
        event = StatusEvent.from_text(entity.status_cause, now)
        if event is None or event.kind is not StatusEventKind.FAULT:
            return ()
        named = [s for s in (event.sequence_number, *event.pending) if s not in (None, resolved)]
        held = await tx.messages(entity.id, entity.name, named)
        waiting = {m.sequence_number for m in held if m.state is not MessageState.LOCKED}
        return tuple(seq for seq in named if seq in waiting)
