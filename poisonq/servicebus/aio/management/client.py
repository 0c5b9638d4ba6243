"""The asyncio ``ServiceBusAdministrationClient``: the sync client's calls as coroutines.

Each call runs the call of the same name of a sync
:class:`~poisonq.servicebus.management.ServiceBusAdministrationClient` in a thread, off the
event loop, so what it accepts, refuses, maps and raises (the options, runtime properties,
rules, the errors, the store made by a ``create_*``) is the sync client's, written once. An
administration call is a store transaction or a few, rare next to messaging: one thread per
client runs them (a client made :meth:`from_broker` uses the broker's threads instead).
A listing is an async iterator, as the SDK's ``AsyncItemPaged``: ``async for queue in
admin.list_queues()``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import poisonq.aio
from poisonq.aio.calls import StoreCalls
from poisonq.servicebus.management import ServiceBusAdministrationClient as SyncClient


class _SyncCall:
    """The sync client's method of the same name, run in the client's thread: as a
    coroutine, or for a ``listing``, as an async iterator over what it lists (read when the
    iteration starts), as the SDK's ``AsyncItemPaged``."""

    def __init__(self, *, listing: bool = False) -> None:
        self._listing = listing

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, admin: ServiceBusAdministrationClient | None, owner: type) -> Any:
        method = getattr(SyncClient if admin is None else admin._sync, self._name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            assert admin is not None
            return await admin._calls(method, *args, **kwargs)

        async def listing(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            assert admin is not None
            items = await admin._calls(lambda: list(method(*args, **kwargs)))
            for item in items:
                yield item

        return functools.wraps(method)(listing if self._listing else call)


class ServiceBusAdministrationClient:
    """Creates, reads, updates, lists and deletes entities of one store, for asyncio."""

    def __init__(
        self, fully_qualified_namespace: str, credential: object = None, **kwargs: Any
    ) -> None:
        self._sync = SyncClient(fully_qualified_namespace, credential, **kwargs)
        self._calls = StoreCalls(1)
        self._owns_calls = True

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusAdministrationClient:
        return cls(conn_str, **kwargs)

    @classmethod
    def from_broker(cls, broker: poisonq.aio.AsyncBroker) -> ServiceBusAdministrationClient:
        """An administration client on an async broker already open (poisonq's own), its
        calls on the broker's threads. Closing the client leaves the broker open."""
        admin = cls(broker.sync.url)
        admin._calls.close()
        admin._sync = SyncClient.from_broker(broker.sync)
        admin._calls, admin._owns_calls = broker.calls, False
        return admin

    async def close(self) -> None:
        """Close the store connection; a call after opens it again, as the sync client's."""
        await self._calls(self._sync.close)
        if self._owns_calls:
            self._calls.close()
            self._calls = StoreCalls(1)  # its thread starts with the next call, if any

    async def __aenter__(self) -> ServiceBusAdministrationClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    get_namespace_properties = _SyncCall()

    get_queue = _SyncCall()
    get_queue_runtime_properties = _SyncCall()
    create_queue = _SyncCall()
    update_queue = _SyncCall()
    delete_queue = _SyncCall()
    list_queues = _SyncCall(listing=True)
    list_queues_runtime_properties = _SyncCall(listing=True)

    get_topic = _SyncCall()
    get_topic_runtime_properties = _SyncCall()
    create_topic = _SyncCall()
    update_topic = _SyncCall()
    delete_topic = _SyncCall()
    list_topics = _SyncCall(listing=True)
    list_topics_runtime_properties = _SyncCall(listing=True)

    get_subscription = _SyncCall()
    get_subscription_runtime_properties = _SyncCall()
    create_subscription = _SyncCall()
    update_subscription = _SyncCall()
    delete_subscription = _SyncCall()
    list_subscriptions = _SyncCall(listing=True)
    list_subscriptions_runtime_properties = _SyncCall(listing=True)

    get_rule = _SyncCall()
    create_rule = _SyncCall()
    update_rule = _SyncCall()
    delete_rule = _SyncCall()
    list_rules = _SyncCall(listing=True)
