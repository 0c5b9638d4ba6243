"""Whether an entity has anything due on the store's clock, in both stores: the cheap read
every reader makes before it reads, so that an idle read stays a read and only a read that
finds something due takes a write transaction to apply it (the engine's
:mod:`~poisonq.engine.housekeeping`).

One statement, three probes, each a seek on an index: ``messages_by_state`` for the locks
that ran out, the partial ``messages_scheduled`` for the scheduled messages whose time has
come (the entity's own, and its retry subqueue's whose cycle delay has passed), the partial
``messages_expiring`` for the messages past their time to live. A deferred message is not
among them: it never expires (Service Bus). A fourth probe looks for the lease covers that ran
out, among the few leases that have one.

The locks that ran out are found among the entity's locked messages (the index holds no
``locked_until``): a read pays as much as a receive's own sweep does, nothing when nothing is
locked.
"""

from __future__ import annotations

from poisonq.store.shared_sql import SharedStatements


class HousekeepingStatements(SharedStatements):
    """The housekeeping reads of both stores' transactions."""

    # What a store adds to the probes: PostgreSQL fences each subquery off (OFFSET 0), or
    # its planner merges the state condition of the probe by expires_at in and walks every
    # active message of the entity by the state index instead, and turns the probes of
    # every entity into one hashed scan of the whole table.
    _FENCE = ""

    def _probes(self, entity: str, scheduled_in: str) -> str:
        """Whether anything of ``entity`` (an expression) is due, with its scheduled
        messages looked for in the entities ``scheduled_in``."""
        fence = self._FENCE
        return (
            f"EXISTS (SELECT 1 FROM messages WHERE entity_id = {entity} AND state = 'locked'"
            f"   AND locked_until <= :now{fence})"
            f" OR EXISTS (SELECT 1 FROM messages WHERE entity_id IN {scheduled_in}"
            f"   AND state = 'scheduled' AND visible_at <= :now{fence})"
            " OR EXISTS (SELECT 1 FROM (SELECT state FROM messages"
            f"   WHERE entity_id = {entity} AND expires_at <= :now{fence}) AS m"
            "   WHERE state IN ('scheduled', 'active'))"
            # A lease's cover that ran out is a run of locks that ran out (no message row
            # says so).
            f" OR EXISTS (SELECT 1 FROM leases WHERE entity_id = {entity}"
            f"   AND cover_lo IS NOT NULL AND locked_until <= :now{fence})"
        )

    async def housekeeping_due(self, entity_id: int, cycle_id: int, now: float) -> bool:
        (row,) = await self._query(
            f"SELECT {self._probes(':e', '(:e, :cycle)')}",
            {"e": entity_id, "cycle": cycle_id, "now": now},
        )
        return bool(row[0])

    async def entities_due(self, now: float) -> list[str]:
        rows = await self._query(
            f"SELECT name FROM entities e WHERE {self._probes('e.id', '(e.id)')} ORDER BY name",
            {"now": now},
        )
        return [row[0] for row in rows]
