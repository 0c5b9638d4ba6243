"""Sessions: a receiver locks a whole session of a session-enabled queue and gets its
messages in order; the session keeps a state; its lock is renewed as one.

The messages a session receiver locks carry the session's lock token and lock end, so they
are settled like any other locked message, and renewing the session renews them too. When a
session lock runs out, its messages' locks run out with it and count as abandons.

Only a renewal extends a session lock (as in Service Bus: receiving and settling do not).
Closing a session gives back what it holds in one transaction: its locked messages return to
the queue uncounted (as azure-servicebus' plain receiver releases what it holds when it
closes), so the next receiver gets the whole session. A session ended with an error
(Service Broker's END CONVERSATION WITH ERROR) dead-letters everything of it the queue
still holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from poisonq.engine.receiving import Receiving
from poisonq.engine.targets import Lock, Target, check_failure, check_text, whole_session
from poisonq.errors import (
    InvalidOperationError,
    InvalidOptionError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from poisonq.limits import check_count
from poisonq.model import FailureRecord, ReceivedMessage, Settlement
from poisonq.store.base import SessionRecord, Transaction


class Sessions(Receiving):
    async def accept_session(
        self, address: str, session_id: str | None, lock_duration: float | None = None
    ) -> tuple[str, str, float] | None:
        """Lock session ``session_id``, or with ``None`` the next session that has a message
        waiting and no holder. Returns (session id, lock token, locked until); ``None`` when
        no session is waiting. A named session held by another receiver raises
        :class:`SessionCannotBeLockedError`."""
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise InvalidOptionError(f"session_id must be a non-empty string: {session_id!r}")
        check_text(session_id, "session_id")
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            self.resolver.check_receivable(target)
            if not await self.poisoner.housekeep(tx, target, now):
                return None
            token = str(uuid.uuid4())
            until = target.lock_until(now, lock_duration)
            got = await tx.lock_session(target.entity.id, session_id, token, until, now)
            if got is None:
                if session_id is not None:
                    raise SessionCannotBeLockedError(target.entity.name, session_id)
                return None
            return got, token, until

    async def receive_session(
        self,
        address: str,
        session_id: str,
        token: str,
        max_messages: int,
        complete: Sequence[Lock] = (),
        settle: Sequence[Settlement] = (),
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` of the session's messages, in order, locked under the
        session's lock (``complete`` and ``settle`` as in :meth:`receive`)."""
        check_count(max_messages, "max_messages")
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            entity = target.entity
            await self._settle_previous(tx, target, complete, settle, now)
            self.resolver.check_receivable(target)
            if not await self.poisoner.housekeep(tx, target, now):
                return []
            held = await self._held_session(tx, target, session_id, token, now)
            assert held.locked_until is not None
            ready = target.ready
            return await tx.lock_ready(
                entity.id,
                entity.name,
                ready,
                max_messages,
                token,
                held.locked_until,
                session_id,
                last=True,
            )

    async def session_state(self, address: str, session_id: str, token: str) -> bytes | None:
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            return (await self._held_session(tx, target, session_id, token, now)).state

    async def set_session_state(
        self, address: str, session_id: str, token: str, state: bytes | None
    ) -> None:
        if state is not None and not isinstance(state, bytes):
            raise InvalidOptionError(f"session state must be bytes or None, not {state!r}")
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            if not await tx.set_session_state(target.entity.id, session_id, token, now, state):
                raise SessionLockLostError(target.entity.name, session_id)

    async def session_ids(
        self, address: str, state_updated_after: float | None = None
    ) -> list[str]:
        """The sessions of a session queue with a message waiting, locked, deferred or
        scheduled, or with a state kept; with ``state_updated_after``, those whose state was
        set after it."""
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            return await tx.session_ids(target.entity.id, state_updated_after)

    async def renew_session_lock(
        self, address: str, session_id: str, token: str, lock_duration: float | None = None
    ) -> float:
        """Extend the session lock, and the locks of the messages taken under it; returns
        the new end."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            until = target.lock_until(now, lock_duration)
            if not await tx.renew_session(target.entity.id, session_id, token, now, until):
                raise SessionLockLostError(target.entity.name, session_id)
            return until

    async def close_session(
        self, address: str, session_id: str, token: str, failure: FailureRecord | None = None
    ) -> list[int]:
        """Give the session up so another receiver can accept it, and its messages still
        locked under it back to the queue, uncounted (closing is not a failed delivery).
        With ``failure`` (the receiver's ``with`` block ended by an exception) the oldest of
        them, the one the handler was on, counts as abandoned with it. Returns the sequence
        numbers the retry policy poisoned."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            entity = target.entity
            held = await tx.session_locks(entity.id, session_id, token, now)
            failed = held[:1] if failure is not None else []
            rest = held[len(failed) :]
            if rest:
                await tx.release(entity.id, token, rest[0], rest[-1], rest, target.ready, now)
            poisoned: list[int] = []
            if failed:
                locks = await tx.locked(entity.id, token, failed, now)
                poisoned = await self.poisoner.after_failure(tx, target, locks, failure, False)
            await tx.release_session(entity.id, session_id, token)
            return poisoned

    async def dead_letter_session(
        self,
        address: str,
        session_id: str,
        token: str,
        reason: str,
        description: str | None,
        failure: FailureRecord | None,
    ) -> list[int]:
        """End the session with an error (Service Broker's END CONVERSATION WITH ERROR): every
        message of it the queue holds (locked under it, waiting, scheduled or deferred) goes
        to the dead-letter queue with ``reason``, and the session lock is given up, in one
        transaction. Returns the sequence numbers dead-lettered."""
        if not isinstance(reason, str) or not reason:
            raise InvalidOptionError(f"reason must be a non-empty string: {reason!r}")
        check_text(reason, "a dead-letter reason")
        check_text(description, "a dead-letter description")
        check_failure(failure)
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self._session_target(tx, address)
            entity = target.entity
            await self._held_session(tx, target, session_id, token, now)
            seqs = await whole_session(tx, target, session_id)
            record = failure.to_json() if failure else None
            moved = await self.router.dead_letter(
                tx, target, seqs, reason, description, record, now
            )
            await tx.release_session(entity.id, session_id, token)
            return moved

    async def _session_target(self, tx: Transaction, address: str) -> Target:
        target = await self.resolver.resolve(tx, address)
        if not target.sessions:
            raise InvalidOperationError(f"{target.entity.name!r} does not require sessions")
        return target

    @staticmethod
    async def _held_session(
        tx: Transaction, target: Target, session_id: str, token: str, now: float
    ) -> SessionRecord:
        found = await tx.session(target.entity.id, session_id)
        if found is None or found.lock_token != token or found.locked_until is None:
            raise SessionLockLostError(target.entity.name, session_id)
        if found.locked_until <= now:
            raise SessionLockLostError(target.entity.name, session_id, ran_out=True)
        return found
