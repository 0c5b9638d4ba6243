"""``ServiceBusAdministrationClient``: queues, topics, subscriptions and rules, with their
runtime properties, on the :class:`poisonq.Broker`'s admin operations.

Connected as :class:`~poisonq.servicebus.ServiceBusClient` is: the store URL as the
connection string, opened when first used. A missing entity raises
:class:`~poisonq.servicebus.exceptions.MessagingEntityNotFoundError` and an existing one
:class:`~poisonq.servicebus.exceptions.MessagingEntityAlreadyExistsError` (the SDK raises
azure-core's ``ResourceNotFoundError`` and ``ResourceExistsError`` there).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from poisonq.model import EntityKind
from poisonq.reports import QueueInfo
from poisonq.servicebus.client import ServiceBusClient
from poisonq.servicebus.exceptions import (
    FeatureNotSupportedError,
    MessagingEntityNotFoundError,
    translated,
)
from poisonq.servicebus.management.models import (
    QueueProperties,
    QueueRuntimeProperties,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
    check_flags,
    native_options,
    native_status,
    queue_properties,
    queue_runtime_properties,
    subscription_properties,
    subscription_runtime_properties,
    topic_properties,
    topic_runtime_properties,
)
from poisonq.servicebus.management.rules import (
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    native_rule,
    rule_filter,
)


def _path(topic_name: str, subscription_name: str) -> str:
    return f"{topic_name}/subscriptions/{subscription_name}"


class ServiceBusAdministrationClient:
    """Creates, reads, updates, lists and deletes entities of one store."""

    def __init__(
        self, fully_qualified_namespace: str, credential: object = None, **kwargs: Any
    ) -> None:
        kwargs.pop("api_version", None)  # there is no management REST API to choose
        self._client = ServiceBusClient(fully_qualified_namespace, credential, **kwargs)

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusAdministrationClient:
        return cls(conn_str, **kwargs)

    @classmethod
    def from_broker(cls, broker: Any) -> ServiceBusAdministrationClient:
        """An administration client on a broker already open (poisonq's own)."""
        admin = cls(broker.url)
        admin._client = ServiceBusClient.from_broker(broker)
        return admin

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServiceBusAdministrationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_namespace_properties(self, **kwargs: Any) -> Any:
        raise FeatureNotSupportedError("namespace properties", "a store has no namespace")

    def _info(self, path: str, kind: EntityKind) -> QueueInfo:
        with translated():
            info = self._client.broker().get_queue(path)
        if info.kind is not kind or info.subqueue is not None:
            raise MessagingEntityNotFoundError(message=f"no {kind.value} {path!r}")
        return info

    def _entities(self, kind: EntityKind) -> list[QueueInfo]:
        with translated():
            return [q for q in self._client.broker().list_queues() if q.kind is kind]

    def _create(self, path: str, kind: EntityKind, options: dict[str, Any], **extra: Any) -> None:
        status = native_status(options.pop("status", None))
        kept = native_options(options)
        broker = self._client.broker(create=True)  # making an entity may make the store
        with translated():
            if kind is EntityKind.QUEUE:
                broker.create_queue(path, **kept)
            elif kind is EntityKind.TOPIC:
                broker.create_topic(path, **kept)
            else:
                topic, _, name = path.split("/", 2)
                broker.create_subscription(topic, name.partition("/")[2] or name, **kept, **extra)
            if status is not None:
                broker.set_status(path, status)

    def _update(
        self,
        path: str,
        current: Mapping[str, Any],
        given: Mapping[str, Any],
        changes: dict[str, Any],
    ) -> None:
        wanted = {**dict(given), **changes}
        status = native_status(wanted.pop("status", None))
        kept = native_options({k: v for k, v in wanted.items() if k in current})
        broker = self._client.broker()
        with translated():
            broker.update_queue(path, **kept)
            if status is not None:
                broker.set_status(path, status)

    # Queues -------------------------------------------------------------------------------
    def get_queue(self, queue_name: str, **kwargs: Any) -> QueueProperties:
        return queue_properties(self._info(queue_name, EntityKind.QUEUE))

    def get_queue_runtime_properties(
        self, queue_name: str, **kwargs: Any
    ) -> QueueRuntimeProperties:
        info = self._info(queue_name, EntityKind.QUEUE)
        return queue_runtime_properties(info, self._transfer_dead_letters(info))

    def _transfer_dead_letters(self, info: QueueInfo) -> int:
        with translated():
            transfer = self._client.broker().get_queue(f"{info.name}/$transfer/$deadletterqueue")
        return transfer.counts["dead_lettered"]

    def create_queue(self, queue_name: str, **options: Any) -> QueueProperties:
        self._create(queue_name, EntityKind.QUEUE, options)
        return self.get_queue(queue_name)

    def update_queue(self, queue: QueueProperties | Mapping[str, Any], **kwargs: Any) -> None:
        current = self.get_queue(queue["name"])
        self._update(current.name, current, queue, kwargs)

    def delete_queue(self, queue_name: str, **kwargs: Any) -> None:
        self._info(queue_name, EntityKind.QUEUE)
        with translated():
            self._client.broker().delete_queue(queue_name)

    def list_queues(self, **kwargs: Any) -> Iterator[QueueProperties]:
        return iter([queue_properties(q) for q in self._entities(EntityKind.QUEUE)])

    def list_queues_runtime_properties(self, **kwargs: Any) -> Iterator[QueueRuntimeProperties]:
        return iter(
            [
                queue_runtime_properties(q, self._transfer_dead_letters(q))
                for q in self._entities(EntityKind.QUEUE)
            ]
        )

    # Topics -------------------------------------------------------------------------------
    def get_topic(self, topic_name: str, **kwargs: Any) -> TopicProperties:
        return topic_properties(self._info(topic_name, EntityKind.TOPIC))

    def get_topic_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> TopicRuntimeProperties:
        return self._topic_runtime(self._info(topic_name, EntityKind.TOPIC))

    def _topic_runtime(self, info: QueueInfo) -> TopicRuntimeProperties:
        prefix = f"{info.name}/subscriptions/"
        subscriptions = self._entities(EntityKind.SUBSCRIPTION)
        return topic_runtime_properties(
            info, [s for s in subscriptions if s.name.startswith(prefix)]
        )

    def create_topic(self, topic_name: str, **options: Any) -> TopicProperties:
        self._create(topic_name, EntityKind.TOPIC, options)
        return self.get_topic(topic_name)

    def update_topic(self, topic: TopicProperties | Mapping[str, Any], **kwargs: Any) -> None:
        current = self.get_topic(topic["name"])
        self._update(current.name, current, topic, kwargs)

    def delete_topic(self, topic_name: str, **kwargs: Any) -> None:
        self._info(topic_name, EntityKind.TOPIC)
        with translated():
            self._client.broker().delete_queue(topic_name)

    def list_topics(self, **kwargs: Any) -> Iterator[TopicProperties]:
        return iter([topic_properties(t) for t in self._entities(EntityKind.TOPIC)])

    def list_topics_runtime_properties(self, **kwargs: Any) -> Iterator[TopicRuntimeProperties]:
        return iter([self._topic_runtime(t) for t in self._entities(EntityKind.TOPIC)])

    # Subscriptions ------------------------------------------------------------------------
    @staticmethod
    def _on_filter_errors(info: QueueInfo) -> bool:
        return info.dead_letter_on_filter_exceptions

    def get_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionProperties:
        info = self._info(_path(topic_name, subscription_name), EntityKind.SUBSCRIPTION)
        return subscription_properties(info, self._on_filter_errors(info))

    def get_subscription_runtime_properties(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionRuntimeProperties:
        info = self._info(_path(topic_name, subscription_name), EntityKind.SUBSCRIPTION)
        return subscription_runtime_properties(info, self._transfer_dead_letters(info))

    def create_subscription(
        self, topic_name: str, subscription_name: str, **options: Any
    ) -> SubscriptionProperties:
        check_flags(options)
        flag = options.pop("dead_lettering_on_filter_evaluation_exceptions", None)
        extra = {} if flag is None else {"dead_letter_on_filter_evaluation_exceptions": flag}
        self._create(
            _path(topic_name, subscription_name), EntityKind.SUBSCRIPTION, options, **extra
        )
        return self.get_subscription(topic_name, subscription_name)

    def update_subscription(
        self,
        topic_name: str,
        subscription: SubscriptionProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        current = self.get_subscription(topic_name, subscription["name"])
        wanted = {**dict(subscription), **kwargs}
        flag = wanted.get("dead_lettering_on_filter_evaluation_exceptions")
        if flag is not None and flag != current["dead_lettering_on_filter_evaluation_exceptions"]:
            raise FeatureNotSupportedError(
                "changing dead_lettering_on_filter_evaluation_exceptions",
                "it is set when the subscription is created",
            )
        self._update(_path(topic_name, current.name), current, wanted, {})

    def delete_subscription(self, topic_name: str, subscription_name: str, **kwargs: Any) -> None:
        path = _path(topic_name, subscription_name)
        self._info(path, EntityKind.SUBSCRIPTION)
        with translated():
            self._client.broker().delete_queue(path)

    def list_subscriptions(
        self, topic_name: str, **kwargs: Any
    ) -> Iterator[SubscriptionProperties]:
        return iter(
            [
                subscription_properties(s, self._on_filter_errors(s))
                for s in self._subscriptions(topic_name)
            ]
        )

    def list_subscriptions_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> Iterator[SubscriptionRuntimeProperties]:
        return iter(
            [
                subscription_runtime_properties(s, self._transfer_dead_letters(s))
                for s in self._subscriptions(topic_name)
            ]
        )

    def _subscriptions(self, topic_name: str) -> list[QueueInfo]:
        self._info(topic_name, EntityKind.TOPIC)
        prefix = f"{topic_name}/subscriptions/"
        return [s for s in self._entities(EntityKind.SUBSCRIPTION) if s.name.startswith(prefix)]

    # Rules --------------------------------------------------------------------------------
    def _rules(self, topic_name: str, subscription_name: str) -> dict[str, Any]:
        with translated():
            return self._client.broker().rules(topic_name, subscription_name)

    def get_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> RuleProperties:
        rules = self._rules(topic_name, subscription_name)
        if rule_name not in rules:
            raise MessagingEntityNotFoundError(
                message=f"no rule {rule_name!r} on {_path(topic_name, subscription_name)!r}"
            )
        return RuleProperties(rule_name, filter=rule_filter(rules[rule_name]))

    def list_rules(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> Iterator[RuleProperties]:
        rules = self._rules(topic_name, subscription_name)
        return iter(
            [RuleProperties(name, filter=rule_filter(rule)) for name, rule in rules.items()]
        )

    def create_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule_name: str,
        *,
        filter: RuleFilter | None = None,
        action: SqlRuleAction | None = None,
        **kwargs: Any,
    ) -> RuleProperties:
        rule = native_rule(filter, action)
        with translated():
            self._client.broker().create_rule(topic_name, subscription_name, rule_name, rule)
        return self.get_rule(topic_name, subscription_name, rule_name)

    def update_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule: RuleProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        wanted = {**dict(rule), **kwargs}
        native = native_rule(wanted.get("filter"), wanted.get("action"))
        with translated():
            self._client.broker().update_rule(topic_name, subscription_name, wanted["name"], native)

    def delete_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> None:
        with translated():
            self._client.broker().delete_rule(topic_name, subscription_name, rule_name)
