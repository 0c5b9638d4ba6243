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
poison message must still be dead-lettered in the end. The README's "Defects" section says how
the default ratio was chosen.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from poisonq.errors import InvalidOptionError
from poisonq.model import FailureRecord

DEFAULT_MAX_FAILURE_RATIO = 0.5
MIN_FAILURES = 10


@dataclass(frozen=True)
class Defect:
    """Most of a batch failed the same way: ``failure`` is the first of them (with its
    traceback), ``failed`` of ``total`` messages failed so."""

    failure: FailureRecord
    failed: int
    total: int

    def __str__(self) -> str:
        first = next(iter(self.failure.message.splitlines()), "")
        return (
            f"{self.failed} of {self.total} messages failed the same way"
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
    failures: Iterable[FailureRecord], total: int, max_failure_ratio: float | None
) -> Defect | None:
    """The defect among the failures of a batch of ``total`` messages, if they show one."""
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
    if failed >= MIN_FAILURES and failed > max_failure_ratio * total:
        return Defect(first[key], failed, total)
    return None


class FailureWindow:
    """The outcomes of the last messages one consumer handled, for consumers whose batches
    are too small to show a defect alone (the Processor's default batch is one message).

    A consumer holds its failures, unsettled, while the window is :meth:`undecided` (more
    than the ratio failing, too few failures to call it a defect), so that a defect found
    after ten single-message batches has spent no delivery on any of them."""

    def __init__(self, max_failure_ratio: float | None, size: int) -> None:
        self.max_failure_ratio = max_failure_ratio
        self._recent: deque[FailureRecord | None] = deque(maxlen=size)

    def add(self, outcomes: Iterable[FailureRecord | None]) -> Defect | None:
        """Add a batch's outcomes (``None`` for a success); the defect the window shows now."""
        self._recent.extend(outcomes)
        return find_defect(self._failures(), len(self._recent), self.max_failure_ratio)

    def undecided(self) -> bool:
        """Whether more failures of the kind seen could still make the window a defect."""
        if self.max_failure_ratio is None:
            return False
        failed = sum(1 for _ in self._failures())
        return failed > self.max_failure_ratio * len(self._recent)

    def _failures(self) -> Iterator[FailureRecord]:
        return (failure for failure in self._recent if failure is not None)
