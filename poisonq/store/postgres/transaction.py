"""The SQL of the PostgreSQL store: one :class:`PostgresTransaction` per store transaction.

The statements follow the SQLite store's one for one (same tables, columns and guards; the
rows and filters both read are :mod:`poisonq.store.rows`), and those that read the same in both
dialects are written once, in the ``*_sql`` modules of :mod:`poisonq.store` this class
inherits. What differs is concurrency.
SQLite runs one writer at a time; here transactions run side by side under READ COMMITTED, so:

- a receive takes its batch as a cover (``covers.py``) when it gets the entity's cover lock at
  once, and otherwise locks rows with ``FOR UPDATE SKIP LOCKED``: competing receivers take
  disjoint batches without waiting for each other;
- a lease's cover locks no row (``covers.py``): what keeps its messages from other claims is
  the entity's cover lock, held shared by every receive, TTL sweep, bulk task and send of the
  entity and exclusive by a lease while it takes its batch;
- every read that a later statement of the same transaction acts on (expired locks and TTLs,
  the locks a settlement names, the messages a bulk task selects) locks its rows
  (``FOR UPDATE``), so no other transaction can change them in between;
- the ledger is written just before ``COMMIT`` (``runner.py``): the entity row is the one row
  every transaction on a queue updates, and holding its lock only for the commit itself keeps
  concurrent consumers from queueing behind each other's whole transactions. Entities are
  updated in id order, so two transactions never wait for each other's entity rows in a cycle;
- messages have no foreign key to their entity (schema 5): a statement that adds messages to an
  entity holds that entity row (``FOR KEY SHARE``, see ``_DESTINATION``) and adds nothing if it is
  gone, and :meth:`PostgresTransaction.delete_entity` deletes the entity rows before their
  messages, so a deletion waits for the transactions adding to it and then deletes what they
  added.

How a lease locks and what a bulk task selects are in ``batches.py``; running statements, the
ledger, the history's writes and answers fetched ahead in ``runner.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from poisonq.errors import EntityNotFoundError
from poisonq.model import HELD_STATES, EntityStatus, MessageState, ReceivedMessage
from poisonq.store.base import (
    Deleted,
    EntityRecord,
    Letter,
    LockInfo,
    MessageFilter,
    NewMessage,
    Transaction,
    all_alike,
)
from poisonq.store.entities_sql import EntityStatements
from poisonq.store.history import HistoryBuffer
from poisonq.store.housekeeping_sql import HousekeepingStatements
from poisonq.store.leases_sql import as_covered, held_by, within
from poisonq.store.ledger import LedgerCounts
from poisonq.store.postgres.batches import (
    BatchQueries,
    filter_clauses,
    in_index_order,
    ready_seqs,
)
from poisonq.store.postgres.covers import COVER_DELIVERY, COVERED, SESSION_PICKS, TOP, emptied
from poisonq.store.postgres.runner import Results

# The message columns below return the values the shared row mappers take, in their order
# (``failures::text`` is the JSON text SQLite keeps).
from poisonq.store.rows import ENTITY_COLUMNS as _ENTITY_COLUMNS
from poisonq.store.rows import HELD_IN, message_rows
from poisonq.store.rows import LIVE as _LIVE
from poisonq.store.rows import entity_row as entity_from_row
from poisonq.store.rows import message_row as message_from_row
from poisonq.store.sessions_sql import SessionStatements
from poisonq.store.settling_sql import SettlingStatements
from poisonq.store.tasks_sql import TaskStatements
from poisonq.store.timelines_sql import TimelineStatements

# The deleted entities' ledgers, summed (schema 19), a column each named ``gone_…``.
_DELETED_TOTALS = (
    "SELECT "
    + ", ".join(f"coalesce(sum({name}), 0)::bigint AS gone_{name}" for name in Deleted._fields)
    + " FROM deleted_entities"
)
# What the ledgers of an entity and its subqueues held as they are deleted (the row ids kept,
# with the entities'), the messages they held to be counted in by the statement that
# deletes them.
_KEEP_DELETED_LEDGERS = (
    "WITH gone AS (DELETE FROM entities WHERE id = %(id)b OR parent_id = %(id)b"
    " RETURNING id, name, sent, moved_in, completed, dropped, moved_out)"
    " INSERT INTO deleted_entities (entity_id, name, deleted_at, sent, moved_in, completed,"
    " dropped, moved_out) SELECT id, name, %(now)b, sent, moved_in, completed, dropped,"
    " moved_out FROM gone RETURNING id, entity_id"
)

_MESSAGE_COLUMNS = (
    "seq, message_id, body, content_type, subject, properties, session_id, correlation_id,"
    " reply_to, state, enqueued_at, scheduled_at, expires_at, delivery_count, abort_count,"
    " move_count, resubmit_count, hop_count, lock_token, locked_until, dead_letter_reason,"
    " dead_letter_description, dead_letter_source, failures::text, to_address,"
    " reply_to_session_id, partition_key"
)
# The same, of a message a receive's cover holds: locked under the receive's token, with the
# delivery the cover counts (see covers.py).
_COVERED_COLUMNS = as_covered(
    _MESSAGE_COLUMNS, "'locked'::text", "%(token)b::text", "%(until)b::float8"
)
# The counters the retry policy decides on (LockInfo), for a settlement or a lock sweep.
_LOCK_COLUMNS = "seq, delivery_count, move_count, dead_lettered_deliveries"
_STATES = {s.value: s for s in MessageState}
# The messages of an entity past their TTL, by the partial index on expires_at. OFFSET 0 keeps
# the planner from merging a state condition in here: on a table it has no statistics for yet
# (a new queue), it would walk every active message by the state index instead.
_EXPIRING = (
    "(SELECT seq, state FROM messages WHERE entity_id = %(e)b AND expires_at <= %(now)b OFFSET 0)"
)


def _record_failure(failure: str) -> str:
    """SET clauses that append a failure record (``failure``: a jsonb expression, NULL for
    none) to a message's history, and keep the columns dead-letter analysis groups by."""
    return (
        f" failures = CASE WHEN {failure} IS NULL THEN failures"
        f"   ELSE coalesce(failures, '[]'::jsonb) || jsonb_build_array({failure}) END,"
        f" last_error_type = coalesce({failure} ->> 'error_type', last_error_type),"
        f" last_fingerprint = coalesce({failure} ->> 'fingerprint', last_fingerprint)"
    )


# The letters of a dead-lettering (see Letter), one row each, from arrays of equal length.
_LETTERS = (
    "unnest(%(seqs)b::bigint[], %(reasons)b::text[], %(descriptions)b::text[],"
    " %(failures)b::jsonb[]) AS letter(sequence_number, reason, description, failure)"
)
# Letters that share their reason, description and failure: those bound once, as one row
# that joins every message (joined by sequence number, the row per message was planned as a
# nested loop over the array for every message when the statistics were stale: 2 ms of a
# batch of 100).
_ALIKE = (
    "(SELECT %(reason)b::text AS reason, %(description)b::text AS description,"
    " %(failure)b::jsonb AS failure) AS letter"
)


# The entity a statement adds messages to, held against deletion until the transaction ends
# (one lock per statement where a foreign key would check every row). Joined into the
# statement, so that a deleted entity gets no rows: see _check_destination.
_DESTINATION = "(SELECT id FROM entities WHERE id = %(destination)b FOR KEY SHARE) AS destination"

# A settlement's rows joined with the messages they name, by sequence number. The array
# of sequence numbers too: once the plan of the statement is generic (after five runs of a
# prepared statement), the join alone was planned as a walk of the entity's messages for
# every row, 0.3-0.7 s for 1,000 letters; the array makes the messages a look-up of the
# primary key (+entity_id: see _RECEIVE_BATCH in covers.py).
_NAMED = "messages.seq = ANY(%(seqs)b) AND +entity_id = %(entity)b"
_JOINED = "messages.seq = {alias}.sequence_number AND " + _NAMED
# A message held under the lock token bound as ``token``, valid at ``now``: locked, or covered.
_HELD_BY_TOKEN = held_by("%(entity)b", "%(token)b", "%(now)b")
# A message a lease's cover holds counts its delivery in its row as it leaves (COVERED asks the
# source's covers); a dead letter is never leasable (a cover of its queue taken meanwhile
# must not count it). The messages are named by sequence number, so that the test of a cover
# beside the lock's (_HELD_BY_TOKEN) costs one look-up of the lease row.
_DEAD_LETTER = (
    "WITH moved AS (UPDATE messages SET entity_id = destination.id, state = 'dead_lettered',"
    " lock_token = NULL, locked_until = NULL, dead_letter_reason = letter.reason,"
    f" leasable = 0, delivery_count = delivery_count + {COVER_DELIVERY},"
    # Without a description, the last recorded failure describes the message.
    " dead_letter_description = coalesce(letter.description,"
    "   (failures -> -1 ->> 'error_type') || ': ' || (failures -> -1 ->> 'message')),"
    " dead_letter_source = %(source)b, dead_lettered_at = %(now)b,"
    f" dead_lettered_deliveries = delivery_count + {COVER_DELIVERY},"
    f" {_record_failure('letter.failure')}"
    f" FROM {_DESTINATION}, {{letters}} WHERE {{named}}"
    f" AND state IN {_LIVE} AND (%(token)b::text IS NULL OR {_HELD_BY_TOKEN})"
    " RETURNING seq, size, dead_letter_reason, subject, last_fingerprint),"
    f" {emptied('moved')} SELECT * FROM moved"
)
_DEAD_LETTER_EACH = _DEAD_LETTER.format(letters=_LETTERS, named=_JOINED.format(alias="letter"))
# An abandon of messages ``held`` (a condition: locked, or held by a lease's cover), each with
# its failure; a covered message's delivery is counted in its row as it leaves its lease.
_ABANDON = (
    "UPDATE messages SET state = %(ready)b, lock_token = NULL, locked_until = NULL,"
    f" delivery_count = delivery_count + {COVER_DELIVERY}, leasable = 0,"
    f" abort_count = abort_count + 1, {_record_failure('failed.failure')}"
    " FROM unnest(%(seqs)b::bigint[], %(failures)b::jsonb[])"
    f" AS failed(sequence_number, failure) WHERE {_JOINED.format(alias='failed')}"
    " AND {held}"
)
_DEAD_LETTER_ALIKE = _DEAD_LETTER.format(letters=_ALIKE, named=_NAMED)


# The entity's locked messages past their lock, oldest first (see in_index_order).
_LOCKED_IN_ORDER = in_index_order(
    "entity_id, state, seq", "%(e)b, 'locked'", also="locked_until <= %(now)b"
)


def _failure_json(failure: dict[str, Any] | None) -> str | None:
    # jsonb refuses the escape \u0000, which an exception message may well contain.
    return json.dumps(failure).replace("\\u0000", "\\ufffd") if failure else None


class PostgresTransaction(
    SessionStatements,
    EntityStatements,
    TaskStatements,
    BatchQueries,
    SettlingStatements,
    TimelineStatements,
    HousekeepingStatements,
    LedgerCounts,
    Transaction,
):
    _FENCE = " OFFSET 0"  # the housekeeping probes: see HousekeepingStatements
    # See SessionStatements: the first of the oldest 32 free sessions' messages whose session
    # no other look is taking (the scan of the materialized candidates stops at it).
    _PICK_FREE = (
        "WITH candidates AS MATERIALIZED ({candidates} LIMIT 32) SELECT session_id"
        f" FROM candidates WHERE pg_try_advisory_xact_lock({SESSION_PICKS},"
        " hashtext(:entity::text || '/' || session_id)) LIMIT 1"
    )
    # The aggregates' keys and hours as the triggers of schema 12 write them.
    _KEY = "coalesce(to_jsonb({column})::text, 'null')"
    _HOUR = "floor({time} / 3600)::bigint * 3600"

    # Entities -----------------------------------------------------------------------------
    async def entity(self, name: str) -> EntityRecord | None:
        await self.flush_ledger()
        known = self._recall(("entity", name))
        if known is not None:
            return cast(EntityRecord, known)
        # The engine resolves a queue's subqueues (or a subqueue's queue) right after the
        # entity itself: fetch the whole family in the same round trip.
        rows = await self._fetch_all(
            "WITH named AS (SELECT id, parent_id FROM entities WHERE name = %b)"
            f" SELECT {_ENTITY_COLUMNS} FROM entities WHERE id IN (SELECT id FROM named)"
            " OR id IN (SELECT parent_id FROM named) OR parent_id IN (SELECT id FROM named)",
            (name,),
        )
        found = None
        for record in map(entity_from_row, rows):
            self._names[record.id] = record.name
            if record.name == name:
                found = record
            else:
                self._remember(("entity", record.name), record)
                self._remember(("entity_id", record.id), record)
        return found

    async def entity_by_id(self, entity_id: int) -> EntityRecord:
        await self.flush_ledger()
        known = self._recall(("entity_id", entity_id))
        if known is not None:
            return cast(EntityRecord, known)
        return await super().entity_by_id(entity_id)

    async def entities(self) -> list[EntityRecord]:
        await self.flush_ledger()
        return await super().entities()

    async def audit_rows(self) -> tuple[list[tuple[EntityRecord, int]], Deleted]:
        # The ledgers, the rows and the deleted ledgers in one statement: under READ
        # COMMITTED separate statements could see other transactions' commits in between
        # (a message moved, an entity deleted) and report a ledger out of balance that is
        # not. The deleted sums come on every row, and on a row of NULLs if no entity is left.
        await self.flush_ledger()
        rows = await self._fetch_all(
            f"SELECT {_ENTITY_COLUMNS}, (SELECT count(*) FROM messages"
            f" WHERE messages.entity_id = entities.id), gone.* FROM ({_DELETED_TOTALS}) AS gone"
            " LEFT JOIN entities ON true ORDER BY name"
        )
        width = len(Deleted._fields)
        deleted = Deleted(*rows[0][-width:])
        if rows[0][0] is None:
            return [], deleted
        return [(entity_from_row(row[: -width - 1]), row[-width - 1]) for row in rows], deleted

    async def set_status(
        self, entity_id: int, status: EntityStatus, cause: str | None, now: float
    ) -> None:
        await super().set_status(entity_id, status, cause, now)
        self._made_receivable()  # an enabled queue may have messages to receive

    async def delete_entity(self, entity_id: int, now: float) -> None:
        # The entity rows first: this waits for every transaction that holds them to add
        # messages (_DESTINATION), and the messages are deleted by a later statement, which sees
        # what those transactions committed. Leases, duplicate-detection ids, sessions and
        # tasks go with the entity rows (ON DELETE CASCADE). Each row's ledger is kept as
        # the deletion returns it (the version those transactions committed), and the
        # messages deleted after it are counted into it as discarded.
        await self.flush_ledger()
        self.history = HistoryBuffer()
        kept = await self._fetch_all(_KEEP_DELETED_LEDGERS, {"id": entity_id, "now": now})
        await self._run(
            "WITH held AS (DELETE FROM messages WHERE entity_id = ANY(%(entities)b)"
            " RETURNING entity_id), counted AS (SELECT entity_id, count(*) AS n FROM held"
            " GROUP BY entity_id) UPDATE deleted_entities d SET discarded = counted.n"
            " FROM counted WHERE d.id = ANY(%(kept)b) AND d.entity_id = counted.entity_id",
            {"entities": [row[1] for row in kept], "kept": [row[0] for row in kept]},
        )

    async def held_counts(
        self, entity_id: int, ready: MessageState, held: int
    ) -> dict[MessageState, int]:
        others = [s.value for s in HELD_STATES if s is not ready]
        # The covered messages are locked, not ready.
        rows = await self._fetch_all(
            "SELECT state, count(*) FROM messages WHERE entity_id = %(entity)b"
            " AND state = ANY(%(others)b) GROUP BY state UNION ALL SELECT 'locked', count(*)"
            " FROM messages WHERE entity_id = %(entity)b AND state = %(ready)b AND leasable = 1"
            f" AND seq <= {TOP}",
            {"entity": entity_id, "others": others, "ready": ready.value},
        )
        counts: dict[MessageState, int] = {}
        for state, n in rows:
            counts[_STATES[state]] = counts.get(_STATES[state], 0) + n
        counts[ready] = held - sum(counts.values())
        return {state: n for state, n in counts.items() if n}

    # Sending ------------------------------------------------------------------------------
    async def insert_messages(
        self, entity_id: int, rows: Sequence[NewMessage], now: float, *, last: bool = False
    ) -> list[int]:
        # One statement for the whole batch: each column is bound as one array and the rows
        # are rebuilt with unnest, so the statement text (and its prepared plan) never changes
        # with the batch size. A column no message uses is bound as NULL, which unnest pads;
        # so are the state and the size when every message has the usual one (active; the
        # body's length), the common case: an array less to send and to read costs more than
        # the coalesce that fills it in (docs/speed.md).
        def column(name: str) -> list[Any] | None:
            values = [getattr(m, name) for m in rows]
            return values if any(v is not None for v in values) else None

        usual_state = all(m.state is MessageState.ACTIVE for m in rows)
        usual_size = all(m.size == len(m.body) for m in rows)

        scheduled = column("scheduled_at")
        # Counted before it runs (the sizes are known), so that with ``last`` the ledger can
        # travel with the statement and COMMIT.
        self._count_sent(entity_id, len(rows), sum(m.size for m in rows))
        await self._claiming(entity_id)  # their sequence numbers above any cover (covers.py)
        seqs = await self._fetch_all(
            "INSERT INTO messages (entity_id, enqueued_at, state, message_id, body, size,"
            " content_type, subject, properties, session_id, correlation_id, reply_to,"
            " scheduled_at, visible_at, expires_at, to_address, reply_to_session_id,"
            " partition_key)"
            " SELECT destination.id, %(now)b, coalesce(r.state, 'active'), r.message_id, r.body,"
            " coalesce(r.size, octet_length(r.body)), r.content_type,"
            " r.subject, r.properties, r.session_id, r.correlation_id, r.reply_to,"
            " r.scheduled_at, r.scheduled_at, r.expires_at, r.to_address, r.reply_to_session_id,"
            " r.partition_key"
            f" FROM {_DESTINATION}, unnest(%(state)b::text[], %(id)b::text[], %(body)b::bytea[],"
            " %(size)b::int[], %(type)b::text[], %(subject)b::text[], %(props)b::text[],"
            " %(session)b::text[], %(correlation)b::text[], %(reply)b::text[],"
            " %(scheduled)b::float8[], %(expires)b::float8[], %(to)b::text[],"
            " %(reply_session)b::text[], %(partition)b::text[])"
            " WITH ORDINALITY AS r(state, message_id, body, size, content_type, subject,"
            " properties, session_id, correlation_id, reply_to, scheduled_at, expires_at,"
            " to_address, reply_to_session_id, partition_key, n)"
            " ORDER BY r.n RETURNING seq",
            {
                "destination": entity_id,
                "now": now,
                "state": None if usual_state else [m.state.value for m in rows],
                "id": [m.message_id for m in rows],
                "body": [m.body for m in rows],
                "size": None if usual_size else [m.size for m in rows],
                "type": column("content_type"),
                "subject": column("subject"),
                "props": column("properties"),
                "session": column("session_id"),
                "correlation": column("correlation_id"),
                "reply": column("reply_to"),
                "scheduled": scheduled,
                "expires": column("expires_at"),
                "to": column("to_address"),
                "reply_session": column("reply_to_session_id"),
                "partition": column("partition_key"),
            },
            last=last,
        )
        await self._check_destination(entity_id, len(rows), len(seqs))
        # Identity values are drawn in the order the rows are inserted (ORDER BY r.n).
        return sorted(row[0] for row in seqs)

    async def remember_message_ids(
        self, entity_id: int, message_ids: Sequence[str], expires_at: float
    ) -> None:
        await self._run(
            "INSERT INTO seen_message_ids (entity_id, message_id, expires_at)"
            " SELECT %b, unnest(%b::text[]), %b ON CONFLICT (entity_id, message_id)"
            " DO UPDATE SET expires_at = excluded.expires_at",
            (entity_id, list(message_ids), expires_at),
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
        last: bool = False,
    ) -> list[ReceivedMessage]:
        if session_id is None:
            rows = await self._receive_batch(
                _MESSAGE_COLUMNS, _COVERED_COLUMNS, entity_id, ready, limit, token,
                locked_until, last=last,
            )  # fmt: skip
        else:
            rows = await self._lock_ready(
                _MESSAGE_COLUMNS, entity_id, ready, limit, token, locked_until, session_id,
                last=last,
            )  # fmt: skip
        rows.sort(key=lambda row: row[0])
        return message_rows(rows, name)

    async def take_ready(
        self, entity_id: int, name: str, ready: MessageState, limit: int
    ) -> list[ReceivedMessage]:
        await self._claiming(entity_id)
        rows = await self._fetch_all(
            f"DELETE FROM messages WHERE seq = ANY({ready_seqs()})"
            f" RETURNING {_MESSAGE_COLUMNS}, size",
            {"entity": entity_id, "ready": ready.value, "limit": limit},
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
        rows = await self._fetch_all(
            "UPDATE messages SET state = 'locked', lock_token = %b, locked_until = %b,"
            " delivery_count = delivery_count + 1"
            " WHERE entity_id = %b AND state = 'deferred' AND seq = ANY(%b)"
            f" RETURNING {_MESSAGE_COLUMNS}",
            (token, locked_until, entity_id, list(seqs)),
        )
        rows.sort(key=lambda row: row[0])
        return message_rows(rows, name)

    async def peek(
        self, entity_id: int, name: str, from_seq: int, limit: int, where: MessageFilter
    ) -> list[ReceivedMessage]:
        clauses, params = filter_clauses(where)
        rows = await self._fetch_all(
            f"SELECT {_MESSAGE_COLUMNS} FROM held_messages WHERE entity_id = %b AND seq >= %b"
            f"{clauses} ORDER BY seq LIMIT %b",
            (entity_id, from_seq, *params, limit),
        )
        return message_rows(rows, name)

    async def message(self, entity_id: int, name: str, seq: int) -> ReceivedMessage | None:
        rows = await self._fetch_all(
            f"SELECT {_MESSAGE_COLUMNS} FROM held_messages WHERE entity_id = %b AND seq = %b",
            (entity_id, seq),
        )
        return message_from_row(rows[0], name) if rows else None

    async def messages(
        self, entity_id: int, name: str, seqs: Sequence[int]
    ) -> list[ReceivedMessage]:
        rows = await self._fetch_all(
            f"SELECT {_MESSAGE_COLUMNS} FROM held_messages WHERE entity_id = %b"
            " AND seq = ANY(%b)"
            " ORDER BY seq",
            (entity_id, list(seqs)),
        )
        return message_rows(rows, name)

    async def still_stored(self, seqs: Sequence[int]) -> set[int]:
        rows = await self._fetch_all("SELECT seq FROM messages WHERE seq = ANY(%b)", (list(seqs),))
        return {row[0] for row in rows}

    async def locked(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float
    ) -> list[LockInfo]:
        # FOR UPDATE: the settlement that follows acts on exactly these rows, and no lock
        # sweep of another transaction can release them in between.
        rows = await self._fetch_all(
            f"SELECT {_LOCK_COLUMNS} FROM messages WHERE entity_id = %b"
            " AND state = 'locked' AND lock_token = %b AND locked_until > %b AND seq = ANY(%b)"
            " ORDER BY seq FOR UPDATE",
            (entity_id, token, now, list(seqs)),
        )
        held = [LockInfo(*row) for row in rows]
        if len(held) < len(seqs):  # the others may be held by a lease's cover
            covered = await self._covered_of(entity_id, token, seqs, now)
            if covered:
                held += [
                    LockInfo(*row)
                    for row in await self._fetch_all(
                        "SELECT seq, delivery_count + 1, move_count, dead_lettered_deliveries"
                        " FROM messages WHERE seq = ANY(%b) ORDER BY seq",
                        (covered,),
                    )
                ]
        return held

    async def _sweep(self, entity_id: int, now: float) -> list[LockInfo]:
        """A receive's housekeeping reads, in one statement: the expired locks (returned),
        and whether any scheduled message is due or any message is past its TTL (remembered:
        promote_scheduled and expired_messages usually find nothing, and then cost nothing)."""
        # SKIP LOCKED: an expired lock that another transaction is already releasing (or its
        # owner is settling, and will find lost) is that transaction's to handle.
        rows = await self._fetch_all(
            "SELECT l.seq, l.delivery_count, l.move_count, l.dead_lettered_deliveries,"
            " f.nothing_due, f.nothing_expired, f.covers_expired FROM (SELECT NOT EXISTS"
            "   (SELECT FROM messages WHERE entity_id = %(e)b AND state = 'scheduled'"
            f"   AND visible_at <= %(now)b) AS nothing_due, NOT EXISTS (SELECT FROM {_EXPIRING} m"
            "   WHERE state IN ('scheduled', 'active')) AS nothing_expired, EXISTS (SELECT FROM"
            "   leases WHERE entity_id = %(e)b AND cover_lo IS NOT NULL"
            "   AND locked_until <= %(now)b) AS covers_expired) AS f"
            f" LEFT JOIN LATERAL (SELECT {_LOCK_COLUMNS} FROM messages {_LOCKED_IN_ORDER}"
            "   FOR UPDATE SKIP LOCKED) AS l ON true ORDER BY l.seq",
            {"e": entity_id, "now": now},
        )
        self._remember(("nothing due", entity_id, now), rows[0][4])
        self._remember(("nothing expired", entity_id, now), rows[0][5])
        expired = [LockInfo(*row[:4]) for row in rows if row[0] is not None]
        if rows[0][6]:
            expired = sorted(expired + await self._expired_covered(entity_id, now), key=_seq)
        return expired

    async def _expired_covered(self, entity_id: int, now: float) -> list[LockInfo]:
        """The messages of the entity's covers whose lock ran out, each a lock that ran out
        (with the delivery its lease made). A cover another sweep has is its to handle (and
        to close: see :meth:`close_expired_leases`); a message whose settlement is under way
        is waited for, and left out if it changed."""
        covers = await self._fetch_all(
            "SELECT consumer, number, cover_lo, cover_hi FROM leases"
            " WHERE entity_id = %b AND cover_lo IS NOT NULL AND locked_until <= %b"
            " FOR UPDATE SKIP LOCKED",
            (entity_id, now),
        )
        if not covers:
            return []
        self._expired_covers[entity_id] = [(row[0], row[1]) for row in covers]
        rows = await self._fetch_all(
            "SELECT m.seq, m.delivery_count + 1, m.move_count, m.dead_lettered_deliveries"
            " FROM unnest(%(los)b::bigint[], %(his)b::bigint[]) AS c(lo, hi)"
            " JOIN messages m ON m.entity_id = %(entity)b AND m.leasable = 1"
            " AND m.state IN ('active', 'dead_lettered') AND m.seq BETWEEN c.lo AND c.hi"
            " ORDER BY m.seq FOR UPDATE OF m",
            {
                "entity": entity_id,
                "los": [row[2] for row in covers],
                "his": [row[3] for row in covers],
            },
        )
        return [LockInfo(*row) for row in rows]

    async def close_expired_leases(self, entity_id: int, now: float) -> None:
        # Only the covers this transaction swept: one another sweep has may be its to close
        # (waiting for it here, two sweeps would wait for each other).
        # A receive's cover (of no consumer) is nothing once closed: its row goes.
        swept = self._expired_covers.pop(entity_id, None)
        if swept:
            consumers, numbers = zip(*swept, strict=True)
            await self._run(
                "WITH swept AS (SELECT * FROM unnest(%(consumers)b::text[], %(numbers)b::bigint[])"
                " AS s(consumer, number)), gone AS (DELETE FROM leases WHERE entity_id = %(entity)b"
                " AND consumer = '' AND (consumer, number) IN (SELECT * FROM swept))"
                " UPDATE leases SET cover_lo = NULL, cover_hi = NULL WHERE entity_id = %(entity)b"
                " AND consumer != '' AND (consumer, number) IN (SELECT * FROM swept)",
                {"entity": entity_id, "consumers": list(consumers), "numbers": list(numbers)},
            )

    async def receive_follows(self, entity_id: int) -> None:
        self._receiving = entity_id

    async def _sweep_after(self, entity_id: int, now: float) -> None:
        """Run the housekeeping reads of the receive the caller said follows
        (:meth:`receive_follows`) with a settlement, in its round trip."""
        if self._receiving == entity_id:
            self._remember(("expired locks", entity_id, now), await self._sweep(entity_id, now))

    async def expired_locks(self, entity_id: int, now: float) -> list[LockInfo]:
        known = self._recall(("expired locks", entity_id, now))
        if known is not None:
            return cast(list[LockInfo], known)
        return await self._sweep(entity_id, now)

    async def expired_messages(self, entity_id: int, now: float) -> list[int]:
        if self._recall(("nothing expired", entity_id, now)):
            return []
        await self._claiming(entity_id)
        # A message a lease's cover holds is locked: it does not expire.
        rows = await self._fetch_all(
            f"SELECT seq FROM messages WHERE seq IN (SELECT seq FROM {_EXPIRING} m)"
            f" AND state IN ('scheduled', 'active') AND NOT {COVERED} ORDER BY seq"
            " FOR UPDATE SKIP LOCKED",
            {"e": entity_id, "entity": entity_id, "now": now},
        )
        return [row[0] for row in rows]

    async def promote_scheduled(self, entity_id: int, now: float) -> int:
        if self._recall(("nothing due", entity_id, now)):
            return 0
        promoted = await self._changed(
            "UPDATE messages SET state = 'active', leasable = 0 WHERE entity_id = %b"
            " AND state = 'scheduled' AND visible_at <= %b",
            (entity_id, now),
        )
        self._made_receivable(promoted)
        return promoted

    async def due_scheduled(self, entity_id: int, now: float) -> list[int]:
        # Locked, for the move that follows; one another receive is moving already is its own.
        rows = await self._fetch_all(
            "SELECT seq FROM messages WHERE entity_id = %b AND state = 'scheduled'"
            " AND visible_at <= %b ORDER BY seq FOR UPDATE SKIP LOCKED",
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
        rows = await self._fetch_all(
            "UPDATE messages SET entity_id = destination.id,"
            " state = coalesce(%(state)b::text, state),"
            " visible_at = coalesce(%(visible)b::float8, visible_at),"
            " move_count = move_count + %(moves)b, hop_count = hop_count + %(hops)b,"
            f" leasable = 0 FROM {_DESTINATION} WHERE entity_id = %(entity)b"
            f" AND state IN {HELD_IN} AND state != 'locked' AND NOT {COVERED}"
            " AND seq = ANY(%(seqs)b) RETURNING seq, size",
            {
                "destination": destination_id,
                "state": None if state is None else state.value,
                "visible": visible_at,
                "moves": move_count,
                "hops": hop_count,
                "entity": entity_id,
                "seqs": list(seqs),
            },
        )
        await self._check_destination(destination_id, len(seqs), len(rows))
        moved, size = len(rows), sum(row[1] for row in rows)
        self._count_moved(entity_id, destination_id, moved, size)
        return sorted(row[0] for row in rows)

    # Settling -----------------------------------------------------------------------------
    async def complete(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float
    ) -> list[int]:
        # Locked or covered in one statement: the messages are named by sequence number (see
        # _RECEIVE_BATCH in covers.py for +entity_id), so the test of the cover beside the
        # lock's costs a look-up of the lease row, once.
        done = await self._run(
            "WITH gone AS (DELETE FROM messages WHERE seq = ANY(%(seqs)b)"
            f" AND +entity_id = %(entity)b AND {_HELD_BY_TOKEN} RETURNING seq, size),"
            f" {emptied('gone')} SELECT seq, size FROM gone",
            {"seqs": list(seqs), "entity": entity_id, "token": token, "now": now},
        )
        await self._sweep_after(entity_id, now)
        return await self._completed(entity_id, done)

    async def complete_span(self, entity_id: int, token: str, lo: int, hi: int, now: float) -> int:
        done = len(
            await self._completed(
                entity_id,
                await self._delete_locked(entity_id, token, now, "seq BETWEEN %b AND %b", lo, hi),
            )
        )
        cover = await self._cover(entity_id, token, now)
        span = within(cover, lo, hi)
        if span is not None:
            # Counted in the statement: RETURNING would send every row back.
            ((count, size),) = await self._fetch_all(
                "WITH gone AS (DELETE FROM messages WHERE entity_id = %b AND leasable = 1"
                " AND state IN ('active', 'dead_lettered') AND seq BETWEEN %b AND %b"
                " RETURNING size) SELECT count(*), coalesce(sum(size), 0) FROM gone",
                (entity_id, *span),
            )
            self._count_completed(entity_id, count, size)
            done += count
            if span == cover:
                await self._forget_cover(entity_id, token)
        return done

    async def _delete_locked(
        self, entity_id: int, token: str, now: float, which: str, *params: object
    ) -> Results:
        """Queue the deletion of the messages ``which`` names that are validly locked under
        ``token`` (a completion); :meth:`_completed` reads its result."""
        return await self._run(
            "DELETE FROM messages WHERE entity_id = %b AND state = 'locked' AND lock_token = %b"
            f" AND locked_until > %b AND {which} RETURNING seq, size",
            (entity_id, token, now, *params),
        )

    async def _completed(self, entity_id: int, done: Results) -> list[int]:
        rows = await done.fetchall()
        self._count_completed(entity_id, len(rows), sum(row[1] for row in rows))
        return [row[0] for row in rows]

    async def _check_destination(self, destination_id: int, asked: int, added: int) -> None:
        """Raise if a statement joined with ``_DESTINATION`` added fewer messages than asked
        because the destination entity was deleted meanwhile (fewer can also be right: messages
        no longer in the state the statement asks for)."""
        if added < asked and (
            self.committed
            or not await self._fetch_all("SELECT FROM entities WHERE id = %b", (destination_id,))
        ):
            # Deleted since this transaction looked it up: it is not found, as it would be a
            # moment later, and nothing was added to it.
            raise EntityNotFoundError(self._names.get(destination_id, f"#{destination_id}"))

    async def abandon(
        self,
        entity_id: int,
        seqs: Sequence[int],
        ready: MessageState,
        failures: Sequence[dict[str, Any] | None],
        lock_expired: bool,
    ) -> int:
        params = {
            "ready": ready.value,
            "failures": [_failure_json(failure) for failure in failures],
            "entity": entity_id,
            "seqs": list(seqs),
        }
        changed = await self._changed(_ABANDON.format(held="state = 'locked'"), params)
        if changed < len(seqs):  # the others are held by a lease's cover (the engine checked)
            changed += await self._changed(_ABANDON.format(held=COVERED), params)
        self._count_returned(entity_id, changed, lock_expired)
        return changed

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
        listed = "" if seqs is None else " AND seq = ANY(%(seqs)b)"
        rows = await self._fetch_all(
            "UPDATE messages SET state = %(ready)b, lock_token = NULL, locked_until = NULL,"
            " delivery_count = delivery_count - 1, leasable = 0"
            " WHERE entity_id = %(entity)b AND state = 'locked' AND lock_token = %(token)b"
            " AND locked_until > %(now)b AND seq BETWEEN %(lo)b AND %(hi)b"
            f"{listed} RETURNING seq",
            {
                "ready": ready.value,
                "entity": entity_id,
                "token": token,
                "now": now,
                "lo": lo,
                "hi": hi,
                "seqs": None if seqs is None else list(seqs),
            },
        )
        covered = await self._give_back_covered(entity_id, token, lo, hi, seqs, now)
        self._made_receivable(len(rows) + len(covered))
        return sorted([row[0] for row in rows] + covered)

    async def release_session(self, entity_id: int, session_id: str, token: str) -> int:
        given_up = await super().release_session(entity_id, session_id, token)
        self._made_receivable(given_up)  # another receiver may accept the session's messages
        return given_up

    async def dead_letter_each(
        self,
        entity_id: int,
        letters: Sequence[Letter],
        destination_id: int,
        source: str,
        now: float,
        lock_token: str | None = None,
    ) -> list[int]:
        where = {"destination": destination_id, "source": source, "now": now, "entity": entity_id}
        moving = await self._dead_letter(letters, {**where, "token": lock_token})
        await self._sweep_after(entity_id, now)
        rows = await moving.fetchall()
        await self._check_destination(destination_id, len(letters), len(rows))
        moved, size = len(rows), sum(row[1] for row in rows)
        self.history.dead_lettered(destination_id, (row[2:] for row in rows))
        self._count_moved(entity_id, destination_id, moved, size, "dead_lettered")
        return sorted(row[0] for row in rows)

    async def _dead_letter(self, letters: Sequence[Letter], params: dict[str, Any]) -> Results:
        """Queue the move of ``letters`` (see :data:`_DEAD_LETTER`), with ``params``."""
        first = all_alike(letters)
        params = {**params, "seqs": [letter.seq for letter in letters]}
        if first is not None:
            params.update(
                reason=first.reason,
                description=first.description,
                failure=_failure_json(first.failure),
            )
            return await self._run(_DEAD_LETTER_ALIKE, params)
        params.update(
            reasons=[letter.reason for letter in letters],
            descriptions=[letter.description for letter in letters],
            failures=[_failure_json(letter.failure) for letter in letters],
        )
        return await self._run(_DEAD_LETTER_EACH, params)

    async def drop(self, entity_id: int, seqs: Sequence[int]) -> int:
        rows = await self._fetch_all(
            f"DELETE FROM messages WHERE entity_id = %b AND state IN {HELD_IN} AND seq = ANY(%b)"
            " RETURNING size",
            (entity_id, list(seqs)),
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
        # One statement moves the rows: the copies get new, ascending sequence numbers (in
        # the old order), so a resubmitted message joins the back of the queue as a new send.
        await self._claiming(destination_id)
        rows = await self._fetch_all(
            f"WITH gone AS (DELETE FROM messages USING {_DESTINATION} WHERE entity_id = %(entity)b"
            " AND state IN ('active', 'deferred', 'dead_lettered') AND seq = ANY(%(seqs)b)"
            f" AND NOT {COVERED} RETURNING messages.*, destination.id AS destination_id)"
            " INSERT INTO messages (entity_id, state, message_id, body, size, content_type,"
            " subject, properties, session_id, correlation_id, reply_to, enqueued_at, expires_at,"
            " abort_count, resubmit_count, hop_count, last_error_type, last_fingerprint, failures,"
            " to_address, reply_to_session_id, partition_key)"
            " SELECT destination_id, 'active', message_id, body, size, content_type, subject,"
            " properties, session_id, correlation_id, reply_to, %(now)b, %(expires)b,"
            " abort_count, resubmit_count + 1, hop_count, last_error_type, last_fingerprint,"
            " failures, to_address, reply_to_session_id, partition_key FROM gone ORDER BY seq"
            " RETURNING size",
            {
                "entity": entity_id,
                "seqs": list(seqs),
                "destination": destination_id,
                "now": now,
                "expires": expires_at,
            },
        )
        await self._check_destination(destination_id, len(seqs), len(rows))
        moved, size = len(rows), sum(row[0] for row in rows)
        self._count_moved(entity_id, destination_id, moved, size, "resubmitted")
        return moved


def _seq(lock: LockInfo) -> int:
    return lock.seq
