"""Names, addresses, durations, options and the retry policy (pure code)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from poisonq import InvalidNameError, InvalidOptionError, QueueOptions, RetryPolicy
from poisonq.model import ReceiveErrorHandling, SubQueue, to_seconds
from poisonq.names import Address, dot_segments, parse_address, subqueue_name, validate_name
from poisonq.options import MoveToRetry, Poison, Redeliver


@pytest.mark.parametrize(
    "name", ["orders", "a", "events/subscriptions/audit", "x.y-z_1", "a" * 260]
)
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "a" * 261, "orders;poison", "has space", "ünïcode", "a//b", "/lead", "trail/", "$dlq", 7],
)
def test_invalid_names_are_refused_with_a_reason(name: object) -> None:
    with pytest.raises(InvalidNameError) as caught:
        validate_name(name)
    assert "invalid entity name" in str(caught.value)


@pytest.mark.parametrize("name", [".", "..", "x/../admin", "x/.", "./x", "a/./b"])
def test_a_new_name_has_no_dot_segment_a_client_would_normalise_away(name: str) -> None:
    """``x/../admin`` in a URL is ``admin`` after a browser or curl normalises it."""
    with pytest.raises(InvalidNameError, match=re.escape("'.' or '..'")):
        validate_name(name)
    assert dot_segments(name)


@pytest.mark.parametrize("name", ["x.y", "...", "a/.b/c", "a/b..", ".hidden"])
def test_dots_inside_a_segment_are_still_a_name(name: str) -> None:
    assert validate_name(name) == name and not dot_segments(name)


def test_an_existing_entity_with_a_dot_segment_is_still_addressed() -> None:
    """A store made before the rule may hold one: it is found, listed and can be deleted."""
    assert parse_address("x/../admin;poison") == Address("x/../admin", SubQueue.DEADLETTER)


@pytest.mark.parametrize(
    ("address", "entity", "subqueue"),
    [
        ("orders", "orders", None),
        ("orders/$deadletterqueue", "orders", SubQueue.DEADLETTER),
        ("orders;poison", "orders", SubQueue.DEADLETTER),
        ("orders;retry", "orders", SubQueue.RETRY),
        ("orders/$transfer/$deadletterqueue", "orders", SubQueue.TRANSFER_DEADLETTER),
        (
            "events/subscriptions/audit/$deadletterqueue",
            "events/subscriptions/audit",
            SubQueue.DEADLETTER,
        ),
    ],
)
def test_addresses_name_subqueues_both_ways(
    address: str, entity: str, subqueue: SubQueue | None
) -> None:
    parsed = parse_address(address)
    assert (parsed.entity, parsed.subqueue) == (entity, subqueue)
    assert parse_address(str(parsed)) == parsed


def test_subqueue_argument_and_its_conflicts() -> None:
    assert parse_address("orders", "deadletter").subqueue is SubQueue.DEADLETTER
    assert subqueue_name("orders", SubQueue.DEADLETTER) == "orders/$deadletterqueue"
    with pytest.raises(InvalidNameError, match="unknown subqueue"):
        parse_address("orders", "poisoned")
    with pytest.raises(InvalidNameError, match="at once"):
        parse_address("orders;retry", "deadletter")


def test_durations_accept_seconds_timedeltas_and_iso_8601_text_only() -> None:
    """Every duration (queue options, lock renewal, waits) is read by one rule: seconds, a
    timedelta, or ISO 8601 text as Service Bus writes it; anything else is refused."""
    assert to_seconds(timedelta(minutes=2), "x") == 120.0
    assert to_seconds(5, "x") == 5.0
    assert to_seconds("PT5M", "x") == 300.0
    assert to_seconds("P1DT2H0.5S", "x") == 93600.5
    assert QueueOptions.build(lock_duration="PT45S").lock_duration == 45.0
    bad_text = ("5", "", "P", "PT", "5 minutes", "PT-5S", "pt5m", "P999999999999D", "P36600D")
    for bad in (-1, float("nan"), float("inf"), 1e300, 2**2000, timedelta.max, True, None):
        with pytest.raises(InvalidOptionError):
            to_seconds(bad, "x")  # type: ignore[arg-type]
    for text in bad_text:
        with pytest.raises(InvalidOptionError):
            to_seconds(text, "x")


def test_option_defaults_follow_the_reference_systems() -> None:
    options = QueueOptions()
    assert options.lock_duration == 60.0
    assert options.max_delivery_count == 10
    assert options.default_message_ttl is None
    assert options.dead_lettering_on_message_expiration is True
    assert (options.requires_duplicate_detection, options.duplicate_detection_window) == (
        False,
        600.0,
    )
    assert options.requires_session is False
    assert (options.max_message_size, options.max_properties_size) == (256 * 1024, 64 * 1024)
    assert options.max_size == 1024**3
    assert options.auto_disable_after_rollbacks is None
    assert options.retry == RetryPolicy.service_bus()


@pytest.mark.parametrize(
    "changes",
    [
        {"lock_duration": 0},
        {"lock_duration": 301},
        {"lock_duration": timedelta(minutes=6)},
        {"default_message_ttl": 0},
        {"duplicate_detection_window": 5},
        {"max_message_size": 0},
        {"requires_session": "yes"},
        {"forward_to": "bad name"},
        {"auto_disable_after_rollbacks": 0},
        {"no_such_option": 1},
    ],
)
def test_bad_options_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises((InvalidOptionError, InvalidNameError)):
        QueueOptions.build(**changes)


def test_max_delivery_count_is_shorthand_for_a_service_bus_policy() -> None:
    options = QueueOptions.build(max_delivery_count=3, lock_duration=timedelta(seconds=30))
    assert options.retry == RetryPolicy(receive_retry_count=2)
    assert options.lock_duration == 30.0
    with pytest.raises(InvalidOptionError, match="not both"):
        QueueOptions.build(max_delivery_count=3, retry=RetryPolicy())
    with pytest.raises(InvalidOptionError):
        QueueOptions.build(max_delivery_count=0)


def test_options_round_trip_through_json() -> None:
    options = QueueOptions.build(max_delivery_count=4, default_message_ttl=60, forward_to="audit")
    assert QueueOptions.from_json(options.to_json()) == options


def test_named_profiles() -> None:
    wcf = RetryPolicy.wcf()
    assert (wcf.receive_retry_count, wcf.max_retry_cycles, wcf.retry_cycle_delay) == (5, 2, 1800.0)
    assert wcf.receive_error_handling is ReceiveErrorHandling.FAULT
    assert wcf.total_attempts == 18
    assert RetryPolicy.service_bus().total_attempts == 10


# (receive_retry_count, cycles, delay, growth, delivery_count, move_count) -> decision
@pytest.mark.parametrize(
    ("policy", "delivery_count", "move_count", "decision"),
    [
        (RetryPolicy.service_bus(3), 1, 0, Redeliver()),
        (RetryPolicy.service_bus(3), 2, 0, Redeliver()),
        (RetryPolicy.service_bus(3), 3, 0, Poison()),
        (RetryPolicy.service_bus(1), 1, 0, Poison()),
        (RetryPolicy(1, 2, 60, 2.0), 1, 0, Redeliver()),
        (RetryPolicy(1, 2, 60, 2.0), 2, 0, MoveToRetry(60.0)),
        (RetryPolicy(1, 2, 60, 2.0), 3, 1, Redeliver()),
        (RetryPolicy(1, 2, 60, 2.0), 4, 1, MoveToRetry(120.0)),
        (RetryPolicy(1, 2, 60, 2.0), 6, 2, Poison()),
        (RetryPolicy.wcf(), 6, 0, MoveToRetry(1800.0)),
        (RetryPolicy.wcf(), 18, 2, Poison()),
        (RetryPolicy(0, 0, receive_error_handling="drop"), 1, 0, Poison()),
    ],
)
def test_retry_policy_decisions(
    policy: RetryPolicy, delivery_count: int, move_count: int, decision: object
) -> None:
    assert policy.decide(delivery_count, move_count) == decision


def test_bad_retry_policies_are_refused() -> None:
    for kwargs in (
        {"receive_retry_count": -1},
        {"max_retry_cycles": 1.5},
        {"retry_cycle_delay_multiplier": 0.5},
        {"receive_error_handling": "explode"},
    ):
        with pytest.raises(InvalidOptionError):
            RetryPolicy(**kwargs)  # type: ignore[arg-type]
