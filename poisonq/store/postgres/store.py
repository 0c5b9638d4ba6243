"""The PostgreSQL store: many processes on many hosts share one database.

Connections come from a pool (``psycopg_pool``), so the threads of one process (a Processor's
workers, a lock renewer) run transactions side by side. Each transaction runs in pipeline mode:
statements whose results nobody waits for (``BEGIN``, the ledger update, ``NOTIFY``) travel
with the next one that is waited for, and the end of a transaction (ledger, notification,
``COMMIT``) is one round trip, the one that leaves pipeline mode. The connections are in
autocommit mode and the store sends ``BEGIN`` and ``COMMIT`` itself: psycopg would wait for the
answer to its own ``BEGIN`` before sending anything else, and sync once more after its
``COMMIT``, two round trips per transaction for nothing.

Long-polling receivers wait on ``LISTEN``: a transaction that makes a message receivable
sends ``NOTIFY poisonq`` as it commits, and a waiting receiver wakes at once instead of
sleeping between polls.

During an outage an attempt fails fast: a connection waits at most ``CONNECTION_WAIT``
seconds for the pool, and a new connection gives up after libpq's ``connect_timeout``
(``CONNECT_TIMEOUT`` unless the URL says otherwise). The pool replaces broken connections in
the background with a backoff of its own that grows to half a minute and more; so once a
transaction has found the server gone, transactions open a connection of their own while the
pool has none to give, and the first attempt after the server is back succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from typing import Any, TypeGuard
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.errors import DiskFull
from psycopg_pool import ConnectionPool, PoolTimeout

from poisonq.errors import (
    InvalidOptionError,
    StoreConflictError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)
from poisonq.store import redacted_url
from poisonq.store.base import UNSTORABLE, Store, Transaction, pending_migrations, unstorable
from poisonq.store.history import HistoryKeeper
from poisonq.store.postgres.noise import POOL_NAME, own, quiet_own_connections
from poisonq.store.postgres.runner import NOTIFY_CHANNEL, BlockingWire
from poisonq.store.postgres.transaction import PostgresTransaction
from poisonq.store.shared_sql import (
    ADD_SCHEMA_VERSION,
    SCHEMA_TABLE,
    SCHEMA_VERSIONS,
    for_postgres,
)

log = logging.getLogger(__name__)

# Our options in the URL's query; the rest of the query goes to libpq.
_POOL_SIZE = "pool_size"
_SYNCHRONOUS_COMMIT = "synchronous_commit"
_SYNCHRONOUS_VALUES = ("on", "off", "local", "remote_write", "remote_apply")
_MIGRATION_LOCK = 0x706F69736F6E71  # an advisory lock key: "poisonq" in ASCII
CONNECTION_WAIT = 5.0  # seconds an attempt waits for a pooled connection
CONNECT_TIMEOUT = 5  # libpq's connect_timeout, unless the URL gives one
# A measurement of the server's clock waits less: it may be asked for by a thread that holds
# a pooled connection already, and a missed one only keeps the last offset a while longer.
CLOCK_WAIT = 0.5
CLOCK_SAMPLES = 3  # round trips per measurement of the server's clock; the quickest counts
CLOCK_QUERY = "SELECT extract(epoch FROM clock_timestamp())"


def _unreachable(exc: psycopg.Error) -> bool:
    """Whether opening a connection failed for a while only: no server answered (refused,
    timed out, cut), or it answered that it is starting up or shutting down. A server that
    refuses the caller (a wrong password or database: libpq's ``FATAL`` reply, which psycopg
    gives no SQLSTATE when connecting) is the caller's to fix, and is not retried."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    text = str(exc)
    return "FATAL:" not in text or "the database system is" in text


class PostgresStore(Store):
    """A store in one PostgreSQL database (the tables live in its default schema)."""

    def __init__(self, url: str, pool_size: int = 4, synchronous_commit: str | None = None) -> None:
        self.url = url
        self.history = HistoryKeeper()
        parts = urlsplit(url)
        query = [
            (k, v) for k, v in parse_qsl(parts.query) if k not in (_POOL_SIZE, _SYNCHRONOUS_COMMIT)
        ]
        if not any(k == "connect_timeout" for k, _ in query):
            query.append(("connect_timeout", str(CONNECT_TIMEOUT)))
        conninfo = urlunsplit(parts._replace(scheme="postgresql", query=urlencode(query)))
        self.name = redacted_url(url)  # for messages: without the password
        settings = {} if synchronous_commit is None else {"synchronous_commit": synchronous_commit}
        self.conninfo = conninfo  # libpq's, with the connect timeout
        self.pool_size = pool_size
        self._listener: psycopg.Connection[Any] | None = None
        self._listen_lock = threading.Lock()
        self._changes = 0
        self.settings = settings  # of every transaction's connection (configure)
        self._pool_broken = False  # a transaction found the server gone; the pool recovers
        quiet_own_connections()
        try:
            # One plain connection first: it migrates, and a server that cannot be reached
            # fails here at once with libpq's reason (a pool would retry in the background).
            with psycopg.connect(conninfo, autocommit=False) as conn:
                own(conn)
                self._migrate(conn)
        except psycopg.Error as exc:
            kind = StoreUnavailableError if _unreachable(exc) else StoreError
            raise kind(f"cannot open PostgreSQL store {self.name}: {exc}") from exc
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            conninfo, configure=configure(settings), **pool_options(pool_size)
        )
        self._pool.open(wait=False)

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """``postgresql://user:password@host:port/database``; query options: ``pool_size``
        (connections per process, default 4) and ``synchronous_commit=off``, which trades
        the last commits before a server crash for speed. Other query options go to libpq
        (``sslmode=require``, ``connect_timeout=5``, ...)."""
        parts = urlsplit(url)
        if not parts.hostname and "host=" not in parts.query:
            raise InvalidOptionError(f"no host in {url!r}; use postgresql://user@host/database")
        query = dict(parse_qsl(parts.query))
        pool_size = query.get(_POOL_SIZE, "4")
        if not pool_size.isdigit() or not 1 <= int(pool_size) <= 100:
            raise InvalidOptionError(f"pool_size must be an integer in [1, 100]: {pool_size!r}")
        synchronous = query.get(_SYNCHRONOUS_COMMIT)
        if synchronous is not None and synchronous not in _SYNCHRONOUS_VALUES:
            choices = ", ".join(_SYNCHRONOUS_VALUES)
            raise InvalidOptionError(
                f"synchronous_commit must be one of {choices}: {synchronous!r}"
            )
        return cls(url, int(pool_size), synchronous)

    # Schema -------------------------------------------------------------------------------
    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Apply the numbered scripts this database has not seen, in one transaction; an
        advisory lock makes processes that start together take turns."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(SCHEMA_TABLE)
            applied = {v for (v,) in conn.execute(SCHEMA_VERSIONS)}
            for version, script in pending_migrations("postgres", applied, self.name):
                conn.execute(script.encode(), prepare=False)
                conn.execute(for_postgres(ADD_SCHEMA_VERSION), {"version": version})

    # Transactions -------------------------------------------------------------------------
    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        self.check_open()
        try:
            with self._connection() as conn:
                try:
                    # The transaction's commit ends the pipeline (``end``): leaving pipeline
                    # mode syncs, and that sync is the one that carries COMMIT.
                    with ExitStack() as stack:
                        pipeline = stack.enter_context(conn.pipeline())
                        conn.execute("BEGIN")
                        wire = BlockingWire(conn, pipeline, stack.close)
                        tx = PostgresTransaction(wire, self.history)
                        yield tx
                        await tx.commit()
                except BaseException:
                    if not conn.closed:
                        conn.execute("ROLLBACK")
                    raise
        except FAILURES as exc:
            error = translated(exc, self.name)
            if outage(exc):
                self._outage_seen(exc)
                self._pool.check()  # a restart broke every pooled connection, not just this one
            raise error from exc

    @contextmanager
    def _connection(self, wait: float = CONNECTION_WAIT) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; after an outage, until the pool has one again, a connection
        of the transaction's own (closed after it), so that recovery does not wait for the
        pool's reconnection backoff."""
        if self._pool_broken and not self._pool.get_stats().get("pool_available"):
            with psycopg.connect(self.conninfo, **CONNECTION_OPTIONS) as conn:
                configure(self.settings)(conn)
                yield conn
            return
        with self._pool.connection(timeout=wait) as conn:
            self._pool_broken = False
            yield conn

    def _outage_seen(self, exc: psycopg.OperationalError) -> None:
        """Note a connection that failed (not one that was only waited for too long: the
        pool is busy, not broken)."""
        if not isinstance(exc, PoolTimeout):
            self._pool_broken = True

    # Clock --------------------------------------------------------------------------------
    has_server_clock = True

    def server_offset(self, local: Callable[[], float]) -> float:
        """The database server's clock (``clock_timestamp()``: the time now, not the
        transaction's start) less ``local()``: the quickest of a few round trips on one
        connection, timed around the query alone, so the error is at most half of that
        round trip (the wait for a connection, or its setup, is left out)."""
        self.check_open()
        samples: list[tuple[float, float]] = []
        try:
            with self._connection(CLOCK_WAIT) as conn:
                for _ in range(CLOCK_SAMPLES):
                    before = local()
                    row = conn.execute(CLOCK_QUERY).fetchone()
                    after = local()
                    assert row is not None
                    samples.append((after - before, float(row[0]) - (before + after) / 2))
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                self._outage_seen(exc)
            raise StoreUnavailableError(f"PostgreSQL unavailable on {self.name}: {exc}") from exc
        return min(samples)[1]

    # Change notification ------------------------------------------------------------------
    def _drain(self, timeout: float) -> None:
        """Count the notifications that arrive within ``timeout`` (0: those already here);
        return at the first. Called with ``_listen_lock`` held."""
        if self._listener is None:
            self._listener = psycopg.connect(self.conninfo, autocommit=True)
            own(self._listener)
            self._listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        stop = None if timeout == 0 else 1
        for _ in self._listener.notifies(timeout=timeout, stop_after=stop):
            self._changes += 1

    def change_marker(self) -> int:
        """The number of notifications seen so far; the listening connection is opened on
        the first call, so only processes that wait ever hold one. Notifications only save
        polls: when the connection fails, waiting falls back to polling until it is back."""
        with self._listen_lock:
            try:
                self._drain(0)
            except psycopg.Error as exc:
                self._listener_failed(exc)
            return self._changes

    def wait_for_change(self, marker: object, timeout: float) -> None:
        # One thread reads the listening connection at a time; the others wait for the lock
        # and then find the count moved on. A notification that arrived between the
        # caller's marker and now is already counted, so no commit is ever missed.
        deadline = time.monotonic() + timeout
        if not self._listen_lock.acquire(timeout=max(timeout, 0)):
            return
        try:
            left = deadline - time.monotonic()
            if self._changes == marker and left > 0:
                self._drain(left)
        except psycopg.Error as exc:
            self._listener_failed(exc)
            time.sleep(max(0.0, deadline - time.monotonic()))  # a poll interval instead
        finally:
            self._listen_lock.release()

    def _listener_failed(self, exc: psycopg.Error) -> None:
        """Drop the listening connection (the next wait opens a new one)."""
        if self._listener is not None:
            # Debug only: the client's outage lines say it (poisonq.retrying.Reachability).
            log.debug("lost the notification connection to %s: %s", self.name, exc)
        self._reset_listener()

    def _reset_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def close(self) -> None:
        self.closed = True
        with self._listen_lock:
            self._reset_listener()
        self._pool.close()


CONNECTION_OPTIONS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0}

# What a transaction may raise that the store reports as one of its typed errors.
FAILURES = (psycopg.Error, *UNSTORABLE)


def translated(
    exc: psycopg.Error | UnicodeEncodeError | OverflowError, store: str
) -> StoreError | InvalidOptionError:
    """The typed error for what a transaction on ``store`` (its name for messages) raised;
    the blocking and the asyncio stores report alike."""
    if isinstance(exc, psycopg.DataError):
        return InvalidOptionError(f"PostgreSQL cannot store a value: {exc}")
    if isinstance(exc, DiskFull):
        return StoreFullError(f"PostgreSQL on {store} has no room left: {exc}")
    if isinstance(exc, UNSTORABLE):
        return unstorable(exc)
    if _conflict(exc):
        return StoreConflictError(f"PostgreSQL gave this transaction up on {store}: {exc}")
    if isinstance(exc, psycopg.OperationalError):
        # The server is gone, restarting or refusing connections: nothing here says the
        # operation was wrong.
        return StoreUnavailableError(f"PostgreSQL unavailable on {store}: {exc}")
    return StoreError(f"PostgreSQL error on {store}: {exc}")


def outage(exc: BaseException) -> TypeGuard[psycopg.OperationalError]:
    """Whether ``exc`` says a connection failed (or the pool had none in time), not that the
    server refused the work or gave it up for another's: the store checks its pool then."""
    return (
        isinstance(exc, psycopg.OperationalError)
        and not isinstance(exc, DiskFull)
        and not _conflict(exc)
    )


def _conflict(exc: BaseException) -> bool:
    """Whether PostgreSQL rolled the transaction back for another it conflicted with: a
    deadlock's victim, a serialization failure (SQLSTATE class 40, whose psycopg classes
    share no base but ``OperationalError``)."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("40")


def _settings_statement(settings: dict[str, str]) -> tuple[str, list[str]] | None:
    """One statement that applies ``settings`` to a connection (``None``: none to apply)."""
    if not settings:
        return None
    calls = ", ".join("set_config(%s, %s, false)" for _ in settings)
    return f"SELECT {calls}", [part for item in settings.items() for part in item]


def configure(settings: dict[str, str]) -> Callable[[psycopg.Connection[Any]], None]:
    """The pool's set-up of a new connection: the store's own (see ``noise.py``), with
    ``settings``."""
    statement = _settings_statement(settings)

    def configure(conn: psycopg.Connection[Any]) -> None:
        own(conn)
        if statement is not None:
            conn.execute(*statement)

    return configure


def pool_options(max_size: int) -> dict[str, Any]:
    """The options of a connection pool of either kind (blocking or asyncio), opened later
    (``open``), that grows to ``max_size`` connections."""
    return {
        "min_size": 1,
        "max_size": max_size,
        "kwargs": CONNECTION_OPTIONS,
        "timeout": CONNECTION_WAIT,
        "open": False,
        "name": POOL_NAME,
    }


def configure_async(
    settings: dict[str, str],
) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """:func:`configure` for a connection of psycopg's asyncio pool."""
    statement = _settings_statement(settings)

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        own(conn)
        if statement is not None:
            await conn.execute(*statement)

    return configure
