"""How the PostgreSQL store runs the statements of one transaction.

A transaction runs in pipeline mode: a statement is sent when it is queued, and the client
waits only when it reads a result. What no one waits for (``BEGIN``, the ledger, ``NOTIFY``)
travels with the next statement that is waited for. Two more things save round trips:

- the ledger is kept in memory during the transaction and written in one statement just
  before ``COMMIT`` (see :meth:`StatementRunner.flush_ledger`);
- an answer the next call will need can be fetched ahead, in a round trip made anyway, and is
  used only if no statement has run since (:meth:`StatementRunner._recall`);
- a statement the caller says is the transaction's last (a receive's lock) travels with the
  ledger, the notification and ``COMMIT`` (:meth:`StatementRunner._last_or_all`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import Connection, Cursor, Pipeline

from poisonq.store.base import Ledger

NOTIFY_CHANNEL = "poisonq"

_LEDGER = Ledger.__slots__
_FLUSH_LEDGER = (
    "UPDATE entities SET "
    + ", ".join(f"{name} = {name} + %b" for name in _LEDGER)
    + " WHERE id = %b"
)


class StatementRunner:
    """The connection of one transaction, with the pending ledger and the answers fetched
    ahead. The store's SQL lives in its subclasses."""

    def __init__(self, conn: Connection[Any], pipeline: Pipeline, end: Callable[[], None]) -> None:
        self._db = conn
        self._pipeline = pipeline
        self._end = end  # leaves pipeline mode: one sync, every result read
        self._ledger: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_LEDGER, 0))
        self.notify = False  # whether this transaction made a message receivable
        self._statements = 0
        # Answers fetched ahead of the call that needs them, in a round trip that was made
        # anyway; valid only while no other statement has run (see _recall).
        self._ahead: dict[tuple[Any, ...], Any] = {}
        self._ahead_at = 0
        self.committed = False

    def _run(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Cursor[Any]:
        """Queue a statement in the pipeline (nothing waits for it until a result is read)."""
        if self.committed:
            raise RuntimeError("a statement after the one the caller said was the last")
        self._statements += 1
        return self._db.execute(sql, params, binary=True)

    def _all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(sql, params).fetchall()

    def _last_or_all(
        self, last: bool, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        """:meth:`_all`; with ``last``, the transaction commits in the same round trip (the
        statement must not change the ledger: that is written before it)."""
        cur = self._run(sql, params)
        if last:
            self.commit()
        return cur.fetchall()

    def commit(self) -> None:
        """Write the ledger, notify the listeners if a message became receivable, and
        commit: one round trip, with any statement still queued. The store calls it at the
        end of the transaction unless a last statement did already."""
        if self.committed:
            return
        self.flush_ledger()
        if self.notify:
            self._db.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))
        self._db.execute("COMMIT")
        self._end()
        self.committed = True

    def _count(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run a statement and return how many rows it changed (which waits for it)."""
        cur = self._run(sql, params)
        self._pipeline.sync()
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

    def _bump(self, entity_id: int, **deltas: int) -> None:
        """Add ``deltas`` to the entity's ledger at commit (see the module docstring)."""
        ledger = self._ledger[entity_id]
        for name, delta in deltas.items():
            ledger[name] += delta

    def flush_ledger(self) -> None:
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
            self._run(_FLUSH_LEDGER, change)
