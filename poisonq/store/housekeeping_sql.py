"""Whether an entity has anything due on the store's clock, in both stores: the cheap read
every reader makes before it reads, so that an idle read stays a read and only a read that
finds something due takes a write transaction to apply it (the engine's
:mod:`~poisonq.engine.housekeeping`).

One statement, three probes, each a seek on an index: ``messages_by_state`` for the locks
that ran out, the partial ``messages_scheduled`` for the scheduled messages whose time has
come (the entity's own, and its retry subqueue's whose cycle delay has passed), the partial
``messages_expiring`` for the messages past their time to live. A deferred message is not
among them: it never expires (Service Bus). SQLite adds the lease covers that ran out.
"""

from __future__ import annotations

from poisonq.store.shared_sql import SharedStatements

_DUE = (
    "SELECT EXISTS (SELECT 1 FROM messages WHERE entity_id = :e AND state = 'locked'"
    "   AND locked_until <= :now)"
    " OR EXISTS (SELECT 1 FROM messages WHERE entity_id IN (:e, :cycle)"
    "   AND state = 'scheduled' AND visible_at <= :now)"
    " OR EXISTS (SELECT 1 FROM messages WHERE entity_id = :e AND expires_at <= :now"
    "   AND state IN ('scheduled', 'active'))"
)


class HousekeepingStatements(SharedStatements):
    """The housekeeping read of both stores' transactions."""

    def housekeeping_due(self, entity_id: int, cycle_id: int, now: float) -> bool:
        (row,) = self._query(_DUE, {"e": entity_id, "cycle": cycle_id, "now": now})
        return bool(row[0])
