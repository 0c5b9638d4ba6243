"""Auto-forwarding: moved in the send's transaction, hops counted and limited."""

from __future__ import annotations

import pytest

from poisonq import Broker, EntityNotFoundError, InvalidNameError, InvalidOptionError, Message
from tests.helpers import assert_balanced


def test_forward_to_moves_each_message_in_the_same_transaction_with_its_hop_count(
    broker: Broker,
) -> None:
    broker.create_queue("archive")
    broker.create_queue("orders", forward_to="archive")
    (seq,) = broker.sender("orders").send(Message(body=b"x"))
    assert broker.peek("orders") == []
    [moved] = broker.peek("archive")
    assert (moved.sequence_number, moved.hop_count) == (seq, 1)
    assert broker.get_queue("orders").ledger.moved_out == 1
    assert_balanced(broker)


def test_more_than_4_hops_is_dead_lettered_max_transfer_hop_count_exceeded(
    broker: Broker,
) -> None:
    names = [f"q{n}" for n in range(6)]
    broker.create_queue(names[-1])
    for here, there in zip(reversed(names[:-1]), reversed(names[1:]), strict=True):
        broker.create_queue(here, forward_to=there)
    broker.sender("q0").send(Message(body=b"x"))
    assert broker.peek("q5") == []
    [dead] = broker.peek("q4/$transfer/$deadletterqueue")  # where a 5th hop was refused
    assert dead.dead_letter_reason == "MaxTransferHopCountExceeded"
    assert dead.hop_count == 4
    assert_balanced(broker)


def test_a_disabled_destination_sends_to_the_transfer_dead_letter_queue(broker: Broker) -> None:
    broker.create_queue("archive")
    broker.create_queue("orders", forward_to="archive")
    broker.disable("archive")
    broker.sender("orders").send(Message(body=b"x"))
    [dead] = broker.peek("orders/$transfer/$deadletterqueue")
    assert dead.dead_letter_reason == "TransferFailed" and "disabled" in (
        dead.dead_letter_error_description or ""
    )
    assert_balanced(broker)


def test_a_full_destination_sends_to_the_transfer_dead_letter_queue(broker: Broker) -> None:
    broker.create_queue("archive", max_size=10)
    broker.create_queue("orders", forward_to="archive")
    broker.sender("orders").send(Message(body=b"x" * 20))
    [dead] = broker.peek("orders/$transfer/$deadletterqueue")
    assert "full" in (dead.dead_letter_error_description or "")
    assert_balanced(broker)


def test_a_deleted_destination_makes_the_send_fail(broker: Broker) -> None:
    broker.create_queue("archive")
    broker.create_queue("orders", forward_to="archive")
    broker.delete_queue("archive")
    with pytest.raises(EntityNotFoundError):
        broker.sender("orders").send(Message(body=b"x"))
    assert broker.get_queue("orders").ledger.sent == 0  # nothing was sent
    assert_balanced(broker)


def test_forward_dead_lettered_messages_to_moves_what_is_dead_lettered(broker: Broker) -> None:
    broker.create_queue("poison")
    broker.create_queue("orders", forward_dead_lettered_messages_to="poison")
    broker.sender("orders").send(Message(body=b"x"))
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(), reason="InvalidOrder")
    assert broker.peek("orders/$deadletterqueue") == []
    [moved] = broker.peek("poison")
    assert (moved.state, moved.hop_count, moved.dead_letter_reason) == ("active", 1, "InvalidOrder")
    assert_balanced(broker)


def test_a_topic_or_a_subqueue_is_refused_as_a_forwarding_destination(broker: Broker) -> None:
    broker.create_topic("events")
    broker.create_queue("archive")
    with pytest.raises(InvalidOptionError, match="forward to a queue"):
        broker.create_queue("orders", forward_to="events")
    with pytest.raises(InvalidNameError):
        broker.create_queue("orders", forward_to="archive/$deadletterqueue")
