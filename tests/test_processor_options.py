"""What a Processor refuses as it is made, and what the sync Processor does with a handler
that gives back a coroutine it cannot await: never complete the message unhandled."""

from __future__ import annotations

import asyncio
import functools
import warnings
from typing import Any

import pytest

import poisonq
import poisonq.aio
from poisonq import Broker, InvalidOptionError, ManualClock, Message, ReceivedMessage
from poisonq.processor.handler_runs import AwaitableReturnedError
from tests.helpers import assert_balanced


async def handle_async(message: Any) -> None:
    raise AssertionError("a coroutine the sync Processor made must never run")


class AsyncCallable:
    async def __call__(self, message: Any) -> None:
        raise AssertionError("never awaited, never run")


@pytest.mark.parametrize(
    "handler",
    [handle_async, AsyncCallable(), functools.partial(handle_async)],
    ids=["async-def", "async-call", "partial"],
)
def test_the_sync_processor_refuses_a_coroutine_function_handler_naming_the_aio_processor(
    broker: Broker, handler: Any
) -> None:
    with pytest.raises(InvalidOptionError, match=r"poisonq\.aio\.Processor"):
        poisonq.Processor(broker, "orders", handler)
    with pytest.raises(InvalidOptionError, match=r"poisonq\.aio\.Processor"):
        poisonq.Processor(broker, "orders", handler, batch=True)


def test_the_aio_processor_takes_a_coroutine_function_of_each_kind(url: str) -> None:
    async def make() -> None:
        async with await poisonq.aio.connect(url) as broker:
            for handler in (handle_async, AsyncCallable(), functools.partial(handle_async)):
                poisonq.aio.Processor(broker, "orders", handler)

    asyncio.run(make())


def test_the_aio_processor_refuses_a_sync_broker_naming_the_sync_processor(broker: Broker) -> None:
    with pytest.raises(InvalidOptionError, match=r"poisonq\.Processor"):
        poisonq.aio.Processor(broker, "orders", handle_async)  # type: ignore[arg-type]


def test_the_sync_processor_refuses_an_async_broker_naming_the_aio_processor(url: str) -> None:
    async def make() -> None:
        async with await poisonq.aio.connect(url) as broker:
            with pytest.raises(InvalidOptionError, match=r"poisonq\.aio\.Processor"):
                poisonq.Processor(broker, "orders", print)  # type: ignore[arg-type]

    asyncio.run(make())


@pytest.mark.parametrize(
    ("batch", "isolation"),
    [(False, None), (True, None), (False, "process")],
    ids=["message", "batch", "process"],
)
def test_a_sync_handler_that_returns_a_coroutine_fails_its_run_and_completes_nothing(
    url: str, clock: ManualClock, batch: bool, isolation: str | None
) -> None:
    """The returned coroutine is closed unrun (no "never awaited" warning) and the run is a
    failure naming poisonq.aio.Processor; as every message fails so, the defect window stops
    the run and gives the held-back failures back."""
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders", max_delivery_count=3)
        broker.sender("orders").send([Message(body=str(n).encode()) for n in range(30)])

        def handler(work: ReceivedMessage | list[ReceivedMessage]) -> Any:
            return handle_async(work)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(poisonq.ProcessorStoppedError) as stopped:
                poisonq.Processor(
                    broker, "orders", handler, batch=batch, isolation=isolation, max_wait=0
                ).run(until_idle=True)
        assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []
        failure = stopped.value.defect.failure
        assert failure.error_type == "poisonq.processor.handler_runs.AwaitableReturnedError"
        assert "poisonq.aio.Processor" in failure.message
        assert broker.counts("orders")["completed"] == 0
        assert broker.counts("orders")["active"] == 30
        assert_balanced(broker)


@pytest.mark.parametrize("name", ["on_poison", "on_lock_lost"])
def test_the_sync_processor_refuses_a_coroutine_function_hook_naming_the_aio_processor(
    broker: Broker, name: str
) -> None:
    with pytest.raises(InvalidOptionError, match=rf"{name} .*poisonq\.aio\.Processor"):
        poisonq.Processor(broker, "orders", print, **{name: AsyncCallable()})


def test_an_on_poison_hook_that_returns_a_coroutine_ends_the_sync_run_as_a_raising_hook_does(
    url: str, clock: ManualClock
) -> None:
    """A sync ``on_poison`` that returns a coroutine (``lambda m, e: alert(m, e)``) would
    lose its alert unseen: the coroutine is closed unrun and the run ends with
    AwaitableReturnedError naming the hook, the message staying dead-lettered."""
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([Message(body=b"bad")])

        def handler(message: ReceivedMessage) -> None:
            raise poisonq.PermanentError("unknown customer")

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(AwaitableReturnedError, match=r"the on_poison hook .*aio"):
                poisonq.Processor(
                    broker,
                    "orders",
                    handler,
                    max_wait=0,
                    on_poison=lambda message, error: handle_async(message),
                ).run(until_idle=True)
        assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []
        assert broker.counts("orders")["dead_lettered"] == 1
        assert_balanced(broker)
