"""The poison actions (receive_error_handling): fault, drop, reject, move; and a policy for
reading the dead-letter queue itself."""

from __future__ import annotations

import pytest

from poisonq import (
    Broker,
    EntityDisabledError,
    InvalidOperationError,
    InvalidOptionError,
    Message,
    MessageNotFoundError,
    PoisonMessageError,
    ReceivedMessage,
    RetryPolicy,
)
from tests.aio_driver import processor
from tests.helpers import assert_balanced

BOTH_APIS = True  # each test with `broker` runs through the sync API and poisonq.aio (conftest)


def _policy(handling: str, attempts: int = 2) -> RetryPolicy:
    return RetryPolicy(receive_retry_count=attempts - 1, receive_error_handling=handling)  # type: ignore[arg-type]


def _poison(broker: Broker, address: str = "orders", attempts: int = 2) -> list[int]:
    receiver = broker.receiver(address)
    poisoned: list[int] = []
    for _ in range(attempts):
        poisoned += receiver.abandon(receiver.receive(max_messages=10), error=KeyError("cust-17"))
    return poisoned


def test_fault_disables_receive_and_reports_sequence_number(broker: Broker) -> None:
    broker.create_queue("orders", retry=_policy("fault"))
    seqs = broker.sender("orders").send([Message(body=b"bad"), Message(body=b"good")])
    receiver = broker.receiver("orders")
    [bad] = receiver.receive()
    receiver.abandon(bad)
    [bad] = receiver.receive()
    assert receiver.abandon(bad, error=KeyError("cust-17")) == [seqs[0]]
    with pytest.raises(PoisonMessageError) as caught:
        receiver.receive()
    assert caught.value.sequence_number == seqs[0]
    assert isinstance(caught.value, EntityDisabledError)
    info = broker.get_queue("orders")
    assert info.status == "receive_disabled"
    assert info.event is not None and info.event.kind == "fault"
    assert info.event.sequence_number == seqs[0] and "KeyError" in info.event.description
    assert broker.counts("orders")["active"] == 2  # the message stays
    broker.sender("orders").send(Message(body=b"still accepted"))
    assert_balanced(broker)


@pytest.mark.parametrize(
    ("action", "where"), [("move", "dead_lettered"), ("drop", "dropped"), ("resubmit", "active")]
)
def test_an_operator_resolves_a_fault_by_sequence_number(
    broker: Broker, action: str, where: str
) -> None:
    broker.create_queue("orders", retry=_policy("fault"))
    (seq,) = broker.sender("orders").send(Message(body=b"bad"))
    _poison(broker)
    info = broker.resolve_poison("orders", seq, action)
    assert info.status == "active" and info.event is None
    assert broker.counts("orders")[where] == 1
    if action == "resubmit":
        [again] = broker.receiver("orders").receive()
        assert again.sequence_number > seq and again.delivery_count == 1
    with pytest.raises(MessageNotFoundError):
        broker.resolve_poison("orders", seq, action)
    assert_balanced(broker)


def test_messages_poisoned_together_fault_the_queue_in_turn(broker: Broker) -> None:
    broker.create_queue("orders", retry=_policy("fault"))
    first, second, third = broker.sender("orders").send([Message(body=b"bad")] * 3)
    assert _poison(broker) == [first, second, third]  # one batch, poisoned at once
    faulted = broker.get_queue("orders").event
    assert faulted is not None and faulted.sequence_number == first
    assert faulted.pending == (second, third)

    info = broker.resolve_poison("orders", first, "move")
    # Still faulted: the others used every delivery too and must not be delivered again.
    assert info.status == "receive_disabled"
    assert info.event is not None and info.event.sequence_number == second
    with pytest.raises(PoisonMessageError) as caught:
        broker.receiver("orders").receive()
    assert caught.value.sequence_number == second
    broker.resolve_poison("orders", third, "drop")  # any order the operator likes
    info = broker.resolve_poison("orders", second, "resubmit")
    assert info.status == "active" and info.event is None
    [again] = broker.receiver("orders").receive()
    assert again.delivery_count == 1
    counts = broker.counts("orders")
    assert (counts["dead_lettered"], counts["dropped"]) == (1, 1)
    assert_balanced(broker)


def test_drop_removes_counts_and_logs_the_poison_message(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.create_queue("orders", retry=_policy("drop"))
    (seq,) = broker.sender("orders").send(Message(body=b"bad"))
    assert _poison(broker) == [seq]
    assert broker.counts("orders")["dropped"] == 1
    assert broker.peek("orders") == [] and broker.peek("orders/$deadletterqueue") == []
    assert f"[{seq}]" in caplog.text
    assert_balanced(broker)


def test_reject_sends_to_the_reply_to_queues_dead_letter_queue(broker: Broker) -> None:
    broker.create_queue("orders", retry=_policy("reject"))
    broker.create_queue("shop")
    broker.sender("orders").send(Message(body=b"bad", reply_to="shop"))
    _poison(broker)
    [rejected] = broker.peek("shop/$deadletterqueue")
    assert rejected.dead_letter_reason == "Rejected"
    assert rejected.dead_letter_source == "orders"
    assert broker.peek("orders/$deadletterqueue") == []
    assert_balanced(broker)


def test_reject_without_a_sender_queue_goes_to_the_namespace_dead_letter_queue(
    broker: Broker,
) -> None:
    broker.create_queue("orders", retry=_policy("reject"))
    broker.sender("orders").send([Message(body=b"a"), Message(body=b"b", reply_to="gone")])
    _poison(broker)
    rejected = broker.peek("$deadletterqueue")
    assert [r.dead_letter_reason for r in rejected] == ["Rejected", "Rejected"]
    assert broker.counts("$deadletterqueue")["dead_lettered"] == 2
    [queue] = broker.list_queues()  # the namespace dead-letter queue is not a queue
    assert queue.name == "orders"
    assert [g.key for g in broker.dead_letter_groups("$deadletterqueue")] == ["Rejected"]
    with pytest.raises(InvalidOptionError, match="to=QUEUE"):
        broker.resubmit("$deadletterqueue")
    assert broker.resubmit("$deadletterqueue", to="orders", rate=None).done == 2
    assert broker.counts("orders")["active"] == 2
    assert_balanced(broker)


def test_the_namespace_dead_letter_queue_is_never_deleted(broker: Broker) -> None:
    """The namespace dead-letter queue is the store's own, made on a first reject: deleting
    it, by any spelling, before or after it exists, is refused with one message that says
    to purge it, and nothing changes."""
    for name in (
        "$deadletterqueue",
        "$deadletterqueue;poison",
        "$deadletterqueue/$deadletterqueue",
    ):
        with pytest.raises(InvalidOperationError, match="cannot be deleted; purge it"):
            broker.delete_queue(name)
    broker.create_queue("orders", retry=_policy("reject"))
    broker.sender("orders").send(Message(body=b"a"))
    _poison(broker)
    with pytest.raises(InvalidOperationError, match="cannot be deleted; purge it"):
        broker.delete_queue("$deadletterqueue")
    assert broker.counts("$deadletterqueue")["dead_lettered"] == 1
    assert_balanced(broker)


def test_move_dead_letters_with_max_delivery_count_exceeded_and_the_last_error(
    broker: Broker,
) -> None:
    broker.create_queue("orders", retry=_policy("move"))
    broker.sender("orders").send(Message(body=b"bad"))
    _poison(broker)
    [dead] = broker.peek("orders/$deadletterqueue")
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_error_description == "KeyError: 'cust-17'"
    assert_balanced(broker)


def test_reading_the_dead_letter_queue_with_a_policy_counts_only_the_attempts_made_there(
    broker: Broker,
) -> None:
    broker.create_queue("orders", max_delivery_count=3, dead_letter_retry=_policy("drop", 2))
    (seq,) = broker.sender("orders").send(Message(body=b"bad"))
    _poison(broker, attempts=3)
    assert _poison(broker, "orders/$deadletterqueue", attempts=1) == []
    assert broker.counts("orders/$deadletterqueue")["dead_lettered"] == 1
    assert _poison(broker, "orders/$deadletterqueue", attempts=1) == [seq]
    assert broker.counts("orders/$deadletterqueue")["dropped"] == 1
    assert_balanced(broker)


def test_reading_the_dead_letter_queue_with_fault_disables_it(broker: Broker) -> None:
    broker.create_queue("orders", max_delivery_count=1, dead_letter_retry=_policy("fault", 1))
    (seq,) = broker.sender("orders").send(Message(body=b"bad"))
    _poison(broker, attempts=1)
    _poison(broker, "orders/$deadletterqueue", attempts=1)
    with pytest.raises(PoisonMessageError) as caught:
        broker.receiver("orders/$deadletterqueue").receive()
    assert caught.value.sequence_number == seq
    broker.resolve_poison("orders/$deadletterqueue", seq, "resubmit")
    assert broker.counts("orders")["active"] == 1
    assert_balanced(broker)


def test_reading_the_dead_letter_queue_with_reject_moves_it_to_the_senders(
    broker: Broker,
) -> None:
    broker.create_queue("orders", max_delivery_count=1, dead_letter_retry=_policy("reject", 1))
    broker.sender("orders").send(Message(body=b"bad"))
    _poison(broker, attempts=1)
    _poison(broker, "orders/$deadletterqueue", attempts=1)
    [moved] = broker.peek("$deadletterqueue")
    assert moved.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert_balanced(broker)


@pytest.mark.parametrize(
    "policy",
    [_policy("move"), RetryPolicy(max_retry_cycles=1, receive_error_handling="drop")],  # type: ignore[arg-type]
)
def test_move_or_cycles_on_the_dead_letter_queue_is_a_configuration_error(
    broker: Broker, policy: RetryPolicy
) -> None:
    with pytest.raises(InvalidOptionError, match="dead_letter_retry"):
        broker.create_queue("orders", dead_letter_retry=policy)


def test_a_processor_on_a_faulted_queue_stops_with_the_poison_message_error(
    broker: Broker,
) -> None:
    broker.create_queue("orders", retry=_policy("fault", 1))
    seqs = broker.sender("orders").send([Message(body=b"bad"), Message(body=b"good")])
    poisoned: list[int] = []

    def handle(message: ReceivedMessage) -> None:
        raise ValueError("cannot parse")

    pump = processor(
        broker, "orders", handle, on_poison=lambda m, e: poisoned.append(m.sequence_number)
    )
    with pytest.raises(PoisonMessageError) as caught:
        pump.run(until_idle=True)
    assert caught.value.sequence_number == seqs[0] and poisoned == [seqs[0]]
    assert broker.counts("orders")["active"] == 2
    assert_balanced(broker)
