"""The PostgreSQL store on an event loop: transactions on psycopg's asyncio connections.

The engine's operations are coroutines (``poisonq/engine/driving.py``); on this store each of
their statements waits on the loop, not on the thread, so one loop runs as many transactions
side by side as its pool has connections (``max_size``), and any number of coroutines wait
for one. A transaction is the blocking store's, statement for statement: the same
:class:`~poisonq.store.postgres.transaction.PostgresTransaction` over an
:class:`~poisonq.store.postgres.runner.AsyncWire` (pipeline mode, ``BEGIN`` and ``COMMIT``
sent by the store), the same connection set-up and the same typed errors.

What is not a transaction it takes from a blocking
:class:`~poisonq.store.postgres.store.PostgresStore` that it opens and owns: the migrations
(run as it opens, in a thread, off the loop), the server's clock, and the notifications a
waiting receiver wakes on (``LISTEN``). So there is one migration path and one listener; their
calls block the thread that makes them, as on the blocking store (an asyncio caller waits for a
change in a thread of its own).

A pool of psycopg's belongs to the loop it opened on, while a user may run one broker under one
``asyncio.run`` after another: the store keeps a pool per loop, opened by the loop's first
transaction, and closes the connections of a pool whose loop has closed when the next loop
opens one (no coroutine can await that pool any more).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from poisonq.store.base import Store, Transaction
from poisonq.store.postgres.runner import AsyncWire
from poisonq.store.postgres.store import (
    CONNECTION_OPTIONS,
    FAILURES,
    PostgresStore,
    configure_async,
    outage,
    pool_options,
    translated,
)
from poisonq.store.postgres.transaction import PostgresTransaction


class AsyncPostgresStore(Store):
    """A store in one PostgreSQL database whose transactions run on an event loop. Open it
    with :meth:`open` (or :meth:`beside` a blocking store already open), and close it with
    :meth:`aclose` (or ``async with``)."""

    has_server_clock = True

    def __init__(self, blocking: PostgresStore, max_size: int, *, owns_blocking: bool) -> None:
        """Use :meth:`open` or :meth:`beside`."""
        self.url = blocking.url
        self.history = blocking.history  # one keeper: the history's prunes are the store's
        self._blocking = blocking
        self._owns_blocking = owns_blocking
        self._max_size = max_size
        self._pools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}

    @classmethod
    async def open(cls, url: str, *, max_size: int | None = None) -> AsyncPostgresStore:
        """The store at ``url`` (as :meth:`PostgresStore.from_url
        <poisonq.store.postgres.store.PostgresStore.from_url>` reads it), with a pool of up
        to ``max_size`` connections per event loop (default: the URL's ``pool_size``, else
        4, as the blocking store's). The database is migrated first, in a thread; a server
        that cannot be reached raises :class:`~poisonq.errors.StoreUnavailableError` here."""
        blocking = await asyncio.to_thread(PostgresStore.from_url, url)
        size = blocking.pool_size if max_size is None else max_size
        return cls(blocking, size, owns_blocking=True)

    @classmethod
    def beside(cls, blocking: PostgresStore, *, max_size: int) -> AsyncPostgresStore:
        """An asyncio store on the database of ``blocking`` (open, migrated), which it
        borrows for its clock and notifications and leaves open when it closes: the
        asyncio broker's, beside its blocking broker's store."""
        return cls(blocking, max_size, owns_blocking=False)

    async def _pool(self) -> _LoopPool:
        """The running loop's pool, opened by its first transaction."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for gone in [other for other in self._pools if other.is_closed()]:
                self._pools.pop(gone).abandon()
            pool = self._pools[loop] = _LoopPool(self._blocking, self._max_size)
        await pool.open()
        return pool

    # Transactions -------------------------------------------------------------------------
    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        self.check_open()
        pool = await self._pool()
        try:
            async with pool.turn(), pool.connection() as conn:
                try:
                    # As the blocking store's: the commit's sync is the one that leaves
                    # pipeline mode (``end``).
                    async with AsyncExitStack() as stack:
                        pipeline = await stack.enter_async_context(conn.pipeline())
                        await conn.execute("BEGIN")
                        wire = AsyncWire(conn, pipeline, stack.aclose)
                        tx = PostgresTransaction(wire, self.history)
                        yield tx
                        await tx.commit()
                except asyncio.CancelledError:
                    # Cancelled maybe in the middle of a statement's exchange: the connection
                    # is closed (the server rolls back), and the pool opens another.
                    await conn.close()
                    raise
                except BaseException:
                    if not conn.closed:
                        await conn.execute("ROLLBACK")
                    raise
        except FAILURES as exc:
            error = translated(exc, self._blocking.name)
            if outage(exc):
                pool.outage_seen()
                await pool.check()  # a restart broke every pooled connection
            raise error from exc

    # What is not a transaction: the blocking store's ---------------------------------------
    def server_offset(self, local: Callable[[], float]) -> float:
        return self._blocking.server_offset(local)

    def change_marker(self) -> object:
        return self._blocking.change_marker()

    def wait_for_change(self, marker: object, timeout: float) -> None:
        """Blocks the calling thread (see the module docstring)."""
        self._blocking.wait_for_change(marker, timeout)

    # Closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close what closes without the loop: later transactions raise
        :class:`~poisonq.errors.BrokerClosedError`, and the blocking store's connections
        close if it owns them. The pools' connections close with :meth:`aclose`."""
        self.closed = True
        if self._owns_blocking:
            self._blocking.close()

    async def aclose(self) -> None:
        """Close the store and its pools (the running loop's awaited, the others' connections
        closed at once). Idempotent."""
        self.close()
        running = asyncio.get_running_loop()
        pools, self._pools = self._pools, {}
        for loop, pool in pools.items():
            if loop is running:
                await pool.close()
            else:
                pool.abandon()

    async def __aenter__(self) -> AsyncPostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _LoopPool:
    """The connection pool of one event loop, and the connections it made (so that they can
    be closed without the loop once it has closed)."""

    def __init__(self, blocking: PostgresStore, max_size: int) -> None:
        self._connections: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()
        self._conninfo = blocking.conninfo
        self._broken = False
        setup = configure_async(blocking.settings)

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            self._connections.add(conn)
            await setup(conn)

        self._configure = configure

        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            blocking.conninfo, configure=configure, **pool_options(max_size)
        )

        # A transaction waits here for its turn, for as long as the loop's transactions
        # before it take (as a call waits for a thread of a pool of threads); then for a
        # connection, at most the pool's timeout (5 s): a wait that long then means an outage, not
        # hundreds of coroutines in line.
        self._turns = asyncio.Semaphore(max_size)

    async def open(self) -> None:
        """The first caller opens the pool; one that comes meanwhile waits for that (the
        pool's ``open`` is idempotent)."""
        if self._pool.closed:
            await self._pool.open(wait=False)

    def turn(self) -> asyncio.Semaphore:
        return self._turns

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection; after an outage, until the pool has one again, a connection
        of the transaction's own (closed after it), as the blocking store's
        (``PostgresStore._connection``), so that an attempt meets a refused connection at
        once and recovery does not wait for the pool's reconnection backoff."""
        if self._broken and not self._pool.get_stats().get("pool_available"):
            async with await psycopg.AsyncConnection.connect(
                self._conninfo, **CONNECTION_OPTIONS
            ) as conn:
                await self._configure(conn)
                yield conn
            return
        async with self._pool.connection() as conn:
            self._broken = False
            yield conn

    def outage_seen(self) -> None:
        """Note that the pool is broken: a connection failed, or the wait for one timed out,
        which here means the pool cannot connect, never that it is busy (a transaction
        waits for its turn first, and the turns are as many as the pool's connections)."""
        self._broken = True

    async def check(self) -> None:
        await self._pool.check()

    async def close(self) -> None:
        """Close the pool. Its workers may have been cancelled already, as ``asyncio.run``
        cancels every task left when its main one ends (after a KeyboardInterrupt, say):
        their cancellation is not this close's, which goes on."""
        try:
            await self._pool.close()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            self.abandon()  # the pool's close stopped before it closed its connections

    def abandon(self) -> None:
        """Close the connections of a pool whose loop is gone, without it: the server rolls
        back what they had begun."""
        for conn in list(self._connections):
            conn.pgconn.finish()
