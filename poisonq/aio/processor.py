"""The asyncio Processor: the sync Processor's rules for handlers that may be coroutines, with
``concurrency`` tasks on one event loop instead of threads.

The rules are the sync Processor's, shared: the options (:mod:`poisonq.processor.options`),
the outcomes and their settlements (:mod:`poisonq.processor.outcomes`), the defect window's
judgment of a round, the batch bisection and a session batch's first-failure search
(:mod:`poisonq.processor.pump`: ``judge``, ``bisected``, ``first_failure``), the crash rule's
``is_suspect``, the run's ``tally``. What this module adds is the waiting: handlers are
awaited, a search through a failing batch runs its algorithm in a thread that hands each run
back to the loop, and the gate that lets a suspect run alone is one the pump tasks share.

What it does not do (the sync Processor does): ``isolation="process"``, since a coroutine
cannot run in the crash guard's child.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from poisonq.aio.broker import AsyncBroker
from poisonq.aio.calls import to_the_end, wait_at_most
from poisonq.aio.lock_renewer import AutoLockRenewer
from poisonq.aio.receivers import AsyncReceiver, AsyncSessionReceiver
from poisonq.aio.suspects import AloneGate
from poisonq.defects import FailureWindow
from poisonq.errors import InvalidOptionError
from poisonq.failures import failure_from_exception
from poisonq.model import ReceivedMessage, ReceiveErrorHandling
from poisonq.processor.lost_locks import LockLostHook, LostLocks, poisoned_by_expiry
from poisonq.processor.options import (
    ProcessorOptions,
    check_broker,
    check_flag,
    check_handler,
    check_hook,
)
from poisonq.processor.outcomes import (
    GivenBack,
    HandlerFailure,
    Outcome,
    Succeeded,
    outcome_of,
    settlement,
)
from poisonq.processor.pump import (
    FLUSH_INTERVAL,
    Lookouts,
    ProcessorStats,
    ProcessorStoppedError,
    bisected,
    first_failure,
    judge,
    tally,
)
from poisonq.processor.suspects import is_suspect
from poisonq.receivers import settling

log = logging.getLogger(__name__)

Handler = Callable[[Any], Any]  # a coroutine function, or a plain one; a message or a batch

LOOP_BLOCKED = 1.0
"""Seconds (on the broker's clock, which judges locks) a handler call may hold the event loop
before the Processor warns: twice the lock renewer's interval, so renewals came late."""
PoisonHook = Callable[[ReceivedMessage, BaseException], Any]
Work = ReceivedMessage | list[ReceivedMessage]


def _run_cancelled() -> bool:
    """Whether the task running this (a pump task, or a batch search's handler call) is
    being cancelled: only then does a ``CancelledError`` end the run."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class Processor:
    """Receives from ``address``, awaits ``handler(message)`` (or calls it, if it is not a
    coroutine function; with ``batch=True``, ``handler(messages)``) and settles each message
    by outcome, as :class:`poisonq.Processor` does. ``on_poison(message, error)`` and
    ``on_lock_lost(message)`` (:mod:`poisonq.processor.lost_locks`) may be coroutine
    functions. The other keyword arguments are
    :class:`~poisonq.processor.options.ProcessorOptions`, checked there;
    ``isolation="process"`` is refused (see the module docstring)."""

    def __init__(
        self,
        broker: AsyncBroker,
        address: str,
        handler: Handler,
        *,
        on_poison: PoisonHook | None = None,
        on_lock_lost: LockLostHook | None = None,
        **options: Any,
    ) -> None:
        check_broker(broker, AsyncBroker, "poisonq.aio.Processor", "poisonq.Processor")
        check_handler(handler)
        check_hook(on_poison, "on_poison")
        check_hook(on_lock_lost, "on_lock_lost")
        self.options = ProcessorOptions.of(options)
        if self.options.isolation is not None:
            raise InvalidOptionError(
                "the asyncio Processor runs its handler on the event loop: isolation='process'"
                " is the sync Processor's"
            )
        self.broker = broker
        self.address = address
        self.handler = handler
        self.on_poison = on_poison
        self.lost_locks = LostLocks(address, on_lock_lost)
        self.stopping = asyncio.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to return once the messages in hand are settled: a wait for
        messages ends at once. Called before :meth:`run`, the next run returns at once (a
        shutdown asked for during start-up is kept). Call it on the run's event loop
        (``loop.call_soon_threadsafe(processor.stop)`` from another thread)."""
        self.stopping.set()

    async def run(self, until_idle: bool = False) -> ProcessorStats:
        """Pump until :meth:`stop` is called or, with ``until_idle``, until a receive waits
        ``max_wait`` and finds nothing. Returns what was done. Raises
        :class:`ProcessorStoppedError` on a defect; an error of one task (a store still
        unavailable after the client's retries) cancels the others and is raised."""
        check_flag(until_idle, "until_idle")
        # An event of this run's loop (the Processor may run again under another
        # asyncio.run), carrying a stop asked for before the run.
        asked, self.stopping = self.stopping.is_set(), asyncio.Event()
        if asked:
            self.stopping.set()
        try:
            return await self._run_until_stopped(until_idle)
        finally:
            self.stopping.clear()

    async def _run_until_stopped(self, until_idle: bool) -> ProcessorStats:
        queue = (await self.broker.get_queue(self.address)).options
        stats = ProcessorStats()
        window = FailureWindow(self.options.max_failure_ratio)
        gate = AloneGate()
        # A faulting queue stops at its first poison message anyway: holding failures back
        # would only let more messages fail before it does.
        holds_back = queue.retry.receive_error_handling is not ReceiveErrorHandling.FAULT
        lost = self.lost_locks.report  # called in a store call's thread: the renewer runs
        # a coroutine hook's result on the loop
        renewal = self.options.max_lock_renewal_duration
        async with AutoLockRenewer(renewal, lambda m, _: lost(m)) as renewer:
            pump = _Pump(self, renewer, window, gate, stats, until_idle, holds_back)
            work = pump.sessions if queue.requires_session else pump.queue
            try:
                async with asyncio.TaskGroup() as pumps:
                    for _ in range(self.options.concurrency):
                        pumps.create_task(work())
            except BaseExceptionGroup as group:  # one task's error, as the sync run raises it
                first = group.exceptions[0]
                if isinstance(first, ProcessorStoppedError):
                    raise ProcessorStoppedError(first.defect, stats) from None
                raise first from None
        return stats


class _Pump:
    """What every pump task of one run shares: each task runs :meth:`queue` or
    :meth:`sessions`, keeping what it holds in its own frame."""

    def __init__(
        self,
        processor: Processor,
        renewer: AutoLockRenewer,
        window: FailureWindow,
        gate: AloneGate,
        stats: ProcessorStats,
        until_idle: bool,
        holds_back: bool,
    ) -> None:
        self.processor = processor
        self.options = processor.options
        self.broker = processor.broker
        self.renewer = renewer
        self.window = window
        self.gate = gate
        self.stats = stats
        self.until_idle = until_idle
        self.holds_back = holds_back
        self.stopping = processor.stopping
        self.defect_found = False  # by any task: the others give their failures back
        self.warned_blocking = False
        # Every task's look for another session (a task is known by its asyncio.Task).
        self.lookouts = Lookouts(processor.options.concurrency, asyncio.current_task)

    async def queue(self) -> None:
        """Receive, handle and settle until idle or stopped; failures on their first
        delivery held back while the defect window is undecided; a suspect run alone."""
        receiver = self.broker.receiver(self.processor.address)
        held_back: list[Outcome] = []
        in_hand: list[ReceivedMessage] = []  # the last batch received
        holding = False
        try:
            while not self.stopping.is_set():
                if holding and self.gate.wanted():  # another task runs a suspect: hold nothing
                    held_back = await self._give_back_held(receiver, held_back)
                    self.gate.let_go()
                    holding = False
                if not holding:
                    await self.gate.hold()
                    holding = True
                wait = self.options.max_wait
                in_hand = messages = await self._receive(
                    receiver, min(wait, FLUSH_INTERVAL) if held_back else wait
                )
                if not messages:
                    if held_back:  # nothing else to judge them by: settle them as failures
                        await self._settle(receiver, held_back)
                        held_back = []
                        self.window.settled()
                    elif self.until_idle:
                        break
                    continue
                self.stats.received += len(messages)
                self.renewer.register(receiver, messages)
                suspects = [m for m in messages if is_suspect(m)]
                if suspects and self.gate.claim():
                    rest: list[Outcome] = [GivenBack(m) for m in messages if m is not suspects[0]]
                    await self._settle(receiver, rest)
                    held_back = await self._give_back_held(receiver, held_back)
                    self.gate.let_go()
                    holding = False
                    await self._alone(receiver, suspects[0], claimed=True)
                    continue
                if suspects:
                    # Another task runs its suspects alone: these go back for it to take one
                    # by one, and the rest is handled.
                    await self._settle(receiver, [GivenBack(m) for m in suspects])
                    messages = [m for m in messages if not is_suspect(m)]
                outcomes, early = await self._handle(receiver, messages, in_order=False)
                held_back = await self._judge(receiver, outcomes, held_back, early)
        finally:
            await to_the_end(self._end([(receiver, held_back)], holding, in_hand))

    async def sessions(self) -> None:
        """A session queue: one session at a time, its messages in order until it is empty
        (a failure ends its batch, the messages after it given back to come after it); then
        the next session nobody holds. A session whose failure is held back for the defect
        window stays open (parked, its lock renewed) while other sessions decide, as in the
        sync Processor: a bug failing the first message of every session poisons none."""
        parked: list[tuple[AsyncSessionReceiver, list[Outcome]]] = []
        missed_once = False  # with sessions parked, the last look for another found none
        holding = False
        try:
            while not self.stopping.is_set():
                if parked and (not self.window.undecided() or self.gate.wanted()):
                    if self.gate.wanted():  # a suspect runs: hold nothing
                        await self._give_back_parked(parked)
                    else:
                        await self._unpark(parked)
                    missed_once = False
                if not parked and holding:  # holding nothing: wait here while another
                    self.gate.let_go()  # runs suspects
                    holding = False
                if not holding:
                    await self.gate.hold()
                    holding = True
                address = self.processor.address
                session = await self.broker.accept_next_session(address, max_wait=0)
                if session is None:
                    everyone_looked = self.lookouts.found_none()
                    if parked and missed_once and everyone_looked:
                        await self._judge_parked(parked)
                        missed_once = False
                    elif parked:  # other tasks may hold the rest, or be taking them
                        missed_once = True
                        await wait_at_most(self.stopping, FLUSH_INTERVAL)
                    elif self.until_idle:
                        break
                    else:
                        await wait_at_most(self.stopping, self.options.max_wait)
                    continue
                missed_once = False
                self.lookouts.found_one()
                try:
                    held_back, suspect = await self._drain(session)
                    if suspect:
                        await self._give_back_parked(parked)
                        self.gate.let_go()
                        holding = False
                        await self._alone(session, None)
                except BaseException:
                    await to_the_end(session.close())
                    raise
                if held_back:
                    parked.append((session, held_back))
                else:
                    await session.close()
        finally:
            await to_the_end(self._end(parked, holding))
            self.lookouts.found_none()  # an ended task takes no more sessions

    async def _drain(self, session: AsyncSessionReceiver) -> tuple[list[Outcome], bool]:
        """Receive and handle ``session``'s batches in order until it is empty, a failure is
        held back (returned: its later messages must wait), or a suspect comes (``True``:
        the messages before it handled, it and the rest given back, to run alone)."""
        held_back: list[Outcome] = []
        while not (self.stopping.is_set() or held_back or self.gate.wanted()):
            messages = await session.receive(self.options.batch_size)
            if not messages:
                break
            self.stats.received += len(messages)
            self.renewer.register(session, messages)
            suspects = [m for m in messages if is_suspect(m)]
            cut = messages.index(suspects[0]) if suspects else len(messages)
            outcomes, early = await self._handle(session, messages[:cut], in_order=True)
            outcomes += [GivenBack(m) for m in messages[cut:]]
            held_back = await self._judge(session, outcomes, held_back, early)
            if suspects and not held_back:
                return [], True
        return held_back, False

    async def _receive(self, receiver: AsyncReceiver, wait: float) -> list[ReceivedMessage]:
        """A batch, waiting up to ``wait`` for it unless :meth:`Processor.stop` comes first
        (the receive is then cancelled: what it locked goes back uncounted)."""
        if wait <= 0:
            return await receiver.receive(self.options.batch_size)
        receiving = asyncio.ensure_future(receiver.receive(self.options.batch_size, wait))
        stopped = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait([receiving, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not receiving.done():
                receiving.cancel()
                await asyncio.wait([receiving])
        return [] if receiving.cancelled() else receiving.result()

    async def _give_back_parked(
        self, parked: list[tuple[AsyncSessionReceiver, list[Outcome]]]
    ) -> None:
        """Ahead of a suspect's run: the parked sessions' failures are released and the
        sessions let go."""
        for session, held_back in parked:
            await self._give_back_held(session, held_back)
            await session.close()
        parked.clear()

    async def _unpark(self, parked: list[tuple[AsyncSessionReceiver, list[Outcome]]]) -> None:
        """The parked sessions' failures were poison: settle them and let the sessions go."""
        for session, held_back in parked:
            await self._settle(session, held_back)
            await session.close()
        parked.clear()
        self.window.settled()

    async def _judge_parked(self, parked: list[tuple[AsyncSessionReceiver, list[Outcome]]]) -> None:
        """Every session on offer was tried and the parked failures are still undecided: a
        few sessions are judged with fewer failures
        (:meth:`~poisonq.defects.FailureWindow.defect_of_all`). A defect gives them back
        uncounted and stops the run; else they are settled as poison."""
        defect = self.window.defect_of_all()
        if defect is None:
            await self._unpark(parked)
            return
        self.defect_found = True  # before anything else lets its failures go
        for session, held_back in parked:
            await self._settle(session, [GivenBack(o.message) for o in held_back])
            await session.close()
        parked.clear()
        raise ProcessorStoppedError(defect, self.stats)

    async def _alone(
        self, receiver: AsyncReceiver, first: ReceivedMessage | None, claimed: bool = False
    ) -> None:
        """The crash rule: once no other task holds a message, the suspect ``first`` (or,
        without it, the next message received) and then those received one at a time after
        it are each handled and settled before the next is received; the first that is not
        a suspect is given back, for the next batch. Stopped or cancelled first, the
        message in hand goes back uncounted: a crash costs a suspect a delivery, a shutdown
        does not."""
        message = first
        try:
            if claimed:  # by the caller, which holds ``first`` under its lock
                await self.gate.wait_alone()
            else:  # (a session's suspect, received again once the gate is claimed)
                await self.gate.alone()
                claimed = True
            while not self.stopping.is_set():
                if message is None:
                    got = await receiver.receive(1)
                    if not got:
                        return
                    self.stats.received += 1
                    self.renewer.register(receiver, got)
                    message = got[0]
                    if not is_suspect(message):
                        break
                in_order = isinstance(receiver, AsyncSessionReceiver)
                await self._settle(receiver, (await self._handle(receiver, [message], in_order))[0])
                message = None
        finally:
            if message is not None:  # (one already settled is left out)
                await self._settle(receiver, [GivenBack(message)])
            if claimed:
                self.gate.unclaim()

    async def _judge(
        self,
        receiver: AsyncReceiver,
        outcomes: list[Outcome],
        held_back: list[Outcome],
        settled_early: set[int],
        holds_back: bool | None = None,
    ) -> list[Outcome]:
        """Settle a round by the defect rule (:func:`~poisonq.processor.pump.judge`); the
        failures still held back. A defect gives back its failures and stops the run."""
        holds = self.holds_back if holds_back is None else holds_back
        judged = judge(self.window, outcomes, held_back, settled_early, holds)
        if judged.defect is not None:
            self.defect_found = True  # before anything else lets its failures go
            back: list[Outcome] = [GivenBack(o.message) for o in judged.held_back]
            await self._settle(receiver, judged.ready + back)
            raise ProcessorStoppedError(judged.defect, self.stats)
        await self._settle(receiver, judged.ready)
        return judged.held_back

    async def _end(
        self,
        held: Sequence[tuple[AsyncReceiver, list[Outcome]]],
        holding: bool,
        in_hand: Sequence[ReceivedMessage] = (),
    ) -> None:
        """A pump task's end: the failures each receiver still holds back are given back
        after a defect (found by any task), else settled as the failures they are; what
        else of the batch ``in_hand`` is unsettled (the task ended between the receive and
        the handler) goes back uncounted; sessions are closed (which gives back the rest of
        theirs), and the gate let go if ``holding``. Callers run it :func:`to_the_end`: a
        task ending by its own error is cancelled when another task's error ends the run
        first, and a session left half released would keep its messages locked."""
        for receiver, held_back in held:
            if self.defect_found:
                held_back = [GivenBack(o.message) for o in held_back]
            await self._settle(receiver, held_back)
            await self._settle(receiver, [GivenBack(m) for m in in_hand])
            if isinstance(receiver, AsyncSessionReceiver):
                await receiver.close()
        if holding:
            self.gate.let_go()

    async def _give_back_held(
        self, receiver: AsyncReceiver, held_back: list[Outcome]
    ) -> list[Outcome]:
        """Ahead of a suspect's run: the failures held back are released (they come back as
        first deliveries), and the defect window starts again."""
        if held_back:
            await self._settle(receiver, [GivenBack(o.message) for o in held_back])
            self.window.settled()
        return []

    # Running the handler ---------------------------------------------------------------

    async def _handle(
        self, receiver: AsyncReceiver, messages: list[ReceivedMessage], in_order: bool
    ) -> tuple[list[Outcome], set[int]]:
        """Each message's outcome, and the sequence numbers of those already settled (a
        message handler's completed messages are settled every :data:`FLUSH_INTERVAL`).
        ``in_order`` (a session): a failure ends the batch, the rest given back."""
        if not messages:
            return [], set()
        if self.options.batch:
            search = first_failure if in_order else bisected
            try:
                return await self._search(search, messages), set()
            except BaseException:  # cancelled or interrupted: not a failed delivery
                await self._settle(receiver, [GivenBack(m) for m in messages])
                raise
        loop = asyncio.get_running_loop()
        outcomes: list[Outcome] = []
        finished: list[Outcome] = []
        settled_early: set[int] = set()
        flush_at = loop.time() + FLUSH_INTERVAL
        for position, message in enumerate(messages):
            if self.stopping.is_set():  # stop(): the rest goes back uncounted
                outcomes += [GivenBack(later) for later in messages[position:]]
                break
            if self.processor.lost_locks.known(message):
                outcomes.append(GivenBack(message))
                continue
            try:
                failure = await self._run(message)
            except BaseException:
                # Cancelled (another task's error or defect, the caller, Ctrl-C) or an
                # exit: not a failed delivery. What was handled is settled by its outcome,
                # the rest (the message in hand too) given back uncounted.
                back = [GivenBack(later) for later in messages[position:]]
                await self._settle(receiver, [*outcomes, *back])
                raise
            outcome = outcome_of(message, failure)
            outcomes.append(outcome)
            if _run_cancelled():  # the handler swallowed the run's cancellation: it ends here
                back = [GivenBack(later) for later in messages[position + 1 :]]
                await self._settle(receiver, [*outcomes, *back])
                raise asyncio.CancelledError
            if isinstance(outcome, Succeeded):
                finished.append(outcome)
                if loop.time() >= flush_at and position < len(messages) - 1:
                    await self._settle(receiver, finished)
                    settled_early.update(o.message.sequence_number for o in finished)
                    finished, flush_at = [], loop.time() + FLUSH_INTERVAL
            elif in_order:
                outcomes += [GivenBack(later) for later in messages[position + 1 :]]
                break
        return outcomes, settled_early

    async def _search(
        self, search: Callable[[list[ReceivedMessage], Any], list[Outcome]], batch: list[Any]
    ) -> list[Outcome]:
        """A batch handler's ``search`` (bisection, or a session's first failure), whose
        algorithm is synchronous: it runs in a thread, and hands each run of the handler
        back to the loop as a task. Cancelled, it calls no handler after the cancellation:
        the call in flight is cancelled, the search stops before its next call, and the
        thread has ended when the cancellation is raised."""
        loop = asyncio.get_running_loop()
        stopped = False  # read and set on the loop only
        calls: set[asyncio.Task[Any]] = set()

        async def guarded(part: list[ReceivedMessage]) -> HandlerFailure | BaseException | None:
            # What stops the search (a cancellation, Ctrl-C, an exit) is carried to the
            # searching thread, not raised in the loop.
            if stopped:  # the run was cancelled before this call began: it never does
                return asyncio.CancelledError()
            task = asyncio.current_task()
            assert task is not None
            calls.add(task)
            try:
                return await self._run(part)
            except BaseException as exc:
                return exc
            finally:
                calls.discard(task)

        def run(part: list[ReceivedMessage]) -> HandlerFailure | None:
            result = asyncio.run_coroutine_threadsafe(guarded(part), loop).result()
            if isinstance(result, BaseException):
                raise result
            return result

        searching = loop.run_in_executor(None, search, batch, run)
        try:
            return await asyncio.shield(searching)
        except asyncio.CancelledError:
            stopped = True
            for call in calls:
                call.cancel()
            # The thread ends at the cancelled call, or before its next one: wait for it.
            await asyncio.wait([searching])
            searching.exception()  # the search's own end (the cancellation) is retrieved
            raise

    async def _run(self, work: Work) -> HandlerFailure | None:
        """The handler's failure on ``work``, or ``None`` if it returned."""
        self.stats.handler_runs += 1
        clock = self.broker.clock
        started = clock.now()
        try:
            try:
                result = self.processor.handler(work)
            finally:
                self._blocked(work, clock.now() - started)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError as exc:
            if _run_cancelled():
                raise
            # The handler's own cancellation (a sub-task or a wait it cancelled) escaped it
            # while the run goes on: its failure like any exception, not the run's end.
            failure = failure_from_exception(exc, self.broker.clock.now())
            return HandlerFailure(exc, failure, isinstance(exc, self.options.permanent_errors))
        except Exception as exc:  # where a coroutine handler's exception becomes data
            failure = failure_from_exception(exc, self.broker.clock.now())
            return HandlerFailure(exc, failure, isinstance(exc, self.options.permanent_errors))
        return None

    def _blocked(self, work: Work, seconds: float) -> None:
        """Warn, once a run, of a handler call that held the event loop (its synchronous
        part: a plain handler, or a coroutine's before its first ``await``) for longer than
        :data:`LOOP_BLOCKED`: nothing else on the loop ran meanwhile, lock renewals neither,
        so the locks of other messages in hand may have run out."""
        if seconds <= LOOP_BLOCKED or self.warned_blocking:
            return
        self.warned_blocking = True
        first = work[0] if isinstance(work, list) else work
        log.warning(
            "the handler held the event loop for %.1f s (message %d of %s): no other task ran"
            " meanwhile, lock renewals neither, so other messages' locks may run out; run"
            " blocking work in asyncio.to_thread",
            seconds,
            first.sequence_number,
            self.processor.address,
        )

    # Settling ---------------------------------------------------------------------------

    async def _settle(self, receiver: AsyncReceiver, outcomes: list[Outcome]) -> None:
        """Settle outcomes in one transaction (those whose lock was lost are left out and
        delivered again), then call ``on_poison`` for what this poisoned: to the end, if
        the task is cancelled meanwhile (what was settled is counted and reported)."""
        await to_the_end(self._settle_now(receiver, outcomes))

    async def _settle_now(self, receiver: AsyncReceiver, outcomes: list[Outcome]) -> None:
        outcomes = [o for o in outcomes if not o.message.settled]
        if not outcomes:
            return
        messages = [o.message for o in outcomes]
        # Unregistered and marked first, as the sync pump does: a renewal on its way then
        # fails on a settled message, which is no loss.
        self.renewer.sync.unregister(messages)
        with settling(messages):
            poisoned, lost = await self.broker.calls.run(
                self.broker.link.messaging._settle_held,
                receiver.address,
                [settlement(o) for o in outcomes],
            )
        expired = [o.message for o in outcomes if o.message.sequence_number in lost]
        for message in expired:
            reported = self.processor.lost_locks.report(message)
            if inspect.isawaitable(reported):
                await reported
        spent = []
        if expired:  # a read, in a thread: rarely needed
            sync, address = self.broker.sync, receiver.address
            spent = await self.broker.calls(poisoned_by_expiry, sync, address, expired)
        hook = self.processor.on_poison
        for message, error in [*tally(self.stats, outcomes, poisoned, lost), *spent]:
            self.stats.poisoned += 1
            if hook is not None:
                result = hook(message, error)
                if inspect.isawaitable(result):
                    await result
