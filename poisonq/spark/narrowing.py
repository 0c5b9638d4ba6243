"""Narrowing a plain streaming query's batch after it failed, so that a poison row costs a
few restarts and its own deliveries, not the batch.

A plain query (no :func:`~poisonq.spark.foreach_batch`) that fails on a row dies, and is
restarted from its checkpoint (by its scheduler, a notebook, or
:func:`~poisonq.spark.restarting.run_restarting`); Spark then replays the failed batch, the
same lease. The source sees the replay as a lease planned a second time. The rules here
decide what a replay reads and how the leases after it are sized; the source applies them
and keeps no state between calls: the plan count is in the store, and the sizing of the next
leases (:class:`Chunks`) in the offsets Spark writes to the checkpoint, so a new process (or
a query restarted in the same one) continues where the last run left off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import poisonq
from poisonq.model import Abandon, FailureRecord, Lease

# A replayed batch keeps 1/NARROWING of what failed, and the leases after it take the rest
# in parts of that size: a poison row of a batch of B shows alone after about
# log_NARROWING(B) failures, with up to NARROWING - 1 small micro-batches each.
NARROWING = 8
# A lease holding at most this many messages delivered before gives the first of them a
# micro-batch of its own; more (a killed query's batch delivered again) are not suspects.
MAX_SUSPECTS = 4


@dataclass(frozen=True)
class Chunks:
    """How the next leases are sized, carried in the offsets Spark logs (so a restart
    keeps it): ``count`` more leases of at most ``width`` messages, then full batches."""

    width: int | None = None
    count: int = 0

    @classmethod
    def of(cls, offset: Mapping[str, int]) -> Chunks:
        """The sizing that followed the lease ending at ``offset``."""
        count = offset.get("chunks", 0)
        return cls(offset.get("width"), count) if count else cls()

    def after_one(self) -> Chunks:
        """What is left once one more lease is taken."""
        return Chunks(self.width, self.count - 1) if self.count > 1 else Chunks()

    def offset(self) -> dict[str, int]:
        if not self.count or self.width is None:
            return {}
        return {"width": self.width, "chunks": self.count}


def isolate_suspect(broker: poisonq.Broker, lease: Lease) -> None:
    """Give a message delivered before (abandoned, or given back by a failed batch) a
    micro-batch of its own: keep only it, or only what comes before it, and give the rest
    back with no delivery counted, so a poison row redelivered fails its own micro-batch,
    not a whole batch again."""
    held = broker.lease_sequence_numbers(lease)
    fresh = set(broker.lease_sequence_numbers(lease, first_delivery=True))
    suspects = [seq for seq in held if seq not in fresh]
    if not suspects or len(suspects) > MAX_SUSPECTS:
        return
    first = suspects[0]
    broker.release_lease(lease, lo=first + 1 if first == held[0] else first)


def narrow(broker: poisonq.Broker, lease: Lease, address: str) -> None:
    """A lease planned again is replayed after its query failed (a plain query that dies on
    a poison row is restarted by its scheduler, and the same batch would fail again): keep
    its first 1/:data:`NARROWING` and give the rest back without a delivery counted (the
    leases after it take that rest in parts: :func:`after_replay`). A lease down
    to one message failed with that message alone: abandon it, so the queue's retry policy
    counts it, and poison exhausts its deliveries while every good message gets through."""
    held = broker.lease_sequence_numbers(lease)
    if not held:  # given back or settled before the query died (a stopped defect)
        return
    if len(held) == 1:  # its query's error was not recorded (no run_restarting)
        failure = FailureRecord(
            time.time(),
            "QueryFailed",
            "the streaming query failed while this message was its whole batch",
            fingerprint="query-failed",
        )
        abandon_alone(broker, lease, address, failure)
        return
    broker.release_lease(lease, lo=held[math.ceil(len(held) / NARROWING)])


def abandon_alone(
    broker: poisonq.Broker, lease: Lease, address: str, failure: FailureRecord
) -> None:
    """Abandon the message of a lease that holds one, with ``failure``: its batch failed
    with it alone. A lease holding more says nothing of which of them failed."""
    held = broker.lease_sequence_numbers(lease)
    if len(held) == 1:
        broker.settle_held(address, [Abandon(held[0], lease.lock_token, failure)])


def after_replay(broker: poisonq.Broker, lease: Lease) -> Chunks | None:
    """How the leases after ``lease`` are sized, if a replay narrowed it (before it is
    completed). It then holds what the replay read, the first part of a batch that failed,
    and passed: the rest, given back, holds the poison, and the next leases take it in parts
    of the same size, so the failing part shows in the next failure instead of the whole
    rest failing again."""
    kept = len(broker.lease_sequence_numbers(lease))
    if not kept or broker.lease_plans(lease) < 2:
        return None
    given_back = max(0, lease.count - kept)  # more if some went back when it was taken
    return Chunks(kept, min(NARROWING - 1, math.ceil(given_back / kept)))
