"""What the engine's parts pass between them: a resolved address (:class:`Target`) with its
entity's parsed options (:class:`Spec`), locks, and the small argument checks.

An entity's options are kept by the store as JSON text it never reads. The engine writes
there the :class:`QueueOptions` plus what kind of entity it is (queue, topic, subscription)
and a subscription's filter, and parses them back here, cached by their text.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from poisonq.errors import (
    InvalidOperationError,
    InvalidOptionError,
    MessageLockLostError,
)
from poisonq.filters import Filter, filter_from_json
from poisonq.limits import check_count
from poisonq.model import (
    DEAD_LETTER_QUEUES,
    LOCK_EXPIRED,
    EntityKind,
    FailureRecord,
    MessageState,
    SubQueue,
)
from poisonq.names import NAMESPACE_DEADLETTER
from poisonq.options import QueueOptions, RetryPolicy
from poisonq.store.base import EntityRecord, MessageFilter, Transaction

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
        if holds_dead_letters(self):
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

    def lock_until(self, now: float, lock_duration: float | None) -> float:
        """When a lock taken at ``now`` ends: after ``lock_duration``, else the queue's."""
        return now + (lock_duration or self.options.lock_duration)

    @property
    def sessions(self) -> bool:
        """Whether receiving here goes through session locks (the main entity only)."""
        return self.options.requires_session and self.subqueue is None


def holds_dead_letters(target: Target) -> bool:
    """Whether ``target`` is a dead-letter queue (the store keeps its groups aggregated)."""
    return target.subqueue in DEAD_LETTER_QUEUES


_EVERYTHING = 1 << 62  # a selection without a limit


async def whole_session(tx: Transaction, target: Target, session_id: str) -> list[int]:
    """Every message of a session the entity holds, its locks under the session ended
    (settling one afterwards raises that its lock was lost): what goes when the whole
    session goes (poisoned with a message of it, or ended with an error)."""
    await tx.unlock_session(target.entity.id, session_id, target.ready)
    return await tx.select(target.entity.id, MessageFilter(session_id=session_id), 0, _EVERYTHING)


def lock_expired(now: float) -> FailureRecord:
    """The failure a lock that ran out records. It has a fingerprint of its own: an empty
    one made a second group beside the messages without any, whose link selected all."""
    return FailureRecord(
        time=now, error_type="LockExpired", message="the lock expired", fingerprint=LOCK_EXPIRED
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


def check_failure(failure: object) -> FailureRecord | None:
    """A failure a caller gives to record (or None): a :class:`FailureRecord` whose error type
    and fingerprint, the keys its dead letter is grouped by, are text without NUL (SQLite's
    grouping cut a key at it, merging fingerprints; PostgreSQL cannot keep it). A record
    made from an exception has its NULs spelled out already."""
    if failure is None:
        return None
    if not isinstance(failure, FailureRecord):
        raise InvalidOptionError(f"a failure is a FailureRecord, not {failure!r}")
    check_text(failure.error_type, "a failure's error type")
    check_text(failure.fingerprint, "a failure's fingerprint")
    return failure


def check_sequence_numbers(values: object) -> list[int]:
    """Sequence numbers as a caller gives them (one or a sequence), checked: integers >= 0."""
    seqs = [values] if isinstance(values, int) else values
    if not isinstance(seqs, Sequence) or isinstance(seqs, str | bytes):
        raise InvalidOptionError(f"give a sequence number or a list of them, not {values!r}")
    for seq in seqs:
        check_count(seq, "a sequence number", minimum=0)
    return list(seqs)


def check_lock(seq: object, token: object) -> None:
    """A lock as a caller names it: a sequence number and the text of its lock token."""
    check_count(seq, "a sequence number", minimum=0)
    if token is None:
        raise InvalidOperationError(
            f"message {seq} holds no lock (received in receive-and-delete mode or peeked)"
        )
    if not isinstance(token, str):
        raise InvalidOptionError(f"a lock token is text, not {token!r}")


def by_token(locks: Sequence[Lock]) -> dict[str, list[int]]:
    """The locks' sequence numbers by lock token, each lock checked."""
    grouped: dict[str, list[int]] = defaultdict(list)
    for seq, token in locks:
        check_lock(seq, token)
        grouped[token].append(seq)
    return grouped


def all_or_raise(wanted: Sequence[int], got: Sequence[int]) -> None:
    """Raise :class:`MessageLockLostError` for ``wanted`` numbers missing from ``got``; the
    transaction then rolls back, so a batch with one lost lock changes nothing. A message
    wanted twice (given twice to one call) is found once: not lost."""
    if len(got) != len(wanted):
        lost = sorted(set(wanted) - set(got))
        if lost:
            raise MessageLockLostError(lost)
