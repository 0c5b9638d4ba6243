"""The bounded history a store keeps for the explorer's charts (schema 8).

Two tables of time buckets per entity, each bucket kept at two resolutions: a minute (kept
25 hours: the last hour and the last day are drawn from them) and an hour (kept 8 days: the
last week). ``dead_letter_history`` counts the messages dead-lettered *into* an entity by
reason, subject and fingerprint together (a chart groups them by any one at read time);
``depth_history`` holds, for each bucket in which the entity's depth changed, the depth it had
before the bucket's first change (the depth at any time follows from those and the ledger's
depth now, reading back from the present).

A transaction gathers what it adds in a :class:`HistoryBuffer` and the store writes it with
the commit, after the ledger, in one statement per table whatever the batch: so the history
holds exactly the work that committed, from every process, and a history row is only ever
written by a transaction that holds its entity's ledger row (on PostgreSQL, the row lock that
orders concurrent writers of one queue already). Keys are stored as JSON text (``null`` for a
message without a subject or fingerprint), so that a key column is never NULL and an upsert
always finds its row.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable

from poisonq.clock import Clock, SystemClock

MINUTE, HOUR = 60, 3600
# Seconds each resolution is kept for: a margin above the longest window drawn from it.
KEEP = {MINUTE: 25 * HOUR, HOUR: 8 * 24 * HOUR}
PRUNE_EVERY = 60.0  # seconds between a store's prunes (each process prunes for itself)
# The ledger columns whose changes move the depth, with their sign.
_HELD_SIGNS = {"sent": 1, "moved_in": 1, "completed": -1, "dropped": -1, "moved_out": -1}


def buckets(now: float) -> list[tuple[int, int]]:
    """(span, start) of the buckets holding ``now``, one per resolution."""
    return [(span, int(now // span) * span) for span in KEEP]


def key_column(by: str | None) -> str:
    """The column of the history a chart groups by (a constant for no grouping)."""
    if by is None:
        return "CAST('null' AS TEXT)"
    if by not in ("reason", "subject", "fingerprint"):
        raise ValueError(f"no history by {by!r}")
    return by


def key_text(value: str | None) -> str:
    return json.dumps(value, ensure_ascii=False)


def key_value(text: str) -> str | None:
    value: str | None = json.loads(text)
    return value


class HistoryBuffer:
    """What one transaction adds to the history: depth changes and dead-letterings, per
    entity, summed in memory until the commit writes them."""

    def __init__(self) -> None:
        self.held: defaultdict[int, int] = defaultdict(int)
        self.dead: Counter[tuple[int, str, str | None, str | None]] = Counter()

    def __bool__(self) -> bool:
        return bool(self.held or self.dead)

    def bump(self, entity_id: int, deltas: dict[str, int]) -> None:
        """Note a ledger change (the same deltas the ledger gets)."""
        change = sum(sign * deltas.get(name, 0) for name, sign in _HELD_SIGNS.items())
        if change:
            self.held[entity_id] += change

    def dead_lettered(
        self, entity_id: int, keys: Iterable[tuple[str, str | None, str | None]]
    ) -> None:
        """Count messages dead-lettered into ``entity_id``; ``keys`` are their (reason,
        subject, fingerprint). (Counted as they are, encoded once per distinct key when
        written.)"""
        self.dead.update((entity_id, *key) for key in keys)

    def depth_rows(self) -> list[tuple[int, int]]:
        """(entity, change of depth), entities in id order, unchanged ones left out."""
        return sorted((entity, change) for entity, change in self.held.items() if change)

    def dead_rows(self) -> list[tuple[int, str, str, str, int]]:
        """(entity, reason, subject, fingerprint, count) in key order, keys as JSON text."""
        return sorted(
            (entity, key_text(reason), key_text(subject), key_text(fingerprint), count)
            for (entity, reason, subject, fingerprint), count in self.dead.items()
        )


class HistoryKeeper:
    """A store's side of the history: the clock that stamps the buckets (the engine hands
    the store its own, so that history and messages share one time) and when the next prune
    is due."""

    def __init__(self) -> None:
        self.clock: Clock = SystemClock()
        self._next_prune = 0.0
        self._lock = threading.Lock()

    def stamp(self) -> tuple[float, bool]:
        """The time of a commit, and whether it should prune (at most every
        :data:`PRUNE_EVERY` seconds per store)."""
        now = self.clock.now()
        with self._lock:
            due = now >= self._next_prune
            if due:
                self._next_prune = now + PRUNE_EVERY
        return now, due


def cutoffs(now: float) -> list[tuple[int, float]]:
    """(span, oldest bucket start kept) for a prune at ``now``."""
    return [(span, now - kept) for span, kept in KEEP.items()]
