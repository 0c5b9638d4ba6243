"""``azure.servicebus.management`` on poisonq: ``ServiceBusAdministrationClient`` and the
property classes (:mod:`.models`) and rule filters (:mod:`.rules`) it takes and gives."""

from __future__ import annotations

from poisonq.servicebus.management.client import ServiceBusAdministrationClient
from poisonq.servicebus.management.models import (
    ApiVersion,
    EntityStatus,
    QueueProperties,
    QueueRuntimeProperties,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)
from poisonq.servicebus.management.rules import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
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
