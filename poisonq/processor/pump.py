"""One pump thread of a :class:`~poisonq.processor.Processor`, and what a run reports.

A pump receives, runs the handler (:mod:`poisonq.processor.handler_runs`), turns each run into
an outcome (:mod:`poisonq.processor.outcomes`) and settles it, holding first deliveries'
failures back while the defect window (:mod:`poisonq.defects`) cannot tell poison from a
defect. It keeps track of everything it holds under a lock, so that it can let go of all of it
before a suspect runs alone (:mod:`poisonq.processor.suspects`): the crash rule is applied in
:meth:`Pump._round` and :meth:`Pump._run_suspects_alone`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from poisonq.bisection import failing_alone
from poisonq.client import Receiver, SessionReceiver
from poisonq.defects import Defect, FailureWindow
from poisonq.errors import PoisonqError
from poisonq.lock_renewer import AutoLockRenewer
from poisonq.model import ReceivedMessage, ReceiveErrorHandling
from poisonq.processor.handler_runs import HandlerRun, InChildProcess, refuse_awaitable
from poisonq.processor.lost_locks import poisoned_by_expiry
from poisonq.processor.outcomes import (
    FailedPermanently,
    FailedTransiently,
    GivenBack,
    HandlerFailure,
    Outcome,
    Succeeded,
    failure_record,
    first_delivery,
    outcome_of,
    settlement,
)
from poisonq.processor.suspects import AloneGate, is_suspect
from poisonq.receivers import settling

if TYPE_CHECKING:
    from poisonq.processor import Processor

FLUSH_INTERVAL = 0.5  # seconds a handled message may wait for the rest of its batch


@dataclass
class ProcessorStats:
    """What one :meth:`Processor.run` did. ``poisoned`` counts the messages that reached the
    dead-letter queue (or were dropped) because of this run, by either path, not the messages
    of their sessions moved with them; and those the expiry of a lock this run lost moved
    there (:func:`~poisonq.processor.lost_locks.poisoned_by_expiry`). ``released`` counts
    messages given back without a delivery counted (a session's messages after a failure, a
    defect's failures, suspects received beside other messages to be received again alone),
    and ``received`` counts a message again each time it is received."""

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


def tally(
    stats: ProcessorStats, outcomes: Sequence[Outcome], poisoned: Sequence[int], lost: Sequence[int]
) -> list[tuple[ReceivedMessage, BaseException]]:
    """Count settled ``outcomes`` in ``stats`` (``poisoned`` and ``lost``: the sequence
    numbers the settlement poisoned, and those whose lock was lost, left unsettled); the
    messages this settlement poisoned, with their handler's error, for ``on_poison``."""
    stats.lock_lost += len(lost)
    hooks: list[tuple[ReceivedMessage, BaseException]] = []
    for outcome in outcomes:
        if outcome.message.sequence_number in lost:
            continue
        match outcome:
            case Succeeded():
                stats.completed += 1
            case GivenBack():
                stats.released += 1
            case FailedPermanently(message, failure):
                stats.dead_lettered += 1
                hooks.append((message, failure.error))
            case FailedTransiently(message, failure):
                stats.abandoned += 1
                if message.sequence_number in poisoned:
                    hooks.append((message, failure.error))
    return hooks


@dataclass(frozen=True)
class Judged:
    """A round's outcomes judged by the defect window: what to settle now, the failures
    held back (locked, renewed, unsettled) until the window can tell, and the defect found."""

    ready: list[Outcome]
    held_back: list[Outcome]
    defect: Defect | None


def judge(
    window: FailureWindow,
    outcomes: Sequence[Outcome],
    held_back: Sequence[Outcome],
    settled_early: set[int],
    holds_back: bool,
) -> Judged:
    """The defect rule for one round (both Processors'): only first deliveries tell a defect
    (a message that failed before is suspected already, and settled as it comes); their
    failures are held back while the window is undecided (``holds_back``: the queue does not
    fault), and settled together once it is. ``settled_early``: sequence numbers settled
    already. On a defect, ``ready`` is to be settled and ``held_back`` given back."""
    fresh = [o for o in outcomes if first_delivery(o)]
    ready = [
        o
        for o in outcomes
        if (failure_record(o) is None or not first_delivery(o))
        and o.message.sequence_number not in settled_early
    ]
    held = [*held_back, *(o for o in fresh if failure_record(o) is not None)]
    defect = window.add(failure_record(o) for o in fresh)
    if defect is None and not (holds_back and window.undecided()):
        ready, held = ready + held, []
        window.settled()
    return Judged(ready, held, defect)


Run = Callable[[list[ReceivedMessage]], "HandlerFailure | None"]


def first_failure(messages: list[ReceivedMessage], run: Run) -> list[Outcome]:
    """A session's batch handler's outcomes (both Processors'): if the batch fails, the
    longest first part that succeeds is completed, the message after it runs alone for its
    own outcome, and the rest are given back. A binary search over the length of the first
    part: O(log n) runs, each of which handles a first part again (a handler must tolerate
    that, as any redelivery)."""
    if run(messages) is None:
        return [Succeeded(message) for message in messages]
    passing, failing = 0, len(messages)  # first parts known to pass and to fail
    while failing - passing > 1:
        middle = (passing + failing) // 2
        if run(messages[:middle]) is None:
            passing = middle
        else:
            failing = middle
    alone = messages[passing]  # alone: the failure may have been a passing one
    return [
        *(Succeeded(message) for message in messages[:passing]),
        outcome_of(alone, run([alone])),
        *(GivenBack(message) for message in messages[passing + 1 :]),
    ]


def bisected(messages: list[ReceivedMessage], run: Run) -> list[Outcome]:
    """A batch handler's outcomes (both Processors'): the batch run, and halves of a failing
    part down to single messages (:func:`poisonq.bisection.failing_alone`)."""
    failing = failing_alone(messages, lambda part: run(list(part)))
    return [outcome_of(message, failing.get(position)) for position, message in enumerate(messages)]


class ProcessorStoppedError(PoisonqError):
    """Most of the messages handled last failed the same way: a defect in the handler (or
    what it calls), not poison. The batch's failed messages were given back without a
    delivery counted; ``defect`` has the first failure with its traceback, ``stats`` what
    the run did."""

    def __init__(self, defect: Defect, stats: ProcessorStats) -> None:
        super().__init__(f"processor stopped: {defect}; the failed messages are back in the queue")
        self.defect = defect
        self.stats = stats


class Lookouts:
    """Which pumps of a session queue found no session left to take. Parked failures are
    judged as a whole only once every pump did (or ended): before that, another may be
    handling the first message of a session that fails the same way. ``whoami`` tells one
    pump from another (a thread's ident; for the asyncio Processor, its task)."""

    def __init__(self, pumps: int, whoami: Callable[[], object] = threading.get_ident) -> None:
        self._pumps = pumps
        self._whoami = whoami
        self._idle: set[object] = set()
        self._lock = threading.Lock()

    def found_none(self) -> bool:
        """This pump found no session; whether every pump has now."""
        with self._lock:
            self._idle.add(self._whoami())
            return len(self._idle) >= self._pumps

    def found_one(self) -> None:
        with self._lock:
            self._idle.discard(self._whoami())


class Pump:
    """One pump thread of a :class:`Processor`: receives, runs the handler, settles, and
    keeps track of what it holds under a lock, so that it can let go of everything before a
    suspect runs (:class:`~poisonq.processor.suspects.AloneGate`).

    Failures on their first delivery are held back (locked, renewed, unsettled) while the
    defect window cannot yet tell poison from a defect (unless the queue faults): settled as
    failures once successes dilute them, given back without a delivery counted if they grow
    into a defect. A session whose failure is held back stays open (parked) meanwhile."""

    def __init__(
        self,
        processor: Processor,
        renewer: AutoLockRenewer,
        window: FailureWindow,
        gate: AloneGate,
        lookouts: Lookouts,
        runs: HandlerRun,
        stats: ProcessorStats,
        until_idle: bool,
    ) -> None:
        self.processor = processor
        self.broker = processor.broker
        self.renewer = renewer
        self.window = window
        self.gate = gate
        self.lookouts = lookouts
        self.runs = runs
        self.stats = stats
        self.until_idle = until_idle
        self.stopping = processor.stopping
        self.holds_gate = False
        self.holds_back_failures = True

    def run(self) -> None:
        options = self.broker.get_queue(self.processor.address).options
        # A faulting queue stops at its first poison message anyway: holding failures back
        # would only let more messages fail before it does.
        handling = options.retry.receive_error_handling
        self.holds_back_failures = handling is not ReceiveErrorHandling.FAULT
        try:
            if options.requires_session:
                self._pump_sessions()
            else:
                self._pump_queue()
        finally:
            self._let_go_of_gate()
            self.lookouts.found_none()  # an ended thread takes no more sessions

    # The gate ---------------------------------------------------------------------------

    def _hold_gate(self) -> None:
        if not self.holds_gate:
            self.gate.hold()
            self.holds_gate = True

    def _let_go_of_gate(self) -> None:
        if self.holds_gate:
            self.gate.let_go()
            self.holds_gate = False

    # Pumping ----------------------------------------------------------------------------

    def _pump_queue(self) -> None:
        receiver = self.broker.receiver(self.processor.address)
        while True:
            held_back, alone = self._pump(receiver)
            if alone is None and (self.stopping.is_set() or not self.gate.wanted()):
                self._let_go(receiver, held_back)  # stopped, or idle
                return
            self._give_back_held(receiver, held_back)
            self._let_go_of_gate()
            if alone is not None:
                self._run_suspects_alone(receiver, alone)

    def _pump_sessions(self) -> None:
        """A session queue: one session at a time, its messages in order, until it is
        empty; then the next session nobody holds. A session whose failure is held back
        stays open (parked, its lock renewed) while other sessions tell poison from a
        defect: its messages must not run past the failure, and a bug that fails the first
        message of every session must not poison whole sessions before it shows."""
        parked: list[tuple[SessionReceiver, list[Outcome]]] = []
        missed_once = False  # with sessions parked, the last look for another found none
        try:
            while not self.stopping.is_set():
                if parked and (not self.window.undecided() or self.gate.wanted()):
                    if self.gate.wanted():  # a suspect runs: hold nothing
                        self._give_back_parked(parked)
                    else:
                        self._unpark(parked)
                    missed_once = False
                if not parked:  # holding nothing: wait here while another runs suspects
                    self._let_go_of_gate()
                self._hold_gate()
                session = self.broker.accept_next_session(self.processor.address, max_wait=0)
                if session is None:
                    everyone_looked = self.lookouts.found_none()
                    if parked and missed_once and everyone_looked:
                        # Nothing else to judge them by: a defect if every session tried
                        # failed the same way, else the failures they are.
                        self._judge_parked(parked)
                        missed_once = False
                    elif parked:
                        # Other threads may hold the rest, or be taking them: look again.
                        missed_once = True
                        self.stopping.wait(FLUSH_INTERVAL)
                    elif self.until_idle:
                        break
                    else:
                        self.stopping.wait(self.processor.options.max_wait)
                    continue
                missed_once = False
                self.lookouts.found_one()
                try:
                    held_back, alone = self._pump(session)
                    if alone is not None:
                        self._give_back_parked(parked)
                        self._let_go_of_gate()
                        self._run_suspects_alone(session, alone)
                except BaseException:
                    session.close()
                    raise
                if held_back:
                    parked.append((session, held_back))
                else:
                    session.close()
        finally:
            for session, held_back in parked:
                self._let_go(session, held_back)
                session.close()

    def _give_back_parked(self, parked: list[tuple[SessionReceiver, list[Outcome]]]) -> None:
        """Ahead of a suspect's run: the parked sessions' failures are released and the
        sessions let go."""
        for parked_session, held_back in parked:
            self._give_back_held(parked_session, held_back)
            parked_session.close()
        parked.clear()

    def _judge_parked(self, parked: list[tuple[SessionReceiver, list[Outcome]]]) -> None:
        """Every session on offer was tried and the parked failures are still undecided: a
        few sessions can never show :data:`~poisonq.defects.MIN_FAILURES`, so they are judged
        with fewer (:meth:`~poisonq.defects.FailureWindow.defect_of_all`). A defect gives
        them back uncounted and stops the run; else they are settled as poison."""
        defect = self.window.defect_of_all()
        if defect is None:
            self._unpark(parked)
            return
        self.processor.defect_found.set()  # before anything else lets its failures go
        for session, held_back in parked:  # the window stays: the other threads' failures
            self._give_back(session, [], held_back)  # are the same defect's
            session.close()
        parked.clear()
        raise ProcessorStoppedError(defect, self.stats)

    def _unpark(self, parked: list[tuple[SessionReceiver, list[Outcome]]]) -> None:
        """The parked sessions' failures were poison: settle them and let the sessions go."""
        for session, held_back in parked:
            self._settle(session, held_back)
            session.close()
        parked.clear()
        self.window.settled()

    def _pump(self, receiver: Receiver) -> tuple[list[Outcome], list[ReceivedMessage] | None]:
        """Receive, handle and settle until idle, stopped, this thread claims the gate to run
        suspects alone, or another thread waits to. Returns the failures still held back,
        and the suspects kept to run alone once claimed (``None``: not claimed). A session
        returns as soon as it holds a failure back, since its later messages must wait."""
        in_order = isinstance(receiver, SessionReceiver)
        options = self.processor.options
        wait = 0.0 if in_order else options.max_wait
        held_back: list[Outcome] = []
        self._hold_gate()  # waits while another thread runs suspects alone
        try:
            while not (self.stopping.is_set() or (in_order and held_back) or self.gate.wanted()):
                # Held-back failures wait for the next messages to judge them by, not longer.
                messages = self._receive(receiver, min(wait, FLUSH_INTERVAL) if held_back else wait)
                if not messages:
                    if held_back:  # nothing else to judge them by: settle them as failures
                        self._settle(receiver, held_back)
                        held_back = []
                        self.window.settled()
                    elif self.until_idle:
                        break
                    continue
                held_back, alone = self._round(receiver, messages, held_back)
                if alone is not None:
                    return held_back, alone
        except BaseException:
            self._let_go(receiver, held_back)
            raise
        return held_back, None

    def _receive(self, receiver: Receiver, wait: float) -> list[ReceivedMessage]:
        """A batch, waiting up to ``wait`` for it but not past :meth:`Processor.stop`
        (looked at every :data:`FLUSH_INTERVAL`: a shutdown's grace period is shorter than
        a long poll)."""
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            slice_ = max(0.0, min(left, FLUSH_INTERVAL))
            messages = receiver.receive(self.processor.options.batch_size, slice_)
            if messages or left <= FLUSH_INTERVAL or self.stopping.is_set():
                return messages

    def _round(
        self, receiver: Receiver, messages: list[ReceivedMessage], held_back: list[Outcome]
    ) -> tuple[list[Outcome], list[ReceivedMessage] | None]:
        """Handle one receive's messages, except suspects. Returns the failures held back,
        and, when this thread claimed the gate for its suspects, those it keeps to run alone
        (``None``: not claimed).

        A queue's first suspect is kept, and everything else of the receive given back:
        handling the rest first would hold the suspect's lock through their runs, and
        giving it back too would let the messages before it come first again and again.
        In a session the messages before the first suspect are handled (in order), the rest
        given back, and the suspect received again on its own. A thread that cannot claim
        (another runs its suspects) gives its suspects back and handles the rest."""
        self.stats.received += len(messages)
        self.renewer.register(receiver, messages)
        in_order = isinstance(receiver, SessionReceiver)
        suspects = [m for m in messages if is_suspect(m)]
        alone: list[ReceivedMessage] | None = None
        if in_order:
            cut = messages.index(suspects[0]) if suspects else len(messages)
            now, later = messages[:cut], messages[cut:]
        elif suspects and self.gate.claim():
            alone, now = suspects[:1], []
            later = [m for m in messages if m is not suspects[0]]
        else:
            now, later = [m for m in messages if not is_suspect(m)], suspects
        try:
            handled, settled_early = self._handle(receiver, now, in_order)
        except (KeyboardInterrupt, SystemExit):
            # Ctrl-C or exit is not a failed delivery: what the handler did not finish goes
            # back uncounted (locks left to run out would each count a delivery and come
            # back as suspects).
            self._settle(receiver, [GivenBack(m) for m in messages])
            raise
        outcomes = [*handled, *(GivenBack(message) for message in later)]
        judged = judge(self.window, outcomes, held_back, settled_early, self.holds_back_failures)
        ready, held_back = judged.ready, judged.held_back
        if judged.defect is not None:
            if alone is not None:
                self.gate.unclaim()
                ready.append(GivenBack(alone[0]))
            self.processor.defect_found.set()  # before anything else lets its failures go
            self._give_back(receiver, ready, held_back)
            raise ProcessorStoppedError(judged.defect, self.stats)
        self._settle(receiver, ready)
        if in_order and suspects and not held_back and self.gate.claim():
            alone = []
        return held_back, alone

    def _run_suspects_alone(self, receiver: Receiver, kept: list[ReceivedMessage]) -> None:
        """The crash rule (:mod:`poisonq.processor.suspects`), run by the thread that claimed the
        gate: once no other thread holds a message, the suspects ``kept`` and then those
        received one at a time are each handled and settled before the next is received.
        Ends at the first message that is not a suspect (given back, for the next batch),
        or when none is left."""
        in_order = isinstance(receiver, SessionReceiver)
        try:
            self.gate.wait_alone()
            for message in kept:
                self._settle(receiver, self._handle(receiver, [message], in_order)[0])
            while not self.stopping.is_set():
                messages = receiver.receive(1, 0.0)
                if not messages:
                    return
                self.stats.received += 1
                self.renewer.register(receiver, messages)
                if not is_suspect(messages[0]):
                    self._settle(receiver, [GivenBack(messages[0])])
                    return
                self._settle(receiver, self._handle(receiver, messages, in_order)[0])
        finally:
            self.gate.unclaim()

    # Running the handler ---------------------------------------------------------------

    def _handle(
        self, receiver: Receiver, messages: list[ReceivedMessage], in_order: bool
    ) -> tuple[list[Outcome], set[int]]:
        """Each message's outcome, and the sequence numbers of those already settled.
        ``in_order`` (a session): a failure ends the batch, and the messages after it are
        given back. A message handler runs on a message only if its lock is not known lost
        (else it is given back). Its completed messages are settled every
        :data:`FLUSH_INTERVAL` rather than waiting for the slowest of their batch: a worker
        that dies loses little."""
        if not messages:
            return [], set()
        if self.processor.options.batch:
            if in_order:
                return first_failure(messages, self._run), set()
            return bisected(messages, self._run), set()
        if isinstance(self.runs, InChildProcess) and not in_order:
            return self._in_one_round_trip(receiver, messages, self.runs), set()
        outcomes: list[Outcome] = []
        finished: list[Outcome] = []
        settled_early: set[int] = set()
        flush_at = time.monotonic() + FLUSH_INTERVAL
        try:
            for position, message in enumerate(messages):
                if self.stopping.is_set():  # stop() or Ctrl-C: the rest goes back uncounted
                    outcomes += [GivenBack(later) for later in messages[position:]]
                    break
                # Its lock renewal counts from now, as the handler's run does.
                self.renewer.register(receiver, message)
                if self.processor.lost_locks.known(message):
                    outcomes.append(GivenBack(message))
                    continue
                outcome = outcome_of(message, self._run(message))
                outcomes.append(outcome)
                if isinstance(outcome, Succeeded):
                    finished.append(outcome)
                    if time.monotonic() >= flush_at and position < len(messages) - 1:
                        self._settle(receiver, finished)
                        settled_early.update(o.message.sequence_number for o in finished)
                        finished, flush_at = [], time.monotonic() + FLUSH_INTERVAL
                if in_order and not isinstance(outcome, Succeeded):
                    outcomes += [GivenBack(later) for later in messages[position + 1 :]]
                    break
        except (KeyboardInterrupt, SystemExit):
            # Interrupted, not failed: what was handled is settled by its outcome, and the
            # rest (the message in hand too) given back uncounted.
            self._settle(receiver, outcomes)
            raise
        return outcomes, settled_early

    def _in_one_round_trip(
        self, receiver: Receiver, messages: list[ReceivedMessage], child: InChildProcess
    ) -> list[Outcome]:
        """A message handler in a child process: the messages whose lock is not known lost
        go to the child together (one round trip through the pipe, not one per message;
        a crash still costs only the crasher, the guard running the rest in a new child),
        and are settled together when it is done."""
        self.renewer.register(receiver, messages)  # renewal counts from now
        lost = [m for m in messages if self.processor.lost_locks.known(m)]
        run = [m for m in messages if m not in lost]
        self.stats.handler_runs += len(run)
        failures = child.run_each(run) if run else []
        return [
            *(outcome_of(m, f) for m, f in zip(run, failures, strict=True)),
            *(GivenBack(m) for m in lost),
        ]

    def _run(self, work: ReceivedMessage | list[ReceivedMessage]) -> HandlerFailure | None:
        """Run the handler once (in this process or a child): its failure, as data."""
        self.stats.handler_runs += 1
        return self.runs.run(work)

    # Settling ---------------------------------------------------------------------------

    def _settle(self, receiver: Receiver, outcomes: list[Outcome]) -> None:
        """Settle outcomes in one transaction and stop renewing their locks. Messages whose
        lock ran out while the handler ran are left out (they will be delivered again) and
        the rest settled."""
        # A message is settled once: what a defect gave back is not given back again by the
        # frame that lets go of what it held when the defect's error passes through.
        outcomes = [o for o in outcomes if not o.message.settled]
        if not outcomes:
            return
        stats = self.stats
        # Unregistered and marked first: a renewal already on its way then fails on a
        # settled message, which the renewer does not report as a lost lock.
        self.renewer.unregister([o.message for o in outcomes])
        with settling([o.message for o in outcomes]):
            poisoned, lost = self.broker.settle_held(
                receiver.address, [settlement(o) for o in outcomes]
            )
        expired = [o.message for o in outcomes if o.message.sequence_number in lost]
        for message in expired:
            self.processor.lost_locks.report(message)
        spent = poisoned_by_expiry(self.broker, receiver.address, expired)
        for message, error in [*tally(stats, outcomes, poisoned, lost), *spent]:
            self._poisoned(message, error)

    def _give_back(self, receiver: Receiver, settled: list[Outcome], failed: list[Outcome]) -> None:
        """Settle ``settled`` as they are and release ``failed`` (no delivery counted), in
        one transaction."""
        back: list[Outcome] = [GivenBack(outcome.message) for outcome in failed]
        self._settle(receiver, settled + back)

    def _give_back_held(self, receiver: Receiver, held_back: list[Outcome]) -> None:
        """Ahead of a suspect's run: the failures held back are released (they come back as
        first deliveries), and the defect window starts again."""
        if held_back:
            self._give_back(receiver, [], held_back)
            self.window.settled()

    def _let_go(self, receiver: Receiver, held_back: list[Outcome]) -> None:
        """Failures still held back when pumping ends: given back after a defect (found by
        any thread), else settled as the failures they are."""
        if self.processor.defect_found.is_set():
            self._give_back(receiver, [], held_back)
        else:
            self._settle(receiver, held_back)

    def _poisoned(self, message: ReceivedMessage, error: BaseException) -> None:
        self.stats.poisoned += 1
        if self.processor.on_poison is not None:
            refuse_awaitable(self.processor.on_poison(message, error), "the on_poison hook")
