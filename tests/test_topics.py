"""Topics and subscriptions: a copy to each matching subscription, filters never eval'd."""

from __future__ import annotations

import pytest

from poisonq import (
    Broker,
    EntityExistsError,
    EntityNotFoundError,
    FilterError,
    InvalidOperationError,
    Message,
    SqlFilter,
)
from poisonq.filters import CorrelationFilter, FilterEvaluationError
from tests.helpers import assert_balanced

EU = "events/subscriptions/eu"
ALL = "events/subscriptions/all"


@pytest.mark.parametrize(
    ("expression", "values", "expected"),
    [
        ("region = 'eu'", {"region": "eu"}, True),
        ("region = 'eu'", {}, False),
        ("region != 'eu'", {"region": "us"}, True),
        ("region <> 'eu'", {"region": "eu"}, False),
        ("amount >= 100 AND amount < 200.5", {"amount": 150}, True),
        ("NOT (amount > 1)", {"amount": 0}, True),
        ("a = 1 OR b = 2", {"b": 2}, True),
        ("priority IN ('high', 'urgent')", {"priority": "urgent"}, True),
        ("priority NOT IN ('high', 'urgent')", {"priority": "low"}, True),
        ("coupon IS NULL", {}, True),
        ("coupon IS NOT NULL", {"coupon": "x"}, True),
        ("EXISTS(coupon)", {"coupon": None}, True),
        ("flag", {"flag": True}, True),
        ("flag = FALSE", {"flag": False}, True),
        ("name = 'it''s'", {"name": "it's"}, True),
        ("sys.subject = 'order'", {"sys.subject": "order"}, True),
        ("missing > 3", {}, False),  # unknown is not a match
    ],
)
def test_sql_filters_evaluate_a_small_boolean_language(
    expression: str, values: dict[str, object], expected: bool
) -> None:
    assert SqlFilter(expression).matches(values) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "region =",
        "a = = 1",
        "__import__('os')",
        "a IN 1",
        "(a = 1",
        "a = 1 b",
        "sys.nope = 1",
        "a ; 1",
        "",
        "  ",
        "(" * 400 + "a" + ")" * 400,  # the parser's recursion ran out (RecursionError)
        "NOT " * 33 + "a",
    ],
)
def test_invalid_filter_text_is_refused_with_a_typed_error(text: str) -> None:
    with pytest.raises(FilterError):
        SqlFilter(text)


def test_a_long_chain_is_evaluated_without_recursing_per_operand() -> None:
    """Each OR was a node calling the one before: 3000 of them raised RecursionError when
    a message was matched, inside the send."""
    chain = SqlFilter(" OR ".join(["a = 1"] * 3000) + " OR a = 2")
    assert chain.matches({"a": 2}) and not chain.matches({"a": 3})
    assert SqlFilter(" AND ".join(["a = 2"] * 100)).matches({"a": 2})
    assert not SqlFilter("a = 2 AND b = 1").matches({"a": 2})  # unknown is not a match


def test_a_comparison_of_incompatible_types_is_an_evaluation_error() -> None:
    with pytest.raises(FilterEvaluationError):
        SqlFilter("amount > 1").matches({"amount": "many"})
    with pytest.raises(FilterEvaluationError):  # was a TypeError
        SqlFilter("amount < ''").matches({"amount": b"not a property type"})  # type: ignore[dict-item]


def test_correlation_filters_are_property_equality() -> None:
    rule = CorrelationFilter({"region": "eu", "sys.subject": "order"})
    assert rule.matches({"region": "eu", "sys.subject": "order", "x": 1})
    assert not rule.matches({"region": "eu"})


def test_a_send_to_a_topic_reaches_every_subscription_whose_filter_matches(
    broker: Broker,
) -> None:
    broker.create_topic("events")
    broker.create_subscription("events", "eu", filter="region = 'eu'")
    broker.create_subscription("events", "orders", filter={"sys.subject": "order"})
    broker.create_subscription("events", "all")
    broker.sender("events").send(
        [
            Message(body=b"1", subject="order", properties={"region": "eu"}),
            Message(body=b"2", subject="refund", properties={"region": "us"}),
        ]
    )
    assert [m.text for m in broker.peek(EU)] == ["1"]
    assert [m.text for m in broker.peek("events/subscriptions/orders")] == ["1"]
    assert [m.text for m in broker.peek(ALL)] == ["1", "2"]
    kinds = {q.name: q.kind for q in broker.list_queues()}
    assert kinds == {"events": "topic", EU: "subscription", ALL: "subscription",
                     "events/subscriptions/orders": "subscription"}  # fmt: skip
    with pytest.raises(InvalidOperationError):
        broker.receiver("events").receive()
    assert_balanced(broker)


def test_a_filter_that_fails_dead_letters_the_message_when_the_subscription_asks(
    broker: Broker,
) -> None:
    broker.create_topic("events")
    broker.create_subscription(
        "events", "strict", filter="amount > 10", dead_letter_on_filter_evaluation_exceptions=True
    )
    broker.create_subscription("events", "lenient", filter="amount > 10")
    broker.sender("events").send(Message(body=b"x", properties={"amount": "lots"}))
    [dead] = broker.peek("events/subscriptions/strict/$deadletterqueue")
    assert dead.dead_letter_reason == "FilterEvaluationException"
    assert broker.counts("events/subscriptions/lenient")["active"] == 0
    assert_balanced(broker)


def test_each_subscription_has_its_own_dead_letter_queue(broker: Broker) -> None:
    broker.create_topic("events")
    broker.create_subscription("events", "eu", max_delivery_count=1)
    broker.create_subscription("events", "all")
    broker.sender("events").send(Message(body=b"x"))
    receiver = broker.receiver(EU)
    receiver.abandon(receiver.receive(), error=ValueError("bad"))
    assert len(broker.peek(f"{EU}/$deadletterqueue")) == 1
    assert broker.peek(f"{ALL}/$deadletterqueue") == []
    assert broker.counts(ALL)["active"] == 1
    broker.delete_queue("events")
    assert broker.list_queues() == []
    assert_balanced(broker)


def test_invalid_filters_and_topics_are_refused_at_create_time(broker: Broker) -> None:
    broker.create_queue("orders")
    with pytest.raises(InvalidOperationError):
        broker.create_subscription("orders", "x")
    broker.create_topic("events")
    with pytest.raises(FilterError):
        broker.create_subscription("events", "x", filter="region = ")


def test_duplicate_detection_on_a_topic_ignores_an_id_seen_in_the_window(broker: Broker) -> None:
    broker.create_topic("events", requires_duplicate_detection=True)
    broker.create_subscription("events", "all")
    broker.sender("events").send([Message(body=b"1", message_id="e-1")] * 2)
    broker.sender("events").send(Message(body=b"1", message_id="e-1"))
    assert broker.counts(ALL)["active"] == 1
    assert_balanced(broker)


def test_a_subscriptions_rules_let_in_what_any_of_them_matches(broker: Broker) -> None:
    """Rules on an existing subscription (Service Bus): the filter it was created with is
    rule ``$Default``; a message reaches it when any rule matches, and nothing does once it
    has no rule. Each change is one transaction on the subscription's options."""
    broker.create_topic("events")
    broker.create_subscription("events", "eu", filter="region = 'eu'")
    assert list(broker.rules("events", "eu")) == ["$Default"]
    broker.create_rule("events", "eu", "refunds", {"sys.subject": "refund"})
    with pytest.raises(EntityExistsError):
        broker.create_rule("events", "eu", "refunds")
    sender = broker.sender("events")
    sender.send(Message(body=b"1", properties={"region": "eu"}))
    sender.send(Message(body=b"2", subject="refund"))
    sender.send(Message(body=b"3", properties={"region": "us"}))
    assert broker.counts(EU)["active"] == 2
    broker.update_rule("events", "eu", "refunds", "region = 'us'")
    broker.delete_rule("events", "eu", "$Default")
    sender.send(Message(body=b"4", properties={"region": "us"}))
    assert broker.counts(EU)["active"] == 3
    broker.delete_rule("events", "eu", "refunds")
    assert broker.rules("events", "eu") == {}
    sender.send(Message(body=b"5", properties={"region": "us"}))
    assert broker.counts(EU)["active"] == 3
    with pytest.raises(EntityNotFoundError):
        broker.delete_rule("events", "eu", "refunds")
    with pytest.raises(EntityNotFoundError):
        broker.create_rule("events", "us", "x")  # no such subscription
    assert_balanced(broker)
