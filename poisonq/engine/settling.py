"""Settling: complete, abandon, defer, dead-letter, renew a lock, or many of them each its
own way in one transaction. Receiving builds on this module, not the other way round: a
receive may settle the previous batch first, in its own transaction."""

from __future__ import annotations

from collections.abc import Sequence

from poisonq.engine.base import EngineBase
from poisonq.engine.targets import (
    Lock,
    Target,
    all_or_raise,
    by_token,
    check_failure,
    check_lock,
    check_text,
)
from poisonq.errors import InvalidOperationError, InvalidOptionError, MessageLockLostError
from poisonq.limits import MAX_INT
from poisonq.model import (
    Abandon,
    Complete,
    DeadLetter,
    DeadLetterReason,
    FailureRecord,
    Release,
    Settlement,
)
from poisonq.store.base import EntityRecord, Letter, LockInfo, Transaction


class Settling(EngineBase):
    async def complete(
        self, address: str, locks: Sequence[Lock], *, in_doubt: bool = False
    ) -> None:
        """locked → completed for every lock, or (a lock lost) nothing at all. With
        ``in_doubt`` (a retry of a call whose commit may have landed), a message no longer
        stored counts as completed, not as a lost lock."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            await self._complete(
                tx, (await self.resolver.resolve(tx, address)).entity, locks, now, in_doubt
            )

    async def _complete(
        self,
        tx: Transaction,
        entity: EntityRecord,
        locks: Sequence[Lock],
        now: float,
        in_doubt: bool = False,
    ) -> None:
        """locked → completed, all or nothing; a completion ends a run of rollbacks."""
        lost = await self._complete_held(tx, entity, locks, now, in_doubt)
        if lost:
            raise MessageLockLostError(lost)

    async def _complete_held(
        self,
        tx: Transaction,
        entity: EntityRecord,
        locks: Sequence[Lock],
        now: float,
        in_doubt: bool = False,
    ) -> list[int]:
        """Complete the locks still held; returns the lost ones, ascending. The caller raises
        if there are any, which rolls the completions back.

        ``in_doubt``: the first attempt of this call lost its connection while committing,
        so it may have completed these very messages. A completed message is deleted, so a
        lost lock whose message is stored nowhere any more is taken as that attempt's
        completion: reporting it lost would tell the caller it will be delivered again."""
        lost: list[int] = []
        for token, seqs in by_token(locks).items():
            lost += set(seqs) - set(await tx.complete(entity.id, token, seqs, now))
        if in_doubt and lost:
            lost = list(await tx.still_stored(lost))
        if entity.rollbacks and len(lost) < len(locks):
            await tx.reset_rollbacks(entity.id)
        return sorted(lost)

    async def abandon(
        self,
        address: str,
        locks: Sequence[Lock],
        failure: FailureRecord | None,
        delay: float | None = None,
    ) -> list[int]:
        """locked → active (``abort_count += 1``), after the retry policy's redelivery delay
        or ``delay`` seconds; or poisoned if every attempt is used. Returns the sequence
        numbers that were poisoned."""
        check_failure(failure)
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            held = await self._held_locks(tx, target, locks, now)
            return await self.poisoner.after_failure(tx, target, held, failure, False, delay)

    async def defer(self, address: str, locks: Sequence[Lock]) -> None:
        """locked → deferred: kept until received again by sequence number."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            entity = (await self.resolver.resolve(tx, address)).entity
            for token, seqs in by_token(locks).items():
                all_or_raise(seqs, await tx.defer(entity.id, token, seqs, now))

    async def dead_letter(
        self,
        address: str,
        locks: Sequence[Lock],
        reason: str | None,
        description: str | None,
        failure: FailureRecord | None,
    ) -> None:
        """locked → dead-lettered in the queue's dead-letter queue, with reason and
        description: a :meth:`settle` of one kind."""
        reason = reason or ""  # the default is settle's
        await self.settle(
            address, [DeadLetter(s, t, reason, description, failure) for s, t in locks]
        )

    async def renew_lock(
        self, address: str, locks: Sequence[Lock], lock_duration: float | None = None
    ) -> float:
        """Move ``locked_until`` on by the lock duration; returns the new time."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            until = target.lock_until(now, lock_duration)
            for token, seqs in by_token(locks).items():
                if await tx.renew(target.entity.id, token, seqs, now, until) != len(seqs):
                    held = await tx.locked(target.entity.id, token, seqs, now)
                    all_or_raise(seqs, [h.seq for h in held])
            return until

    async def settle(
        self, address: str, settlements: Sequence[Settlement], *, in_doubt: bool = False
    ) -> list[int]:
        """Settle many messages, each its own way, in one transaction: complete, abandon
        (with its own failure), dead-letter (with its own reason) or release (back to the
        queue, no delivery counted). If any lock was lost,
        :class:`MessageLockLostError` names all the lost ones and nothing changes. Returns
        the sequence numbers the retry policy poisoned. ``in_doubt`` as for
        :meth:`complete`: it concerns completions only."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.resolve(tx, address)
            return await self._settle(tx, target, settlements, now, in_doubt)

    async def _settle_previous(
        self,
        tx: Transaction,
        target: Target,
        complete: Sequence[Lock],
        settle: Sequence[Settlement],
        now: float,
    ) -> None:
        """A receive's settlement of the previous batch, first in its transaction."""
        if complete or settle:
            await tx.receive_follows(target.entity.id)
        if complete:
            await self._complete(tx, target.entity, complete, now)
        if settle:
            await self._settle(tx, target, settle, now)

    async def _settle(
        self,
        tx: Transaction,
        target: Target,
        settlements: Sequence[Settlement],
        now: float,
        in_doubt: bool = False,
    ) -> list[int]:
        """:meth:`settle` inside the caller's transaction (a receive settles the previous
        batch this way before it locks the next one).

        An abandon needs its lock's counters for the retry policy, so with one among them
        every lock is read (and checked) first. Without, the guarded completions and moves
        are the check: one statement less per batch, and the lost locks are named all the
        same before anything commits."""
        entity = target.entity
        kinds = _ByKind(settlements)
        held: dict[int, LockInfo] = {}
        if kinds.abandoned:
            held = {lock.seq: lock for lock in await self._held_locks(tx, target, kinds.locks, now)}
        done = kinds.completed
        lost = await self._complete_held(tx, entity, done, now, in_doubt) if done else []
        # Released first: a message poisoned below takes its session's unlocked messages
        # with it, and a message given back in the same batch is one of them.
        for token, seqs in kinds.released.items():
            back = await tx.release(entity.id, token, min(seqs), max(seqs), seqs, target.ready, now)
            lost += set(seqs) - set(back)
        poisoned: list[int] = []
        if kinds.abandoned:  # together, each with its own failure
            locks = [held[seq] for seq, _ in kinds.abandoned]
            failures = [failure for _, failure in kinds.abandoned]
            poisoned = await self.poisoner.after_failures(tx, target, locks, failures, False)
        if kinds.letters and target.subqueue is not None:
            raise InvalidOperationError(
                f"messages in {entity.name!r} cannot be dead-lettered again"
            )
        # A lock's letters move together, whatever each carries (every failed message's
        # description and failure record differ).
        for token, letters in kinds.letters.items():
            moved = await self.router.dead_letter_each(tx, target, letters, now, lock_token=token)
            lost += {letter.seq for letter in letters} - set(moved)
        if lost:
            raise MessageLockLostError(sorted(lost))
        return sorted(poisoned)

    async def _held_locks(
        self, tx: Transaction, target: Target, locks: Sequence[Lock], now: float
    ) -> list[LockInfo]:
        held: list[LockInfo] = []
        for token, seqs in by_token(locks).items():
            valid = await tx.locked(target.entity.id, token, seqs, now)
            all_or_raise(seqs, [v.seq for v in valid])
            held.extend(valid)
        return held


_KINDS = (Complete, Abandon, DeadLetter, Release)


class _ByKind:
    """Settlements checked, and sorted by kind, in one pass before anything is settled.
    ``settlements`` must be a list of settlements, each of one message, with its failure
    (if any) a :class:`FailureRecord`: else :class:`InvalidOptionError`. A message settled
    twice under one lock would be settled both ways (an old lock beside the new one is only
    lost), so that is refused too.

    This runs for every message settled, so the usual case (an ``int`` sequence number, a
    ``str`` token and reason) is told by its types, and the checks that name what is wrong
    run only when it is not."""

    def __init__(self, settlements: object) -> None:
        if not isinstance(settlements, Sequence):
            raise InvalidOptionError(f"settle takes a list of settlements, not {settlements!r}")
        self.locks: list[Lock] = []
        self.completed: list[Lock] = []
        self.released: dict[str, list[int]] = {}
        self.abandoned: list[tuple[int, FailureRecord | None]] = []
        self.letters: dict[str, list[Letter]] = {}  # by lock token
        seen: set[Lock] = set()
        for settlement in settlements:
            kind = type(settlement)
            if kind not in _KINDS:
                kind = _kind(settlement)
            seq, token = lock = settlement.sequence_number, settlement.lock_token
            if type(seq) is not int or not 0 <= seq <= MAX_INT or type(token) is not str:
                check_lock(seq, token)
            if lock in seen:
                raise InvalidOptionError(f"message {seq} is settled twice under one lock")
            seen.add(lock)
            self.locks.append(lock)
            if kind is Complete:
                self.completed.append(lock)
            elif kind is Release:
                self.released.setdefault(token, []).append(seq)
            elif kind is Abandon:
                assert isinstance(settlement, Abandon)
                self.abandoned.append((seq, check_failure(settlement.failure)))
            else:
                assert isinstance(settlement, DeadLetter)
                reason, description = settlement.reason, settlement.description
                if type(reason) is not str or "\x00" in reason:
                    check_text(reason, "a dead-letter reason")
                if description is not None and (
                    type(description) is not str or "\x00" in description
                ):
                    check_text(description, "a dead-letter description")
                reason = reason or DeadLetterReason.DEAD_LETTERED_BY_RECEIVER
                failure = check_failure(settlement.failure)
                record = failure.to_json() if failure else None
                letter = Letter(seq, reason, description, record)
                self.letters.setdefault(token, []).append(letter)


def _kind(settlement: object) -> type[Settlement]:
    """Which of the settlements ``settlement`` is (an instance of a subclass), else
    :class:`InvalidOptionError`."""
    for each in _KINDS:
        if isinstance(settlement, each):
            return each
    raise InvalidOptionError(
        f"a settlement is Complete, Abandon, DeadLetter or Release, not {settlement!r}"
    )
