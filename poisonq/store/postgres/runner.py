"""How the PostgreSQL store runs the statements of one transaction.

A transaction runs in pipeline mode: a statement is sent when it is queued, and the client
waits only when it reads a result. What no one waits for (``BEGIN``, the ledger, ``NOTIFY``)
travels with the next statement that is waited for. Two more things save round trips:

- the ledger is kept in memory during the transaction and written in one statement just
  before ``COMMIT`` (see :meth:`StatementRunner.flush_ledger`), and so is what the transaction
  adds to the history (``poisonq/store/history.py``), after it;
- an answer the next call will need can be fetched ahead, in a round trip made anyway, and is
  used only if no statement has run since (:meth:`StatementRunner._recall`);
- a statement the caller says is the transaction's last (a receive's lock) travels with the
  ledger, the notification and ``COMMIT`` (``last`` of :meth:`StatementRunner._fetch_all`).

The runner reaches the server through a :class:`Wire`, whose every call is awaited: psycopg's
blocking connection (:class:`BlockingWire`, whose awaits never suspend, so that
:func:`~poisonq.engine.driving.drive` runs a transaction in one step) or its asyncio one
(:class:`AsyncWire`, on an event loop). The SQL above it is written once for both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from psycopg import AsyncConnection, AsyncPipeline, Connection, Cursor, Pipeline

from poisonq.store.base import Ledger
from poisonq.store.history import HistoryBuffer, HistoryKeeper, buckets
from poisonq.store.history_sql import HistoryTables
from poisonq.store.rows import HELD_COUNT
from poisonq.store.shared_sql import Params, for_postgres

NOTIFY_CHANNEL = "poisonq"

_LEDGER = Ledger.__slots__
_FLUSH_LEDGER = (
    "UPDATE entities SET "
    + ", ".join(f"{name} = {name} + %b" for name in _LEDGER)
    + " WHERE id = %b"
)

_BUCKETS = "unnest(%(spans)b::int[], %(buckets)b::bigint[]) AS b(span, bucket)"
# Rows in key order, so that concurrent writers of several rows take their locks in one order.
# The first change of a bucket records the depth before it and the peak so far; later ones
# raise the peak when they pass it, and otherwise write nothing (as SQLite's).
_RECORD_DEPTHS = (
    "INSERT INTO depth_history AS h (entity_id, span, bucket, opened, peak)"
    f" SELECT e.id, b.span, b.bucket, {HELD_COUNT} - c.change,"
    f" greatest({HELD_COUNT} - c.change, {HELD_COUNT})"
    " FROM unnest(%(ids)b::bigint[], %(changes)b::bigint[]) AS c(id, change)"
    f" JOIN entities e ON e.id = c.id, {_BUCKETS} ORDER BY 1, 2, 3"
    " ON CONFLICT (entity_id, span, bucket) DO UPDATE SET peak = excluded.peak"
    " WHERE h.peak IS NULL OR excluded.peak > h.peak"
)
_RECORD_DEAD_LETTERS = (
    "INSERT INTO dead_letter_history"
    " (entity_id, span, bucket, reason, subject, fingerprint, count)"
    " SELECT d.id, b.span, b.bucket, d.reason, d.subject, d.fingerprint, d.n"
    " FROM unnest(%(ids)b::bigint[], %(reasons)b::text[], %(subjects)b::text[],"
    " %(fingerprints)b::text[], %(counts)b::bigint[])"
    f" AS d(id, reason, subject, fingerprint, n), {_BUCKETS} ORDER BY 1, 2, 3, 4, 5, 6"
    " ON CONFLICT (entity_id, span, bucket, reason, subject, fingerprint)"
    " DO UPDATE SET count = dead_letter_history.count + excluded.count"
)


Arguments = Sequence[Any] | dict[str, Any]  # a statement's, by position or by name


class Results(Protocol):
    """A statement's results, read once the pipeline has them (``rowcount``: after a sync)."""

    @property
    def rowcount(self) -> int: ...

    async def fetchall(self) -> list[Any]: ...

    async def fetchone(self) -> Any | None: ...


class Wire(Protocol):
    """The connection of one transaction, in pipeline mode."""

    async def execute(self, sql: str, params: Arguments = ()) -> Results:
        """Queue a statement (binary results); nothing waits for it until a result is read."""

    async def sync(self) -> None:
        """Wait for every statement queued so far."""

    async def end(self) -> None:
        """Leave pipeline mode: one sync, every result read."""


class BlockingResults:
    """A blocking cursor's results, awaitable: each read returns at once, never suspends."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Cursor[Any]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    async def fetchone(self) -> Any | None:
        return self._cursor.fetchone()


class BlockingWire:
    """psycopg's blocking connection and pipeline; ``end`` leaves the pipeline."""

    __slots__ = ("_conn", "_end", "_pipeline")

    def __init__(self, conn: Connection[Any], pipeline: Pipeline, end: Callable[[], None]) -> None:
        self._conn, self._pipeline, self._end = conn, pipeline, end

    async def execute(self, sql: str, params: Arguments = ()) -> Results:
        return BlockingResults(self._conn.execute(sql, params, binary=True))

    async def sync(self) -> None:
        self._pipeline.sync()

    async def end(self) -> None:
        self._end()


class AsyncWire:
    """psycopg's asyncio connection and pipeline (its cursors are the results as they are);
    ``end`` leaves the pipeline."""

    __slots__ = ("_conn", "_end", "_pipeline")

    def __init__(
        self,
        conn: AsyncConnection[Any],
        pipeline: AsyncPipeline,
        end: Callable[[], Awaitable[None]],
    ) -> None:
        self._conn, self._pipeline, self._end = conn, pipeline, end

    async def execute(self, sql: str, params: Arguments = ()) -> Results:
        return await self._conn.execute(sql, params, binary=True)

    async def sync(self) -> None:
        await self._pipeline.sync()

    async def end(self) -> None:
        await self._end()


class StatementRunner(HistoryTables):
    """The connection of one transaction, with the pending ledger, the history it writes with
    the commit, and the answers fetched ahead. The store's SQL lives in its subclasses."""

    def __init__(self, wire: Wire, keeper: HistoryKeeper) -> None:
        self._wire = wire
        self._ledger: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_LEDGER, 0))
        self._keeper = keeper
        self.history = HistoryBuffer()  # written with the commit, after the ledger
        self._wakes = False  # whether this transaction made a message receivable
        self._receiving: int | None = None  # the entity a receive follows a settlement of
        self._statements = 0
        self._names: dict[int, str] = {}  # the entities it read, by id: to name one deleted
        self._cover_locks: set[int] = set()  # the entities whose cover lock this one holds
        self._exclusive: set[int] = set()  # the entities whose cover lock it holds exclusive
        self._leasing: set[int] = set()  # the entities it will take a lease of
        # The covers (consumer, number) whose lock ran out that this one swept, by entity.
        self._expired_covers: dict[int, list[tuple[str, int]]] = {}
        # Answers fetched ahead of the call that needs them, in a round trip that was made
        # anyway; valid only while no other statement has run (see _recall).
        self._ahead: dict[tuple[Any, ...], Any] = {}
        self._ahead_at = 0
        self.committed = False

    async def _run(self, sql: str, params: Arguments = (), *, reads: bool = False) -> Results:
        """Queue a statement in the pipeline (nothing waits for it until a result is read).
        ``reads``: it changes nothing an answer fetched ahead could depend on (a lock)."""
        if self.committed:
            raise RuntimeError("a statement after the one the caller said was the last")
        if not reads:
            self._statements += 1
        return await self._wire.execute(sql, params)

    async def _fetch_all(
        self, sql: str, params: Arguments = (), *, last: bool = False
    ) -> list[tuple[Any, ...]]:
        """The statement's rows; with ``last``, the transaction commits in the same round
        trip (the statement must not change the ledger: that is written before it)."""
        cur = await self._run(sql, params)
        if last:
            await self.commit()
        return await cur.fetchall()

    async def commit(self) -> None:
        """Write the ledger and the history, notify the listeners if a message became
        receivable, and commit: one round trip, with any statement still queued. The store
        calls it at the end of the transaction unless a last statement did already."""
        if self.committed:
            return
        await self.flush_ledger()
        if self.history:
            await self._write_history()
        if self._wakes:
            await self._wire.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))
        await self._wire.execute("COMMIT")
        await self._wire.end()
        self.committed = True

    # The primitives of the statements both stores share (poisonq.store.shared_sql).
    async def _query(self, sql: str, params: Params) -> list[tuple[Any, ...]]:
        return await self._fetch_all(for_postgres(sql), params)

    async def _update(self, sql: str, params: Params) -> int:
        return await self._changed(for_postgres(sql), params)

    async def _execute(self, sql: str, params: Params) -> None:
        await self._run(for_postgres(sql), params)

    def _list(self, values: Sequence[Any]) -> list[Any]:
        return list(values)

    def _in_list(self, name: str) -> str:
        return f"= ANY(:{name})"

    async def _changed(self, sql: str, params: Arguments = ()) -> int:
        """Run a statement and return how many rows it changed (which waits for it)."""
        cur = await self._run(sql, params)
        await self._wire.sync()
        return cur.rowcount

    def _remember(self, key: tuple[Any, ...], value: Any) -> None:
        if self._ahead_at != self._statements:
            self._ahead, self._ahead_at = {}, self._statements
        self._ahead[key] = value

    def _recall(self, key: tuple[Any, ...]) -> Any:
        """A value fetched ahead, if this transaction has run no statement since: nothing it
        did can have changed the answer (which other transactions may change at any time,
        as they may between any two statements)."""
        if self._ahead_at != self._statements:
            return None
        return self._ahead.pop(key, None)

    def _made_receivable(self, count: int = 1) -> None:
        """The commit notifies the listeners (see :class:`~poisonq.store.ledger.LedgerCounts`):
        a waiting receiver wakes at once instead of at its next poll."""
        self._wakes = self._wakes or count > 0

    def _add_to_ledger(self, entity_id: int, **deltas: int) -> None:
        """Add ``deltas`` to the entity's ledger at commit (see the module docstring)."""
        ledger = self._ledger[entity_id]
        for name, delta in deltas.items():
            ledger[name] += delta
        self.history.bump(entity_id, deltas)

    async def _write_history(self) -> None:
        """Queue the writes of what this transaction added to the history (after the
        ledger, before ``COMMIT``: see :meth:`commit`), and a prune when one is due."""
        now, prune = self._keeper.stamp()
        spans, starts = zip(*buckets(now), strict=True)
        at = {"spans": list(spans), "buckets": list(starts)}
        if depths := self.history.depth_rows():
            ids, changes = zip(*depths, strict=True)
            await self._run(_RECORD_DEPTHS, {**at, "ids": list(ids), "changes": list(changes)})
        if dead := self.history.dead_rows():
            ids, reasons, subjects, fingerprints, counts = zip(*dead, strict=True)
            columns = {"ids": ids, "reasons": reasons, "subjects": subjects}
            columns |= {"fingerprints": fingerprints, "counts": counts}
            await self._run(
                _RECORD_DEAD_LETTERS, {**at, **{k: list(v) for k, v in columns.items()}}
            )
        if prune:
            await self._prune_history(now)

    async def flush_ledger(self) -> None:
        """Write the ledger changes so far, entities in id order, in one round trip. The
        store calls it just before ``COMMIT``, and entity reads call it so that a transaction
        always reads its own changes."""
        changes = [
            (*ledger.values(), entity_id)
            for entity_id, ledger in sorted(self._ledger.items())
            if any(ledger.values())
        ]
        self._ledger.clear()
        for change in changes:  # queued: cheaper than executemany for the usual one or two
            await self._run(_FLUSH_LEDGER, change)
