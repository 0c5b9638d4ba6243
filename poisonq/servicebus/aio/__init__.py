"""azure-servicebus 7's asyncio API on poisonq: ``from poisonq.servicebus.aio import
ServiceBusClient`` in place of ``from azure.servicebus.aio import ServiceBusClient``.

It is :mod:`poisonq.aio` underneath, and shares the sync flavour's rules, free of I/O:
message conversion and the checks before a settlement (:mod:`poisonq.servicebus.message`),
receive modes (:mod:`~poisonq.servicebus.constants`), what a client is given
(:mod:`~poisonq.servicebus.connection`) and the errors (:mod:`~poisonq.servicebus.exceptions`).
Messages and constants are imported from :mod:`poisonq.servicebus`, as the SDK's from
``azure.servicebus``.
"""

from __future__ import annotations

from poisonq.servicebus.aio.client import ServiceBusClient
from poisonq.servicebus.aio.lock_renewer import AutoLockRenewer
from poisonq.servicebus.aio.receiver import ServiceBusReceiver, ServiceBusSession
from poisonq.servicebus.aio.sender import ServiceBusSender

__all__ = [
    "AutoLockRenewer",
    "ServiceBusClient",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
]
