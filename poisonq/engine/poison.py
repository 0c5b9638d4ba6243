"""What happens after a failed delivery: the retry policy's decision (redeliver, park in the
retry subqueue for a cycle, or poison), the four poison actions of WCF (move, drop, reject,
fault), whole-session poisoning, Service Broker's auto-disable after consecutive rollbacks,
and the housekeeping of an entity (what is due on the store's clock), which every receive
runs and every reader before it reads (:mod:`~poisonq.engine.housekeeping`). (The
operator's way out of a fault is an admin operation.)
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import defaultdict
from collections.abc import Sequence

from poisonq.clock import Clock
from poisonq.engine.resolving import Resolver
from poisonq.engine.routing import Router
from poisonq.engine.targets import Target, lock_expired, whole_session
from poisonq.errors import InvalidOperationError
from poisonq.failures import describe
from poisonq.limits import MAX_MESSAGE
from poisonq.model import (
    LOCK_EXPIRED,
    DeadLetterReason,
    FailureRecord,
    MessageState,
    ReceiveErrorHandling,
    StatusEventKind,
    SubQueue,
)
from poisonq.options import MoveToRetry, Poison, Redeliver
from poisonq.reports import StatusEvent
from poisonq.store.base import Letter, LockInfo, Transaction

log = logging.getLogger(__name__)


class Poisoner:
    """The poison rules, applied inside the caller's transaction after a failed delivery or
    in an entity's housekeeping."""

    def __init__(self, resolver: Resolver, router: Router, clock: Clock) -> None:
        self.resolver = resolver
        self.router = router
        self.clock = clock

    async def after_failure(
        self,
        tx: Transaction,
        target: Target,
        locks: Sequence[LockInfo],
        failure: FailureRecord | None,
        lock_expired: bool,
        delay: float | None = None,
    ) -> list[int]:
        """:meth:`after_failures` of messages that failed alike (one failure, or none)."""
        return await self.after_failures(
            tx, target, locks, [failure] * len(locks), lock_expired, delay
        )

    async def after_failures(
        self,
        tx: Transaction,
        target: Target,
        locks: Sequence[LockInfo],
        failures: Sequence[FailureRecord | None],
        lock_expired: bool,
        delay: float | None = None,
    ) -> list[int]:
        """An abandon or a lock expiry: back to ready (``abort_count += 1``, each message's
        own failure, ``failures[i]`` for ``locks[i]``, appended), counted as a rollback, then
        the retry policy decides per message: at once, after its redelivery delay (or
        ``delay``, when the caller names one), in the retry subqueue, or poisoned, described
        by its own failure. Returns the sequence numbers poisoned (whatever the action did
        with them)."""
        entity = target.entity
        if delay and target.sessions:
            raise InvalidOperationError(
                f"{entity.name!r} requires sessions, whose messages are delivered in order:"
                " an abandoned message cannot wait while the rest of its session goes on"
                " (abandon without a delay, or defer it)"
            )
        seqs = [lock.seq for lock in locks]
        records = [failure.to_json() if failure else None for failure in failures]
        await tx.abandon(entity.id, seqs, target.ready, records, lock_expired)
        now = self.clock.now()
        await self._count_rollbacks(tx, target, len(seqs), now)
        policy = target.policy
        if policy is None:
            return []
        poisoned: list[int] = []
        waiting: dict[float, list[int]] = defaultdict(list)
        parked: dict[float, list[int]] = defaultdict(list)
        # In a dead-letter queue only the deliveries made there count (MSMQ resets a
        # message's abort count when it moves to another subqueue).
        dead = target.ready is MessageState.DEAD_LETTERED
        for lock in locks:
            deliveries = lock.delivery_count - (lock.dead_lettered_deliveries if dead else 0)
            match policy.decide(deliveries, lock.move_count):
                case Redeliver(backoff):
                    wait = backoff if delay is None else delay
                    if wait > 0:
                        waiting[wait].append(lock.seq)
                case MoveToRetry(cycle_delay):
                    parked[cycle_delay].append(lock.seq)
                case Poison():
                    poisoned.append(lock.seq)
        # Sessions are delivered in order and subqueues are never scheduled: at once there.
        if waiting and target.subqueue is None and not target.sessions:
            jitter = policy.redelivery_jitter if delay is None else 0.0  # a named delay is kept
            for wait, chosen in waiting.items():
                spread = 1 + jitter * (2 * random.random() - 1)
                await tx.reschedule(entity.id, chosen, now + wait * spread)
        if parked:
            retry = await self.resolver.child(tx, target, SubQueue.RETRY)
            for cycle_delay, chosen in parked.items():
                visible_at = now + cycle_delay
                await tx.move(entity.id, chosen, retry.id, MessageState.SCHEDULED, visible_at, 1)
        if poisoned:
            failed = {lock.seq: failure for lock, failure in zip(locks, failures, strict=True)}
            described = {seq: _described(failed[seq]) for seq in poisoned}
            if lock_expired:
                described.update(await _before_the_expiries(tx, target, poisoned))
            await self.poison_each(tx, target, described)
        return sorted(poisoned)

    async def poison(
        self, tx: Transaction, target: Target, seqs: list[int], description: str | None
    ) -> None:
        """:meth:`poison_each` of messages with one description."""
        await self.poison_each(tx, target, dict.fromkeys(seqs, description))

    async def poison_each(
        self, tx: Transaction, target: Target, described: dict[int, str | None]
    ) -> None:
        """Unlocked messages that used every attempt (each with its description): the queue's
        poison action, for them and (unless poisoned per message) their sessions' other
        messages."""
        policy = target.policy
        assert policy is not None  # only a policy poisons
        action = policy.receive_error_handling
        seqs = list(described)
        followers = sorted(set(await self._with_sessions(tx, target, seqs)) - set(seqs))
        await self._poison(tx, target, described, action)
        if followers:  # never delivered, never failed: they go with their session
            why = f"moved with poison message {seqs[0]} of its session"
            await self._poison(tx, target, dict.fromkeys(followers, why), action)
        await tx.count_poisoned(target.entity.id, len(seqs))

    async def _with_sessions(self, tx: Transaction, target: Target, seqs: list[int]) -> list[int]:
        """In a session queue a poisoned message takes its whole session with it (WCF),
        unless the queue asks for ``per_message_poisoning``: all the session's other
        messages go the same way, those locked under the session too (their locks end here,
        so settling one of them afterwards raises that its lock was lost)."""
        if not target.sessions or target.options.per_message_poisoning:
            return seqs
        entity = target.entity
        chosen = set(seqs)
        messages = await tx.messages(entity.id, entity.name, seqs)
        for session_id in {m.session_id for m in messages if m.session_id is not None}:
            chosen.update(await whole_session(tx, target, session_id))
        return sorted(chosen)

    async def _poison(
        self,
        tx: Transaction,
        target: Target,
        described: dict[int, str | None],
        action: ReceiveErrorHandling,
    ) -> None:
        entity = target.entity
        now = self.clock.now()
        seqs = list(described)
        match action:
            case ReceiveErrorHandling.MOVE:
                reason = DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
                letters = [Letter(seq, reason, why, None) for seq, why in described.items()]
                await self.router.dead_letter_each(tx, target, letters, now)
            case ReceiveErrorHandling.DROP:
                await tx.drop(entity.id, seqs)
                log.warning("dropped poison message(s) %s from %s", seqs, entity.name)
            case ReceiveErrorHandling.REJECT:
                await self._reject(tx, target, described, now)
            case ReceiveErrorHandling.FAULT:
                await self._fault(tx, target, seqs, described[seqs[0]], now)

    async def _fault(
        self, tx: Transaction, target: Target, seqs: list[int], description: str | None, now: float
    ) -> None:
        """The queue refuses receives until an operator has acted on each poison message.
        Messages poisoned together, or while the queue is faulted, wait their turn in the
        event's ``pending``: none of them may be delivered again."""
        entity = await tx.entity_by_id(target.entity.id)
        event = StatusEvent.from_text(entity.status_cause, now)
        if not entity.status.can_receive and event and event.kind is StatusEventKind.FAULT:
            known = {event.sequence_number, *event.pending}
            pending = (*event.pending, *(seq for seq in seqs if seq not in known))
            faulted = dataclasses.replace(event, pending=pending)
            await tx.set_status(entity.id, entity.status, faulted.to_text(), now)
            return
        why = f"poison message {seqs[0]}" + (f": {description}" if description else "")
        event = StatusEvent(
            StatusEventKind.FAULT, now, why, sequence_number=seqs[0], pending=tuple(seqs[1:])
        )
        await self.resolver.disable_receive(tx, target, event)
        log.error("%s faulted on %s", entity.name, why)

    async def _reject(
        self, tx: Transaction, target: Target, described: dict[int, str | None], now: float
    ) -> None:
        """To the sender's dead-letter queue: that of the queue named by ``reply_to``, else
        the namespace dead-letter queue (MSMQ's negative acknowledgement)."""
        entity = target.entity
        by_destination: dict[int, list[int]] = defaultdict(list)
        for message in await tx.messages(entity.id, entity.name, list(described)):
            seq = message.sequence_number
            sender = await tx.entity(message.reply_to) if message.reply_to else None
            if sender is not None and sender.parent_id is None and sender.subqueue is None:
                dlq = await self.resolver.child(tx, self.resolver.of(sender), SubQueue.DEADLETTER)
            else:
                dlq = await self.router.namespace_dlq(tx, now)
            by_destination[dlq.id].append(seq)
        for dlq_id, chosen in by_destination.items():
            if target.ready is MessageState.DEAD_LETTERED:
                # Read from a dead-letter queue: it keeps its reason and changes place.
                await tx.move(entity.id, chosen, dlq_id, None, None)
                continue
            reason = DeadLetterReason.REJECTED
            letters = [Letter(seq, reason, described[seq], None) for seq in chosen]
            await tx.dead_letter_each(entity.id, letters, dlq_id, entity.name, now)

    async def _count_rollbacks(
        self, tx: Transaction, target: Target, count: int, now: float
    ) -> None:
        """Service Broker's safety net: ``auto_disable_after_rollbacks`` rollbacks in a row
        (abandons or lock expiries with no completion between) disable receiving."""
        limit = target.options.auto_disable_after_rollbacks
        if limit is None or target.subqueue is not None:
            return
        total = await tx.add_rollbacks(target.entity.id, count)
        if total >= limit:
            why = f"{total} rollbacks in a row with no completion (limit {limit})"
            event = StatusEvent(StatusEventKind.AUTO_DISABLED, now, why, rollbacks=total)
            await self.resolver.disable_receive(tx, target, event)

    async def housekeep(self, tx: Transaction, target: Target, now: float) -> bool:
        """What is due of the entity by ``now``, on the store's clock: expired locks count
        as abandons; messages whose retry cycle delay has passed come back from the retry
        subqueue; due scheduled messages become active; messages past their TTL are
        dead-lettered or dropped before anyone can receive them (a deferred message never
        expires). Run by every receive and, before a read, by
        :class:`~poisonq.engine.housekeeping.Housekeeper`; it applies, whatever the entity's
        status, all that is due (time passes for a disabled queue too).

        Returns whether the entity can still be received from: counting expired locks may
        fault or auto-disable it. A receive then hands out nothing but commits, so the
        expiries stay counted (raising would roll them back)."""
        entity = target.entity
        expired = await tx.expired_locks(entity.id, now)
        if expired:
            await self.after_failure(tx, target, expired, lock_expired(now), lock_expired=True)
        await tx.close_expired_leases(entity.id, now)
        receivable = not expired or (await tx.entity_by_id(entity.id)).status.can_receive
        if target.subqueue is None:  # no TTL or scheduling in subqueues
            await self._due_messages(tx, target, now)
        return receivable

    async def _due_messages(self, tx: Transaction, target: Target, now: float) -> None:
        entity = target.entity
        if target.options.retry.max_retry_cycles:
            retry = await self.resolver.child(tx, target, SubQueue.RETRY)
            due = await tx.due_scheduled(retry.id, now)
            if due:
                await tx.move(retry.id, due, entity.id, MessageState.ACTIVE, None)
        await tx.promote_scheduled(entity.id, now)
        stale = await tx.expired_messages(entity.id, now)
        if not stale:
            return
        if target.options.dead_lettering_on_message_expiration:
            reason = DeadLetterReason.TTL_EXPIRED
            description = "the message expired before it was received"
            await self.router.dead_letter(tx, target, stale, reason, description, None, now)
        else:
            await tx.drop(entity.id, stale)
            log.info("dropped expired message(s) %s from %s", stale, entity.name)


def _described(failure: FailureRecord | None) -> str | None:
    return describe(failure) if failure else None


async def _before_the_expiries(tx: Transaction, target: Target, seqs: list[int]) -> dict[int, str]:
    """The descriptions of messages a lock expiry poisons that recorded a failure before
    their locks ran out: that failure, after the expiry. An expiry says only that nobody
    settled the message; a holder killed during the last delivery (a crash it could not
    record) left the story in the failures before it. Read only on this rare path."""
    entity = target.entity
    described = {}
    for message in await tx.messages(entity.id, entity.name, seqs):
        recorded = [f for f in message.failures if f.fingerprint != LOCK_EXPIRED]
        if recorded:
            last = describe(recorded[-1])
            described[message.sequence_number] = (
                f"the lock expired; its last recorded failure: {last}"[:MAX_MESSAGE]
            )
    return described
