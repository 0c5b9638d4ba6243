"""Settling failed messages from Spark executors, and telling a defect from poison there.

Every executor-side part of the Spark runtime (the ``map`` transform, :func:`poisonq.spark.udf`,
the expectations gate of a ``transform``, the streaming helper) ends the same way: a list of
failed messages of one lease, settled in one transaction (a permanent failure dead-letters,
any other abandons, so the queue's retry policy applies), unless the failures show a defect
(:mod:`poisonq.defects`). A defect fails the task with :class:`DefectFound` instead, with
nothing settled, and the driver reads it back from the job's error with :func:`defect_in`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import poisonq
from poisonq.defects import MIN_FAILURES, Defect, find_defect
from poisonq.failures import dead_lettering
from poisonq.model import Abandon, DeadLetter, FailureRecord, Lease

Failure = Abandon | DeadLetter
_DEFECT = re.compile(r"poisonq-defect:([A-Za-z0-9+/=]+):end")


@dataclass(frozen=True)
class LeaseContext:
    """What an executor needs to settle a lease's messages (picklable, nothing open)."""

    url: str
    address: str
    lease: Lease
    permanent: tuple[type[BaseException], ...] = ()
    max_failure_ratio: float | None = None

    def failure(self, seq: int, failure: FailureRecord, permanent: bool) -> Failure:
        """The settlement of a failed message: dead-letter if permanent, else abandon."""
        if permanent:
            return dead_lettering(seq, self.lease.lock_token, failure)
        return Abandon(seq, self.lease.lock_token, failure)

    def settle(
        self, broker: poisonq.Broker, failures: Sequence[Failure], seen: Collection[int]
    ) -> None:
        """Settle ``failures`` of the messages ``seen`` (sequence numbers) in one
        transaction, or raise :class:`DefectFound` if they show a defect. Only first
        deliveries tell a defect: a batch of poison coming back is all suspects."""
        if not failures:
            return
        if self.max_failure_ratio is not None and len(failures) >= MIN_FAILURES:
            lease, lo, hi = self.lease, min(seen), max(seen)
            fresh = set(broker.lease_sequence_numbers(lease, lo, hi, first_delivery=True))
            total = len(fresh.intersection(seen))
            first = (f.failure for f in failures if f.failure and f.sequence_number in fresh)
            defect = find_defect(first, total, self.max_failure_ratio)
            if defect is not None:
                raise DefectFound(defect)
        broker.settle_held(self.address, failures)


class DefectFound(Exception):
    """Raised in a task whose rows fail like a defect, to fail the job before anything is
    settled or written; the driver reads the defect back from the job's error text."""

    def __init__(self, defect: Defect) -> None:
        data = {**defect.failure.to_json(), "failed": defect.failed, "total": defect.total}
        encoded = base64.b64encode(json.dumps(data).encode()).decode()
        super().__init__(f"{defect} [poisonq-defect:{encoded}:end]")


def defect_in(error: BaseException) -> Defect | None:
    """The defect a :class:`DefectFound` carried through a failed Spark job, if any."""
    found = _DEFECT.search(str(error))
    if found is None:
        return None
    data = json.loads(base64.b64decode(found.group(1)))
    failed, total = data.pop("failed"), data.pop("total")
    return Defect(FailureRecord.from_json(data), failed, total)
