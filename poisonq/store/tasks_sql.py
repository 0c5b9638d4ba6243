"""Bulk tasks in both stores: the row that records a task's kind, what it selects, and how
far it got. Selecting a task's messages differs (SQLite leaves out what a lease's cover holds,
PostgreSQL locks what it selects) and stays in each store."""

from __future__ import annotations

import json
from typing import Any

from poisonq.store.base import TaskRecord
from poisonq.store.shared_sql import SharedStatements


class TaskStatements(SharedStatements):
    """The task methods of both stores' transactions."""

    def insert_task(
        self, kind: str, entity_id: int, spec: dict[str, Any], total: int, now: float
    ) -> int:
        ((task_id,),) = self._query(
            "INSERT INTO tasks (kind, entity_id, status, spec, total, created_at, updated_at)"
            " VALUES (:kind, :entity, 'running', :spec, :total, :now, :now) RETURNING id",
            {
                "kind": kind,
                "entity": entity_id,
                "spec": json.dumps(spec),
                "total": total,
                "now": now,
            },
        )
        return int(task_id)

    def task(self, task_id: int) -> TaskRecord | None:
        rows = self._query(
            "SELECT id, kind, entity_id, status, spec, total, done, created_at, updated_at, error"
            " FROM tasks WHERE id = :id",
            {"id": task_id},
        )
        if not rows:
            return None
        task_id, kind, entity_id, status, spec, total, done, created, updated, error = rows[0]
        return TaskRecord(
            task_id, kind, entity_id, status, json.loads(spec), total, done, created, updated, error
        )

    def update_task(
        self, task_id: int, done: int, status: str, error: str | None, now: float
    ) -> None:
        self._execute(
            "UPDATE tasks SET done = :done, status = :status, error = :error, updated_at = :now"
            " WHERE id = :id",
            {"done": done, "status": status, "error": error, "now": now, "id": task_id},
        )
