"""poisonq.servicebus.aio's own shapes, on both stores, as the SDK's asyncio API has them
where it differs from its sync one: async iterators (a receiver, the session listings), and
a session receiver's session usable before the receiver opens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import poisonq.aio
from poisonq import ManualClock, Message
from poisonq.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusReceiveMode
from poisonq.servicebus import exceptions as sb
from poisonq.servicebus.aio import AutoLockRenewer, ServiceBusClient
from poisonq.servicebus.aio import management as aio_management
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


def test_a_session_receivers_session_accepts_it_when_first_used(
    url: str, clock: ManualClock
) -> None:
    """``receiver.session`` is there before the receiver opens, as the SDK's: its id is the
    one asked for (``None`` for the next available until one is accepted), and its first
    call accepts the session."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("sessions", requires_session=True)
            await broker.sender("sessions").send(Message(body=b"x", session_id="a"))
            async with ServiceBusClient.from_broker(broker) as client:
                named = client.get_queue_receiver("sessions", session_id="a", max_wait_time=0.05)
                assert (named.session.session_id, named.session.locked_until_utc) == ("a", None)
                await named.session.set_state("started")
                assert named.session.locked_until_utc is not None
                (message,) = await named.receive_messages()
                await named.complete_message(message)
                await named.close()
                await broker.sender("sessions").send(Message(body=b"y", session_id="a"))
                following = client.get_queue_receiver(
                    "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.05
                )
                assert following.session.session_id is None
                assert await following.session.get_state() == b"started"
                assert following.session.session_id == "a"
                (message,) = await following.receive_messages()
                await following.complete_message(message)
            assert_balanced(broker.sync)

    asyncio.run(main())


def test_a_receiver_is_its_own_async_iterator_ending_after_max_wait_time(
    url: str, clock: ManualClock
) -> None:
    """As the SDK's: ``__aiter__`` returns the receiver, ``anext(receiver)`` receives one
    message, and the iteration ends once none came for ``max_wait_time``."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("orders")
            await broker.sender("orders").send([Message(body=b"a"), Message(body=b"b")])
            async with ServiceBusClient.from_broker(broker) as client:
                mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
                receiver = client.get_queue_receiver(
                    "orders", receive_mode=mode, max_wait_time=0.05
                )
                async with receiver:
                    assert receiver.__aiter__() is receiver
                    assert receiver.receive_mode is mode
                    first = await anext(receiver)
                    rest = [str(message) async for message in receiver]
            assert (str(first), rest) == ("a", ["b"])
            assert_balanced(broker.sync)

    asyncio.run(main())


def test_a_coroutine_is_awaited_with_the_sdks_objects_when_a_lock_is_lost(
    url: str, clock: ManualClock
) -> None:
    """A coroutine ``on_lock_renew_failure`` given to ``register`` runs on the loop with the
    message and an AutoLockRenewFailed whose ``error`` is the lost lock's; a closed renewer
    refuses a registration with the SDK's ServiceBusError."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("orders", lock_duration=30)
            await broker.sender("orders").send(Message(body=b"a"))
            reported = asyncio.Event()
            lost: list[tuple[object, BaseException | None]] = []

            async def on_failure(renewable: object, error: BaseException | None) -> None:
                lost.append((renewable, error))
                reported.set()

            renewer = AutoLockRenewer(max_lock_renewal_duration=0, check_interval=3600)
            async with ServiceBusClient.from_broker(broker) as client:
                async with client.get_queue_receiver("orders", max_wait_time=0.05) as receiver:
                    (message,) = await receiver.receive_messages()
                    renewer.register(receiver, message, on_lock_renew_failure=on_failure)
                    clock.advance(31)
                    await renewer.renew_due()
                    await asyncio.wait_for(reported.wait(), timeout=10)
                await renewer.close()
                with pytest.raises(sb.ServiceBusError, match="AutoLockRenewer has already been"):
                    renewer.register(receiver, message)
            [(what, error)] = lost
            assert what is message and message.auto_renew_error is error
            assert isinstance(error, sb.AutoLockRenewFailed)
            assert isinstance(error.error, sb.MessageLockLostError)
            assert_balanced(broker.sync)

    asyncio.run(main())


def test_a_receiver_of_another_entity_refuses_to_settle_a_message(
    url: str, clock: ManualClock
) -> None:
    """The sync rule through the asyncio flavour: a ValueError naming both entities, and
    the message still locked."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("orders")
            await broker.create_queue("other")
            await broker.sender("orders").send(Message(body=b"a"))
            async with (
                ServiceBusClient.from_broker(broker) as client,
                client.get_queue_receiver("orders", max_wait_time=0.05) as receiver,
                client.get_queue_receiver("other") as other,
            ):
                (message,) = await receiver.receive_messages()
                with pytest.raises(ValueError, match="received from 'orders'"):
                    await other.complete_message(message)
                assert (await broker.counts("orders"))["locked"] == 1
                await receiver.complete_message(message)
            assert_balanced(broker.sync)

    asyncio.run(main())


def test_a_session_queue_refuses_a_message_without_a_session_id_through_asyncio(
    url: str, clock: ManualClock
) -> None:
    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("sessions", requires_session=True)
            async with (
                ServiceBusClient.from_broker(broker) as client,
                client.get_queue_sender("sessions") as sender,
            ):
                with pytest.raises(sb.ServiceBusError, match="SessionId was not set"):
                    await sender.send_messages(ServiceBusMessage("no session"))
                await sender.send_messages(ServiceBusMessage("a", session_id="s"))
            counts = await broker.counts("sessions")
            assert (counts["active"], counts["dead_lettered"]) == (1, 0)
            assert_balanced(broker.sync)

    asyncio.run(main())


def test_the_asyncio_administration_client_makes_the_store_and_opens_again_after_close(
    tmp_path: Path,
) -> None:
    """As the sync one: its first ``create_queue`` makes the store, a read of a store that
    is not there raises ServiceBusConnectionError, and a call after ``close`` opens the
    store again."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"

    async def main() -> None:
        missing = aio_management.ServiceBusAdministrationClient.from_connection_string(
            f"sqlite:///{tmp_path / 'shp.db'}"
        )
        with pytest.raises(sb.ServiceBusConnectionError, match=r"shp\.db"):
            await missing.get_queue("orders")
        await missing.close()
        admin = aio_management.ServiceBusAdministrationClient.from_connection_string(url)
        await admin.create_queue("orders")
        await admin.close()
        assert [q.name async for q in admin.list_queues()] == ["orders"]
        await admin.close()

    asyncio.run(main())
    assert not (tmp_path / "shp.db").exists()
