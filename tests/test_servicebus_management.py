"""poisonq.servicebus.management's rules, on both stores and through both the sync and the
asyncio administration client: Service Bus' options, runtime properties and rules as poisonq
keeps them."""

from __future__ import annotations

import asyncio
import datetime
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from poisonq import Broker, EntityDisabledError, ManualClock, Message
from poisonq.aio import AsyncBroker
from poisonq.servicebus import exceptions as sb
from poisonq.servicebus.aio import management as aio_management
from poisonq.servicebus.management import (
    CorrelationRuleFilter,
    EntityStatus,
    FalseRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from tests.helpers import assert_balanced


class ThroughAsyncio:
    """The asyncio client driven call by call from a sync test: each coroutine run to its
    end on one event loop, each listing read whole."""

    def __init__(
        self, admin: aio_management.ServiceBusAdministrationClient, runner: asyncio.Runner
    ) -> None:
        self._admin, self._runner = admin, runner

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = getattr(self._admin, name)(*args, **kwargs)
            if inspect.isasyncgen(result):
                return iter(self._runner.run(_read(result)))
            return self._runner.run(result)

        return call


async def _read(listing: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in listing]


@pytest.fixture(params=["sync", "asyncio"])
def admin(broker: Broker, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The administration client, sync or asyncio (``poisonq.servicebus.aio.management``):
    every rule holds through both."""
    if request.param == "sync":
        with ServiceBusAdministrationClient.from_broker(broker) as opened:
            yield opened
        return
    with asyncio.Runner() as runner:
        async_broker = AsyncBroker(broker, 1)
        admin = aio_management.ServiceBusAdministrationClient.from_broker(async_broker)
        try:
            yield ThroughAsyncio(admin, runner)
        finally:
            runner.run(admin.close())
            async_broker.calls.close()


def test_queue_options_are_kept_under_their_service_bus_names(
    admin: ServiceBusAdministrationClient, broker: Broker
) -> None:
    created = admin.create_queue(
        "orders",
        lock_duration="PT45S",
        max_delivery_count=4,
        default_message_time_to_live=datetime.timedelta(hours=1),
        max_size_in_megabytes=10,
        max_message_size_in_kilobytes=64,
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window="PT5M",
        auto_delete_on_idle="P10675199DT2H48M5.4775807S",  # never, Service Bus' default
        enable_partitioning=False,
    )
    assert created.lock_duration == datetime.timedelta(seconds=45)
    assert created.default_message_time_to_live == datetime.timedelta(hours=1)
    assert (created.max_delivery_count, created.max_size_in_megabytes) == (4, 10)
    options = broker.get_queue("orders").options
    assert (options.max_message_size, options.duplicate_detection_window) == (65536, 300)
    admin.update_queue(created, status=EntityStatus.SEND_DISABLED)
    assert admin.get_queue("orders").status is EntityStatus.SEND_DISABLED
    with pytest.raises(EntityDisabledError):
        broker.sender("orders").send(Message(body=b"x"))


def test_options_without_meaning_here_are_refused_by_name(
    admin: ServiceBusAdministrationClient,
) -> None:
    for option in (
        {"enable_partitioning": True},
        {"auto_delete_on_idle": datetime.timedelta(minutes=5)},
        {"user_metadata": "owner: team a"},
    ):
        with pytest.raises(sb.FeatureNotSupportedError, match=next(iter(option))):
            admin.create_queue("orders", **option)
    with pytest.raises(TypeError, match="colour"):
        admin.create_queue("orders", colour="blue")
    assert list(admin.list_queues()) == []


@pytest.mark.parametrize(
    "flag",
    [
        "requires_session",
        "dead_lettering_on_message_expiration",
        "requires_duplicate_detection",
        "enable_batched_operations",
    ],
)
@pytest.mark.parametrize("value", ["false", "no", 0])
def test_a_boolean_property_that_is_not_a_bool_is_refused_naming_it(
    admin: ServiceBusAdministrationClient, flag: str, value: object
) -> None:
    """A boolean entity property is a bool (``"false"`` is truthy): anything else is a
    TypeError naming it, on create and update, sync and asyncio, and nothing is made."""
    with pytest.raises(TypeError, match=flag):
        admin.create_queue("orders", **{flag: value})
    assert list(admin.list_queues()) == []
    created = admin.create_queue("orders")
    with pytest.raises(TypeError, match=flag):
        admin.update_queue(created, **{flag: value})
    assert admin.get_queue("orders")["requires_session"] is False
    if flag != "requires_session":
        with pytest.raises(TypeError, match=flag):
            admin.create_topic("events", **{flag: value})
    admin.create_topic("news")
    with pytest.raises(TypeError, match="dead_lettering_on_filter_evaluation_exceptions"):
        admin.create_subscription(
            "news", "all", dead_lettering_on_filter_evaluation_exceptions=value
        )


def test_runtime_properties_count_as_service_bus_does(
    admin: ServiceBusAdministrationClient, broker: Broker, clock: ManualClock
) -> None:
    """Active counts the locked messages too; the total, every message held with the dead
    letters; the size is the bytes held."""
    admin.create_queue("orders")
    sender = broker.sender("orders")
    sender.send([Message(body=b"abcd") for _ in range(4)])
    later = datetime.datetime.fromtimestamp(clock.now(), datetime.UTC) + datetime.timedelta(hours=1)
    sender.schedule(Message(body=b"abcd"), later)
    receiver = broker.receiver("orders")
    first, _locked = receiver.receive(max_messages=2)
    receiver.dead_letter(first, reason="Bad")
    runtime = admin.get_queue_runtime_properties("orders")
    assert (runtime.active_message_count, runtime.scheduled_message_count) == (3, 1)
    assert (runtime.dead_letter_message_count, runtime.total_message_count) == (1, 5)
    assert runtime.size_in_bytes == 4 * 4  # the dead letter is in its subqueue
    assert [r.name for r in admin.list_queues_runtime_properties()] == ["orders"]
    assert_balanced(broker)


def test_a_topic_counts_its_subscriptions_and_a_subscription_its_messages(
    admin: ServiceBusAdministrationClient, broker: Broker
) -> None:
    admin.create_topic("events")
    admin.create_subscription("events", "eu", dead_lettering_on_filter_evaluation_exceptions=True)
    admin.create_subscription("events", "all")
    broker.sender("events").send(Message(body=b"x"))
    admin.create_rule("events", "eu", "refunds", filter=CorrelationRuleFilter(label="refund"))
    runtime = admin.get_topic_runtime_properties("events")
    assert (runtime.subscription_count, runtime.sql_filter_count) == (2, 2)  # the $Defaults
    assert runtime.correlation_filter_count == 1
    eu = admin.get_subscription("events", "eu")
    assert (eu.name, eu.dead_lettering_on_filter_evaluation_exceptions) == ("eu", True)
    assert admin.get_subscription_runtime_properties("events", "all").active_message_count == 1
    with pytest.raises(sb.FeatureNotSupportedError):
        admin.update_subscription(
            "events",
            admin.get_subscription("events", "all"),
            dead_lettering_on_filter_evaluation_exceptions=True,
        )
    with pytest.raises(sb.MessagingEntityNotFoundError):
        admin.get_queue("events")  # a topic is no queue
    with pytest.raises(sb.MessagingEntityAlreadyExistsError):
        admin.create_topic("events")
    admin.delete_topic("events")
    assert list(admin.list_topics()) == []


def test_rule_filters_map_to_poisonqs_filters_and_back(
    admin: ServiceBusAdministrationClient, broker: Broker
) -> None:
    """SQL filters get their parameters as literals (text quoted), correlation filters
    compare the broker fields and properties, a false filter lets nothing in, and rule
    actions are refused by name."""
    admin.create_topic("events")
    admin.create_subscription("events", "s")
    admin.delete_rule("events", "s", "$Default")
    admin.create_rule(
        "events",
        "s",
        "named",
        filter=SqlRuleFilter("owner = @owner AND n > @n", parameters={"@owner": "o'k", "@n": 2}),
    )
    admin.create_rule(
        "events",
        "s",
        "refunds",
        filter=CorrelationRuleFilter(label="refund", properties={"eu": True}),
    )
    admin.create_rule("events", "s", "never", filter=FalseRuleFilter())
    admin.create_rule("events", "s", "billing", filter=CorrelationRuleFilter(to="billing"))
    rules = {r.name: r.filter for r in admin.list_rules("events", "s")}
    assert rules == {
        "named": SqlRuleFilter("owner = 'o''k' AND n > 2"),
        "refunds": CorrelationRuleFilter(label="refund", properties={"eu": True}),
        "never": FalseRuleFilter(),
        "billing": CorrelationRuleFilter(to="billing"),
    }
    sender = broker.sender("events")
    sender.send(Message(body=b"1", properties={"owner": "o'k", "n": 3}))
    sender.send(Message(body=b"2", subject="refund", properties={"eu": True}))
    sender.send(Message(body=b"3", subject="refund"))
    sender.send(Message(body=b"4", to="billing"))
    assert broker.counts("events/subscriptions/s")["active"] == 3
    with pytest.raises(sb.FeatureNotSupportedError, match="rule actions"):
        admin.create_rule(
            "events", "s", "a", filter=TrueRuleFilter(), action=SqlRuleAction("SET x = 1")
        )
    with pytest.raises(sb.MessagingEntityNotFoundError):
        admin.get_rule("events", "s", "$Default")
    assert_balanced(broker)
