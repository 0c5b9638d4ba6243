"""The SQL of the PostgreSQL store: one :class:`PostgresTransaction` per store transaction.

The statements follow the SQLite store's one for one (same tables, columns and guards), so a
method added there ports by translating placeholders: ``?`` → ``%b``, ``json_each(?)`` →
``= ANY(%b)`` with a list, ``json_insert`` → ``jsonb ||``. What differs is concurrency.
SQLite runs one writer at a time; here transactions run side by side under READ COMMITTED, so:

- receiving locks rows with ``FOR UPDATE SKIP LOCKED``: competing receivers take disjoint
  batches without waiting for each other;
- every read that a later statement of the same transaction acts on (expired locks and TTLs,
  the locks a settlement names, the messages a bulk task selects) locks its rows
  (``FOR UPDATE``), so no other transaction can change them in between;
- the ledger is kept in memory during the transaction and written in one statement just
  before ``COMMIT``: the entity row is the one row every transaction on a queue updates, and
  holding its lock only for the commit itself keeps concurrent consumers from queueing behind
  each other's whole transactions. Entities are updated in id order, so two transactions
  never wait for each other's entity rows in a cycle.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

from psycopg import Connection, Cursor, Pipeline, errors

from poisonq.errors import EntityExistsError
from poisonq.model import EntityStatus, Lease, MessageState, ReceivedMessage, SubQueue
from poisonq.store.base import (
    DeadLetterGroup,
    EntityRecord,
    Ledger,
    LockInfo,
    MessageFilter,
    NewMessage,
    TaskRecord,
    Transaction,
)

# The row mappers are the SQLite store's: these column lists return the same values in the
# same order (``failures::text`` is the JSON text SQLite keeps).
from poisonq.store.sqlite import _entity as entity_from_row
from poisonq.store.sqlite import _message as message_from_row

NOTIFY_CHANNEL = "poisonq"

_MESSAGE_COLUMNS = (
    "seq, message_id, body, content_type, subject, properties, session_id, correlation_id,"
    " reply_to, state, enqueued_at, scheduled_at, expires_at, delivery_count, abort_count,"
    " move_count, resubmit_count, hop_count, lock_token, locked_until, dead_letter_reason,"
    " dead_letter_description, dead_letter_source, failures::text"
)
_ENTITY_COLUMNS = (
    "id, name, parent_id, subqueue, status, status_cause, options, created_at, updated_at, "
    "sent, moved_in, completed, dropped, moved_out, dead_lettered, resubmitted, lock_expiries, "
    "size_bytes"
)
_LEDGER = Ledger.__slots__
_FLUSH_LEDGER = (
    "UPDATE entities SET "
    + ", ".join(f"{name} = {name} + %b" for name in _LEDGER)
    + " WHERE id = %b"
)
_HELD = "('scheduled', 'active', 'locked', 'deferred', 'dead_lettered')"
_LIVE = "('scheduled', 'active', 'locked', 'deferred')"
_GROUP_KEYS = {
    "reason": ("dead_letter_reason", "dead_letter_reason"),
    "subject": ("subject", "subject"),
    "fingerprint": ("last_fingerprint", "last_error_type"),
}
_STATES = {s.value: s for s in MessageState}
# The messages of an entity past their TTL, by the partial index on expires_at. OFFSET 0 keeps
# the planner from merging a state condition in here: on a table it has no statistics for yet
# (a new queue), it would walk every active message by the state index instead.
_EXPIRING = (
    "(SELECT seq, state FROM messages WHERE entity_id = %(e)b AND expires_at <= %(now)b OFFSET 0)"
)
# Appends a failure record (a JSON object, or NULL for none) to the history, and keeps the
# columns dead-letter analysis groups by.
_RECORD_FAILURE = (
    " failures = CASE WHEN %(failure)b::jsonb IS NULL THEN failures"
    "   ELSE coalesce(failures, '[]'::jsonb) || jsonb_build_array(%(failure)b::jsonb) END,"
    " last_error_type = coalesce(%(failure)b::jsonb ->> 'error_type', last_error_type),"
    " last_fingerprint = coalesce(%(failure)b::jsonb ->> 'fingerprint', last_fingerprint)"
)


def _failure_json(failure: dict[str, Any] | None) -> str | None:
    # jsonb refuses the escape \u0000, which an exception message may well contain.
    return json.dumps(failure).replace("\\u0000", "\\ufffd") if failure else None


def _filter_sql(where: MessageFilter) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, value, op in (
        ("dead_letter_reason", where.reason, "="),
        ("subject", where.subject, "="),
        ("last_fingerprint", where.fingerprint, "="),
        ("seq", where.min_sequence, ">="),
        ("seq", where.max_sequence, "<="),
        ("coalesce(dead_lettered_at, enqueued_at)", where.since, ">="),
        ("coalesce(dead_lettered_at, enqueued_at)", where.until, "<"),
    ):
        if value is not None:
            clauses.append(f" AND {column} {op} %b")
            params.append(value)
    return "".join(clauses), params


class PostgresTransaction(Transaction):
    def __init__(self, conn: Connection[Any], pipeline: Pipeline) -> None:
        self._db = conn
        self._pipeline = pipeline
        self._ledger: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_LEDGER, 0))
        self.notify = False  # whether this transaction made a message receivable
        self._statements = 0
        # Answers fetched ahead of the call that needs them, in a round trip that was made
        # anyway; valid only while no other statement has run (see _recall).
        self._ahead: dict[tuple[Any, ...], Any] = {}
        self._ahead_at = 0

    def _run(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Cursor[Any]:
        """Queue a statement in the pipeline (nothing waits for it until a result is read)."""
        self._statements += 1
        return self._db.execute(sql, params, binary=True)

    def _all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(sql, params).fetchall()

    def _count(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run a statement and return how many rows it changed (which waits for it)."""
        cur = self._run(sql, params)
        self._pipeline.sync()
        return cur.rowcount

    def _remember(self, key: tuple[Any, ...], value: Any) -> None:
        if self._ahead_at != self._statements:
            self._ahead, self._ahead_at = {}, self._statements
        self._ahead[key] = value

    def _recall(self, key: tuple[Any, ...]) -> Any:
        """A value fetched ahead, if no statement has run since: then the database would
        give the same answer now, inside this transaction."""
        if self._ahead_at != self._statements:
            return None
        return self._ahead.pop(key, None)

    def _bump(self, entity_id: int, **deltas: int) -> None:
        """Add ``deltas`` to the entity's ledger at commit (see the module docstring)."""
        ledger = self._ledger[entity_id]
        for name, delta in deltas.items():
            ledger[name] += delta

    def flush_ledger(self) -> None:
        """Write the ledger changes so far, entities in id order, in one round trip."""
        changes = [
            (*ledger.values(), entity_id)
            for entity_id, ledger in sorted(self._ledger.items())
            if any(ledger.values())
        ]
        self._ledger.clear()
        if changes:
            self._statements += 1
            with self._db.cursor() as cur:
                cur.executemany(_FLUSH_LEDGER, changes)

    # Entities -----------------------------------------------------------------------------
    def insert_entity(
        self,
        name: str,
        parent_id: int | None,
        subqueue: SubQueue | None,
        options: str,
        now: float,
    ) -> int:
        try:
            with self._db.transaction():  # a savepoint: the error must not abort the rest
                (row,) = self._all(
                    "INSERT INTO entities (name, parent_id, subqueue, options, created_at,"
                    " updated_at) VALUES (%b, %b, %b, %b, %b, %b) RETURNING id",
                    (name, parent_id, subqueue, options, now, now),
                )
        except errors.UniqueViolation as exc:
            raise EntityExistsError(name) from exc
        return int(row[0])

    def entity(self, name: str) -> EntityRecord | None:
        self.flush_ledger()
        known = self._recall(("entity", name))
        if known is not None:
            return cast(EntityRecord, known)
        # The engine resolves a queue's subqueues (or a subqueue's queue) right after the
        # entity itself: fetch the whole family in the same round trip.
        rows = self._all(
            "WITH named AS (SELECT id, parent_id FROM entities WHERE name = %b)"
            f" SELECT {_ENTITY_COLUMNS} FROM entities WHERE id IN (SELECT id FROM named)"
            " OR id IN (SELECT parent_id FROM named) OR parent_id IN (SELECT id FROM named)",
            (name,),
        )
        found = None
        for record in map(entity_from_row, rows):
            if record.name == name:
                found = record
            else:
                self._remember(("entity", record.name), record)
                self._remember(("entity_id", record.id), record)
        return found

    def entity_by_id(self, entity_id: int) -> EntityRecord:
        self.flush_ledger()
        known = self._recall(("entity_id", entity_id))
        if known is not None:
            return cast(EntityRecord, known)
        (row,) = self._all(f"SELECT {_ENTITY_COLUMNS} FROM entities WHERE id = %b", (entity_id,))
        return entity_from_row(row)

    def entities(self) -> list[EntityRecord]:
        self.flush_ledger()
        return [
            entity_from_row(row)
            for row in self._all(f"SELECT {_ENTITY_COLUMNS} FROM entities ORDER BY name")
        ]

    def set_options(self, entity_id: int, options: str, now: float) -> None:
        self._run(
            "UPDATE entities SET options = %b, updated_at = %b WHERE id = %b",
            (options, now, entity_id),
        )

    def set_status(
        self, entity_id: int, status: EntityStatus, cause: str | None, now: float
    ) -> None:
        self._run(
            "UPDATE entities SET status = %b, status_cause = %b, updated_at = %b WHERE id = %b",
            (status.value, cause, now, entity_id),
        )
        self.notify = True  # an enabled queue may have messages to receive

    def delete_entity(self, entity_id: int) -> None:
        # Messages, leases, duplicate-detection ids and tasks go with it (ON DELETE CASCADE).
        self._ledger.clear()
        self._run("DELETE FROM entities WHERE id = %(id)b OR parent_id = %(id)b", {"id": entity_id})

    def held_counts(self, entity_id: int) -> dict[MessageState, int]:
        rows = self._all(
            "SELECT state, count(*) FROM messages WHERE entity_id = %b GROUP BY state",
            (entity_id,),
        )
        return {_STATES[state]: n for state, n in rows}

    # Sending ------------------------------------------------------------------------------
    def insert_messages(self, entity_id: int, rows: Sequence[NewMessage], now: float) -> list[int]:
        # One statement for the whole batch: each column is bound as one array and the rows
        # are rebuilt with unnest, so the statement text (and its prepared plan) never changes
        # with the batch size. A column no message uses is bound as NULL, which unnest pads.
        def column(name: str) -> list[Any] | None:
            values = [getattr(m, name) for m in rows]
            return values if any(v is not None for v in values) else None

        scheduled = column("scheduled_at")
        seqs = self._all(
            "INSERT INTO messages (entity_id, enqueued_at, state, message_id, body, size,"
            " content_type, subject, properties, session_id, correlation_id, reply_to,"
            " scheduled_at, visible_at, expires_at)"
            " SELECT %b, %b, r.state, r.message_id, r.body, r.size, r.content_type, r.subject,"
            " r.properties, r.session_id, r.correlation_id, r.reply_to, r.scheduled_at,"
            " r.scheduled_at, r.expires_at"
            " FROM unnest(%b::text[], %b::text[], %b::bytea[], %b::int[], %b::text[], %b::text[],"
            " %b::text[], %b::text[], %b::text[], %b::text[], %b::float8[], %b::float8[])"
            " WITH ORDINALITY AS r(state, message_id, body, size, content_type, subject,"
            " properties, session_id, correlation_id, reply_to, scheduled_at, expires_at, n)"
            " ORDER BY r.n RETURNING seq",
            (
                entity_id,
                now,
                [m.state.value for m in rows],
                [m.message_id for m in rows],
                [m.body for m in rows],
                [m.size for m in rows],
                column("content_type"),
                column("subject"),
                column("properties"),
                column("session_id"),
                column("correlation_id"),
                column("reply_to"),
                scheduled,
                column("expires_at"),
            ),
        )
        self._bump(entity_id, sent=len(rows), size_bytes=sum(m.size for m in rows))
        self.notify = True
        # Identity values are drawn in the order the rows are inserted (ORDER BY r.n).
        return sorted(row[0] for row in seqs)

    def seen_message_ids(self, entity_id: int, message_ids: Sequence[str], now: float) -> set[str]:
        rows = self._all(
            "SELECT message_id FROM seen_message_ids WHERE entity_id = %b AND expires_at > %b"
            " AND message_id = ANY(%b)",
            (entity_id, now, list(message_ids)),
        )
        return {row[0] for row in rows}

    def remember_message_ids(
        self, entity_id: int, message_ids: Sequence[str], expires_at: float
    ) -> None:
        self._run(
            "INSERT INTO seen_message_ids (entity_id, message_id, expires_at)"
            " SELECT %b, unnest(%b::text[]), %b ON CONFLICT (entity_id, message_id)"
            " DO UPDATE SET expires_at = excluded.expires_at",
            (entity_id, list(message_ids), expires_at),
        )

    def forget_message_ids(self, now: float) -> int:
        return self._count("DELETE FROM seen_message_ids WHERE expires_at <= %b", (now,))

    # Receiving ----------------------------------------------------------------------------
    def lock_ready(
        self,
        entity_id: int,
        name: str,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
    ) -> list[ReceivedMessage]:
        rows = self._all(
            "UPDATE messages SET state = 'locked', lock_token = %b, locked_until = %b,"
            " delivery_count = delivery_count + 1"
            " WHERE seq IN (SELECT seq FROM messages WHERE entity_id = %b AND state = %b"
            f" ORDER BY seq LIMIT %b FOR UPDATE SKIP LOCKED) RETURNING {_MESSAGE_COLUMNS}",
            (token, locked_until, entity_id, ready.value, limit),
        )
        rows.sort(key=lambda row: row[0])
        return [message_from_row(row, name) for row in rows]

    def take_ready(
        self, entity_id: int, name: str, ready: MessageState, limit: int
    ) -> list[ReceivedMessage]:
        rows = self._all(
            "DELETE FROM messages WHERE seq IN (SELECT seq FROM messages WHERE entity_id = %b"
            " AND state = %b ORDER BY seq LIMIT %b FOR UPDATE SKIP LOCKED)"
            f" RETURNING {_MESSAGE_COLUMNS}, size",
            (entity_id, ready.value, limit),
        )
        rows.sort(key=lambda row: row[0])
        self._bump(entity_id, completed=len(rows), size_bytes=-sum(row[-1] for row in rows))
        taken = [message_from_row(row[:-1], name) for row in rows]
        for message in taken:
            message.delivery_count += 1
            message.state = MessageState.COMPLETED
        return taken

    def lock_deferred(
        self, entity_id: int, name: str, seqs: Sequence[int], token: str, locked_until: float
    ) -> list[ReceivedMessage]:
        rows = self._all(
            "UPDATE messages SET state = 'locked', lock_token = %b, locked_until = %b,"
            " delivery_count = delivery_count + 1"
            " WHERE entity_id = %b AND state = 'deferred' AND seq = ANY(%b)"
            f" RETURNING {_MESSAGE_COLUMNS}",
            (token, locked_until, entity_id, list(seqs)),
        )
        rows.sort(key=lambda row: row[0])
        return [message_from_row(row, name) for row in rows]

    def peek(self, entity_id: int, name: str, from_seq: int, limit: int) -> list[ReceivedMessage]:
        rows = self._all(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE entity_id = %b AND seq >= %b"
            " ORDER BY seq LIMIT %b",
            (entity_id, from_seq, limit),
        )
        return [message_from_row(row, name) for row in rows]

    def seq_span(self, entity_id: int) -> tuple[int, int, int]:
        ((count, lo, hi),) = self._all(
            "SELECT count(*), min(seq), max(seq) FROM messages WHERE entity_id = %b",
            (entity_id,),
        )
        return (count, lo, hi) if count else (0, 0, -1)

    def message(self, entity_id: int, name: str, seq: int) -> ReceivedMessage | None:
        rows = self._all(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE entity_id = %b AND seq = %b",
            (entity_id, seq),
        )
        return message_from_row(rows[0], name) if rows else None

    def locked(self, entity_id: int, token: str, seqs: Sequence[int], now: float) -> list[LockInfo]:
        # FOR UPDATE: the settlement that follows acts on exactly these rows, and no lock
        # sweep of another transaction can release them in between.
        rows = self._all(
            "SELECT seq, delivery_count, move_count FROM messages WHERE entity_id = %b"
            " AND state = 'locked' AND lock_token = %b AND locked_until > %b AND seq = ANY(%b)"
            " ORDER BY seq FOR UPDATE",
            (entity_id, token, now, list(seqs)),
        )
        return [LockInfo(*row) for row in rows]

    def _sweep_ahead(self, entity_id: int, now: float) -> Cursor[Any]:
        """Queue a receive's housekeeping reads: the expired locks (returned, to be fetched)
        and whether any scheduled message is due or any message past its TTL (remembered).
        promote_scheduled and expired_messages usually find nothing, and then cost nothing."""
        # SKIP LOCKED: an expired lock that another transaction is already releasing (or its
        # owner is settling, and will find lost) is that transaction's to handle.
        locks = self._run(
            "SELECT seq, delivery_count, move_count FROM messages WHERE entity_id = %b"
            " AND state = 'locked' AND locked_until <= %b ORDER BY seq FOR UPDATE SKIP LOCKED",
            (entity_id, now),
        )
        (quiet,) = self._all(
            "SELECT NOT EXISTS (SELECT FROM messages WHERE entity_id = %(e)b"
            "   AND state = 'scheduled' AND visible_at <= %(now)b),"
            f" NOT EXISTS (SELECT FROM {_EXPIRING} m WHERE state IN ('scheduled', 'active',"
            " 'deferred'))",
            {"e": entity_id, "now": now},
        )
        self._remember(("nothing due", entity_id, now), quiet[0])
        self._remember(("nothing expired", entity_id, now), quiet[1])
        return locks

    def _sweep_after(self, entity_id: int, now: float) -> None:
        """Send a receive's housekeeping reads with a settlement (in its round trip): in
        complete_and_receive and settle_and_receive the receive follows at once. Locking the
        expired locks a moment early is harmless when none follows: the transaction ends."""
        expired = [LockInfo(*row) for row in self._sweep_ahead(entity_id, now).fetchall()]
        self._remember(("expired locks", entity_id, now), expired)

    def expired_locks(self, entity_id: int, now: float) -> list[LockInfo]:
        known = self._recall(("expired locks", entity_id, now))
        if known is not None:
            return cast(list[LockInfo], known)
        return [LockInfo(*row) for row in self._sweep_ahead(entity_id, now).fetchall()]

    def expired_messages(self, entity_id: int, now: float) -> list[int]:
        if self._recall(("nothing expired", entity_id, now)):
            return []
        rows = self._all(
            f"SELECT seq FROM messages WHERE seq IN (SELECT seq FROM {_EXPIRING} m)"
            " AND state IN ('scheduled', 'active', 'deferred') ORDER BY seq"
            " FOR UPDATE SKIP LOCKED",
            {"e": entity_id, "now": now},
        )
        return [row[0] for row in rows]

    def promote_scheduled(self, entity_id: int, now: float) -> int:
        if self._recall(("nothing due", entity_id, now)):
            return 0
        promoted = self._count(
            "UPDATE messages SET state = 'active' WHERE entity_id = %b AND state = 'scheduled'"
            " AND visible_at <= %b",
            (entity_id, now),
        )
        self.notify = self.notify or promoted > 0
        return promoted

    # Leases -------------------------------------------------------------------------------
    def lock_ready_seqs(
        self, entity_id: int, ready: MessageState, limit: int, token: str, locked_until: float
    ) -> list[int]:
        rows = self._all(
            "UPDATE messages SET state = 'locked', lock_token = %b, locked_until = %b,"
            " delivery_count = delivery_count + 1"
            " WHERE seq IN (SELECT seq FROM messages WHERE entity_id = %b AND state = %b"
            " ORDER BY seq LIMIT %b FOR UPDATE SKIP LOCKED) RETURNING seq",
            (token, locked_until, entity_id, ready.value, limit),
        )
        return sorted(row[0] for row in rows)

    def insert_lease(self, entity_id: int, lease: Lease) -> None:
        self._run(
            "INSERT INTO leases (entity_id, consumer, number, lock_token, count, min_seq,"
            " max_seq, created_at) VALUES (%b, %b, %b, %b, %b, %b, %b, %b)",
            (
                entity_id,
                lease.consumer,
                lease.number,
                lease.lock_token,
                lease.count,
                lease.min_sequence,
                lease.max_sequence,
                lease.created_at,
            ),
        )

    def lease(self, entity_id: int, name: str, consumer: str, number: int | None) -> Lease | None:
        rows = self._all(
            "SELECT consumer, number, lock_token, count, min_seq, max_seq, created_at"
            " FROM leases WHERE entity_id = %(entity)b AND consumer = %(consumer)b"
            " AND (%(number)b::bigint IS NULL OR number = %(number)b)"
            " ORDER BY number DESC LIMIT 1",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )
        return Lease(name, *rows[0]) if rows else None

    def delete_leases(self, entity_id: int, consumer: str, before: int) -> None:
        self._run(
            "DELETE FROM leases WHERE entity_id = %b AND consumer = %b AND number < %b",
            (entity_id, consumer, before),
        )

    def lease_seqs(self, entity_id: int, token: str, lo: int, hi: int, now: float) -> list[int]:
        rows = self._all(
            "SELECT seq FROM messages WHERE entity_id = %b AND state = 'locked'"
            " AND seq BETWEEN %b AND %b AND lock_token = %b AND locked_until > %b ORDER BY seq",
            (entity_id, lo, hi, token, now),
        )
        return [row[0] for row in rows]

    def lease_rows(
        self, entity_id: int, token: str, lo: int, hi: int, now: float
    ) -> list[tuple[Any, ...]]:
        return self._all(
            "SELECT seq, message_id, body, content_type, subject, properties, session_id,"
            " correlation_id, enqueued_at, delivery_count FROM messages"
            " WHERE entity_id = %b AND state = 'locked' AND seq BETWEEN %b AND %b"
            " AND lock_token = %b AND locked_until > %b ORDER BY seq",
            (entity_id, lo, hi, token, now),
        )

    # Settling -----------------------------------------------------------------------------
    def complete(self, entity_id: int, token: str, seqs: Sequence[int], now: float) -> list[int]:
        done = self._run(
            "DELETE FROM messages WHERE entity_id = %b AND state = 'locked' AND lock_token = %b"
            " AND locked_until > %b AND seq = ANY(%b) RETURNING seq, size",
            (entity_id, token, now, list(seqs)),
        )
        self._sweep_after(entity_id, now)
        rows = done.fetchall()
        self._bump(entity_id, completed=len(rows), size_bytes=-sum(row[1] for row in rows))
        return [row[0] for row in rows]

    def release(
        self,
        entity_id: int,
        seqs: Sequence[int],
        ready: MessageState,
        failure: dict[str, Any] | None,
        lock_expired: bool,
    ) -> int:
        changed = self._count(
            "UPDATE messages SET state = %(ready)b, lock_token = NULL, locked_until = NULL,"
            f" abort_count = abort_count + 1, {_RECORD_FAILURE}"
            " WHERE entity_id = %(entity)b AND state = 'locked' AND seq = ANY(%(seqs)b)",
            {
                "ready": ready.value,
                "failure": _failure_json(failure),
                "entity": entity_id,
                "seqs": list(seqs),
            },
        )
        if lock_expired:
            self._bump(entity_id, lock_expiries=changed)
        self.notify = True
        return changed

    def defer(self, entity_id: int, token: str, seqs: Sequence[int], now: float) -> int:
        return self._count(
            "UPDATE messages SET state = 'deferred', lock_token = NULL, locked_until = NULL"
            " WHERE entity_id = %b AND state = 'locked' AND lock_token = %b AND locked_until > %b"
            " AND seq = ANY(%b)",
            (entity_id, token, now, list(seqs)),
        )

    def renew(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float, locked_until: float
    ) -> int:
        return self._count(
            "UPDATE messages SET locked_until = %b WHERE entity_id = %b AND state = 'locked'"
            " AND lock_token = %b AND locked_until > %b AND seq = ANY(%b)",
            (locked_until, entity_id, token, now, list(seqs)),
        )

    def dead_letter(
        self,
        entity_id: int,
        seqs: Sequence[int],
        target_id: int,
        reason: str,
        description: str | None,
        source: str,
        failure: dict[str, Any] | None,
        now: float,
        lock_token: str | None = None,
    ) -> list[int]:
        moving = self._run(
            "UPDATE messages SET entity_id = %(target)b, state = 'dead_lettered',"
            " lock_token = NULL, locked_until = NULL, dead_letter_reason = %(reason)b,"
            # Without a description, the last recorded failure describes the message.
            " dead_letter_description = coalesce(%(description)b,"
            "   (failures -> -1 ->> 'error_type') || ': ' || (failures -> -1 ->> 'message')),"
            f" dead_letter_source = %(source)b, dead_lettered_at = %(now)b, {_RECORD_FAILURE}"
            f" WHERE entity_id = %(entity)b AND state IN {_LIVE}"
            " AND (%(token)b::text IS NULL"
            "   OR (state = 'locked' AND lock_token = %(token)b AND locked_until > %(now)b))"
            " AND seq = ANY(%(seqs)b) RETURNING seq, size",
            {
                "target": target_id,
                "reason": reason,
                "description": description,
                "source": source,
                "now": now,
                "failure": _failure_json(failure),
                "entity": entity_id,
                "token": lock_token,
                "seqs": list(seqs),
            },
        )
        if lock_token is not None:  # a receiver's settlement: a receive may follow
            self._sweep_after(entity_id, now)
        rows = moving.fetchall()
        moved, size = len(rows), sum(row[1] for row in rows)
        self._bump(entity_id, moved_out=moved, dead_lettered=moved, size_bytes=-size)
        self._bump(target_id, moved_in=moved, size_bytes=size)
        self.notify = self.notify or moved > 0
        return sorted(row[0] for row in rows)

    def drop(self, entity_id: int, seqs: Sequence[int]) -> int:
        rows = self._all(
            f"DELETE FROM messages WHERE entity_id = %b AND state IN {_HELD} AND seq = ANY(%b)"
            " RETURNING size",
            (entity_id, list(seqs)),
        )
        self._bump(entity_id, dropped=len(rows), size_bytes=-sum(row[0] for row in rows))
        return len(rows)

    def resubmit(
        self,
        entity_id: int,
        seqs: Sequence[int],
        target_id: int,
        now: float,
        expires_at: float | None,
    ) -> int:
        # One statement moves the rows: the copies get new, ascending sequence numbers (in
        # the old order), so a resubmitted message joins the back of the queue as a new send.
        rows = self._all(
            "WITH gone AS (DELETE FROM messages WHERE entity_id = %(entity)b"
            " AND state IN ('active', 'deferred', 'dead_lettered') AND seq = ANY(%(seqs)b)"
            " RETURNING *)"
            " INSERT INTO messages (entity_id, state, message_id, body, size, content_type,"
            " subject, properties, session_id, correlation_id, reply_to, enqueued_at, expires_at,"
            " abort_count, resubmit_count, hop_count, last_error_type, last_fingerprint, failures)"
            " SELECT %(target)b, 'active', message_id, body, size, content_type, subject,"
            " properties, session_id, correlation_id, reply_to, %(now)b, %(expires)b,"
            " abort_count, resubmit_count + 1, hop_count, last_error_type, last_fingerprint,"
            " failures FROM gone ORDER BY seq RETURNING size",
            {
                "entity": entity_id,
                "seqs": list(seqs),
                "target": target_id,
                "now": now,
                "expires": expires_at,
            },
        )
        moved, size = len(rows), sum(row[0] for row in rows)
        self._bump(entity_id, moved_out=moved, resubmitted=moved, size_bytes=-size)
        self._bump(target_id, moved_in=moved, size_bytes=size)
        self.notify = self.notify or moved > 0
        return moved

    # Dead-letter analysis and tasks ------------------------------------------------------
    def dead_letter_groups(self, entity_id: int, by: str) -> list[DeadLetterGroup]:
        key, label = _GROUP_KEYS[by]
        rows = self._all(
            f"SELECT {key}, max({label}), count(*),"
            " min(coalesce(dead_lettered_at, enqueued_at)),"
            " max(coalesce(dead_lettered_at, enqueued_at))"
            f" FROM messages WHERE entity_id = %b GROUP BY {key}"
            f" ORDER BY count(*) DESC, {key} NULLS FIRST",
            (entity_id,),
        )
        return [DeadLetterGroup(*row) for row in rows]

    def select(self, entity_id: int, where: MessageFilter, after_seq: int, limit: int) -> list[int]:
        clauses, params = _filter_sql(where)
        # Locked here, so a receiver cannot take them before the task moves or drops them.
        rows = self._all(
            "SELECT seq FROM messages WHERE entity_id = %b AND state != 'locked' AND seq > %b"
            f"{clauses} ORDER BY seq LIMIT %b FOR UPDATE SKIP LOCKED",
            (entity_id, after_seq, *params, limit),
        )
        return [row[0] for row in rows]

    def count_matching(self, entity_id: int, where: MessageFilter) -> int:
        clauses, params = _filter_sql(where)
        ((n,),) = self._all(
            f"SELECT count(*) FROM messages WHERE entity_id = %b AND state != 'locked'{clauses}",
            (entity_id, *params),
        )
        return int(n)

    def insert_task(
        self, kind: str, entity_id: int, spec: dict[str, Any], total: int, now: float
    ) -> int:
        ((task_id,),) = self._all(
            "INSERT INTO tasks (kind, entity_id, status, spec, total, created_at, updated_at)"
            " VALUES (%b, %b, 'running', %b, %b, %b, %b) RETURNING id",
            (kind, entity_id, json.dumps(spec), total, now, now),
        )
        return int(task_id)

    def task(self, task_id: int) -> TaskRecord | None:
        rows = self._all(
            "SELECT id, kind, entity_id, status, spec, total, done, created_at, updated_at, error"
            " FROM tasks WHERE id = %b",
            (task_id,),
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
        self._run(
            "UPDATE tasks SET done = %b, status = %b, error = %b, updated_at = %b WHERE id = %b",
            (done, status, error, now, task_id),
        )
