"""Senders and receivers: what ``Broker.sender``, ``Broker.receiver`` and
``Broker.accept_session`` hand out. Each is bound to one address and works through the
:class:`~poisonq.link.Link` the broker hands it (the engine's operations, the clock, the
store's change feed); it keeps the broker as ``broker`` for its callers, and uses nothing
else of it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from poisonq.engine.driving import drive
from poisonq.errors import InvalidOperationError, InvalidOptionError, MessageAlreadySettledError
from poisonq.failures import failure_from_exception
from poisonq.link import ChangeFeed, Linked
from poisonq.model import (
    Duration,
    FailureRecord,
    Message,
    ReceivedMessage,
    ReceiveMode,
    Release,
    Settlement,
    SubQueue,
    from_timestamp,
    to_seconds,
)
from poisonq.names import parse_address
from poisonq.options import lock_seconds
from poisonq.store.base import MessageFilter

MessageOrList = ReceivedMessage | Sequence[ReceivedMessage]
Settling = tuple[list[tuple[int, str]], list[Settlement], list[ReceivedMessage]]
"""What a look settles before it receives: locks to complete, settlements, and the messages
they are (marked settled while the store settles them)."""
T = TypeVar("T")
RECEIVE_WAIT = 60.0
"""Seconds a receive of an endless iteration, or ``accept_next_session``, waits by default
(Service Bus' default operation timeout) before it asks again or gives up."""
LOOK_INTERVAL = 0.1
"""Seconds a waiting receive goes at most without looking: scheduled messages and expired
locks come due without any commit to wake it (the asyncio API waits by the same rule)."""


class LockRenewal(Protocol):
    """What a receiver asks of its ``auto_lock_renewer`` (an
    :class:`~poisonq.lock_renewer.AutoLockRenewer`)."""

    def register(self, receiver: Receiver, messages: MessageOrList | None = None) -> None:
        """Keep renewing these messages' locks (a session receiver's session lock without
        messages)."""

    def registered(self, locks: Iterable[tuple[int, str]]) -> list[ReceivedMessage]:
        """The registered messages that hold these locks."""


def as_list(messages: MessageOrList) -> list[ReceivedMessage]:
    """One received message or a sequence of them, as a list; anything else is refused."""
    if isinstance(messages, ReceivedMessage):
        return [messages]
    if isinstance(messages, Sequence) and all(isinstance(m, ReceivedMessage) for m in messages):
        return list(messages)
    raise InvalidOptionError(f"expected received messages (one or a list), not {messages!r}")


@contextmanager
def settling(messages: Sequence[ReceivedMessage]) -> Iterator[None]:
    """Mark ``messages`` settled before the store settles them, and unmark them if it does
    not: an :class:`AutoLockRenewer` whose renewal fails because a settlement got there
    first then sees the mark, and knows the lock ended normally rather than was lost."""
    before = [message.settled for message in messages]
    for message in messages:
        message.settled = True
    try:
        yield
    except BaseException:
        for message, was in zip(messages, before, strict=True):
            message.settled = was
        raise


def wait_for(
    changes: ChangeFeed, deadline: float, marker: object, found: T, look: Callable[[], T]
) -> T:
    """What ``look`` finds, looking again after every change in the store until it finds
    something or ``deadline`` (on ``time.monotonic``) passes; ``found`` is what the caller's
    own look found, after it took ``marker`` from ``changes``. Scheduled messages and expired
    locks come due without any commit, so it looks at least every :data:`LOOK_INTERVAL`."""
    while not found and (left := deadline - time.monotonic()) > 0:
        changes.wait_for_change(marker, min(left, LOOK_INTERVAL))
        marker = changes.change_marker()
        found = look()
    return found


def _failure(error: BaseException | FailureRecord | None, now: float) -> FailureRecord | None:
    if error is None or isinstance(error, FailureRecord):
        return error
    if not isinstance(error, BaseException):
        raise InvalidOptionError(f"error is an exception or a FailureRecord, not {error!r}")
    return failure_from_exception(error, now)


def _batch(messages: object) -> list[Message]:
    """What a sender was given as a list: one message or an iterable of them (each one is
    checked when it is sent)."""
    if isinstance(messages, Message):
        return [messages]
    if isinstance(messages, Iterable) and not isinstance(messages, str | bytes):
        return list(messages)
    raise InvalidOptionError(f"send takes a Message or a list of them, not {messages!r}")


class Sender:
    """Sends to one queue."""

    def __init__(self, broker: Linked, address: str) -> None:
        self.broker = broker
        self.link = broker.link
        self.address = address
        self.shut = False

    def _check_open(self) -> None:
        if self.shut:
            raise InvalidOperationError(f"the sender of {self.address!r} is closed")

    def close(self) -> None:
        """Refuse every later call (:class:`InvalidOperationError`). Closing again does
        nothing."""
        self.shut = True

    def send(self, messages: Message | Iterable[Message]) -> list[int]:
        """Send one message or a batch (one transaction: all or nothing, durable on return).
        Returns the sequence numbers; a duplicate ignored by duplicate detection gets none."""
        return drive(self._send(messages))

    async def _send(self, messages: Message | Iterable[Message]) -> list[int]:
        self._check_open()
        return await self.link.engine.send(self.address, _batch(messages))

    def schedule(self, messages: Message | Iterable[Message], at: Any) -> list[int]:
        """Send messages that become visible at ``at`` (a timezone-aware datetime)."""
        return drive(self._schedule(messages, at))

    async def _schedule(self, messages: Message | Iterable[Message], at: Any) -> list[int]:
        batch = _batch(messages)
        for message in batch:
            message.scheduled_enqueue_time = at
        return await self._send(batch)

    def cancel_scheduled(self, sequence_numbers: int | Sequence[int]) -> int:
        """Cancel scheduled messages not yet due (they leave the queue, counted as dropped),
        all or none: a number naming no such message raises :class:`MessageNotFoundError`.
        On a topic, the copies :meth:`schedule` put in its subscriptions."""
        return drive(self._cancel_scheduled(sequence_numbers))

    async def _cancel_scheduled(self, sequence_numbers: int | Sequence[int]) -> int:
        self._check_open()
        return await self.link.engine.cancel_scheduled(self.address, sequence_numbers)

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Receiver:
    """Receives from one queue or subqueue and settles what it received.

    Settlement methods take one message or a sequence; a sequence is settled in one
    transaction, and if any lock was lost, :class:`MessageLockLostError` is raised and
    none of them changes. ``for message in receiver`` receives one message at a time as
    they arrive, until none has come for ``max_wait_time`` (forever without it).

    With an ``auto_lock_renewer``, every message it receives in peek-lock mode is registered
    with it, so its lock is kept until it is settled (azure-servicebus' receiver does the
    same).
    """

    def __init__(
        self,
        broker: Linked,
        address: str,
        subqueue: SubQueue | str | None,
        receive_mode: ReceiveMode,
        lock_duration: Duration | None,
        max_wait_time: Duration | None = None,
        auto_lock_renewer: LockRenewal | None = None,
    ) -> None:
        self.broker = broker
        self.link = broker.link
        self.address = str(parse_address(address, subqueue))
        self.receive_mode = receive_mode
        self.lock_duration = None if lock_duration is None else lock_seconds(lock_duration)
        self.max_wait_time = (
            None if max_wait_time is None else to_seconds(max_wait_time, "max_wait_time")
        )
        self.auto_lock_renewer = auto_lock_renewer
        self._engine = self.link.engine
        self.shut = False

    def _check_open(self) -> None:
        """A closed receiver refuses every call: a message it received after its ``with``
        would stay locked until its lock ran out."""
        if self.shut:
            raise InvalidOperationError(f"the receiver of {self.address!r} is closed")

    def close(self) -> None:
        """Refuse every later call (:class:`InvalidOperationError`); messages still locked
        stay locked until settled elsewhere or their locks run out. Closing again does
        nothing."""
        self.shut = True

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while True:
            got = self.receive(max_messages=1, max_wait=self.max_wait_time or RECEIVE_WAIT)
            if got:
                yield got[0]
            elif self.max_wait_time is not None:
                return

    def receive(
        self, max_messages: int = 1, max_wait: Duration | None = None
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, oldest first. With ``max_wait``, wait up to that
        long for the first message to arrive and return as soon as any do; without it,
        return at once (possibly empty)."""
        return self._receive(max_messages, max_wait)

    def complete_and_receive(
        self, messages: MessageOrList, max_messages: int = 1, max_wait: Duration | None = None
    ) -> list[ReceivedMessage]:
        """Complete ``messages`` and receive the next ones in one transaction: the same as
        :meth:`complete` then :meth:`receive`, with one commit instead of two. If a lock was
        lost, :class:`MessageLockLostError` is raised and nothing is completed or received."""
        return self._receive(max_messages, max_wait, *self._completing(messages))

    def settle_and_receive(
        self,
        settlements: Sequence[Settlement],
        max_messages: int = 1,
        max_wait: Duration | None = None,
    ) -> list[ReceivedMessage]:
        """Settle messages, each its own way (as :meth:`Broker.settle`), and receive the next
        ones in one transaction: a consumer loop that dead-letters or abandons some of a
        batch still commits once per batch. If a lock was lost,
        :class:`MessageLockLostError` is raised and nothing is settled or received. The
        messages the receiver's ``auto_lock_renewer`` renews are marked settled with them."""
        return self._receive(max_messages, max_wait, *self._settling(settlements))

    def _completing(self, messages: MessageOrList) -> Settling:
        """What :meth:`complete_and_receive`'s first look settles."""
        return self._locks(messages), [], as_list(messages)

    def _settling(self, settlements: Sequence[Settlement]) -> Settling:
        """What :meth:`settle_and_receive`'s first look settles."""
        batch = list(settlements)
        settled = []
        if self.auto_lock_renewer is not None:
            # Anything else in the batch is refused by the engine, before anything changes.
            locks = [(s.sequence_number, s.lock_token) for s in batch if isinstance(s, Settlement)]
            settled = self.auto_lock_renewer.registered(locks)
        return [], batch, settled

    def _receive(
        self,
        max_messages: int,
        max_wait: Duration | None,
        complete: Sequence[tuple[int, str]] = (),
        settle: Sequence[Settlement] = (),
        settled: Sequence[ReceivedMessage] = (),
    ) -> list[ReceivedMessage]:
        """Settle (``complete``, ``settle``; ``settled`` are the messages they are) with the
        first look, then wait up to ``max_wait`` for messages."""
        self._check_open()
        wait = 0.0 if max_wait is None else to_seconds(max_wait, "max_wait")
        deadline = time.monotonic() + wait
        # Only a receive that may wait needs the marker (on PostgreSQL, asking for it opens
        # the store's listening connection).
        marker = self.link.changes.change_marker() if wait > 0 else None
        got = drive(self._look(max_messages, complete, settle, settled))
        return wait_for(
            self.link.changes, deadline, marker, got, lambda: drive(self._look(max_messages))
        )

    async def _look(
        self,
        max_messages: int,
        complete: Sequence[tuple[int, str]] = (),
        settle: Sequence[Settlement] = (),
        settled: Sequence[ReceivedMessage] = (),
    ) -> list[ReceivedMessage]:
        """One look, which waits for nothing: settle (``complete``, ``settle``; ``settled``
        are the messages they are) and receive up to ``max_messages``, handed to the lock
        renewer."""
        self._check_open()
        delete = self.receive_mode is ReceiveMode.RECEIVE_AND_DELETE
        with settling(settled):
            got = await self._fetch(max_messages, delete, list(complete), list(settle))
        if not delete:
            self._renew_locks_of(got)
        return got

    async def _give_back(self, messages: list[ReceivedMessage]) -> None:
        """Put back, uncounted (``Release``), what a look took for a caller that is gone
        (an asyncio receive cancelled while its look ran)."""
        releases: list[Settlement] = [
            Release(m.sequence_number, m.lock_token) for m in messages if m.lock_token
        ]
        if releases and self.receive_mode is ReceiveMode.PEEK_LOCK:
            await self._engine.settle(self.address, releases)

    def _renew_locks_of(self, messages: list[ReceivedMessage]) -> None:
        """Hand received messages to the receiver's lock renewer, if it has one."""
        if self.auto_lock_renewer is not None and messages:
            self.auto_lock_renewer.register(self, messages)

    async def _fetch(
        self,
        max_messages: int,
        delete: bool,
        complete: list[tuple[int, str]],
        settle: list[Settlement],
    ) -> list[ReceivedMessage]:
        return await self._engine.receive(
            self.address, max_messages, delete, self.lock_duration, complete, settle
        )

    def receive_deferred(self, sequence_numbers: int | Sequence[int]) -> list[ReceivedMessage]:
        """Lock deferred messages by sequence number."""
        return drive(self._receive_deferred(sequence_numbers))

    async def _receive_deferred(
        self, sequence_numbers: int | Sequence[int]
    ) -> list[ReceivedMessage]:
        self._check_open()
        got = await self._engine.receive_deferred(
            self.address, sequence_numbers, self.lock_duration
        )
        if got and self.auto_lock_renewer is not None:
            self.auto_lock_renewer.register(self, got)
        return got

    def peek(self, max_messages: int = 1, from_sequence: int = 0) -> list[ReceivedMessage]:
        return drive(self._peek(max_messages, from_sequence))

    async def _peek(self, max_messages: int, from_sequence: int) -> list[ReceivedMessage]:
        self._check_open()
        return await self._engine.peek(self.address, from_sequence, max_messages, MessageFilter())

    def _locks(self, messages: MessageOrList) -> list[tuple[int, str]]:
        """The locks to settle or renew ``messages`` by, checked before any store call: a
        message this client settled already (its ``settled`` mark) refuses the whole batch
        with :class:`MessageAlreadySettledError`, as azure-servicebus refuses one, rather
        than reaching the store and reading as a lost lock."""
        self._check_open()
        if self.receive_mode is ReceiveMode.RECEIVE_AND_DELETE:
            raise InvalidOperationError("messages received with receive_and_delete hold no lock")
        batch = as_list(messages)
        if settled := [message.sequence_number for message in batch if message.settled]:
            raise MessageAlreadySettledError(settled)
        locks = []
        for message in batch:
            if message.lock_token is None:
                raise InvalidOperationError(f"message {message.sequence_number} holds no lock")
            locks.append((message.sequence_number, message.lock_token))
        return locks

    def complete(self, messages: MessageOrList) -> None:
        """locked → completed."""
        drive(self._complete(messages))

    async def _complete(self, messages: MessageOrList) -> None:
        locks = self._locks(messages)
        with settling(as_list(messages)):
            await self._engine.complete(self.address, locks)

    def abandon(
        self,
        messages: MessageOrList,
        error: BaseException | FailureRecord | None = None,
        delay: Duration | None = None,
    ) -> list[int]:
        """locked → active again (or poisoned when every attempt is used). ``error`` is kept
        in each message's failure history. The message is delivered again after the retry
        policy's redelivery delay, or after ``delay`` (seconds or a timedelta) for this call.
        Returns the sequence numbers the retry policy poisoned (dead-lettered or dropped).
        On a session queue a ``delay`` is refused (:class:`InvalidOperationError`): the
        session is delivered in order, so one message cannot wait while the rest goes on."""
        return drive(self._abandon(messages, error, delay))

    async def _abandon(
        self,
        messages: MessageOrList,
        error: BaseException | FailureRecord | None,
        delay: Duration | None,
    ) -> list[int]:
        failure = _failure(error, self.link.clock.now())
        seconds = None if delay is None else to_seconds(delay, "delay")
        locks = self._locks(messages)
        with settling(as_list(messages)):
            return await self._engine.abandon(self.address, locks, failure, seconds)

    def defer(self, messages: MessageOrList) -> None:
        """locked → deferred; get it back with :meth:`receive_deferred`."""
        drive(self._defer(messages))

    async def _defer(self, messages: MessageOrList) -> None:
        locks = self._locks(messages)
        with settling(as_list(messages)):
            await self._engine.defer(self.address, locks)

    def dead_letter(
        self,
        messages: MessageOrList,
        reason: str | None = None,
        description: str | None = None,
        error: BaseException | FailureRecord | None = None,
    ) -> None:
        """locked → the dead-letter queue with ``reason`` and ``description``."""
        drive(self._dead_letter(messages, reason, description, error))

    async def _dead_letter(
        self,
        messages: MessageOrList,
        reason: str | None,
        description: str | None,
        error: BaseException | FailureRecord | None,
    ) -> None:
        failure = _failure(error, self.link.clock.now())
        locks = self._locks(messages)
        with settling(as_list(messages)):
            await self._engine.dead_letter(self.address, locks, reason, description, failure)

    def effective_lock_duration(self) -> float:
        """The lock duration this receiver's locks get (its own, else the queue's)."""
        return drive(self._effective_lock_duration())

    async def _effective_lock_duration(self) -> float:
        if self.lock_duration is None:
            info = await self._engine.get_queue(self.address)
            self.lock_duration = info.options.lock_duration
        return self.lock_duration

    def renew_lock(self, messages: MessageOrList) -> None:
        """Extend the locks by the lock duration; updates ``locked_until`` on the objects."""
        drive(self._renew_lock(messages))

    async def _renew_lock(self, messages: MessageOrList) -> None:
        batch = as_list(messages)
        locks = self._locks(batch)
        until = await self._engine.renew_lock(self.address, locks, self.lock_duration)
        for message in batch:
            message.locked_until = from_timestamp(until)


class SessionReceiver(Receiver):
    """Receives the messages of one session, in order, under the session's lock (Service
    Bus' session receiver). Settle them as with any receiver.

    Only :meth:`renew_session_lock` extends the session lock (receiving and settling do
    not, as in Service Bus): a session worked on for longer than the lock duration needs
    it, or an ``auto_lock_renewer``, which keeps the session (and so every message locked
    under it) for as long as it renews.

    :meth:`close` (or leaving the ``with`` block) gives the session up with the messages
    it still holds, uncounted, so that the next receiver gets the whole session; leaving
    the block by an exception counts a delivery against the oldest of them, the one the
    handler was on, with that exception as its failure. :meth:`dead_letter_session` ends
    the session with an error. After either, the receiver is closed: receiving, the
    session state and the session lock raise :class:`InvalidOperationError`, and settling a
    message it received raises :class:`MessageLockLostError`."""

    def __init__(
        self,
        broker: Linked,
        address: str,
        lock_duration: float | None,
        session_id: str,
        token: str,
        locked_until: float,
        auto_lock_renewer: LockRenewal | None = None,
    ) -> None:
        super().__init__(broker, address, None, ReceiveMode.PEEK_LOCK, lock_duration)
        self.session_id = session_id
        self._token = token
        self.session_locked_until = from_timestamp(locked_until)
        self.closed = False
        self.auto_lock_renewer = auto_lock_renewer
        if auto_lock_renewer is not None:  # the session's lock covers its messages' locks
            try:
                auto_lock_renewer.register(self)
            except BaseException:
                self.close()  # nobody would hold it
                raise

    def __enter__(self) -> SessionReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        drive(self._exit(exc[1] if len(exc) > 1 else None))

    async def _exit(self, error: object) -> None:
        """Close, an exception (not a KeyboardInterrupt or SystemExit, which stop) failing the
        delivery in hand."""
        now = self.link.clock.now()
        await self._close(
            failure_from_exception(error, now) if isinstance(error, Exception) else None
        )

    def _open(self) -> None:
        if self.closed:
            raise InvalidOperationError(
                f"the receiver of session {self.session_id!r} is closed: accept the session again"
            )

    async def _give_back(self, messages: list[ReceivedMessage]) -> None:
        """Nothing to do: the session holds them, and its close gives them back."""

    def _renew_locks_of(self, messages: list[ReceivedMessage]) -> None:
        """Nothing to register: the renewer renews the session, and its messages with it."""

    async def _fetch(
        self,
        max_messages: int,
        delete: bool,
        complete: list[tuple[int, str]],
        settle: list[Settlement],
    ) -> list[ReceivedMessage]:
        self._open()
        return await self._engine.receive_session(
            self.address, self.session_id, self._token, max_messages, complete, settle
        )

    def get_session_state(self) -> bytes | None:
        return drive(self._get_session_state())

    async def _get_session_state(self) -> bytes | None:
        self._open()
        return await self._engine.session_state(self.address, self.session_id, self._token)

    def set_session_state(self, state: bytes | str | None) -> None:
        """Store the session's state (kept after the session is closed)."""
        drive(self._set_session_state(state))

    async def _set_session_state(self, state: bytes | str | None) -> None:
        self._open()
        try:
            data = state.encode() if isinstance(state, str) else state
        except UnicodeEncodeError as exc:
            raise InvalidOptionError(f"session state text must be valid Unicode: {exc}") from None
        await self._engine.set_session_state(self.address, self.session_id, self._token, data)

    def renew_session_lock(self) -> None:
        """Extend the session lock and the locks of the messages received under it."""
        drive(self._renew_session_lock())

    async def _renew_session_lock(self) -> None:
        self._open()
        until = await self._engine.renew_session_lock(
            self.address, self.session_id, self._token, self.lock_duration
        )
        self.session_locked_until = from_timestamp(until)

    async def _renew_lock(self, messages: MessageOrList) -> None:
        """Extend these messages' locks (raising if one is lost) and the session lock with
        them, so a long handler (or :class:`AutoLockRenewer`) keeps the session too."""
        await super()._renew_lock(messages)
        await self._renew_session_lock()

    def dead_letter_session(
        self,
        reason: str,
        description: str | None = None,
        error: BaseException | FailureRecord | None = None,
    ) -> list[int]:
        """End the session with an error, as Service Broker ends a conversation with one
        when it cannot be completed: every message of the session the queue still holds
        (those this receiver holds and those not yet delivered) goes to the dead-letter
        queue with ``reason`` and ``description``, in one transaction, and the receiver is
        closed. Returns their sequence numbers. The session state is kept; a message sent
        to the session later starts it anew."""
        return drive(self._dead_letter_session(reason, description, error))

    async def _dead_letter_session(
        self,
        reason: str,
        description: str | None,
        error: BaseException | FailureRecord | None,
    ) -> list[int]:
        self._open()
        failure = _failure(error, self.link.clock.now())
        with self._closing():
            return await self._engine.dead_letter_session(
                self.address, self.session_id, self._token, reason, description, failure
            )

    def close(self) -> None:
        """Give the session up, with the messages still locked under it (uncounted: a
        close is not a failed delivery), so another receiver can accept all of it. Closing
        again does nothing."""
        drive(self._close(None))

    async def _close(self, failure: FailureRecord | None) -> None:
        if self.closed:
            return
        with self._closing():
            await self._engine.close_session(self.address, self.session_id, self._token, failure)

    @contextmanager
    def _closing(self) -> Iterator[None]:
        """Closed before the store gives the session up (a renewal that fails because the
        close got there first is no loss), and open again if it does not."""
        self.closed = True
        try:
            yield
        except BaseException:
            self.closed = False
            raise
