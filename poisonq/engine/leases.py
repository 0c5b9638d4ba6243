"""Leases: numbered batches of messages one consumer (a Spark query, a pipeline) locks at
once under one token, durable so a restarted consumer replays them."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any

from poisonq.engine.receiving import Receiving
from poisonq.engine.timeline import Timelines
from poisonq.errors import InvalidOperationError
from poisonq.limits import check_count
from poisonq.model import Abandon, Lease, Settlement
from poisonq.names import validate_name
from poisonq.timeline import BatchRun


class Leasing(Receiving, Timelines):
    async def acquire_lease(
        self,
        address: str,
        consumer: str,
        number: int,
        max_messages: int,
        lock_duration: float | None = None,
    ) -> Lease | None:
        """Lease ``number`` of ``consumer``: up to ``max_messages`` messages locked under one
        token. Asking again for a lease that exists returns it with its locks renewed,
        revived if they ran out and nothing reclaimed them (a restarted consumer replays it:
        see :meth:`resume_lease`); a new lease forgets the consumer's leases before the
        one before it (a consumer may take a lease while it finishes the one before, as the
        pipeline runner does; the older ones are settled by then). ``None`` when nothing is
        receivable."""
        validate_name(consumer)
        check_count(number, "a lease number")
        check_count(max_messages, "max_messages")
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            entity = target.entity
            until = target.lock_until(now, lock_duration)
            lease = await tx.lease(entity.id, entity.name, consumer, number)
            if lease is not None:
                await tx.revive_lease(entity.id, lease.lock_token, *_span(lease), until)
                return lease
            if target.sessions:
                raise InvalidOperationError(
                    f"{entity.name!r} requires sessions; leases do not lock by session"
                )
            self.resolver.check_receivable(target)
            await tx.lease_follows(entity.id)
            if not await self.poisoner.housekeep(tx, target, now):
                return None
            token = str(uuid.uuid4())
            lease = await tx.lock_lease(
                entity.id, entity.name, consumer, number, target.ready, max_messages, token,
                until, now,
            )  # fmt: skip
            if lease is not None:
                await tx.delete_leases(entity.id, consumer, before=number - 1)
            return lease

    async def lease(self, address: str, consumer: str, number: int | None) -> Lease | None:
        validate_name(consumer)
        if number is not None:  # 0: before a consumer's first lease, which none is
            check_count(number, "a lease number", minimum=0)
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, address)).entity
            return await tx.lease(entity.id, entity.name, consumer, number)

    async def lease_sequence_numbers(
        self,
        lease: Lease,
        lo: int | None = None,
        hi: int | None = None,
        first_delivery: bool = False,
    ) -> list[int]:
        """The lease's messages in ``[lo, hi]`` that it still holds under a valid lock (with
        ``first_delivery``, only those delivered for the first time)."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, lease.entity)).entity
            span = _span(lease, lo, hi)
            return await tx.lease_seqs(entity.id, lease.lock_token, *span, now, first_delivery)

    async def lease_rows(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> list[tuple[Any, ...]]:
        """The messages the lease still holds in ``[lo, hi]``, as :data:`LEASE_COLUMNS`."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, lease.entity)).entity
            return await tx.lease_rows(entity.id, lease.lock_token, *_span(lease, lo, hi), now)

    async def retry_in_lease(
        self,
        lease: Lease,
        settlements: Sequence[Settlement],
        again: Collection[int] | None = None,
    ) -> list[tuple[Any, ...]]:
        """Settle messages the lease holds (an abandon with its own failure, the retry policy
        applied as to any abandon), and take back into the lease those of the abandoned
        messages in ``again`` (by default every one) that the policy returned to the queue
        at once, each counting a delivery, as the lease's consumer receiving them again
        would: a pipeline runs a message that crashed its worker again within its batch,
        rather than in a batch of its own. Those it moved, delayed or poisoned stay where
        the policy put them, and nothing is taken back from a queue that can no longer be
        received from (the abandons may have disabled it). One transaction; returns the
        messages taken back as :data:`~poisonq.store.base.LEASE_COLUMNS`, ascending."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, lease.entity)
            await self._settle(tx, target, settlements, now)
            target = await self.resolver.resolve(tx, lease.entity)  # its status may have moved
            if not target.entity.status.can_receive:
                return []
            seqs = [
                each.sequence_number
                for each in settlements
                if type(each) is Abandon and (again is None or each.sequence_number in again)
            ]
            return await tx.retake(target.entity.id, lease.lock_token, seqs, target.ready)

    async def renew_lease(self, lease: Lease, lock_duration: float | None = None) -> int:
        """Extend the locks the lease still holds; returns how many."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, lease.entity)
            until = target.lock_until(now, lock_duration)
            return await tx.renew_lease(
                target.entity.id, lease.lock_token, *_span(lease), now, until
            )

    async def resume_lease(self, lease: Lease, lock_duration: float | None = None) -> int:
        """Renew the lease's locks, those that ran out included as long as nothing reclaimed
        them (every receive and lease of the entity first counts its expired locks, and only
        then are their messages another's); returns how many it holds.

        A consumer replaying a batch (a query restarted after a kill, later than the lock)
        resumes its lease so that the replay has the messages the killed run had, under the
        same lease: what the killed run wrote is then written again under the same identity,
        not in a later batch."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, lease.entity)
            until = target.lock_until(now, lock_duration)
            return await tx.revive_lease(target.entity.id, lease.lock_token, *_span(lease), until)

    async def complete_lease(self, lease: Lease, run: BatchRun | None = None) -> int:
        """Complete every message the lease still holds (the others were settled apart, or
        their locks ran out and they will be delivered again), and record the lease as
        completed, in one transaction; with ``run``, record its batch in the consumer's
        timeline in the same transaction. Returns how many."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, lease.entity)
            entity = target.entity
            await tx.finish_lease(entity.id, lease.consumer, lease.number, now)
            completed = await tx.complete_span(entity.id, lease.lock_token, *_span(lease), now)
            if completed and entity.rollbacks:
                await tx.reset_rollbacks(entity.id)
            if run is not None:
                await self._record_batch(tx, target, lease, run, completed)
            return completed

    async def plan_lease(self, lease: Lease) -> int:
        """Count a planning of the lease's batch; more than one means it is being replayed
        (its query failed, or was stopped, after planning it)."""
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, lease.entity)).entity
            return await tx.plan_lease(entity.id, lease.consumer, lease.number)

    async def lease_plans(self, lease: Lease) -> int:
        """How many times the lease's batch was planned since it was taken (or reset)."""
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, lease.entity)).entity
            return await tx.lease_plans(entity.id, lease.consumer, lease.number)

    async def reset_lease_plans(self, lease: Lease) -> None:
        """Count the lease's batch as not planned yet: a handler that isolates its own
        failures (``poisonq.spark.foreach_batch``) took it up, so a planning after this one
        is a restart's replay, not a replay after the batch failed its query, and the source
        does not narrow it."""
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, lease.entity)).entity
            await tx.reset_lease_plans(entity.id, lease.consumer, lease.number)

    async def release_lease(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> int:
        """Give back what the lease still holds in ``[lo, hi]`` as if it had never been
        delivered (no delivery counted, no failure, no rollback): for a consumer that found
        the fault in itself, or that narrows a lease. Returns how many."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, lease.entity)
            span = _span(lease, lo, hi)
            return len(
                await tx.release(target.entity.id, lease.lock_token, *span, None, target.ready, now)
            )


def _span(lease: Lease, lo: int | None = None, hi: int | None = None) -> tuple[int, int]:
    """The part of the lease's range in ``[lo, hi]`` (each a sequence number, or None for
    no bound)."""
    for bound in (lo, hi):
        if bound is not None:
            check_count(bound, "a sequence number", minimum=0)
    return (
        lease.min_sequence if lo is None else max(lo, lease.min_sequence),
        lease.max_sequence if hi is None else min(hi, lease.max_sequence),
    )
