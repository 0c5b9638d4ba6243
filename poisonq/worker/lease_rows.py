"""The message a pipeline's transform gets, built from a lease row.

Kept apart from :mod:`poisonq.spark` because it runs in the crash guard's helper process
(:mod:`poisonq.worker.guard`), which must stay lean: a fork costs in proportion to the memory of the
process forked, and importing pyspark, pyarrow or the store there would multiply it. Rows
travel to the child as the store's tuples of builtin values, which the guard writes into its
shared memory with ``marshal``, at a fraction of the cost of the dicts built from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from poisonq.worker.results import Transform

_NO_PROPERTIES = ("{}", "", None)


@lru_cache(maxsize=4096)
def _enqueued(timestamp: float) -> datetime:
    """A send batch shares one enqueue time: one datetime for all its messages (immutable,
    so sharing it is safe)."""
    return datetime.fromtimestamp(timestamp, UTC)


def lease_message(row: tuple[Any, ...]) -> dict[str, Any]:
    """A lease row (the store's ``LEASE_COLUMNS``, in that order) as the dict a transform
    gets. Built in one step: this runs once per message, and its cost is on every batch."""
    seq, message_id, body, content_type, subject, properties, session, correlation, at, count = row
    return {
        "sequence_number": seq,
        "message_id": message_id,
        "body": body,
        "content_type": content_type,
        "subject": subject,
        "properties": {} if properties in _NO_PROPERTIES else json.loads(properties),
        "session_id": session,
        "correlation_id": correlation,
        "enqueued_time": _enqueued(at),
        "delivery_count": count,
    }


@dataclass(frozen=True, slots=True)
class OnLeaseRows:
    """``transform`` applied to lease rows instead of message dicts."""

    transform: Transform

    def __call__(self, row: tuple[Any, ...]) -> dict[str, Any] | None:
        return self.transform(lease_message(row))
