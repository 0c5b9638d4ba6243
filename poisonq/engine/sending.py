"""Sending: validation and sizing, duplicate detection, quotas, what is dead-lettered on
arrival (oversized properties, a missing session id), auto-forwarding, and the fan-out of a
topic to the subscriptions whose filter matches.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any

from poisonq.engine.base import EngineBase
from poisonq.engine.targets import Target, check_sequence_numbers, check_text
from poisonq.errors import (
    EntityDisabledError,
    InvalidOptionError,
    MessageNotFoundError,
    MessageTooLargeError,
    QuotaExceededError,
)
from poisonq.filters import SYSTEM_FIELDS, FilterEvaluationError
from poisonq.limits import MAX_ID_LENGTH
from poisonq.model import (
    DeadLetterReason,
    EntityKind,
    Message,
    MessageState,
    PropertyValue,
    to_seconds,
    to_timestamp,
)
from poisonq.options import QueueOptions
from poisonq.store.base import NewMessage, Transaction

log = logging.getLogger(__name__)
SCHEDULED = MessageState.SCHEDULED

# Why a message is dead-lettered as it arrives (None: it is not).
Arrival = tuple[NewMessage, str | None]


class Sending(EngineBase):
    async def send(self, address: str, messages: Sequence[Message]) -> list[int]:
        """Send a batch: all or nothing, durable on return. Returns the new sequence numbers
        (duplicates ignored by duplicate detection get none; a topic returns those of every
        subscription that took a copy, subscription by subscription)."""
        if isinstance(messages, Message):
            messages = [messages]
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.main(tx, address)
            if not target.entity.status.can_send:
                raise EntityDisabledError(target.entity.name, target.entity.status, "send")
            if target.kind is EntityKind.TOPIC:
                return await self._publish(tx, target, messages, now)
            rows = self._rows(messages, target.options, now)
            return await self._enqueue(tx, target, rows, now, last=True)

    async def cancel_scheduled(self, address: str, sequence_numbers: int | Sequence[int]) -> int:
        """Scheduled → dropped (Service Bus' cancel of a scheduled message): the messages
        ``sequence_numbers`` names, still waiting for their time in ``address`` (a queue,
        or a topic's subscriptions, where scheduling a message to a topic put its copies),
        leave it counted as dropped, in one transaction. A number naming no such message
        (sent, received or cancelled already) raises :class:`MessageNotFoundError` and
        cancels nothing. Returns how many were cancelled."""
        seqs = sorted(set(check_sequence_numbers(sequence_numbers)))
        now = self.clock.now()
        async with self.store.transaction() as tx:
            target = await self.resolver.main(tx, address)
            targets = [target]
            if target.kind is EntityKind.TOPIC:
                targets = await self.resolver.subscriptions(tx, target.entity.name)
            found: list[tuple[Target, list[int]]] = []
            for each in targets:
                await self.poisoner.housekeep(tx, each, now)  # one whose time came is not pending
                held = await tx.messages(each.entity.id, each.entity.name, seqs)
                found.append((each, [m.sequence_number for m in held if m.state is SCHEDULED]))
            missing = sorted(set(seqs).difference(*(mine for _, mine in found)))
            if missing:
                raise MessageNotFoundError(target.entity.name, missing[0])
            return sum([await tx.drop(each.entity.id, mine) for each, mine in found if mine])

    async def _enqueue(
        self, tx: Transaction, target: Target, rows: list[Arrival], now: float, last: bool = False
    ) -> list[int]:
        """Insert the rows, dead-letter those refused on arrival, forward the rest if the
        queue says so. ``last``: the caller runs nothing after, so when neither follows the
        insert is the transaction's last statement (see ``Transaction.lock_ready``)."""
        options = target.options
        if options.requires_duplicate_detection:
            rows = await self._drop_duplicates(tx, target, rows, now)
        total = target.entity.ledger.size_bytes + sum(row.size for row, _ in rows)
        if total > options.max_size:
            raise QuotaExceededError(target.entity.name, total, options.max_size)
        if not rows:
            return []
        destination = options.forward_to
        last = last and not destination and all(why is None for _, why in rows)
        seqs = await tx.insert_messages(target.entity.id, [row for row, _ in rows], now, last=last)
        refused: dict[str, list[int]] = {}
        for seq, (_, why) in zip(seqs, rows, strict=True):
            if why is not None:
                refused.setdefault(why, []).append(seq)
        for reason, chosen in refused.items():
            await self.router.dead_letter(
                tx, target, chosen, reason, _arrival_description(reason, options), None, now
            )
        if destination:
            dead = {seq for chosen in refused.values() for seq in chosen}
            hops = {seq: 0 for seq in seqs if seq not in dead}
            if hops:
                await self.router.forward(
                    tx, target, target.entity, hops, destination, now, strict=True
                )
        return seqs

    def _rows(
        self, messages: Sequence[Message], options: QueueOptions, now: float
    ) -> list[Arrival]:
        """Validate and size messages, each with why it is dead-lettered on arrival."""
        rows: list[Arrival] = []
        # A message of a body and an id (the usual one) takes the short way, unless the
        # queue requires sessions: then it is refused on arrival, as the long way tells.
        ttl = options.default_message_ttl
        plain = _PlainRows(None if ttl is None else now + ttl, options.max_message_size)
        short = not options.requires_session
        for message in messages:
            if not isinstance(message, Message):
                raise InvalidOptionError(f"send takes poisonq.Message objects, not {message!r}")
            if short and (plain_row := plain.row(message)) is not None:
                rows.append((plain_row, None))
                continue
            row, props_size = _new_row(message, options, now)
            if row.size > options.max_message_size:
                raise MessageTooLargeError(row.message_id, row.size, options.max_message_size)
            why = None
            if props_size > options.max_properties_size:
                why = DeadLetterReason.HEADER_SIZE_EXCEEDED.value
            elif options.requires_session and row.session_id is None:
                why = DeadLetterReason.SESSION_ID_IS_NULL.value
            rows.append((row, why))
        return rows

    async def _drop_duplicates(
        self, tx: Transaction, target: Target, rows: list[Arrival], now: float
    ) -> list[Arrival]:
        """Leave out messages whose id was sent inside the window (or earlier in the batch)."""
        entity_id = target.entity.id
        seen = await tx.seen_message_ids(entity_id, [row.message_id for row, _ in rows], now)
        fresh: list[Arrival] = []
        for row, why in rows:
            if row.message_id not in seen:
                seen.add(row.message_id)
                fresh.append((row, why))
        if fresh:
            window = target.options.duplicate_detection_window
            ids = [row.message_id for row, _ in fresh]
            await tx.remember_message_ids(entity_id, ids, now + window)
            await tx.forget_message_ids(now)
        return fresh

    # Topics -------------------------------------------------------------------------------
    async def _publish(
        self, tx: Transaction, topic: Target, messages: Sequence[Message], now: float
    ) -> list[int]:
        """A copy of each message to every subscription whose filter matches. A filter that
        cannot be evaluated on a message skips that subscription, or dead-letters the copy
        there (``FilterEvaluationException``) if the subscription asks for it. With no
        subscription matching, the message is discarded, as in Service Bus. Duplicate
        detection on the topic leaves out ids it saw inside its window."""
        arrivals = self._rows(messages, topic.options, now)  # the topic's own size limits
        if topic.options.requires_duplicate_detection:
            fresh = {id(row) for row, _ in await self._drop_duplicates(tx, topic, arrivals, now)}
            messages = [
                m for m, (row, _) in zip(messages, arrivals, strict=True) if id(row) in fresh
            ]
        seqs: list[int] = []
        for sub in await self.resolver.subscriptions(tx, topic.entity.name):
            entity = sub.entity
            if not entity.status.can_send:
                continue
            rows: list[Arrival] = []
            for message, (row, why) in zip(
                messages, self._rows(messages, sub.options, now), strict=True
            ):
                try:
                    matched = sub.spec.filter.matches(filter_values(message))
                except FilterEvaluationError as exc:
                    if not sub.spec.dead_letter_on_filter_exceptions:
                        log.warning(
                            "filter of %s failed on %s: %s", entity.name, row.message_id, exc
                        )
                        continue
                    matched, why = True, why or DeadLetterReason.FILTER_EVALUATION_EXCEPTION.value
                if matched:
                    rows.append((row, why))
            seqs += await self._enqueue(tx, sub, rows, now)
        return seqs


def filter_values(message: Message) -> dict[str, PropertyValue]:
    """What a subscription filter sees: the user properties and the ``sys.`` fields."""
    values: dict[str, PropertyValue] = dict(message.properties)
    for name in SYSTEM_FIELDS:
        values[f"sys.{name}"] = getattr(message, name)
    return values


def _arrival_description(reason: str, options: QueueOptions) -> str:
    match reason:
        case DeadLetterReason.HEADER_SIZE_EXCEEDED:
            return f"properties exceed max_properties_size of {options.max_properties_size} bytes"
        case DeadLetterReason.SESSION_ID_IS_NULL:
            return "the queue requires sessions and the message has no session_id"
        case _:
            return "the subscription's filter could not be evaluated on the message"


class _PlainRows:
    """The rows of messages that set nothing but a body (bytes) and a message id: what
    :func:`_new_row` would make of them, with the checks such a message needs. Sending runs
    this for every message, so it reads each field once and stops at the first set."""

    def __init__(self, expires_at: float | None, max_size: int) -> None:
        self.expires_at = expires_at
        self.max_size = max_size

    def row(self, message: Message) -> NewMessage | None:
        """The row of ``message``, or ``None`` if it is not plain (or not valid, or too
        large: :func:`_new_row` says why)."""
        body, message_id, properties = message.body, message.message_id, message.properties
        if (
            type(body) is not bytes
            or len(body) > self.max_size
            or type(message_id) is not str
            or not 0 < len(message_id) <= MAX_ID_LENGTH
            or "\x00" in message_id
            or type(properties) is not dict
            or properties
            or message.content_type is not None
            or message.subject is not None
            or message.correlation_id is not None
            or message.reply_to is not None
            or message.session_id is not None
            or message.scheduled_enqueue_time is not None
            or message.time_to_live is not None
            or message.to is not None
            or message.reply_to_session_id is not None
            or message.partition_key is not None
        ):
            return None
        return NewMessage(
            message_id, body, len(body), None, None, None, None, None, None,
            MessageState.ACTIVE, None, self.expires_at,
        )  # fmt: skip


def _new_row(message: Message, options: QueueOptions, now: float) -> tuple[NewMessage, int]:
    """Validate a message and turn it into a row; returns the row and its properties' size.

    This runs for every message sent, so the common case (bytes body, no optional fields)
    takes the fewest checks.
    """
    given: object = message.body  # typed bytes | str, but callers may pass anything
    if type(given) is bytes:
        body = given
    elif isinstance(given, str):
        body = given.encode()
    elif isinstance(given, bytearray | memoryview):
        body = bytes(given)
    else:
        raise InvalidOptionError(f"body must be bytes or str, not {type(given).__name__}")
    message_id = message.message_id
    if type(message_id) is not str or not 0 < len(message_id) <= MAX_ID_LENGTH:
        raise InvalidOptionError(f"message_id must be 1-{MAX_ID_LENGTH} characters: {message_id!r}")
    check_text(message_id, "message_id")
    size = len(body)
    props = _properties_json(message.properties)
    props_size = len(props.encode()) if props else 0
    size += props_size
    for value in (
        message.content_type,
        message.subject,
        message.correlation_id,
        message.reply_to,
        message.session_id,
    ):
        if value is not None:
            check_text(value, "a message field")
            size += len(value.encode())
    session_id = message.session_id
    if session_id is not None and not 0 < len(session_id) <= MAX_ID_LENGTH:
        raise InvalidOptionError(f"session_id must be 1-{MAX_ID_LENGTH} characters: {session_id!r}")
    addresses = (message.to, message.reply_to_session_id, message.partition_key)
    if addresses != (None, None, None):
        size += _addresses_size(message)
    scheduled_at = None
    state = MessageState.ACTIVE
    if message.scheduled_enqueue_time is not None:
        scheduled_at = to_timestamp(message.scheduled_enqueue_time)
        if scheduled_at > now:
            state = MessageState.SCHEDULED
    ttl = options.default_message_ttl
    if message.time_to_live is not None:
        own = to_seconds(message.time_to_live, "time_to_live")
        if own <= 0:
            raise InvalidOptionError("time_to_live must be > 0")
        ttl = own if ttl is None else min(own, ttl)
    expires_at = None if ttl is None else max(now, scheduled_at or now) + ttl
    row = NewMessage(
        message_id,
        body,
        size,
        message.content_type,
        message.subject,
        props,
        session_id,
        message.correlation_id,
        message.reply_to,
        state,
        scheduled_at,
        expires_at,
        *addresses,
    )
    return row, props_size


def _addresses_size(message: Message) -> int:
    """The size of the fields few messages set (``to``, ``reply_to_session_id``,
    ``partition_key``), checked; a partition key beside a session id must be that id, as
    Service Bus requires (a session's messages are one partition)."""
    key, session_id = message.partition_key, message.session_id
    if key is not None and session_id is not None and key != session_id:
        raise InvalidOptionError(
            f"partition_key {key!r} must equal the session_id {session_id!r} when both are set"
        )
    size = 0
    for name in ("to", "reply_to_session_id", "partition_key"):
        value = getattr(message, name)
        if value is not None:
            check_text(value, name)
            if len(value) > MAX_ID_LENGTH:
                raise InvalidOptionError(f"{name} must be at most {MAX_ID_LENGTH} characters")
            size += len(value.encode())
    return size


def _properties_json(properties: dict[str, Any]) -> str | None:
    if not isinstance(properties, dict):
        raise InvalidOptionError(f"properties must be a dict, not {type(properties).__name__}")
    if not properties:
        return None
    for key, value in properties.items():
        if not isinstance(key, str) or not key:
            raise InvalidOptionError(f"property names must be non-empty strings, not {key!r}")
        check_text(key, "a property name")
        if isinstance(value, str):
            check_text(value, f"property {key!r}")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise InvalidOptionError(
                f"property {key!r} must be str, int, float, bool or None, "
                f"not {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidOptionError(f"property {key!r} must be a finite number")
    return json.dumps(properties, separators=(",", ":"))
