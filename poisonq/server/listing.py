"""The explorer's listing newest first: a page ends below the sequence number ``before``."""

from __future__ import annotations

from typing import Any

from poisonq.client import Broker
from poisonq.model import ReceivedMessage


def newest_dead_letters(
    broker: Broker, queue: str, before: int | None, limit: int, where: dict[str, Any]
) -> list[ReceivedMessage]:
    """The ``limit`` dead letters of ``queue`` matching ``where`` with the highest sequence
    numbers below ``before`` (all of them when None), highest first."""
    if before is not None:
        below = before - 1
        where = {**where, "max_sequence": min(below, where.get("max_sequence", below))}
    return broker.dead_letters(queue, limit=limit, newest_first=True, **where)
