"""The messaging part of the :class:`~poisonq.Broker` (Service Bus' client, apart from its
administration): senders, receivers and sessions, peeking, reading a message, settling.
It works through the :class:`~poisonq.link.Link` of the broker it belongs to, and hands the
broker to the senders and receivers it makes (their ``broker``)."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from poisonq.engine.driving import drive
from poisonq.errors import InvalidOperationError, InvalidOptionError, MessageLockLostError
from poisonq.link import Linked
from poisonq.lock_renewer import AutoLockRenewer, check_renewer
from poisonq.model import (
    Duration,
    ReceivedMessage,
    ReceiveMode,
    Settlement,
    SubQueue,
    to_seconds,
    to_timestamp,
)
from poisonq.options import lock_seconds
from poisonq.receivers import (
    RECEIVE_WAIT,
    Receiver,
    Sender,
    SessionReceiver,
    wait_for,
)
from poisonq.selection import message_filter

log = logging.getLogger(__name__)


class Messaging:
    """Senders, receivers, sessions, peeks and settlements, through the owner's link."""

    def __init__(self, owner: Linked) -> None:
        # Weak: the owner holds this part, and a broker nobody holds should go at once (and
        # close its store's connections) as it did before it had parts.
        self._owner = weakref.ref(owner)
        self.link = owner.link
        self.engine = owner.link.engine

    @property
    def owner(self) -> Linked:
        """The broker this part belongs to: the senders and receivers it makes keep it."""
        owner = self._owner()
        if owner is None:
            raise InvalidOperationError("the broker of this messaging part is gone")
        return owner

    def change_marker(self) -> object:
        """An opaque value that changes whenever the store commits a write, from any process:
        comparing two tells cheaply whether anything may have arrived. Messages also become
        receivable without a commit (scheduled ones, expired locks), so look again now and
        then even when it has not changed."""
        return self.link.changes.change_marker()

    def sender(self, address: str) -> Sender:
        return Sender(self.owner, address)

    def receiver(
        self,
        address: str,
        *,
        subqueue: SubQueue | str | None = None,
        receive_mode: ReceiveMode | str = ReceiveMode.PEEK_LOCK,
        lock_duration: Duration | None = None,
        max_wait_time: Duration | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> Receiver:
        """A receiver of ``address`` (or its ``subqueue``). ``max_wait_time`` ends an
        iteration (``for message in receiver``) once no message has come for that long.
        With ``auto_lock_renewer``, the messages it receives are registered with it."""
        try:
            mode = ReceiveMode(receive_mode)
        except ValueError:
            choices = ", ".join(m.value for m in ReceiveMode)
            raise InvalidOptionError(f"receive_mode must be one of {choices}") from None
        check_renewer(auto_lock_renewer)
        return Receiver(
            self.owner, address, subqueue, mode, lock_duration, max_wait_time, auto_lock_renewer
        )

    def accept_session(
        self,
        address: str,
        session_id: str,
        *,
        lock_duration: Duration | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> SessionReceiver:
        """Lock session ``session_id`` of a session-enabled queue; raises
        :class:`SessionCannotBeLockedError` if another receiver holds it. With
        ``auto_lock_renewer``, the session is registered with it until it is closed."""
        return drive(self._accept_session(address, session_id, lock_duration, auto_lock_renewer))

    async def _accept_session(
        self,
        address: str,
        session_id: str | None,
        lock_duration: Duration | None,
        auto_lock_renewer: AutoLockRenewer | None,
    ) -> SessionReceiver:
        if session_id is None:  # the engine would take the next session (accept_next_session)
            raise InvalidOptionError("name the session to accept, not None")
        check_renewer(auto_lock_renewer)
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        got = await self.engine.accept_session(address, session_id, seconds)
        assert got is not None, "a named session is locked or refused"
        return SessionReceiver(self.owner, address, seconds, *got, auto_lock_renewer)

    def accept_next_session(
        self,
        address: str,
        *,
        lock_duration: Duration | None = None,
        max_wait: Duration = RECEIVE_WAIT,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> SessionReceiver | None:
        """Lock the next session with a message waiting that nobody holds, waiting up to
        ``max_wait`` (a minute by default, as a Service Bus client waits; 0 looks once) for
        one to arrive or to be given up; ``None`` if none came. ``auto_lock_renewer`` as in
        :meth:`accept_session`."""
        check_renewer(auto_lock_renewer)
        wait = to_seconds(max_wait, "max_wait")
        deadline = time.monotonic() + wait
        marker = self.link.changes.change_marker() if wait > 0 else None

        def look() -> SessionReceiver | None:
            return drive(self._accept_next_session(address, lock_duration, auto_lock_renewer))

        return wait_for(self.link.changes, deadline, marker, look(), look)

    async def _accept_next_session(
        self,
        address: str,
        lock_duration: Duration | None,
        auto_lock_renewer: AutoLockRenewer | None,
    ) -> SessionReceiver | None:
        """One look for the next session (:meth:`accept_next_session` without the wait)."""
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        got = await self.engine.accept_session(address, None, seconds)
        if got is None:
            return None
        return SessionReceiver(self.owner, address, seconds, *got, auto_lock_renewer)

    def session_ids(
        self, address: str, *, state_updated_after: datetime | float | None = None
    ) -> list[str]:
        """The sessions of session queue ``address`` that have a message (waiting, locked,
        deferred or scheduled) or a state, by id; with ``state_updated_after``, those whose
        state was set after that time (azure-servicebus' ``list_queue_sessions``)."""
        return drive(self._session_ids(address, state_updated_after))

    async def _session_ids(
        self, address: str, state_updated_after: datetime | float | None
    ) -> list[str]:
        after = None if state_updated_after is None else to_timestamp(state_updated_after)
        return await self.engine.session_ids(address, after)

    def peek(
        self, /, address: str, *, from_sequence: int = 0, max_messages: int = 100, **where: Any
    ) -> list[ReceivedMessage]:
        """Messages without locking them or counting a delivery; the filters of
        :meth:`resubmit` (``subject="order"``, ``fingerprint=NO_VALUE``, ...) narrow them."""
        return drive(self._peek(address, from_sequence, max_messages, where))

    async def _peek(
        self, address: str, from_sequence: int, max_messages: int, where: dict[str, Any]
    ) -> list[ReceivedMessage]:
        return await self.engine.peek(address, from_sequence, max_messages, message_filter(where))

    def sequence_span(self, address: str) -> tuple[int, int, int]:
        """(count, lowest, highest) sequence number held by ``address``; (0, 0, -1) if empty.
        Spark splits a read into partitions by this range."""
        return drive(self.engine.sequence_span(address))

    def message(self, address: str, sequence_number: int) -> ReceivedMessage:
        """One message by sequence number, with its failure history."""
        return drive(self.engine.message(address, sequence_number))

    def settle(self, address: str, settlements: Sequence[Settlement]) -> list[int]:
        """Settle many locked messages, each its own way (:class:`Complete`,
        :class:`Abandon`, :class:`DeadLetter`, :class:`Release`), in one transaction. A
        lost lock raises :class:`MessageLockLostError` and changes nothing. Returns the
        sequence numbers the retry policy poisoned."""
        return drive(self.engine.settle(address, settlements))

    def settle_held(
        self, address: str, settlements: Sequence[Settlement]
    ) -> tuple[list[int], list[int]]:
        """:meth:`settle` what is still held: settlements whose lock ran out are left out
        (those messages will be delivered again) and the rest settled in one transaction.
        Returns (poisoned, lost) sequence numbers."""
        return drive(self._settle_held(address, settlements))

    async def _settle_held(
        self, address: str, settlements: Sequence[Settlement]
    ) -> tuple[list[int], list[int]]:
        return await held_only(partial(self.engine.settle, address), settlements)


S = TypeVar("S", bound=Settlement)
T = TypeVar("T")


async def held_only(
    settle: Callable[[list[S]], Awaitable[list[T]]], settlements: Sequence[S]
) -> tuple[list[T], list[int]]:
    """``settle`` the settlements whose locks are still held, in one transaction: one that
    raises :class:`MessageLockLostError` is run again without the lost ones (their messages
    will be delivered again). Returns what ``settle`` returned and the lost sequence
    numbers."""
    pending = {s.sequence_number: s for s in settlements}
    lost: list[int] = []
    while pending:
        try:
            return await settle(list(pending.values())), lost
        except MessageLockLostError as exc:
            log.warning("lost the lock on message(s) %s", exc.sequence_numbers)
            lost += exc.sequence_numbers
            for seq in exc.sequence_numbers:
                del pending[seq]
    return [], lost
