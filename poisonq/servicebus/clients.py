"""What the sync and the asyncio ``ServiceBusClient`` share: the connection string checked, and
the senders and receivers handed out (the SDK's ``get_*_sender`` and ``get_*_receiver``).

Each flavour names its own sender, receiver and renewer types and adds how it opens and closes
its broker; the handlers it hands out are kept (weakly) to be closed with it, as the SDK closes
its handlers: a session receiver gives its session back then, rather than leave it locked, and
none of them reopens the store after. No I/O: nothing here waits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from poisonq.servicebus.connection import check_client_options, store_url
from poisonq.servicebus.constants import ServiceBusReceiveMode, ServiceBusSessionFilter
from poisonq.servicebus.exceptions import FeatureNotSupportedError
from poisonq.servicebus.handler import Handler

SenderT = TypeVar("SenderT", bound=Handler)
ReceiverT = TypeVar("ReceiverT", bound=Handler)
RenewerT = TypeVar("RenewerT")
Client = TypeVar("Client", bound="HandlerFactory[Any, Any, Any]")


class HandlerFactory(Generic[SenderT, ReceiverT, RenewerT]):
    """A client's store URL and retry options, and the handlers it hands out."""

    sender_type: Callable[..., SenderT]  # each flavour's own classes, set on its client
    receiver_type: Callable[..., ReceiverT]
    renewer_type: type[RenewerT]

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
        self._owns_broker = True
        self._handlers: weakref.WeakSet[SenderT | ReceiverT] = weakref.WeakSet()

    @classmethod
    def from_connection_string(cls: type[Client], conn_str: str, **kwargs: Any) -> Client:
        """A client on the store ``conn_str`` names (poisonq's store URL)."""
        return cls(conn_str, **kwargs)

    @property
    def fully_qualified_namespace(self) -> str:
        return self._url

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> SenderT:
        return self._sender(queue_name, kwargs)

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> SenderT:
        return self._sender(topic_name, kwargs)

    def _sender(self, entity_name: str, kwargs: dict[str, Any]) -> SenderT:
        check_client_options(kwargs, handler=True)
        sender = self.sender_type(self, entity_name)
        self._handlers.add(sender)
        return sender

    def get_queue_receiver(
        self,
        queue_name: str,
        *,
        session_id: str | ServiceBusSessionFilter | None = None,
        sub_queue: str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: RenewerT | None = None,
        prefetch_count: int = 0,
        **kwargs: Any,
    ) -> ReceiverT:
        """A receiver of the queue (``sub_queue``: its dead-letter queue); ``session_id``
        names a session to accept, or is :data:`NEXT_AVAILABLE_SESSION`."""
        check_client_options(kwargs, handler=True)
        if auto_lock_renewer is not None and not isinstance(auto_lock_renewer, self.renewer_type):
            raise TypeError(f"auto_lock_renewer is an AutoLockRenewer, not {auto_lock_renewer!r}")
        receiver = self.receiver_type(
            self,
            queue_name,
            session_id=session_id,
            sub_queue=sub_queue,
            receive_mode=receive_mode,
            max_wait_time=max_wait_time,
            auto_lock_renewer=auto_lock_renewer,
            prefetch_count=prefetch_count,
        )
        self._handlers.add(receiver)
        return receiver

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> ReceiverT:
        """A receiver of subscription ``topic_name/subscriptions/subscription_name``; the
        keyword arguments of :meth:`get_queue_receiver`."""
        return self.get_queue_receiver(f"{topic_name}/subscriptions/{subscription_name}", **kwargs)
