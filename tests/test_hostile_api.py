"""Hostile input to the Python API on both stores (a SQLite file, the PostgreSQL server):
names, messages, options, sequence numbers, lock tokens and counts of every wrong kind. Each
call works or raises a ``PoisonqError``, a refused call changes nothing, and the ledger
balances after every call (``tests/hostile.py``)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from poisonq import (
    Abandon,
    Broker,
    Complete,
    DeadLetter,
    InvalidNameError,
    Message,
    MessageNotFoundError,
    PoisonqError,
    QueueOptions,
    Release,
    RetryPolicy,
)
from poisonq.model import to_seconds
from tests.helpers import assert_balanced
from tests.hostile import (
    HOSTILE,
    anything,
    attempt,
    bad_waits,
    durations,
    floats,
    hostile_text,
    ints,
    names,
    scalars,
    sequence_numbers,
    times,
)

Q = "orders"


def _orders(broker: Broker) -> None:
    if not any(info.name == Q for info in broker.list_queues()):
        broker.create_queue(Q, max_delivery_count=2, lock_duration=30)


@HOSTILE
@given(name=names, other=names)
def test_hostile_entity_names(broker: Broker, name: Any, other: Any) -> None:
    attempt(broker, lambda: broker.create_queue(name))
    attempt(broker, lambda: broker.get_queue(name))
    attempt(broker, lambda: broker.counts(name))
    attempt(broker, lambda: broker.sender(name).send(Message(body=b"x")))
    attempt(broker, lambda: broker.peek(name))
    attempt(broker, lambda: broker.receiver(name).receive(max_messages=5))
    attempt(broker, lambda: broker.receiver(Q, subqueue=name))
    attempt(broker, lambda: broker.dead_letters(name))
    attempt(broker, lambda: broker.create_queue(other, forward_to=name))
    attempt(broker, lambda: broker.create_topic(other))
    attempt(broker, lambda: broker.create_subscription(other, name))
    attempt(broker, lambda: broker.accept_session(name, other))
    attempt(broker, lambda: broker.set_status(name, "disabled"))
    attempt(broker, lambda: broker.delete_queue(other))
    attempt(broker, lambda: broker.delete_queue(name))


property_maps = st.dictionaries(hostile_text, scalars, max_size=4) | anything
message_fields = st.fixed_dictionaries(
    {},
    optional={
        "body": anything | st.binary(max_size=64) | st.sampled_from([b"x" * 300_000]),
        "message_id": hostile_text | anything,
        "content_type": hostile_text | anything,
        "subject": hostile_text | anything,
        "properties": property_maps,
        "session_id": hostile_text | anything,
        "correlation_id": hostile_text | anything,
        "reply_to": hostile_text | anything,
        "time_to_live": durations | anything,
        "scheduled_enqueue_time": times | floats | anything,
    },
)


@HOSTILE
@given(batch=st.lists(message_fields, min_size=1, max_size=3))
@example(batch=[{"body": b"", "time_to_live": 5e-324}])
def test_hostile_messages(broker: Broker, batch: list[dict[str, Any]]) -> None:
    """A batch with one bad message sends none of it; what is sent reads back as sent, unless
    its time to live ran out as it was sent (a TTL too small to move the clock's time)."""
    _orders(broker)
    messages = [Message(**fields) for fields in batch]
    sent = attempt(broker, lambda: broker.sender(Q).send(messages))
    if isinstance(sent, PoisonqError):
        return
    assert isinstance(sent, list)
    now = broker.clock.now()
    for seq, message in zip(sent, messages, strict=True):
        ttl = message.time_to_live
        if ttl is not None and now + to_seconds(ttl, "time_to_live") <= now:
            with pytest.raises(MessageNotFoundError):  # expired, and gone
                broker.message(Q, seq)
            continue
        got = broker.message(Q, seq)
        assert got.properties == message.properties
        body = message.body.encode() if isinstance(message.body, str) else bytes(message.body)
        assert got.body == body
    receiver = broker.receiver(Q)
    while got_batch := attempt(broker, lambda: receiver.receive(max_messages=10)):
        assert isinstance(got_batch, list)
        attempt(broker, lambda b=got_batch: receiver.complete(b))  # type: ignore[misc]


OPTION_NAMES = [f.name for f in dataclasses.fields(QueueOptions)] + ["max_delivery_count"]
RETRY_NAMES = [f.name for f in dataclasses.fields(RetryPolicy)]


@HOSTILE
@given(
    options=st.dictionaries(st.sampled_from(OPTION_NAMES) | hostile_text, anything | durations),
    retry=st.dictionaries(st.sampled_from(RETRY_NAMES), anything | durations | ints, max_size=3),
    name=names,
)
def test_hostile_options(
    broker: Broker, options: dict[str, Any], retry: dict[str, Any], name: Any
) -> None:
    _orders(broker)
    attempt(broker, lambda: broker.create_queue(name, **options))
    attempt(broker, lambda: broker.update_queue(Q, **options))
    attempt(broker, lambda: broker.create_queue(name, retry=RetryPolicy(**retry)))
    attempt(
        broker,
        lambda: broker.receiver(
            Q, **{k: options[k] for k in options if k in ("lock_duration", "max_wait_time")}
        ),
    )
    attempt(broker, lambda: broker.receiver(Q, receive_mode=options.get("receive_mode")))
    attempt(broker, lambda: broker.sender(Q).send(Message(body=b"x")))
    attempt(broker, lambda: broker.delete_queue(name))


@HOSTILE
@given(
    seq=sequence_numbers,
    token=hostile_text | anything,
    count=ints | anything,
    text=hostile_text | anything,
    delay=durations | anything,
    wait=bad_waits,
    how=st.sampled_from(["complete", "abandon", "dead_letter", "defer", "renew", "settle"]),
)
def test_hostile_locks_and_counts(
    broker: Broker,
    seq: Any,
    token: Any,
    count: Any,
    text: Any,
    delay: Any,
    wait: Any,
    how: str,
) -> None:
    """Settling with forged sequence numbers and tokens, and counts of every kind, on a
    queue that holds messages locked for real."""
    _orders(broker)
    broker.sender(Q).send([Message(body=b"a"), Message(body=b"b")])
    receiver = broker.receiver(Q)
    held = receiver.receive(max_messages=2)
    forged = dataclasses.replace(held[0], sequence_number=seq, lock_token=token)
    settle = {
        "complete": lambda: receiver.complete([held[1], forged]),
        "abandon": lambda: receiver.abandon(forged, error=text, delay=delay),
        "dead_letter": lambda: receiver.dead_letter(forged, reason=text, description=text),
        "defer": lambda: receiver.defer(forged),
        "renew": lambda: receiver.renew_lock(forged),
        "settle": lambda: broker.settle(
            Q,
            [
                Complete(held[1].sequence_number, held[1].lock_token or ""),
                Abandon(seq, token, failure=text),
                DeadLetter(seq, token, reason=text, description=text),
                Release(seq, token),
            ][: 1 + len(str(text)) % 4],
        ),
    }[how]
    attempt(broker, settle)
    attempt(broker, lambda: receiver.dead_letter(held[0], reason=text, description=text))
    attempt(broker, lambda: receiver.abandon(held, delay=delay))
    attempt(broker, lambda: receiver.receive(max_messages=count, max_wait=wait))
    attempt(broker, lambda: receiver.receive_deferred(seq))
    attempt(broker, lambda: broker.peek(Q, from_sequence=seq, max_messages=count))
    attempt(broker, lambda: broker.message(Q, seq))
    attempt(broker, lambda: broker.resolve_poison(Q, seq, text))
    attempt(broker, lambda: broker.dead_letters(Q, after=seq, limit=count, reason=text))
    attempt(broker, lambda: broker.count_dead_letters(Q, min_sequence=seq, since=delay))
    attempt(broker, lambda: broker.dead_letter_groups(Q, by=text))
    attempt(broker, lambda: broker.acquire_lease(Q, text, count, count, delay))
    attempt(broker, lambda: broker.lease(Q, text, seq))
    lease = broker.acquire_lease(Q, "hostile", 1, max_messages=1)
    if lease is not None:
        attempt(broker, lambda: broker.lease_rows(lease, seq, count))
        attempt(broker, lambda: broker.lease_sequence_numbers(lease, count, seq))
        attempt(broker, lambda: broker.release_lease(lease, seq, count))
        broker.release_lease(lease)
    attempt(broker, lambda: broker.accept_session(Q, text))
    attempt(broker, lambda: broker.task(seq))
    attempt(broker, lambda: broker.cancel_task(seq))
    attempt(broker, lambda: broker.resubmit(Q, reason=text, rate=delay, to=token))
    attempt(broker, lambda: broker.purge(Q, subject=text))
    # Whatever is left is settled for real, so the next example starts from an empty queue.
    while left := receiver.receive(max_messages=10):
        receiver.complete(left)


@pytest.mark.parametrize("name", ["..", ".", "x/../admin", "x/./y"])
def test_names_with_dot_segments_are_refused_by_both_stores(broker: Broker, name: str) -> None:
    """``x/../admin`` would be ``admin`` to a client that normalises the URL of a purge:
    ``.`` and ``..`` segments are refused for queues, topics, subscriptions and forwarding
    targets alike, and nothing is made."""
    broker.create_queue("admin")
    broker.create_topic("events")
    before = [info.name for info in broker.entities()]
    dots = next(segment for segment in name.split("/") if segment in (".", ".."))
    for create in (
        lambda: broker.create_queue(name),
        lambda: broker.create_topic(name),
        lambda: broker.create_queue("q", forward_to=name),
        lambda: broker.create_subscription("events", dots),
    ):
        with pytest.raises(InvalidNameError, match=re.escape("'.' or '..'")):
            create()
    assert [info.name for info in broker.entities()] == before
    assert_balanced(broker)
