"""What every part of the engine shares: resolving an address to its entity and options, the
status events, and small argument checks.

An entity's options are kept by the store as JSON text it never reads. The engine writes
there the :class:`QueueOptions` plus what kind of entity it is (queue, topic, subscription)
and a subscription's filter, and parses them back here, cached by their text.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

from poisonq.clock import Clock
from poisonq.errors import (
    EntityDisabledError,
    EntityNotFoundError,
    InvalidOperationError,
    InvalidOptionError,
    MessageLockLostError,
    PoisonMessageError,
)
from poisonq.filters import Filter, filter_from_json
from poisonq.model import (
    LIVE_STATES,
    EntityKind,
    EntityStatus,
    FailureRecord,
    MessageState,
    StatusEventKind,
    SubQueue,
    from_timestamp,
)
from poisonq.names import NAMESPACE_DEADLETTER, Address, parse_address, subqueue_name
from poisonq.options import QueueOptions, RetryPolicy
from poisonq.reports import QueueInfo, StatusEvent
from poisonq.store.base import EntityRecord, Store, Transaction

MAX_HOPS = 4  # Service Bus: a message may be forwarded at most 4 times
Lock = tuple[int, str]  # (sequence number, lock token)


@dataclass(frozen=True, slots=True)
class Spec:
    """What an entity's options text holds, parsed."""

    kind: EntityKind
    options: QueueOptions
    filter: Filter
    dead_letter_on_filter_exceptions: bool

    def to_text(self) -> str:
        data: dict[str, Any] = self.options.to_json()
        data["kind"] = self.kind.value
        if self.kind is EntityKind.SUBSCRIPTION:
            data["filter"] = self.filter.to_json()
            data["dead_letter_on_filter_exceptions"] = self.dead_letter_on_filter_exceptions
        return json.dumps(data)

    @classmethod
    def from_text(cls, text: str) -> Spec:
        data: dict[str, Any] = json.loads(text)
        kind = EntityKind(data.pop("kind", EntityKind.QUEUE))
        rule = filter_from_json(data.pop("filter", {}))
        on_error = bool(data.pop("dead_letter_on_filter_exceptions", False))
        return cls(kind, QueueOptions.from_json(data), rule, on_error)


@dataclass(frozen=True, slots=True)
class Target:
    """A resolved address: the entity addressed and the queue whose options govern it."""

    entity: EntityRecord
    queue: EntityRecord
    spec: Spec

    @property
    def options(self) -> QueueOptions:
        return self.spec.options

    @property
    def kind(self) -> EntityKind:
        return self.spec.kind

    @property
    def subqueue(self) -> SubQueue | None:
        return self.entity.subqueue

    @property
    def ready(self) -> MessageState:
        """The state a receivable message has here."""
        if self.subqueue is SubQueue.DEADLETTER or self.subqueue is SubQueue.TRANSFER_DEADLETTER:
            return MessageState.DEAD_LETTERED
        return MessageState.ACTIVE

    @property
    def policy(self) -> RetryPolicy | None:
        """The retry policy that applies to failed deliveries here: the queue's own, the one
        it sets for reading its dead-letter queue, or none (a message is never poisoned in
        the retry or transfer dead-letter subqueues, nor in the namespace dead-letter queue)."""
        if self.entity.name == NAMESPACE_DEADLETTER:
            return None
        if self.subqueue is None:
            return self.options.retry
        if self.subqueue is SubQueue.DEADLETTER:
            return self.options.dead_letter_retry
        return None

    @property
    def sessions(self) -> bool:
        """Whether receiving here goes through session locks (the main entity only)."""
        return self.options.requires_session and self.subqueue is None


def lock_expired(now: float) -> FailureRecord:
    return FailureRecord(time=now, error_type="LockExpired", message="the lock expired")


class EngineBase:
    """Resolution of addresses and the checks every operation shares."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        store.history.clock = clock  # the history's buckets on the messages' time
        self._specs: dict[str, Spec] = {}

    def _spec(self, queue: EntityRecord) -> Spec:
        """Parsed options, cached by their JSON text (parsing validates, which is not free)."""
        spec = self._specs.get(queue.options)
        if spec is None:
            spec = Spec.from_text(queue.options)
            self._specs[queue.options] = spec
        return spec

    def _resolve(
        self, tx: Transaction, address: str, subqueue: SubQueue | str | None = None
    ) -> Target:
        parsed = parse_address(address, subqueue)
        entity = tx.entity(str(parsed))
        if entity is None:
            raise self._missing(tx, parsed)
        queue = entity if entity.parent_id is None else tx.entity_by_id(entity.parent_id)
        return Target(entity, queue, self._spec(queue))

    @staticmethod
    def _missing(tx: Transaction, address: Address) -> EntityNotFoundError:
        """The error for an address that names nothing. Every queue has its subqueues, so
        what is missing is the queue: it is named as the user wrote it (``ordres`` for
        ``ordres;poison``), with the queues whose names are closest."""
        names = [e.name for e in tx.entities() if e.parent_id is None]
        if address.entity in names:
            return EntityNotFoundError(str(address))
        return EntityNotFoundError(address.entity, get_close_matches(address.entity, names))

    def _child(self, tx: Transaction, target: Target, subqueue: SubQueue) -> EntityRecord:
        child = tx.entity(subqueue_name(target.queue.name, subqueue))
        assert child is not None, "every queue is created with its subqueues"
        return child

    def _main(self, tx: Transaction, name: str) -> Target:
        target = self._resolve(tx, name)
        if target.subqueue is not None:
            raise InvalidOperationError(f"{target.entity.name!r} is a subqueue, not a queue")
        return target

    def _check_receivable(self, target: Target) -> None:
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

    def _disable_receive(self, tx: Transaction, target: Target, event: StatusEvent) -> None:
        """Turn the entity ``receive_disabled`` with ``event`` as its cause; an entity that
        is already disabled keeps its first cause (the one the operator must act on). The
        status is read again: an earlier step of this transaction may have changed it."""
        if tx.entity_by_id(target.entity.id).status.can_receive:
            status = EntityStatus.RECEIVE_DISABLED
            tx.set_status(target.entity.id, status, event.to_text(), event.time)

    def _counts(self, tx: Transaction, target: Target) -> dict[str, int]:
        """Held messages by state, as a receive would find them: a lock that ran out is
        not counted as locked but as ready again (the next receive counts the abandon)."""
        entity = target.entity
        held = tx.held_counts(entity.id, target.ready, entity.ledger.held)
        counts = {state.value: held.get(state, 0) for state in LIVE_STATES}
        if target.subqueue is None and entity.name != NAMESPACE_DEADLETTER:
            counts["dead_lettered"] = self._child(tx, target, SubQueue.DEADLETTER).ledger.held
        else:
            counts["dead_lettered"] = held.get(MessageState.DEAD_LETTERED, 0)
        counts["completed"] = target.entity.ledger.completed
        counts["dropped"] = target.entity.ledger.dropped
        if counts[MessageState.LOCKED.value]:
            expired = tx.expired_lock_count(target.entity.id, self.clock.now())
            counts[MessageState.LOCKED.value] -= expired
            counts[target.ready.value] += expired
        return counts

    def _info(self, tx: Transaction, target: Target) -> QueueInfo:
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
            counts=self._counts(tx, target),
            ledger=entity.ledger,
            created_at=from_timestamp(entity.created_at),  # type: ignore[arg-type]
            updated_at=from_timestamp(entity.updated_at),  # type: ignore[arg-type]
            kind=kind,
            event=event,
            filter=rule,
        )


MAX_INT = 2**63 - 1
"""The largest count or number the stores keep (a 64-bit integer)."""


def check_count(value: object, what: str, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT:
        raise InvalidOptionError(
            f"{what} must be an integer from {minimum} to 2**63-1, not {value!r}"
        )


def check_text(value: object, what: str) -> None:
    """Text a caller gives the store to keep (or None): a ``str`` without NUL, which
    PostgreSQL cannot keep. SQLite could; both refuse it, so the two stores agree."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidOptionError(f"{what} must be text, not {value!r}")
    if "\x00" in value:
        raise InvalidOptionError(f"{what} cannot contain NUL characters: {value!r}")


def check_sequence_numbers(values: object) -> list[int]:
    """Sequence numbers as a caller gives them (one or a sequence), checked: integers >= 0."""
    seqs = [values] if isinstance(values, int) else values
    if not isinstance(seqs, Sequence) or isinstance(seqs, str | bytes):
        raise InvalidOptionError(f"give a sequence number or a list of them, not {values!r}")
    for seq in seqs:
        check_count(seq, "a sequence number", minimum=0)
    return list(seqs)


def by_token(locks: Sequence[Lock]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for seq, token in locks:
        check_count(seq, "a sequence number", minimum=0)
        if token is None:
            raise InvalidOperationError(
                f"message {seq} holds no lock (received in receive-and-delete mode or peeked)"
            )
        if not isinstance(token, str):
            raise InvalidOptionError(f"a lock token is text, not {token!r}")
        grouped[token].append(seq)
    return grouped


def all_or_raise(wanted: Sequence[int], got: Sequence[int]) -> None:
    """Raise :class:`MessageLockLostError` for ``wanted`` numbers missing from ``got``; the
    transaction then rolls back, so a batch with one lost lock changes nothing."""
    if len(got) != len(wanted):
        lost = sorted(set(wanted) - set(got))
        raise MessageLockLostError(lost)
