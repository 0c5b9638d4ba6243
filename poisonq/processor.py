"""The Processor: a message pump that turns what a handler does into a settlement.

A handler that returns completes its message. One that raises :class:`PermanentError` (or a
type listed in ``permanent``) dead-letters it at once with the exception type as reason and the
traceback as description: Service Broker's advice to fail fast on errors that a retry cannot
fix. Any other exception abandons the message, and the queue's retry policy decides whether it
comes back or is poisoned.

A batch handler sees many messages and cannot say which one broke it. When it raises, the
batch is re-run in halves until every failing message stands alone (the reference systems
re-read one message at a time; bisection finds k bad messages among n in O(k log n) runs). The
messages of the halves that succeed are completed, so only the guilty ones count a failed
attempt. A batch handler therefore has to tolerate seeing a message again in a smaller batch,
as it has to tolerate any redelivery.

A session's messages are handled in order: a failure ends the session's batch at the failing
message, and the messages after it are released (no delivery counted) to come again after it;
a session's failing batch is searched for its first failing message instead of bisected.

A defect is not poison (:mod:`poisonq.defects`): when most of the last messages handled fail
the same way, the failed messages of the batch are given back without a delivery counted,
the rest of the batch is settled, and :meth:`Processor.run` raises
:class:`ProcessorStoppedError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from poisonq.bisection import failing_alone
from poisonq.client import Broker, Receiver, SessionReceiver
from poisonq.defects import DEFAULT_MAX_FAILURE_RATIO, Defect, FailureWindow, check_ratio
from poisonq.errors import InvalidOptionError, PermanentError, PoisonqError
from poisonq.failures import dead_lettering, failure_from_exception
from poisonq.lock_renewer import AutoLockRenewer
from poisonq.model import (
    Abandon,
    Complete,
    Duration,
    FailureRecord,
    ReceivedMessage,
    ReceiveErrorHandling,
    Release,
    Settlement,
    to_seconds,
)

log = logging.getLogger(__name__)

MessageHandler = Callable[[ReceivedMessage], Any]
BatchHandler = Callable[[list[ReceivedMessage]], Any]
PoisonHook = Callable[[ReceivedMessage, BaseException], Any]
LockLostHook = Callable[[ReceivedMessage], Any]
FLUSH_INTERVAL = 0.5  # seconds a handled message may wait for the rest of its batch


@dataclass(frozen=True)
class Completed:
    message: ReceivedMessage


@dataclass(frozen=True)
class Retry:
    """A transient failure: abandon and let the retry policy decide."""

    message: ReceivedMessage
    error: BaseException


@dataclass(frozen=True)
class Reject:
    """A permanent failure: dead-letter now."""

    message: ReceivedMessage
    error: BaseException


@dataclass(frozen=True)
class Skipped:
    """Given back without a delivery counted: not handled (a message before it in its
    session failed, or its lock was lost), or handled and failed by a defect."""

    message: ReceivedMessage


Outcome = Completed | Retry | Reject | Skipped
Held = tuple[Outcome, FailureRecord | None]  # an outcome and its failure, not yet settled


@dataclass
class ProcessorStats:
    """What one :meth:`Processor.run` did. ``poisoned`` counts the messages that reached the
    dead-letter queue (or were dropped) because of this run, by either path, not the messages
    of their sessions moved with them. ``released`` counts messages given back without a
    delivery counted (a session's messages after a failure, or a defect's failures), and
    ``received`` counts a message again each time it is received."""

    received: int = 0
    completed: int = 0
    abandoned: int = 0
    dead_lettered: int = 0
    poisoned: int = 0
    handler_runs: int = 0
    lock_lost: int = 0
    released: int = 0

    def add(self, other: ProcessorStats) -> None:
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class ProcessorStoppedError(PoisonqError):
    """Most of the messages handled last failed the same way: a defect in the handler (or
    what it calls), not poison. The batch's failed messages were given back without a
    delivery counted; ``defect`` has the first failure with its traceback, ``stats`` what
    the run did."""

    def __init__(self, defect: Defect, stats: ProcessorStats) -> None:
        super().__init__(f"processor stopped: {defect}; the failed messages are back in the queue")
        self.defect = defect
        self.stats = stats


class Processor:
    """Receives from ``address``, calls ``handler`` and settles each message by outcome.

    ``batch=True`` passes lists of up to ``batch_size`` messages to the handler; otherwise it
    is called once per message (still received and completed ``batch_size`` at a time).
    ``concurrency`` threads pump at once. Locks are renewed while a handler runs, for at most
    ``max_lock_renewal_duration`` seconds. ``on_poison(message, error)`` is called after each
    message that this processor dead-lettered or that its abandon poisoned; an exception from
    the hook propagates (the message is already settled, so nothing is lost).
    ``on_lock_lost(message)`` is called (and a warning logged) once for each message whose
    lock was lost before it was settled: its renewal failed or stopped at
    ``max_lock_renewal_duration`` while the handler still ran. Such a message is delivered
    again; its outcome here is counted as ``lock_lost``.
    ``max_failure_ratio`` (``None``: never) is the share of the messages handled since a run
    of failures began (first deliveries only) that may fail the same way before the run
    stops with :class:`ProcessorStoppedError` instead of spending their deliveries.
    """

    def __init__(
        self,
        broker: Broker,
        address: str,
        handler: MessageHandler | BatchHandler,
        *,
        batch_size: int = 1,
        batch: bool = False,
        concurrency: int = 1,
        permanent: Sequence[type[BaseException]] = (),
        on_poison: PoisonHook | None = None,
        on_lock_lost: LockLostHook | None = None,
        max_lock_renewal_duration: Duration = 300.0,
        max_wait: Duration = 1.0,
        max_failure_ratio: float | None = DEFAULT_MAX_FAILURE_RATIO,
    ) -> None:
        if batch_size < 1:
            raise InvalidOptionError("batch_size must be at least 1")
        if concurrency < 1:
            raise InvalidOptionError("concurrency must be at least 1")
        self.broker = broker
        self.address = address
        self.handler = handler
        self.batch_size = batch_size
        self.batch = batch
        self.concurrency = concurrency
        self.permanent: tuple[type[BaseException], ...] = (PermanentError, *permanent)
        self.on_poison = on_poison
        self.on_lock_lost = on_lock_lost
        self._lost: set[tuple[int, str]] = set()  # locks reported lost, each once
        self._lost_lock = threading.Lock()
        self.max_lock_renewal_duration = max_lock_renewal_duration
        self.max_wait = max_wait
        self.max_failure_ratio = check_ratio(max_failure_ratio)
        self._stop = threading.Event()
        self._defect_found = threading.Event()  # by any thread: the others give failures back

    def stop(self) -> None:
        """Ask :meth:`run` to return once the messages in hand are settled."""
        self._stop.set()

    def run(self, until_idle: bool = False) -> ProcessorStats:
        """Pump until :meth:`stop` is called or, with ``until_idle``, until a receive waits
        ``max_wait`` and finds nothing. Returns what was done. Raises
        :class:`ProcessorStoppedError` on a defect; any other error of a thread (a store
        still unavailable after the client's retries) stops every thread and is raised."""
        self._stop.clear()
        self._defect_found.clear()
        per_thread: list[ProcessorStats] = []
        failed: list[BaseException] = []

        window = FailureWindow(self.max_failure_ratio)  # every thread's evidence together

        def pump(renewer: AutoLockRenewer) -> None:
            # A thread never dies alone: its error stops the others and run() raises it.
            stats = ProcessorStats()
            per_thread.append(stats)
            try:
                self._pump(renewer, until_idle, window, stats)
            except BaseException as exc:
                failed.append(exc)
                if isinstance(exc, ProcessorStoppedError):
                    self._defect_found.set()
                self._stop.set()

        lost = self._lock_lost
        with AutoLockRenewer(self.max_lock_renewal_duration, lambda m, _: lost(m)) as renewer:
            if self.concurrency == 1:
                pump(renewer)
            else:
                threads = [
                    threading.Thread(target=pump, args=(renewer,), name=f"poisonq-processor-{n}")
                    for n in range(self.concurrency)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        total = ProcessorStats()
        for stats in per_thread:
            total.add(stats)
        if failed:
            first = failed[0]
            if isinstance(first, ProcessorStoppedError):
                raise ProcessorStoppedError(first.defect, total) from None
            raise first
        return total

    def _pump(
        self,
        renewer: AutoLockRenewer,
        until_idle: bool,
        window: FailureWindow,
        stats: ProcessorStats,
    ) -> None:
        options = self.broker.get_queue(self.address).options
        # A faulting queue stops at its first poison message anyway: holding failures back
        # would only let more messages fail before it does.
        hold = options.retry.receive_error_handling is not ReceiveErrorHandling.FAULT
        if options.requires_session:
            self._pump_sessions(renewer, until_idle, window, stats, hold)
            return
        receiver = self.broker.receiver(self.address)
        held = self._pump_one(receiver, renewer, until_idle, window, stats, hold)
        self._let_go(receiver, renewer, held, stats)

    def _pump_sessions(
        self,
        renewer: AutoLockRenewer,
        until_idle: bool,
        window: FailureWindow,
        stats: ProcessorStats,
        hold: bool,
    ) -> None:
        """A session queue: one session at a time, its messages in order, until it is
        empty; then the next session nobody holds. A session whose failure is held stays
        open (parked, its lock renewed) while other sessions tell poison from a defect:
        its messages must not run past the failure, and a bug that fails the first message
        of every session must not poison whole sessions before it shows."""
        parked: list[tuple[SessionReceiver, list[Held]]] = []
        looked_in_vain = False  # the last look for another session found none
        try:
            while not self._stop.is_set():
                if parked and not window.undecided():
                    self._unpark(parked, renewer, window, stats)
                session = self.broker.accept_next_session(self.address)
                if session is None:
                    if parked and looked_in_vain:
                        # Nothing else to judge them by: settle them as the failures they are.
                        self._unpark(parked, renewer, window, stats)
                    elif parked:
                        # Other threads may hold the rest, or be taking them: look again.
                        self._stop.wait(FLUSH_INTERVAL)
                    elif until_idle:
                        break
                    else:
                        self._stop.wait(to_seconds(self.max_wait, "max_wait"))
                    looked_in_vain = not looked_in_vain and bool(parked)
                    continue
                looked_in_vain = False
                try:
                    held = self._pump_one(session, renewer, True, window, stats, hold)
                except BaseException:
                    session.close()
                    raise
                if held:
                    parked.append((session, held))
                else:
                    session.close()
        finally:
            for session, held in parked:
                self._let_go(session, renewer, held, stats)
                session.close()

    def _unpark(
        self,
        parked: list[tuple[SessionReceiver, list[Held]]],
        renewer: AutoLockRenewer,
        window: FailureWindow,
        stats: ProcessorStats,
    ) -> None:
        """The parked sessions' failures were poison: settle them and let the sessions go."""
        for session, held in parked:
            self._settle(session, renewer, held, stats)
            session.close()
        parked.clear()
        window.settled()

    def _let_go(
        self, receiver: Receiver, renewer: AutoLockRenewer, held: list[Held], stats: ProcessorStats
    ) -> None:
        """Failures still held when pumping ends: given back after a defect (found by any
        thread), else settled as the failures they are."""
        if self._defect_found.is_set():
            self._give_back(receiver, renewer, [], [o for o, _ in held], stats)
        else:
            self._settle(receiver, renewer, held, stats)

    def _pump_one(
        self,
        receiver: Receiver,
        renewer: AutoLockRenewer,
        until_idle: bool,
        window: FailureWindow,
        stats: ProcessorStats,
        hold: bool,
    ) -> list[Held]:
        """Receive, handle and settle until idle or stopped; returns the failures it still
        holds. Successes are settled with their batch; with ``hold``, failures are held
        (locked, renewed) while the window cannot yet tell poison from a defect. A session
        returns as soon as it holds one, since its later messages must wait for it."""
        in_order = isinstance(receiver, SessionReceiver)
        wait = 0.0 if in_order else self.max_wait
        held: list[Held] = []
        early: set[int] = set()  # the batch's messages settled before the batch ended

        def settle_early(finished: list[Outcome]) -> None:
            self._settle(receiver, renewer, [(o, None) for o in finished], stats)
            early.update(o.message.sequence_number for o in finished)

        def starting(message: ReceivedMessage) -> bool:
            """Whether to handle the message: not once its lock is known lost. Its lock
            renewal counts from now, as the handler's run does."""
            renewer.register(receiver, message)
            with self._lost_lock:
                return (message.sequence_number, message.lock_token or "") not in self._lost

        try:
            while not self._stop.is_set() and not (in_order and held):
                # Held failures wait for the next messages to judge them by, not longer.
                messages = receiver.receive(
                    self.batch_size, min(wait, FLUSH_INTERVAL) if held else wait
                )
                if not messages:
                    if held:  # nothing else to judge them by: settle them as failures
                        self._settle(receiver, renewer, held, stats)
                        held = []
                        window.settled()
                    elif until_idle:
                        break
                    continue
                stats.received += len(messages)
                renewer.register(receiver, messages)
                early.clear()
                outcomes = self._handle(messages, stats, in_order, starting, settle_early)
                results = [(outcome, self._failure(outcome)) for outcome in outcomes]
                # Only first deliveries tell a defect: a message that failed before is a
                # suspect, settled as it comes.
                fresh = [(o, f) for o, f in results if _first_delivery(o)]
                done: list[Held] = [
                    (o, f)
                    for o, f in results
                    if (f is None or not _first_delivery(o))
                    and o.message.sequence_number not in early
                ]
                held += [(o, f) for o, f in fresh if f is not None]
                defect = window.add(f for _, f in fresh)
                if defect is not None:
                    self._defect_found.set()  # before anything else lets its failures go
                    failed, held = [o for o, _ in held], []
                    self._give_back(receiver, renewer, done, failed, stats)
                    raise ProcessorStoppedError(defect, stats)
                if not (hold and window.undecided()):
                    done, held = done + held, []
                    window.settled()
                self._settle(receiver, renewer, done, stats)
        except BaseException:
            self._let_go(receiver, renewer, held, stats)
            raise
        return held

    def _handle(
        self,
        messages: list[ReceivedMessage],
        stats: ProcessorStats,
        in_order: bool,
        starting: Callable[[ReceivedMessage], bool],
        settle_early: Callable[[list[Outcome]], None],
    ) -> list[Outcome]:
        """Each message's outcome. ``in_order`` (a session): a failure ends the batch, and
        the messages after it are :class:`Skipped`. A message handler runs on a message only
        if ``starting(message)`` says so (its lock is not lost; else it is skipped). Its
        completed messages are passed to ``settle_early`` every :data:`FLUSH_INTERVAL` rather
        than waiting for the slowest of their batch: a worker that dies loses little."""
        if self.batch:
            if in_order:
                return self._first_failure(messages, stats)
            return self._bisect(messages, stats)
        outcomes: list[Outcome] = []
        finished: list[Outcome] = []
        flush_at = time.monotonic() + FLUSH_INTERVAL
        for position, message in enumerate(messages):
            if not starting(message):
                outcomes.append(Skipped(message))
                continue
            stats.handler_runs += 1
            outcome = self._outcome(message, self._call(message))
            outcomes.append(outcome)
            if isinstance(outcome, Completed):
                finished.append(outcome)
                if time.monotonic() >= flush_at and position < len(messages) - 1:
                    settle_early(finished)
                    finished, flush_at = [], time.monotonic() + FLUSH_INTERVAL
            if in_order and not isinstance(outcome, Completed):
                outcomes += [Skipped(later) for later in messages[position + 1 :]]
                break
        return outcomes

    def _first_failure(
        self, messages: list[ReceivedMessage], stats: ProcessorStats
    ) -> list[Outcome]:
        """A session's batch that fails: the longest first part that succeeds is completed,
        the message after it runs alone for its own outcome, and the rest are skipped. A
        binary search over the length of the first part: O(log n) runs, each of which
        handles a first part again (a handler must tolerate that, as any redelivery)."""
        stats.handler_runs += 1
        if self._call(messages) is None:
            return [Completed(message) for message in messages]
        passing, failing = 0, len(messages)  # first parts known to pass and to fail
        while failing - passing > 1:
            middle = (passing + failing) // 2
            stats.handler_runs += 1
            if self._call(messages[:middle]) is None:
                passing = middle
            else:
                failing = middle
        suspect = messages[passing]
        stats.handler_runs += 1  # alone: the failure may have been a passing one
        return [
            *(Completed(message) for message in messages[:passing]),
            self._outcome(suspect, self._call([suspect])),
            *(Skipped(message) for message in messages[passing + 1 :]),
        ]

    def _bisect(self, messages: list[ReceivedMessage], stats: ProcessorStats) -> list[Outcome]:
        """Run the batch handler on ``messages``, and on halves of a failing part down to
        single messages (:func:`poisonq.bisection.failing_alone`)."""

        def run(part: Sequence[ReceivedMessage]) -> BaseException | None:
            stats.handler_runs += 1
            return self._call(list(part))

        failing = failing_alone(messages, run)
        return [
            self._outcome(message, failing[position]) if position in failing else Completed(message)
            for position, message in enumerate(messages)
        ]

    def _call(self, work: ReceivedMessage | list[ReceivedMessage]) -> BaseException | None:
        """Run the handler; its failure, whatever it is, becomes data to settle by."""
        try:
            self.handler(work)  # type: ignore[arg-type]  # batch or not, set in __init__
        except Exception as exc:  # the one place where a handler failure is caught
            return exc
        return None

    def _outcome(self, message: ReceivedMessage, error: BaseException | None) -> Outcome:
        if error is None:
            return Completed(message)
        if isinstance(error, self.permanent):
            return Reject(message, error)
        return Retry(message, error)

    def _settle(
        self,
        receiver: Receiver,
        renewer: AutoLockRenewer,
        outcomes: list[Held],
        stats: ProcessorStats,
    ) -> None:
        """Settle outcomes in one transaction and stop renewing their locks. Messages whose
        lock ran out while the handler ran are left out (they will be delivered again) and
        the rest settled."""
        if not outcomes:
            return
        settlements = [self._settlement(o, f) for o, f in outcomes]
        poisoned, lost = self.broker.settle_held(receiver.address, settlements)
        renewer.unregister([o.message for o, _ in outcomes])
        stats.lock_lost += len(lost)
        for outcome, _ in outcomes:
            if outcome.message.sequence_number in lost:
                self._lock_lost(outcome.message)
        pending = {o.message.sequence_number: o for o, _ in outcomes}
        for seq in lost:
            del pending[seq]
        for outcome in pending.values():
            match outcome:
                case Completed():
                    stats.completed += 1
                case Skipped():
                    stats.released += 1
                case Reject(message, error):
                    stats.dead_lettered += 1
                    self._poisoned(message, error, stats)
                case Retry(message, error):
                    stats.abandoned += 1
                    if message.sequence_number in poisoned:
                        self._poisoned(message, error, stats)

    def _give_back(
        self,
        receiver: Receiver,
        renewer: AutoLockRenewer,
        settled: list[Held],
        failed: list[Outcome],
        stats: ProcessorStats,
    ) -> None:
        """A defect: settle ``settled`` as they are and release ``failed`` (no delivery
        counted), in one transaction."""
        back: list[Held] = [(Skipped(outcome.message), None) for outcome in failed]
        self._settle(receiver, renewer, settled + back, stats)

    def _failure(self, outcome: Outcome) -> FailureRecord | None:
        match outcome:
            case Completed() | Skipped():
                return None
            case Reject(_, error) | Retry(_, error):
                return failure_from_exception(error, self.broker.clock.now())

    def _settlement(self, outcome: Outcome, failure: FailureRecord | None) -> Settlement:
        token = outcome.message.lock_token
        seq = outcome.message.sequence_number
        assert token is not None, "the processor receives in peek-lock mode"
        match outcome:
            case Completed():
                return Complete(seq, token)
            case Skipped():
                return Release(seq, token)
            case Reject():
                assert failure is not None, "a rejected message has its failure"
                return dead_lettering(seq, token, failure)
            case Retry():
                return Abandon(seq, token, failure)

    def _lock_lost(self, message: ReceivedMessage) -> None:
        """Log a lost lock and call ``on_lock_lost``, once per message and lock, whether the
        renewer saw it first or the settlement did."""
        key = (message.sequence_number, message.lock_token or "")
        with self._lost_lock:
            if key in self._lost:
                return
            self._lost.add(key)
        log.warning(
            "lost the lock on message %d of %s: it was not settled and will be delivered again",
            message.sequence_number,
            self.address,
        )
        if self.on_lock_lost is not None:
            self.on_lock_lost(message)

    def _poisoned(
        self, message: ReceivedMessage, error: BaseException, stats: ProcessorStats
    ) -> None:
        stats.poisoned += 1
        if self.on_poison is not None:
            self.on_poison(message, error)


def _first_delivery(outcome: Outcome) -> bool:
    """A handled message on its first delivery (skipped ones were not handled)."""
    return not isinstance(outcome, Skipped) and outcome.message.delivery_count == 1
