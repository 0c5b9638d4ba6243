"""``azure.servicebus.management`` on poisonq: ``ServiceBusAdministrationClient`` and the
property classes and rule filters it takes and gives (:mod:`.models`)."""

from __future__ import annotations

from poisonq.servicebus.management.client import ServiceBusAdministrationClient
from poisonq.servicebus.management.models import (
    ApiVersion,
    CorrelationRuleFilter,
    EntityStatus,
    FalseRuleFilter,
    QueueProperties,
    QueueRuntimeProperties,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
    TrueRuleFilter,
)

__all__ = [
    "ApiVersion",
    "CorrelationRuleFilter",
    "EntityStatus",
    "FalseRuleFilter",
    "QueueProperties",
    "QueueRuntimeProperties",
    "RuleProperties",
    "ServiceBusAdministrationClient",
    "SqlRuleAction",
    "SqlRuleFilter",
    "SubscriptionProperties",
    "SubscriptionRuntimeProperties",
    "TopicProperties",
    "TopicRuntimeProperties",
    "TrueRuleFilter",
]
