"""The :class:`AutoLockRenewer`: keeps message locks alive while a handler works."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from poisonq.errors import InvalidOperationError, MessageLockLostError, PoisonqError
from poisonq.model import Duration, ReceivedMessage, to_seconds
from poisonq.receivers import MessageOrList, as_list

if TYPE_CHECKING:
    from poisonq.receivers import Receiver

log = logging.getLogger(__name__)


class AutoLockRenewer:
    """Renews the locks of registered messages in a background thread until they are settled
    or ``max_lock_renewal_duration`` has passed (as the Service Bus SDK's renewer does).

    ``on_lock_renew_failure(message, error)`` is called once for a message whose lock is
    lost while it is registered: a renewal that failed, or a lock that ran out after the
    renewing stopped at ``max_lock_renewal_duration``. Without it, that is logged."""

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
        messages: MessageOrList,
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
            for message in as_list(messages):
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

    def unregister(self, messages: MessageOrList) -> None:
        with self._lock:
            for message in as_list(messages):
                self._entries.pop((message.sequence_number, message.lock_token or ""), None)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.renew_due()

    def renew_due(self) -> None:
        """One pass: renew every registered lock that is past half its lock duration."""
        with self._lock:
            entries = list(self._entries.items())
        for key, (receiver, message, until) in entries:
            if message.settled:  # through its receiver: the normal end, not a loss
                self._forget(key)
                continue
            assert message.locked_until is not None
            remaining = message.locked_until.timestamp() - receiver.broker.clock.now()
            if time.monotonic() >= until:  # renewing is over: watch for the lock's end
                if remaining <= 0 and self._forget(key):
                    self._lost(message, MessageLockLostError([message.sequence_number]))
                continue
            if remaining > receiver.effective_lock_duration() / 2:
                continue
            try:
                receiver.renew_lock(message)
            except PoisonqError as exc:
                # Settled meanwhile (and so unregistered): that is the normal end, not a loss.
                if self._forget(key):
                    self._lost(message, exc)

    def _forget(self, key: tuple[int, str]) -> bool:
        """Stop watching a message; whether it was still registered."""
        with self._lock:
            return self._entries.pop(key, None) is not None

    def _lost(self, message: ReceivedMessage, error: PoisonqError) -> None:
        if self.on_lock_renew_failure is not None:
            self.on_lock_renew_failure(message, error)
        else:
            log.warning("lost the lock on message %s: %s", message.sequence_number, error)

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
