"""Queue administration: create, list, show, update, enable/disable, delete."""

from __future__ import annotations

import pytest

import poisonq
from poisonq import (
    Broker,
    EntityDisabledError,
    EntityExistsError,
    EntityNotFoundError,
    EntityStatus,
    InvalidNameError,
    InvalidOperationError,
    InvalidOptionError,
    Message,
    SubQueue,
)


def test_create_makes_the_subqueues(broker: Broker) -> None:
    info = broker.create_queue("orders", max_delivery_count=4, lock_duration=20)
    assert info.name == "orders"
    assert info.options.max_delivery_count == 4
    assert info.status is EntityStatus.ACTIVE
    assert info.counts == {
        "scheduled": 0, "active": 0, "locked": 0, "deferred": 0,
        "dead_lettered": 0, "completed": 0, "dropped": 0,
    }  # fmt: skip
    dlq = broker.get_queue("orders;poison")
    assert dlq.name == "orders/$deadletterqueue"
    assert dlq.subqueue is SubQueue.DEADLETTER
    assert broker.get_queue("orders;retry").subqueue is SubQueue.RETRY
    assert [q.name for q in broker.list_queues()] == ["orders"]


def test_names_are_validated_and_unique(broker: Broker) -> None:
    broker.create_queue("orders")
    with pytest.raises(EntityExistsError):
        broker.create_queue("orders")
    with pytest.raises(InvalidNameError):
        broker.create_queue("orders;poison")
    with pytest.raises(InvalidNameError):
        broker.create_queue("drop table")
    with pytest.raises(EntityNotFoundError):
        broker.get_queue("missing")


def test_an_unknown_queue_is_named_as_written_with_the_closest_names(broker: Broker) -> None:
    for name in ("orders", "returns"):
        broker.create_queue(name)
    broker.create_topic("events")
    broker.create_subscription("events", "audit")
    for written in ("ordres", "ordres;poison", "ordres/$deadletterqueue", "ordres;retry"):
        with pytest.raises(EntityNotFoundError) as caught:
            broker.peek(written)
        assert str(caught.value) == "no queue 'ordres'; did you mean 'orders'?"
        assert (caught.value.name, caught.value.close) == ("ordres", ["orders"])
    with pytest.raises(EntityNotFoundError) as caught:
        broker.dead_letter_groups("event/subscriptions/audit")
    assert caught.value.close == ["events/subscriptions/audit"]
    with pytest.raises(EntityNotFoundError, match=r"^no queue 'zzz'$"):
        broker.counts("zzz")
    with pytest.raises(EntityNotFoundError, match="did you mean 'orders'"):
        broker.create_queue("refunds", forward_to="order")


def test_update_changes_only_what_it_names(broker: Broker) -> None:
    broker.create_queue("orders", max_delivery_count=4, default_message_ttl=60)
    info = broker.update_queue("orders", lock_duration=10)
    assert info.options.lock_duration == 10
    assert info.options.max_delivery_count == 4
    assert info.options.default_message_ttl == 60
    assert broker.update_queue("orders", max_delivery_count=2).options.max_delivery_count == 2
    with pytest.raises(InvalidOptionError):
        broker.update_queue("orders", lock_duration=-1)
    with pytest.raises(InvalidOperationError):
        broker.update_queue("orders;poison", lock_duration=5)


def test_a_forwarding_destination_must_exist_and_not_be_the_queue_itself(broker: Broker) -> None:
    with pytest.raises(poisonq.EntityNotFoundError):
        broker.create_queue("orders", forward_to="nowhere")
    with pytest.raises(InvalidOptionError, match="itself"):
        broker.create_queue("orders", forward_dead_lettered_messages_to="orders")


def test_disabled_states_refuse_what_they_say(broker: Broker) -> None:
    broker.create_queue("orders")
    sender, receiver = broker.sender("orders"), broker.receiver("orders")
    broker.set_status("orders", "send_disabled")
    with pytest.raises(EntityDisabledError) as caught:
        sender.send(Message(body=b"x"))
    assert caught.value.status == "send_disabled"
    assert receiver.receive() == []
    broker.set_status("orders", EntityStatus.RECEIVE_DISABLED, cause="operator")
    assert sender.send(Message(body=b"x")) == [1]
    with pytest.raises(EntityDisabledError):
        receiver.receive()
    assert broker.get_queue("orders").status_cause == "operator"
    broker.disable("orders")
    with pytest.raises(EntityDisabledError):
        sender.send(Message(body=b"x"))
    broker.enable("orders")
    assert len(receiver.receive(max_messages=5)) == 1
    with pytest.raises(InvalidOptionError):
        broker.set_status("orders", "paused")


def test_delete_removes_queue_subqueues_and_messages(broker: Broker) -> None:
    broker.create_queue("orders")
    broker.sender("orders").send([Message(body=b"x")] * 3)
    broker.delete_queue("orders")
    with pytest.raises(EntityNotFoundError):
        broker.get_queue("orders/$deadletterqueue")
    with pytest.raises(EntityNotFoundError):
        broker.sender("orders").send(Message(body=b"x"))
    broker.create_queue("orders")
    assert broker.counts("orders")["active"] == 0


def test_a_closed_broker_says_so(url: str) -> None:
    broker = poisonq.connect(url)
    broker.create_queue("orders")
    receiver = broker.receiver("orders")
    broker.close()
    broker.close()  # closing twice is harmless
    for call in (
        lambda: broker.counts("orders"),
        lambda: broker.sender("orders").send(poisonq.Message(body=b"x")),
        lambda: receiver.receive(max_messages=1),
    ):
        with pytest.raises(poisonq.BrokerClosedError, match="is closed"):
            call()
