"""azure-servicebus 7's ``aio`` ``ServiceBusClient`` on a :class:`poisonq.aio.AsyncBroker`.

The connection string is the store's URL, checked as the sync client checks it
(:mod:`poisonq.servicebus.connection`); the broker is opened on first use and closed by
:meth:`ServiceBusClient.close` (or its ``async with`` block).
"""

from __future__ import annotations

import asyncio
import datetime
import weakref
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import poisonq.aio
from poisonq.servicebus.aio.lock_renewer import AutoLockRenewer
from poisonq.servicebus.aio.receiver import ServiceBusReceiver
from poisonq.servicebus.aio.sender import ServiceBusSender
from poisonq.servicebus.connection import check_client_options, store_url
from poisonq.servicebus.constants import ServiceBusReceiveMode, ServiceBusSessionFilter
from poisonq.servicebus.exceptions import FeatureNotSupportedError, translated
from poisonq.servicebus.message import utc

Handed = TypeVar("Handed", ServiceBusSender, ServiceBusReceiver)


class ServiceBusClient:
    """Senders and receivers of one store's queues, topics and subscriptions, for asyncio."""

    def __init__(
        self, fully_qualified_namespace: str, credential: object = None, **kwargs: Any
    ) -> None:
        if credential is not None:
            raise FeatureNotSupportedError(
                "credentials",
                "poisonq has no namespace to authenticate to: use"
                " ServiceBusClient.from_connection_string(STORE_URL)",
            )
        self._url = store_url(fully_qualified_namespace)
        self._retry = check_client_options(kwargs)
        self._broker: poisonq.aio.AsyncBroker | None = None
        self._owns_broker = True
        self._opening = asyncio.Lock()
        # Closed with the client, as the SDK closes its handlers: a session receiver gives
        # its session back then, and none of them reopens the store after.
        self._handlers: weakref.WeakSet[ServiceBusSender | ServiceBusReceiver] = weakref.WeakSet()

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusClient:
        """A client on the store ``conn_str`` names (poisonq's store URL)."""
        return cls(conn_str, **kwargs)

    @classmethod
    def from_broker(cls, broker: poisonq.aio.AsyncBroker) -> ServiceBusClient:
        """A client on an async broker already open (poisonq's own): native and SDK-shaped
        calls on one store, one clock. Closing the client leaves it open."""
        client = cls(broker.sync.url)
        client._broker, client._owns_broker = broker, False
        return client

    @property
    def fully_qualified_namespace(self) -> str:
        return self._url

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

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> ServiceBusSender:
        check_client_options(kwargs, handler=True)
        return self._handed_out(ServiceBusSender(self, queue_name))

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> ServiceBusSender:
        check_client_options(kwargs, handler=True)
        return self._handed_out(ServiceBusSender(self, topic_name))

    def _handed_out(self, handler: Handed) -> Handed:
        self._handlers.add(handler)
        return handler

    def get_queue_receiver(
        self,
        queue_name: str,
        *,
        session_id: str | ServiceBusSessionFilter | None = None,
        sub_queue: str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
        prefetch_count: int = 0,
        **kwargs: Any,
    ) -> ServiceBusReceiver:
        """A receiver of the queue (``sub_queue``: its dead-letter queue); ``session_id``
        names a session to accept, or is :data:`NEXT_AVAILABLE_SESSION`."""
        check_client_options(kwargs, handler=True)
        if auto_lock_renewer is not None and not isinstance(auto_lock_renewer, AutoLockRenewer):
            raise TypeError(f"auto_lock_renewer is an AutoLockRenewer, not {auto_lock_renewer!r}")
        receiver = ServiceBusReceiver(
            self,
            queue_name,
            session_id=session_id,
            sub_queue=sub_queue,
            receive_mode=receive_mode,
            max_wait_time=max_wait_time,
            auto_lock_renewer=auto_lock_renewer,
            prefetch_count=prefetch_count,
        )
        return self._handed_out(receiver)

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> ServiceBusReceiver:
        return self.get_queue_receiver(f"{topic_name}/subscriptions/{subscription_name}", **kwargs)

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
