"""A synchronous face over the real asyncio API, so that the conformance tests, written against
the sync API, check every rule through ``poisonq.aio`` too (the ``api`` parameter of the
``broker`` fixture in ``tests/conftest.py``).

It is a driver, not a twin: each call goes to the :class:`~poisonq.aio.AsyncBroker` (or the
sender, receiver or session receiver it gave) and the coroutine runs to its end on the one
event loop of the driven broker. A name the asyncio API lacks is an ``AttributeError``, so a
conformance test fails where the two APIs differ instead of quietly falling back to the sync
one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import poisonq
import poisonq.aio
from poisonq import ManualClock
from poisonq.aio import AsyncBroker, AsyncReceiver, AsyncSender

_DRIVEN = (AsyncBroker, AsyncSender, AsyncReceiver)


class Driven:
    """The asyncio object ``target`` with each coroutine method run to its end on ``loop``;
    what a call returns that is itself an asyncio object of the API is driven in turn."""

    def __init__(self, target: object, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def _drive(self, result: Any) -> Any:
        if inspect.isawaitable(result):
            if self._loop.is_running():
                # A call from a plain handler the asyncio Processor runs on the loop (a test
                # looking at the store meanwhile): it runs on a loop of its own in a thread.
                with ThreadPoolExecutor(1) as aside:
                    result = aside.submit(asyncio.run, _awaited(result)).result()
            else:
                try:
                    result = self._loop.run_until_complete(_awaited(result))
                except (KeyboardInterrupt, SystemExit):
                    _end_every_task(self._loop)  # as asyncio.run does when one is raised
                    raise
        return Driven(result, self._loop) if isinstance(result, _DRIVEN) else result

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._drive(value(*args, **kwargs))

        return call

    def __enter__(self) -> Driven:
        self._drive(self._target.__aenter__())  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: Any) -> None:
        self._drive(self._target.__aexit__(*exc))  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[Any]:
        messages = self._target.__aiter__()  # type: ignore[attr-defined]
        while True:
            try:
                yield self._drive(messages.__anext__())
            except StopAsyncIteration:
                return


def _end_every_task(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on ``loop`` and let it run to its end (giving back what it
    holds), as ``asyncio.run`` does before it returns."""
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


@contextmanager
def connect(url: str, clock: ManualClock) -> Iterator[Any]:
    """An :class:`AsyncBroker` on ``url`` driven from sync code, on an event loop of its own,
    closed (with the loop) at the end."""
    loop = asyncio.new_event_loop()
    try:
        broker = loop.run_until_complete(poisonq.aio.connect(url, clock=clock))
        try:
            yield Driven(broker, loop)
        finally:
            loop.run_until_complete(broker.close())
    finally:
        loop.close()


def processor(broker: Any, address: str, handler: Any, **options: Any) -> Any:
    """The Processor of ``broker``'s API: the sync one on a sync broker, the asyncio one
    (its ``run`` driven) on a driven broker."""
    if isinstance(broker, Driven):
        target = poisonq.aio.Processor(broker._target, address, handler, **options)
        return Driven(target, broker._loop)
    return poisonq.Processor(broker, address, handler, **options)
