"""azure-servicebus 7's ``aio`` ``AutoLockRenewer`` on :class:`poisonq.aio.AutoLockRenewer`
(renewing from a task, not a thread); a loss is reported as the sync flavour reports it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import poisonq.aio
from poisonq.errors import PoisonqError
from poisonq.servicebus.handler import check_renewer_open, reporting_loss
from poisonq.servicebus.message import ServiceBusReceivedMessage

if TYPE_CHECKING:
    from poisonq.servicebus.aio.receiver import ServiceBusReceiver, ServiceBusSession

Renewable = Any  # a ServiceBusReceivedMessage or a ServiceBusSession
LockRenewFailureCallback = Callable[[Renewable, BaseException | None], Any]


class AutoLockRenewer:
    """Renews registered message and session locks until they are settled (closed), or
    ``max_lock_renewal_duration`` seconds have passed. ``on_lock_renew_failure`` (the
    renewer's, or a registration's) may be a coroutine function: it runs on the loop that
    registered."""

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
        check_renewer_open(self._native.sync)
        report = reporting_loss(renewable, on_lock_renew_failure or self._on_lock_renew_failure)
        loop = asyncio.get_running_loop()

        def lost(native: object, error: PoisonqError) -> None:
            # Called in the thread of a store call: a coroutine callback runs on the loop.
            result = report(native, error)
            if inspect.iscoroutine(result):
                asyncio.run_coroutine_threadsafe(result, loop)

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

    async def renew_due(self) -> None:
        """One pass now (poisonq's): renew every registered lock past half its duration,
        and report those lost. A test that moves a ``ManualClock`` awaits it."""
        await self._native.renew_due()

    async def close(self) -> None:
        """Stop renewing (what is registered keeps the lock it has until it runs out)."""
        await self._native.close()

    async def __aenter__(self) -> AutoLockRenewer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
