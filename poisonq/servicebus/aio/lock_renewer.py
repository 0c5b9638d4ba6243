"""azure-servicebus 7's ``aio`` ``AutoLockRenewer`` on :class:`poisonq.aio.AutoLockRenewer`
(renewing from a task, not a thread); a loss is reported as the sync flavour reports it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import poisonq.aio
from poisonq.errors import PoisonqError
from poisonq.servicebus.exceptions import AutoLockRenewFailed, translate
from poisonq.servicebus.message import ServiceBusReceivedMessage

if TYPE_CHECKING:
    from poisonq.servicebus.aio.receiver import ServiceBusReceiver, ServiceBusSession

Renewable = Any  # a ServiceBusReceivedMessage or a ServiceBusSession
LockRenewFailureCallback = Callable[[Renewable, BaseException | None], Any]


class AutoLockRenewer:
    """Renews registered message and session locks until they are settled (closed), or
    ``max_lock_renewal_duration`` seconds have passed. ``on_lock_renew_failure`` may be a
    coroutine function."""

    def __init__(
        self,
        max_lock_renewal_duration: float = 300,
        on_lock_renew_failure: LockRenewFailureCallback | None = None,
        *,
        check_interval: float = 0.5,
    ) -> None:
        self._native = poisonq.aio.AutoLockRenewer(
            max_lock_renewal_duration, check_interval=check_interval
        )
        self._on_lock_renew_failure = on_lock_renew_failure

    def register(
        self,
        receiver: ServiceBusReceiver,
        renewable: ServiceBusReceivedMessage | ServiceBusSession,
        max_lock_renewal_duration: float | None = None,
        on_lock_renew_failure: LockRenewFailureCallback | None = None,
    ) -> None:
        """Keep ``renewable``'s lock (a message ``receiver`` received, or its session)."""
        callback = on_lock_renew_failure or self._on_lock_renew_failure

        def lost(_: object, error: PoisonqError) -> Any:
            failure = AutoLockRenewFailed("Failed to auto-renew lock", error=translate(error))
            renewable.auto_renew_error = failure
            result = None if callback is None else callback(renewable, failure)
            return result if inspect.isawaitable(result) else None

        if receiver._shutdown:
            return  # a closed receiver's locks are not renewed, as the SDK's renewer skips them
        native = receiver._native
        assert native is not None, "a receiver registers what it received, once open"
        if isinstance(renewable, ServiceBusReceivedMessage):
            if renewable._settled or renewable.lock_token is None:
                raise ValueError("only a message received in PEEK_LOCK mode, not settled, renews")
            self._native.register(native, renewable.raw, max_lock_renewal_duration, lost)
            receiver._renewed_by(self._native.sync, renewable.raw)
        else:
            self._native.register(native, None, max_lock_renewal_duration, lost)

    async def close(self) -> None:
        """Stop renewing (what is registered keeps the lock it has until it runs out)."""
        await self._native.close()

    async def __aenter__(self) -> AutoLockRenewer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
