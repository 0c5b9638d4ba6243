"""poisonq for asyncio: ``broker = await poisonq.aio.connect(url)``.

The same operations, semantics and errors as the sync API, which does the work: every call
is the sync object's, run off the event loop on a bounded pool of threads, and every wait
(a receive's ``max_wait``, a session accept, the lock renewer's interval) happens in the
loop, holding no thread (docs/architecture.md, "The asyncio API").
"""

from poisonq.aio.broker import DEFAULT_POOL_SIZE, AsyncBroker, connect
from poisonq.aio.lock_renewer import AutoLockRenewer
from poisonq.aio.processor import Processor
from poisonq.aio.receivers import AsyncReceiver, AsyncSender, AsyncSessionReceiver

__all__ = [
    "DEFAULT_POOL_SIZE",
    "AsyncBroker",
    "AsyncReceiver",
    "AsyncSender",
    "AsyncSessionReceiver",
    "AutoLockRenewer",
    "Processor",
    "connect",
]
