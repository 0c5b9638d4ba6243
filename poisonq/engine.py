"""Queue semantics: the message state machine of DESIGN.md on top of any store.

Every public method runs exactly one store transaction, so every transition is atomic. The
engine decides *which* guarded transition to run (the retry policy's decision, TTL handling,
dead-letter targets); the store runs it and keeps the ledger. Lazy housekeeping (expired locks,
due scheduled messages, expired TTLs) runs at the start of each receive on that entity, inside
the same transaction, so no message is ever delivered with an expired TTL and an expired lock
always counts as an abandon before the message can be received again.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from poisonq.clock import Clock
from poisonq.errors import (
    EntityDisabledError,
    EntityNotFoundError,
    InvalidOperationError,
    InvalidOptionError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageTooLargeError,
    QuotaExceededError,
    TaskNotFoundError,
)
from poisonq.failures import describe
from poisonq.model import (
    HELD_STATES,
    Abandon,
    Complete,
    DeadLetter,
    DeadLetterReason,
    EntityStatus,
    FailureRecord,
    Lease,
    Message,
    MessageState,
    ReceivedMessage,
    ReceiveErrorHandling,
    Settlement,
    SubQueue,
    from_timestamp,
    to_seconds,
    to_timestamp,
)
from poisonq.names import parse_address, subqueue_name, validate_name
from poisonq.options import MoveToRetry, Poison, QueueOptions, Redeliver
from poisonq.reports import AuditEntry, AuditReport, QueueInfo
from poisonq.store.base import (
    DeadLetterGroup,
    EntityRecord,
    LockInfo,
    MessageFilter,
    NewMessage,
    Store,
    TaskRecord,
    Transaction,
)

log = logging.getLogger(__name__)

MAX_ID_LENGTH = 128
Lock = tuple[int, str]  # (sequence number, lock token)


@dataclass(frozen=True, slots=True)
class Target:
    """A resolved address: the entity addressed and the queue whose options govern it."""

    entity: EntityRecord
    queue: EntityRecord
    options: QueueOptions

    @property
    def subqueue(self) -> SubQueue | None:
        return self.entity.subqueue

    @property
    def ready(self) -> MessageState:
        """The state a receivable message has here."""
        if self.subqueue is SubQueue.DEADLETTER or self.subqueue is SubQueue.TRANSFER_DEADLETTER:
            return MessageState.DEAD_LETTERED
        return MessageState.ACTIVE


def _lock_expired(now: float) -> FailureRecord:
    return FailureRecord(time=now, error_type="LockExpired", message="the lock expired")


class Engine:
    """The state machine. Thread-safe as far as the store is (each call is one transaction)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._options: dict[str, QueueOptions] = {}

    # Resolution ---------------------------------------------------------------------------
    def _queue_options(self, queue: EntityRecord) -> QueueOptions:
        """Parsed options, cached by their JSON text (parsing validates, which is not free)."""
        options = self._options.get(queue.options)
        if options is None:
            options = QueueOptions.from_json(json.loads(queue.options))
            self._options[queue.options] = options
        return options

    def _resolve(
        self, tx: Transaction, address: str, subqueue: SubQueue | str | None = None
    ) -> Target:
        parsed = parse_address(address, subqueue)
        name = subqueue_name(parsed.entity, parsed.subqueue)
        entity = tx.entity(name)
        if entity is None:
            raise EntityNotFoundError(name)
        queue = entity if entity.parent_id is None else tx.entity_by_id(entity.parent_id)
        return Target(entity, queue, self._queue_options(queue))

    def _child(self, tx: Transaction, target: Target, subqueue: SubQueue) -> EntityRecord:
        child = tx.entity(subqueue_name(target.queue.name, subqueue))
        assert child is not None, "every queue is created with its subqueues"
        return child

    # Entities -----------------------------------------------------------------------------
    def create_queue(self, name: str, options: QueueOptions) -> QueueInfo:
        """Create a queue with its dead-letter, retry and transfer dead-letter subqueues."""
        validate_name(name)
        self._check_supported(options)
        now = self.clock.now()
        with self.store.transaction() as tx:
            queue_id = tx.insert_entity(name, None, None, json.dumps(options.to_json()), now)
            for sub in SubQueue:
                tx.insert_entity(subqueue_name(name, sub), queue_id, sub, "{}", now)
            return self._info(tx, self._resolve(tx, name))

    def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        """Change options of a queue; the rest keep their values."""
        with self.store.transaction() as tx:
            target = self._main(tx, name)
            options = QueueOptions.build(target.options, **changes)
            self._check_supported(options)
            tx.set_options(target.entity.id, json.dumps(options.to_json()), self.clock.now())
            return self._info(tx, self._resolve(tx, name))

    def set_status(self, address: str, status: EntityStatus, cause: str | None = None) -> None:
        with self.store.transaction() as tx:
            target = self._resolve(tx, address)
            tx.set_status(target.entity.id, EntityStatus(status), cause, self.clock.now())

    def delete_queue(self, name: str) -> None:
        """Delete a queue, its subqueues and all their messages."""
        with self.store.transaction() as tx:
            tx.delete_entity(self._main(tx, name).entity.id)

    def get_queue(self, address: str) -> QueueInfo:
        with self.store.transaction() as tx:
            return self._info(tx, self._resolve(tx, address))

    def list_queues(self) -> list[QueueInfo]:
        with self.store.transaction() as tx:
            return [
                self._info(tx, self._resolve(tx, e.name))
                for e in tx.entities()
                if e.parent_id is None
            ]

    def counts(self, address: str) -> dict[str, int]:
        with self.store.transaction() as tx:
            return self._counts(tx, self._resolve(tx, address))

    def _main(self, tx: Transaction, name: str) -> Target:
        target = self._resolve(tx, name)
        if target.subqueue is not None:
            raise InvalidOperationError(f"{target.entity.name!r} is a subqueue, not a queue")
        return target

    def _check_supported(self, options: QueueOptions) -> None:
        retry = options.retry
        if retry.max_retry_cycles or retry.receive_error_handling not in (
            ReceiveErrorHandling.MOVE,
            ReceiveErrorHandling.DROP,
        ):
            raise InvalidOptionError(
                "retry cycles and the fault/reject error handling are not available yet; "
                "use max_retry_cycles=0 with receive_error_handling 'move' or 'drop'"
            )
        if (
            options.requires_session
            or options.forward_to
            or options.forward_dead_lettered_messages_to
        ):
            raise InvalidOptionError("sessions and auto-forwarding are not available yet")

    def _counts(self, tx: Transaction, target: Target) -> dict[str, int]:
        held = tx.held_counts(target.entity.id)
        counts = {state.value: held.get(state, 0) for state in HELD_STATES}
        if target.subqueue is None:
            dlq = self._child(tx, target, SubQueue.DEADLETTER)
            counts["dead_lettered"] = sum(tx.held_counts(dlq.id).values())
        else:
            counts["dead_lettered"] = held.get(MessageState.DEAD_LETTERED, 0)
        counts["completed"] = target.entity.ledger.completed
        counts["dropped"] = target.entity.ledger.dropped
        return counts

    def _info(self, tx: Transaction, target: Target) -> QueueInfo:
        entity = target.entity
        return QueueInfo(
            name=entity.name,
            subqueue=entity.subqueue,
            status=entity.status,
            status_cause=entity.status_cause,
            options=target.options,
            counts=self._counts(tx, target),
            ledger=entity.ledger,
            created_at=from_timestamp(entity.created_at),  # type: ignore[arg-type]
            updated_at=from_timestamp(entity.updated_at),  # type: ignore[arg-type]
        )

    # Sending ------------------------------------------------------------------------------
    def send(self, address: str, messages: Sequence[Message]) -> list[int]:
        """Send a batch: all or nothing, durable on return. Returns the new sequence numbers
        (duplicates ignored by duplicate detection get none)."""
        if isinstance(messages, Message):
            messages = [messages]
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._main(tx, address)
            options = target.options
            if not target.entity.status.can_send:
                raise EntityDisabledError(target.entity.name, target.entity.status, "send")
            rows = self._rows(messages, options, now)
            if options.requires_duplicate_detection:
                rows = self._drop_duplicates(tx, target, rows, now)
            total = target.entity.ledger.size_bytes + sum(row.size for row, _ in rows)
            if total > options.max_size:
                raise QuotaExceededError(target.entity.name, total, options.max_size)
            seqs = (
                tx.insert_messages(target.entity.id, [row for row, _ in rows], now) if rows else []
            )
            oversized = [seq for seq, (_, too_big) in zip(seqs, rows, strict=True) if too_big]
            if oversized:
                dlq = self._child(tx, target, SubQueue.DEADLETTER)
                tx.dead_letter(
                    target.entity.id,
                    oversized,
                    dlq.id,
                    DeadLetterReason.HEADER_SIZE_EXCEEDED,
                    f"properties exceed max_properties_size of {options.max_properties_size} bytes",
                    target.entity.name,
                    None,
                    now,
                )
            return seqs

    def _rows(
        self, messages: Sequence[Message], options: QueueOptions, now: float
    ) -> list[tuple[NewMessage, bool]]:
        """Validate and size messages, each with whether its properties are too large."""
        rows: list[tuple[NewMessage, bool]] = []
        for message in messages:
            if not isinstance(message, Message):
                raise InvalidOptionError(f"send takes poisonq.Message objects, not {message!r}")
            row, props_size = _new_row(message, options, now)
            if row.size > options.max_message_size:
                raise MessageTooLargeError(row.message_id, row.size, options.max_message_size)
            rows.append((row, props_size > options.max_properties_size))
        return rows

    def _drop_duplicates(
        self, tx: Transaction, target: Target, rows: list[tuple[NewMessage, bool]], now: float
    ) -> list[tuple[NewMessage, bool]]:
        """Leave out messages whose id was sent inside the window (or earlier in the batch)."""
        entity_id = target.entity.id
        seen = tx.seen_message_ids(entity_id, [row.message_id for row, _ in rows], now)
        fresh: list[tuple[NewMessage, bool]] = []
        for row, too_big in rows:
            if row.message_id not in seen:
                seen.add(row.message_id)
                fresh.append((row, too_big))
        if fresh:
            window = target.options.duplicate_detection_window
            ids = [row.message_id for row, _ in fresh]
            tx.remember_message_ids(entity_id, ids, now + window)
            tx.forget_message_ids(now)
        return fresh

    # Receiving ----------------------------------------------------------------------------
    def receive(
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
        received.
        """
        _check_count(max_messages, "max_messages")
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._resolve(tx, address)
            entity = target.entity
            if complete:
                self._complete(tx, entity, complete, now)
            if settle:
                self._settle(tx, target, settle, now)
            if not entity.status.can_receive:
                raise EntityDisabledError(entity.name, entity.status, "receive")
            self._housekeep(tx, target, now)
            if delete:
                return tx.take_ready(entity.id, entity.name, target.ready, max_messages)
            token = str(uuid.uuid4())
            until = now + (lock_duration or target.options.lock_duration)
            return tx.lock_ready(entity.id, entity.name, target.ready, max_messages, token, until)

    def _housekeep(self, tx: Transaction, target: Target, now: float) -> None:
        """Expired locks count as abandons; due scheduled messages become active; messages
        past their TTL are dead-lettered or dropped before anyone can receive them."""
        entity = target.entity
        expired = tx.expired_locks(entity.id, now)
        if expired:
            self._after_failure(tx, target, expired, _lock_expired(now), lock_expired=True)
        if target.subqueue is not None:
            return  # no TTL or scheduling in subqueues
        tx.promote_scheduled(entity.id, now)
        stale = tx.expired_messages(entity.id, now)
        if not stale:
            return
        if target.options.dead_lettering_on_message_expiration:
            dlq = self._child(tx, target, SubQueue.DEADLETTER)
            tx.dead_letter(
                entity.id,
                stale,
                dlq.id,
                DeadLetterReason.TTL_EXPIRED,
                "the message expired before it was received",
                entity.name,
                None,
                now,
            )
        else:
            tx.drop(entity.id, stale)
            log.info("dropped %d expired message(s) from %s", len(stale), entity.name)

    def _after_failure(
        self,
        tx: Transaction,
        target: Target,
        locks: Sequence[LockInfo],
        failure: FailureRecord | None,
        lock_expired: bool,
    ) -> list[int]:
        """An abandon or a lock expiry: back to active, then the retry policy decides whether
        the message has used all its attempts. Returns the sequence numbers poisoned."""
        entity = target.entity
        seqs = [lock.seq for lock in locks]
        record = failure.to_json() if failure else None
        tx.release(entity.id, seqs, target.ready, record, lock_expired)
        if target.subqueue is not None:
            return []  # a dead-letter queue cannot dead-letter again
        poisoned: dict[ReceiveErrorHandling, list[int]] = defaultdict(list)
        for lock in locks:
            match target.options.retry.decide(lock.delivery_count, lock.move_count):
                case Redeliver():
                    pass
                case Poison(action):
                    poisoned[action].append(lock.seq)
                case MoveToRetry():
                    raise AssertionError("retry cycles are refused at queue creation")
        now = self.clock.now()
        for action, chosen in poisoned.items():
            match action:
                case ReceiveErrorHandling.MOVE:
                    dlq = self._child(tx, target, SubQueue.DEADLETTER)
                    description = describe(failure) if failure else None
                    tx.dead_letter(
                        entity.id,
                        chosen,
                        dlq.id,
                        DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED,
                        description,
                        entity.name,
                        None,
                        now,
                    )
                case ReceiveErrorHandling.DROP:
                    tx.drop(entity.id, chosen)
                    log.warning("dropped poison message(s) %s from %s", chosen, entity.name)
                case _:
                    raise AssertionError(f"{action} is refused at queue creation")
        return sorted(seq for chosen in poisoned.values() for seq in chosen)

    def receive_deferred(
        self, address: str, sequence_numbers: Sequence[int], lock_duration: float | None = None
    ) -> list[ReceivedMessage]:
        """Lock deferred messages by sequence number; a missing one (or one past its time to
        live) raises :class:`MessageNotFoundError` and locks nothing. A deferred message
        that has used every delivery is dead-lettered instead of delivered again."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._resolve(tx, address)
            self._housekeep(tx, target, now)
            token = str(uuid.uuid4())
            until = now + (lock_duration or target.options.lock_duration)
            entity = target.entity
            got = tx.lock_deferred(entity.id, entity.name, sequence_numbers, token, until)
            missing = sorted(set(sequence_numbers) - {m.sequence_number for m in got})
            if missing:
                raise MessageNotFoundError(entity.name, missing[0])
            if target.subqueue is not None:
                return got
            limit = target.options.max_delivery_count
            spent = [m.sequence_number for m in got if m.delivery_count > limit]
            if spent:
                tx.dead_letter(
                    entity.id,
                    spent,
                    self._child(tx, target, SubQueue.DEADLETTER).id,
                    DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED,
                    f"deferred after its last delivery (max_delivery_count {limit})",
                    entity.name,
                    None,
                    now,
                    lock_token=token,
                )
            return [m for m in got if m.delivery_count <= limit]

    def peek(
        self, address: str, from_sequence: int = 0, max_messages: int = 1
    ) -> list[ReceivedMessage]:
        """Held messages from ``from_sequence`` on, without locking or counting a delivery."""
        _check_count(max_messages, "max_messages")
        with self.store.transaction() as tx:
            entity = self._resolve(tx, address).entity
            return tx.peek(entity.id, entity.name, from_sequence, max_messages)

    def sequence_span(self, address: str) -> tuple[int, int, int]:
        """(count, lowest, highest) sequence number held; (0, 0, -1) when empty."""
        with self.store.transaction() as tx:
            return tx.seq_span(self._resolve(tx, address).entity.id)

    def message(self, address: str, sequence_number: int) -> ReceivedMessage:
        with self.store.transaction() as tx:
            entity = self._resolve(tx, address).entity
            found = tx.message(entity.id, entity.name, sequence_number)
            if found is None:
                raise MessageNotFoundError(entity.name, sequence_number)
            return found

    # Settling -----------------------------------------------------------------------------
    def complete(self, address: str, locks: Sequence[Lock]) -> None:
        """locked → completed for every lock, or (a lock lost) nothing at all."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            self._complete(tx, self._resolve(tx, address).entity, locks, now)

    def _complete(
        self, tx: Transaction, entity: EntityRecord, locks: Sequence[Lock], now: float
    ) -> None:
        for token, seqs in _by_token(locks).items():
            _all_or_raise(seqs, tx.complete(entity.id, token, seqs, now))

    def abandon(
        self, address: str, locks: Sequence[Lock], failure: FailureRecord | None
    ) -> list[int]:
        """locked → active (``abort_count += 1``), or poisoned if every attempt is used.
        Returns the sequence numbers that were poisoned."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._resolve(tx, address)
            held = self._held_locks(tx, target, locks, now)
            return self._after_failure(tx, target, held, failure, lock_expired=False)

    def defer(self, address: str, locks: Sequence[Lock]) -> None:
        """locked → deferred: kept until received again by sequence number."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            entity = self._resolve(tx, address).entity
            for token, seqs in _by_token(locks).items():
                if tx.defer(entity.id, token, seqs, now) != len(seqs):
                    _all_or_raise(seqs, [i.seq for i in tx.locked(entity.id, token, seqs, now)])

    def dead_letter(
        self,
        address: str,
        locks: Sequence[Lock],
        reason: str | None,
        description: str | None,
        failure: FailureRecord | None,
    ) -> None:
        """locked → dead-lettered in the queue's dead-letter queue, with reason and description."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._resolve(tx, address)
            if target.subqueue is not None:
                raise InvalidOperationError(
                    f"messages in {target.entity.name!r} cannot be dead-lettered again"
                )
            dlq = self._child(tx, target, SubQueue.DEADLETTER)
            record = failure.to_json() if failure else None
            for token, seqs in _by_token(locks).items():
                moved = tx.dead_letter(
                    target.entity.id,
                    seqs,
                    dlq.id,
                    reason or "DeadLetteredByReceiver",
                    description,
                    target.entity.name,
                    record,
                    now,
                    lock_token=token,
                )
                _all_or_raise(seqs, moved)

    def renew_lock(
        self, address: str, locks: Sequence[Lock], lock_duration: float | None = None
    ) -> float:
        """Move ``locked_until`` on by the lock duration; returns the new time."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._resolve(tx, address)
            until = now + (lock_duration or target.options.lock_duration)
            for token, seqs in _by_token(locks).items():
                if tx.renew(target.entity.id, token, seqs, now, until) != len(seqs):
                    held = tx.locked(target.entity.id, token, seqs, now)
                    _all_or_raise(seqs, [h.seq for h in held])
            return until

    def settle(self, address: str, settlements: Sequence[Settlement]) -> list[int]:
        """Settle many messages, each its own way, in one transaction: complete, abandon
        (with its own failure) or dead-letter (with its own reason). If any lock was lost,
        :class:`MessageLockLostError` names all the lost ones and nothing changes. Returns
        the sequence numbers the retry policy poisoned."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            return self._settle(tx, self._resolve(tx, address), settlements, now)

    def _settle(
        self, tx: Transaction, target: Target, settlements: Sequence[Settlement], now: float
    ) -> list[int]:
        entity = target.entity
        locks = [(s.sequence_number, s.lock_token) for s in settlements]
        held = {lock.seq: lock for lock in self._held_locks(tx, target, locks, now)}
        done = [s for s in settlements if isinstance(s, Complete)]
        if done:
            self._complete(tx, entity, [(s.sequence_number, s.lock_token) for s in done], now)
        poisoned: list[int] = []
        # Dead-letters alike (same lock, reason, description and failure) move in one call.
        letters: dict[tuple[str, str, str | None, FailureRecord | None], list[int]] = {}
        for settlement in settlements:
            match settlement:
                case Complete():
                    continue
                case Abandon(seq, _, failure):
                    poisoned += self._after_failure(tx, target, [held[seq]], failure, False)
                case DeadLetter(seq, token, reason, description, failure):
                    letters.setdefault((token, reason, description, failure), []).append(seq)
        if letters and target.subqueue is not None:
            raise InvalidOperationError(
                f"messages in {entity.name!r} cannot be dead-lettered again"
            )
        for (token, reason, description, failure), seqs in letters.items():
            tx.dead_letter(
                entity.id,
                seqs,
                self._child(tx, target, SubQueue.DEADLETTER).id,
                reason,
                description,
                entity.name,
                failure.to_json() if failure else None,
                now,
                lock_token=token,
            )
        return sorted(poisoned)

    # Leases -------------------------------------------------------------------------------
    def acquire_lease(
        self,
        address: str,
        consumer: str,
        number: int,
        max_messages: int,
        lock_duration: float | None = None,
    ) -> Lease | None:
        """Lease ``number`` of ``consumer``: up to ``max_messages`` messages locked under one
        token. Asking again for a lease that exists returns it with its locks renewed (a
        restarted consumer replays it); a new lease forgets the consumer's older ones, which
        are settled by then. ``None`` when nothing is receivable."""
        validate_name(consumer)
        _check_count(number, "a lease number")
        _check_count(max_messages, "max_messages")
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._resolve(tx, address)
            entity = target.entity
            until = now + (lock_duration or target.options.lock_duration)
            lease = tx.lease(entity.id, entity.name, consumer, number)
            if lease is not None:
                self._renew_lease(tx, entity, lease, now, until)
                return lease
            if not entity.status.can_receive:
                raise EntityDisabledError(entity.name, entity.status, "receive")
            self._housekeep(tx, target, now)
            token = str(uuid.uuid4())
            seqs = tx.lock_ready_seqs(entity.id, target.ready, max_messages, token, until)
            if not seqs:
                return None
            lease = Lease(entity.name, consumer, number, token, len(seqs), seqs[0], seqs[-1], now)
            tx.insert_lease(entity.id, lease)
            tx.delete_leases(entity.id, consumer, before=number)
            return lease

    def lease(self, address: str, consumer: str, number: int | None) -> Lease | None:
        with self.store.transaction() as tx:
            entity = self._resolve(tx, address).entity
            return tx.lease(entity.id, entity.name, consumer, number)

    def lease_sequence_numbers(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> list[int]:
        """The lease's messages in ``[lo, hi]`` that it still holds under a valid lock."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            entity = self._resolve(tx, lease.entity).entity
            return tx.lease_seqs(entity.id, lease.lock_token, *_span(lease, lo, hi), now)

    def lease_rows(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> list[tuple[Any, ...]]:
        """The messages the lease still holds in ``[lo, hi]``, as :data:`LEASE_COLUMNS`."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            entity = self._resolve(tx, lease.entity).entity
            return tx.lease_rows(entity.id, lease.lock_token, *_span(lease, lo, hi), now)

    def renew_lease(self, lease: Lease, lock_duration: float | None = None) -> int:
        """Extend the locks the lease still holds; returns how many."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            target = self._resolve(tx, lease.entity)
            until = now + (lock_duration or target.options.lock_duration)
            return self._renew_lease(tx, target.entity, lease, now, until)

    def _renew_lease(
        self, tx: Transaction, entity: EntityRecord, lease: Lease, now: float, until: float
    ) -> int:
        seqs = _held(tx, entity, lease, now)
        return tx.renew(entity.id, lease.lock_token, seqs, now, until) if seqs else 0

    def complete_lease(self, lease: Lease) -> int:
        """Complete every message the lease still holds (the others were settled apart, or
        their locks ran out and they will be delivered again). Returns how many."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            entity = self._resolve(tx, lease.entity).entity
            seqs = _held(tx, entity, lease, now)
            return len(tx.complete(entity.id, lease.lock_token, seqs, now)) if seqs else 0

    def _held_locks(
        self, tx: Transaction, target: Target, locks: Sequence[Lock], now: float
    ) -> list[LockInfo]:
        held: list[LockInfo] = []
        for token, seqs in _by_token(locks).items():
            valid = tx.locked(target.entity.id, token, seqs, now)
            _all_or_raise(seqs, [v.seq for v in valid])
            held.extend(valid)
        return held

    # Audit --------------------------------------------------------------------------------
    def audit(self) -> AuditReport:
        """Check every entity's ledger against the messages it holds."""
        with self.store.transaction() as tx:
            entries = []
            for entity in tx.entities():
                ledger = entity.ledger
                entries.append(
                    AuditEntry(
                        name=entity.name,
                        sent=ledger.sent,
                        moved_in=ledger.moved_in,
                        completed=ledger.completed,
                        dropped=ledger.dropped,
                        moved_out=ledger.moved_out,
                        held=sum(tx.held_counts(entity.id).values()),
                    )
                )
            return AuditReport(entries)

    # Dead-letter analysis and bulk tasks -------------------------------------------------
    def dead_letter_groups(self, address: str, by: str) -> list[DeadLetterGroup]:
        with self.store.transaction() as tx:
            return tx.dead_letter_groups(self._resolve(tx, address).entity.id, by)

    def start_task(
        self, kind: str, address: str, where: MessageFilter, spec: dict[str, Any]
    ) -> TaskRecord:
        """Record a bulk task over the messages of ``address`` matching ``where``."""
        now = self.clock.now()
        with self.store.transaction() as tx:
            entity = self._resolve(tx, address).entity
            total = tx.count_matching(entity.id, where)
            task_id = tx.insert_task(kind, entity.id, spec, total, now)
            task = tx.task(task_id)
            assert task is not None
            return task

    def task(self, task_id: int) -> TaskRecord:
        with self.store.transaction() as tx:
            task = tx.task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            return task

    def finish_task(self, task_id: int, status: str, error: str | None = None) -> TaskRecord:
        """Mark a running task completed, cancelled or failed (a finished one stays as it is)."""
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
            source = self._resolve(tx, address)
            seqs = tx.select(source.entity.id, where, after_seq, limit)
            if not seqs:
                return []
            if task.kind == "resubmit":
                to = task.spec.get("to")
                target = self._main(tx, to) if to else self._resolve(tx, source.queue.name)
                if not target.entity.status.can_send:
                    raise EntityDisabledError(target.entity.name, target.entity.status, "resubmit")
                ttl = target.options.default_message_ttl
                expires_at = None if ttl is None else now + ttl
                done = tx.resubmit(source.entity.id, seqs, target.entity.id, now, expires_at)
            else:
                done = tx.drop(source.entity.id, seqs)
            tx.update_task(task_id, task.done + done, "running", None, now)
            return seqs


def _check_count(value: object, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidOptionError(f"{what} must be an integer >= 1, not {value!r}")


def _held(tx: Transaction, entity: EntityRecord, lease: Lease, now: float) -> list[int]:
    """The lease's messages still locked under its token."""
    return tx.lease_seqs(entity.id, lease.lock_token, lease.min_sequence, lease.max_sequence, now)


def _span(lease: Lease, lo: int | None, hi: int | None) -> tuple[int, int]:
    return (
        lease.min_sequence if lo is None else max(lo, lease.min_sequence),
        lease.max_sequence if hi is None else min(hi, lease.max_sequence),
    )


def _by_token(locks: Sequence[Lock]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for seq, token in locks:
        if token is None:
            raise InvalidOperationError(
                f"message {seq} holds no lock (received in receive-and-delete mode or peeked)"
            )
        grouped[token].append(seq)
    return grouped


def _all_or_raise(wanted: Sequence[int], got: Sequence[int]) -> None:
    """Raise :class:`MessageLockLostError` for ``wanted`` numbers missing from ``got``; the
    transaction then rolls back, so a batch with one lost lock changes nothing."""
    if len(got) != len(wanted):
        lost = sorted(set(wanted) - set(got))
        raise MessageLockLostError(lost)


def _new_row(message: Message, options: QueueOptions, now: float) -> tuple[NewMessage, int]:
    """Validate a message and turn it into a row; returns the row and its properties' size.

    This runs for every message sent, so the common case (bytes body, no optional fields)
    takes the fewest checks.
    """
    given: object = message.body  # typed bytes | str, but callers may pass anything
    if type(given) is bytes:
        body = given
    elif isinstance(given, str):
        body = given.encode()
    elif isinstance(given, bytearray | memoryview):
        body = bytes(given)
    else:
        raise InvalidOptionError(f"body must be bytes or str, not {type(given).__name__}")
    message_id = message.message_id
    if type(message_id) is not str or not 0 < len(message_id) <= MAX_ID_LENGTH:
        raise InvalidOptionError(f"message_id must be 1-{MAX_ID_LENGTH} characters: {message_id!r}")
    size = len(body)
    props = _properties_json(message.properties)
    props_size = len(props.encode()) if props else 0
    size += props_size
    for value in (
        message.content_type,
        message.subject,
        message.correlation_id,
        message.reply_to,
        message.session_id,
    ):
        if value is not None:
            if not isinstance(value, str):
                raise InvalidOptionError(f"message fields must be strings, not {value!r}")
            size += len(value.encode())
    session_id = message.session_id
    if session_id is not None and not 0 < len(session_id) <= MAX_ID_LENGTH:
        raise InvalidOptionError(f"session_id must be 1-{MAX_ID_LENGTH} characters: {session_id!r}")
    scheduled_at = None
    state = MessageState.ACTIVE
    if message.scheduled_enqueue_time is not None:
        scheduled_at = to_timestamp(message.scheduled_enqueue_time)
        if scheduled_at > now:
            state = MessageState.SCHEDULED
    ttl = options.default_message_ttl
    if message.time_to_live is not None:
        own = to_seconds(message.time_to_live, "time_to_live")
        if own <= 0:
            raise InvalidOptionError("time_to_live must be > 0")
        ttl = own if ttl is None else min(own, ttl)
    expires_at = None if ttl is None else max(now, scheduled_at or now) + ttl
    row = NewMessage(
        message_id,
        body,
        size,
        message.content_type,
        message.subject,
        props,
        session_id,
        message.correlation_id,
        message.reply_to,
        state,
        scheduled_at,
        expires_at,
    )
    return row, props_size


def _properties_json(properties: dict[str, Any]) -> str | None:
    if not isinstance(properties, dict):
        raise InvalidOptionError(f"properties must be a dict, not {type(properties).__name__}")
    if not properties:
        return None
    for key, value in properties.items():
        if not isinstance(key, str) or not key:
            raise InvalidOptionError(f"property names must be non-empty strings, not {key!r}")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise InvalidOptionError(
                f"property {key!r} must be str, int, float, bool or None, "
                f"not {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidOptionError(f"property {key!r} must be a finite number")
    return json.dumps(properties, separators=(",", ":"))
