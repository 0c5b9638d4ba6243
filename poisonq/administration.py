"""The administration part of the :class:`~poisonq.Broker` (Service Bus' administration
client): entities and their options, a subscription's rules, status, counts, the audit,
housekeeping and the way out of a fault. Each call checks its arguments and runs one engine
operation."""

from __future__ import annotations

from typing import Any

from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.engine.targets import check_text
from poisonq.errors import InvalidOptionError
from poisonq.filters import Filter, Rule, RuleSet, make_filter
from poisonq.history import Trend
from poisonq.model import EntityKind, EntityStatus, FaultAction, PropertyValue
from poisonq.options import QueueOptions
from poisonq.reports import AuditReport, QueueInfo

MAX_RULE_NAME = 50  # Service Bus' limit on a rule's name


def _rule_name(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_RULE_NAME:
        raise InvalidOptionError(f"a rule name is 1-{MAX_RULE_NAME} characters, not {name!r}")
    check_text(name, "a rule name")
    return name


def _rule(spec: Rule | str | dict[str, PropertyValue] | None) -> Rule:
    rule = make_filter(spec)
    if isinstance(rule, RuleSet):
        raise InvalidOptionError("a rule is one filter, not a set of rules")
    return rule


class Administration:
    """Entities, rules, status, counts, the audit and housekeeping, on the engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create_queue(
        self, /, name: str, *, max_delivery_count: int | None = None, **options: Any
    ) -> QueueInfo:
        """Create a queue (and its subqueues). Options: see :class:`QueueOptions`."""
        built = QueueOptions.build(None, max_delivery_count=max_delivery_count, **options)
        return drive(self.engine.create_queue(name, built))

    def update_queue(
        self, /, name: str, *, max_delivery_count: int | None = None, **options: Any
    ) -> QueueInfo:
        """Change options; ``max_delivery_count`` changes the attempts per cycle and keeps
        the rest of the retry policy (see :meth:`QueueOptions.build`)."""
        if max_delivery_count is not None:
            options["max_delivery_count"] = max_delivery_count
        return drive(self.engine.update_queue(name, **options))

    def create_topic(self, /, name: str, **options: Any) -> QueueInfo:
        """Create a topic: what is sent to it goes to each subscription whose filter matches.
        Options as for a queue (size limits apply to what is sent to the topic)."""
        built = QueueOptions.build(None, **options)
        return drive(self.engine.create_queue(name, built, EntityKind.TOPIC))

    def create_subscription(
        self,
        /,
        topic: str,
        name: str,
        *,
        filter: Filter | str | dict[str, PropertyValue] | None = None,
        dead_letter_on_filter_evaluation_exceptions: bool = False,
        max_delivery_count: int | None = None,
        **options: Any,
    ) -> QueueInfo:
        """Create subscription ``topic/subscriptions/name``: a queue of its own (with its own
        dead-letter queue) receiving a copy of each message sent to the topic that ``filter``
        matches: SQL text (``"region = 'eu' AND amount > 100"``), a dict of properties that
        must all be equal (a correlation filter), or ``None`` for every message. Invalid
        filter text raises :class:`FilterError`."""
        built = QueueOptions.build(None, max_delivery_count=max_delivery_count, **options)
        rule = make_filter(filter)
        flag = dead_letter_on_filter_evaluation_exceptions
        if not isinstance(flag, bool):
            raise InvalidOptionError("dead_letter_on_filter_evaluation_exceptions must be a bool")
        return drive(self.engine.create_subscription(topic, name, built, rule, flag))

    def rules(self, topic: str, subscription: str) -> dict[str, Rule]:
        """Subscription ``topic/subscriptions/subscription``'s rules by name: a message
        sent to the topic reaches it when any of them matches. The filter it was created
        with is its rule ``$Default``."""
        return dict(drive(self.engine.rules(topic, subscription)))

    def create_rule(
        self,
        topic: str,
        subscription: str,
        name: str,
        filter: Rule | str | dict[str, PropertyValue] | None = None,
    ) -> None:
        """Add rule ``name`` to a subscription (``filter`` as for :meth:`create_subscription`;
        ``None`` matches every message); a name it has raises :class:`EntityExistsError`."""
        drive(self.engine.change_rule(topic, subscription, _rule_name(name), _rule(filter), True))

    def update_rule(
        self,
        topic: str,
        subscription: str,
        name: str,
        filter: Rule | str | dict[str, PropertyValue] | None = None,
    ) -> None:
        """Replace rule ``name``'s filter; a rule the subscription does not have raises
        :class:`EntityNotFoundError`."""
        drive(self.engine.change_rule(topic, subscription, _rule_name(name), _rule(filter), False))

    def delete_rule(self, topic: str, subscription: str, name: str) -> None:
        """Remove rule ``name`` (:class:`EntityNotFoundError` if there is none); a
        subscription without rules receives nothing, as in Service Bus."""
        drive(self.engine.change_rule(topic, subscription, _rule_name(name), None, False))

    def resolve_poison(
        self,
        address: str,
        sequence_number: int,
        action: FaultAction = "move",
        *,
        enable: bool = True,
    ) -> QueueInfo:
        """The operator's way out of a fault: ``move`` message ``sequence_number`` to the
        dead-letter queue, ``drop`` it or ``resubmit`` it (fresh delivery count, back of the
        queue), and with ``enable`` make the queue active again, all in one transaction."""
        return drive(self.engine.resolve_poison(address, sequence_number, action, enable))

    def get_queue(self, address: str) -> QueueInfo:
        return drive(self.engine.get_queue(address))

    def list_queues(self) -> list[QueueInfo]:
        return drive(self.engine.list_queues())

    def delete_queue(self, name: str) -> None:
        drive(self.engine.delete_queue(name))

    def entities(self) -> list[QueueInfo]:
        """Every queue and each of its subqueues (dead-letter, retry, transfer dead-letter)
        with counts and ledger, by name: what an operator's overview and metrics show."""
        return drive(self.engine.list_entities())

    def set_status(
        self, address: str, status: EntityStatus | str, cause: str | None = None
    ) -> None:
        try:
            status = EntityStatus(status)
        except ValueError:
            choices = ", ".join(s.value for s in EntityStatus)
            raise InvalidOptionError(f"status must be one of {choices}, not {status!r}") from None
        drive(self.engine.set_status(address, status, cause))

    def enable(self, address: str) -> None:
        self.set_status(address, EntityStatus.ACTIVE)

    def disable(self, address: str) -> None:
        self.set_status(address, EntityStatus.DISABLED)

    def counts(self, address: str) -> dict[str, int]:
        """Messages held by state, plus the dead-letter depth and lifetime completions/drops."""
        return drive(self.engine.counts(address))

    def audit(self) -> AuditReport:
        """Check that every message sent is completed, dropped or still held somewhere."""
        return drive(self.engine.audit())

    def housekeep(self) -> list[str]:
        """Apply what is due on the store's clock (locks that ran out, time-to-lives that
        passed, scheduled messages and retry cycles whose time came, the auto-disable they
        may cause) to every entity, one transaction each; the names of those where
        something was. Every read applies as much for what it reads: this is for time to
        pass where nobody reads (``poisonq housekeep``, the server's loop)."""
        return drive(self.engine.housekeep())

    def queue_trends(self) -> dict[str, Trend]:
        """Every queue's depth and dead-letterings over the last day, by the hour."""
        return drive(self.engine.queue_trends())
