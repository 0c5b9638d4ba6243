"""Rows as both stores return them: the column lists and state lists their statements share,
and the functions that turn rows into records (the PostgreSQL store selects the same columns
in the same order, ``failures`` as JSON text). Hot paths are marked."""

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

# The state sets of poisonq.model as SQL lists, for ``state IN …``.
HELD_IN = "(" + ", ".join(f"'{state.value}'" for state in HELD_STATES) + ")"
LIVE = "(" + ", ".join(f"'{state.value}'" for state in LIVE_STATES) + ")"
# An entities row's held messages by its ledger (the row aliased ``e``): what the audit checks.
HELD_COUNT = "e.sent + e.moved_in - e.completed - e.dropped - e.moved_out"

ENTITY_COLUMNS = (
    "id, name, parent_id, subqueue, status, status_cause, options, created_at, updated_at, "
    "sent, moved_in, completed, dropped, moved_out, dead_lettered, resubmitted, lock_expiries, "
    "size_bytes, abandoned, poisoned, rollbacks"
)
GROUP_KEYS = {
    "reason": ("dead_letter_reason", "dead_letter_reason"),
    "subject": ("subject", "subject"),
    "fingerprint": ("last_fingerprint", "last_error_type"),
}

STATES = {s.value: s for s in MessageState}
_datetime = datetime.fromtimestamp


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
        source, failures, to_address, reply_to_session_id, partition_key,
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
        to_address,
        reply_to_session_id,
        partition_key,
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


def filter_sql(where: MessageFilter, placeholder: str, body_contains: str) -> tuple[str, list[Any]]:
    """``AND`` clauses (each with a leading space) and their parameters for ``where``;
    :data:`NO_VALUE` is ``IS NULL``. ``placeholder`` is the store's parameter marker, and
    ``body_contains`` its test of a body against one parameter (a scan of the bodies: for an
    operator's search)."""
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
            clauses.append(f" AND {column} {op} {placeholder}")
            params.append(value)
    if where.body_contains is not None:
        clauses.append(f" AND {body_contains}")
        params.append(where.body_contains.encode())
    return "".join(clauses), params
