"""What a bulk task selects in the SQLite store: the unlocked messages that match a filter,
leaving out those a lease's cover holds (the task rows are :mod:`poisonq.store.tasks_sql`)."""

from __future__ import annotations

import sqlite3

from poisonq.store.base import MessageFilter
from poisonq.store.sqlite_leases import SqliteLeases
from poisonq.store.sqlite_rows import filter_clauses

# The states of held messages nobody holds a lock on (a lease's cover aside).
UNLOCKED = ("scheduled", "active", "deferred", "dead_lettered")
UNLOCKED_SQL = "('scheduled', 'active', 'deferred', 'dead_lettered')"


class SqliteTasks(SqliteLeases):
    """The selection methods of :class:`poisonq.store.sqlite.SqliteTransaction`."""

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
