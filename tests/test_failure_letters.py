"""Dead-letters that each carry their own reason, description and failure, settled together:
what every poison path hands the broker (a pipeline's failing rows, a Processor's handler
errors). A lock's letters move in one call, and each message keeps what it carried."""

from __future__ import annotations

import pytest

from poisonq import (
    Abandon,
    Broker,
    Complete,
    DeadLetter,
    FailureRecord,
    InvalidOptionError,
    Message,
    MessageLockLostError,
)
from tests.helpers import assert_balanced

DLQ = "orders/$deadletterqueue"


def _failure(n: int) -> FailureRecord:
    return FailureRecord(
        time=1.0, error_type=f"Error{n % 2}", message=f"row {n} is bad", fingerprint=f"fp{n % 2}"
    )


def _letter(seq: int, token: str, n: int) -> DeadLetter:
    return DeadLetter(seq, token, f"Reason{n % 3}", f"row {n}: bad", _failure(n))


def test_each_dead_letter_of_one_settle_keeps_its_own_reason_description_and_failure(
    broker: Broker, queue: str
) -> None:
    """Six letters under one lock, three reasons, two fingerprints, six descriptions and
    failures: each message ends in the dead-letter queue with what it carried, its failure
    appended to its history, and the groups, the timeline and the ledger count each."""
    broker.sender(queue).send([Message(body=str(n).encode()) for n in range(6)])
    messages = broker.receiver(queue).receive(max_messages=6)
    letters = [_letter(m.sequence_number, m.lock_token or "", n) for n, m in enumerate(messages)]
    assert broker.settle(queue, letters) == []
    dead = {m.sequence_number: m for m in broker.peek(DLQ, max_messages=10)}
    for n, letter in enumerate(letters):
        message = dead[letter.sequence_number]
        assert message.dead_letter_reason == f"Reason{n % 3}"
        assert message.dead_letter_error_description == f"row {n}: bad"
        assert [f.message for f in message.failures] == [f"row {n} is bad"]
        assert message.failures[-1].fingerprint == f"fp{n % 2}"
    by_reason = {g.key: g.count for g in broker.dead_letter_groups(queue, by="reason")}
    assert by_reason == {"Reason0": 2, "Reason1": 2, "Reason2": 2}
    by_print = {g.key: g.count for g in broker.dead_letter_groups(queue, by="fingerprint")}
    assert by_print == {"fp0": 3, "fp1": 3}
    timeline = broker.dead_letter_timeline(queue, by="reason")
    assert {key: sum(bars) for key, bars in timeline.series.items()} == by_reason
    assert broker.get_queue(queue).ledger.dead_lettered == 6
    assert_balanced(broker)


def test_a_lost_lock_among_dead_letters_with_their_own_failures_settles_nothing(
    broker: Broker, queue: str
) -> None:
    """One letter's lock is lost (its message completed already): the settle raises
    MessageLockLostError naming it and moves none of the others."""
    broker.sender(queue).send([Message(body=str(n).encode()) for n in range(4)])
    messages = broker.receiver(queue).receive(max_messages=4)
    gone = messages[2]
    broker.settle(queue, [Complete(gone.sequence_number, gone.lock_token or "")])
    letters = [_letter(m.sequence_number, m.lock_token or "", n) for n, m in enumerate(messages)]
    with pytest.raises(MessageLockLostError) as raised:
        broker.settle(queue, letters)
    assert raised.value.sequence_numbers == [gone.sequence_number]
    assert broker.peek(DLQ, max_messages=10) == []
    assert broker.counts(queue)["locked"] == 3
    assert_balanced(broker)


def test_a_dead_letter_without_a_description_is_described_by_its_last_failure(
    broker: Broker, queue: str
) -> None:
    """Beside letters that carry a description, one that does not is described by the last
    failure recorded on its message."""
    broker.sender(queue).send([Message(body=b"a"), Message(body=b"b")])
    receiver = broker.receiver(queue)
    first = receiver.receive(max_messages=2)
    broker.settle(
        queue, [Abandon(m.sequence_number, m.lock_token or "", _failure(1)) for m in first]
    )
    a, b = receiver.receive(max_messages=2)
    broker.settle(
        queue,
        [
            DeadLetter(a.sequence_number, a.lock_token or "", "Bad", None),
            DeadLetter(b.sequence_number, b.lock_token or "", "Bad", "its own", _failure(2)),
        ],
    )
    dead = {m.sequence_number: m for m in broker.peek(DLQ, max_messages=10)}
    assert dead[a.sequence_number].dead_letter_error_description == "Error1: row 1 is bad"
    assert dead[b.sequence_number].dead_letter_error_description == "its own"
    assert [f.message for f in dead[b.sequence_number].failures] == ["row 1 is bad", "row 2 is bad"]
    assert_balanced(broker)


def test_dead_letters_with_their_own_failures_are_forwarded_each_keeping_its_reason(
    broker: Broker,
) -> None:
    """A queue that forwards its dead letters: every letter of the settle arrives in the
    destination, still with its own reason and description."""
    broker.create_queue("errors")
    broker.create_queue("orders", forward_dead_lettered_messages_to="errors")
    broker.sender("orders").send([Message(body=str(n).encode()) for n in range(4)])
    messages = broker.receiver("orders").receive(max_messages=4)
    letters = [_letter(m.sequence_number, m.lock_token or "", n) for n, m in enumerate(messages)]
    broker.settle("orders", letters)
    assert broker.peek(DLQ, max_messages=10) == []
    arrived = {m.sequence_number: m for m in broker.peek("errors", max_messages=10)}
    assert {seq: m.dead_letter_reason for seq, m in arrived.items()} == {
        letter.sequence_number: letter.reason for letter in letters
    }
    assert all(
        arrived[letter.sequence_number].dead_letter_error_description == letter.description
        for letter in letters
    )
    assert_balanced(broker)


def test_a_lease_dead_letters_its_failing_rows_each_with_its_own_failure(broker: Broker) -> None:
    """A pipeline's lease settles its failing rows (held by the lease, not by locks of their
    own) with settle_held, each with its own failure; the rest is completed with the lease."""
    broker.create_queue("orders", lock_duration=60)
    broker.sender("orders").send([Message(body=str(n).encode()) for n in range(10)])
    lease = broker.acquire_lease("orders", "job", 1, 10)
    assert lease is not None
    seqs = [row[0] for row in broker.lease_rows(lease)]
    failing = seqs[1::3]
    letters = [_letter(seq, lease.lock_token, n) for n, seq in enumerate(failing)]
    assert broker.settle_held("orders", letters) == ([], [])
    assert broker.complete_lease(lease) == len(seqs) - len(failing)
    dead = broker.peek(DLQ, max_messages=20)
    assert [m.sequence_number for m in dead] == failing
    assert [m.failures[-1].message for m in dead] == [f"row {n} is bad" for n in range(3)]
    assert_balanced(broker)


def test_abandons_of_one_settle_each_append_their_own_failure(broker: Broker, queue: str) -> None:
    """Abandons settled together return their messages, each with its own failure appended
    to its history (and none poisoned: deliveries are left)."""
    broker.sender(queue).send([Message(body=str(n).encode()) for n in range(4)])
    messages = broker.receiver(queue).receive(max_messages=4)
    abandons = [
        Abandon(m.sequence_number, m.lock_token or "", _failure(n)) for n, m in enumerate(messages)
    ]
    assert broker.settle(queue, abandons) == []
    back = {m.sequence_number: m for m in broker.peek(queue, max_messages=10)}
    for n, abandon in enumerate(abandons):
        assert [f.message for f in back[abandon.sequence_number].failures] == [f"row {n} is bad"]
    assert broker.get_queue(queue).ledger.abandoned == 4
    assert_balanced(broker)


def test_abandons_that_use_the_last_delivery_are_poisoned_each_described_by_its_own_failure(
    broker: Broker,
) -> None:
    """On a queue of one delivery, abandons settled together are all poisoned (moved to the
    dead-letter queue as MaxDeliveryCountExceeded), each described by its own failure."""
    broker.create_queue("orders", max_delivery_count=1)
    broker.sender("orders").send([Message(body=str(n).encode()) for n in range(4)])
    messages = broker.receiver("orders").receive(max_messages=4)
    abandons = [
        Abandon(m.sequence_number, m.lock_token or "", _failure(n)) for n, m in enumerate(messages)
    ]
    assert broker.settle("orders", abandons) == [a.sequence_number for a in abandons]
    dead = {m.sequence_number: m for m in broker.peek(DLQ, max_messages=10)}
    for n, abandon in enumerate(abandons):
        message = dead[abandon.sequence_number]
        assert message.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert message.dead_letter_error_description == f"Error{n % 2}: row {n} is bad"
    assert broker.get_queue("orders").ledger.poisoned == 4
    assert_balanced(broker)


def test_a_reason_that_is_not_unicode_among_the_letters_is_refused_and_nothing_moves(
    broker: Broker, queue: str
) -> None:
    """A lone surrogate in one letter's reason cannot be stored: the settle raises
    InvalidOptionError, as for a letter alone, and every message stays locked."""
    broker.sender(queue).send([Message(body=b"a"), Message(body=b"b")])
    a, b = broker.receiver(queue).receive(max_messages=2)
    letters = [_letter(a.sequence_number, a.lock_token or "", 0)]
    letters.append(DeadLetter(b.sequence_number, b.lock_token or "", "bad\ud800", "x"))
    with pytest.raises(InvalidOptionError):
        broker.settle(queue, letters)
    assert broker.counts(queue)["locked"] == 2
    assert_balanced(broker)
