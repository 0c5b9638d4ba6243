"""``AutoLockRenewer``: azure-servicebus 7's renewer on :class:`poisonq.AutoLockRenewer`.

``register(receiver, renewable)`` takes the SDK's receiver and a received message or a
receiver's ``session``; ``on_lock_renew_failure(renewable, error)`` is called with them, the
error an :class:`AutoLockRenewFailed` whose ``error`` is the lost lock's
(:class:`MessageLockLostError` or :class:`SessionLockLostError`), also set as the
renewable's ``auto_renew_error``. What is settled, or closed, stops being renewed; a
settlement that reaches the store while a renewal is on its way is no loss.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

import poisonq
from poisonq.receivers import SessionReceiver
from poisonq.servicebus.handler import check_renewer_open, reporting_loss
from poisonq.servicebus.message import ServiceBusReceivedMessage
from poisonq.servicebus.receiver import ServiceBusReceiver, ServiceBusSession

Renewable = ServiceBusReceivedMessage | ServiceBusSession
LockRenewFailureCallback = Callable[[Renewable, BaseException | None], None]


class AutoLockRenewer:
    """Renews registered message and session locks in a background thread until they are
    settled (closed), or ``max_lock_renewal_duration`` seconds have passed."""

    def __init__(
        self,
        max_lock_renewal_duration: float = 300,
        on_lock_renew_failure: LockRenewFailureCallback | None = None,
        executor: Executor | None = None,
        max_workers: int | None = None,
        *,
        check_interval: float = 0.5,
    ) -> None:
        """``executor`` and ``max_workers`` are accepted without effect (one thread renews
        every lock); ``check_interval`` is poisonq's: the seconds between two passes."""
        self._native = poisonq.AutoLockRenewer(
            max_lock_renewal_duration, check_interval=check_interval
        )
        self._on_lock_renew_failure = on_lock_renew_failure

    def register(
        self,
        receiver: ServiceBusReceiver,
        renewable: Renewable,
        max_lock_renewal_duration: float | None = None,
        on_lock_renew_failure: LockRenewFailureCallback | None = None,
    ) -> None:
        """Keep ``renewable``'s lock (a message ``receiver`` received, or its session)."""
        if not isinstance(receiver, ServiceBusReceiver):
            raise TypeError(f"register takes the ServiceBusReceiver first, not {receiver!r}")
        check_renewer_open(self._native)
        lost = reporting_loss(renewable, on_lock_renew_failure or self._on_lock_renew_failure)
        if receiver._shutdown:
            return  # a closed receiver's locks are not renewed, as the SDK's renewer skips them
        native: poisonq.Receiver
        if isinstance(renewable, ServiceBusSession):
            native = renewable._native
            messages = None
        elif isinstance(renewable, ServiceBusReceivedMessage):
            if renewable._settled or renewable.lock_token is None:
                raise ValueError("only a message received in PEEK_LOCK mode, not settled, renews")
            if receiver._session is not None:
                raise ValueError("register a session receiver's session, not its messages")
            native = receiver._open()
            messages = renewable.raw
        else:
            raise TypeError(f"register a received message or a session, not {renewable!r}")
        assert isinstance(native, SessionReceiver) or messages is not None
        self._native.register(native, messages, max_lock_renewal_duration, lost)
        if messages is not None:
            receiver._renewed_by(self._native, messages)

    def renew_due(self) -> None:
        """One pass now (poisonq's): renew every registered lock past half its duration,
        and report those lost. A test that moves a ``ManualClock`` calls it."""
        self._native.renew_due()

    def close(self, wait: bool = True) -> None:
        """Stop renewing (what is registered keeps the lock it has until it runs out)."""
        self._native.close()

    def __enter__(self) -> AutoLockRenewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
