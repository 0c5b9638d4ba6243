"""Bulk tasks in both stores: the row that records a task's kind, what it selects, and how
far it got. Selecting a task's messages differs (SQLite leaves out what a lease's cover holds,
PostgreSQL locks what it selects) and stays in each store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from poisonq.store.base import TaskRecord
from poisonq.store.shared_sql import SharedStatements


class TaskStatements(SharedStatements):
    """The task methods of both stores' transactions."""

    async def insert_task(
        self,
        kind: str,
        entity_id: int,
        spec: dict[str, Any],
        total: int,
        now: float,
        started_by: str | None,
    ) -> int:
        ((task_id,),) = await self._query(
            "INSERT INTO tasks (kind, entity_id, status, spec, total, created_at, updated_at,"
            " started_by) VALUES (:kind, :entity, 'running', :spec, :total, :now, :now, :by)"
            " RETURNING id",
            {
                "kind": kind,
                "entity": entity_id,
                "spec": json.dumps(spec),
                "total": total,
                "now": now,
                "by": started_by,
            },
        )
        return int(task_id)

    async def task(self, task_id: int) -> TaskRecord | None:
        rows = await self._query(f"{_SELECT} WHERE t.id = :id", {"id": task_id})
        return _record(rows[0]) if rows else None

    async def tasks(
        self, entity_id: int | None, before_id: int | None, limit: int, running: bool = False
    ) -> list[TaskRecord]:
        params: dict[str, Any] = {"entity": entity_id, "before": before_id, "limit": limit}
        conditions = [  # fixed fragments: the values are bound
            *(["t.entity_id = :entity"] if entity_id is not None else []),
            *(["t.id < :before"] if before_id is not None else []),
            *(["t.status = 'running'"] if running else []),
        ]
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        rows = await self._query(f"{_SELECT}{where} ORDER BY t.id DESC LIMIT :limit", params)
        return [_record(row) for row in rows]

    async def update_task(
        self,
        task_id: int,
        done: int,
        status: str,
        error: str | None,
        now: float,
        cancelled_by: str | None = None,
    ) -> None:
        await self._execute(
            "UPDATE tasks SET done = :done, status = :status, error = :error, updated_at = :now,"
            " cancelled_by = COALESCE(:by, cancelled_by) WHERE id = :id",
            {
                "done": done,
                "status": status,
                "error": error,
                "now": now,
                "by": cancelled_by,
                "id": task_id,
            },
        )


_SELECT = (
    "SELECT t.id, t.kind, t.entity_id, e.name, t.status, t.spec, t.total, t.done, t.created_at,"
    " t.updated_at, t.error, t.started_by, t.cancelled_by"
    " FROM tasks t JOIN entities e ON e.id = t.entity_id"
)


def _record(row: Sequence[Any]) -> TaskRecord:
    task_id, kind, entity_id, name, status, spec, total, done, created, updated, *rest = row
    error, started_by, cancelled_by = rest
    return TaskRecord(
        task_id, kind, entity_id, name, status, json.loads(spec), total, done, created, updated,
        error, started_by, cancelled_by,
    )  # fmt: skip
