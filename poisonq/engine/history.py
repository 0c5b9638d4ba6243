"""The charts' reads: the store's history of one dead-letter queue or of every queue, cut
into the bars of a window (:mod:`poisonq.history`), and the causes a reason hides."""

from __future__ import annotations

from collections import defaultdict

from poisonq.engine.base import EngineBase
from poisonq.engine.targets import Target, holds_dead_letters
from poisonq.history import TREND, Timeline, Trend, Window, peaks, timeline
from poisonq.model import SubQueue
from poisonq.store.base import (
    DeadLetterCause,
    DeadLetterCount,
    DepthChange,
    EntityRecord,
    Transaction,
)


class History(EngineBase):
    async def dead_letter_timeline(self, address: str, by: str, frame: Window) -> Timeline:
        """Messages dead-lettered into ``address`` over the window, by ``by``."""
        now = self.clock.now()
        counts = await self.housekeeper.read(
            address,
            lambda tx, target: tx.dead_letter_history(
                frame.span, frame.start(now), by, target.entity.id
            ),
        )
        return timeline(counts, frame, now)

    async def queue_trends(self) -> dict[str, Trend]:
        """Every queue's depth (the highest in each hour) and dead-letterings over the last
        day, by the hour."""
        now = self.clock.now()
        since = TREND.start(now)

        async def read(
            tx: Transaction,
        ) -> tuple[list[EntityRecord], list[DepthChange], list[DeadLetterCount]]:
            return (
                await tx.entities(),
                await tx.depth_history(TREND.span, since, None),
                await tx.dead_letter_history(TREND.span, since, None, None),
            )

        entities, changes, counts = await self.housekeeper.read_all(read)
        dlq_of = {e.parent_id: e.id for e in entities if e.subqueue is SubQueue.DEADLETTER}
        changes_of: defaultdict[int, list[DepthChange]] = defaultdict(list)
        for change in changes:
            changes_of[change.entity_id].append(change)
        counts_of: defaultdict[int, list[DeadLetterCount]] = defaultdict(list)
        for count in counts:
            counts_of[count.entity_id].append(count)
        trends = {}
        for queue in (e for e in entities if e.parent_id is None):
            dead = timeline(counts_of[dlq_of.get(queue.id, 0)], TREND, now)
            held = peaks(changes_of[queue.id], queue.ledger.held, TREND, now)
            trends[queue.name] = Trend(dead.start, TREND.step, held, dead.totals)
        return trends

    async def dead_letter_causes(self, address: str) -> list[DeadLetterCause]:
        """The held messages of ``address`` by reason and their last failure's type."""
        return await self.housekeeper.read(
            address,
            lambda tx, target: tx.dead_letter_causes(target.entity.id, holds_dead_letters(target)),
        )

    async def fingerprint_labels(self, address: str) -> dict[str, tuple[str | None, str | None]]:
        """Every fingerprint the dead-letter queue ``address`` has held, with the error type
        and description of its first dead letter (none for another entity)."""

        async def read(tx: Transaction, target: Target) -> dict[str, tuple[str | None, str | None]]:
            return (
                await tx.fingerprint_labels(target.entity.id) if holds_dead_letters(target) else {}
            )

        return await self.housekeeper.read(address, read)
