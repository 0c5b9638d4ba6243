"""``poisonq.aio.connect`` and the :class:`AsyncBroker`: the sync :class:`~poisonq.Broker`'s
calls as coroutines (every rule is the sync API's; see :mod:`poisonq.aio.calls` for how they
leave the event loop), and the waits of receiving a session done in the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import poisonq
from poisonq.aio.calls import AsyncLink, ChangeWatch, StoreCalls
from poisonq.aio.lock_renewer import AutoLockRenewer, sync_renewer
from poisonq.aio.receivers import AsyncReceiver, AsyncSender, AsyncSessionReceiver
from poisonq.client import Broker
from poisonq.clock import Clock
from poisonq.engine import Engine
from poisonq.limits import check_count
from poisonq.link import Link
from poisonq.messaging import Messaging
from poisonq.model import (
    Duration,
    EntityStatus,
    FaultAction,
    ReceivedMessage,
    ReceiveMode,
    Settlement,
    SubQueue,
    to_seconds,
)
from poisonq.receivers import LOOK_INTERVAL, RECEIVE_WAIT, SessionReceiver
from poisonq.reports import AuditReport, QueueInfo
from poisonq.retrying import retrying
from poisonq.store.base import DeadLetterCause, DeadLetterGroup, Store, TaskRecord
from poisonq.store.postgres import AsyncPostgresStore, PostgresStore
from poisonq.tasks import BulkTask

T = TypeVar("T")

DEFAULT_POOL_SIZE = 10
"""Threads (and PostgreSQL connections) an :class:`AsyncBroker` runs store calls on."""


def _with_pool_size(url: str, pool_size: int) -> str:
    """A PostgreSQL URL whose connection pool has ``pool_size`` connections, unless it names
    its own size (a thread of the pool then never waits for a connection)."""
    if not url.startswith(("postgresql:", "postgres:")):
        return url
    if "pool_size" in parse_qs(urlsplit(url).query):
        return url
    return f"{url}{'&' if '?' in url else '?'}pool_size={pool_size}"


async def connect(
    url: str = poisonq.client.DEFAULT_URL,
    *,
    clock: Clock | None = None,
    create: bool = True,
    pool_size: int = DEFAULT_POOL_SIZE,
    **retry: Any,
) -> AsyncBroker:
    """Open the store ``url`` names, as :func:`poisonq.connect` does (``clock``, ``create``
    and the ``retry_*`` arguments are its own). On PostgreSQL, messaging runs on the event
    loop, through psycopg's asyncio connections (a pool of up to ``pool_size`` per loop);
    the administration's calls run on as many threads, whose blocking pool gets as many
    connections unless the URL says ``pool_size``. On SQLite, store calls run on one
    thread."""
    check_count(pool_size, "pool_size")
    url = _with_pool_size(url, pool_size)
    sync = await asyncio.to_thread(poisonq.connect, url, clock=clock, create=create, **retry)
    if isinstance(sync.store, PostgresStore):
        return AsyncBroker(
            sync, pool_size, AsyncPostgresStore.beside(sync.store, max_size=pool_size)
        )
    return AsyncBroker(sync, 1)


class Native:
    """What the senders and receivers of an asyncio broker whose store has an asyncio
    driver are linked to (their ``broker``): an engine on that store, whose operations are
    retried as the sync broker's are, waiting on the loop; the sync broker's clock and
    change feed."""

    def __init__(self, sync: Broker, store: Store) -> None:
        engine = Engine(store, sync.clock)
        retried = retrying(engine, sync.retry, sync.reachability, asyncio.sleep)
        self.link = Link(retried, sync.clock, sync.link.changes)


class AsyncBroker:
    """A connection to a poisonq store for asyncio code: the :class:`~poisonq.Broker`'s
    operations as coroutines, with the same semantics and errors. Use it as an ``async
    with`` block, or call :meth:`close`.

    ``native``, a store of an asyncio driver on the database of ``broker``'s store, runs
    the messaging (sending, receiving, settling, sessions, lock renewal) on the event loop;
    without it, or for the administration, calls run on ``workers`` threads."""

    def __init__(
        self, broker: Broker, workers: int, native: AsyncPostgresStore | None = None
    ) -> None:
        self.sync = broker
        self.native = native
        self.calls = StoreCalls(workers, broker.url, native=native is not None)
        self.changes = ChangeWatch(broker.link.changes)
        # Held here: the messaging part refers to its owner weakly.
        self._owner = broker if native is None else Native(broker, native)
        messaging = broker.messaging if native is None else Messaging(self._owner)
        self.link = AsyncLink(broker, messaging, self.calls, self.changes)

    @property
    def clock(self) -> Clock:
        return self.sync.clock

    async def close(self) -> None:
        self.changes.close()
        await self.calls.finish()
        self.calls.close()
        if self.native is not None:
            await self.native.aclose()
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncBroker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Admin ------------------------------------------------------------------------------
    async def create_queue(self, name: str, **options: Any) -> QueueInfo:
        return await self.calls(self.sync.create_queue, name, **options)

    async def update_queue(self, name: str, **options: Any) -> QueueInfo:
        return await self.calls(self.sync.update_queue, name, **options)

    async def create_topic(self, name: str, **options: Any) -> QueueInfo:
        return await self.calls(self.sync.create_topic, name, **options)

    async def create_subscription(self, topic: str, name: str, **options: Any) -> QueueInfo:
        return await self.calls(self.sync.create_subscription, topic, name, **options)

    async def get_queue(self, address: str) -> QueueInfo:
        return await self.calls(self.sync.get_queue, address)

    async def list_queues(self) -> list[QueueInfo]:
        return await self.calls(self.sync.list_queues)

    async def delete_queue(self, name: str) -> None:
        await self.calls(self.sync.delete_queue, name)

    async def counts(self, address: str) -> dict[str, int]:
        return await self.calls(self.sync.counts, address)

    async def audit(self) -> AuditReport:
        return await self.calls(self.sync.audit)

    async def peek(
        self, address: str, *, from_sequence: int = 0, max_messages: int = 100, **where: Any
    ) -> list[ReceivedMessage]:
        """As :meth:`poisonq.Broker.peek`."""
        messaging = self.link.messaging
        return await self.calls.run(messaging._peek, address, from_sequence, max_messages, where)

    async def message(self, address: str, sequence_number: int) -> ReceivedMessage:
        return await self.calls.run(self.link.messaging.engine.message, address, sequence_number)

    async def settle(self, address: str, settlements: Sequence[Settlement]) -> list[int]:
        """As :meth:`poisonq.Broker.settle`: many settlements, one transaction."""
        return await self.calls.run(self.link.messaging.engine.settle, address, settlements)

    async def session_ids(
        self, address: str, *, state_updated_after: datetime | float | None = None
    ) -> list[str]:
        """As :meth:`poisonq.Broker.session_ids`."""
        messaging = self.link.messaging
        return await self.calls.run(messaging._session_ids, address, state_updated_after)

    async def dead_letters(self, queue: str, **options: Any) -> list[ReceivedMessage]:
        return await self.calls(self.sync.dead_letters, queue, **options)

    async def count_dead_letters(self, queue: str, **where: Any) -> int:
        return await self.calls(self.sync.count_dead_letters, queue, **where)

    async def dead_letter_groups(self, queue: str, by: str = "reason") -> list[DeadLetterGroup]:
        return await self.calls(self.sync.dead_letter_groups, queue, by)

    async def dead_letter_causes(self, queue: str) -> list[DeadLetterCause]:
        return await self.calls(self.sync.dead_letter_causes, queue)

    async def dead_letter_fingerprints(
        self, queue: str
    ) -> dict[str, tuple[str | None, str | None]]:
        return await self.calls(self.sync.dead_letter_fingerprints, queue)

    async def resolve_poison(
        self, address: str, sequence_number: int, action: FaultAction = "move", **options: Any
    ) -> QueueInfo:
        """As :meth:`poisonq.Broker.resolve_poison`: the way out of a fault."""
        return await self.calls(
            self.sync.resolve_poison, address, sequence_number, action, **options
        )

    async def set_status(
        self, address: str, status: EntityStatus | str, cause: str | None = None
    ) -> None:
        await self.calls(self.sync.set_status, address, status, cause)

    async def enable(self, address: str) -> None:
        await self.calls(self.sync.enable, address)

    async def disable(self, address: str) -> None:
        await self.calls(self.sync.disable, address)

    async def housekeep(self) -> list[str]:
        return await self.calls(self.sync.housekeep)

    async def task(self, task_id: int) -> TaskRecord:
        return await self.calls(self.sync.task, task_id)

    async def tasks(self, queue: str | None = None, **options: Any) -> list[TaskRecord]:
        return await self.calls(self.sync.tasks, queue, **options)

    async def cancel_task(self, task_id: int, by: str | None = None) -> TaskRecord:
        return await self.calls(self.sync.cancel_task, task_id, by)

    async def resubmit(self, queue: str, *, wait: bool = True, **options: Any) -> BulkTask:
        """As :meth:`poisonq.Broker.resubmit`: the task runs in its own thread, and
        ``wait=True`` waits for it in the event loop."""
        task = await self.calls(self.sync.resubmit, queue, wait=False, **options)
        return await self._finished(task) if wait else task

    async def purge(self, queue: str, *, wait: bool = True, **options: Any) -> BulkTask:
        """As :meth:`poisonq.Broker.purge`; waits as :meth:`resubmit` does."""
        task = await self.calls(self.sync.purge, queue, wait=False, **options)
        return await self._finished(task) if wait else task

    async def _finished(self, task: BulkTask) -> BulkTask:
        while task.running:
            await asyncio.sleep(LOOK_INTERVAL)
        await self.calls(task.wait)  # its thread has ended: this reads its last record
        return task

    # Senders and receivers ------------------------------------------------------------
    def sender(self, address: str) -> AsyncSender:
        return AsyncSender(self.link, self.link.messaging.sender(address))

    def receiver(
        self,
        address: str,
        *,
        subqueue: SubQueue | str | None = None,
        receive_mode: ReceiveMode | str = ReceiveMode.PEEK_LOCK,
        lock_duration: Duration | None = None,
        max_wait_time: Duration | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> AsyncReceiver:
        """As :meth:`poisonq.Broker.receiver` (checked the same way, no I/O)."""
        receiver = self.link.messaging.receiver(
            address,
            subqueue=subqueue,
            receive_mode=receive_mode,
            lock_duration=lock_duration,
            max_wait_time=max_wait_time,
            auto_lock_renewer=sync_renewer(auto_lock_renewer),
        )
        if auto_lock_renewer is not None:
            auto_lock_renewer.start(self.calls)
        return AsyncReceiver(self.link, receiver)

    async def accept_session(
        self,
        address: str,
        session_id: str,
        *,
        lock_duration: Duration | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> AsyncSessionReceiver:
        """As :meth:`poisonq.Broker.accept_session`."""
        renewer = sync_renewer(auto_lock_renewer)
        if auto_lock_renewer is not None:
            auto_lock_renewer.start(self.calls)
        messaging = self.link.messaging
        receiver = await self.calls.taking(
            lambda: messaging._accept_session(address, session_id, lock_duration, renewer),
            _given_up,
        )
        return AsyncSessionReceiver(self.link, receiver)

    async def accept_next_session(
        self,
        address: str,
        *,
        lock_duration: Duration | None = None,
        max_wait: Duration = RECEIVE_WAIT,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> AsyncSessionReceiver | None:
        """As :meth:`poisonq.Broker.accept_next_session`; the wait holds no thread."""
        renewer = sync_renewer(auto_lock_renewer)
        if auto_lock_renewer is not None:
            auto_lock_renewer.start(self.calls)
        wait = to_seconds(max_wait, "max_wait")
        deadline = asyncio.get_running_loop().time() + wait
        messaging = self.link.messaging

        def look() -> Awaitable[SessionReceiver | None]:  # one look: the waits are the loop's
            return self.calls.taking(
                lambda: messaging._accept_next_session(address, lock_duration, renewer),
                _given_up,
            )

        got = await self.changes.look_until(deadline, look)
        return None if got is None else AsyncSessionReceiver(self.link, got)


async def _given_up(receiver: SessionReceiver | None) -> None:
    """A session a cancelled accept took, given back (its messages uncounted)."""
    if receiver is not None:
        await receiver._close(None)
