"""Where a Processor runs its handler: in its own process, or in a child that a crash ends alone.

In the Processor's process (``isolation=None``, the default) a handler's exception is caught
and becomes data, but a crash (``os._exit``, a segfault in a native library, the
out-of-memory killer) ends the Processor with every message it holds: their locks run out,
each counts a delivery and comes back a suspect (:mod:`poisonq.processor.suspects`), which the
Processor runs alone, so each crash after the first costs only the crasher's delivery.

With ``isolation="process"`` the handler runs in a child forked by the crash guard's helper
(:mod:`poisonq.worker.guard`, as the pipeline runs a transform): a crash ends that child
only, the message is abandoned with a ``WorkerCrashed`` failure that names the exit code or
signal, and the Processor goes on with the next message in a new child. The price is a
pickle of each message into memory shared with the child and a round trip of a few words
through a pipe (a receive's messages in one, for a message handler outside sessions: figures
in docs/speed.md), and a handler that cannot share state with the Processor's process: what
it returns is dropped, and what it changes in memory stays in the child.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from poisonq.clock import Clock
from poisonq.errors import InvalidOptionError, PoisonqError
from poisonq.failures import failure_from_exception
from poisonq.model import FailureRecord, ReceivedMessage
from poisonq.processor.outcomes import HandlerFailure
from poisonq.worker import guard

Isolation = Literal["process"] | None
Work = ReceivedMessage | list[ReceivedMessage]  # what a handler takes: a message or a batch
Handler = Callable[[Any], Any]


def check_isolation(isolation: object) -> Isolation:
    """``isolation`` as given, or :class:`InvalidOptionError`."""
    if isolation is None:
        return None
    if isolation != "process":
        raise InvalidOptionError(
            "isolation must be None (the handler runs in the Processor's process) or"
            f" 'process' (in a child process that a crash ends alone), not {isolation!r}"
        )
    if not hasattr(os, "fork"):
        raise InvalidOptionError("isolation='process' needs os.fork, which this platform lacks")
    return "process"


class HandlerError(PoisonqError):
    """A handler's failure in its child process (``isolation="process"``), as its failure
    record tells it: the exception itself stayed in the child. ``failure`` is the record."""

    def __init__(self, failure: FailureRecord) -> None:
        first = next(iter(failure.message.splitlines()), "")
        super().__init__(f"{failure.error_type}: {first}")
        self.failure = failure


class HandlerCrashedError(HandlerError):
    """The child process running the handler died (its exit code or signal is in the
    message): a crash, not an exception."""


class AwaitableReturnedError(PoisonqError, TypeError):
    """The sync Processor's handler (or its ``on_poison`` hook) returned an awaitable (a
    coroutine), which it cannot await: the run fails, so a handler's message is not
    completed unhandled and a hook's alert is not lost unseen. ``result`` is what was
    returned."""

    def __init__(self, result: object, returned_by: str = "the handler") -> None:
        super().__init__(
            f"{returned_by} returned {type(result).__name__} {result!r}, which"
            " poisonq.Processor does not await: use poisonq.aio.Processor with an AsyncBroker"
        )


def refuse_awaitable(result: object, returned_by: str) -> None:
    """:class:`AwaitableReturnedError` if ``result`` is an awaitable, which is closed first
    when it is a coroutine (so it never runs, and Python does not warn that it was never
    awaited)."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise AwaitableReturnedError(result, returned_by)


def called(handler: Handler, work: Work) -> None:
    """Call a sync Processor's handler; :class:`AwaitableReturnedError` if it returned an
    awaitable."""
    refuse_awaitable(handler(work), "the handler")


class HandlerRun(Protocol):
    def run(self, work: Work) -> HandlerFailure | None:
        """Run the handler on ``work``: its failure, or ``None`` if it returned."""

    def close(self) -> None: ...


class InProcess:
    """The handler in the Processor's own process: a crash ends the Processor."""

    def __init__(
        self, handler: Handler, permanent: tuple[type[BaseException], ...], clock: Clock
    ) -> None:
        self._handler = handler
        self._permanent = permanent
        self._clock = clock

    def run(self, work: Work) -> HandlerFailure | None:
        try:
            called(self._handler, work)
        except Exception as exc:  # the one place where a handler's exception is caught
            failure = failure_from_exception(exc, self._clock.now())
            return HandlerFailure(exc, failure, isinstance(exc, self._permanent))
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _ResultDropped:
    """The handler as the guard runs it: what it returns stays in the child (it need not
    pickle). Named ``transform`` for the guard, which pickles the user's module by value."""

    transform: Handler

    def __call__(self, work: Work) -> None:
        called(self.transform, work)


class InChildProcess:
    """The handler in a child process forked by the crash guard's helper: a crash ends the
    child, and its message is abandoned with the failure the guard records for it."""

    def __init__(
        self, handler: Handler, permanent: tuple[type[BaseException], ...], clock: Clock
    ) -> None:
        self._helper = guard.start_helper(_ResultDropped(handler), permanent)
        self._clock = clock

    def run(self, work: Work) -> HandlerFailure | None:
        return self.run_each([work])[0]

    def run_each(self, works: Sequence[Work]) -> list[HandlerFailure | None]:
        """The handler run on each of ``works`` in one round trip to the child (the guard
        runs the rest of them in a new child after a crash)."""
        return [self._failure(result) for result in self._helper.run(works)]

    def _failure(self, result: object) -> HandlerFailure | None:
        """A run's result as the guard reports it, as data on the broker's clock (the
        child took the wall clock's)."""
        match result:
            case guard.Failed(record, permanent):
                kind: type[HandlerError] = HandlerError
            case guard.Crashed(record):
                kind, permanent = HandlerCrashedError, False
            case _:
                return None
        record = dataclasses.replace(record, time=self._clock.now())
        return HandlerFailure(kind(record), record, permanent)

    def close(self) -> None:
        self._helper.close()


def start(
    isolation: Isolation,
    handler: Handler,
    permanent: tuple[type[BaseException], ...],
    clock: Clock,
) -> HandlerRun:
    """Where one pump thread runs the handler (a child process serves one thread at a time)."""
    if isolation == "process":
        return InChildProcess(handler, permanent, clock)
    return InProcess(handler, permanent, clock)
