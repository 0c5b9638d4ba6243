"""``ServiceBusSender``: azure-servicebus 7's sender on :class:`poisonq.Sender`."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from poisonq.servicebus.exceptions import translated
from poisonq.servicebus.handler import BrokerSource, Handler
from poisonq.servicebus.message import (
    ServiceBusMessage,
    ServiceBusMessageBatch,
    check_session_ids,
    native_batch,
    utc,
    without_session_id,
)

if TYPE_CHECKING:
    from poisonq.client import Broker
    from poisonq.model import Message
    from poisonq.receivers import Sender
    from poisonq.reports import QueueInfo

Messages = ServiceBusMessage | ServiceBusMessageBatch | Iterable[ServiceBusMessage]


def batch_limit(limit: int, max_size_in_bytes: int | None) -> int:
    """A batch's size limit: ``max_size_in_bytes`` if given, at most the entity's ``limit``
    (its ``max_message_size``, as the SDK's link limits a batch)."""
    if max_size_in_bytes is not None and max_size_in_bytes > limit:
        raise ValueError(
            f"max_size_in_bytes {max_size_in_bytes} is larger than the entity's"
            f" max_message_size of {limit} bytes"
        )
    return max_size_in_bytes or limit


class ServiceBusSender(Handler):
    """Sends to a queue or a topic. Each call is one transaction: a list or a batch is sent
    whole or not at all, and is durable when the call returns. Once closed (or its client
    closed), every call raises the SDK's ``ValueError``."""

    def __init__(self, client: BrokerSource[Broker], entity_name: str) -> None:
        super().__init__()
        self._client = client
        self.entity_name = entity_name
        self._entity: QueueInfo | None = None  # looked up once a message has no session id

    def _native(self) -> Sender:
        self._check_live()
        return self._client.broker().sender(self.entity_name)

    def _batch(self, messages: Messages) -> list[Message]:
        """What is sent, checked as Service Bus checks it (a session queue's messages need
        a session id)."""
        batch = native_batch(messages)
        if self._entity is None and without_session_id(batch):
            self._check_live()
            with translated():
                self._entity = self._client.broker().get_queue(self.entity_name)
        if self._entity is not None:
            check_session_ids(batch, self._entity)
        return batch

    def send_messages(self, message: Messages, **kwargs: Any) -> None:
        """Send a message, a list of them, or a :class:`ServiceBusMessageBatch`."""
        batch = self._batch(message)
        with translated():
            self._native().send(batch)

    def schedule_messages(
        self, messages: Messages, schedule_time_utc: datetime.datetime, **kwargs: Any
    ) -> list[int]:
        """Send messages that become receivable at ``schedule_time_utc`` (a naive datetime
        is UTC); returns their sequence numbers, for :meth:`cancel_scheduled_messages` (on
        a topic, those of every subscription's copy)."""
        batch = self._batch(messages)
        with translated():
            return self._native().schedule(batch, utc(schedule_time_utc))

    def cancel_scheduled_messages(
        self, sequence_numbers: int | Sequence[int], **kwargs: Any
    ) -> None:
        """Cancel scheduled messages not yet due, all or none (a number naming none raises
        :class:`~poisonq.servicebus.exceptions.MessageNotFoundError`)."""
        with translated():
            self._native().cancel_scheduled(sequence_numbers)

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        """An empty batch holding at most ``max_size_in_bytes`` (by default, and at most,
        the entity's ``max_message_size``, as the SDK's link limits a batch)."""
        self._check_live()
        with translated():
            limit = self._client.broker().get_queue(self.entity_name).options.max_message_size
        return ServiceBusMessageBatch(batch_limit(limit, max_size_in_bytes))

    def close(self) -> None:
        """Refuse every call from now on (each call was one transaction of the client's
        broker: nothing else to release)."""
        self._shut_down()

    def __enter__(self) -> ServiceBusSender:
        self._check_live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
