"""``azure.servicebus.aio.management`` on poisonq: the asyncio ``ServiceBusAdministrationClient``.
Its property classes and rule filters are :mod:`poisonq.servicebus.management`'s, as the
SDK's come from ``azure.servicebus.management``."""

from __future__ import annotations

from poisonq.servicebus.aio.management.client import ServiceBusAdministrationClient

__all__ = ["ServiceBusAdministrationClient"]
