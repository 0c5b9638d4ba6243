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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from poisonq.store.base import Store, Transaction
from poisonq.store.postgres.noise import POOL_NAME
from poisonq.store.postgres.runner import AsyncWire
from poisonq.store.postgres.store import (
    CONNECTION_OPTIONS,
    CONNECTION_WAIT,
    FAILURES,
    PostgresStore,
    configure_async,
    outage,
    translated,
)
from poisonq.store.postgres.transaction import PostgresTransaction


class AsyncPostgresStore(Store):
    """A store in one PostgreSQL database whose transactions run on an event loop. Open it
    with :meth:`open` on the loop that will use it, and close it with :meth:`aclose` (or
    ``async with``)."""

    has_server_clock = True

    def __init__(
        self, blocking: PostgresStore, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]
    ) -> None:
        """Use :meth:`open`: the pool opens on the running loop."""
        self.url = blocking.url
        self.history = blocking.history  # one keeper: the history's prunes are the store's
        self._blocking = blocking
        self._pool = pool

    @classmethod
    async def open(
        cls, url: str, *, min_size: int = 1, max_size: int | None = None
    ) -> AsyncPostgresStore:
        """The store at ``url`` (as :meth:`PostgresStore.from_url
        <poisonq.store.postgres.store.PostgresStore.from_url>` reads it), with a pool of
        ``min_size`` to ``max_size`` connections (default: the URL's ``pool_size``, else 4,
        as the blocking store's). The database is migrated first, in a thread; a server
        that cannot be reached raises :class:`~poisonq.errors.StoreUnavailableError` here."""
        blocking = await asyncio.to_thread(PostgresStore.from_url, url)
        size = blocking.pool_size if max_size is None else max_size
        try:
            pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                blocking.conninfo,
                min_size=min(min_size, size),
                max_size=size,
                kwargs=CONNECTION_OPTIONS,
                configure=configure_async(blocking.settings),
                timeout=CONNECTION_WAIT,
                open=False,
                name=POOL_NAME,
            )
            await pool.open(wait=False)
        except BaseException:
            blocking.close()
            raise
        return cls(blocking, pool)

    # Transactions -------------------------------------------------------------------------
    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        self.check_open()
        try:
            async with self._pool.connection() as conn:
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
                await self._pool.check()  # a restart broke every pooled connection
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
        close. The pool's connections close with :meth:`aclose`."""
        self.closed = True
        self._blocking.close()

    async def aclose(self) -> None:
        """Close the store and its pool. Idempotent."""
        self.close()
        await self._pool.close()

    async def __aenter__(self) -> AsyncPostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
