"""How the asyncio API reaches the store without blocking the event loop.

:class:`StoreCalls` runs the sync API's calls (each a short store transaction) on a bounded
pool of threads; :class:`ChangeWatch` is the one thread per broker that blocks in
``Store.wait_for_change`` and wakes every coroutine waiting for a change, so a waiting receive
holds no thread and no connection. The waits follow :func:`poisonq.receivers.wait_for`'s rule:
take the marker (here: the current :class:`asyncio.Event`) before looking, look again after
every change and at least every :data:`~poisonq.receivers.LOOK_INTERVAL`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from poisonq.errors import PoisonqError
from poisonq.receivers import LOOK_INTERVAL
from poisonq.store.base import Store

T = TypeVar("T")


class StoreCalls:
    """Runs sync calls on at most ``workers`` threads, off the event loop."""

    def __init__(self, workers: int) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="poisonq-aio")

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        """``fn(*args, **kwargs)`` in a worker thread, as a future of the running loop. A
        cancelled caller does not stop the call: the thread finishes its transaction."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def taking(self, call: Callable[[], T], give_back: Callable[[T], None]) -> T:
        """``call()``, which takes something (locks messages, a session): if the caller is
        cancelled while it runs, the call still ends in its thread, and what it took is
        handed to ``give_back`` (a sync call, run the same way) before the cancellation
        goes on, so that nothing stays locked for nobody."""
        running = asyncio.ensure_future(self(call))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            got = await running
            await self(give_back, got)
            raise

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class ChangeWatch:
    """Wakes the coroutines waiting for a change in the store: one thread blocks in
    ``Store.wait_for_change`` (started by the first wait) and sets the loop's current event
    on each change, then replaces it with a fresh one."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def marker(self) -> asyncio.Event:
        """The event the next change sets: take it before looking, so that a change made
        after the look is never missed."""
        if self._event is None:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
            self._thread = threading.Thread(target=self._watch, name="poisonq-aio-changes")
            self._thread.daemon = True
            self._thread.start()
        return self._event

    async def wait(self, marker: asyncio.Event, timeout: float) -> None:
        """Until the store changes after ``marker`` was taken, or ``timeout`` (at most
        :data:`LOOK_INTERVAL`: what comes due comes without a commit)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(marker.wait(), min(timeout, LOOK_INTERVAL))

    def _watch(self) -> None:
        marker: object = None
        while not self._stop.is_set():
            try:
                if marker is None:
                    marker = self._store.change_marker()
                self._store.wait_for_change(marker, LOOK_INTERVAL)
                now = self._store.change_marker()
            except PoisonqError:  # an outage: the waiters still look every LOOK_INTERVAL
                marker = None
                self._stop.wait(LOOK_INTERVAL)
                continue
            if now != marker:
                marker = now
                assert self._loop is not None
                with contextlib.suppress(RuntimeError):  # the loop closed first
                    self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        woken, self._event = self._event, asyncio.Event()
        assert woken is not None
        woken.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
