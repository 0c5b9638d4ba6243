"""Entities in both stores: their rows (options, status, the rollback counter), the span of
their messages' sequence numbers, and their duplicate-detection ids (looked up, and forgotten
once past their time; each store remembers them its own way, an upsert of many rows).

Finding an entity by name stays in each store (PostgreSQL fetches the whole family in that
round trip), and PostgreSQL adds its ledger and its answers fetched ahead to the reads here;
deleting an entity and the ledger are each store's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from poisonq.errors import EntityExistsError
from poisonq.model import EntityStatus, SubQueue
from poisonq.store.base import EntityRecord
from poisonq.store.rows import ENTITY_COLUMNS, entity_row
from poisonq.store.shared_sql import SharedStatements


class EntityStatements(SharedStatements):
    """The entity methods of both stores' transactions."""

    async def insert_entity(
        self,
        name: str,
        parent_id: int | None,
        subqueue: SubQueue | None,
        options: str,
        now: float,
    ) -> int:
        rows = await self._query(
            "INSERT INTO entities (name, parent_id, subqueue, options, created_at, updated_at)"
            " VALUES (:name, :parent, :subqueue, :options, :now, :now)"
            " ON CONFLICT (name) DO NOTHING RETURNING id",
            {
                "name": name,
                "parent": parent_id,
                "subqueue": subqueue,
                "options": options,
                "now": now,
            },
        )
        if not rows:
            raise EntityExistsError(name)
        return int(rows[0][0])

    async def entity_by_id(self, entity_id: int) -> EntityRecord:
        (row,) = await self._query(
            f"SELECT {ENTITY_COLUMNS} FROM entities WHERE id = :id", {"id": entity_id}
        )
        return entity_row(row)

    async def entities(self) -> list[EntityRecord]:
        rows = await self._query(f"SELECT {ENTITY_COLUMNS} FROM entities ORDER BY name", {})
        return [entity_row(row) for row in rows]

    async def set_options(self, entity_id: int, options: str, now: float) -> None:
        await self._execute(
            "UPDATE entities SET options = :options, updated_at = :now WHERE id = :id",
            {"options": options, "now": now, "id": entity_id},
        )

    async def set_status(
        self, entity_id: int, status: EntityStatus, cause: str | None, now: float
    ) -> None:
        await self._execute(
            "UPDATE entities SET status = :status, status_cause = :cause, updated_at = :now"
            " WHERE id = :id",
            {"status": status.value, "cause": cause, "now": now, "id": entity_id},
        )

    async def add_rollbacks(self, entity_id: int, count: int) -> int:
        # Written at once, not with the ledger at commit: the engine decides on the total.
        ((total,),) = await self._query(
            "UPDATE entities SET rollbacks = rollbacks + :count WHERE id = :id RETURNING rollbacks",
            {"count": count, "id": entity_id},
        )
        return int(total)

    async def reset_rollbacks(self, entity_id: int) -> None:
        # A counter at 0 is left unwritten (PostgreSQL would write a new row version).
        await self._execute(
            "UPDATE entities SET rollbacks = 0 WHERE id = :id AND rollbacks != 0",
            {"id": entity_id},
        )

    async def seq_span(self, entity_id: int) -> tuple[int, int, int]:
        ((count, lo, hi),) = await self._query(
            "SELECT count(*), min(seq), max(seq) FROM messages WHERE entity_id = :entity",
            {"entity": entity_id},
        )
        return (count, lo, hi) if count else (0, 0, -1)

    async def seen_message_ids(
        self, entity_id: int, message_ids: Sequence[str], now: float
    ) -> set[str]:
        rows = await self._query(
            "SELECT message_id FROM seen_message_ids WHERE entity_id = :entity"
            f" AND expires_at > :now AND message_id {self._in_list('ids')}",
            {"entity": entity_id, "now": now, "ids": self._list(message_ids)},
        )
        return {row[0] for row in rows}

    async def forget_message_ids(self, now: float) -> int:
        return await self._update(
            "DELETE FROM seen_message_ids WHERE expires_at <= :now", {"now": now}
        )
