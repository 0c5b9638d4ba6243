"""The public Python API: ``poisonq.connect(url)`` gives a :class:`Broker`.

The broker hands out senders and receivers bound to one address and exposes the admin
operations. Everything here calls the engine; nothing touches the store directly except the
long-poll wait, which asks the store whether anything changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from poisonq.clock import Clock, SystemClock
from poisonq.engine import Engine
from poisonq.errors import (
    InvalidOperationError,
    InvalidOptionError,
    MessageLockLostError,
    PoisonqError,
)
from poisonq.failures import failure_from_exception
from poisonq.model import (
    Duration,
    EntityStatus,
    FailureRecord,
    Lease,
    Message,
    ReceivedMessage,
    ReceiveMode,
    Settlement,
    SubQueue,
    from_timestamp,
    to_seconds,
)
from poisonq.names import parse_address
from poisonq.options import MAX_LOCK_DURATION, QueueOptions
from poisonq.reports import AuditReport, QueueInfo
from poisonq.store import open_store
from poisonq.store.base import DeadLetterGroup, MessageFilter, Store
from poisonq.tasks import BulkTask, purge_task, resubmit_task

log = logging.getLogger(__name__)

DEFAULT_URL = "sqlite:///poisonq.db"
Messages = ReceivedMessage | Sequence[ReceivedMessage]


def connect(url: str = DEFAULT_URL, *, clock: Clock | None = None) -> Broker:
    """Open the store ``url`` names (``sqlite:///path`` or ``postgresql://...``)."""
    return Broker(open_store(url), clock or SystemClock())


def _as_list(messages: Messages) -> list[ReceivedMessage]:
    return [messages] if isinstance(messages, ReceivedMessage) else list(messages)


def _filter(where: dict[str, Any]) -> MessageFilter:
    """A message filter from keyword arguments, refusing unknown names."""
    try:
        return MessageFilter(**where)
    except TypeError:
        known = ", ".join(MessageFilter.__dataclass_fields__)
        raise InvalidOptionError(f"unknown filter in {sorted(where)}; use {known}") from None


def _lock_seconds(lock_duration: Duration) -> float:
    seconds = to_seconds(lock_duration, "lock_duration")
    if not 0 < seconds <= MAX_LOCK_DURATION:
        raise InvalidOptionError(f"lock_duration must be in (0, {MAX_LOCK_DURATION:g}] seconds")
    return seconds


def _failure(error: BaseException | FailureRecord | None, now: float) -> FailureRecord | None:
    if error is None or isinstance(error, FailureRecord):
        return error
    return failure_from_exception(error, now)


class Broker:
    """A connection to a poisonq store: admin operations, senders and receivers."""

    def __init__(self, store: Store, clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self.engine = Engine(store, self.clock)

    @property
    def url(self) -> str:
        return self.store.url

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Admin --------------------------------------------------------------------------------
    def create_queue(
        self, name: str, *, max_delivery_count: int | None = None, **options: Any
    ) -> QueueInfo:
        """Create a queue (and its subqueues). Options: see :class:`QueueOptions`."""
        built = QueueOptions.build(None, max_delivery_count=max_delivery_count, **options)
        return self.engine.create_queue(name, built)

    def update_queue(
        self, name: str, *, max_delivery_count: int | None = None, **options: Any
    ) -> QueueInfo:
        if max_delivery_count is not None:
            options["max_delivery_count"] = max_delivery_count
        return self.engine.update_queue(name, **options)

    def get_queue(self, address: str) -> QueueInfo:
        return self.engine.get_queue(address)

    def list_queues(self) -> list[QueueInfo]:
        return self.engine.list_queues()

    def delete_queue(self, name: str) -> None:
        self.engine.delete_queue(name)

    def set_status(
        self, address: str, status: EntityStatus | str, cause: str | None = None
    ) -> None:
        try:
            status = EntityStatus(status)
        except ValueError:
            choices = ", ".join(s.value for s in EntityStatus)
            raise InvalidOptionError(f"status must be one of {choices}, not {status!r}") from None
        self.engine.set_status(address, status, cause)

    def enable(self, address: str) -> None:
        self.set_status(address, EntityStatus.ACTIVE)

    def disable(self, address: str) -> None:
        self.set_status(address, EntityStatus.DISABLED)

    def counts(self, address: str) -> dict[str, int]:
        """Messages held by state, plus the dead-letter depth and lifetime completions/drops."""
        return self.engine.counts(address)

    def audit(self) -> AuditReport:
        """Check that every message sent is completed, dropped or still held somewhere."""
        return self.engine.audit()

    # Messaging ----------------------------------------------------------------------------
    def sender(self, address: str) -> Sender:
        return Sender(self, address)

    def receiver(
        self,
        address: str,
        *,
        subqueue: SubQueue | str | None = None,
        receive_mode: ReceiveMode | str = ReceiveMode.PEEK_LOCK,
        lock_duration: Duration | None = None,
    ) -> Receiver:
        try:
            mode = ReceiveMode(receive_mode)
        except ValueError:
            choices = ", ".join(m.value for m in ReceiveMode)
            raise InvalidOptionError(f"receive_mode must be one of {choices}") from None
        return Receiver(self, address, subqueue, mode, lock_duration)

    def peek(
        self, address: str, *, from_sequence: int = 0, max_messages: int = 100
    ) -> list[ReceivedMessage]:
        """Messages without locking them or counting a delivery."""
        return self.engine.peek(address, from_sequence, max_messages)

    def sequence_span(self, address: str) -> tuple[int, int, int]:
        """(count, lowest, highest) sequence number held by ``address``; (0, 0, -1) if empty.
        Spark splits a read into partitions by this range."""
        return self.engine.sequence_span(address)

    def message(self, address: str, sequence_number: int) -> ReceivedMessage:
        """One message by sequence number, with its failure history."""
        return self.engine.message(address, sequence_number)

    def settle(self, address: str, settlements: Sequence[Settlement]) -> list[int]:
        """Settle many locked messages, each its own way (:class:`Complete`,
        :class:`Abandon`, :class:`DeadLetter`), in one transaction. A lost lock raises
        :class:`MessageLockLostError` and changes nothing. Returns the sequence numbers
        the retry policy poisoned."""
        return self.engine.settle(address, settlements)

    def settle_held(
        self, address: str, settlements: Sequence[Settlement]
    ) -> tuple[list[int], list[int]]:
        """:meth:`settle` what is still held: settlements whose lock ran out are left out
        (those messages will be delivered again) and the rest settled in one transaction.
        Returns (poisoned, lost) sequence numbers."""
        pending = {s.sequence_number: s for s in settlements}
        lost: list[int] = []
        while pending:
            try:
                return self.engine.settle(address, list(pending.values())), lost
            except MessageLockLostError as exc:
                log.warning("lost the lock on message(s) %s", exc.sequence_numbers)
                lost += exc.sequence_numbers
                for seq in exc.sequence_numbers:
                    del pending[seq]
        return [], lost

    # Leases: the batches Spark queries lock ---------------------------------------------
    def acquire_lease(
        self,
        address: str,
        consumer: str,
        number: int,
        max_messages: int,
        lock_duration: Duration | None = None,
    ) -> Lease | None:
        """Lock up to ``max_messages`` messages as lease ``number`` of ``consumer``, or get
        that lease again (renewed) if it exists. ``None`` when nothing is receivable."""
        seconds = None if lock_duration is None else _lock_seconds(lock_duration)
        return self.engine.acquire_lease(address, consumer, number, max_messages, seconds)

    def lease(self, address: str, consumer: str, number: int | None = None) -> Lease | None:
        """The consumer's lease ``number`` (its latest by default), if it still exists."""
        return self.engine.lease(address, consumer, number)

    def lease_sequence_numbers(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> list[int]:
        """The sequence numbers in ``[lo, hi]`` the lease still holds under a valid lock."""
        return self.engine.lease_sequence_numbers(lease, lo, hi)

    def lease_rows(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> list[tuple[Any, ...]]:
        """The messages the lease still holds, as tuples of
        :data:`poisonq.store.base.LEASE_COLUMNS` (what Spark executors read)."""
        return self.engine.lease_rows(lease, lo, hi)

    def renew_lease(self, lease: Lease, lock_duration: Duration | None = None) -> int:
        seconds = None if lock_duration is None else _lock_seconds(lock_duration)
        return self.engine.renew_lease(lease, seconds)

    def complete_lease(self, lease: Lease) -> int:
        """Complete what the lease still holds; returns how many were completed."""
        return self.engine.complete_lease(lease)

    # Dead-letter operations ---------------------------------------------------------------
    def dead_letter_groups(self, queue: str, by: str = "reason") -> list[DeadLetterGroup]:
        """Dead-lettered messages of ``queue`` grouped by reason, subject or fingerprint."""
        if by not in ("reason", "subject", "fingerprint"):
            raise InvalidOptionError(f"group by reason, subject or fingerprint, not {by!r}")
        return self.engine.dead_letter_groups(self._dlq(queue), by)

    def resubmit(
        self,
        queue: str,
        *,
        to: str | None = None,
        rate: float | None = 500.0,
        wait: bool = True,
        progress: Callable[[BulkTask], None] | None = None,
        **where: Any,
    ) -> BulkTask:
        """Move dead-lettered messages of ``queue`` back to it (or to ``to``) as a tracked
        task, at most ``rate`` messages per second. Filters: ``reason``, ``subject``,
        ``fingerprint``, ``min_sequence``, ``max_sequence``, ``since``, ``until``.
        With ``wait=False`` the task runs in a thread; ``task.cancel()`` stops it."""
        task = resubmit_task(self.engine, self._dlq(queue), _filter(where), to, rate)
        return task.run(wait=wait, progress=progress)

    def purge(
        self,
        queue: str,
        *,
        progress: Callable[[BulkTask], None] | None = None,
        **where: Any,
    ) -> BulkTask:
        """Drop dead-lettered messages of ``queue`` that match the filters (all by default)."""
        task = purge_task(self.engine, self._dlq(queue), _filter(where))
        return task.run(wait=True, progress=progress)

    def _dlq(self, queue: str) -> str:
        """``orders`` means its dead-letter queue here; a subqueue address stays as it is."""
        address = parse_address(queue)
        if address.subqueue is None:
            address = parse_address(queue, SubQueue.DEADLETTER)
        return str(address)


class Sender:
    """Sends to one queue."""

    def __init__(self, broker: Broker, address: str) -> None:
        self.broker = broker
        self.address = address

    def send(self, messages: Message | Iterable[Message]) -> list[int]:
        """Send one message or a batch (one transaction: all or nothing, durable on return).
        Returns the sequence numbers; a duplicate ignored by duplicate detection gets none."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        return self.broker.engine.send(self.address, batch)

    def schedule(self, messages: Message | Iterable[Message], at: Any) -> list[int]:
        """Send messages that become visible at ``at`` (a timezone-aware datetime)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
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
    none of them changes.
    """

    def __init__(
        self,
        broker: Broker,
        address: str,
        subqueue: SubQueue | str | None,
        receive_mode: ReceiveMode,
        lock_duration: Duration | None,
    ) -> None:
        self.broker = broker
        self.address = str(parse_address(address, subqueue))
        self.receive_mode = receive_mode
        self.lock_duration = None if lock_duration is None else _lock_seconds(lock_duration)
        self._engine = broker.engine

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def receive(
        self, max_messages: int = 1, max_wait: Duration | None = None
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, oldest first. With ``max_wait``, wait up to that
        long for the first message to arrive and return as soon as any do; without it,
        return at once (possibly empty)."""
        return self._receive(max_messages, max_wait, [])

    def complete_and_receive(
        self, messages: Messages, max_messages: int = 1, max_wait: Duration | None = None
    ) -> list[ReceivedMessage]:
        """Complete ``messages`` and receive the next ones in one transaction: the same as
        :meth:`complete` then :meth:`receive`, with one commit instead of two. If a lock was
        lost, :class:`MessageLockLostError` is raised and nothing is completed or received."""
        return self._receive(max_messages, max_wait, self._locks(messages))

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
            got = self._engine.receive(
                self.address, max_messages, delete, self.lock_duration, complete, settle or ()
            )
            complete, settle = [], None
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            # Scheduled messages and expired locks become receivable without any commit,
            # so look again at least every 100 ms even when nothing changed.
            self.broker.store.wait_for_change(marker, min(left, 0.1))

    def receive_deferred(self, sequence_numbers: int | Sequence[int]) -> list[ReceivedMessage]:
        """Lock deferred messages by sequence number."""
        seqs = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        return self._engine.receive_deferred(self.address, seqs, self.lock_duration)

    def peek(self, max_messages: int = 1, from_sequence: int = 0) -> list[ReceivedMessage]:
        return self._engine.peek(self.address, from_sequence, max_messages)

    def _locks(self, messages: Messages) -> list[tuple[int, str]]:
        if self.receive_mode is ReceiveMode.RECEIVE_AND_DELETE:
            raise InvalidOperationError("messages received with receive_and_delete hold no lock")
        locks = []
        for message in _as_list(messages):
            if message.lock_token is None:
                raise InvalidOperationError(f"message {message.sequence_number} holds no lock")
            locks.append((message.sequence_number, message.lock_token))
        return locks

    def complete(self, messages: Messages) -> None:
        """locked → completed."""
        self._engine.complete(self.address, self._locks(messages))

    def abandon(
        self, messages: Messages, error: BaseException | FailureRecord | None = None
    ) -> list[int]:
        """locked → active again (or poisoned when every attempt is used). ``error`` is kept
        in each message's failure history. Returns the sequence numbers the retry policy
        poisoned (dead-lettered or dropped) with this abandon."""
        failure = _failure(error, self.broker.clock.now())
        return self._engine.abandon(self.address, self._locks(messages), failure)

    def defer(self, messages: Messages) -> None:
        """locked → deferred; get it back with :meth:`receive_deferred`."""
        self._engine.defer(self.address, self._locks(messages))

    def dead_letter(
        self,
        messages: Messages,
        reason: str | None = None,
        description: str | None = None,
        error: BaseException | FailureRecord | None = None,
    ) -> None:
        """locked → the dead-letter queue with ``reason`` and ``description``."""
        failure = _failure(error, self.broker.clock.now())
        self._engine.dead_letter(self.address, self._locks(messages), reason, description, failure)

    def effective_lock_duration(self) -> float:
        """The lock duration this receiver's locks get (its own, else the queue's)."""
        if self.lock_duration is None:
            self.lock_duration = self.broker.get_queue(self.address).options.lock_duration
        return self.lock_duration

    def renew_lock(self, messages: Messages) -> None:
        """Extend the locks by the lock duration; updates ``locked_until`` on the objects."""
        batch = _as_list(messages)
        until = self._engine.renew_lock(self.address, self._locks(batch), self.lock_duration)
        for message in batch:
            message.locked_until = from_timestamp(until)


class AutoLockRenewer:
    """Renews the locks of registered messages in a background thread until they are settled
    or ``max_lock_renewal_duration`` has passed (as the Service Bus SDK's renewer does)."""

    def __init__(
        self,
        max_lock_renewal_duration: Duration = 300.0,
        on_lock_renew_failure: Callable[[ReceivedMessage, PoisonqError], None] | None = None,
        check_interval: float = 0.5,
    ) -> None:
        self.max_lock_renewal_duration = to_seconds(
            max_lock_renewal_duration, "max_lock_renewal_duration"
        )
        self.on_lock_renew_failure = on_lock_renew_failure
        self._interval = check_interval
        self._entries: dict[tuple[int, str], tuple[Receiver, ReceivedMessage, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(
        self,
        receiver: Receiver,
        messages: Messages,
        max_lock_renewal_duration: Duration | None = None,
    ) -> None:
        """Keep renewing these messages' locks until they are settled or the time is up."""
        limit = (
            self.max_lock_renewal_duration
            if max_lock_renewal_duration is None
            else to_seconds(max_lock_renewal_duration, "max_lock_renewal_duration")
        )
        until = time.monotonic() + limit
        with self._lock:
            for message in _as_list(messages):
                if message.lock_token is None:
                    raise InvalidOperationError(f"message {message.sequence_number} holds no lock")
                self._entries[(message.sequence_number, message.lock_token)] = (
                    receiver,
                    message,
                    until,
                )
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="poisonq-lock-renewer", daemon=True
                )
                self._thread.start()

    def unregister(self, messages: Messages) -> None:
        with self._lock:
            for message in _as_list(messages):
                self._entries.pop((message.sequence_number, message.lock_token or ""), None)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.renew_due()

    def renew_due(self) -> None:
        """One pass: renew every registered lock that is past half its lock duration."""
        with self._lock:
            entries = list(self._entries.items())
        for key, (receiver, message, until) in entries:
            if time.monotonic() >= until:
                self.unregister(message)
                continue
            assert message.locked_until is not None
            remaining = message.locked_until.timestamp() - receiver.broker.clock.now()
            if remaining > receiver.effective_lock_duration() / 2:
                continue
            try:
                receiver.renew_lock(message)
            except PoisonqError as exc:
                # A settled message has no lock left to renew: that is the normal end.
                with self._lock:
                    self._entries.pop(key, None)
                if self.on_lock_renew_failure is not None:
                    self.on_lock_renew_failure(message, exc)
                else:
                    log.debug("stopped renewing message %s: %s", message.sequence_number, exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._entries.clear()

    def __enter__(self) -> AutoLockRenewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
