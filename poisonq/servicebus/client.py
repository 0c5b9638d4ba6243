"""``ServiceBusClient``: azure-servicebus 7's entry point on a poisonq store.

The connection string is the store's URL (``sqlite:///path``, ``postgresql://...``): the
client opens one :class:`poisonq.Broker` on it when first used (nothing is opened by the
constructor, as the SDK's client connects lazily too) and closes it with :meth:`close`. A
Service Bus connection string (``Endpoint=sb://...``), a credential, a proxy or a custom
endpoint raise :class:`~poisonq.servicebus.exceptions.FeatureNotSupportedError` naming it.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from typing import Any

import poisonq
from poisonq.servicebus.clients import HandlerFactory
from poisonq.servicebus.connection import check_client_options
from poisonq.servicebus.exceptions import translated
from poisonq.servicebus.lock_renewer import AutoLockRenewer
from poisonq.servicebus.message import utc
from poisonq.servicebus.receiver import ServiceBusReceiver
from poisonq.servicebus.sender import ServiceBusSender


class ServiceBusClient(HandlerFactory[ServiceBusSender, ServiceBusReceiver, AutoLockRenewer]):
    """Senders and receivers of one store's queues, topics and subscriptions."""

    sender_type = ServiceBusSender
    receiver_type = ServiceBusReceiver
    renewer_type = AutoLockRenewer

    def __init__(
        self, fully_qualified_namespace: str, credential: object = None, **kwargs: Any
    ) -> None:
        super().__init__(fully_qualified_namespace, credential, **kwargs)
        self._broker: poisonq.Broker | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_broker(cls, broker: poisonq.Broker) -> ServiceBusClient:
        """A client on a broker already open (poisonq's own, not the SDK's): native and
        SDK-shaped calls on one store, one clock. Closing the client leaves it open."""
        client = cls(broker.url)
        client._broker, client._owns_broker = broker, False
        return client

    def broker(self, *, create: bool = False) -> poisonq.Broker:
        """The poisonq broker under this client, opened on first use. A store that does not
        exist raises :class:`ServiceBusConnectionError` naming it, as an unreachable
        namespace does, unless ``create`` (what the administration client's ``create_*``
        calls pass, as ``poisonq queue create`` makes the store)."""
        with self._lock:
            if self._broker is None:
                with translated():
                    self._broker = poisonq.connect(self._url, create=create, **self._retry)
            return self._broker

    def close(self) -> None:
        """Close the senders and receivers this client handed out (a session receiver gives
        its session back; each refuses every call after), then the broker it opened."""
        for handler in list(self._handlers):
            handler.close()
        with self._lock:
            if self._broker is not None and self._owns_broker:
                self._broker.close()
                self._broker = None  # a handler asked for after opens it again, as the SDK's

    def __enter__(self) -> ServiceBusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_queue_sessions(
        self,
        queue_name: str,
        *,
        state_updated_after: datetime.datetime | None = None,
        **kwargs: Any,
    ) -> Iterator[str]:
        """The ids of the queue's sessions with messages or a stored state; with
        ``state_updated_after``, of those whose state was set after it (a naive time is
        UTC)."""
        check_client_options(kwargs, handler=True)
        with translated():
            sessions = self.broker().session_ids(
                queue_name, state_updated_after=utc(state_updated_after)
            )
        return iter(sessions)

    def list_subscription_sessions(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> Iterator[str]:
        """:meth:`list_queue_sessions` of a subscription."""
        return self.list_queue_sessions(f"{topic_name}/subscriptions/{subscription_name}", **kwargs)
