"""azure-servicebus 7's ``aio`` ``ServiceBusClient`` on a :class:`poisonq.aio.AsyncBroker`.

The connection string is the store's URL, checked as the sync client checks it
(:mod:`poisonq.servicebus.connection`); the broker is opened on first use and closed by
:meth:`ServiceBusClient.close` (or its ``async with`` block).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from typing import Any

import poisonq.aio
from poisonq.servicebus.aio.lock_renewer import AutoLockRenewer
from poisonq.servicebus.aio.receiver import ServiceBusReceiver
from poisonq.servicebus.aio.sender import ServiceBusSender
from poisonq.servicebus.clients import HandlerFactory
from poisonq.servicebus.connection import check_client_options
from poisonq.servicebus.exceptions import translated
from poisonq.servicebus.message import utc


class ServiceBusClient(HandlerFactory[ServiceBusSender, ServiceBusReceiver, AutoLockRenewer]):
    """Senders and receivers of one store's queues, topics and subscriptions, for asyncio."""

    sender_type = ServiceBusSender
    receiver_type = ServiceBusReceiver
    renewer_type = AutoLockRenewer

    def __init__(
        self, fully_qualified_namespace: str, credential: object = None, **kwargs: Any
    ) -> None:
        super().__init__(fully_qualified_namespace, credential, **kwargs)
        self._broker: poisonq.aio.AsyncBroker | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def from_broker(cls, broker: poisonq.aio.AsyncBroker) -> ServiceBusClient:
        """A client on an async broker already open (poisonq's own): native and SDK-shaped
        calls on one store, one clock. Closing the client leaves it open."""
        client = cls(broker.sync.url)
        client._broker, client._owns_broker = broker, False
        return client

    async def broker(self) -> poisonq.aio.AsyncBroker:
        """The poisonq broker under this client, opened on first use; a store that does not
        exist raises :class:`ServiceBusConnectionError` naming it, as the sync client's."""
        async with self._opening:
            if self._broker is None:
                with translated():
                    self._broker = await poisonq.aio.connect(self._url, create=False, **self._retry)
            return self._broker

    async def close(self) -> None:
        """Close the senders and receivers this client handed out (each refuses every call
        after), then its broker."""
        for handler in list(self._handlers):
            await handler.close()
        async with self._opening:
            if self._broker is not None and self._owns_broker:
                await self._broker.close()
                self._broker = None  # a handler asked for after opens it again, as the SDK's

    async def __aenter__(self) -> ServiceBusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def list_queue_sessions(
        self,
        queue_name: str,
        *,
        state_updated_after: datetime.datetime | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[str]:
        """The ids of the queue's sessions with messages or a stored state (with
        ``state_updated_after``, of those whose state was set after it; a naive time is
        UTC), as an async iterator: ``async for session_id in client.list_queue_sessions(q)``,
        as the SDK's ``AsyncItemPaged``."""
        check_client_options(kwargs, handler=True)
        return self._session_ids(queue_name, utc(state_updated_after))

    def list_subscription_sessions(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> AsyncIterator[str]:
        """:meth:`list_queue_sessions` of a subscription."""
        return self.list_queue_sessions(f"{topic_name}/subscriptions/{subscription_name}", **kwargs)

    async def _session_ids(
        self, path: str, state_updated_after: datetime.datetime | None
    ) -> AsyncIterator[str]:
        broker = await self.broker()
        with translated():
            session_ids = await broker.session_ids(path, state_updated_after=state_updated_after)
        for session_id in session_ids:
            yield session_id
