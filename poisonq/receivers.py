"""Senders and receivers: what ``Broker.sender``, ``Broker.receiver`` and
``Broker.accept_session`` hand out. Each is bound to one address and calls the engine."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from poisonq.errors import InvalidOperationError, InvalidOptionError
from poisonq.failures import failure_from_exception
from poisonq.model import (
    Duration,
    FailureRecord,
    Message,
    ReceivedMessage,
    ReceiveMode,
    Settlement,
    SubQueue,
    from_timestamp,
    to_seconds,
)
from poisonq.names import parse_address
from poisonq.options import MAX_LOCK_DURATION
from poisonq.store.base import MessageFilter

if TYPE_CHECKING:
    from poisonq.client import Broker

MessageOrList = ReceivedMessage | Sequence[ReceivedMessage]
_ITER_WAIT = 60.0  # seconds one receive of an endless iteration waits before it asks again


def as_list(messages: MessageOrList) -> list[ReceivedMessage]:
    """One received message or a sequence of them, as a list; anything else is refused."""
    if isinstance(messages, ReceivedMessage):
        return [messages]
    if isinstance(messages, Sequence) and all(isinstance(m, ReceivedMessage) for m in messages):
        return list(messages)
    raise InvalidOptionError(f"settle received messages (one or a list), not {messages!r}")


def _mark_settled(messages: MessageOrList) -> None:
    for message in as_list(messages):
        message.settled = True


def lock_seconds(lock_duration: Duration) -> float:
    seconds = to_seconds(lock_duration, "lock_duration")
    if not 0 < seconds <= MAX_LOCK_DURATION:
        raise InvalidOptionError(f"lock_duration must be in (0, {MAX_LOCK_DURATION:g}] seconds")
    return seconds


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

    def __init__(self, broker: Broker, address: str) -> None:
        self.broker = broker
        self.address = address

    def send(self, messages: Message | Iterable[Message]) -> list[int]:
        """Send one message or a batch (one transaction: all or nothing, durable on return).
        Returns the sequence numbers; a duplicate ignored by duplicate detection gets none."""
        return self.broker.engine.send(self.address, _batch(messages))

    def schedule(self, messages: Message | Iterable[Message], at: Any) -> list[int]:
        """Send messages that become visible at ``at`` (a timezone-aware datetime)."""
        batch = _batch(messages)
        for message in batch:
            message.scheduled_enqueue_time = at
        return self.send(batch)

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Receiver:
    """Receives from one queue or subqueue and settles what it received.

    Settlement methods take one message or a sequence; a sequence is settled in one
    transaction, and if any lock was lost, :class:`MessageLockLostError` is raised and
    none of them changes. ``for message in receiver`` receives one message at a time as
    they arrive, until none has come for ``max_wait_time`` (forever without it).
    """

    def __init__(
        self,
        broker: Broker,
        address: str,
        subqueue: SubQueue | str | None,
        receive_mode: ReceiveMode,
        lock_duration: Duration | None,
        max_wait_time: Duration | None = None,
    ) -> None:
        self.broker = broker
        self.address = str(parse_address(address, subqueue))
        self.receive_mode = receive_mode
        self.lock_duration = None if lock_duration is None else lock_seconds(lock_duration)
        self.max_wait_time = (
            None if max_wait_time is None else to_seconds(max_wait_time, "max_wait_time")
        )
        self._engine = broker.engine

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while True:
            got = self.receive(max_messages=1, max_wait=self.max_wait_time or _ITER_WAIT)
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
        return self._receive(max_messages, max_wait, [])

    def complete_and_receive(
        self, messages: MessageOrList, max_messages: int = 1, max_wait: Duration | None = None
    ) -> list[ReceivedMessage]:
        """Complete ``messages`` and receive the next ones in one transaction: the same as
        :meth:`complete` then :meth:`receive`, with one commit instead of two. If a lock was
        lost, :class:`MessageLockLostError` is raised and nothing is completed or received."""
        received = self._receive(max_messages, max_wait, self._locks(messages))
        _mark_settled(messages)
        return received

    def settle_and_receive(
        self,
        settlements: Sequence[Settlement],
        max_messages: int = 1,
        max_wait: Duration | None = None,
    ) -> list[ReceivedMessage]:
        """Settle messages, each its own way (as :meth:`Broker.settle`), and receive the next
        ones in one transaction: a consumer loop that dead-letters or abandons some of a
        batch still commits once per batch. If a lock was lost,
        :class:`MessageLockLostError` is raised and nothing is settled or received."""
        return self._receive(max_messages, max_wait, [], list(settlements))

    def _receive(
        self,
        max_messages: int,
        max_wait: Duration | None,
        complete: list[tuple[int, str]],
        settle: list[Settlement] | None = None,
    ) -> list[ReceivedMessage]:
        wait = 0.0 if max_wait is None else to_seconds(max_wait, "max_wait")
        deadline = time.monotonic() + wait
        delete = self.receive_mode is ReceiveMode.RECEIVE_AND_DELETE
        while True:
            # Only a receive that may wait needs the marker (on PostgreSQL, asking for it
            # opens the store's listening connection).
            marker = self.broker.store.change_marker() if wait > 0 else None
            got = self._fetch(max_messages, delete, complete, settle or [])
            complete, settle = [], None
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            # Scheduled messages and expired locks become receivable without any commit,
            # so look again at least every 100 ms even when nothing changed.
            self.broker.store.wait_for_change(marker, min(left, 0.1))

    def _fetch(
        self,
        max_messages: int,
        delete: bool,
        complete: list[tuple[int, str]],
        settle: list[Settlement],
    ) -> list[ReceivedMessage]:
        return self._engine.receive(
            self.address, max_messages, delete, self.lock_duration, complete, settle
        )

    def receive_deferred(self, sequence_numbers: int | Sequence[int]) -> list[ReceivedMessage]:
        """Lock deferred messages by sequence number."""
        return self._engine.receive_deferred(self.address, sequence_numbers, self.lock_duration)

    def peek(self, max_messages: int = 1, from_sequence: int = 0) -> list[ReceivedMessage]:
        return self._engine.peek(self.address, from_sequence, max_messages, MessageFilter())

    def _locks(self, messages: MessageOrList) -> list[tuple[int, str]]:
        if self.receive_mode is ReceiveMode.RECEIVE_AND_DELETE:
            raise InvalidOperationError("messages received with receive_and_delete hold no lock")
        locks = []
        for message in as_list(messages):
            if message.lock_token is None:
                raise InvalidOperationError(f"message {message.sequence_number} holds no lock")
            locks.append((message.sequence_number, message.lock_token))
        return locks

    def complete(self, messages: MessageOrList) -> None:
        """locked → completed."""
        self._engine.complete(self.address, self._locks(messages))
        _mark_settled(messages)

    def abandon(
        self,
        messages: MessageOrList,
        error: BaseException | FailureRecord | None = None,
        delay: Duration | None = None,
    ) -> list[int]:
        """locked → active again (or poisoned when every attempt is used). ``error`` is kept
        in each message's failure history. The message is delivered again after the retry
        policy's redelivery delay, or after ``delay`` (seconds or a timedelta) for this call.
        Returns the sequence numbers the retry policy poisoned (dead-lettered or dropped)."""
        failure = _failure(error, self.broker.clock.now())
        seconds = None if delay is None else to_seconds(delay, "delay")
        poisoned = self._engine.abandon(self.address, self._locks(messages), failure, seconds)
        _mark_settled(messages)
        return poisoned

    def defer(self, messages: MessageOrList) -> None:
        """locked → deferred; get it back with :meth:`receive_deferred`."""
        self._engine.defer(self.address, self._locks(messages))
        _mark_settled(messages)

    def dead_letter(
        self,
        messages: MessageOrList,
        reason: str | None = None,
        description: str | None = None,
        error: BaseException | FailureRecord | None = None,
    ) -> None:
        """locked → the dead-letter queue with ``reason`` and ``description``."""
        failure = _failure(error, self.broker.clock.now())
        self._engine.dead_letter(self.address, self._locks(messages), reason, description, failure)
        _mark_settled(messages)

    def effective_lock_duration(self) -> float:
        """The lock duration this receiver's locks get (its own, else the queue's)."""
        if self.lock_duration is None:
            self.lock_duration = self.broker.get_queue(self.address).options.lock_duration
        return self.lock_duration

    def renew_lock(self, messages: MessageOrList) -> None:
        """Extend the locks by the lock duration; updates ``locked_until`` on the objects."""
        batch = as_list(messages)
        until = self._engine.renew_lock(self.address, self._locks(batch), self.lock_duration)
        for message in batch:
            message.locked_until = from_timestamp(until)


class SessionReceiver(Receiver):
    """Receives the messages of one session, in order, under the session's lock (Service
    Bus' session receiver). Settle them as with any receiver; :meth:`close` (or leaving the
    ``with`` block) gives the session up so another receiver can accept it."""

    def __init__(
        self,
        broker: Broker,
        address: str,
        lock_duration: float | None,
        session_id: str,
        token: str,
        locked_until: float,
    ) -> None:
        super().__init__(broker, address, None, ReceiveMode.PEEK_LOCK, lock_duration)
        self.session_id = session_id
        self._token = token
        self.session_locked_until = from_timestamp(locked_until)

    def __enter__(self) -> SessionReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetch(
        self,
        max_messages: int,
        delete: bool,
        complete: list[tuple[int, str]],
        settle: list[Settlement],
    ) -> list[ReceivedMessage]:
        return self._engine.receive_session(
            self.address, self.session_id, self._token, max_messages, complete, settle
        )

    def get_session_state(self) -> bytes | None:
        return self._engine.session_state(self.address, self.session_id, self._token)

    def set_session_state(self, state: bytes | str | None) -> None:
        """Store the session's state (kept after the session is closed)."""
        try:
            data = state.encode() if isinstance(state, str) else state
        except UnicodeEncodeError as exc:
            raise InvalidOptionError(f"session state text must be valid Unicode: {exc}") from None
        self._engine.set_session_state(self.address, self.session_id, self._token, data)

    def renew_session_lock(self) -> None:
        """Extend the session lock and the locks of the messages received under it."""
        until = self._engine.renew_session_lock(
            self.address, self.session_id, self._token, self.lock_duration
        )
        self.session_locked_until = from_timestamp(until)

    def renew_lock(self, messages: MessageOrList) -> None:
        """Extend these messages' locks (raising if one is lost) and the session lock with
        them, so a long handler (or :class:`AutoLockRenewer`) keeps the session too."""
        super().renew_lock(messages)
        self.renew_session_lock()

    def close(self) -> None:
        self._engine.close_session(self.address, self.session_id, self._token)
