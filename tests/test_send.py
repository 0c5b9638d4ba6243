"""Sending: batches are atomic and durable; scheduling, TTL, duplicates, quotas."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest

import poisonq
from poisonq import (
    Broker,
    DeadLetterReason,
    InvalidOperationError,
    InvalidOptionError,
    ManualClock,
    Message,
    MessageTooLargeError,
    QuotaExceededError,
)
from tests.helpers import assert_balanced


def test_a_batch_is_all_or_nothing(broker: Broker, queue: str) -> None:
    sender = broker.sender(queue)
    with pytest.raises(InvalidOptionError):
        sender.send([Message(body=b"ok"), Message(body=b"ok"), Message(body=12)])  # type: ignore[arg-type]
    assert broker.counts(queue)["active"] == 0
    with pytest.raises(MessageTooLargeError) as caught:
        sender.send([Message(body=b"ok"), Message(body=b"x" * 300_000, message_id="big")])
    assert caught.value.message_id == "big"
    assert broker.counts(queue)["active"] == 0
    assert_balanced(broker)


def test_sent_messages_are_durable_and_keep_their_fields(
    broker: Broker, queue: str, url: str
) -> None:
    seqs = broker.sender(queue).send(
        Message(
            body="héllo",
            message_id="o-1",
            content_type="text/plain",
            subject="order",
            properties={"region": "eu", "n": 3, "x": 1.5, "ok": True, "none": None},
            correlation_id="c-1",
            reply_to="replies",
        )
    )
    with poisonq.connect(url) as other:
        (message,) = other.peek(queue)
    assert message.sequence_number == seqs[0]
    assert message.body == "héllo".encode()
    assert message.text == "héllo"
    assert (message.message_id, message.subject, message.content_type) == (
        "o-1",
        "order",
        "text/plain",
    )
    assert message.properties == {"region": "eu", "n": 3, "x": 1.5, "ok": True, "none": None}
    assert (message.correlation_id, message.reply_to) == ("c-1", "replies")
    assert message.delivery_count == 0
    assert message.enqueued_time.tzinfo is UTC


def test_to_reply_session_and_partition_key_are_kept_through_receipt_and_resubmit(
    broker: Broker, queue: str
) -> None:
    """Service Bus' ``to``, ``reply_to_session_id`` and ``partition_key`` are kept with the
    message, also by a resubmit's copy; ``sys.to`` is a field a filter can read. A partition
    key beside a session id must be that id."""
    sender = broker.sender(queue)
    fields = {"to": "billing", "reply_to_session_id": "r-7", "partition_key": "p-1"}
    sender.send([Message(body=b"a", **fields), Message(body=b"b")])
    receiver = broker.receiver(queue)
    first, second = receiver.receive(max_messages=2)
    assert (first.to, first.reply_to_session_id, first.partition_key) == tuple(fields.values())
    assert (second.to, second.reply_to_session_id, second.partition_key) == (None, None, None)
    receiver.dead_letter(first, reason="Later")
    receiver.complete(second)
    broker.resubmit(queue, reason="Later")
    (copy,) = broker.peek(queue)
    assert (copy.to, copy.reply_to_session_id, copy.partition_key) == tuple(fields.values())
    assert poisonq.SqlFilter("sys.to = 'billing'").matches({"sys.to": "billing"})
    with pytest.raises(InvalidOptionError, match="partition_key"):
        sender.send(Message(session_id="s-1", partition_key="p-1"))
    with pytest.raises(InvalidOptionError, match="to"):
        sender.send(Message(to="x" * 200))
    assert_balanced(broker)


@pytest.mark.parametrize(
    "bad",
    [
        Message(properties={"k": [1, 2]}),  # type: ignore[dict-item]
        Message(properties={"": 1}),
        Message(properties={"k": float("nan")}),
        Message(message_id=""),
        Message(message_id="x" * 129),
        Message(subject=5),  # type: ignore[arg-type]
        Message(time_to_live=-3),
        Message(scheduled_enqueue_time=datetime(2030, 1, 1)),
    ],
)
def test_bad_messages_are_refused_with_a_clear_error(
    broker: Broker, queue: str, bad: Message
) -> None:
    with pytest.raises(InvalidOptionError):
        broker.sender(queue).send(bad)


def test_subqueues_cannot_be_sent_to(broker: Broker, queue: str) -> None:
    with pytest.raises(InvalidOperationError):
        broker.sender(f"{queue}/$deadletterqueue").send(Message())


def test_scheduled_messages_stay_invisible_until_their_time(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    at = datetime.fromtimestamp(clock.now(), UTC) + timedelta(minutes=5)
    broker.sender(queue).schedule(Message(body=b"later"), at)
    assert broker.counts(queue)["scheduled"] == 1
    receiver = broker.receiver(queue)
    assert receiver.receive() == []
    clock.advance(301)
    (message,) = receiver.receive()
    assert message.body == b"later"
    assert message.scheduled_enqueue_time == at


def test_cancelling_scheduled_messages_drops_them_all_or_none(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """Service Bus' cancel of a scheduled message: the pending messages leave the queue,
    counted as dropped, in one transaction; a number naming no pending message (already
    due, or never scheduled) cancels nothing."""
    at = datetime.fromtimestamp(clock.now(), UTC) + timedelta(minutes=5)
    sender = broker.sender(queue)
    first, second, third = sender.schedule([Message(body=str(n)) for n in range(3)], at)
    (active,) = sender.send(Message(body=b"now"))
    with pytest.raises(poisonq.MessageNotFoundError) as caught:
        sender.cancel_scheduled([first, active])
    assert caught.value.sequence_number == active
    assert broker.counts(queue)["scheduled"] == 3
    assert sender.cancel_scheduled(first) == 1
    assert sender.cancel_scheduled([second, second]) == 1
    with pytest.raises(poisonq.MessageNotFoundError):
        sender.cancel_scheduled(first)  # cancelled already
    clock.advance(301)
    with pytest.raises(poisonq.MessageNotFoundError):
        sender.cancel_scheduled(third)  # its time came: it is in the queue
    counts = broker.counts(queue)
    assert (counts["scheduled"], counts["active"], counts["dropped"]) == (0, 2, 2)
    assert_balanced(broker)


def test_cancelling_a_topics_scheduled_message_cancels_every_subscriptions_copy(
    broker: Broker, clock: ManualClock
) -> None:
    """Scheduling to a topic puts a copy in each subscription, each with its own sequence
    number; cancelling those numbers on the topic drops every copy."""
    broker.create_topic("events")
    broker.create_subscription("events", "a")
    broker.create_subscription("events", "b")
    at = datetime.fromtimestamp(clock.now(), UTC) + timedelta(minutes=5)
    seqs = broker.sender("events").schedule(Message(body=b"later"), at)
    assert len(seqs) == 2
    assert broker.sender("events").cancel_scheduled(seqs) == 2
    for sub in ("events/subscriptions/a", "events/subscriptions/b"):
        assert broker.counts(sub)["scheduled"] == 0
    assert_balanced(broker)


def test_ttl_is_the_shorter_of_message_and_queue(broker: Broker, clock: ManualClock) -> None:
    broker.create_queue("orders", default_message_ttl=60)
    broker.sender("orders").send(
        [
            Message(body=b"a"),
            Message(body=b"b", time_to_live=10),
            Message(body=b"c", time_to_live=600),
        ]
    )
    expiries = [m.expires_at.timestamp() - clock.now() for m in broker.peek("orders")]  # type: ignore[union-attr]
    assert expiries == [60, 10, 60]


def test_duplicates_inside_the_window_are_accepted_and_ignored(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_queue("orders", requires_duplicate_detection=True, duplicate_detection_window=60)
    sender = broker.sender("orders")
    assert (
        len(
            sender.send([Message(message_id="a"), Message(message_id="b"), Message(message_id="a")])
        )
        == 2
    )
    receiver = broker.receiver("orders")
    receiver.complete(receiver.receive(max_messages=10))
    assert sender.send(Message(message_id="a")) == []  # completed, still inside the window
    clock.advance(61)
    assert len(sender.send(Message(message_id="a"))) == 1
    assert broker.counts("orders")["active"] == 1
    assert_balanced(broker)


def test_without_duplicate_detection_the_same_id_is_sent_twice(broker: Broker, queue: str) -> None:
    broker.sender(queue).send([Message(message_id="a"), Message(message_id="a")])
    assert broker.counts(queue)["active"] == 2


def test_properties_too_large_are_dead_lettered_on_arrival(broker: Broker) -> None:
    broker.create_queue("orders", max_properties_size=100)
    seqs = broker.sender("orders").send([Message(body=b"ok"), Message(properties={"k": "v" * 200})])
    assert len(seqs) == 2
    counts = broker.counts("orders")
    assert (counts["active"], counts["dead_lettered"]) == (1, 1)
    (dead,) = broker.peek("orders/$deadletterqueue")
    assert dead.sequence_number == seqs[1]
    assert dead.dead_letter_reason == DeadLetterReason.HEADER_SIZE_EXCEEDED
    assert dead.dead_letter_source == "orders"
    assert_balanced(broker)


def test_the_queue_size_quota_refuses_the_whole_batch(broker: Broker) -> None:
    broker.create_queue("orders", max_size=2000)
    sender = broker.sender("orders")
    sender.send([Message(body=b"x" * 900), Message(body=b"x" * 900)])
    with pytest.raises(QuotaExceededError) as caught:
        sender.send(Message(body=b"x" * 300))
    assert caught.value.limit == 2000
    receiver = broker.receiver("orders")
    receiver.complete(receiver.receive(max_messages=1))
    assert len(sender.send(Message(body=b"x" * 300))) == 1


@pytest.mark.parametrize("text_field", ["body", "message_id", "subject", "session_id"])
def test_text_the_store_cannot_encode_is_refused_and_sends_nothing(
    broker: Broker, queue: str, text_field: str
) -> None:
    """A lone surrogate is not Unicode a store can keep: the driver refused it with a
    UnicodeEncodeError; now the store turns that into the caller's error."""
    message = Message(**{"body": b"x", text_field: "bad \ud800"})  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="valid Unicode"):
        broker.sender(queue).send([Message(body=b"ok"), message])
    assert broker.counts(queue)["active"] == 0
    assert_balanced(broker)


@pytest.mark.parametrize(
    "when",
    [
        {"time_to_live": 1e300},
        {"time_to_live": timedelta.max},
        {"scheduled_enqueue_time": datetime.max.replace(tzinfo=UTC)},
        {"scheduled_enqueue_time": "now"},
    ],
)
def test_times_past_any_date_are_refused(
    broker: Broker, queue: str, when: dict[str, object]
) -> None:
    """A message that expired or came due after year 9999 was sent, then made every read of
    its queue fail (its times could not be read back as dates)."""
    with pytest.raises(InvalidOptionError):
        broker.sender(queue).send(Message(body=b"x", **when))  # type: ignore[arg-type]
    assert broker.peek(queue) == []


@pytest.mark.parametrize(
    "fields",
    [
        {"subject": "a\x00b"},
        {"message_id": "\x00"},
        {"properties": {"a\x00": 1}},
        {"properties": {"a": "\x00"}},
        {"subject": 5},
    ],
)
def test_nul_in_text_is_refused_on_both_stores(
    broker: Broker, queue: str, fields: dict[str, object]
) -> None:
    """SQLite kept a NUL where PostgreSQL refused it: the stores disagreed on one message."""
    with pytest.raises(InvalidOptionError):
        broker.sender(queue).send(Message(body=b"\x00 is fine in a body", **fields))  # type: ignore[arg-type]
    assert broker.counts(queue)["active"] == 0


def test_a_message_without_an_id_gets_a_random_uuid_never_given_before() -> None:
    """Ids come from a page of random bytes read at a time: each id is a version 4 UUID,
    none repeats within a process, and a forked child does not hand out its parent's."""
    ids = [Message().message_id for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert {uuid.UUID(i).version for i in ids} == {4}
    assert {uuid.UUID(i).variant for i in ids} == {uuid.RFC_4122}
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its next ids, to the parent
        os.write(write, " ".join(Message().message_id for _ in range(10)).encode())
        os._exit(0)
    os.waitpid(child, 0)
    os.close(write)
    theirs = set(os.read(read, 4096).decode().split())
    os.close(read)
    mine = {Message().message_id for _ in range(10)}
    assert len(theirs) == 10
    assert not theirs & mine
