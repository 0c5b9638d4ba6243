"""azure-servicebus 7's ``aio`` sender on :class:`poisonq.aio.AsyncSender`."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from poisonq.servicebus.exceptions import translated
from poisonq.servicebus.handler import BrokerSource, Handler
from poisonq.servicebus.message import (
    ServiceBusMessageBatch,
    check_session_ids,
    native_batch,
    utc,
    without_session_id,
)
from poisonq.servicebus.sender import Messages, batch_limit

if TYPE_CHECKING:
    from poisonq.aio import AsyncBroker, AsyncSender
    from poisonq.model import Message
    from poisonq.reports import QueueInfo


class ServiceBusSender(Handler):
    """Sends to a queue or a topic; each call is one transaction, durable when it returns.
    Once closed (or its client closed), every call raises the SDK's ``ValueError``."""

    def __init__(self, client: BrokerSource[Awaitable[AsyncBroker]], entity_name: str) -> None:
        super().__init__()
        self._client = client
        self.entity_name = entity_name
        self._entity: QueueInfo | None = None  # looked up once a message has no session id

    async def _native(self) -> AsyncSender:
        self._check_live()
        return (await self._client.broker()).sender(self.entity_name)

    async def _batch(self, messages: Messages) -> list[Message]:
        """What is sent, checked as the sync sender checks it."""
        batch = native_batch(messages)
        if self._entity is None and without_session_id(batch):
            self._check_live()
            with translated():
                self._entity = await (await self._client.broker()).get_queue(self.entity_name)
        if self._entity is not None:
            check_session_ids(batch, self._entity)
        return batch

    async def send_messages(self, message: Messages, **kwargs: Any) -> None:
        """Send a message, a list of them, or a :class:`ServiceBusMessageBatch`."""
        batch = await self._batch(message)
        with translated():
            await (await self._native()).send(batch)

    async def schedule_messages(
        self, messages: Messages, schedule_time_utc: datetime.datetime, **kwargs: Any
    ) -> list[int]:
        batch = await self._batch(messages)
        with translated():
            return await (await self._native()).schedule(batch, utc(schedule_time_utc))

    async def cancel_scheduled_messages(
        self, sequence_numbers: int | Sequence[int], **kwargs: Any
    ) -> None:
        with translated():
            await (await self._native()).cancel_scheduled(sequence_numbers)

    async def create_message_batch(
        self, max_size_in_bytes: int | None = None
    ) -> ServiceBusMessageBatch:
        """An empty batch holding at most ``max_size_in_bytes`` (the entity's
        ``max_message_size`` by default and at most)."""
        self._check_live()
        with translated():
            info = await (await self._client.broker()).get_queue(self.entity_name)
        return ServiceBusMessageBatch(batch_limit(info.options.max_message_size, max_size_in_bytes))

    async def close(self) -> None:
        """Refuse every call from now on (nothing else to release)."""
        self._shut_down()

    async def __aenter__(self) -> ServiceBusSender:
        self._check_live()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
