"""The property classes of ``azure.servicebus.management`` (queues, topics, subscriptions
and their runtime properties), and their conversion to and from poisonq's entity options and
reports. No I/O: the asyncio flavour shares this module.

An option poisonq keeps maps to one of :class:`poisonq.QueueOptions`; one that has no meaning
here is accepted at the value Service Bus gives it by default (``auto_delete_on_idle`` never,
no partitioning) and refused by name otherwise
(:class:`~poisonq.servicebus.exceptions.FeatureNotSupportedError`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Mapping
from enum import StrEnum
from typing import Any

from poisonq.filters import (
    CorrelationFilter,
    RuleSet,
    filter_from_json,
)
from poisonq.model import EntityStatus as NativeStatus
from poisonq.model import iso_duration
from poisonq.reports import QueueInfo
from poisonq.servicebus.exceptions import FeatureNotSupportedError

MIB = 1024 * 1024
NEVER = datetime.timedelta(days=10675199, seconds=10085, microseconds=477580)
"""Service Bus' ``TimeSpan.MaxValue``: a time to live (or idle time) that never ends."""


class EntityStatus(StrEnum):
    ACTIVE = "Active"
    DISABLED = "Disabled"
    SEND_DISABLED = "SendDisabled"
    RECEIVE_DISABLED = "ReceiveDisabled"


STATUSES = {
    NativeStatus.ACTIVE: EntityStatus.ACTIVE,
    NativeStatus.DISABLED: EntityStatus.DISABLED,
    NativeStatus.SEND_DISABLED: EntityStatus.SEND_DISABLED,
    NativeStatus.RECEIVE_DISABLED: EntityStatus.RECEIVE_DISABLED,
}


class ApiVersion(StrEnum):
    """Accepted without effect: there is no management REST API under poisonq."""

    V2024_05 = "2024-05"
    V2021_05 = "2021-05"
    V2017_04 = "2017-04"


def duration(value: datetime.timedelta | str | float, what: str) -> datetime.timedelta:
    """A duration as the SDK takes it: a timedelta or ISO 8601 text (``"PT30S"``)."""
    if isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.timedelta(seconds=value)
    if isinstance(value, str) and (parsed := iso_duration(value)) is not None:
        return parsed
    raise ValueError(f"{what} is a timedelta or an ISO 8601 duration (PT30S), not {value!r}")


class Properties(Mapping[str, Any]):
    """Fields as attributes, and as a mapping (``update_queue`` takes either)."""

    FIELDS: tuple[str, ...] = ()

    def __init__(self, name: str, **fields: Any) -> None:
        unknown = set(fields) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no {sorted(unknown)}")
        self.name = name
        for field in self.FIELDS:
            setattr(self, field, fields.get(field))

    def __getitem__(self, key: str) -> Any:
        if key != "name" and key not in self.FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(("name", *self.FIELDS))

    def __len__(self) -> int:
        return 1 + len(self.FIELDS)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"


class QueueProperties(Properties):
    FIELDS = (
        "authorization_rules",
        "auto_delete_on_idle",
        "dead_lettering_on_message_expiration",
        "default_message_time_to_live",
        "duplicate_detection_history_time_window",
        "availability_status",
        "enable_batched_operations",
        "enable_express",
        "enable_partitioning",
        "lock_duration",
        "max_delivery_count",
        "max_size_in_megabytes",
        "requires_duplicate_detection",
        "requires_session",
        "status",
        "forward_to",
        "user_metadata",
        "forward_dead_lettered_messages_to",
        "max_message_size_in_kilobytes",
    )


class TopicProperties(Properties):
    FIELDS = (
        "default_message_time_to_live",
        "max_size_in_megabytes",
        "requires_duplicate_detection",
        "duplicate_detection_history_time_window",
        "enable_batched_operations",
        "size_in_bytes",
        "authorization_rules",
        "status",
        "support_ordering",
        "auto_delete_on_idle",
        "enable_partitioning",
        "availability_status",
        "enable_express",
        "user_metadata",
        "max_message_size_in_kilobytes",
    )


class SubscriptionProperties(Properties):
    FIELDS = (
        "lock_duration",
        "requires_session",
        "default_message_time_to_live",
        "dead_lettering_on_message_expiration",
        "dead_lettering_on_filter_evaluation_exceptions",
        "max_delivery_count",
        "enable_batched_operations",
        "status",
        "forward_to",
        "user_metadata",
        "forward_dead_lettered_messages_to",
        "auto_delete_on_idle",
        "availability_status",
    )


class QueueRuntimeProperties(Properties):
    FIELDS = (
        "accessed_at_utc",
        "created_at_utc",
        "updated_at_utc",
        "size_in_bytes",
        "total_message_count",
        "active_message_count",
        "dead_letter_message_count",
        "scheduled_message_count",
        "transfer_dead_letter_message_count",
        "transfer_message_count",
    )


class TopicRuntimeProperties(Properties):
    FIELDS = (
        "accessed_at_utc",
        "created_at_utc",
        "updated_at_utc",
        "size_in_bytes",
        "subscription_count",
        "sql_filter_count",
        "correlation_filter_count",
        "scheduled_message_count",
    )


class SubscriptionRuntimeProperties(Properties):
    FIELDS = (
        "accessed_at_utc",
        "created_at_utc",
        "updated_at_utc",
        "total_message_count",
        "active_message_count",
        "dead_letter_message_count",
        "transfer_dead_letter_message_count",
        "transfer_message_count",
    )


# The options poisonq keeps, by the SDK's name: poisonq's name, and the conversion.
def _seconds(value: Any) -> float:
    return duration(value, "a duration").total_seconds()


def _ttl(value: Any) -> float | None:
    seconds = _seconds(value)
    return None if seconds >= NEVER.total_seconds() - 1 else seconds


KEPT: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "lock_duration": ("lock_duration", _seconds),
    "max_delivery_count": ("max_delivery_count", int),
    "default_message_time_to_live": ("default_message_ttl", _ttl),
    "dead_lettering_on_message_expiration": ("dead_lettering_on_message_expiration", bool),
    "duplicate_detection_history_time_window": ("duplicate_detection_window", _seconds),
    "requires_duplicate_detection": ("requires_duplicate_detection", bool),
    "requires_session": ("requires_session", bool),
    "forward_to": ("forward_to", str),
    "forward_dead_lettered_messages_to": ("forward_dead_lettered_messages_to", str),
    "max_size_in_megabytes": ("max_size", lambda mb: int(mb) * MIB),
    "max_message_size_in_kilobytes": ("max_message_size", lambda kb: int(kb) * 1024),
}
# Options without meaning here, each with the test a value passes to be accepted.
WITHOUT_MEANING: dict[str, Callable[[Any], bool]] = {
    "auto_delete_on_idle": lambda v: _seconds(v) >= NEVER.total_seconds() - 1,
    "enable_partitioning": lambda v: not v,
    "enable_express": lambda v: not v,
    "authorization_rules": lambda v: not v,
    "user_metadata": lambda v: v is None,
    "enable_batched_operations": lambda v: True,
    "support_ordering": lambda v: True,
    "availability_status": lambda v: True,
    "size_in_bytes": lambda v: True,  # read-only
}


# The SDK's boolean entity properties: each a bool or None (not given), never text.
FLAGS = frozenset(
    {
        "dead_lettering_on_message_expiration",
        "dead_lettering_on_filter_evaluation_exceptions",
        "requires_duplicate_detection",
        "requires_session",
        "enable_batched_operations",
        "enable_partitioning",
        "enable_express",
        "support_ordering",
    }
)


def check_flags(options: Mapping[str, Any]) -> None:
    """A boolean property given as anything but a bool (``requires_session="false"``, which is
    truthy) is a TypeError naming it, as the SDK's typed properties are bool; None: not given."""
    for name, value in options.items():
        if name in FLAGS and value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, not {value!r}")


def native_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """poisonq's entity options for the SDK's (``None`` values left out); ``status`` and a
    subscription's ``dead_lettering_on_filter_evaluation_exceptions`` are the caller's."""
    check_flags(options)
    kept: dict[str, Any] = {}
    for name, value in options.items():
        if value is None or name in ("name", "status"):
            continue
        if name in KEPT:
            native, convert = KEPT[name]
            kept[native] = convert(value)
        elif name in WITHOUT_MEANING:
            if not WITHOUT_MEANING[name](value):
                raise FeatureNotSupportedError(f"{name}={value!r}")
        elif name != "dead_lettering_on_filter_evaluation_exceptions":
            raise TypeError(f"unexpected keyword argument {name!r}")
    return kept


def native_status(value: EntityStatus | str | None) -> NativeStatus | None:
    if value is None:
        return None
    wanted = EntityStatus(value)
    return next(native for native, sdk in STATUSES.items() if sdk is wanted)


def _common(info: QueueInfo) -> dict[str, Any]:
    o = info.options
    ttl = o.default_message_ttl
    return {
        "default_message_time_to_live": NEVER if ttl is None else datetime.timedelta(seconds=ttl),
        "status": STATUSES[info.status],
        "auto_delete_on_idle": NEVER,
        "enable_batched_operations": True,
        "availability_status": "Available",
        "user_metadata": None,
    }


def queue_properties(info: QueueInfo) -> QueueProperties:
    o = info.options
    return QueueProperties(
        info.name,
        **_common(info),
        lock_duration=datetime.timedelta(seconds=o.lock_duration),
        max_delivery_count=o.max_delivery_count,
        dead_lettering_on_message_expiration=o.dead_lettering_on_message_expiration,
        duplicate_detection_history_time_window=datetime.timedelta(
            seconds=o.duplicate_detection_window
        ),
        requires_duplicate_detection=o.requires_duplicate_detection,
        requires_session=o.requires_session,
        forward_to=o.forward_to,
        forward_dead_lettered_messages_to=o.forward_dead_lettered_messages_to,
        max_size_in_megabytes=o.max_size // MIB,
        max_message_size_in_kilobytes=o.max_message_size // 1024,
        enable_partitioning=False,
        enable_express=False,
        authorization_rules=[],
    )


def topic_properties(info: QueueInfo) -> TopicProperties:
    o = info.options
    return TopicProperties(
        info.name,
        **_common(info),
        max_size_in_megabytes=o.max_size // MIB,
        requires_duplicate_detection=o.requires_duplicate_detection,
        duplicate_detection_history_time_window=datetime.timedelta(
            seconds=o.duplicate_detection_window
        ),
        size_in_bytes=info.ledger.size_bytes,
        authorization_rules=[],
        support_ordering=True,
        enable_partitioning=False,
        enable_express=False,
        max_message_size_in_kilobytes=o.max_message_size // 1024,
    )


def subscription_properties(info: QueueInfo, on_filter_errors: bool) -> SubscriptionProperties:
    o = info.options
    return SubscriptionProperties(
        info.name.rpartition("/")[2],
        **_common(info),
        lock_duration=datetime.timedelta(seconds=o.lock_duration),
        requires_session=o.requires_session,
        dead_lettering_on_message_expiration=o.dead_lettering_on_message_expiration,
        dead_lettering_on_filter_evaluation_exceptions=on_filter_errors,
        max_delivery_count=o.max_delivery_count,
        forward_to=o.forward_to,
        forward_dead_lettered_messages_to=o.forward_dead_lettered_messages_to,
    )


def _held(counts: Mapping[str, int]) -> int:
    return sum(counts[state] for state in ("scheduled", "active", "locked", "deferred"))


def _runtime(info: QueueInfo, transfer_dead_letters: int) -> dict[str, Any]:
    """Runtime counts as Service Bus gives them: ``active_message_count`` holds the locked
    messages too, ``total_message_count`` every message held, dead letters included."""
    c = info.counts
    return {
        "accessed_at_utc": None,
        "created_at_utc": info.created_at,
        "updated_at_utc": info.updated_at,
        "total_message_count": _held(c) + c["dead_lettered"] + transfer_dead_letters,
        "active_message_count": c["active"] + c["locked"],
        "dead_letter_message_count": c["dead_lettered"],
        "transfer_dead_letter_message_count": transfer_dead_letters,
        "transfer_message_count": 0,
    }


def queue_runtime_properties(info: QueueInfo, transfer_dead_letters: int) -> QueueRuntimeProperties:
    return QueueRuntimeProperties(
        info.name,
        **_runtime(info, transfer_dead_letters),
        size_in_bytes=info.ledger.size_bytes,
        scheduled_message_count=info.counts["scheduled"],
    )


def subscription_runtime_properties(
    info: QueueInfo, transfer_dead_letters: int
) -> SubscriptionRuntimeProperties:
    name = info.name.rpartition("/")[2]
    return SubscriptionRuntimeProperties(name, **_runtime(info, transfer_dead_letters))


def topic_runtime_properties(
    info: QueueInfo, subscriptions: list[QueueInfo]
) -> TopicRuntimeProperties:
    """A topic's runtime properties; its filters are its subscriptions' rules, a rule that
    lets every message in counted as SQL (``1=1``), as Service Bus counts it."""
    rules = [
        rule
        for sub in subscriptions
        for _, rule in RuleSet.of(filter_from_json(sub.filter or {})).rules
    ]
    correlation = sum(isinstance(rule, CorrelationFilter) for rule in rules)
    return TopicRuntimeProperties(
        info.name,
        accessed_at_utc=None,
        created_at_utc=info.created_at,
        updated_at_utc=info.updated_at,
        size_in_bytes=info.ledger.size_bytes,
        subscription_count=len(subscriptions),
        sql_filter_count=len(rules) - correlation,
        correlation_filter_count=correlation,
        scheduled_message_count=0,  # a topic holds nothing: its subscriptions do
    )
