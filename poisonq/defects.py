"""Telling a defect from poison.

Poison is a few messages that fail while their neighbours pass; a defect (a bug in the
handler or transform, a wrong schema, a broken sink) fails nearly all of them, the same way.
Settling a defect's failures as failures would spend the deliveries of good messages and
dead-letter them, so consumers check a batch's failures first: when one fingerprint
covers more than ``max_failure_ratio`` of the batch, and at least :data:`MIN_FAILURES`
messages, the batch is given back without a delivery counted and the consumer stops (Service
Broker disables a queue after five rollbacks for the same reason; Beam fails a pipeline
whose bad-record ratio passes a threshold).

With fewer than :data:`MIN_FAILURES` failures a batch is never called a defect: a batch of one
poison message must still be dead-lettered in the end. A session queue is the exception: only
the first message of each session can be tried before its failure is settled, so a queue of a
few sessions can never show ten failures, and settling a session's first failure as poison
takes its whole session with it. When every session on offer has been tried, the failures are
judged with :data:`MIN_SESSION_FAILURES` instead (:meth:`FailureWindow.defect_of_all`).

Only first deliveries count, on both sides of the ratio: a message that failed before is
suspected already, and as a queue drains, its last batches are mostly poison messages on their
later deliveries. docs/python-api.md, "Defects are not poison", says how the default ratio was
chosen.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from poisonq.errors import InvalidOptionError
from poisonq.model import FailureRecord

DEFAULT_MAX_FAILURE_RATIO = 0.5
MIN_FAILURES = 10
MIN_SESSION_FAILURES = 3


@dataclass(frozen=True)
class Defect:
    """Most of a batch failed the same way: ``failure`` is the first of them (with its
    traceback), ``failed`` of ``total`` messages failed so. With ``alone``, the isolation of
    a failed Spark job found ``failed`` messages failing it alone, more than poison explains,
    and stopped looking: the batch's own failure is ``failure``."""

    failure: FailureRecord
    failed: int
    total: int
    alone: bool = False

    @property
    def traceback(self) -> str:
        return self.failure.traceback

    def __str__(self) -> str:
        first = next(iter(self.failure.message.splitlines()), "")
        how = (
            "failed a Spark job alone, more than poison explains"
            if self.alone
            else "failed the same way"
        )
        return (
            f"{self.failed} of {self.total} messages {how}"
            f" ({self.failure.error_type}: {first}): a defect, not poison"
        )


def check_ratio(max_failure_ratio: float | None) -> float | None:
    """``max_failure_ratio`` as given, or :class:`InvalidOptionError`."""
    if max_failure_ratio is not None and not 0 < max_failure_ratio <= 1:
        raise InvalidOptionError(
            f"max_failure_ratio must be in (0, 1], or None to never stop, not {max_failure_ratio!r}"
        )
    return max_failure_ratio


def find_defect(
    failures: Iterable[FailureRecord],
    total: int,
    max_failure_ratio: float | None,
    minimum: int = MIN_FAILURES,
) -> Defect | None:
    """The defect among the failures of a batch of ``total`` messages, if they show one: at
    least ``minimum`` of one fingerprint, more than the ratio of the batch."""
    if max_failure_ratio is None:
        return None
    first: dict[str, FailureRecord] = {}
    counts: Counter[str] = Counter()
    for failure in failures:
        key = failure.fingerprint or failure.error_type
        first.setdefault(key, failure)
        counts[key] += 1
    if not counts:
        return None
    key, failed = counts.most_common(1)[0]
    if failed >= minimum and failed > max_failure_ratio * total:
        return Defect(first[key], failed, total)
    return None


class FailureWindow:
    """The outcomes a consumer has seen since the oldest failure it still holds, for
    consumers whose batches are too small to show a defect alone (the Processor's default
    batch is one message) or in which a defect starts after healthy traffic.

    A consumer holds its failures, unsettled, while the span is :meth:`undecided` (its
    failures outnumber the ratio of it, too few to call it a defect yet): a run of failures
    is then either diluted by successes (poison: settle the failures) or grows into a defect
    before any of them has spent a delivery. :meth:`settled` starts a new span."""

    def __init__(self, max_failure_ratio: float | None) -> None:
        self.max_failure_ratio = max_failure_ratio
        self._span: list[FailureRecord | None] = []
        self._lock = threading.Lock()  # one window for all of a consumer's threads

    def add(self, outcomes: Iterable[FailureRecord | None]) -> Defect | None:
        """Add outcomes (``None`` for a success); the defect the span shows now."""
        with self._lock:
            for outcome in outcomes:
                if self._span or outcome is not None:  # a span starts at a failure
                    self._span.append(outcome)
            return find_defect(self._failures(), len(self._span), self.max_failure_ratio)

    def defect_of_all(self, minimum: int = MIN_SESSION_FAILURES) -> Defect | None:
        """The defect the span shows when no more evidence can come (every session of a
        session queue was tried), judged with ``minimum`` failures of one fingerprint."""
        with self._lock:
            return find_defect(self._failures(), len(self._span), self.max_failure_ratio, minimum)

    def undecided(self) -> bool:
        """Whether the failures held could still turn out to be a defect."""
        if self.max_failure_ratio is None:
            return False
        with self._lock:
            failed = sum(1 for _ in self._failures())
            return failed > self.max_failure_ratio * len(self._span)

    def settled(self) -> None:
        """The held failures were settled (or given back): the next failure starts a span."""
        with self._lock:
            self._span.clear()

    def _failures(self) -> Iterator[FailureRecord]:
        return (failure for failure in self._span if failure is not None)
