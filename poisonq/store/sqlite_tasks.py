"""What a bulk task selects in the SQLite store: the unlocked messages that match a filter,
leaving out those a lease's cover holds (the task rows are :mod:`poisonq.store.tasks_sql`)."""

from __future__ import annotations

import sqlite3

from poisonq.store.base import NO_VALUE, MessageFilter
from poisonq.store.dead_letters_sql import DeadLetterAnalysis
from poisonq.store.sqlite_leases import SqliteLeases
from poisonq.store.sqlite_rows import filter_clauses

# The states of held messages nobody holds a lock on (a lease's cover aside).
UNLOCKED = ("scheduled", "active", "deferred", "dead_lettered")
UNLOCKED_SQL = "('scheduled', 'active', 'deferred', 'dead_lettered')"


class SqliteTasks(SqliteLeases, DeadLetterAnalysis):
    """The selection methods of :class:`poisonq.store.sqlite.SqliteTransaction`."""

    _db: sqlite3.Connection

    async def select(
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
        covered = await self._covered_clause(entity_id)
        if _one_group(where):  # the group's index, in order: a page costs its size
            rows = self._db.execute(
                f"SELECT seq FROM messages WHERE entity_id = ? AND state IN {UNLOCKED_SQL}"
                f" AND seq > ?{clauses} AND NOT {covered} ORDER BY seq {order} LIMIT ?",
                (entity_id, after_seq, *params, limit),
            )
            return [row[0] for row in rows]
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

    async def count_matching(
        self, entity_id: int, where: MessageFilter, aggregated: bool = False
    ) -> int:
        clauses, params = filter_clauses(where)
        covered = await self._covered_clause(entity_id)
        kept = await self._kept_count(entity_id, where) if aggregated else None
        if kept is not None:  # less the locked ones (by the state index, unless covered)
            locks = "INDEXED BY messages_by_state WHERE entity_id = ? AND state = 'locked'"
            if covered != "0":
                locks = (
                    f"WHERE entity_id = ? AND (state = 'locked' OR state IN {UNLOCKED_SQL}"
                    f" AND {covered})"
                )
            (locked,) = self._db.execute(
                f"SELECT count(*) FROM messages {locks}{clauses}", (entity_id, *params)
            ).fetchone()
            return kept - int(locked)
        (n,) = self._db.execute(
            f"SELECT count(*) FROM messages WHERE entity_id = ? AND state IN {UNLOCKED_SQL}"
            f"{clauses} AND NOT {covered}",
            (entity_id, *params),
        ).fetchone()
        return int(n)


def _one_group(where: MessageFilter) -> bool:
    """Whether ``where`` names one reason or fingerprint (which an index of its own keeps in
    sequence order)."""
    return any(
        value is not None and value is not NO_VALUE for value in (where.reason, where.fingerprint)
    )
