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

A crash is not an exception: a handler that ends its process takes every message the process
holds with it. A message whose last delivery ended that way (its lock ran out unsettled) is a
suspect and runs alone (:mod:`poisonq.processor.suspects`), so a crash costs its neighbours a
delivery once; ``isolation="process"`` runs the handler in a child that a crash ends alone
(:mod:`poisonq.processor.handler_runs`). Each of the ``concurrency`` threads is a
:class:`~poisonq.processor.pump.Pump`; the outcomes it settles by are in
:mod:`poisonq.processor.outcomes`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from poisonq.client import Broker
from poisonq.defects import FailureWindow
from poisonq.lock_renewer import AutoLockRenewer
from poisonq.model import ReceivedMessage
from poisonq.processor import handler_runs
from poisonq.processor.lost_locks import LockLostHook, LostLocks
from poisonq.processor.options import (
    ProcessorOptions,
    check_broker,
    check_flag,
    check_hook,
    check_sync_handler,
)
from poisonq.processor.pump import (
    FLUSH_INTERVAL,
    Lookouts,
    ProcessorStats,
    ProcessorStoppedError,
    Pump,
)
from poisonq.processor.suspects import AloneGate

__all__ = ["FLUSH_INTERVAL", "Processor", "ProcessorStats", "ProcessorStoppedError"]

log = logging.getLogger(__name__)

MessageHandler = Callable[[ReceivedMessage], Any]
BatchHandler = Callable[[list[ReceivedMessage]], Any]
PoisonHook = Callable[[ReceivedMessage, BaseException], Any]


class Processor:
    """Receives from ``address``, calls ``handler`` and settles each message by outcome.

    ``batch=True`` passes lists of up to ``batch_size`` messages to the handler; otherwise it
    is called once per message (still received and completed ``batch_size`` at a time).
    ``concurrency`` threads pump at once. Locks are renewed while a handler runs, for at most
    ``max_lock_renewal_duration`` seconds. ``on_poison(message, error)`` is called after each
    message that this processor dead-lettered or that its abandon poisoned, or that the
    expiry of a lock it lost moved to the dead-letter queue (the error: that
    ``MessageLockLostError``); an exception from the hook propagates (the message is already
    settled, so nothing is lost).
    ``on_lock_lost(message)`` is called (and a warning logged) once for each message whose
    lock was lost before it was settled: its renewal failed or stopped at
    ``max_lock_renewal_duration`` while the handler still ran. Such a message is delivered
    again; its outcome here is counted as ``lock_lost``. A hook's error is logged and the
    run goes on (:mod:`poisonq.processor.lost_locks`).
    ``handler`` is a plain function: a coroutine function is refused
    (:class:`~poisonq.errors.InvalidOptionError`; ``poisonq.aio.Processor`` awaits one), and a
    handler that returns an awaitable fails that run unawaited.
    ``max_failure_ratio`` (``None``: never) is the share of the messages handled since a run
    of failures began (first deliveries only) that may fail the same way before the run
    stops with :class:`ProcessorStoppedError` instead of spending their deliveries.
    A message whose last delivery ended with its lock running out is a suspect: it may have
    killed its holder, so it runs alone (:mod:`poisonq.processor.suspects`).
    ``isolation="process"`` runs the handler in a child process that a crash ends alone
    (:mod:`poisonq.processor.handler_runs`). These and the other keyword arguments are
    :class:`~poisonq.processor.options.ProcessorOptions`, checked there.
    """

    def __init__(
        self,
        broker: Broker,
        address: str,
        handler: MessageHandler | BatchHandler,
        *,
        on_poison: PoisonHook | None = None,
        on_lock_lost: LockLostHook | None = None,
        **options: Any,
    ) -> None:
        check_broker(broker, Broker, "poisonq.Processor", "poisonq.aio.Processor")
        check_sync_handler(handler)
        for hook, name in ((on_poison, "on_poison"), (on_lock_lost, "on_lock_lost")):
            check_hook(hook, name)
            if hook is not None:
                check_sync_handler(hook, name)
        self.options = ProcessorOptions.of(options)
        self.broker = broker
        self.address = address
        self.handler = handler
        self.on_poison = on_poison
        self.on_lock_lost = on_lock_lost
        self.lost_locks = LostLocks(address, on_lock_lost, awaits=False)
        self.stopping = threading.Event()
        self.defect_found = threading.Event()  # by any thread: the others give failures back

    def stop(self) -> None:
        """Ask :meth:`run` to return once the messages in hand are settled (from another
        thread, or a signal handler). Called before :meth:`run`, the next run returns at
        once: a shutdown asked for during start-up is kept."""
        self.stopping.set()

    def run(self, until_idle: bool = False) -> ProcessorStats:
        """Pump until :meth:`stop` is called or, with ``until_idle``, until a receive waits
        ``max_wait`` and finds nothing. Returns what was done. Raises
        :class:`ProcessorStoppedError` on a defect; any other error of a thread (a store
        still unavailable after the client's retries) stops every thread and is raised."""
        check_flag(until_idle, "until_idle")
        try:
            return self._run_until_stopped(until_idle)
        finally:
            self.stopping.clear()  # the next run runs

    def _run_until_stopped(self, until_idle: bool) -> ProcessorStats:
        options = self.options
        self.defect_found.clear()
        per_thread: list[ProcessorStats] = []
        failed: list[BaseException] = []
        window = FailureWindow(self.options.max_failure_ratio)  # every thread's evidence together
        gate = AloneGate()  # every thread's messages: none held while a suspect runs
        lookouts = Lookouts(self.options.concurrency)  # every thread's look for another session

        ended = threading.Semaphore(0)  # one release per pump thread that has ended

        def pump(renewer: AutoLockRenewer) -> None:
            # A thread never dies alone: its error stops the others and run() raises it.
            try:
                pump_until_done(renewer)
            finally:
                ended.release()

        def pump_until_done(renewer: AutoLockRenewer) -> None:
            stats = ProcessorStats()
            per_thread.append(stats)
            try:
                runs = handler_runs.start(
                    options.isolation, self.handler, options.permanent_errors, self.broker.clock
                )
                try:
                    Pump(self, renewer, window, gate, lookouts, runs, stats, until_idle).run()
                finally:
                    runs.close()
            except BaseException as exc:
                failed.append(exc)
                if isinstance(exc, ProcessorStoppedError):
                    self.defect_found.set()
                self.stopping.set()

        lost = self.lost_locks.report
        with AutoLockRenewer(options.max_lock_renewal_duration, lambda m, _: lost(m)) as renewer:
            # Pumps run in threads of their own even alone: Ctrl-C lands in the calling
            # thread, and one landing in a pump between a receive's commit and its return
            # would leave the batch locked, known to nobody, until its locks ran out.
            threads = [
                threading.Thread(target=pump, args=(renewer,), name=f"poisonq-processor-{n}")
                for n in range(options.concurrency)
            ]
            for thread in threads:
                thread.start()
            try:
                _wait_for(threads, ended)
            except BaseException:
                # Ctrl-C lands here, not in a pump: stop the pumps, which settle what they
                # finished and give back the rest, then raise it.
                self.stopping.set()
                _wait_for(threads, ended)
                raise
        total = ProcessorStats()
        for stats in per_thread:
            total.add(stats)
        if failed:
            first = failed[0]
            if isinstance(first, ProcessorStoppedError):
                raise ProcessorStoppedError(first.defect, total) from None
            raise first
        return total


def _wait_for(threads: list[threading.Thread], ended: threading.Semaphore) -> None:
    """Until every thread has ended, woken by each end. Not ``join()``: a join cut by an
    interrupt can take a thread that still runs for one that ended (Python 3.11)."""
    while any(thread.is_alive() for thread in threads):
        ended.acquire(timeout=1.0)
