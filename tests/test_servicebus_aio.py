"""poisonq.servicebus.aio's own shapes, on both stores: where the SDK's asyncio API differs
from its sync one (async iterators where the sync API gives iterators), poisonq's does too."""

from __future__ import annotations

import asyncio

import poisonq.aio
from poisonq import ManualClock, Message
from poisonq.servicebus.aio import ServiceBusClient
from tests.helpers import assert_balanced


def test_sessions_are_listed_by_an_async_iterator_of_their_ids(
    url: str, clock: ManualClock
) -> None:
    """``list_queue_sessions`` and ``list_subscription_sessions`` are not coroutines: they
    return what ``async for`` reads, as the SDK's ``AsyncItemPaged``."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("sessions", requires_session=True)
            await broker.create_topic("events")
            await broker.create_subscription("events", "all", requires_session=True)
            for session_id in ("a", "b"):
                message = Message(body=b"x", session_id=session_id)
                await broker.sender("sessions").send(message)
                await broker.sender("events").send(message)
            async with ServiceBusClient.from_broker(broker) as client:
                queue = [s async for s in client.list_queue_sessions("sessions")]
                topic = [s async for s in client.list_subscription_sessions("events", "all")]
            assert queue == topic == ["a", "b"]
            assert_balanced(broker.sync)

    asyncio.run(main())
