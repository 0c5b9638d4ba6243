"""Dead-lettering, the dead-letter queue, failure history, resubmit and purge."""

from __future__ import annotations

import threading

import pytest

from poisonq import (
    NO_VALUE,
    Broker,
    DeadLetterReason,
    InvalidOperationError,
    InvalidOptionError,
    ManualClock,
    Message,
    MessageState,
    TaskNotFoundError,
    TaskRunningError,
)
from poisonq.engine.driving import drive
from poisonq.store.base import MessageFilter
from poisonq.tasks import BulkTask
from tests.helpers import assert_balanced

DLQ = "orders/$deadletterqueue"


def _fail_until_poisoned(broker: Broker, queue: str, error: Exception) -> list[int]:
    receiver = broker.receiver(queue)
    poisoned: list[int] = []
    while got := receiver.receive(max_messages=100):
        poisoned += receiver.abandon(got, error=error)
    return poisoned


def test_max_delivery_count_moves_to_the_dead_letter_queue(broker: Broker, queue: str) -> None:
    seqs = broker.sender(queue).send([Message(body=b"a"), Message(body=b"b")])
    poisoned = _fail_until_poisoned(broker, queue, KeyError("cust-17"))
    assert poisoned == seqs
    dead = broker.peek(DLQ, max_messages=10)
    assert [m.sequence_number for m in dead] == seqs
    first = dead[0]
    assert first.state is MessageState.DEAD_LETTERED
    assert first.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
    assert first.dead_letter_error_description == "KeyError: 'cust-17'"
    assert first.dead_letter_source == "orders"
    assert (first.delivery_count, first.abort_count) == (3, 3)
    assert len(first.failures) == 3
    assert all(f.error_type == "KeyError" for f in first.failures)
    assert broker.counts(queue)["dead_lettered"] == 2
    assert broker.get_queue(queue).ledger.dead_lettered == 2
    assert_balanced(broker)


def test_drop_handling_removes_poison_and_counts_it(broker: Broker) -> None:
    from poisonq import RetryPolicy

    broker.create_queue(
        "orders", retry=RetryPolicy(receive_retry_count=1, receive_error_handling="drop")
    )
    broker.sender("orders").send(Message(body=b"a"))
    assert len(_fail_until_poisoned(broker, "orders", ValueError("x"))) == 1
    counts = broker.counts("orders")
    assert (counts["dropped"], counts["dead_lettered"], counts["active"]) == (1, 0, 0)
    assert_balanced(broker)


def test_lock_expiries_alone_poison_a_message(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    broker.sender(queue).send(Message(body=b"crashes the worker"))
    receiver = broker.receiver(queue)
    for _ in range(3):
        assert len(receiver.receive()) == 1
        clock.advance(31)
    assert receiver.receive() == []
    (dead,) = broker.peek(DLQ)
    assert dead.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
    assert dead.dead_letter_error_description == "LockExpired: the lock expired"
    assert_balanced(broker)


def test_a_lock_expiry_that_poisons_a_message_describes_it_by_its_last_recorded_failure(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A holder killed during the last delivery records nothing: the expiry that poisons
    the message names the failure recorded before it (its history keeps every entry)."""
    broker.sender(queue).send(Message(body=b"crashes the worker on its second try"))
    receiver = broker.receiver(queue)
    (first,) = receiver.receive()
    receiver.abandon(first, ValueError("no such customer"))
    for _ in range(2):
        assert len(receiver.receive()) == 1
        clock.advance(31)
    assert receiver.receive() == []
    (dead,) = broker.peek(DLQ)
    assert dead.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
    assert dead.dead_letter_error_description == (
        "the lock expired; its last recorded failure: ValueError: no such customer"
    )
    assert [f.error_type for f in dead.failures] == ["ValueError", "LockExpired", "LockExpired"]
    assert_balanced(broker)


def test_expired_messages_are_dead_lettered_never_delivered(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_queue("orders", default_message_ttl=100)
    broker.sender("orders").send([Message(body=b"old", time_to_live=60), Message(body=b"young")])
    clock.advance(61)
    broker.sender("orders").send(Message(body=b"new"))
    got = broker.receiver("orders").receive(max_messages=10)
    assert [m.body for m in got] == [b"young", b"new"]
    (dead,) = broker.peek(DLQ)
    assert dead.body == b"old"
    assert dead.dead_letter_reason == DeadLetterReason.TTL_EXPIRED
    assert_balanced(broker)


def test_expired_messages_are_dropped_when_the_queue_says_so(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_queue(
        "orders", default_message_ttl=60, dead_lettering_on_message_expiration=False
    )
    broker.sender("orders").send(Message(body=b"old"))
    clock.advance(61)
    assert broker.receiver("orders").receive() == []
    assert broker.counts("orders")["dropped"] == 1
    assert_balanced(broker)


def test_application_dead_letter_with_reason_and_history(broker: Broker, queue: str) -> None:
    broker.sender(queue).send(Message(body=b"bad", subject="order"))
    receiver = broker.receiver(queue)
    (message,) = receiver.receive()
    receiver.dead_letter(
        message, reason="InvalidCustomer", description="cust-17 unknown", error=KeyError("cust-17")
    )
    (dead,) = broker.peek(DLQ)
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
        "InvalidCustomer",
        "cust-17 unknown",
    )
    assert dead.failures[-1].error_type == "KeyError"


def test_the_dead_letter_queue_has_peek_lock_no_ttl_and_no_second_dead_letter(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_queue("orders", default_message_ttl=60, max_delivery_count=1)
    broker.sender("orders").send(Message(body=b"x"))
    _fail_until_poisoned(broker, "orders", ValueError("no"))
    clock.advance(10_000)  # far past the TTL: the DLQ keeps it
    dlq = broker.receiver("orders", subqueue="deadletter")
    (message,) = dlq.receive()
    assert message.state is MessageState.LOCKED
    with pytest.raises(InvalidOperationError, match="cannot be dead-lettered again"):
        dlq.dead_letter(message, reason="again")
    dlq.abandon(message)  # back to dead_lettered, no poisoning in a DLQ
    clock.advance(10_000)
    for _ in range(5):
        (message,) = dlq.receive()
        clock.advance(100)  # lock expiries in a DLQ only return the message
    (message,) = dlq.receive()
    assert message.delivery_count == 8
    dlq.complete(message)
    assert broker.counts(DLQ)["completed"] == 1
    assert_balanced(broker)


def _raise(error: Exception) -> Exception:
    try:
        raise error
    except Exception as exc:
        return exc


def test_groups_by_reason_subject_and_fingerprint(broker: Broker, queue: str) -> None:
    sender = broker.sender(queue)
    sender.send([Message(body=b"a", subject="order"), Message(body=b"b", subject="refund")])
    receiver = broker.receiver(queue)
    while got := receiver.receive(max_messages=1):
        text = got[0].body.decode()
        receiver.abandon(got, error=_raise(KeyError(f"cust-{text}")))
    sender.send(Message(body=b"c", subject="order"))
    (c,) = receiver.receive()
    receiver.dead_letter(c, reason="Invalid")
    by_reason = {g.key: g.count for g in broker.dead_letter_groups(queue, by="reason")}
    assert by_reason == {"MaxDeliveryCountExceeded": 2, "Invalid": 1}
    by_subject = {g.key: g.count for g in broker.dead_letter_groups(queue, by="subject")}
    assert by_subject == {"order": 2, "refund": 1}
    groups = broker.dead_letter_groups(queue, by="fingerprint")
    keyed = [g for g in groups if g.key is not None]
    assert len(keyed) == 1 and keyed[0].count == 2 and keyed[0].label == "KeyError"
    with pytest.raises(InvalidOptionError):
        broker.dead_letter_groups(queue, by="colour")


def test_no_value_selects_exactly_the_messages_without_one(broker: Broker, queue: str) -> None:
    """The "(none)" group of a grouping is selectable: NO_VALUE is "has none", not "any"."""
    sender = broker.sender(queue)
    sender.send([Message(body=b"a", subject="order"), Message(body=b"b")])
    _fail_until_poisoned(broker, queue, KeyError("cust-17"))  # a fingerprint each
    sender.send([Message(body=b"c"), Message(body=b"d", subject="order")])
    receiver = broker.receiver(queue)
    receiver.dead_letter(receiver.receive(max_messages=2), reason="Invalid")  # no fingerprint
    without = {g.key: g.count for g in broker.dead_letter_groups(queue, "fingerprint")}[None]
    assert without == broker.count_dead_letters(queue, fingerprint=NO_VALUE) == 2
    assert broker.count_dead_letters(queue, subject=NO_VALUE) == 2
    assert broker.count_dead_letters(queue, subject=NO_VALUE, fingerprint=NO_VALUE) == 1
    assert broker.count_dead_letters(queue, reason=NO_VALUE) == 0
    task = broker.purge(queue, fingerprint=NO_VALUE)
    assert task.done == 2 and task.record.spec["where"]["fingerprint"] == "none"
    assert sorted(m.text for m in broker.peek(DLQ, max_messages=10)) == ["a", "b"]
    assert broker.resubmit(queue, subject=NO_VALUE, rate=None).done == 1
    assert [m.text for m in broker.peek(queue)] == ["b"]
    assert_balanced(broker)


def test_dead_letters_are_found_by_message_id_and_by_text_in_the_body(
    broker: Broker, queue: str
) -> None:
    broker.sender(queue).send(
        [
            Message(body='{"customer": "cust-17", "total": 3}', message_id="o-1"),
            Message(body='{"customer": "cust-42"}', message_id="o-2"),
            Message(body=b"\xff\xfe cust-17 in binary", message_id="o-3"),
        ]
    )
    receiver = broker.receiver(queue)
    receiver.dead_letter(receiver.receive(max_messages=3), reason="Invalid")
    found = broker.dead_letters(queue, body_contains="cust-17")
    assert [m.message_id for m in found] == ["o-1", "o-3"]
    assert broker.count_dead_letters(queue, body_contains="cust-17", message_id="o-3") == 1
    assert [m.message_id for m in broker.dead_letters(queue, message_id="o-2")] == ["o-2"]
    assert broker.count_dead_letters(queue, body_contains="no such text") == 0
    # The search is of the body's bytes, so it is case-sensitive, on every store alike.
    assert broker.count_dead_letters(queue, body_contains="CUST-17") == 0
    assert broker.count_dead_letters(queue, body_contains="Customer") == 0
    assert broker.purge(queue, body_contains='"total"').done == 1
    assert_balanced(broker)


def _dead_letter(broker: Broker, queue: str, subjects: list[str]) -> list[int]:
    broker.sender(queue).send([Message(body=s.encode(), subject=s) for s in subjects])
    receiver = broker.receiver(queue)
    got = receiver.receive(max_messages=len(subjects))
    receiver.dead_letter(got, reason="Bad")
    return [m.sequence_number for m in got]


def test_resubmit_moves_back_with_a_fresh_delivery_count(broker: Broker, queue: str) -> None:
    old = _dead_letter(broker, queue, ["a", "b", "a"])
    task = broker.resubmit(queue, subject="a", rate=None)
    assert (task.status, task.total, task.done) == ("completed", 2, 2)
    back = broker.peek(queue, max_messages=10)
    assert [m.subject for m in back] == ["a", "a"]
    assert all(m.sequence_number > max(old) for m in back)  # at the back of the queue
    assert all(m.delivery_count == 0 and m.resubmit_count == 1 for m in back)
    assert all(m.dead_letter_reason is None for m in back)
    assert broker.counts(queue)["dead_lettered"] == 1
    assert broker.get_queue(DLQ).ledger.resubmitted == 2
    assert_balanced(broker)


def test_a_resubmitted_message_gets_a_fresh_ttl(broker: Broker, clock: ManualClock) -> None:
    broker.create_queue("orders", default_message_ttl=60)
    broker.sender("orders").send(Message(body=b"x"))
    clock.advance(61)
    assert broker.receiver("orders").receive() == []  # expired: dead-lettered
    broker.resubmit("orders", rate=None)
    (back,) = broker.receiver("orders").receive()
    assert back.expires_at.timestamp() == clock.now() + 60  # type: ignore[union-attr]


def test_resubmit_keeps_failure_history(broker: Broker, queue: str) -> None:
    broker.sender(queue).send(Message(body=b"x"))
    _fail_until_poisoned(broker, queue, ValueError("boom"))
    broker.resubmit(queue, reason="MaxDeliveryCountExceeded", rate=None)
    (back,) = broker.peek(queue)
    assert [f.message for f in back.failures] == ["boom"] * 3


def test_resubmit_to_another_queue_and_by_sequence_range(broker: Broker, queue: str) -> None:
    broker.create_queue("repair")
    seqs = _dead_letter(broker, queue, ["a", "b", "c", "d"])
    broker.resubmit(queue, to="repair", min_sequence=seqs[1], max_sequence=seqs[2], rate=None)
    assert [m.subject for m in broker.peek("repair", max_messages=10)] == ["b", "c"]
    assert_balanced(broker)


def test_resubmit_is_paced_by_its_rate(broker: Broker, queue: str, clock: ManualClock) -> None:
    _dead_letter(broker, queue, [str(i) for i in range(100)])
    seen: list[int] = []
    start = clock.now()
    broker.resubmit(queue, rate=20, progress=lambda t: seen.append(t.done))
    assert clock.now() - start == pytest.approx(100 / 20)  # the manual clock counts the waits
    assert seen[-1] == 100 and seen == sorted(seen) and len(seen) > 5


def test_a_cancelled_resubmit_stops_and_keeps_what_moved(broker: Broker, queue: str) -> None:
    _dead_letter(broker, queue, [str(i) for i in range(50)])

    def cancel_after_first_chunk(task) -> None:  # type: ignore[no-untyped-def]
        if task.done >= 10 and task.status == "running":
            task.cancel()

    task = broker.resubmit(queue, rate=50, progress=cancel_after_first_chunk)
    assert task.status == "cancelled"
    assert task.done == 10
    assert broker.counts(queue)["active"] == 10
    assert broker.counts(queue)["dead_lettered"] == 40
    assert_balanced(broker)


def test_a_task_whose_queue_is_deleted_ends_with_its_error_in_the_background(
    broker: Broker, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task is deleted with its queue: its runner stops at its next chunk with
    ``TaskNotFoundError`` kept on the task, and its thread ends without an uncaught
    exception (it has no record left to mark failed)."""
    uncaught: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    _dead_letter(broker, queue, [str(i) for i in range(30)])

    def delete_after_first_chunk(task) -> None:  # type: ignore[no-untyped-def]
        if task.done:
            broker.delete_queue(queue)

    task = broker.resubmit(queue, rate=50, wait=False, progress=delete_after_first_chunk)
    with pytest.raises(TaskNotFoundError):
        task.wait(timeout=30)  # it ran to its end; then its record is gone
    assert not task.running and uncaught == []
    assert isinstance(task.error, TaskNotFoundError)
    assert "deleted with its queue" in str(task.error)
    assert_balanced(broker)


def test_resubmit_in_the_background(broker: Broker, queue: str) -> None:
    _dead_letter(broker, queue, ["a", "b"])
    task = broker.resubmit(queue, rate=None, wait=False)
    record = task.wait(timeout=30)
    assert (record.status, record.done) == ("completed", 2)


def test_bad_resubmit_arguments(broker: Broker, queue: str) -> None:
    for rate in (0, float("nan"), float("inf"), 2**2000):
        with pytest.raises(InvalidOptionError):
            broker.resubmit(queue, rate=rate)
    with pytest.raises(InvalidOptionError, match="unknown filter"):
        broker.resubmit(queue, colour="red")
    # A filter value of the wrong kind failed the task's record (TypeError) or the store.
    for where in ({"reason": b"x"}, {"subject": 5}, {"min_sequence": "1"}, {"since": "now"}):
        with pytest.raises(InvalidOptionError):
            broker.resubmit(queue, **where)
        with pytest.raises(InvalidOptionError):
            broker.dead_letters(queue, **where)
    with pytest.raises(InvalidOptionError):
        broker.dead_letters(queue, after=[])


def test_an_empty_range_is_refused_not_answered_with_nothing(broker: Broker, queue: str) -> None:
    """``until`` at or before ``since`` (or ``max_sequence`` below ``min_sequence``) selects
    nothing by construction: a typo, refused with why, so a search does not look empty."""
    for where in (
        {"since": 1_700_000_100, "until": 1_700_000_000},
        {"since": 1_700_000_000, "until": 1_700_000_000},
        {"min_sequence": 5, "max_sequence": 4},
    ):
        with pytest.raises(InvalidOptionError, match="must"):
            broker.count_dead_letters(queue, **where)
        with pytest.raises(InvalidOptionError, match="must"):
            broker.purge(queue, **where)
    assert broker.count_dead_letters(queue, min_sequence=4, max_sequence=4) == 0


def test_purge_drops_matching_dead_letters(broker: Broker, queue: str) -> None:
    _dead_letter(broker, queue, ["a", "b", "a"])
    assert broker.purge(queue, subject="a").done == 2
    assert broker.counts(queue)["dead_lettered"] == 1
    assert broker.purge(queue).done == 1
    assert broker.counts(DLQ)["dropped"] == 3
    assert_balanced(broker)


def test_a_dead_letter_whose_lock_ran_out_is_among_what_a_task_takes(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A dead letter received from the dead-letter queue and never settled is waiting again
    once its lock runs out, though nothing receives there to count the expiry: a task
    (list, resubmit, purge) takes it with the others."""
    _dead_letter(broker, queue, ["a", "b", "c"])
    (held,) = broker.receiver(f"{queue}/$deadletterqueue").receive(max_messages=1)
    assert broker.count_dead_letters(queue) == 2  # locked by its receiver: not for a task
    clock.advance(broker.get_queue(queue).options.lock_duration + 1)
    assert broker.count_dead_letters(queue) == 3
    assert held.sequence_number in {m.sequence_number for m in broker.dead_letters(queue)}
    assert broker.purge(queue).done == 3
    assert broker.counts(queue)["dead_lettered"] == 0
    assert_balanced(broker)


def test_the_task_list_says_who_started_and_cancelled_each_task(broker: Broker, queue: str) -> None:
    _dead_letter(broker, queue, ["a", "b", "c"])
    broker.purge(queue, subject="a", started_by="alice")

    def cancel(task: BulkTask) -> None:
        if task.status == "running":
            broker.cancel_task(task.id, by="carol")

    broker.resubmit(queue, rate=1, started_by="bob", progress=cancel)
    newest, oldest = broker.tasks(queue)
    assert (oldest.kind, oldest.started_by, oldest.cancelled_by) == ("purge", "alice", None)
    assert (newest.kind, newest.status) == ("resubmit", "cancelled")
    assert (newest.started_by, newest.cancelled_by, newest.spec["rate"]) == ("bob", "carol", 1.0)
    assert newest.entity == f"{queue}/$deadletterqueue"
    assert broker.tasks(queue, before=newest.id) == [oldest]
    assert broker.tasks(limit=1) == [newest]
    with pytest.raises(InvalidOptionError):
        broker.tasks(queue, limit=0)


def test_a_second_task_on_a_queue_is_refused_until_the_first_ends_or_goes_quiet(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """One task at a time on a queue, whichever process runs it: a second is refused while
    the first makes progress. A task with no progress for a minute has lost its process: it
    ends ``failed`` saying so (it would show running for ever), and a new task may start."""
    _dead_letter(broker, queue, ["a", "b"])
    first = drive(
        broker.engine.start_task("purge", f"{queue}/$deadletterqueue", MessageFilter(), {}, "x")
    )
    with pytest.raises(TaskRunningError, match=rf"task {first.id} .*started by x"):
        broker.resubmit(queue, started_by="y")
    assert broker.running_task(queue) == first
    clock.advance(61)  # its process died: no progress for a minute
    ended = broker.task(first.id)
    assert ended.status == "failed" and "the process running it stopped" in (ended.error or "")
    assert broker.tasks(queue)[0] == ended
    assert broker.running_task(queue) is None
    assert broker.purge(queue).done == 2
    assert_balanced(broker)


def test_lock_expiries_in_the_dead_letter_queue_are_one_group_of_their_own(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A lock that runs out in the dead-letter queue records the ``lock-expired``
    fingerprint: one group of its own, never an empty fingerprint whose link would select
    the whole dead-letter queue."""
    _dead_letter(broker, queue, ["a", "b", "c"])
    broker.receiver(f"{queue}/$deadletterqueue").receive(max_messages=1)
    clock.advance(broker.get_queue(queue).options.lock_duration + 1)
    assert broker.count_dead_letters(queue, fingerprint="lock-expired") == 1  # counted first
    keys = {g.key: g.count for g in broker.dead_letter_groups(queue, by="fingerprint")}
    assert keys == {None: 2, "lock-expired": 1}
