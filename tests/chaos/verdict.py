"""The one check every chaos scenario ends with, in the terms of a history checked against a
model: what the program was asked to do (good and bad messages) against what the store and
the output hold at the end."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping

import poisonq


@dataclasses.dataclass
class Verdict:
    """What one run of a scenario came to. ``faults`` counts the kills that landed while the
    program was still running (a kill after it finished is no fault)."""

    faults: int = 0
    lost: list[str] = dataclasses.field(default_factory=list)
    duplicated: list[str] = dataclasses.field(default_factory=list)
    misplaced: list[str] = dataclasses.field(default_factory=list)  # wrong queue or reason
    held: int = 0
    balanced: bool = True
    double_holders: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not (self.lost or self.duplicated or self.misplaced or self.held or self.double_holders)
            and self.balanced
        )

    def problems(self) -> str:
        found = {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "misplaced": self.misplaced,
            "double holders": self.double_holders,
        }
        parts = [f"{name}: {ids[:5]} ({len(ids)})" for name, ids in found.items() if ids]
        if self.held:
            parts.append(f"{self.held} still held")
        if not self.balanced:
            parts.append("audit out of balance")
        return "; ".join(parts) or "none"


def dead_lettered(broker: poisonq.Broker, queue: str) -> list[poisonq.ReceivedMessage]:
    """Every message of the queue's dead-letter queue, page by page."""
    found: list[poisonq.ReceivedMessage] = []
    while page := broker.dead_letters(
        queue, after=found[-1].sequence_number if found else 0, limit=1000
    ):
        found += page
    return found


def check(
    broker: poisonq.Broker,
    queue: str,
    good: Iterable[str],
    bad: Mapping[str, str],
    output: Iterable[str] | None,
    completed: int | None = None,
) -> Verdict:
    """``good``: the message ids that must reach the output; ``bad``: message id → the reason
    it must be dead-lettered with. ``output``: the message ids the output holds, or ``None``
    when the program's only output is completion (a ``Processor``), judged by the ledger's
    ``completed`` against the number of good messages."""
    good = set(good)
    verdict = Verdict()
    if output is not None:
        written = Counter(output)
        verdict.lost += sorted(good - written.keys())
        verdict.duplicated += sorted(m for m, n in written.items() if n > 1)
        verdict.misplaced += sorted(written.keys() - good)
    elif completed is not None and completed != len(good):
        wrong = verdict.lost if completed < len(good) else verdict.duplicated
        wrong.append(f"{abs(len(good) - completed)} completions")
    dead = dead_lettered(broker, queue)
    seen = Counter(m.message_id for m in dead)
    verdict.lost += sorted(bad.keys() - seen.keys())
    verdict.duplicated += sorted(m for m, n in seen.items() if n > 1)
    verdict.misplaced += sorted(
        m.message_id
        for m in dead
        if m.message_id not in bad or m.dead_letter_reason != bad[m.message_id]
    )
    counts = broker.counts(queue)
    verdict.held = sum(counts[s] for s in ("scheduled", "active", "locked", "deferred"))
    verdict.balanced = broker.audit().ok
    return verdict


@dataclasses.dataclass(frozen=True)
class Holding:
    """One delivery as the handler saw it: from when it started to when its lock ran out (or
    the handler returned, if it did)."""

    message_id: str
    start: float
    until: float


def double_holders(holdings: Iterable[Holding]) -> list[str]:
    """Messages that a handler started on while an earlier delivery's lock was still valid."""
    by_message: dict[str, list[Holding]] = {}
    for holding in holdings:
        by_message.setdefault(holding.message_id, []).append(holding)
    twice: list[str] = []
    for message_id, held in by_message.items():
        held.sort(key=lambda h: h.start)
        if any(later.start < earlier.until for earlier, later in itertools.pairwise(held)):
            twice.append(message_id)
    return sorted(twice)
