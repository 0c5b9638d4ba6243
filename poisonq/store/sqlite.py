"""The SQLite store: one file in WAL mode, safe for several processes at once.

Write transactions start with ``BEGIN IMMEDIATE`` so that two processes never both read and
then both try to upgrade to a write lock (which SQLite would refuse with SQLITE_BUSY); the
writer lock is taken up front and other writers wait on ``busy_timeout``. Within a process one
connection is shared behind a lock, because SQLite serializes writers anyway.

Lists of sequence numbers are bound as one JSON array and expanded with ``json_each`` so every
statement has a fixed text and stays in the statement cache. A statement assembled from parts
(a clause only some calls need, the failure record's assignments) names its parameters
(``:name``), so each part brings its own and no statement's text is rewritten to fit another's.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from poisonq.errors import (
    InvalidOptionError,
    StoreError,
    StoreFullError,
    StoreNotFoundError,
    StoreUnavailableError,
)
from poisonq.model import (
    DEAD_LETTER_QUEUES,
    HELD_STATES,
    MessageState,
    ReceivedMessage,
)
from poisonq.store.base import (
    UNSTORABLE,
    Deleted,
    EntityRecord,
    Letter,
    LockInfo,
    MessageFilter,
    NewMessage,
    Store,
    Transaction,
    all_alike,
    pending_migrations,
    unstorable,
)
from poisonq.store.entities_sql import EntityStatements
from poisonq.store.history import HistoryBuffer, HistoryKeeper
from poisonq.store.housekeeping_sql import HousekeepingStatements
from poisonq.store.leases_sql import within
from poisonq.store.ledger import LedgerCounts
from poisonq.store.rows import (
    ENTITY_COLUMNS,
    HELD_COUNT,
    HELD_IN,
    LIVE,
    STATES,
    entity_row,
    message_row,
    message_rows,
)
from poisonq.store.sessions_sql import SessionStatements
from poisonq.store.settling_sql import SettlingStatements
from poisonq.store.shared_sql import (
    ADD_SCHEMA_VERSION,
    SCHEMA_TABLE,
    SCHEMA_VERSIONS,
    Params,
)
from poisonq.store.sqlite_history import SqliteHistory
from poisonq.store.sqlite_leases import SqliteLeases
from poisonq.store.sqlite_rows import (
    INSERT_CHUNK,
    LEDGER_COLUMNS,
    MESSAGE_COLUMNS,
    OPTIONAL_COLUMNS,
    SEQS,
    filter_clauses,
    seqs_json,
)
from poisonq.store.sqlite_tasks import SqliteTasks
from poisonq.store.tasks_sql import TaskStatements
from poisonq.store.timelines_sql import TimelineStatements

# The locks that ran out: a message's own, and those of the leases whose locks ran out
# (CROSS JOIN keeps the few expired leases outside, then reads their ranges). Parameters:
# entity, now.
_EXPIRED_LOCKS = (
    "SELECT seq, delivery_count, move_count, dead_lettered_deliveries FROM messages"
    " WHERE entity_id = ?1 AND state = 'locked' AND locked_until <= ?2"
    " UNION ALL SELECT seq, delivery_count + 1, move_count, dead_lettered_deliveries"
    " FROM leases CROSS JOIN messages USING (entity_id) WHERE entity_id = ?1"
    " AND cover_lo IS NOT NULL AND leases.locked_until <= ?2"
    " AND seq BETWEEN cover_lo AND cover_hi AND leasable = 1"
    " AND state IN ('active', 'dead_lettered')"
)


# Or held by the cover whose range is bound as ``lo`` and ``hi`` (a message that a statement
# finds under a token): every ready, leasable message in a cover's range is the cover's
# (leases_sql).
_OR_IN_COVER = (
    " OR (leasable = 1 AND state IN ('active', 'dead_lettered') AND messages.seq BETWEEN :lo"
    " AND :hi)"
)

log = logging.getLogger(__name__)

# A new message's state and optional columns: a batch binds only what its messages use.
_SHAPE = attrgetter("state", *OPTIONAL_COLUMNS)

READ = "BEGIN DEFERRED"  # a reader's transaction (Store.reading)

# A message's group in its dead-letter queue's aggregates, as schema 12 keys them: reason,
# subject, fingerprint, error type (each the JSON text of its value), hour.
_GROUP_KEYS = (
    "json_quote(dead_letter_reason), json_quote(subject), json_quote(last_fingerprint),"
    " json_quote(last_error_type), CAST(coalesce(dead_lettered_at, enqueued_at) / 3600 AS INTEGER)"
    " * 3600"
)


# What counting a group in adds to its row, if it has one.
_ADDED_TO_GROUP = (
    "ON CONFLICT DO UPDATE SET count = count + excluded.count,"
    " first_at = min(first_at, excluded.first_at), last_at = max(last_at, excluded.last_at)"
)


def _counted_in(which: str) -> tuple[str, str]:
    """The statements that count the messages ``which`` selects (all in one dead-letter queue,
    just inserted or moved there) into its aggregates, a group at a time, and name the
    fingerprints it had not held before by their first message (as schema 12's triggers did,
    row by row)."""
    count = (
        "INSERT INTO dead_letter_aggregates (entity_id, reason, subject, fingerprint, error_type,"
        " bucket, count, first_at, last_at)"
        f" SELECT entity_id, {_GROUP_KEYS}, count(*), min(coalesce(dead_lettered_at, enqueued_at)),"
        f" max(coalesce(dead_lettered_at, enqueued_at)) FROM messages WHERE {which}"
        f" GROUP BY 1, 2, 3, 4, 5, 6 {_ADDED_TO_GROUP}"
    )
    name = (
        "INSERT INTO dead_letter_fingerprints (entity_id, fingerprint, error_type, description)"
        " SELECT entity_id, json_quote(last_fingerprint), last_error_type,"
        f" json_extract(failures, '$[#-1].message') FROM messages WHERE {which}"
        " AND last_fingerprint IS NOT NULL ORDER BY seq ON CONFLICT DO NOTHING"
    )
    return count, name


# Counting in messages just inserted (sequence numbers ?1 to ?2), or moved (a JSON list ?1),
# or all of a dead-letter queue's (?1, its id) when its groups are recounted.
_COUNT_INSERTED = _counted_in("seq BETWEEN ?1 AND ?2")
_COUNT_MOVED = _counted_in("seq IN (SELECT value FROM json_each(?1))")
_COUNT_ALL = _counted_in("entity_id = ?1")

# The dead-letter queues whose groups do not add up to the messages their ledger holds, by
# id and name: a process of a poisonq from before schema 18, still running when another
# opened the file and upgraded it, moves messages in without counting them (the row triggers
# that did are gone), and nothing tells it that the schema changed under it.
_DRIFTED = (
    "SELECT e.id, e.name FROM entities e LEFT JOIN dead_letter_aggregates a"
    " ON a.entity_id = e.id"
    f" WHERE e.subqueue IN ({', '.join(repr(s.value) for s in sorted(DEAD_LETTER_QUEUES))})"
    f" GROUP BY e.id HAVING coalesce(sum(a.count), 0) != {HELD_COUNT}"
)


# What the ledgers of an entity (?1) and its subqueues held as they are deleted, at ?2.
_KEEP_DELETED_LEDGERS = (
    "INSERT INTO deleted_entities (entity_id, name, deleted_at, sent, moved_in, completed,"
    " dropped, moved_out, discarded) SELECT id, name, ?2, sent, moved_in, completed, dropped,"
    " moved_out, (SELECT count(*) FROM messages WHERE entity_id = entities.id)"
    " FROM entities WHERE id = ?1 OR parent_id = ?1"
)

_DELETED_TOTALS = (
    "SELECT "
    + ", ".join(f"coalesce(sum({name}), 0)" for name in Deleted._fields)
    + " FROM deleted_entities"
)


def _record_failure(failure: str) -> str:
    """SET clauses that append a failure record (``failure``: an expression giving a JSON
    object's text, or NULL for none) to a message's history, and keep the columns dead-letter
    analysis groups by."""
    return (
        f" failures = CASE WHEN {failure} IS NULL THEN failures"
        f"   ELSE json_insert(coalesce(failures, '[]'), '$[#]', json({failure})) END,"
        f" last_error_type = coalesce(json_extract({failure}, '$.error_type'), last_error_type),"
        f" last_fingerprint = coalesce(json_extract({failure}, '$.fingerprint'),"
        "   last_fingerprint)"
    )


# The letters of a dead-lettering, bound as ``:letters``: a JSON array of [seq, reason,
# description, failure] (see Letter and _rows_json), one row each.
_LETTERS = (
    "(SELECT value ->> 0 AS sequence_number, value ->> 1 AS reason, value ->> 2 AS description,"
    " value ->> 3 AS failure FROM json_each(:letters)) AS letter"
)
# Letters that share their reason, description and failure, bound once as parameters: only
# the sequence numbers go through JSON (``:letters``: an array of them).
_ALIKE = (
    "(SELECT value AS sequence_number, :reason AS reason, :description AS description,"
    " :failure AS failure FROM json_each(:letters)) AS letter"
)
# The failures of an abandon, bound as ``:failed``: a JSON array of [seq, failure].
_FAILED = (
    "(SELECT value ->> 0 AS sequence_number, value ->> 1 AS failure"
    " FROM json_each(:failed)) AS failed"
)


def _rows_json(rows: Iterable[Sequence[Any]]) -> str:
    """Rows of a statement as one JSON array to bind, a failure record (each row's last
    item) as its own JSON text, as a single failure is bound. Text is kept as it is, not
    escaped: a lone surrogate in a reason must fail to bind as it does bound alone
    (:data:`~poisonq.store.base.UNSTORABLE`), not be stored as text no one can read back."""
    return json.dumps(
        [[*row[:-1], json.dumps(row[-1]) if row[-1] else None] for row in rows],
        ensure_ascii=False,
    )


class SqliteTransaction(
    SessionStatements,
    EntityStatements,
    TaskStatements,
    SqliteTasks,
    SqliteLeases,
    SettlingStatements,
    TimelineStatements,
    SqliteHistory,
    HousekeepingStatements,
    LedgerCounts,
    Transaction,
):
    # The aggregates' keys and hours as the triggers of schema 12 write them.
    _KEY = "json_quote({column})"
    _HOUR = "CAST({time} / 3600 AS INTEGER) * 3600"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._db = conn
        self.history = HistoryBuffer()

    # The primitives of the statements both stores share (poisonq.store.shared_sql).
    async def _query(self, sql: str, params: Params) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, params).fetchall()

    async def _update(self, sql: str, params: Params) -> int:
        return self._db.execute(sql, params).rowcount

    async def _execute(self, sql: str, params: Params) -> None:
        self._db.execute(sql, params)

    def _list(self, values: Sequence[Any]) -> str:
        return json.dumps(list(values))

    def _in_list(self, name: str) -> str:
        return f"IN (SELECT value FROM json_each(:{name}))"

    async def _returned(self, entity_id: int) -> str:
        """What ``leasable`` becomes for a message that comes (back) to ready in the entity:
        0 if a lease cover of the entity could take it for one of its own, else unchanged
        (with no cover it is as receivable as a message just sent, and keeping it so spares
        an entry in the index of unleasable messages)."""
        return "0" if await self.cover_top(entity_id) else "leasable"

    def _made_receivable(self, count: int = 1) -> None:
        """Nothing to note: every commit of a write wakes the waiting receivers
        (:meth:`SqliteStore.wait_for_change`)."""

    def _add_to_ledger(self, entity_id: int, **deltas: int) -> None:
        """Add ``deltas`` to the entity's ledger columns (names are ours, never user input)."""
        deltas = {k: v for k, v in deltas.items() if v}
        if not deltas:
            return
        assert set(deltas) <= LEDGER_COLUMNS
        self.history.bump(entity_id, deltas)
        sets = ", ".join(f"{name} = {name} + ?" for name in deltas)
        self._db.execute(f"UPDATE entities SET {sets} WHERE id = ?", (*deltas.values(), entity_id))

    # Entities -----------------------------------------------------------------------------
    async def entity(self, name: str) -> EntityRecord | None:
        row = self._db.execute(
            f"SELECT {ENTITY_COLUMNS} FROM entities WHERE name = ?", (name,)
        ).fetchone()
        return entity_row(row) if row else None

    async def delete_entity(self, entity_id: int, now: float) -> None:
        self.history = HistoryBuffer()  # nothing is kept of what goes
        self._db.execute(_KEEP_DELETED_LEDGERS, (entity_id, now))
        # Messages have no foreign key to their entity (schema 15): they are deleted here,
        # after the entity rows, whose aggregates go with them (so not through _delete:
        # nothing is left to count them out of).
        family = self._db.execute(
            "SELECT json_group_array(id) FROM entities WHERE id = ?1 OR parent_id = ?1",
            (entity_id,),
        ).fetchone()
        self._db.execute("DELETE FROM entities WHERE id = ?1 OR parent_id = ?1", (entity_id,))
        self._db.execute(f"DELETE FROM messages WHERE entity_id IN {SEQS}", family)

    async def held_counts(
        self, entity_id: int, ready: MessageState, held: int
    ) -> dict[MessageState, int]:
        others = [s for s in HELD_STATES if s is not ready]
        rows = self._db.execute(
            "SELECT state, count(*) FROM messages WHERE entity_id = ?"
            f" AND state IN {SEQS} GROUP BY state",
            (entity_id, json.dumps(others)),
        )
        counts = {STATES[state]: n for state, n in rows}
        top = await self.cover_top(entity_id)
        if top:  # the covered messages are locked, not ready
            (covered,) = self._db.execute(
                "SELECT count(*) FROM messages WHERE entity_id = ? AND state = ?"
                " AND leasable = 1 AND seq <= ?",
                (entity_id, ready, top),
            ).fetchone()
            counts[MessageState.LOCKED] = counts.get(MessageState.LOCKED, 0) + covered
        counts[ready] = held - sum(counts.values())
        return {state: n for state, n in counts.items() if n}

    async def audit_rows(self) -> tuple[list[tuple[EntityRecord, int]], Deleted]:
        held = dict(self._db.execute("SELECT entity_id, count(*) FROM messages GROUP BY entity_id"))
        deleted = Deleted(*self._db.execute(_DELETED_TOTALS).fetchone())
        return [(entity, held.get(entity.id, 0)) for entity in await self.entities()], deleted

    # Sending ------------------------------------------------------------------------------
    async def insert_messages(
        self, entity_id: int, rows: Sequence[NewMessage], now: float, *, last: bool = False
    ) -> list[int]:
        # (``last`` changes nothing here: the commit is local.)
        # Multi-row VALUES statements: about 1.5x the rows per second of executemany, which
        # steps the statement once per row. One writer at a time, so the messages get
        # consecutive sequence numbers (AUTOINCREMENT). Binding is a large part of an
        # insert's cost: a column no message of the batch uses is left out, and a batch of
        # active messages (the usual one) writes its state as a literal.
        shapes = set(map(_SHAPE, rows))  # mostly one: (state, *optional columns)
        optional = [
            c for n, c in enumerate(OPTIONAL_COLUMNS, 1) if any(s[n] is not None for s in shapes)
        ]
        bound = ["message_id", "body", "size", *optional]
        if "scheduled_at" in optional:  # a scheduled message becomes visible when scheduled
            bound.append("scheduled_at")
            optional.append("visible_at")
        marks = ["'active'", *"?" * len(bound)]
        if any(s[0] is not MessageState.ACTIVE for s in shapes):
            marks[0] = "?"
            bound.insert(0, "state")
        columns = ", ".join(["state", "message_id", "body", "size", *optional])
        row_marks = f"(?1, ?2, {', '.join(marks)})"
        values = attrgetter(*bound)
        insert = f"INSERT INTO messages (entity_id, enqueued_at, {columns}) VALUES "
        for start in range(0, len(rows), INSERT_CHUNK):
            chunk = rows[start : start + INSERT_CHUNK]
            params = [entity_id, now, *chain.from_iterable(map(values, chunk))]
            top = self._db.execute(insert + ", ".join([row_marks] * len(chunk)), params).lastrowid
        assert top is not None
        first = top - len(rows) + 1
        self._count_in(entity_id, range(first, top + 1))
        self._count_sent(entity_id, len(rows), sum(m.size for m in rows))
        return list(range(first, top + 1))

    def _count_in(self, entity_id: int, seqs: Sequence[int]) -> None:
        """Count the messages ``seqs`` just inserted or moved into the entity (a ``range`` if
        inserted) into its dead-letter aggregates if it is a dead-letter queue. Messages have
        no row triggers for them (schemas 15, 16 and 18): a row trigger runs its program for
        every row a statement writes, to ask what is the same for the whole statement. (No
        operation of the engine inserts into a dead-letter queue; the store keeps its
        aggregates exact whatever it is asked to write.)"""
        if seqs and self._is_dead_letter_queue(entity_id):
            params: tuple[object, ...]
            if isinstance(seqs, range):
                statements, params = _COUNT_INSERTED, (seqs[0], seqs[-1])
            else:
                statements, params = _COUNT_MOVED, (seqs_json(seqs),)
            for statement in statements:
                self._db.execute(statement, params)

    def _count_letters_in(self, entity_id: int, rows: list[Any], now: float) -> None:
        """Count messages just dead-lettered into the entity at ``now`` into its aggregates
        from the rows the move returned (sequence number, size, reason, subject, fingerprint,
        error type): grouped here, one upsert a group, rather than read again. A fingerprint
        is named from its first message only if a letter has one."""
        if not rows or not self._is_dead_letter_queue(entity_id):
            return
        bucket = int(now / 3600) * 3600  # as CAST(... / 3600 AS INTEGER) * 3600 keys it
        groups = Counter(row[2:6] for row in rows)
        self._db.executemany(
            "INSERT INTO dead_letter_aggregates (entity_id, reason, subject, fingerprint,"
            " error_type, bucket, count, first_at, last_at) VALUES (?6, json_quote(?1),"
            " json_quote(?2), json_quote(?3), json_quote(?4), ?7, ?5, ?8, ?8)"
            f" {_ADDED_TO_GROUP}",
            [(*key, count, entity_id, bucket, now) for key, count in groups.items()],
        )
        fingerprinted = [row[0] for row in rows if row[4] is not None]
        if fingerprinted:
            self._db.execute(_COUNT_MOVED[1], (seqs_json(sorted(fingerprinted)),))

    def _count_out(
        self, entity_id: int, where: str, params: Sequence[object] | Params, joined: str = ""
    ) -> None:
        """Count the messages ``where`` selects (from messages, ``joined`` with another table
        if given) out of the entity's dead-letter aggregates if it is a dead-letter queue,
        before they are deleted, moved away, or given new keys: a dead-letter queue's groups
        are few, so they are counted out by one grouped read and a decrement each."""
        if not self._is_dead_letter_queue(entity_id):
            return
        groups = self._db.execute(
            f"SELECT {_GROUP_KEYS}, count(*) FROM messages{joined} WHERE {where}"
            " GROUP BY 1, 2, 3, 4, 5",
            params,
        ).fetchall()
        self._db.executemany(
            "UPDATE dead_letter_aggregates SET count = count - ?6 WHERE entity_id = ?7"
            " AND reason = ?1 AND subject = ?2 AND fingerprint = ?3 AND error_type = ?4"
            " AND bucket = ?5",
            [(*group, entity_id) for group in groups],
        )
        self._db.execute(
            "DELETE FROM dead_letter_aggregates WHERE entity_id = ? AND count = 0", (entity_id,)
        )

    def _is_dead_letter_queue(self, entity_id: int) -> bool:
        (subqueue,) = self._db.execute(
            "SELECT subqueue FROM entities WHERE id = ?", (entity_id,)
        ).fetchone()
        return subqueue in DEAD_LETTER_QUEUES

    async def remember_message_ids(
        self, entity_id: int, message_ids: Sequence[str], expires_at: float
    ) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO seen_message_ids (entity_id, message_id, expires_at)"
            " VALUES (?, ?, ?)",
            [(entity_id, mid, expires_at) for mid in message_ids],
        )

    # Receiving ----------------------------------------------------------------------------
    async def lock_ready(
        self,
        entity_id: int,
        name: str,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        session_id: str | None = None,
        *,
        last: bool = False,  # a local commit: nothing to fold it into
    ) -> list[ReceivedMessage]:
        if session_id is None:  # a cover, as a lease's (see sqlite_leases)
            rows = await self._receive_batch(entity_id, ready, limit, token, locked_until)
        else:  # (sessions are never leased: their messages are locked row by row)
            rows = self._db.execute(
                "UPDATE messages SET state = 'locked', lock_token = ?5, locked_until = ?6,"
                " delivery_count = delivery_count + 1 WHERE seq IN (SELECT seq FROM messages"
                " WHERE entity_id = ?1 AND state = ?2 AND session_id = ?3 ORDER BY seq LIMIT ?4)"
                f" RETURNING {MESSAGE_COLUMNS}",
                (entity_id, ready, session_id, limit, token, locked_until),
            ).fetchall()
        rows.sort(key=lambda row: row[0])
        return message_rows(rows, name)

    async def take_ready(
        self, entity_id: int, name: str, ready: MessageState, limit: int
    ) -> list[ReceivedMessage]:
        which, top = await self.receivable(entity_id)
        rows = self._delete(
            entity_id,
            f"seq IN ({which})",
            (entity_id, ready, top, limit),
            f"{MESSAGE_COLUMNS}, size",
        )
        rows.sort(key=lambda row: row[0])
        self._count_completed(entity_id, len(rows), sum(row[-1] for row in rows))
        taken = message_rows((row[:-1] for row in rows), name)
        for message in taken:
            message.delivery_count += 1
            message.state = MessageState.COMPLETED
        return taken

    async def lock_deferred(
        self, entity_id: int, name: str, seqs: Sequence[int], token: str, locked_until: float
    ) -> list[ReceivedMessage]:
        rows = self._db.execute(
            "UPDATE messages SET state = 'locked', lock_token = ?, locked_until = ?,"
            " delivery_count = delivery_count + 1"
            f" WHERE entity_id = ? AND state = 'deferred' AND seq IN {SEQS}"
            f" RETURNING {MESSAGE_COLUMNS}",
            (token, locked_until, entity_id, seqs_json(seqs)),
        ).fetchall()
        rows.sort(key=lambda row: row[0])
        return message_rows(rows, name)

    async def peek(
        self, entity_id: int, name: str, from_seq: int, limit: int, where: MessageFilter
    ) -> list[ReceivedMessage]:
        clauses, params = filter_clauses(where)
        rows = self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM held_messages WHERE entity_id = ? AND seq >= ?"
            f"{clauses} ORDER BY seq LIMIT ?",
            (entity_id, from_seq, *params, limit),
        )
        return message_rows(rows, name)

    async def message(self, entity_id: int, name: str, seq: int) -> ReceivedMessage | None:
        row = self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM held_messages WHERE +entity_id = ? AND seq = ?",
            (entity_id, seq),
        ).fetchone()
        return message_row(row, name) if row else None

    async def messages(
        self, entity_id: int, name: str, seqs: Sequence[int]
    ) -> list[ReceivedMessage]:
        rows = self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM held_messages WHERE +entity_id = ? AND seq IN {SEQS}"
            " ORDER BY seq",
            (entity_id, seqs_json(seqs)),
        )
        return message_rows(rows, name)

    async def still_stored(self, seqs: Sequence[int]) -> set[int]:
        rows = self._db.execute(f"SELECT seq FROM messages WHERE seq IN {SEQS}", (seqs_json(seqs),))
        return {row[0] for row in rows}

    async def locked(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float
    ) -> list[LockInfo]:
        held = [
            LockInfo(*row)
            for row in self._db.execute(
                "SELECT seq, delivery_count, move_count, dead_lettered_deliveries FROM messages"
                " WHERE entity_id = ? AND state = 'locked' AND lock_token = ?"
                f" AND locked_until > ? AND seq IN {SEQS}",
                (entity_id, token, now, seqs_json(seqs)),
            )
        ]
        if len(held) < len(seqs):  # the others may be held by a lease's cover
            covered = await self._covered_of(entity_id, token, seqs, now)
            held += [
                LockInfo(*row)
                for row in self._db.execute(
                    "SELECT seq, delivery_count + 1, move_count, dead_lettered_deliveries"
                    f" FROM messages WHERE seq IN {SEQS}",
                    (seqs_json(covered),),
                )
            ]
        return held

    async def expired_locks(self, entity_id: int, now: float) -> list[LockInfo]:
        rows = self._db.execute(f"{_EXPIRED_LOCKS} ORDER BY seq", (entity_id, now))
        return [LockInfo(*row) for row in rows]

    async def expired_messages(self, entity_id: int, now: float) -> list[int]:
        covered = await self._covered_clause(entity_id)
        rows = self._db.execute(
            "SELECT seq FROM messages WHERE entity_id = ? AND expires_at <= ?"
            f" AND state IN ('scheduled', 'active') AND NOT {covered} ORDER BY seq",
            (entity_id, now),
        )
        return [row[0] for row in rows]

    async def promote_scheduled(self, entity_id: int, now: float) -> int:
        return self._db.execute(
            f"UPDATE messages SET state = 'active', leasable = {await self._returned(entity_id)}"
            " WHERE entity_id = ?"
            " AND state = 'scheduled' AND visible_at <= ?",
            (entity_id, now),
        ).rowcount

    async def due_scheduled(self, entity_id: int, now: float) -> list[int]:
        rows = self._db.execute(
            "SELECT seq FROM messages WHERE entity_id = ? AND state = 'scheduled'"
            " AND visible_at <= ? ORDER BY seq",
            (entity_id, now),
        )
        return [row[0] for row in rows]

    # Moves between entities ---------------------------------------------------------------
    async def move(
        self,
        entity_id: int,
        seqs: Sequence[int],
        destination_id: int,
        state: MessageState | None,
        visible_at: float | None,
        move_count: int = 0,
        hop_count: int = 0,
    ) -> list[int]:
        covered = await self._covered_clause(entity_id)
        which = (
            f"entity_id = ? AND state IN {HELD_IN} AND state != 'locked' AND NOT {covered}"
            f" AND seq IN {SEQS}"
        )
        params = (entity_id, seqs_json(seqs))
        self._count_out(entity_id, which, params)
        rows = self._db.execute(
            "UPDATE messages SET entity_id = ?, state = coalesce(?, state),"
            " visible_at = coalesce(?, visible_at),"
            f" leasable = {await self._returned(destination_id)},"
            " move_count = move_count + ?, hop_count = hop_count + ?"
            f" WHERE {which} RETURNING seq, size",
            (destination_id, state, visible_at, move_count, hop_count, *params),
        ).fetchall()
        moved = sorted(row[0] for row in rows)
        self._count_in(destination_id, moved)
        self._count_moved(entity_id, destination_id, len(rows), sum(row[1] for row in rows))
        return moved

    # Settling -----------------------------------------------------------------------------
    async def receive_follows(self, entity_id: int) -> None:
        """Nothing to send ahead: a statement here costs no round trip."""

    async def lease_follows(self, entity_id: int) -> None:
        """Nothing to exclude first: one transaction writes at a time."""

    async def complete(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float
    ) -> list[int]:
        # Locked, or held by the cover of the token's lease or receive, in one statement.
        cover = await self._cover(entity_id, token, now)
        lo, hi = cover or (None, None)
        rows = self._delete(
            entity_id,
            f"seq {self._in_list('seqs')} AND +entity_id = :entity AND ((state = 'locked'"
            f" AND lock_token = :token AND locked_until > :now){_OR_IN_COVER if cover else ''})",
            {"seqs": seqs_json(seqs), "entity": entity_id, "token": token, "now": now,
             "lo": lo, "hi": hi},
            "seq, size",
        )  # fmt: skip
        if cover:
            self._forget_emptied(entity_id, token)
        return self._completed(entity_id, rows)

    async def complete_span(self, entity_id: int, token: str, lo: int, hi: int, now: float) -> int:
        done = len(self._complete(entity_id, token, now, "seq BETWEEN ? AND ?", lo, hi))
        cover = await self._cover(entity_id, token, now)
        span = within(cover, lo, hi)
        if span is not None:
            done += self._delete_covered_span(entity_id, *span)
            if span == cover:
                await self._forget_cover(entity_id, token)
        return done

    def _complete(
        self, entity_id: int, token: str, now: float, which: str, *params: object
    ) -> list[int]:
        rows = self._delete(
            entity_id,
            "entity_id = ? AND state = 'locked' AND lock_token = ? AND locked_until > ?"
            f" AND {which}",
            (entity_id, token, now, *params),
            "seq, size",
        )
        return self._completed(entity_id, rows)

    def _delete_covered_span(self, entity_id: int, lo: int, hi: int) -> int:
        """Complete the covered messages in ``[lo, hi]`` (a lease's batch): counted first,
        then deleted without RETURNING, which would buffer every row."""
        which = (
            "entity_id = ? AND leasable = 1 AND state IN ('active', 'dead_lettered')"
            " AND seq BETWEEN ? AND ?"
        )
        params = (entity_id, lo, hi)
        count, size = self._db.execute(
            f"SELECT count(*), coalesce(sum(size), 0) FROM messages WHERE {which}", params
        ).fetchone()
        self._delete(entity_id, which, params)
        self._count_completed(entity_id, count, size)
        return int(count)

    def _delete(
        self,
        entity_id: int,
        where: str,
        params: Sequence[object] | Params,
        returning: str | None = None,
    ) -> list[Any]:
        """Delete the messages ``where`` selects (all of the entity's), returning
        ``returning`` of each, and count them out of the entity's dead-letter aggregates.
        Every deletion of messages but an entity's own goes through here: messages have no
        delete trigger (schema 15), since a row trigger on a table makes SQLite read every
        deleted row whole, body and all, and run the trigger's program for it, about two
        thirds of a completion."""
        self._count_out(entity_id, where, params)
        if returning is None:
            self._db.execute(f"DELETE FROM messages WHERE {where}", params)
            return []
        return self._db.execute(
            f"DELETE FROM messages WHERE {where} RETURNING {returning}", params
        ).fetchall()

    def _completed(self, entity_id: int, rows: list[Any]) -> list[int]:
        self._count_completed(entity_id, len(rows), sum(row[1] for row in rows))
        return [row[0] for row in rows]

    async def abandon(
        self,
        entity_id: int,
        seqs: Sequence[int],
        ready: MessageState,
        failures: Sequence[dict[str, Any] | None],
        lock_expired: bool,
    ) -> int:
        failing = any(failures)
        covered = await self._covered_clause(entity_id)
        # +entity_id: each found by sequence number, never by walking the entity's index (the
        # OR leaves the planner no state to seek).
        which = (
            "messages.seq = failed.sequence_number AND +entity_id = :entity"
            f" AND (state = 'locked' OR {covered})"
        )
        params = {
            "ready": ready,
            "entity": entity_id,
            "failed": _rows_json(zip(seqs, failures, strict=True)),
        }
        if failing:  # a failure recorded gives a message new keys in a dead-letter queue
            self._count_out(entity_id, which, params, f", {_FAILED}")
        # A covered message's delivery is counted in its row as it leaves its lease.
        rows = self._db.execute(
            "UPDATE messages SET state = :ready, lock_token = NULL, locked_until = NULL,"
            f" delivery_count = delivery_count + {covered},"
            f" leasable = {await self._returned(entity_id)},"
            " abort_count = abort_count + 1"
            f"{',' + _record_failure('failed.failure') if failing else ''}"
            f" FROM {_FAILED} WHERE {which} RETURNING seq",
            params,
        ).fetchall()
        if failing:
            self._count_in(entity_id, [row[0] for row in rows])
        self._count_returned(entity_id, len(rows), lock_expired)
        return len(rows)

    async def release(
        self,
        entity_id: int,
        token: str,
        lo: int,
        hi: int,
        seqs: Sequence[int] | None,
        ready: MessageState,
        now: float,
    ) -> list[int]:
        listed = "" if seqs is None else f" AND seq IN {SEQS}"
        extra = [] if seqs is None else [seqs_json(seqs)]
        rows = self._db.execute(
            "UPDATE messages SET state = ?, lock_token = NULL, locked_until = NULL,"
            f" delivery_count = delivery_count - 1, leasable = {await self._returned(entity_id)}"
            " WHERE entity_id = ? AND state = 'locked' AND lock_token = ? AND locked_until > ?"
            f" AND seq BETWEEN ? AND ?{listed} RETURNING seq",
            (ready, entity_id, token, now, lo, hi, *extra),
        ).fetchall()
        covered = await self._give_back_covered(entity_id, token, lo, hi, seqs, now)
        return sorted([row[0] for row in rows] + covered)

    async def dead_letter_each(
        self,
        entity_id: int,
        letters: Sequence[Letter],
        destination_id: int,
        source: str,
        now: float,
        lock_token: str | None = None,
    ) -> list[int]:
        seqs = [letter.seq for letter in letters]
        failing = any(letter.failure for letter in letters)
        first = all_alike(letters)
        alike = first is not None
        first = first or Letter(0, "", None, None)
        if lock_token is None:
            covered, cover = await self._covered_clause(entity_id), None
        else:  # held under it: a message not locked is held by its cover
            covered, cover = "(state != 'locked')", await self._cover(entity_id, lock_token, now)
        held_by_cover = _OR_IN_COVER if cover else ""
        lo, hi = cover or (None, None)
        letters_from = _ALIKE if alike else _LETTERS
        # The letters are the outer loop, each finding its message by sequence number
        # (+entity_id: never by walking the entity's index, once for every letter).
        which = (
            "messages.seq = letter.sequence_number AND +entity_id = :entity"
            f" AND ((:token IS NULL AND state IN {LIVE})"
            "   OR (state = 'locked' AND lock_token = :token AND locked_until > :now)"
            f"{held_by_cover})"
        )
        params = {
            "destination": destination_id,
            "source": source,
            "now": now,
            "entity": entity_id,
            "token": lock_token,
            "letters": seqs_json(seqs) if alike else _rows_json(letters),
            "reason": first.reason,
            "description": first.description,
            "failure": json.dumps(first.failure) if first.failure else None,
            "lo": lo,
            "hi": hi,
        }
        self._count_out(entity_id, which, params, f", {letters_from}")
        rows = self._db.execute(
            "UPDATE messages SET entity_id = :destination, state = 'dead_lettered',"
            " lock_token = NULL, locked_until = NULL, dead_letter_reason = letter.reason,"
            f" leasable = {await self._returned(destination_id)},"
            f" delivery_count = delivery_count + {covered},"
            # Without a description, the last recorded failure describes the message.
            " dead_letter_description = coalesce(letter.description,"
            "   json_extract(failures, '$[#-1].error_type')"
            "   || ': ' || json_extract(failures, '$[#-1].message')),"
            " dead_letter_source = :source, dead_lettered_at = :now,"
            f" dead_lettered_deliveries = delivery_count + {covered}"
            # (no failure to record: the history's columns are left as they are)
            f"{',' + _record_failure('letter.failure') if failing else ''}"
            f" FROM {letters_from} WHERE {which}"
            " RETURNING seq, size, dead_letter_reason, subject, last_fingerprint, last_error_type",
            params,
        ).fetchall()
        if cover and lock_token is not None:
            self._forget_emptied(entity_id, lock_token)
        moved = sorted(row[0] for row in rows)
        self._count_letters_in(destination_id, rows, now)
        self.history.dead_lettered(destination_id, (row[2:5] for row in rows))
        self._count_moved(
            entity_id, destination_id, len(rows), sum(row[1] for row in rows), "dead_lettered"
        )
        return moved

    async def drop(self, entity_id: int, seqs: Sequence[int]) -> int:
        rows = self._delete(
            entity_id,
            f"entity_id = ? AND state IN {HELD_IN} AND seq IN {SEQS}",
            (entity_id, seqs_json(seqs)),
            "size",
        )
        self._count_dropped(entity_id, len(rows), sum(row[0] for row in rows))
        return len(rows)

    async def resubmit(
        self,
        entity_id: int,
        seqs: Sequence[int],
        destination_id: int,
        now: float,
        expires_at: float | None,
    ) -> int:
        covered = await self._covered_clause(entity_id)
        guard = (
            "entity_id = ? AND state IN ('active', 'deferred', 'dead_lettered')"
            f" AND NOT {covered} AND seq IN {SEQS}"
        )
        params = (entity_id, seqs_json(seqs))
        # INSERT ... SELECT in sequence order gives the copies new, ascending sequence numbers:
        # a resubmitted message joins the back of the queue, as a new send would.
        copied = self._db.execute(
            "INSERT INTO messages (entity_id, state, message_id, body, size, content_type,"
            " subject, properties, session_id, correlation_id, reply_to, enqueued_at, expires_at,"
            " abort_count, resubmit_count, hop_count, last_error_type, last_fingerprint, failures,"
            " to_address, reply_to_session_id, partition_key)"
            " SELECT ?, 'active', message_id, body, size, content_type, subject, properties,"
            " session_id, correlation_id, reply_to, ?, ?, abort_count, resubmit_count + 1,"
            " hop_count, last_error_type, last_fingerprint, failures, to_address,"
            f" reply_to_session_id, partition_key FROM messages WHERE {guard} ORDER BY seq",
            (destination_id, now, expires_at, *params),
        )
        if copied.rowcount > 0:
            top = copied.lastrowid
            assert top is not None
            self._count_in(destination_id, range(top - copied.rowcount + 1, top + 1))
        sizes = [row[0] for row in self._delete(entity_id, guard, params, "size")]
        moved, size = len(sizes), sum(sizes)
        self._count_moved(entity_id, destination_id, moved, size, "resubmitted")
        return moved


def _statements(script: str) -> Iterator[str]:
    """The statements of a migration script, one at a time (a trigger's body holds several,
    each ending in a semicolon: a statement ends where SQLite says it is complete)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""
    if statement.strip():  # comments alone (a script may hold nothing else)
        yield statement


class SqliteStore(Store):
    """A store in one SQLite file."""

    def __init__(self, path: str | Path, synchronous: str = "full", busy_timeout: float = 30.0):
        if synchronous.lower() not in ("full", "normal", "extra", "off"):
            raise InvalidOptionError(
                f"synchronous must be full, normal, extra or off: {synchronous}"
            )
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.history = HistoryKeeper()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, timeout=busy_timeout, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute(f"PRAGMA synchronous = {synchronous}")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc
        self._commits = 0

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> SqliteStore:
        """``sqlite:///relative.db``, ``sqlite:////abs/path.db``, or a bare path; the query
        ``?synchronous=normal`` trades durability of the last commits for speed, and
        ``?busy_timeout=5`` sets how many seconds a write waits for another process's write
        lock (default 30) before the operation fails as unavailable (and is retried).
        Without ``create``, a file that does not exist raises :class:`StoreNotFoundError`."""
        query: dict[str, str] = {}
        if "://" not in url:
            path = url
        else:
            parts = urlsplit(url)
            if parts.netloc:
                raise InvalidOptionError(f"a sqlite URL has no host: {url!r} (use sqlite:///path)")
            path = parts.path[1:] if parts.path.startswith("/") else parts.path
            if not path:
                raise InvalidOptionError(f"no file in {url!r}; use sqlite:///path/to/queues.db")
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if not create and not Path(path).exists():
            raise StoreNotFoundError(str(Path(path).absolute()))
        try:
            busy_timeout = float(query.get("busy_timeout", 30.0))
        except ValueError:
            raise InvalidOptionError(f"busy_timeout must be seconds: {url!r}") from None
        return cls(path, synchronous=query.get("synchronous", "full"), busy_timeout=busy_timeout)

    def _migrate(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(f"{SCHEMA_TABLE} STRICT")
            applied = {v for (v,) in self._db.execute(SCHEMA_VERSIONS)}
            for version, script in pending_migrations("sqlite", applied, str(self.path)):
                for statement in _statements(script):
                    self._db.execute(statement)
                self._db.execute(ADD_SCHEMA_VERSION, {"version": version})
            self._recount_drifted_groups()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _recount_drifted_groups(self) -> None:
        """Recount the groups of each dead-letter queue whose groups do not add up to what
        its ledger holds (:data:`_DRIFTED`), as the store opens: what an older process
        moved in after the upgrade is counted once any process of this poisonq next opens
        the store. (Checked by the total, a read of the groups and not of the messages.)"""
        for entity_id, name in self._db.execute(_DRIFTED).fetchall():
            log.warning(
                "the dead-letter groups of %s did not add up to its messages (an older poisonq"
                " wrote to the store after it was upgraded): recounted",
                name,
            )
            self._db.execute("DELETE FROM dead_letter_aggregates WHERE entity_id = ?", (entity_id,))
            for statement in _COUNT_ALL:
                self._db.execute(statement, (entity_id,))

    def _read_data_version(self) -> int:
        with self._lock:
            self.check_open()
            return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        return self._transaction("BEGIN IMMEDIATE")

    def reading(self) -> AbstractAsyncContextManager[Transaction]:
        # Deferred: a reader takes a snapshot of the WAL, neither taking the write lock nor
        # waiting for another process's. (Within this process the connection is shared, so
        # its transactions, reads or writes, still take turns.)
        return self._transaction(READ)

    @asynccontextmanager
    async def _transaction(self, begin: str) -> AsyncIterator[Transaction]:
        with self._lock:
            self.check_open()
            try:
                self._db.execute(begin)
            except sqlite3.Error as exc:
                raise _store_error(f"cannot begin a transaction on {self.path}", exc) from exc
            try:
                tx = SqliteTransaction(self._db)
                yield tx
                if tx.history:
                    await tx.write_history(self.history)
            except sqlite3.Error as exc:
                self._rollback()
                raise _store_error(f"SQLite error on {self.path}", exc) from exc
            except UNSTORABLE as exc:
                self._db.execute("ROLLBACK")
                raise unstorable(exc) from exc
            except BaseException:
                self._rollback()
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise _store_error(f"cannot commit to {self.path}", exc) from exc
            if begin != READ:  # a reader changed nothing: no waiter need look again
                self._commits += 1
                self._changed.notify_all()

    def _rollback(self) -> None:
        """Roll back the open transaction, if SQLite has not already done so itself (after a
        full disk or an interrupt it may have, and a second ROLLBACK would raise)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def change_marker(self) -> tuple[int, int]:
        return (self._commits, self._read_data_version())

    def wait_for_change(self, marker: object, timeout: float) -> None:
        # Commits from this process bump a counter and notify the condition; commits from
        # other processes show as a new PRAGMA data_version, which we poll at a short interval
        # (SQLite has no cross-process notification). Comparing against a marker taken before
        # the caller looked means a commit in between is never missed.
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.change_marker() == marker:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(min(left, 0.005))

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._db.close()


def _store_error(what: str, exc: sqlite3.Error) -> StoreError:
    """A SQLite error as a store error: a write lock held by another process past the busy
    timeout is transient (:class:`StoreUnavailableError`), a full disk or file is
    :class:`StoreFullError`, anything else is neither."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code == sqlite3.SQLITE_FULL:
        return StoreFullError(f"{what}: the database or its disk is full ({exc})")
    busy = code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return (StoreUnavailableError if busy else StoreError)(f"{what}: {exc}")
