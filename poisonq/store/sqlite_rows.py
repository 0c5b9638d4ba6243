"""Rows of the SQLite store: the column lists its statements select, and the functions that
turn rows into records. Shared by the transaction's modules; hot paths are marked."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from poisonq.model import (
    HELD_STATES,
    LIVE_STATES,
    EntityStatus,
    FailureRecord,
    MessageState,
    ReceivedMessage,
    SubQueue,
)
from poisonq.store.base import NO_VALUE, EntityRecord, Ledger, MessageFilter


def message_columns(source: str) -> str:
    """The columns of a received message, selected from ``messages`` or ``held_messages``."""
    return (
        f"seq, message_id, (SELECT body FROM bodies WHERE bodies.id = {source}.body_id), "
        "content_type, subject, properties, session_id, correlation_id, reply_to, state, "
        "enqueued_at, scheduled_at, expires_at, delivery_count, abort_count, move_count, "
        "resubmit_count, hop_count, lock_token, locked_until, dead_letter_reason, "
        "dead_letter_description, dead_letter_source, failures"
    )


# The rows themselves, for statements that change them...
MESSAGE_COLUMNS = message_columns("messages")
# ...and as readers see them (the view of schema 7): a message a lease covers is locked.
HELD_COLUMNS = message_columns("held_messages")
ENTITY_COLUMNS = (
    "id, name, parent_id, subqueue, status, status_cause, options, created_at, updated_at, "
    "sent, moved_in, completed, dropped, moved_out, dead_lettered, resubmitted, lock_expiries, "
    "size_bytes, abandoned, poisoned, rollbacks"
)
# The state sets of poisonq.model as SQL lists, for ``state IN …``.
HELD = "(" + ", ".join(f"'{state.value}'" for state in HELD_STATES) + ")"
LIVE = "(" + ", ".join(f"'{state.value}'" for state in LIVE_STATES) + ")"
# Whether a row of ``messages`` is held by a lease's cover range: it is ready (a queue's
# messages are active, a dead-letter queue's dead-lettered), leasable, and at or below the top
# of its entity's cover ranges. Every such message lies in exactly one cover (a lease's cover
# begins above the covers before it, and a message that comes back to ready stops being
# leasable), so the top is all a statement that changes rows needs to ask.
COVERED = (
    "(leasable = 1 AND state IN ('active', 'dead_lettered') AND seq <= coalesce("
    "(SELECT max(cover_hi) FROM leases WHERE leases.entity_id = messages.entity_id), 0))"
)
SEQS = "(SELECT value FROM json_each(?))"
LEDGER_COLUMNS = frozenset(Ledger.__slots__)
GROUP_KEYS = {
    "reason": ("dead_letter_reason", "dead_letter_reason"),
    "subject": ("subject", "subject"),
    "fingerprint": ("last_fingerprint", "last_error_type"),
}

STATES = {s.value: s for s in MessageState}
_datetime = datetime.fromtimestamp
INSERT_CHUNK = 250  # rows per INSERT statement, well under SQLite's 32,766 parameters
# Columns a sender may leave empty: a batch inserts only those some message in it uses, since
# binding parameters is a large part of the cost of an insert.
OPTIONAL_COLUMNS = (
    "content_type",
    "subject",
    "properties",
    "session_id",
    "correlation_id",
    "reply_to",
    "scheduled_at",
    "expires_at",
)


def message_rows(rows: Iterable[Sequence[Any]], entity: str) -> list[ReceivedMessage]:
    """Build received messages from rows of ``MESSAGE_COLUMNS`` (hot: runs per message).

    The messages of a batch were mostly sent together and are locked together, so their
    times repeat: each distinct time becomes a ``datetime`` once."""
    times: dict[float, datetime] = {}

    def when(stamp: float | None) -> datetime | None:
        if stamp is None:
            return None
        found = times.get(stamp)
        if found is None:
            found = times[stamp] = _datetime(stamp, UTC)
        return found

    return [_message(row, entity, when) for row in rows]


def message_row(row: Sequence[Any], entity: str) -> ReceivedMessage:
    """One received message from a row of ``MESSAGE_COLUMNS``."""
    return _message(row, entity, _utc)


def _utc(stamp: float | None) -> datetime | None:
    return None if stamp is None else _datetime(stamp, UTC)


def _message(
    row: Sequence[Any], entity: str, when: Callable[[float | None], datetime | None]
) -> ReceivedMessage:
    (
        seq, message_id, body, content_type, subject, props, session_id, correlation_id,
        reply_to, state, enqueued_at, scheduled_at, expires_at, delivery_count, abort_count,
        move_count, resubmit_count, hop_count, lock_token, locked_until, reason, description,
        source, failures,
    ) = row  # fmt: skip
    return ReceivedMessage(
        seq,
        entity,
        message_id,
        body,
        content_type,
        subject,
        json.loads(props) if props else {},
        session_id,
        correlation_id,
        reply_to,
        STATES[state],
        when(enqueued_at),  # type: ignore[arg-type]  # never NULL
        when(scheduled_at),
        when(expires_at),
        delivery_count,
        abort_count,
        move_count,
        resubmit_count,
        hop_count,
        lock_token,
        when(locked_until),
        reason,
        description,
        source,
        [FailureRecord.from_json(f) for f in json.loads(failures)] if failures else [],
    )


def entity_row(row: Sequence[Any]) -> EntityRecord:
    return EntityRecord(
        id=row[0],
        name=row[1],
        parent_id=row[2],
        subqueue=SubQueue(row[3]) if row[3] else None,
        status=EntityStatus(row[4]),
        status_cause=row[5],
        options=row[6],
        created_at=row[7],
        updated_at=row[8],
        ledger=Ledger(*row[9:20]),
        rollbacks=row[20],
    )


def seqs_json(seqs: Sequence[int]) -> str:
    return json.dumps(list(seqs))


# Whether a body holds the bytes of a parameter (SQLite keeps bodies in a table of their own).
BODY_CONTAINS = "instr((SELECT body FROM bodies WHERE bodies.id = body_id), ?) > 0"


def filter_sql(where: MessageFilter, body_contains: str = BODY_CONTAINS) -> tuple[str, list[Any]]:
    """``AND`` clauses (each with a leading space) and their parameters for ``where``;
    :data:`NO_VALUE` is ``IS NULL``. ``body_contains`` is the store's test of a body
    against one parameter (a scan of the bodies: for an operator's search)."""
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
        ("session_id", where.session_id, "="),
        ("message_id", where.message_id, "="),
    ):
        if value is NO_VALUE:
            clauses.append(f" AND {column} IS NULL")
        elif value is not None:
            clauses.append(f" AND {column} {op} ?")
            params.append(value)
    if where.body_contains is not None:
        clauses.append(f" AND {body_contains}")
        params.append(where.body_contains.encode())
    return "".join(clauses), params
