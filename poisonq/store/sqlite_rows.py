"""What the SQLite store's statements share that is its own: the message columns, the test
of the lease covers, lists of sequence numbers as JSON, and its dialect of the message
filters. The rest of the rows is shared with PostgreSQL (:mod:`poisonq.store.rows`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from poisonq.store.base import Ledger, MessageFilter
from poisonq.store.leases_sql import covered
from poisonq.store.rows import filter_sql

# The columns of a received message, selected from ``messages`` (the rows themselves, for
# statements that change them) or from ``held_messages`` (as readers see them, the view of
# schema 7: a message a lease covers is locked).
MESSAGE_COLUMNS = (
    "seq, message_id, body, content_type, subject, properties, session_id, correlation_id,"
    " reply_to, state, enqueued_at, scheduled_at, expires_at, delivery_count, abort_count,"
    " move_count, resubmit_count, hop_count, lock_token, locked_until, dead_letter_reason,"
    " dead_letter_description, dead_letter_source, failures, to_address, reply_to_session_id,"
    " partition_key"
)
# Whether a row of ``messages`` is held by a lease's cover range (see leases_sql.covered).
COVERED = covered("messages.entity_id")
SEQS = "(SELECT value FROM json_each(?))"
LEDGER_COLUMNS = frozenset(Ledger.__slots__)

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
    "to_address",
    "reply_to_session_id",
    "partition_key",
)


def seqs_json(seqs: Sequence[int]) -> str:
    return json.dumps(list(seqs))


# Whether a body holds the bytes of a parameter.
BODY_CONTAINS = "instr(body, ?) > 0"


def filter_clauses(where: MessageFilter) -> tuple[str, list[Any]]:
    """The clauses of :func:`poisonq.store.rows.filter_sql` in SQLite's dialect."""
    return filter_sql(where, "?", BODY_CONTAINS)
