"""azure-servicebus 7's synchronous API on poisonq: ``from poisonq.servicebus import
ServiceBusClient`` in place of ``from azure.servicebus import ServiceBusClient``, and the
store's URL as the connection string.

The surface calls poisonq's public API (:func:`poisonq.connect`, the :class:`~poisonq.Broker`,
its senders and receivers) and nothing under it. The rules it adds, free of I/O so that an
asyncio flavour can share them, are in :mod:`~poisonq.servicebus.message` (the conversion of
messages, the checks before a settlement), :mod:`~poisonq.servicebus.constants` (receive
modes and subqueues), :mod:`~poisonq.servicebus.connection` (what a client is given) and
:mod:`~poisonq.servicebus.exceptions` (poisonq's errors as the SDK's). What differs from the
SDK, and what poisonq adds: docs/migrating-from-service-bus.md.
"""

from __future__ import annotations

from poisonq.servicebus.client import ServiceBusClient
from poisonq.servicebus.constants import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusSessionFilter,
    ServiceBusSubQueue,
    TransportType,
)
from poisonq.servicebus.lock_renewer import AutoLockRenewer
from poisonq.servicebus.message import (
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusReceivedMessage,
)
from poisonq.servicebus.receiver import ServiceBusReceiver, ServiceBusSession
from poisonq.servicebus.sender import ServiceBusSender

__all__ = [
    "NEXT_AVAILABLE_SESSION",
    "AutoLockRenewer",
    "ServiceBusClient",
    "ServiceBusMessage",
    "ServiceBusMessageBatch",
    "ServiceBusMessageState",
    "ServiceBusReceiveMode",
    "ServiceBusReceivedMessage",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
    "ServiceBusSessionFilter",
    "ServiceBusSubQueue",
    "TransportType",
]
