"""What each transition adds to the ledger that ``audit`` checks, and whether it made
messages receivable: stated once, for both stores.

Every entity keeps lifetime counters (:class:`~poisonq.store.base.Ledger`) with
``sent + moved_in = completed + dropped + moved_out + held`` at every commit. A store's
transaction calls the method here named for what it did, in the same transaction; how the
counts reach the ``entities`` row (an ``UPDATE`` per call on SQLite, one per entity at commit
on PostgreSQL) is the store's own :meth:`LedgerCounts._add_to_ledger`.

A message counted into an entity (sent, moved in) or back into its queue (abandoned, its lock
run out) is one a receiver may now take, so the same calls tell the store so
(:meth:`LedgerCounts._made_receivable`): a new transition that adds messages cannot balance the
ledger and forget to wake the waiting receivers. The few that make messages receivable without
a ledger change (a lock given back uncounted, a scheduled message come due, an entity enabled,
a session given up) call it themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

Move = Literal["dead_lettered", "resubmitted"]  # the counter of a move that has one


class LedgerCounts(ABC):
    @abstractmethod
    def _add_to_ledger(self, entity_id: int, **deltas: int) -> None:
        """Add ``deltas`` to the entity's counters (and to its history)."""

    @abstractmethod
    def _made_receivable(self, count: int = 1) -> None:
        """``count`` messages became receivable in this transaction (see the module
        docstring): its commit must wake the receivers waiting on the store."""

    def _count_sent(self, entity_id: int, count: int, size: int) -> None:
        self._add_to_ledger(entity_id, sent=count, size_bytes=size)
        self._made_receivable(count)

    def _count_completed(self, entity_id: int, count: int, size: int) -> None:
        self._add_to_ledger(entity_id, completed=count, size_bytes=-size)

    def _count_dropped(self, entity_id: int, count: int, size: int) -> None:
        self._add_to_ledger(entity_id, dropped=count, size_bytes=-size)

    def _count_moved(
        self, source: int, destination: int, count: int, size: int, why: Move | None = None
    ) -> None:
        """Messages that left ``source`` for ``destination`` (a subqueue, its queue, a
        transfer), counted out of one and into the other; a dead-lettering or a resubmit
        counts under its own name too."""
        reason = {why: count} if why else {}
        self._add_to_ledger(source, moved_out=count, size_bytes=-size, **reason)
        self._add_to_ledger(destination, moved_in=count, size_bytes=size)
        self._made_receivable(count)

    async def count_poisoned(self, entity_id: int, count: int) -> None:
        """Messages the retry policy dead-lettered or dropped (counted besides the move or
        the drop itself)."""
        self._add_to_ledger(entity_id, poisoned=count)

    def _count_returned(self, entity_id: int, count: int, lock_expired: bool) -> None:
        """Messages back in the queue, by a receiver's abandon or their lock's expiry."""
        if lock_expired:
            self._add_to_ledger(entity_id, lock_expiries=count)
        else:
            self._add_to_ledger(entity_id, abandoned=count)
        self._made_receivable(count)
