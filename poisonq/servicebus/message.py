"""Messages as azure-servicebus 7 shapes them, and their conversion to and from poisonq's.

:class:`ServiceBusMessage` becomes a :class:`poisonq.Message` when it is sent
(:func:`to_native`); a :class:`poisonq.ReceivedMessage` is shown as a
:class:`ServiceBusReceivedMessage` with the SDK's field names. Where the two differ, the SDK's
convention wins on this side:

- ``body`` is an iterator over the body's one ``bytes`` section (the SDK's DATA body);
  ``str(message)`` is the body as text.
- ``application_properties`` of a received message has ``bytes`` keys, and ``bytes`` for
  text values, as the SDK's received messages have; ``None`` when there are none.
- ``delivery_count`` of a received message counts the deliveries before this one (AMQP's
  header, 0 on a first receive); poisonq's own count, 1 on a first receive, is
  ``message.raw.delivery_count``.

No I/O here: the asyncio flavour shares this module.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from poisonq.model import EntityKind, Message, MessageState, PropertyValue, ReceivedMessage
from poisonq.reports import QueueInfo
from poisonq.servicebus.constants import ServiceBusMessageState
from poisonq.servicebus.exceptions import (
    FeatureNotSupportedError,
    MessageAlreadySettled,
    MessageSizeExceededError,
    ServiceBusError,
)

Body = str | bytes | bytearray | memoryview | None
STATES = {
    MessageState.DEFERRED: ServiceBusMessageState.DEFERRED,
    MessageState.SCHEDULED: ServiceBusMessageState.SCHEDULED,
}


def utc(value: datetime.datetime | None) -> datetime.datetime | None:
    """The SDK takes a naive datetime as UTC (``datetime.utcnow()`` in its samples)."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=datetime.UTC)
    return value


def _body_bytes(body: Body) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"a message body is str or bytes, not {type(body).__name__}")


def _property(key: object, value: object) -> tuple[str, PropertyValue]:
    """One application property as poisonq keeps it: text keys, and text for bytes."""
    name = key.decode() if isinstance(key, bytes) else key
    if not isinstance(name, str):
        raise TypeError(f"application property names are str or bytes, not {key!r}")
    if isinstance(value, bytes):
        value = value.decode()
    if value is not None and not isinstance(value, str | int | float | bool):
        raise TypeError(
            f"application property {name!r} must be str, bytes, int, float, bool or None,"
            f" not {type(value).__name__}"
        )
    return name, value


class ServiceBusMessage:
    """A message to send, as the SDK builds it (``ServiceBusMessage("text", subject=...)``)."""

    def __init__(
        self,
        body: Body,
        *,
        application_properties: Mapping[str | bytes, Any] | None = None,
        session_id: str | None = None,
        message_id: str | None = None,
        scheduled_enqueue_time_utc: datetime.datetime | None = None,
        time_to_live: datetime.timedelta | float | None = None,
        content_type: str | None = None,
        correlation_id: str | None = None,
        subject: str | None = None,
        partition_key: str | None = None,
        to: str | None = None,
        reply_to: str | None = None,
        reply_to_session_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if "raw_amqp_message" in kwargs or "message" in kwargs:
            raise FeatureNotSupportedError("AMQP annotated messages", "send ServiceBusMessage")
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        self._body = _body_bytes(body)
        self.application_properties: dict[Any, Any] | None = (
            None if application_properties is None else dict(application_properties)
        )
        self.session_id = session_id
        self.message_id = message_id
        self.scheduled_enqueue_time_utc = scheduled_enqueue_time_utc
        self.time_to_live = time_to_live
        self.content_type = content_type
        self.correlation_id = correlation_id
        self.subject = subject
        self.partition_key = partition_key
        self.to = to
        self.reply_to = reply_to
        self.reply_to_session_id = reply_to_session_id

    @property
    def body(self) -> Iterator[bytes]:
        """The body's data sections (one), as the SDK's DATA body."""
        return iter((self._body,))

    @property
    def raw_amqp_message(self) -> Any:
        raise FeatureNotSupportedError("AMQP annotated messages (raw_amqp_message)")

    def __str__(self) -> str:
        return self._body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(body={self._body[:64]!r}, message_id={self.message_id!r})"


def to_native(message: object) -> Message:
    """The poisonq message to send for an SDK message (or a dict of its keyword arguments,
    which the SDK's senders also take). A received message is sent as a new one with its
    fields, as the SDK sends it."""
    if isinstance(message, Mapping):
        message = ServiceBusMessage(**message)
    if not isinstance(message, ServiceBusMessage):
        if type(message).__name__ == "AmqpAnnotatedMessage":
            raise FeatureNotSupportedError("AMQP annotated messages", "send ServiceBusMessage")
        raise TypeError(f"send ServiceBusMessage objects, not {type(message).__name__}")
    properties = dict(
        _property(key, value) for key, value in (message.application_properties or {}).items()
    )
    native = Message(
        body=message._body,
        content_type=message.content_type,
        subject=message.subject,
        properties=properties,
        session_id=message.session_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        time_to_live=message.time_to_live,
        scheduled_enqueue_time=utc(message.scheduled_enqueue_time_utc),
        to=message.to,
        reply_to_session_id=message.reply_to_session_id,
        partition_key=message.partition_key,
    )
    if message.message_id is not None:
        native.message_id = message.message_id
    return native


def native_batch(messages: object) -> list[Message]:
    """What a sender was given (a message, a list of them or a batch) as poisonq messages."""
    if isinstance(messages, ServiceBusMessageBatch):
        return list(messages._messages)
    if isinstance(messages, ServiceBusMessage | Mapping):
        return [to_native(messages)]
    if isinstance(messages, Iterable) and not isinstance(messages, str | bytes):
        return [to_native(message) for message in messages]
    raise TypeError(f"send a ServiceBusMessage, a list of them or a batch, not {messages!r}")


SESSION_ID_NOT_SET = (
    "The SessionId was not set on a message, and it cannot be sent to the entity. Entities"
    " that have session support enabled can only receive messages that have the SessionId set."
)


def without_session_id(messages: list[Message]) -> bool:
    """Whether a send has a message without a session id: only then does the sender look
    whether its entity requires sessions (once: that cannot change)."""
    return any(message.session_id is None for message in messages)


def check_session_ids(messages: list[Message], info: QueueInfo) -> None:
    """Service Bus refuses a send to a session-enabled queue of a message without a session
    id, with its ``ServiceBusError``, and sends nothing; poisonq's own sender takes it and
    dead-letters it (``SessionIdIsNull``), which a port would only find in the dead-letter
    queue. A topic fans out as poisonq's does."""
    requires_session = info.kind is EntityKind.QUEUE and info.options.requires_session
    if requires_session and without_session_id(messages):
        raise ServiceBusError(SESSION_ID_NOT_SET)


def size_of(message: Message) -> int:
    """What a message counts against a batch's ``max_size_in_bytes``: its body, properties
    and text fields, as poisonq sizes a message against ``max_message_size``."""
    body = message.body if isinstance(message.body, bytes) else message.body.encode()
    properties = json.dumps(message.properties, separators=(",", ":")) if message.properties else ""
    texts = (
        message.content_type,
        message.subject,
        message.correlation_id,
        message.reply_to,
        message.session_id,
        message.to,
        message.reply_to_session_id,
        message.partition_key,
    )
    return len(body) + len(properties.encode()) + sum(len(t.encode()) for t in texts if t)


class ServiceBusMessageBatch:
    """Messages sent together (one transaction), refused past ``max_size_in_bytes``:
    :meth:`add_message` raises :class:`MessageSizeExceededError` (a ``ValueError``) for the
    message that does not fit, and the batch stays as it was."""

    def __init__(self, max_size_in_bytes: int) -> None:
        self._max_size_in_bytes = max_size_in_bytes
        self._size = 0
        self._messages: list[Message] = []

    @property
    def max_size_in_bytes(self) -> int:
        return self._max_size_in_bytes

    @property
    def size_in_bytes(self) -> int:
        return self._size

    def add_message(self, message: ServiceBusMessage | Mapping[str, Any]) -> None:
        native = to_native(message)
        size = size_of(native)
        if self._size + size > self._max_size_in_bytes:
            raise MessageSizeExceededError(
                message=f"ServiceBusMessageBatch has reached its size limit:"
                f" {self._max_size_in_bytes} bytes (a message of {size} bytes would make"
                f" it {self._size + size})"
            )
        self._messages.append(native)
        self._size += size

    def __len__(self) -> int:
        return len(self._messages)

    def __repr__(self) -> str:
        return (
            f"ServiceBusMessageBatch(max_size_in_bytes={self._max_size_in_bytes},"
            f" message_count={len(self._messages)})"
        )


class ServiceBusReceivedMessage(ServiceBusMessage):
    """A received (or peeked) message with the SDK's field names; ``raw`` is poisonq's
    :class:`~poisonq.ReceivedMessage` (with its failure history, ``raw.failures``).

    Settle it through a receiver of the entity that it was received from (``source``, the
    receiver's address: ``receiver.complete_message(msg)``).
    """

    def __init__(
        self,
        raw: ReceivedMessage,
        source: str | None = None,
        *,
        peeked: bool = False,
        settled: bool = False,
    ) -> None:
        self.raw = raw
        if settled:  # received and deleted: settled as it was handed out
            raw.settled = True
        self._source = source
        self._is_peeked_message = peeked
        self.auto_renew_error: BaseException | None = None
        self._body = raw.body
        self.message_id = raw.message_id
        self.session_id = raw.session_id
        self.content_type = raw.content_type
        self.correlation_id = raw.correlation_id
        self.subject = raw.subject
        self.reply_to = raw.reply_to
        self.scheduled_enqueue_time_utc = raw.scheduled_enqueue_time
        self.to = raw.to
        self.reply_to_session_id = raw.reply_to_session_id
        self.partition_key = raw.partition_key
        start = raw.scheduled_enqueue_time or raw.enqueued_time
        self.time_to_live = None if raw.expires_at is None else raw.expires_at - start
        self.application_properties = {
            key.encode(): value.encode() if isinstance(value, str) else value
            for key, value in raw.properties.items()
        } or None

    @property
    def _settled(self) -> bool:
        """The SDK's mark of a settled message: the native message's, which poisonq's
        receiver sets as it settles it (through this API or the native one), so that a
        second settlement is refused the same way by both."""
        return self.raw.settled

    @property
    def sequence_number(self) -> int:
        return self.raw.sequence_number

    @property
    def enqueued_sequence_number(self) -> int:
        return self.raw.sequence_number

    @property
    def enqueued_time_utc(self) -> datetime.datetime:
        return self.raw.enqueued_time

    @property
    def expires_at_utc(self) -> datetime.datetime | None:
        return self.raw.expires_at

    @property
    def lock_token(self) -> str | None:
        return self.raw.lock_token

    @property
    def locked_until_utc(self) -> datetime.datetime | None:
        return self.raw.locked_until

    @property
    def delivery_count(self) -> int:
        """Deliveries before this one (AMQP's count, as the SDK gives it): 0 on a first
        receive; for a peeked message, every delivery so far."""
        count = self.raw.delivery_count
        return count if self._is_peeked_message else max(count - 1, 0)

    @property
    def dead_letter_reason(self) -> str | None:
        return self.raw.dead_letter_reason

    @property
    def dead_letter_error_description(self) -> str | None:
        return self.raw.dead_letter_error_description

    @property
    def dead_letter_source(self) -> str | None:
        return self.raw.dead_letter_source

    @property
    def state(self) -> ServiceBusMessageState:
        return STATES.get(self.raw.state, ServiceBusMessageState.ACTIVE)

    def __repr__(self) -> str:
        return (
            f"ServiceBusReceivedMessage(sequence_number={self.sequence_number},"
            f" message_id={self.message_id!r}, delivery_count={self.delivery_count},"
            f" body={self._body[:64]!r})"
        )


def check_settleable(message: object, action: str, delete_mode: bool, address: str | None) -> None:
    """The SDK's checks before a settlement, in its order: only a message received in
    peek-lock mode, not settled already, by a receiver open (on ``address``), can be
    settled; and poisonq's: only through a receiver of the entity it was received from (the
    store would find no such lock there, which reads as a lock lost)."""
    if not isinstance(message, ServiceBusReceivedMessage):
        raise TypeError(f"{action} takes a ServiceBusReceivedMessage, not {message!r}")
    if message._is_peeked_message:
        raise ValueError(
            f"The operation {action} is not supported for peeked messages. Only messages"
            " received using receive methods in PEEK_LOCK mode can be settled."
        )
    if delete_mode:
        raise ValueError(f"The operation {action} is not supported in 'RECEIVE_AND_DELETE' mode.")
    if message._settled:
        raise MessageAlreadySettled(action=action)
    if address is None:
        raise ValueError(
            f"Failed to {action} the message as the handler has already been shutdown."
            " Please use ServiceBusClient to create a new instance."
        )
    if message._source is not None and message._source != address:
        raise ValueError(
            f"Unable to {action} message {message.sequence_number}: it was received from"
            f" {message._source!r}; settle it through a receiver of {message._source!r},"
            f" not of {address!r}."
        )
