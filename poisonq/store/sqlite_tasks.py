"""Dead-letter analysis and bulk tasks in the SQLite store."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from poisonq.store.base import MessageFilter, TaskRecord
from poisonq.store.sqlite_leases import SqliteLeases
from poisonq.store.sqlite_rows import filter_clauses

# The states of held messages nobody holds a lock on (a lease's cover aside).
UNLOCKED = ("scheduled", "active", "deferred", "dead_lettered")
UNLOCKED_SQL = "('scheduled', 'active', 'deferred', 'dead_lettered')"


class SqliteTasks(SqliteLeases):
    """The dead-letter grouping, selection and task methods of
    :class:`poisonq.store.sqlite.SqliteTransaction`."""

    _db: sqlite3.Connection

    def select(
        self,
        entity_id: int,
        where: MessageFilter,
        after_seq: int,
        limit: int,
        newest_first: bool = False,
    ) -> list[int]:
        # One ordered walk of the state index per unlocked state, merged: a chunk of a task
        # costs its size, however many messages the entity holds (``state != 'locked'``
        # would read all of them and sort).
        clauses, params = filter_clauses(where)
        order = "DESC" if newest_first else "ASC"
        covered = self._covered_clause(entity_id)
        part = (
            "SELECT seq FROM (SELECT seq FROM messages WHERE entity_id = ? AND state = ?"
            f" AND seq > ?{clauses} AND NOT {covered} ORDER BY seq {order} LIMIT ?)"
        )
        rows = self._db.execute(
            " UNION ALL ".join([part] * len(UNLOCKED)) + f" ORDER BY seq {order} LIMIT ?",
            [
                *(p for state in UNLOCKED for p in (entity_id, state, after_seq, *params, limit)),
                limit,
            ],
        )
        return [row[0] for row in rows]

    def count_matching(self, entity_id: int, where: MessageFilter) -> int:
        clauses, params = filter_clauses(where)
        (n,) = self._db.execute(
            f"SELECT count(*) FROM messages WHERE entity_id = ? AND state IN {UNLOCKED_SQL}"
            f"{clauses} AND NOT {self._covered_clause(entity_id)}",
            (entity_id, *params),
        ).fetchone()
        return int(n)

    def insert_task(
        self, kind: str, entity_id: int, spec: dict[str, Any], total: int, now: float
    ) -> int:
        cur = self._db.execute(
            "INSERT INTO tasks (kind, entity_id, status, spec, total, created_at, updated_at)"
            " VALUES (?, ?, 'running', ?, ?, ?, ?)",
            (kind, entity_id, json.dumps(spec), total, now, now),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def task(self, task_id: int) -> TaskRecord | None:
        row = self._db.execute(
            "SELECT id, kind, entity_id, status, spec, total, done, created_at, updated_at, error"
            " FROM tasks WHERE id = ?",
            (task_id,),
        ).fetchone()
        if row is None:
            return None
        task_id, kind, entity_id, status, spec, total, done, created, updated, error = row
        return TaskRecord(
            task_id, kind, entity_id, status, json.loads(spec), total, done, created, updated, error
        )

    def update_task(
        self, task_id: int, done: int, status: str, error: str | None, now: float
    ) -> None:
        self._db.execute(
            "UPDATE tasks SET done = ?, status = ?, error = ?, updated_at = ? WHERE id = ?",
            (done, status, error, now, task_id),
        )
