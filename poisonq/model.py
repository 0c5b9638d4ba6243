"""Value types shared by every layer: enums, messages, failure records, durations.

The enums are ``StrEnum`` so their values are what the store writes; the schema constrains the
same values and ``tests/test_schema.py`` proves the two agree.
"""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Literal, TypeAlias

from poisonq.errors import InvalidOptionError

PropertyValue: TypeAlias = str | int | float | bool | None
FaultAction: TypeAlias = Literal["move", "drop", "resubmit"]
"""What an operator does with the message a queue faulted on (``Broker.resolve_poison``)."""
Duration: TypeAlias = int | float | timedelta | str
"""Seconds, a ``timedelta`` or ISO 8601 text (``"PT30S"``): :func:`to_seconds` reads each."""


class MessageState(StrEnum):
    """Where a message is in its life; see docs/design.md, the message state machine."""

    SCHEDULED = "scheduled"
    ACTIVE = "active"
    LOCKED = "locked"
    DEFERRED = "deferred"
    DEAD_LETTERED = "dead_lettered"
    COMPLETED = "completed"
    DROPPED = "dropped"


LIVE_STATES = (
    MessageState.SCHEDULED,
    MessageState.ACTIVE,
    MessageState.LOCKED,
    MessageState.DEFERRED,
)
"""The states of a message still on its way through a queue (not dead-lettered)."""

HELD_STATES = (*LIVE_STATES, MessageState.DEAD_LETTERED)
"""The states of a message the store still holds: what the audit counts as held."""


class DeadLetterReason(StrEnum):
    """The reasons the broker itself dead-letters with (applications may use any text)."""

    MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
    TTL_EXPIRED = "TTLExpiredException"
    HEADER_SIZE_EXCEEDED = "HeaderSizeExceeded"
    SESSION_ID_IS_NULL = "SessionIdIsNull"
    MAX_TRANSFER_HOP_COUNT_EXCEEDED = "MaxTransferHopCountExceeded"
    REJECTED = "Rejected"
    TRANSFER_FAILED = "TransferFailed"
    FILTER_EVALUATION_EXCEPTION = "FilterEvaluationException"
    DEAD_LETTERED_BY_RECEIVER = "DeadLetteredByReceiver"  # a receiver that gave no reason


class ReceiveMode(StrEnum):
    """Peek-lock (at-least-once) or receive-and-delete (at-most-once)."""

    PEEK_LOCK = "peek_lock"
    RECEIVE_AND_DELETE = "receive_and_delete"


class ReceiveErrorHandling(StrEnum):
    """What happens to a message that used all its attempts (WCF ``ReceiveErrorHandling``)."""

    FAULT = "fault"
    DROP = "drop"
    REJECT = "reject"
    MOVE = "move"


class EntityStatus(StrEnum):
    """Whether an entity accepts sends and receives."""

    ACTIVE = "active"
    DISABLED = "disabled"
    SEND_DISABLED = "send_disabled"
    RECEIVE_DISABLED = "receive_disabled"

    @property
    def can_send(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.RECEIVE_DISABLED)

    @property
    def can_receive(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.SEND_DISABLED)


class EntityKind(StrEnum):
    """What an entity is: a queue, a topic (fans out to subscriptions) or a subscription."""

    QUEUE = "queue"
    TOPIC = "topic"
    SUBSCRIPTION = "subscription"


class StatusEventKind(StrEnum):
    """Why an entity's status last changed."""

    FAULT = "fault"
    AUTO_DISABLED = "auto_disabled"
    OPERATOR = "operator"


class SubQueue(StrEnum):
    """The subqueues every queue has."""

    DEADLETTER = "deadletter"
    RETRY = "retry"
    TRANSFER_DEADLETTER = "transfer_deadletter"


DEAD_LETTER_QUEUES = (SubQueue.DEADLETTER, SubQueue.TRANSFER_DEADLETTER)
"""The subqueues that hold dead letters: the store keeps their aggregates (by reason, subject,
fingerprint and hour), so their groups are read in proportion to groups, not messages."""


MAX_DURATION = 100 * 365 * 86400.0
"""The longest duration (100 years): a time to live or a delay is added to a time the store
keeps and gives back as a datetime, so the sum must stay a date (before year 10000)."""
MAX_TIMESTAMP = datetime(9000, 1, 1, tzinfo=UTC).timestamp()
"""The latest time a message may be scheduled for: with :data:`MAX_DURATION` added it is
still a date."""


_ISO_DURATION = re.compile(
    r"P(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)


def iso_duration(text: str) -> timedelta | None:
    """ISO 8601 duration text as Service Bus writes one (``"PT30S"``, ``"P1DT2H"``: days,
    hours, minutes, seconds), or ``None`` if ``text`` is not one. A number of days past what
    a ``timedelta`` holds raises ``OverflowError``."""
    found = _ISO_DURATION.fullmatch(text)
    if found is None or text in ("P", "PT"):
        return None
    return timedelta(**{name: float(n or 0) for name, n in found.groupdict().items()})


def to_seconds(value: Duration, what: str) -> float:
    """Convert a duration given as seconds, a ``timedelta`` or ISO 8601 text
    (:func:`iso_duration`) to seconds, refusing bad values."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            parsed = iso_duration(value) if isinstance(value, str) else float(value)
        except OverflowError:
            parsed = math.inf
        if parsed is None:
            raise InvalidOptionError(
                f"{what} must be seconds, a timedelta or ISO 8601 text (PT30S), not {value!r}"
            )
        seconds = parsed.total_seconds() if isinstance(parsed, timedelta) else parsed
    else:
        raise InvalidOptionError(
            f"{what} must be seconds, a timedelta or ISO 8601 text (PT30S), not {value!r}"
        )
    if not 0 <= seconds <= MAX_DURATION:  # NaN fails both
        raise InvalidOptionError(
            f"{what} must be a duration from 0 to 100 years (in seconds), not {value!r}"
        )
    return seconds


def to_timestamp(value: datetime | float) -> float:
    """Seconds since the epoch for a timezone-aware datetime (or a timestamp already)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidOptionError(f"datetime {value!r} needs a timezone (use datetime.now(UTC))")
        stamp = value.timestamp()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        stamp = float(value)
    else:
        raise InvalidOptionError(f"a time must be a datetime, not {value!r}")
    if not -MAX_TIMESTAMP <= stamp <= MAX_TIMESTAMP:  # NaN fails both
        raise InvalidOptionError(f"a time must be before the year 9000, not {value!r}")
    return stamp


def from_timestamp(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


class _RandomHex:
    """Random hex digits read from ``os.urandom`` a page at a time: one system call per 128
    message ids instead of one each. A child process forgets its parent's page (two
    processes must never hand out the same ids)."""

    PAGE = 4096  # bytes: 128 ids

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        # A new lock too: another thread of the parent may have held it as it forked.
        self._lock = threading.Lock()
        self._digits = ""
        self._at = 0

    def take(self) -> str:
        """32 hex digits never handed out before."""
        with self._lock:
            at = self._at
            if at >= len(self._digits):
                self._digits, at = os.urandom(self.PAGE).hex(), 0
            self._at = at + 32
            return self._digits[at : at + 32]


_random_hex = _RandomHex()
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def new_uuid() -> str:
    """A random (version 4) UUID as text, faster than ``str(uuid.uuid4())`` (see
    docs/speed.md): every message sent without an id needs one."""
    h = _random_hex.take()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


LOCK_EXPIRED = "lock-expired"
"""The fingerprint of the failure a lock that ran out records: one group of them all."""


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """One failed attempt: when, which error, and the fingerprint that groups alike failures."""

    time: float
    error_type: str
    message: str
    traceback: str = ""
    fingerprint: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "time": self.time,
            "error_type": self.error_type,
            "message": self.message,
            "traceback": self.traceback,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> FailureRecord:
        return cls(
            time=float(data["time"]),  # type: ignore[arg-type]
            error_type=str(data["error_type"]),
            message=str(data["message"]),
            traceback=str(data.get("traceback", "")),
            fingerprint=str(data.get("fingerprint", "")),
        )


@dataclass(slots=True)
class Message:
    """A message as the sender builds it. Only ``body`` is required."""

    body: bytes | str = b""
    message_id: str = field(default_factory=new_uuid)
    content_type: str | None = None
    subject: str | None = None
    properties: dict[str, PropertyValue] = field(default_factory=dict)
    session_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    time_to_live: Duration | None = None
    scheduled_enqueue_time: datetime | None = None
    to: str | None = None  # the address it is for: kept, read by no broker rule
    reply_to_session_id: str | None = None
    partition_key: str | None = None  # a partition hint; with a session_id, equal to it


@dataclass(slots=True)
class ReceivedMessage:
    """A message as a receiver or peek sees it, with the broker-set fields.

    ``lock_token`` and ``locked_until`` are set for peek-locked messages and move on with
    :meth:`Receiver.renew_lock`; the rest is a snapshot taken when the message was received.
    """

    sequence_number: int
    entity: str
    message_id: str
    body: bytes
    content_type: str | None
    subject: str | None
    properties: dict[str, PropertyValue]
    session_id: str | None
    correlation_id: str | None
    reply_to: str | None
    state: MessageState
    enqueued_time: datetime
    scheduled_enqueue_time: datetime | None
    expires_at: datetime | None
    delivery_count: int
    abort_count: int
    move_count: int
    resubmit_count: int
    hop_count: int
    lock_token: str | None
    locked_until: datetime | None
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    dead_letter_source: str | None
    failures: list[FailureRecord]
    to: str | None = None
    reply_to_session_id: str | None = None
    partition_key: str | None = None
    # Set by the receiver that settles this message object: an AutoLockRenewer stops then.
    settled: bool = field(default=False, repr=False, compare=False)

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (replacing undecodable bytes)."""
        return self.body.decode("utf-8", errors="replace")

    @property
    def last_lock_expired(self) -> bool:
        """Whether its last delivery ended with its lock running out while nobody settled it
        (a release counts no delivery and records nothing): the holder may have died of it.
        Told by its failure history, whose last entry an expiry always is; an abandon
        without a failure record after it is not told apart (the Processor records one)."""
        return bool(self.failures) and self.failures[-1].fingerprint == LOCK_EXPIRED


@dataclass(frozen=True, slots=True)
class Lease:
    """A numbered batch of messages that one consumer (a Spark query, a pipeline) locked at
    once under one lock token. Durable, so a restarted consumer finds and replays it."""

    entity: str
    consumer: str
    number: int
    lock_token: str
    count: int
    min_sequence: int
    max_sequence: int
    created_at: float
    completed_at: float | None = None  # set by complete_lease, in its transaction


# Settlements of many messages in one transaction, each its own way -----------------------


@dataclass(frozen=True, slots=True)
class Complete:
    sequence_number: int
    lock_token: str


@dataclass(frozen=True, slots=True)
class Abandon:
    sequence_number: int
    lock_token: str
    failure: FailureRecord | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    sequence_number: int
    lock_token: str
    reason: str
    description: str | None = None
    failure: FailureRecord | None = None


@dataclass(frozen=True, slots=True)
class Release:
    """Back to the queue as if never delivered: no delivery counted, no failure recorded.
    For a consumer that found the fault in itself (a defect), not in the message."""

    sequence_number: int
    lock_token: str


Settlement = Complete | Abandon | DeadLetter | Release
