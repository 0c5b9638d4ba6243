"""Retry cycles (WCF/MSMQ): immediate retries, then a wait in the retry subqueue, then poison."""

from __future__ import annotations

from datetime import timedelta

import pytest

from poisonq import Broker, InvalidOptionError, ManualClock, Message, RetryPolicy
from poisonq.options import MoveToRetry, Poison, QueueOptions, Redeliver
from tests.helpers import assert_balanced

RETRY = "orders;retry"


def _fail_once(broker: Broker) -> list[int]:
    receiver = broker.receiver("orders")
    got = receiver.receive(max_messages=10)
    return receiver.abandon(got, error=ValueError("boom")) if got else []


@pytest.mark.parametrize(
    ("delivery_count", "move_count", "decision"),
    [
        (1, 0, Redeliver()),
        (2, 0, MoveToRetry(delay=60.0)),
        (3, 1, Redeliver()),
        (4, 1, MoveToRetry(delay=120.0)),
        (6, 2, Poison()),
    ],
)
def test_policy_decides_from_deliveries_and_cycles(
    delivery_count: int, move_count: int, decision: object
) -> None:
    policy = RetryPolicy(
        receive_retry_count=1,
        max_retry_cycles=2,
        retry_cycle_delay=60,
        retry_cycle_delay_multiplier=2,
        receive_error_handling="fault",  # type: ignore[arg-type]
    )
    assert policy.decide(delivery_count, move_count) == decision


def test_total_attempts_are_retry_count_plus_one_times_cycles_plus_one(
    broker: Broker, clock: ManualClock
) -> None:
    policy = RetryPolicy(receive_retry_count=2, max_retry_cycles=2, retry_cycle_delay=60)
    assert policy.total_attempts == 9
    broker.create_queue("orders", retry=policy)
    (seq,) = broker.sender("orders").send(Message(body=b"x"))
    attempts = 0
    while broker.counts("orders/$deadletterqueue")["dead_lettered"] == 0:
        if _fail_once(broker) is not None and broker.peek(RETRY):
            clock.advance(60 * 4)
        attempts += 1
        assert attempts < 20
    [dead] = broker.peek("orders/$deadletterqueue")
    assert dead.sequence_number == seq
    assert (dead.delivery_count, dead.move_count, dead.abort_count) == (9, 2, 9)
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert "ValueError: boom" in (dead.dead_letter_error_description or "")
    assert_balanced(broker)


def test_a_message_waits_in_the_retry_subqueue_for_the_cycle_delay(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_queue(
        "orders", retry=RetryPolicy(receive_retry_count=0, max_retry_cycles=1, retry_cycle_delay=30)
    )
    (seq,) = broker.sender("orders").send(Message(body=b"x"))
    assert _fail_once(broker) == []
    [parked] = broker.peek(RETRY)
    assert (parked.sequence_number, parked.move_count, parked.state) == (seq, 1, "scheduled")
    assert broker.receiver("orders").receive() == []
    clock.advance(29)
    assert broker.receiver("orders").receive() == []
    clock.advance(1)
    [back] = broker.receiver("orders").receive()
    assert (back.sequence_number, back.delivery_count, back.move_count) == (seq, 2, 1)
    assert broker.peek(RETRY) == []
    assert_balanced(broker)


def test_retry_cycle_delay_grows_per_cycle(broker: Broker, clock: ManualClock) -> None:
    policy = RetryPolicy(
        receive_retry_count=0, max_retry_cycles=2, retry_cycle_delay=10,
        retry_cycle_delay_multiplier=3,
    )  # fmt: skip
    broker.create_queue("orders", retry=policy)
    broker.sender("orders").send(Message(body=b"x"))
    _fail_once(broker)
    clock.advance(10)
    _fail_once(broker)
    clock.advance(29)
    assert broker.receiver("orders").receive() == []
    clock.advance(1)
    assert len(broker.receiver("orders").receive()) == 1


def test_retry_counts_are_kept_durably_on_each_message(url: str, clock: ManualClock) -> None:
    import poisonq

    policy = RetryPolicy(receive_retry_count=0, max_retry_cycles=3, retry_cycle_delay=5)
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders", retry=policy)
        broker.sender("orders").send(Message(body=b"x"))
        _fail_once(broker)
    with poisonq.connect(url, clock=clock) as reopened:
        [parked] = reopened.peek(RETRY)
        assert (parked.abort_count, parked.move_count, parked.delivery_count) == (1, 1, 1)


def test_profiles_follow_the_reference_systems() -> None:
    sb, wcf = RetryPolicy.service_bus(), RetryPolicy.wcf()
    assert (sb.total_attempts, sb.max_retry_cycles, sb.receive_error_handling) == (10, 0, "move")
    assert (wcf.receive_retry_count, wcf.max_retry_cycles, wcf.retry_cycle_delay) == (5, 2, 1800)
    assert wcf.receive_error_handling == "fault" and wcf.total_attempts == 18


def test_max_delivery_count_sets_attempts_per_cycle_and_keeps_the_rest_of_the_policy(
    broker: Broker,
) -> None:
    created = broker.create_queue("orders", max_delivery_count=4)
    assert created.options.retry == RetryPolicy(receive_retry_count=3)
    broker.update_queue("orders", retry=RetryPolicy(receive_error_handling="drop"))  # type: ignore[arg-type]
    updated = broker.update_queue("orders", max_delivery_count=2).options.retry
    assert (updated.receive_retry_count, updated.receive_error_handling) == (1, "drop")
    with pytest.raises(InvalidOptionError, match="either"):
        QueueOptions.build(None, max_delivery_count=2, retry=RetryPolicy())


@pytest.mark.parametrize(
    ("delivery_count", "move_count", "decision"),
    [
        (1, 0, Redeliver(2.0)),
        (2, 0, Redeliver(4.0)),
        (3, 0, Redeliver(5.0)),  # capped at max_redelivery_delay
        (4, 0, MoveToRetry(delay=60.0)),
        (5, 1, Redeliver(2.0)),  # a new cycle starts the backoff again
    ],
)
def test_redelivery_backs_off_within_a_cycle(
    delivery_count: int, move_count: int, decision: object
) -> None:
    policy = RetryPolicy(
        receive_retry_count=3,
        max_retry_cycles=1,
        retry_cycle_delay=60,
        redelivery_delay=2,
        redelivery_delay_multiplier=2,
        max_redelivery_delay=5,
    )
    assert policy.decide(delivery_count, move_count) == decision


def test_an_abandoned_message_comes_back_only_after_its_backoff(
    broker: Broker, clock: ManualClock
) -> None:
    """An abandoned message is delivered again only after its backoff, so a blip of a few
    seconds in a dependency does not use up its deliveries."""
    policy = RetryPolicy(receive_retry_count=3, redelivery_delay=10, redelivery_jitter=0.2)
    broker.create_queue("orders", retry=policy)
    broker.sender("orders").send(Message(body=b"pay"))
    receiver = broker.receiver("orders")
    for attempt, backoff in enumerate((10.0, 20.0, 40.0), start=1):
        [message] = receiver.receive(max_messages=1)
        assert message.delivery_count == attempt
        receiver.abandon(message, error=ConnectionError("503"))
        assert broker.counts("orders")["scheduled"] == 1
        clock.advance(backoff * 0.8 - 0.01)  # within the jitter's reach: still waiting
        assert receiver.receive(max_messages=1) == []
        clock.advance(backoff * 0.4 + 0.02)  # past it
    [message] = receiver.receive(max_messages=1)
    assert message.delivery_count == 4
    assert_balanced(broker)


def test_abandon_with_a_delay_overrides_the_policy_for_one_call(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_queue("orders", max_delivery_count=3)
    broker.sender("orders").send(Message(body=b"x"))
    receiver = broker.receiver("orders")
    [message] = receiver.receive(max_messages=1)
    receiver.abandon(message, delay=timedelta(seconds=30))
    clock.advance(29)
    assert receiver.receive(max_messages=1) == []
    clock.advance(2)
    [again] = receiver.receive(max_messages=1)
    assert (again.sequence_number, again.delivery_count) == (message.sequence_number, 2)
    receiver.abandon(again)  # the policy's own: at once
    assert len(receiver.receive(max_messages=1)) == 1
    with pytest.raises(InvalidOptionError):
        receiver.abandon(again, delay=-1)
    assert_balanced(broker)


def test_sessions_and_subqueues_redeliver_at_once(broker: Broker) -> None:
    """A session's order must not wait on one message's backoff; subqueues never schedule."""
    policy = RetryPolicy(receive_retry_count=3, redelivery_delay=60)
    broker.create_queue("carts", retry=policy, requires_session=True)
    broker.sender("carts").send(
        [Message(body=b"a", session_id="s"), Message(body=b"b", session_id="s")]
    )
    with broker.accept_next_session("carts") as session:
        first, _ = session.receive(max_messages=2)
        session.abandon(first)
    assert broker.counts("carts")["scheduled"] == 0
    assert_balanced(broker)


def test_a_message_parked_for_a_cycle_does_not_delay_the_others_of_its_abandon(
    broker: Broker, clock: ManualClock
) -> None:
    """The state machine found this: abandoned together, a message parked in the retry
    subqueue lent its cycle delay to the next message, which waited instead of coming back."""
    policy = RetryPolicy(receive_retry_count=1, max_retry_cycles=1, retry_cycle_delay=10)
    broker.create_queue("orders", retry=policy)
    first, second = broker.sender("orders").send([Message(body=b"a"), Message(body=b"b")])
    receiver = broker.receiver("orders")
    receiver.abandon(receiver.receive(max_messages=1))  # "a" has one delivery left
    both = receiver.receive(max_messages=2)
    assert [m.sequence_number for m in both] == [first, second]
    receiver.abandon(both)  # "a" to the retry subqueue, "b" back at once
    assert [m.sequence_number for m in receiver.receive(max_messages=2)] == [second]
    assert_balanced(broker)
