"""The asyncio Processor: the sync Processor's settlement rules (:mod:`poisonq.processor`'s
outcomes: a return completes, a :class:`~poisonq.PermanentError` or a ``permanent`` type
dead-letters now, any other exception abandons and the retry policy decides) for handlers
that may be coroutines, with concurrency by tasks on one event loop instead of threads.

Not here yet (the sync Processor has them): batch handlers and their bisection, the defect
window (``max_failure_ratio``), running suspects alone, ``isolation="process"``, and session
queues.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from poisonq.aio.broker import AsyncBroker
from poisonq.aio.lock_renewer import AutoLockRenewer
from poisonq.aio.receivers import AsyncReceiver
from poisonq.failures import failure_from_exception
from poisonq.model import ReceivedMessage
from poisonq.processor.options import ProcessorOptions, check_handler
from poisonq.processor.outcomes import HandlerFailure, Outcome, outcome_of, settlement
from poisonq.processor.pump import ProcessorStats, tally
from poisonq.receivers import settling

log = logging.getLogger(__name__)

Handler = Callable[[ReceivedMessage], Any]  # a coroutine function, or a plain one
PoisonHook = Callable[[ReceivedMessage, BaseException], Any]


class Processor:
    """Receives from ``address``, awaits ``handler(message)`` (or calls it, if it is not a
    coroutine function) and settles each message by outcome. ``concurrency`` tasks pump at
    once, each receiving up to ``batch_size`` messages and settling them in one
    transaction. Locks are renewed while a handler runs, for at most
    ``max_lock_renewal_duration`` seconds. ``on_poison(message, error)`` (a coroutine
    function or not) is called after each message this processor dead-lettered or whose
    abandon the retry policy poisoned."""

    def __init__(
        self,
        broker: AsyncBroker,
        address: str,
        handler: Handler,
        *,
        on_poison: PoisonHook | None = None,
        **options: Any,
    ) -> None:
        check_handler(handler)
        self.options = ProcessorOptions.of(options)
        self.broker = broker
        self.address = address
        self.handler = handler
        self.on_poison = on_poison
        self.stopping = asyncio.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to return once the messages in hand are settled."""
        self.stopping.set()

    async def run(self, until_idle: bool = False) -> ProcessorStats:
        """Pump until :meth:`stop` is called or, with ``until_idle``, until a receive waits
        ``max_wait`` and finds nothing. Returns what was done; an error of one task (a store
        still unavailable after the client's retries) cancels the others and is raised."""
        self.stopping.clear()
        stats = ProcessorStats()
        async with AutoLockRenewer(self.options.max_lock_renewal_duration) as renewer:
            receiver = self.broker.receiver(self.address, auto_lock_renewer=renewer)
            try:
                async with asyncio.TaskGroup() as pumps:
                    for _ in range(self.options.concurrency):
                        pumps.create_task(self._pump(receiver, renewer, stats, until_idle))
            except BaseExceptionGroup as group:  # one task's error, as the sync run raises it
                raise group.exceptions[0] from None
        return stats

    async def _pump(
        self,
        receiver: AsyncReceiver,
        renewer: AutoLockRenewer,
        stats: ProcessorStats,
        until_idle: bool,
    ) -> None:
        while not self.stopping.is_set():
            messages = await receiver.receive(self.options.batch_size, self.options.max_wait)
            if not messages:
                if until_idle:
                    return
                continue
            stats.received += len(messages)
            outcomes = []
            for message in messages:
                stats.handler_runs += 1
                outcomes.append(outcome_of(message, await self._run(message)))
            await self._settle(receiver, renewer, outcomes, stats)

    async def _run(self, message: ReceivedMessage) -> HandlerFailure | None:
        """The handler's failure on ``message``, or ``None`` if it returned."""
        try:
            result = self.handler(message)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # where a coroutine handler's exception becomes data
            failure = failure_from_exception(exc, self.broker.clock.now())
            return HandlerFailure(exc, failure, isinstance(exc, self.options.permanent_errors))
        return None

    async def _settle(
        self,
        receiver: AsyncReceiver,
        renewer: AutoLockRenewer,
        outcomes: list[Outcome],
        stats: ProcessorStats,
    ) -> None:
        """Settle outcomes in one transaction (those whose lock was lost are left out and
        delivered again), then call ``on_poison`` for what this poisoned."""
        messages = [o.message for o in outcomes]
        # Unregistered and marked first, as the sync pump does: a renewal on its way then
        # fails on a settled message, which is no loss.
        renewer.sync.unregister(messages)
        with settling(messages):
            poisoned, lost = await self.broker.calls(
                self.broker.sync.settle_held, self.address, [settlement(o) for o in outcomes]
            )
        for seq in lost:
            log.warning("lost the lock on message %d of %s", seq, self.address)
        for message, error in tally(stats, outcomes, poisoned, lost):
            stats.poisoned += 1
            if self.on_poison is not None:
                result = self.on_poison(message, error)
                if inspect.isawaitable(result):
                    await result
