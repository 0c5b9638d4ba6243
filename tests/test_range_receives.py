"""The rules of a receive, on both stores, as they are kept when a receive takes its batch as
one range (a cover, as a lease does) rather than a lock on every message: each rule must mean
the same whichever way a batch was locked (a session's receive, or one on PostgreSQL that
cannot have the cover lock, locks row by row)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from poisonq import (
    Broker,
    DeadLetterReason,
    ManualClock,
    Message,
    MessageLockLostError,
    MessageState,
)
from tests.helpers import assert_balanced, execute_behind_the_back, fill


def test_two_receivers_never_hold_one_message(broker: Broker, queue: str) -> None:
    """A second receive takes the messages after the first one's batch, never one of it."""
    fill(broker, queue, 10)
    first = broker.receiver(queue).receive(max_messages=4)
    second = broker.receiver(queue).receive(max_messages=10)
    assert len(first) == 4 and len(second) == 6
    assert not {m.sequence_number for m in first} & {m.sequence_number for m in second}
    assert broker.receiver(queue).receive(max_messages=10) == []
    broker.receiver(queue).complete(first + second)
    assert_balanced(broker)


def test_a_message_sent_after_a_batch_was_taken_lands_above_it_and_is_delivered(
    broker: Broker, queue: str
) -> None:
    """Completing a batch completes what it holds and nothing sent after it was taken."""
    fill(broker, queue, 3)
    receiver = broker.receiver(queue)
    batch = receiver.receive(max_messages=10)
    (late,) = broker.sender(queue).send(Message(b"late"))
    assert late > max(m.sequence_number for m in batch)
    receiver.complete(batch)
    (delivered,) = receiver.receive(max_messages=10)
    assert (delivered.sequence_number, delivered.body) == (late, b"late")
    receiver.complete(delivered)
    assert_balanced(broker)


def test_an_expired_batch_lock_gives_the_messages_back_with_their_delivery_counted(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A batch whose lock ran out is received again, each message on its second delivery,
    and the old lock settles nothing."""
    fill(broker, queue, 3)
    receiver = broker.receiver(queue)
    batch = receiver.receive(max_messages=3)
    assert [m.delivery_count for m in batch] == [1, 1, 1]
    clock.advance(31)
    again = receiver.receive(max_messages=3)
    assert [m.sequence_number for m in again] == [m.sequence_number for m in batch]
    assert [m.delivery_count for m in again] == [2, 2, 2]
    with pytest.raises(MessageLockLostError):
        receiver.complete(batch)
    receiver.complete(again)
    assert_balanced(broker)


def test_messages_of_one_batch_are_settled_each_its_own_way(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """Out of one received batch: one completed, one abandoned (back, one delivery more),
    one deferred, one dead-lettered, one renewed and still held after the batch's lock ran
    out, and the ledger balances."""
    fill(broker, queue, 5)
    receiver = broker.receiver(queue)
    done, back, kept, dead, renewed = receiver.receive(max_messages=5)
    receiver.complete(done)
    receiver.abandon(back)
    receiver.defer(kept)
    receiver.dead_letter(dead, reason="Bad", description="bad order")
    clock.advance(20)
    receiver.renew_lock(renewed)
    clock.advance(20)  # the batch's lock ran out; the renewed message's did not
    (again,) = receiver.receive(max_messages=5)
    assert (again.sequence_number, again.delivery_count) == (back.sequence_number, 2)
    receiver.complete(renewed)
    (deferred,) = receiver.receive_deferred(kept.sequence_number)
    assert deferred.delivery_count == 2
    (letter,) = broker.peek(f"{queue}/$deadletterqueue", max_messages=5)
    assert (letter.sequence_number, letter.dead_letter_reason) == (dead.sequence_number, "Bad")
    assert letter.delivery_count == 1
    assert_balanced(broker)


def test_the_last_delivery_of_a_batch_message_abandoned_is_dead_lettered(broker: Broker) -> None:
    """The poison rule holds for a message out of a batch: abandoned on its last delivery,
    it is dead-lettered as MaxDeliveryCountExceeded, the rest of its batch still held."""
    broker.create_queue("once", max_delivery_count=1, lock_duration=30)
    fill(broker, "once", 3)
    receiver = broker.receiver("once")
    poisoned, *rest = receiver.receive(max_messages=3)
    receiver.abandon(poisoned)
    (letter,) = broker.peek("once/$deadletterqueue", max_messages=5)
    assert letter.sequence_number == poisoned.sequence_number
    assert letter.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
    held = broker.peek("once", max_messages=5)
    assert [m.state for m in held] == [MessageState.LOCKED] * 2
    receiver.complete(rest)
    assert_balanced(broker)


def test_a_settled_batch_leaves_no_row_behind(broker: Broker, queue: str, url: str) -> None:
    """Receives keep no record once what they took is settled: a batch completed whole at
    once, or settled in parts and then passed by the next receive."""
    fill(broker, queue, 10)
    receiver = broker.receiver(queue)
    receiver.complete(receiver.receive(max_messages=4))
    assert execute_behind_the_back(url, "SELECT count(*) FROM leases") == [(0,)]
    first, *rest = receiver.receive(max_messages=4)
    receiver.abandon(first)
    receiver.complete(rest)
    receiver.complete(receiver.receive(max_messages=10))
    assert execute_behind_the_back(url, "SELECT count(*) FROM leases") == [(0,)]
    assert_balanced(broker)


def test_a_received_batch_is_one_row_and_no_message_is_written_until_it_is_settled(
    broker: Broker, queue: str, url: str
) -> None:
    """A receive without a session records its batch as one row of ``leases`` (a cover of
    no consumer) and leaves the messages' rows as they were; readers still see each message
    locked, with its delivery counted."""
    fill(broker, queue, 5)
    receiver = broker.receiver(queue)
    batch = receiver.receive(max_messages=5)
    assert execute_behind_the_back(url, "SELECT consumer, count FROM leases") == [("", 5)]
    assert execute_behind_the_back(
        url, "SELECT count(*) FROM messages WHERE state = 'active' AND delivery_count = 0"
    ) == [(5,)]
    peeked = broker.peek(queue, max_messages=10)
    assert [m.state for m in peeked] == [MessageState.LOCKED] * 5
    assert [m.delivery_count for m in peeked] == [1] * 5
    receiver.complete(batch)
    assert execute_behind_the_back(url, "SELECT count(*) FROM leases") == [(0,)]
    assert_balanced(broker)


def test_a_scheduled_message_that_comes_due_inside_a_held_batch_is_not_held_by_it(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A message scheduled between two messages of a batch, coming due while the batch is
    held, is received on its own, and completing the batch leaves it alone."""
    sender = broker.sender(queue)
    (first,) = sender.send(Message(b"first"))
    at = datetime.fromtimestamp(clock.now(), UTC) + timedelta(seconds=10)
    (later,) = sender.schedule(Message(b"later"), at)
    (last,) = sender.send(Message(b"last"))
    receiver = broker.receiver(queue)
    batch = receiver.receive(max_messages=10)
    assert [m.sequence_number for m in batch] == [first, last]
    clock.advance(11)
    (due,) = receiver.receive(max_messages=10)
    assert (due.sequence_number, due.body) == (later, b"later")
    receiver.complete(batch)
    assert [m.state for m in broker.peek(queue, max_messages=10)] == [MessageState.LOCKED]
    receiver.complete(due)
    assert_balanced(broker)


def test_a_message_dead_lettered_into_a_held_batch_s_range_is_received_apart(
    broker: Broker, queue: str
) -> None:
    """A dead-letter queue's received batch does not take in a message dead-lettered later
    whose sequence number falls inside it: that one is received by the next receive, and
    completing the batch leaves it alone."""
    fill(broker, queue, 3)
    receiver = broker.receiver(queue)
    one, two, three = receiver.receive(max_messages=3)
    receiver.dead_letter([one, three], reason="Bad")
    letters = broker.receiver(f"{queue}/$deadletterqueue")
    batch = letters.receive(max_messages=10)
    assert [m.sequence_number for m in batch] == [one.sequence_number, three.sequence_number]
    receiver.dead_letter(two, reason="Bad")
    (late,) = letters.receive(max_messages=10)
    assert late.sequence_number == two.sequence_number
    letters.complete(batch)
    assert [m.sequence_number for m in broker.peek(f"{queue}/$deadletterqueue")] == [
        two.sequence_number
    ]
    letters.complete(late)
    assert_balanced(broker)


def test_a_batch_whose_lock_ran_out_leaves_no_row_once_its_queue_is_housekept(
    broker: Broker, queue: str, url: str, clock: ManualClock
) -> None:
    """The housekeeping that gives back a received batch whose lock ran out also forgets
    its cover, though nobody receives from the queue again."""
    fill(broker, queue, 3)
    broker.receiver(queue).receive(max_messages=3)
    clock.advance(31)
    broker.housekeep()
    assert execute_behind_the_back(url, "SELECT count(*) FROM leases") == [(0,)]
    assert [m.delivery_count for m in broker.peek(queue, max_messages=5)] == [1, 1, 1]
    assert_balanced(broker)
