"""Retry cycles (WCF/MSMQ): immediate retries, then a wait in the retry subqueue, then poison."""

from __future__ import annotations

import pytest

from poisonq import Broker, InvalidOptionError, ManualClock, Message, RetryPolicy
from poisonq.options import MoveToRetry, Poison, QueueOptions, Redeliver
from tests.conftest import assert_balanced

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
        (6, 2, Poison("fault")),  # type: ignore[arg-type]
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
