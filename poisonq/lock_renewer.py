"""The :class:`AutoLockRenewer`: keeps message and session locks alive while a handler works."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from poisonq.engine.driving import drive
from poisonq.errors import (
    InvalidOperationError,
    InvalidOptionError,
    MessageLockLostError,
    PoisonqError,
    SessionLockLostError,
)
from poisonq.model import Duration, ReceivedMessage, to_seconds
from poisonq.receivers import MessageOrList, SessionReceiver, as_list

if TYPE_CHECKING:
    from poisonq.receivers import Receiver

log = logging.getLogger(__name__)

Renewable = ReceivedMessage | SessionReceiver
# Called with the message, or the session receiver whose session lock was lost.
LockRenewFailure = Callable[[Any, PoisonqError], None]


@dataclasses.dataclass(frozen=True)
class _Watch:
    """One registered lock: a message's, or a session receiver's session lock."""

    receiver: Receiver
    renewable: Renewable
    until: float  # on time.monotonic: when renewing stops
    on_failure: LockRenewFailure | None  # this registration's own, else the renewer's

    @property
    def key(self) -> Hashable:
        if isinstance(self.renewable, SessionReceiver):
            return ("session", id(self.renewable))
        return (self.renewable.sequence_number, self.renewable.lock_token)

    def ended(self) -> bool:
        """Settled (or, for a session, closed) by its receiver: the normal end, not a loss.
        Receivers mark this before the store settles, so a renewal that failed because a
        settlement got there first sees it."""
        if isinstance(self.renewable, SessionReceiver):
            return self.renewable.closed
        return self.renewable.settled

    def remaining(self) -> float:
        renewable = self.renewable
        if isinstance(renewable, SessionReceiver):
            end = renewable.session_locked_until
        else:
            end = renewable.locked_until
        assert end is not None  # register refuses a message that holds no lock
        return end.timestamp() - self.receiver.link.clock.now()

    async def renew(self) -> None:
        if isinstance(self.renewable, SessionReceiver):
            await self.renewable._renew_session_lock()
        else:
            await self.receiver._renew_lock(self.renewable)

    def ran_out(self) -> PoisonqError:
        """The error of a lock that ran out after renewing stopped."""
        renewable = self.renewable
        if isinstance(renewable, SessionReceiver):
            return SessionLockLostError(renewable.address, renewable.session_id, ran_out=True)
        return MessageLockLostError([renewable.sequence_number])


def check_renewer(renewer: object) -> None:
    """An ``auto_lock_renewer=`` argument: an :class:`AutoLockRenewer` or ``None``, refused
    before anything is received or locked (a wrong one would fail after the receive and
    leave its messages locked until they count a delivery)."""
    if renewer is not None and not isinstance(renewer, AutoLockRenewer):
        raise InvalidOptionError(f"auto_lock_renewer must be an AutoLockRenewer, not {renewer!r}")


class AutoLockRenewer:
    """Renews the locks of registered messages, and of registered sessions, in a background
    thread until they are settled (a session: closed) or ``max_lock_renewal_duration`` has
    passed, as the Service Bus SDK's renewer does. Pass it as a receiver's
    ``auto_lock_renewer`` to register what the receiver receives, or a session receiver's
    session as it is accepted.

    ``on_lock_renew_failure(renewable, error)`` is called once for a message (or a session
    receiver) whose lock is lost while it is registered: a renewal that failed, or a lock
    that ran out after the renewing stopped at ``max_lock_renewal_duration``. A lock that
    ends because it was settled or closed, even while a renewal was on its way, is no loss.
    Without a callback, a loss is logged.

    With ``thread=False`` it starts no thread: its owner runs a pass every
    ``check_interval`` (:mod:`poisonq.aio`'s renewer awaits ``_renew_due``, the pass as a
    coroutine, from a task)."""

    def __init__(
        self,
        max_lock_renewal_duration: Duration = 300.0,
        on_lock_renew_failure: LockRenewFailure | None = None,
        check_interval: float = 0.5,
        *,
        thread: bool = True,
    ) -> None:
        self.max_lock_renewal_duration = to_seconds(
            max_lock_renewal_duration, "max_lock_renewal_duration"
        )
        self.on_lock_renew_failure = on_lock_renew_failure
        self.check_interval = check_interval
        self._renews_in_thread = thread
        self._entries: dict[Hashable, _Watch] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(
        self,
        receiver: Receiver,
        messages: MessageOrList | None = None,
        max_lock_renewal_duration: Duration | None = None,
        on_lock_renew_failure: LockRenewFailure | None = None,
    ) -> None:
        """Keep renewing these messages' locks until they are settled or the time is up;
        with a session receiver and no messages, its session lock (which covers the locks
        of the messages received under it) until it is closed. ``on_lock_renew_failure``
        replaces the renewer's own callback for what this call registers. A renewer that
        was closed refuses (it would renew nothing), as azure's does."""
        if self._stop.is_set():
            raise InvalidOperationError("the AutoLockRenewer is closed: make a new one")
        limit = (
            self.max_lock_renewal_duration
            if max_lock_renewal_duration is None
            else to_seconds(max_lock_renewal_duration, "max_lock_renewal_duration")
        )
        until = time.monotonic() + limit
        renewables: list[Renewable]
        if messages is not None:
            renewables = list(as_list(messages))
        elif isinstance(receiver, SessionReceiver):
            renewables = [receiver]
        else:
            raise InvalidOperationError("register messages, or a session receiver's session")
        for renewable in renewables:
            if isinstance(renewable, ReceivedMessage) and renewable.lock_token is None:
                raise InvalidOperationError(f"message {renewable.sequence_number} holds no lock")
        with self._lock:
            for renewable in renewables:
                watch = _Watch(receiver, renewable, until, on_lock_renew_failure)
                self._entries[watch.key] = watch
            if self._thread is None and self._renews_in_thread:
                self._thread = threading.Thread(
                    target=self._run, name="poisonq-lock-renewer", daemon=True
                )
                self._thread.start()

    def registered(self, locks: Iterable[tuple[int, str]]) -> list[ReceivedMessage]:
        """The registered messages that hold these locks: a receiver that settles by lock
        (``settle_and_receive``) marks them settled before the store settles them."""
        with self._lock:
            watches = [self._entries.get(lock) for lock in locks]
        return [w.renewable for w in watches if w and isinstance(w.renewable, ReceivedMessage)]

    def unregister(self, messages: MessageOrList) -> None:
        with self._lock:
            for message in as_list(messages):
                self._entries.pop((message.sequence_number, message.lock_token), None)

    def _run(self) -> None:
        while not self._stop.wait(self.check_interval):
            self.renew_due()

    def renew_due(self) -> None:
        """One pass: renew every registered lock that is past half its lock duration."""
        drive(self._renew_due())

    async def _renew_due(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
        for watch in entries:
            if watch.ended():
                self._forget(watch)
                continue
            remaining = watch.remaining()
            if time.monotonic() >= watch.until:  # renewing is over: watch for the lock's end
                if remaining <= 0 and self._forget(watch) and not watch.ended():
                    self._lost(watch, watch.ran_out())
                continue
            if remaining > await watch.receiver._effective_lock_duration() / 2:
                continue
            try:
                await watch.renew()
            except PoisonqError as exc:
                # A settlement that reached the store while this renewal was on its way
                # marked the message first: that is its normal end, not a loss.
                if self._forget(watch) and not watch.ended():
                    self._lost(watch, exc)

    def _forget(self, watch: _Watch) -> bool:
        """Stop watching a lock; whether it was still registered."""
        with self._lock:
            return self._entries.pop(watch.key, None) is not None

    def _lost(self, watch: _Watch, error: PoisonqError) -> None:
        on_failure = watch.on_failure or self.on_lock_renew_failure
        if on_failure is not None:
            try:
                on_failure(watch.renewable, error)
            except Exception:  # a callback's error must not end the pass, or the renewing
                # thread, for every other lock
                log.exception("on_lock_renew_failure %r raised for %r", on_failure, watch.renewable)
        elif isinstance(watch.renewable, SessionReceiver):
            log.warning("lost the lock on session %s: %s", watch.renewable.session_id, error)
        else:
            log.warning("lost the lock on message %s: %s", watch.renewable.sequence_number, error)

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

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
