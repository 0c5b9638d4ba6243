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
import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

import poisonq
from poisonq.servicebus.connection import check_client_options, store_url
from poisonq.servicebus.constants import ServiceBusReceiveMode, ServiceBusSessionFilter
from poisonq.servicebus.exceptions import FeatureNotSupportedError, translated
from poisonq.servicebus.lock_renewer import AutoLockRenewer
from poisonq.servicebus.message import utc
from poisonq.servicebus.receiver import ServiceBusReceiver
from poisonq.servicebus.sender import ServiceBusSender

Handed = TypeVar("Handed", ServiceBusSender, ServiceBusReceiver)


class ServiceBusClient:
    """Senders and receivers of one store's queues, topics and subscriptions."""

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
        self._broker: poisonq.Broker | None = None
        self._owns_broker = True
        self._lock = threading.Lock()
        # The senders and receivers handed out, closed with the client as the SDK closes its
        # handlers: a session receiver gives its session back then, rather than leave it
        # locked, and none of them reopens the store after.
        self._handlers: weakref.WeakSet[ServiceBusSender | ServiceBusReceiver] = weakref.WeakSet()

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusClient:
        """A client on the store ``conn_str`` names (poisonq's store URL)."""
        return cls(conn_str, **kwargs)

    @classmethod
    def from_broker(cls, broker: poisonq.Broker) -> ServiceBusClient:
        """A client on a broker already open (poisonq's own, not the SDK's): native and
        SDK-shaped calls on one store, one clock. Closing the client leaves it open."""
        client = cls(broker.url)
        client._broker, client._owns_broker = broker, False
        return client

    @property
    def fully_qualified_namespace(self) -> str:
        return self._url

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

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> ServiceBusReceiver:
        """A receiver of subscription ``topic_name/subscriptions/subscription_name``; the
        keyword arguments of :meth:`get_queue_receiver`."""
        return self.get_queue_receiver(f"{topic_name}/subscriptions/{subscription_name}", **kwargs)
