"""poisonq.servicebus' handlers and clients live until they are closed, sync and asyncio, as
the SDK's do: a closed sender, receiver or session refuses every call with the SDK's
``ValueError``, a client's close closes what it handed out, and a connection string that
names no store is refused rather than made into an empty one."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest

import poisonq
import poisonq.aio
from poisonq import Broker, ManualClock
from poisonq.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage
from poisonq.servicebus import aio as sb_aio
from poisonq.servicebus import exceptions as sb
from poisonq.servicebus.management import ServiceBusAdministrationClient
from tests.helpers import assert_balanced
from tests.test_servicebus_rules import WAIT, client, send

__all__ = ["client"]  # the fixture, shared with the rules' tests

NOW = datetime.datetime.now(datetime.UTC)
SHUTDOWN = "The handler has already been shutdown. Please use ServiceBusClient to create a new"


def test_a_closed_receiver_refuses_every_call_and_locks_nothing(
    client: ServiceBusClient, broker: Broker
) -> None:
    """After ``close``, receiving, peeking, reopening and settling raise the SDK's
    ValueError; nothing is locked for a receiver nobody can settle through."""
    send(client, "orders", "a")
    receiver = client.get_queue_receiver("orders", max_wait_time=WAIT)
    with receiver:
        (message,) = receiver.receive_messages()
        receiver.abandon_message(message)
    calls = [
        receiver.receive_messages,
        receiver.peek_messages,
        lambda: receiver.receive_deferred_messages([1]),
        lambda: next(iter(receiver)),
        receiver.__enter__,
        lambda: receiver.complete_message(message),
        lambda: receiver.renew_message_lock(message),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=SHUTDOWN):
            call()
    receiver.close()  # a second close does nothing
    assert (broker.counts("orders")["active"], broker.counts("orders")["locked"]) == (1, 0)
    assert_balanced(broker)


def test_a_message_held_by_a_closed_receiver_is_not_renewed_and_comes_again(
    client: ServiceBusClient, broker: Broker, clock: ManualClock
) -> None:
    """Closing a receiver stops the renewal of what it did not settle (the SDK's renewer
    stops with its receiver), reporting no loss: the lock runs out and the message is
    delivered again."""
    send(client, "orders", "a")
    lost: list[object] = []
    renewer = AutoLockRenewer(
        on_lock_renew_failure=lambda what, error: lost.append(what), check_interval=3600
    )
    with renewer:
        with client.get_queue_receiver(
            "orders", auto_lock_renewer=renewer, max_wait_time=WAIT
        ) as receiver:
            (message,) = receiver.receive_messages()
            locked_until = message.locked_until_utc
        with pytest.raises(ValueError, match=SHUTDOWN):
            receiver.complete_message(message)
        clock.advance(20)
        renewer.renew_due()  # past half the lock: it would renew a registered message
        assert message.locked_until_utc == locked_until
        renewer.register(receiver, message)  # a closed receiver's message: nothing to renew
        clock.advance(11)
        renewer.renew_due()
    assert lost == []
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as again:
        (second,) = again.receive_messages()
        assert (second.sequence_number, second.delivery_count) == (message.sequence_number, 1)
        again.complete_message(second)
    with pytest.raises(sb.ServiceBusError, match="AutoLockRenewer has already been shutdown"):
        renewer.register(again, second)  # the renewer was closed with its block
    assert_balanced(broker)


def test_a_closed_sender_refuses_every_call(client: ServiceBusClient, broker: Broker) -> None:
    sender = client.get_queue_sender("orders")
    with sender:
        sender.send_messages(ServiceBusMessage("a"))
    calls = [
        lambda: sender.send_messages(ServiceBusMessage("b")),
        lambda: sender.schedule_messages(ServiceBusMessage("b"), NOW),
        lambda: sender.cancel_scheduled_messages([1]),
        sender.create_message_batch,
        sender.__enter__,
    ]
    for call in calls:
        with pytest.raises(ValueError, match=SHUTDOWN):
            call()
    assert broker.counts("orders")["active"] == 1
    assert_balanced(broker)


def test_a_closed_session_receivers_session_refuses_its_state_and_lock(
    client: ServiceBusClient, broker: Broker
) -> None:
    send(client, "sessions", "a1", session_id="a")
    with client.get_queue_receiver("sessions", session_id="a", max_wait_time=WAIT) as receiver:
        session = receiver.session
        session.set_state("open")
    for call in (session.get_state, lambda: session.set_state("x"), session.renew_lock):
        with pytest.raises(ValueError, match=SHUTDOWN):
            call()
    with broker.accept_session("sessions", "a") as native:  # the close gave it back
        assert native.get_session_state() == b"open"
    assert_balanced(broker)


def test_closing_the_client_closes_every_sender_and_receiver_it_handed_out(
    client: ServiceBusClient, broker: Broker
) -> None:
    """As the SDK's client shuts its handlers down; the client itself hands out new ones
    after, as the SDK's does."""
    sender = client.get_queue_sender("orders")
    receiver = client.get_queue_receiver("orders", max_wait_time=WAIT)
    sender.send_messages(ServiceBusMessage("a"))
    client.close()
    with pytest.raises(ValueError, match=SHUTDOWN):
        sender.send_messages(ServiceBusMessage("b"))
    with pytest.raises(ValueError, match=SHUTDOWN):
        receiver.receive_messages()
    send(client, "orders", "c")
    assert broker.counts("orders") == {**broker.counts("orders"), "active": 2, "locked": 0}
    assert_balanced(broker)


def test_the_asyncio_flavour_closes_handlers_and_sessions_for_good(
    url: str, clock: ManualClock
) -> None:
    """The same rules through ``poisonq.servicebus.aio``: a closed receiver, sender or
    session refuses every call, and the client's close closes them all."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("orders")
            await broker.create_queue("sessions", requires_session=True)
            async with sb_aio.ServiceBusClient.from_broker(broker) as client:
                sender = client.get_queue_sender("orders")
                async with sender:
                    await sender.send_messages(ServiceBusMessage("a"))
                await broker.sender("sessions").send(poisonq.Message(body=b"s", session_id="s"))
                receiver = client.get_queue_receiver("orders", max_wait_time=WAIT)
                async with receiver:
                    (message,) = await receiver.receive_messages()
                session_receiver = client.get_queue_receiver(
                    "sessions", session_id="s", max_wait_time=WAIT
                )
                await session_receiver.__aenter__()
                session = session_receiver.session
                open_sender = client.get_queue_sender("orders")
            calls = [
                lambda: sender.send_messages(ServiceBusMessage("b")),
                sender.create_message_batch,
                lambda: open_sender.send_messages(ServiceBusMessage("b")),
                receiver.receive_messages,
                receiver.peek_messages,
                lambda: receiver.complete_message(message),
                receiver.__aenter__,
                session.get_state,
                session_receiver.receive_messages,
            ]
            for call in calls:
                with pytest.raises(ValueError, match=SHUTDOWN):
                    await call()
            assert (await broker.counts("orders"))["active"] == 0  # a's lock still held
            assert (await broker.counts("sessions"))["active"] == 1  # the session went back
            clock.advance(61)
            assert (await broker.counts("orders"))["active"] == 1
            assert_balanced(broker.sync)

    asyncio.run(main())


def test_a_connection_string_naming_no_store_is_refused_and_nothing_is_made(
    tmp_path: Path,
) -> None:
    """A mistyped SQLite path raises ServiceBusConnectionError naming it (the SDK's error for
    a namespace it cannot reach), through the sync and the asyncio client and the
    administration client's reads; the file is not created."""
    path = tmp_path / "qeues.db"
    url = f"sqlite:///{path}"

    def refused(call: object) -> sb.ServiceBusConnectionError:
        with pytest.raises(sb.ServiceBusConnectionError) as caught:
            call()  # type: ignore[operator]
        assert str(path) in str(caught.value)
        assert isinstance(caught.value.error, poisonq.StoreNotFoundError)
        return caught.value

    with ServiceBusClient.from_connection_string(url) as client:
        refused(lambda: client.get_queue_sender("orders").send_messages(ServiceBusMessage("a")))
        refused(lambda: client.get_queue_receiver("orders").peek_messages())
    with ServiceBusAdministrationClient.from_connection_string(url) as admin:
        refused(lambda: admin.get_queue("orders"))
        refused(lambda: list(admin.list_queues()))

    async def through_aio() -> None:
        async with sb_aio.ServiceBusClient.from_connection_string(url) as client:
            with pytest.raises(sb.ServiceBusConnectionError, match=str(path)):
                await client.get_queue_sender("orders").send_messages(ServiceBusMessage("a"))

    asyncio.run(through_aio())
    assert not path.exists()


def test_creating_an_entity_makes_the_store_as_poisonq_queue_create_does(tmp_path: Path) -> None:
    """The first ``create_queue`` of the administration client makes the store; a client
    then sends to it."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with ServiceBusAdministrationClient.from_connection_string(url) as admin:
        admin.create_queue("orders")
    with ServiceBusClient.from_connection_string(url) as client:
        send(client, "orders", "a")
    with poisonq.connect(url, create=False) as broker:
        assert broker.counts("orders")["active"] == 1
        assert_balanced(broker)
