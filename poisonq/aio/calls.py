"""How the asyncio API reaches the store without blocking the event loop.

:class:`StoreCalls` runs the sync API's core coroutines on the event loop when the store's
driver is asyncio's (PostgreSQL's, through psycopg's asyncio connections), and the calls of a
blocking store (SQLite's; any store's administration) on a bounded pool of threads;
:class:`ChangeWatch` is the one thread per broker that blocks in
``Store.wait_for_change`` and wakes every coroutine waiting for a change, so a waiting receive
holds no thread and no connection. An :class:`AsyncLink` holds the two with the sync broker
whose calls they run: the
:class:`~poisonq.aio.AsyncBroker` hands it to the senders and receivers it makes (as the
sync broker hands them its :class:`~poisonq.link.Link`), so that none depends on the broker.

The waits follow :func:`poisonq.receivers.wait_for`'s rule:
take the marker (here: the current :class:`asyncio.Event`) before looking, look again after
every change and at least every :data:`~poisonq.receivers.LOOK_INTERVAL`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from poisonq.client import Broker
from poisonq.engine.driving import drive
from poisonq.errors import BrokerClosedError, PoisonqError
from poisonq.link import ChangeFeed
from poisonq.messaging import Messaging
from poisonq.receivers import LOOK_INTERVAL

T = TypeVar("T")
P = ParamSpec("P")


class StoreCalls:
    """Runs the store calls of an asyncio broker. Plain calls run on at most ``workers``
    threads, off the event loop. A core coroutine of the sync API (:meth:`run`) runs in one
    of those threads too, unless the broker's store is ``native`` (of an asyncio driver:
    then it runs as a task of the loop, its statements waiting on the loop, at most
    ``workers`` of them at once). Once closed, a
    call raises :class:`BrokerClosedError` for the store at ``url`` (a broker's), as the
    sync Broker does."""

    def __init__(self, workers: int, url: str | None = None, *, native: bool = False) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="poisonq-aio")
        self._url = url
        self._closed = False
        self._native = native
        self._workers = workers
        # A native call's turn, per event loop (a semaphore belongs to the loop it waits on).
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._turns = weakref.WeakKeyDictionary()
        self._tasks: set[asyncio.Task[Any]] = set()  # what native calls run, to their end

    def _check_open(self) -> None:
        if self._closed and self._url is not None:  # also a receive that waited while
            raise BrokerClosedError(self._url)  # its broker closed

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        """``fn(*args, **kwargs)`` in a worker thread, as a future of the running loop. A
        cancelled caller does not stop the call: the thread finishes its transaction."""
        loop = asyncio.get_running_loop()
        self._check_open()
        return loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def run(
        self, operation: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[T]:
        """``operation(*args, **kwargs)``, a coroutine of the sync API's core, awaitable on
        the running loop; a caller cancelled once it has begun does not stop it, as a
        thread's call goes on. On a native store it runs as a task of the loop in its turn
        (kept until it ends: :meth:`finish` waits for it); else it is made and driven to its
        end in a worker thread (made there,
        not here: a call cancelled before a thread took it would leave a coroutine never
        run), which it may be, as it never waits on an event loop on a blocking store (see
        :mod:`poisonq.engine.driving`)."""
        if not self._native:
            return self(lambda: drive(operation(*args, **kwargs)))
        self._check_open()
        return self._in_turn(functools.partial(operation, *args, **kwargs))

    async def _in_turn(self, operation: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``operation()`` as a task of the running loop once one of the loop's ``workers``
        turns is free (as a thread's call waits for a thread): a caller cancelled before
        then runs nothing; once it runs, it runs to its end, its turn held until then."""
        loop = asyncio.get_running_loop()
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = asyncio.Semaphore(self._workers)
        await turns.acquire()
        try:
            task = loop.create_task(operation())
        except BaseException:
            turns.release()
            raise
        task.add_done_callback(lambda _: turns.release())
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        """A native call's end: forgotten, and its error marked seen (its caller, if
        cancelled, will not see it, as a thread's call's is not)."""
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()

    async def taking(
        self,
        take: Callable[[], Coroutine[Any, Any, T]],
        give_back: Callable[[T], Coroutine[Any, Any, None]],
    ) -> T:
        """``take()``, a core coroutine that takes something (locks messages, a session): if
        the caller is cancelled while it runs, it still runs to its end, and what it took is
        handed to ``give_back`` (run the same way) before the cancellation goes on, so that
        nothing stays locked for nobody."""
        running = asyncio.ensure_future(self.run(take))
        try:
            return await to_the_end(running)
        except asyncio.CancelledError:
            if not running.cancelled() and running.exception() is None:
                await to_the_end(self.run(give_back, running.result()))
            raise

    async def finish(self) -> None:
        """Wait for the native calls of the running loop that are still running (their
        callers cancelled): a broker closes its store after them."""
        loop = asyncio.get_running_loop()
        running = [task for task in self._tasks if task.get_loop() is loop]
        await asyncio.gather(*running, return_exceptions=True)

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True)


async def to_the_end(work: Awaitable[T]) -> T:
    """``work``'s result, awaited to its end however many times the caller is cancelled
    meanwhile; the cancellation goes on once it has ended. For what must not stop half done:
    settling, giving back what is held. (``asyncio.shield`` alone covers one cancellation,
    and a task group cancels a task that may already be cleaning up after its own error.)"""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


async def wait_at_most(event: asyncio.Event, seconds: float) -> None:
    """Until ``event`` is set or ``seconds`` have passed; a cancellation of the caller always
    goes on. (Not ``asyncio.wait_for``: before Python 3.12 it returns as if nothing happened
    when the caller is cancelled just as the event is set or the timeout fires, and a
    cancelled receive then went on waiting to its ``max_wait``.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


WATCH_IDLE = 1.0
"""Seconds without a look that may wait after which the change watch's thread ends (on
PostgreSQL it holds the store's listening connection, which a sync receive shares)."""


class ChangeWatch:
    """Wakes the coroutines waiting for a change in the store: one thread blocks in
    ``Store.wait_for_change`` and sets the loop's current event on each change, then
    replaces it with a fresh one. The thread runs while looks that may wait are taken (a
    waiting coroutine takes a marker at least every :data:`LOOK_INTERVAL`), and ends after
    :data:`WATCH_IDLE` without one. A commit made while the thread starts wakes nobody; the
    waiters see it at their next look, within :data:`LOOK_INTERVAL`."""

    def __init__(self, changes: ChangeFeed) -> None:
        self._changes = changes
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._state = threading.Lock()  # guards the two below, shared with the thread
        self._thread: threading.Thread | None = None
        self._last_taken = 0.0  # on time.monotonic

    def marker(self) -> asyncio.Event:
        """The event the next change sets: take it before looking, so that a change made
        after the look is never missed."""
        loop = asyncio.get_running_loop()
        if self._event is None or self._loop is not loop:  # the first look, or a later loop's
            self._loop, self._event = loop, asyncio.Event()
        with self._state:
            self._last_taken = time.monotonic()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._watch, name="poisonq-aio-changes", daemon=True
                )
                self._thread.start()
        return self._event

    async def wait(self, marker: asyncio.Event, timeout: float) -> None:
        """Until the store changes after ``marker`` was taken, or ``timeout`` (at most
        :data:`LOOK_INTERVAL`: what comes due comes without a commit)."""
        await wait_at_most(marker, min(timeout, LOOK_INTERVAL))

    async def look_until(self, deadline: float, look: Callable[[], Awaitable[T]]) -> T:
        """What ``look`` finds, looking again after every change in the store
        until it finds something or ``deadline`` (on the loop's clock) passes."""
        loop = asyncio.get_running_loop()
        while True:
            # Only a look that may wait needs the marker (taking it starts the watch thread).
            marker = self.marker() if deadline > loop.time() else None
            found = await look()
            left = deadline - loop.time()
            if found or left <= 0 or marker is None:
                return found
            await self.wait(marker, min(left, LOOK_INTERVAL))

    def _watch(self) -> None:
        marker: object = None
        while not self._stop.is_set():
            try:
                if marker is None:
                    marker = self._changes.change_marker()
                self._changes.wait_for_change(marker, LOOK_INTERVAL)
                now = self._changes.change_marker()
            except PoisonqError:  # an outage: the waiters still look every LOOK_INTERVAL
                marker = None
                self._stop.wait(LOOK_INTERVAL)
                continue
            if now != marker:
                marker = now
                assert self._loop is not None
                with contextlib.suppress(RuntimeError):  # the loop closed first
                    self._loop.call_soon_threadsafe(self._wake)
            with self._state:
                if time.monotonic() - self._last_taken > WATCH_IDLE:
                    self._thread = None  # the next marker starts another
                    return

    def _wake(self) -> None:
        woken, self._event = self._event, asyncio.Event()
        assert woken is not None
        woken.set()

    def close(self) -> None:
        self._stop.set()
        with self._state:
            thread = self._thread
        if thread is not None:
            thread.join()


@dataclass(frozen=True)
class AsyncLink:
    """What the asyncio senders and receivers use of their broker: the sync broker whose
    plain calls they make, the messaging part whose senders and receivers they wrap (the
    sync broker's, or one on the broker's native store), the calls their cores run on,
    and the change watch their waits wake on."""

    sync: Broker
    messaging: Messaging
    calls: StoreCalls
    changes: ChangeWatch
