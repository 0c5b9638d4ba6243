"""The explorer's listing newest first, over a broker that lists dead letters oldest first.

``Broker.dead_letters`` pages up from a sequence number, and ``count_dead_letters`` counts
a sequence range; so the newest ``limit`` matches below a sequence number are found by
counting windows that reach back from it: widened until one holds ``limit`` matches, then
narrowed (counts only shrink as a window's start moves up, by at most one per step) until
it holds at most twice that, and read in one call. A page costs a few counts on the store's
index, however sparse the matches are.
"""

from __future__ import annotations

from typing import Any

from poisonq.client import Broker
from poisonq.model import ReceivedMessage


def newest_dead_letters(
    broker: Broker, queue: str, before: int | None, limit: int, where: dict[str, Any]
) -> list[ReceivedMessage]:
    """The ``limit`` dead letters of ``queue`` matching ``where`` with the highest sequence
    numbers below ``before`` (all of them when None), highest first."""
    held, lowest, highest = broker.sequence_span(f"{queue}/$deadletterqueue")
    top = min(highest, where.get("max_sequence", highest))
    if before is not None:
        top = min(top, before - 1)
    bottom = max(lowest, where.get("min_sequence", lowest))
    if not held or top < bottom:
        return []

    def count(start: int) -> int:
        return broker.count_dead_letters(
            queue, **{**where, "min_sequence": start, "max_sequence": top}
        )

    width, start, short = limit, top, top + 1  # short: a start known to hold too few
    while True:
        start = max(bottom, top - width + 1)
        found = count(start)
        if found >= limit or start == bottom:
            break
        short, width = start, width * 4
    while found > 2 * limit and short - start > 1:
        middle = (start + short) // 2
        if (in_middle := count(middle)) >= limit:
            start, found = middle, in_middle
        else:
            short = middle
    window = {**where, "min_sequence": start, "max_sequence": top}
    return broker.dead_letters(queue, limit=found, **window)[::-1][:limit]
