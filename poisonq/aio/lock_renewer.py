"""The asyncio :class:`AutoLockRenewer`: the sync renewer's rules (:mod:`poisonq.lock_renewer`:
what is due, what counts as a loss) with its passes run by a task, which sleeps in the event
loop between them instead of holding a thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from poisonq import lock_renewer
from poisonq.errors import InvalidOptionError, PoisonqError
from poisonq.model import Duration
from poisonq.receivers import MessageOrList

if TYPE_CHECKING:
    from poisonq.aio.calls import StoreCalls
    from poisonq.aio.receivers import AsyncReceiver

log = logging.getLogger(__name__)

# Called with the sync message, or session receiver, whose lock was lost; may be a coroutine.
LockRenewFailure = Callable[[Any, PoisonqError], Any]


def sync_renewer(renewer: object) -> lock_renewer.AutoLockRenewer | None:
    """An ``auto_lock_renewer=`` argument of the asyncio API: the sync renewer it drives, or
    ``None``; anything else is refused before anything is received or locked."""
    if renewer is None:
        return None
    if not isinstance(renewer, AutoLockRenewer):
        raise InvalidOptionError(f"auto_lock_renewer must be an AutoLockRenewer, not {renewer!r}")
    return renewer.sync


class AutoLockRenewer:
    """Renews registered message and session locks until they are settled (a session:
    closed) or ``max_lock_renewal_duration`` has passed; as :class:`poisonq.AutoLockRenewer`,
    whose rules it runs. ``on_lock_renew_failure(renewable, error)`` may be a coroutine
    function; it is given the sync message or session receiver whose lock was lost."""

    def __init__(
        self,
        max_lock_renewal_duration: Duration = 300.0,
        on_lock_renew_failure: LockRenewFailure | None = None,
        check_interval: float = 0.5,
    ) -> None:
        self._on_failure = on_lock_renew_failure
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sync = lock_renewer.AutoLockRenewer(
            max_lock_renewal_duration,
            None if on_lock_renew_failure is None else self._lost,
            check_interval,
            thread=False,
        )
        self._task: asyncio.Task[None] | None = None
        self._calls: StoreCalls | None = None

    def register(
        self,
        receiver: AsyncReceiver,
        messages: MessageOrList | None = None,
        max_lock_renewal_duration: Duration | None = None,
        on_lock_renew_failure: LockRenewFailure | None = None,
    ) -> None:
        """As :meth:`poisonq.AutoLockRenewer.register`; a coroutine's to call (it starts the
        renewing task on the running loop)."""
        limit, on_failure = max_lock_renewal_duration, on_lock_renew_failure
        self.sync.register(receiver.sync, messages, limit, on_failure)
        self.start(receiver.link.calls)

    def start(self, calls: StoreCalls) -> None:
        """Start the renewing task, once, its passes run by ``calls`` (its first receiver's
        broker's): a receiver given this renewer calls it too."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._calls = calls
            self._task = self._loop.create_task(self._run(), name="poisonq-lock-renewer")

    async def _run(self) -> None:
        while not self.sync.closed:
            await asyncio.sleep(self.sync.check_interval)
            await self.renew_due()

    async def renew_due(self) -> None:
        """One pass now: renew every registered lock past half its duration, and report
        those lost (a test that moves a ``ManualClock`` awaits it)."""
        if self._calls is not None:  # else nothing was registered
            await self._calls.run(self.sync._renew_due)

    def _lost(self, renewable: Any, error: PoisonqError) -> None:
        """Called in a store call's thread, or on the loop (a native store's): a coroutine
        callback runs on the loop."""
        assert self._on_failure is not None
        result = self._on_failure(renewable, error)
        if inspect.isawaitable(result) and self._loop is not None:
            done: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
                result,  # type: ignore[arg-type]
                self._loop,
            )
            done.add_done_callback(functools.partial(_log_raised, self._on_failure, renewable))

    async def close(self) -> None:
        self.sync.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def __aenter__(self) -> AutoLockRenewer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _log_raised(hook: object, renewable: object, done: concurrent.futures.Future[Any]) -> None:
    """A coroutine callback's error, which nothing awaits: logged, not lost."""
    if not done.cancelled() and (error := done.exception()) is not None:
        log.error("on_lock_renew_failure %r raised for %r", hook, renewable, exc_info=error)
