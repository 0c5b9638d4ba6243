"""Queue options and the retry policy, with their defaults and validation.

Defaults follow the reference systems (docs/design.md, "Options"). Options are frozen dataclasses
validated on construction; the store keeps them as JSON and never interprets them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from poisonq.errors import InvalidOptionError
from poisonq.limits import check_count
from poisonq.model import Duration, ReceiveErrorHandling, to_seconds
from poisonq.names import validate_name

KIB = 1024
MAX_LOCK_DURATION = 300.0


def lock_seconds(lock_duration: Duration) -> float:
    """A receiver's or a lease's own lock duration, in seconds."""
    seconds = to_seconds(lock_duration, "lock_duration")
    if not 0 < seconds <= MAX_LOCK_DURATION:
        raise InvalidOptionError(f"lock_duration must be in (0, {MAX_LOCK_DURATION:g}] seconds")
    return seconds


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Decision: make the message active again in the same queue, after ``delay`` seconds
    (before jitter)."""

    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class MoveToRetry:
    """Decision: park the message in the retry subqueue for ``delay`` seconds (a new cycle)."""

    delay: float


@dataclass(frozen=True, slots=True)
class Poison:
    """Decision: every attempt is used; the queue's ``receive_error_handling`` says what
    becomes of the message (the engine reads it there, as every path that poisons does)."""


RetryDecision = Redeliver | MoveToRetry | Poison


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a failed message is retried, parked for a cycle, or poisoned (WCF names).

    Total attempts = (``receive_retry_count`` + 1) x (``max_retry_cycles`` + 1). The policy is
    a pure function of the message's counters: :meth:`decide` is called after a failed attempt.

    Within a cycle, a failed message comes back after ``redelivery_delay`` seconds, times
    ``redelivery_delay_multiplier`` for each further failure of the cycle, at most
    ``max_redelivery_delay``, each spread by up to ``redelivery_jitter`` of itself either way
    (so consumers that failed together do not retry together). The default is at once, as in
    Service Bus. A new cycle starts the backoff again after ``retry_cycle_delay``.
    """

    receive_retry_count: int = 9
    max_retry_cycles: int = 0
    retry_cycle_delay: float = 0.0
    retry_cycle_delay_multiplier: float = 1.0
    receive_error_handling: ReceiveErrorHandling = ReceiveErrorHandling.MOVE
    redelivery_delay: float = 0.0
    redelivery_delay_multiplier: float = 2.0
    max_redelivery_delay: float = 300.0
    redelivery_jitter: float = 0.2

    def __post_init__(self) -> None:
        check_count(self.receive_retry_count, "receive_retry_count", minimum=0)
        check_count(self.max_retry_cycles, "max_retry_cycles", minimum=0)
        for name in ("retry_cycle_delay", "redelivery_delay", "max_redelivery_delay"):
            object.__setattr__(self, name, to_seconds(getattr(self, name), name))
        for name in ("retry_cycle_delay_multiplier", "redelivery_delay_multiplier"):
            growth = getattr(self, name)
            if not isinstance(growth, int | float) or isinstance(growth, bool) or growth < 1:
                raise InvalidOptionError(f"{name} must be >= 1, not {growth!r}")
        jitter = self.redelivery_jitter
        if not isinstance(jitter, int | float) or isinstance(jitter, bool) or not 0 <= jitter <= 1:
            raise InvalidOptionError(f"redelivery_jitter must be in [0, 1], not {jitter!r}")
        try:
            handling = ReceiveErrorHandling(self.receive_error_handling)
        except ValueError:
            choices = ", ".join(h.value for h in ReceiveErrorHandling)
            raise InvalidOptionError(
                f"receive_error_handling must be one of {choices}, "
                f"not {self.receive_error_handling!r}"
            ) from None
        object.__setattr__(self, "receive_error_handling", handling)

    @classmethod
    def service_bus(cls, max_delivery_count: int = 10) -> RetryPolicy:
        """Service Bus: ``max_delivery_count`` immediate attempts, then the dead-letter queue."""
        check_count(max_delivery_count, "max_delivery_count")
        return cls(receive_retry_count=max_delivery_count - 1)

    @classmethod
    def wcf(cls) -> RetryPolicy:
        """WCF/MSMQ defaults: 5 retries, 2 cycles 30 minutes apart, then fault the queue."""
        return cls(
            receive_retry_count=5,
            max_retry_cycles=2,
            retry_cycle_delay=1800.0,
            receive_error_handling=ReceiveErrorHandling.FAULT,
        )

    @property
    def attempts_per_cycle(self) -> int:
        return self.receive_retry_count + 1

    @property
    def total_attempts(self) -> int:
        return self.attempts_per_cycle * (self.max_retry_cycles + 1)

    def decide(self, delivery_count: int, move_count: int) -> RetryDecision:
        """Decide after a failed delivery, given deliveries so far and cycles already parked."""
        if delivery_count < self.attempts_per_cycle * (move_count + 1):
            failed_in_cycle = delivery_count - self.attempts_per_cycle * move_count
            backoff: float = self.redelivery_delay_multiplier ** max(0, failed_in_cycle - 1)
            return Redeliver(min(self.max_redelivery_delay, self.redelivery_delay * backoff))
        # A cycle is spent by deliveries, not failures alone: a message received again by
        # sequence number after a defer used a delivery, and may have used them all.
        if move_count < self.max_retry_cycles and delivery_count < self.total_attempts:
            growth: float = self.retry_cycle_delay_multiplier**move_count
            return MoveToRetry(delay=self.retry_cycle_delay * growth)
        return Poison()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RetryPolicy:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Every option of a queue, with the reference systems' defaults (docs/design.md, "Options").

    Durations are stored as float seconds; the constructor accepts seconds or ``timedelta``.
    ``max_delivery_count`` is derived from the retry policy (attempts per cycle).
    """

    lock_duration: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy.service_bus)
    default_message_ttl: float | None = None
    dead_lettering_on_message_expiration: bool = True
    requires_duplicate_detection: bool = False
    duplicate_detection_window: float = 600.0
    requires_session: bool = False
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    max_message_size: int = 256 * KIB
    max_properties_size: int = 64 * KIB
    max_size: int = 1024 * KIB * KIB
    auto_disable_after_rollbacks: int | None = None
    dead_letter_retry: RetryPolicy | None = None
    per_message_poisoning: bool = False

    def __post_init__(self) -> None:
        lock = to_seconds(self.lock_duration, "lock_duration")
        if not 0 < lock <= MAX_LOCK_DURATION:
            raise InvalidOptionError(f"lock_duration must be in (0, 300] seconds, not {lock}")
        object.__setattr__(self, "lock_duration", lock)
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidOptionError(f"retry must be a RetryPolicy, not {self.retry!r}")
        if self.default_message_ttl is not None:
            ttl = to_seconds(self.default_message_ttl, "default_message_ttl")
            if ttl <= 0:
                raise InvalidOptionError("default_message_ttl must be > 0 (or None: never expire)")
            object.__setattr__(self, "default_message_ttl", ttl)
        window = to_seconds(self.duplicate_detection_window, "duplicate_detection_window")
        if not 20 <= window <= 7 * 86400:
            raise InvalidOptionError("duplicate_detection_window must be 20 s to 7 days")
        object.__setattr__(self, "duplicate_detection_window", window)
        for flag in (
            "dead_lettering_on_message_expiration",
            "requires_duplicate_detection",
            "requires_session",
            "per_message_poisoning",
        ):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidOptionError(f"{flag} must be true or false")
        for name in ("forward_to", "forward_dead_lettered_messages_to"):
            if getattr(self, name) is not None:
                validate_name(getattr(self, name))
        check_count(self.max_message_size, "max_message_size")
        check_count(self.max_properties_size, "max_properties_size")
        check_count(self.max_size, "max_size")
        if self.auto_disable_after_rollbacks is not None:
            check_count(
                self.auto_disable_after_rollbacks, "auto_disable_after_rollbacks", minimum=1
            )
        if self.dead_letter_retry is not None:
            _check_dead_letter_policy(self.dead_letter_retry)

    @property
    def max_delivery_count(self) -> int:
        return self.retry.attempts_per_cycle

    @classmethod
    def build(
        cls,
        base: QueueOptions | None = None,
        max_delivery_count: int | None = None,
        **changes: Any,
    ) -> QueueOptions:
        """Options from ``base`` (or defaults) with ``changes`` applied and validated.

        ``max_delivery_count=N`` sets the attempts per cycle (``receive_retry_count = N - 1``)
        and keeps the rest of the policy: on a new queue that is the default Service Bus
        policy (N immediate attempts, no cycles, move), as docs/design.md says; on an existing
        queue its cycles and error handling stay as they were (a ``drop`` queue stays
        ``drop``). Giving ``retry`` as well is ambiguous and refused.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise InvalidOptionError(f"unknown queue option(s): {', '.join(unknown)}")
        if max_delivery_count is not None:
            if "retry" in changes:
                raise InvalidOptionError("give either max_delivery_count or retry, not both")
            check_count(max_delivery_count, "max_delivery_count")
            policy = (base or cls()).retry
            changes["retry"] = dataclasses.replace(
                policy, receive_retry_count=max_delivery_count - 1
            )
        return dataclasses.replace(base or cls(), **changes)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["retry"] = self.retry.to_json()
        if self.dead_letter_retry is not None:
            data["dead_letter_retry"] = self.dead_letter_retry.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueOptions:
        data = dict(data)
        data["retry"] = RetryPolicy.from_json(data["retry"])
        if data.get("dead_letter_retry") is not None:
            data["dead_letter_retry"] = RetryPolicy.from_json(data["dead_letter_retry"])
        return cls(**data)


def _check_dead_letter_policy(policy: object) -> None:
    """Reading a dead-letter (poison) queue, only immediate retries and drop, reject or
    fault apply (WCF): there is no retry subqueue to cycle through, and ``move`` would move
    the message into the queue it is already in."""
    if not isinstance(policy, RetryPolicy):
        raise InvalidOptionError(f"dead_letter_retry must be a RetryPolicy, not {policy!r}")
    if policy.max_retry_cycles:
        raise InvalidOptionError("dead_letter_retry cannot have retry cycles (max_retry_cycles=0)")
    if policy.receive_error_handling is ReceiveErrorHandling.MOVE:
        raise InvalidOptionError(
            "dead_letter_retry cannot use 'move' (the message is in the dead-letter queue "
            "already); use drop, reject or fault"
        )
