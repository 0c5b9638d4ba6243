"""The message a pipeline's transform gets, built from a lease row.

Kept apart from :mod:`poisonq.spark` because it runs in the crash guard's helper process
(:mod:`poisonq.guard`), which must stay lean: a fork costs in proportion to the memory of the
process forked, and importing pyspark or pyarrow there would multiply it. Rows travel to the
helper as the store's tuples, which pickle at half the cost of the dicts built from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from poisonq.guard import Transform
from poisonq.store.base import LEASE_COLUMNS


def lease_message(row: tuple[Any, ...]) -> dict[str, Any]:
    """A lease row (:data:`LEASE_COLUMNS`) as the dict a transform gets."""
    message = dict(zip(LEASE_COLUMNS, row, strict=True))
    text = message["properties"]
    message["properties"] = json.loads(text) if text and text != "{}" else {}
    message["enqueued_time"] = datetime.fromtimestamp(message["enqueued_time"], UTC)
    return message


@dataclass(frozen=True, slots=True)
class OnLeaseRows:
    """``transform`` applied to lease rows instead of message dicts."""

    transform: Transform

    def __call__(self, row: tuple[Any, ...]) -> dict[str, Any] | None:
        return self.transform(lease_message(row))
