"""Receiving (peek-lock, receive-and-delete, peek, long-poll) and settlement."""

from __future__ import annotations

import threading

import pytest

import poisonq
from poisonq import (
    Abandon,
    AutoLockRenewer,
    Broker,
    Complete,
    DeadLetter,
    EntityNotFoundError,
    FailureRecord,
    InvalidOperationError,
    InvalidOptionError,
    ManualClock,
    Message,
    MessageAlreadySettledError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageState,
    Settlement,
)
from tests.helpers import assert_balanced, fill

BOTH_APIS = True  # each test with `broker` runs through the sync API and poisonq.aio (conftest)
_THREADS = "threads share one broker; poisonq.aio's concurrency is tasks (tests/test_aio.py)"
_RENEWER = "drives the sync AutoLockRenewer's passes; poisonq.aio's (tests/test_aio.py) runs them"
SYNC_ONLY = {
    "test_competing_receivers_never_share_a_valid_lock": _THREADS,
    "test_an_audit_balances_while_others_send_and_complete": _THREADS,
    "test_auto_lock_renewer_keeps_a_slow_handler_locked": _RENEWER,
    "test_auto_lock_renewer_reports_a_lost_lock": _RENEWER,
    "test_the_renewer_does_not_report_a_message_settled_through_its_receiver": _RENEWER,
}


def test_peek_lock_sets_lock_fields_in_fifo_order(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    seqs = fill(broker, queue, 5)
    got = broker.receiver(queue).receive(max_messages=3)
    assert [m.sequence_number for m in got] == seqs[:3]
    assert all(m.state is MessageState.LOCKED and m.delivery_count == 1 for m in got)
    assert len({m.lock_token for m in got}) == 1  # one lock token per receive call
    assert got[0].locked_until.timestamp() == clock.now() + 30  # type: ignore[union-attr]
    assert broker.counts(queue)["locked"] == 3
    again = broker.receiver(queue).receive(max_messages=10)
    assert [m.sequence_number for m in again] == seqs[3:]
    assert again[0].lock_token != got[0].lock_token


def test_receive_and_delete_completes_as_it_hands_out(broker: Broker, queue: str) -> None:
    fill(broker, queue, 3)
    receiver = broker.receiver(queue, receive_mode="receive_and_delete")
    got = receiver.receive(max_messages=2)
    assert [m.state for m in got] == [MessageState.COMPLETED] * 2
    assert broker.counts(queue)["completed"] == 2
    with pytest.raises(InvalidOperationError):
        receiver.complete(got[0])
    assert_balanced(broker)


def test_peek_neither_locks_nor_counts(broker: Broker, queue: str) -> None:
    seqs = fill(broker, queue, 3)
    assert [m.sequence_number for m in broker.peek(queue, from_sequence=seqs[1])] == seqs[1:]
    (first,) = broker.receiver(queue).peek()
    assert first.delivery_count == 0 and first.lock_token is None
    assert broker.counts(queue)["active"] == 3


def test_peek_shows_a_lock_but_never_its_token(broker: Broker, queue: str) -> None:
    fill(broker, queue, 1)
    (held,) = broker.receiver(queue).receive()
    (seen,) = broker.peek(queue)
    assert seen.state == "locked" and seen.locked_until == held.locked_until
    assert seen.lock_token is None
    assert broker.message(queue, held.sequence_number).lock_token is None
    with pytest.raises(InvalidOperationError):  # a peeked message cannot be settled
        broker.receiver(queue).complete([seen])
    broker.receiver(queue).complete([held])


def test_bad_receive_arguments(broker: Broker, queue: str) -> None:
    with pytest.raises(InvalidOptionError):
        broker.receiver(queue).receive(max_messages=0)
    with pytest.raises(InvalidOptionError):
        broker.receiver(queue).receive(max_wait=-1)
    with pytest.raises(EntityNotFoundError):
        broker.receiver("missing").receive()
    with pytest.raises(InvalidOptionError):
        broker.receiver(queue, receive_mode="twice")
    with pytest.raises(InvalidOptionError):
        broker.receiver(queue, lock_duration=301)
    with pytest.raises(InvalidOptionError):
        broker.peek(queue, max_messages=0)


def test_long_poll_returns_when_a_message_arrives(url: str) -> None:
    import poisonq

    with poisonq.connect(url) as broker:  # real clock: the wait is real
        broker.create_queue("orders")
        sender = threading.Timer(0.2, lambda: broker.sender("orders").send(Message(body=b"late")))
        sender.start()
        got = broker.receiver("orders").receive(max_messages=10, max_wait=30)
        sender.join()
        assert [m.body for m in got] == [b"late"]


def test_complete_removes_and_counts(broker: Broker, queue: str) -> None:
    fill(broker, queue, 2)
    receiver = broker.receiver(queue)
    receiver.complete(receiver.receive(max_messages=2))
    counts = broker.counts(queue)
    assert (counts["locked"], counts["completed"]) == (0, 2)
    assert_balanced(broker)


def test_a_lost_lock_raises_and_changes_nothing(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 2)
    receiver = broker.receiver(queue)
    first = receiver.receive()
    clock.advance(31)
    with pytest.raises(MessageLockLostError) as caught:
        receiver.complete(first)
    assert caught.value.sequence_numbers == [first[0].sequence_number]
    assert broker.counts(queue)["completed"] == 0
    # a batch where one lock is lost changes none of them
    both = receiver.receive(max_messages=2)
    other = receiver.receive()  # nothing left: both are locked
    assert other == []
    forged = [both[0], _with_token(both[1], "not-a-token")]
    with pytest.raises(MessageLockLostError) as caught:
        receiver.complete(forged)
    assert caught.value.sequence_numbers == [both[1].sequence_number]
    assert broker.counts(queue)["locked"] == 2
    for settle in (receiver.abandon, receiver.defer, receiver.dead_letter, receiver.renew_lock):
        with pytest.raises(MessageLockLostError):
            settle(forged[1])  # type: ignore[operator]
    assert broker.counts(queue)["locked"] == 2
    assert_balanced(broker)


@pytest.mark.parametrize("first", ["complete", "abandon", "defer", "dead_letter"])
def test_settling_a_message_this_client_settled_is_refused_before_the_store(
    broker: Broker, queue: str, first: str
) -> None:
    """A message settled through its receiver, settled again (any way) or renewed, raises
    MessageAlreadySettledError, as azure-servicebus' MessageAlreadySettled, and not a lost
    lock; a batch holding one such message settles none of the others."""
    fill(broker, queue, 2)
    receiver = broker.receiver(queue)
    settled, fresh = receiver.receive(max_messages=2)
    getattr(receiver, first)(settled)
    counts = broker.counts(queue)
    again = (
        receiver.complete,
        receiver.abandon,
        receiver.defer,
        receiver.dead_letter,
        receiver.renew_lock,
        receiver.complete_and_receive,
    )
    for settle in again:
        for batch in (settled, [fresh, settled]):
            with pytest.raises(MessageAlreadySettledError) as caught:
                settle(batch)  # type: ignore[operator]
            assert caught.value.sequence_numbers == [settled.sequence_number]
            assert isinstance(caught.value, MessageLockLostError)  # what was caught before
    assert broker.counts(queue) == counts  # ``fresh`` is still locked, as it was
    receiver.complete(fresh)
    assert_balanced(broker)


def test_a_message_redelivered_after_its_lock_ran_out_is_a_lost_lock_not_a_settled_one(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """Only a settlement marks a message settled: one whose lock ran out is a lost lock,
    however often it is tried, and settling its redelivery works."""
    fill(broker, queue, 1)
    receiver = broker.receiver(queue)
    (first,) = receiver.receive()
    clock.advance(31)
    (again,) = receiver.receive()
    for _ in range(2):
        with pytest.raises(MessageLockLostError) as caught:
            receiver.complete(first)
        assert not isinstance(caught.value, MessageAlreadySettledError)
    receiver.complete(again)
    assert broker.counts(queue)["completed"] == 1
    assert_balanced(broker)


def _with_token(message, token):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(message, lock_token=token)


def test_abandon_puts_the_message_back_in_front(broker: Broker, queue: str) -> None:
    seqs = fill(broker, queue, 3)
    receiver = broker.receiver(queue)
    (first,) = receiver.receive()
    assert receiver.abandon(first, error=ValueError("bad")) == []
    (again,) = receiver.receive()
    assert again.sequence_number == seqs[0]
    assert (again.delivery_count, again.abort_count) == (2, 1)
    assert [f.error_type for f in again.failures] == ["ValueError"]


def test_lock_expiry_counts_as_an_abandon(broker: Broker, queue: str, clock: ManualClock) -> None:
    fill(broker, queue, 1)
    receiver = broker.receiver(queue)
    receiver.receive()
    clock.advance(30)
    (again,) = receiver.receive()
    assert (again.delivery_count, again.abort_count) == (2, 1)
    assert again.failures[-1].error_type == "LockExpired"
    assert broker.get_queue(queue).ledger.lock_expiries == 1


def test_competing_receivers_never_share_a_valid_lock(broker: Broker, queue: str) -> None:
    fill(broker, queue, 100)
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        receiver = broker.receiver(queue)
        while got := receiver.receive(max_messages=7):
            with lock:
                seen.extend(m.sequence_number for m in got)
            receiver.complete(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 100
    assert_balanced(broker)


def test_defer_and_receive_deferred_by_sequence_number(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    seqs = fill(broker, queue, 2)
    receiver = broker.receiver(queue)
    (first,) = receiver.receive()
    receiver.defer(first)
    assert broker.counts(queue)["deferred"] == 1
    clock.advance(10_000)  # a deferred message without a time to live waits, out of order
    (second,) = receiver.receive(max_messages=5)
    assert second.sequence_number == seqs[1]
    (back,) = receiver.receive_deferred(seqs[0])
    assert back.state is MessageState.LOCKED and back.delivery_count == 2
    receiver.complete(back)
    with pytest.raises(MessageNotFoundError):
        receiver.receive_deferred([seqs[0]])
    assert_balanced(broker)


def test_renew_lock_moves_locked_until(broker: Broker, queue: str, clock: ManualClock) -> None:
    fill(broker, queue, 1)
    receiver = broker.receiver(queue)
    (message,) = receiver.receive()
    clock.advance(20)
    receiver.renew_lock(message)
    assert message.locked_until.timestamp() == clock.now() + 30  # type: ignore[union-attr]
    clock.advance(20)
    receiver.complete(message)  # 40 s after receive, but renewed
    assert broker.counts(queue)["completed"] == 1


def test_receiver_lock_duration_overrides_the_queue(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 1)
    (message,) = broker.receiver(queue, lock_duration=5).receive()
    assert message.locked_until.timestamp() == clock.now() + 5  # type: ignore[union-attr]


def test_auto_lock_renewer_keeps_a_slow_handler_locked(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 2)
    receiver = broker.receiver(queue)
    messages = receiver.receive(max_messages=2)
    renewer = AutoLockRenewer(max_lock_renewal_duration=600)
    renewer.register(receiver, messages)
    for _ in range(10):  # 100 s of work in steps of 10 s, each step one renewal pass
        clock.advance(10)
        renewer.renew_due()
    receiver.complete(messages)
    renewer.close()
    assert broker.counts(queue)["completed"] == 2


def test_auto_lock_renewer_reports_a_lost_lock(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 1)
    receiver = broker.receiver(queue)
    messages = receiver.receive()
    failures: list[int] = []
    with AutoLockRenewer(
        on_lock_renew_failure=lambda m, e: failures.append(m.sequence_number)
    ) as renewer:
        renewer.register(receiver, messages)
        clock.advance(31)
        renewer.renew_due()
        renewer.renew_due()  # once reported, never again
    assert failures == [messages[0].sequence_number]


def test_settle_and_receive_settles_each_way_and_locks_the_next_in_one_transaction(
    broker: Broker, queue: str
) -> None:
    seqs = fill(broker, queue, 6)
    receiver = broker.receiver(queue)
    first = receiver.receive(max_messages=3)
    settlements: list[Settlement] = [
        Complete(first[0].sequence_number, first[0].lock_token or ""),
        DeadLetter(first[1].sequence_number, first[1].lock_token or "", "Invalid", "no customer"),
        Abandon(first[2].sequence_number, first[2].lock_token or "", None),
    ]
    got = receiver.settle_and_receive(settlements, max_messages=2)
    # The abandoned message went back to the front, so it is received again at once.
    assert [m.sequence_number for m in got] == [seqs[2], seqs[3]]
    assert [m.delivery_count for m in got] == [2, 1]
    counts = broker.counts(queue)
    assert (counts["completed"], counts["dead_lettered"], counts["locked"]) == (1, 1, 2)
    [dead] = broker.peek(f"{queue}/$deadletterqueue")
    assert (dead.sequence_number, dead.dead_letter_reason) == (seqs[1], "Invalid")

    # One lost lock: nothing is settled and nothing received.
    lost = [
        DeadLetter(got[0].sequence_number, "not-a-token", "Invalid"),
        Complete(got[1].sequence_number, got[1].lock_token or ""),
    ]
    with pytest.raises(MessageLockLostError):
        receiver.settle_and_receive(lost, max_messages=2)
    counts = broker.counts(queue)
    assert (counts["completed"], counts["dead_lettered"], counts["locked"]) == (1, 1, 2)
    assert_balanced(broker)


def test_a_dead_letter_without_a_reason_gets_the_same_reason_either_way(
    broker: Broker, queue: str
) -> None:
    """A dead-lettering without a reason gets ``DeadLetteredByReceiver`` whichever call
    made it: one group for one act."""
    fill(broker, queue, 3)
    receiver = broker.receiver(queue)
    first, second, third = receiver.receive(max_messages=3)
    receiver.dead_letter(first)
    broker.settle(queue, [DeadLetter(second.sequence_number, second.lock_token or "", "")])
    broker.settle(queue, [DeadLetter(third.sequence_number, third.lock_token or "", None)])  # type: ignore[arg-type]
    reasons = {
        m.dead_letter_reason for m in broker.peek(f"{queue}/$deadletterqueue", max_messages=3)
    }
    assert reasons == {"DeadLetteredByReceiver"}
    assert_balanced(broker)


def test_a_settlement_without_abandons_names_every_lost_lock(broker: Broker, queue: str) -> None:
    """Without an abandon no lock is read first: the guarded completions and moves find the
    lost ones, and all of them are named before anything commits."""
    fill(broker, queue, 4)
    receiver = broker.receiver(queue)
    got = receiver.receive(max_messages=4)
    seqs = [m.sequence_number for m in got]
    batch: list[Settlement] = [
        Complete(seqs[0], "not-a-token"),
        Complete(seqs[1], got[1].lock_token or ""),
        DeadLetter(seqs[2], "not-a-token", "Invalid"),
        DeadLetter(seqs[3], got[3].lock_token or "", "Invalid"),
    ]
    with pytest.raises(MessageLockLostError) as caught:
        receiver.settle_and_receive(batch, max_messages=2)
    assert caught.value.sequence_numbers == [seqs[0], seqs[2]]
    counts = broker.counts(queue)
    assert (counts["completed"], counts["dead_lettered"], counts["locked"]) == (0, 0, 4)
    assert_balanced(broker)


@pytest.mark.parametrize("settle", ["complete", "abandon", "defer", "dead_letter", "renew_lock"])
def test_a_batch_with_one_message_settled_elsewhere_names_only_that_one_as_lost(
    broker: Broker, queue: str, settle: str
) -> None:
    """Each way of settling a batch names only the message whose lock is gone (another
    client completed it), and changes none of the others."""
    fill(broker, queue, 3)
    receiver = broker.receiver(queue)
    batch = receiver.receive(max_messages=3)
    gone = batch[1]
    broker.settle(queue, [Complete(gone.sequence_number, gone.lock_token or "")])
    with pytest.raises(MessageLockLostError) as caught:
        getattr(receiver, settle)(batch)
    assert caught.value.sequence_numbers == [gone.sequence_number]
    assert broker.counts(queue)["locked"] == 2
    receiver.complete([batch[0], batch[2]])
    assert_balanced(broker)


def test_an_audit_balances_while_others_send_and_complete(broker: Broker, queue: str) -> None:
    """Each audit reads every ledger and every count as of one moment, even while other
    threads (other connections, on PostgreSQL) commit."""
    stop = threading.Event()
    sent = threading.Event()

    def work() -> None:
        receiver = broker.receiver(queue)
        for _ in range(200):  # bounded: stops by itself
            if stop.is_set():
                return
            fill(broker, queue, 5)
            sent.set()
            receiver.complete(receiver.receive(max_messages=5))

    workers = [threading.Thread(target=work) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        # On a busy machine the audits could all run before a worker's first send.
        sent.wait(30)
        reports = [broker.audit() for _ in range(30)]
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    assert all(report.ok for report in reports), [r for r in reports if not r.ok]
    assert reports[-1].sent > 0
    assert_balanced(broker)


def test_counts_never_show_an_expired_lock_as_locked(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    broker.sender(queue).send([Message(body=b"a"), Message(body=b"b")])
    broker.receiver(queue).receive(max_messages=1)
    assert (broker.counts(queue)["locked"], broker.counts(queue)["active"]) == (1, 1)
    clock.advance(31)  # the queue's lock is 30 s: the lock ran out, nobody received since
    assert (broker.counts(queue)["locked"], broker.counts(queue)["active"]) == (0, 2)
    dlq = broker.receiver(f"{queue}/$deadletterqueue")
    [message] = broker.receiver(queue).receive(max_messages=1)
    broker.receiver(queue).dead_letter(message, reason="Bad")
    dlq.receive(max_messages=1)
    clock.advance(61)
    counts = broker.counts(f"{queue}/$deadletterqueue")
    assert (counts["locked"], counts["dead_lettered"]) == (0, 1)
    assert_balanced(broker)


def test_a_receiver_can_be_iterated_until_it_waits_in_vain(broker: Broker, queue: str) -> None:
    broker.sender(queue).send([Message(body=str(n).encode()) for n in range(3)])
    seen = []
    for message in broker.receiver(queue, max_wait_time=0.05):
        seen.append(message.text)
        broker.receiver(queue).complete(message)
    assert seen == ["0", "1", "2"]
    assert broker.counts(queue)["completed"] == 3
    with pytest.raises(poisonq.InvalidOptionError):
        broker.receiver(queue, max_wait_time=-1)


def test_the_renewer_does_not_report_a_message_settled_through_its_receiver(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A message settled through its receiver (completed, abandoned, dead-lettered) leaves
    the renewer quietly: it is never reported to ``on_lock_renew_failure`` as lost."""
    broker.sender(queue).send([Message(body=b"a"), Message(body=b"b"), Message(body=b"c")])
    receiver = broker.receiver(queue)
    first, second, third = receiver.receive(max_messages=3)
    lost: list[int] = []
    renewer = AutoLockRenewer(60, on_lock_renew_failure=lambda m, e: lost.append(m.sequence_number))
    renewer.register(receiver, [first, second, third])
    receiver.complete(first)
    receiver.abandon(second)
    receiver.dead_letter(third, reason="Bad")
    clock.advance(20)  # past half the 30 s lock: renewing is due
    renewer.renew_due()
    assert lost == []
    renewer.close()


@pytest.mark.parametrize("number", [2**63, -1, 1.5, "1", None, True])
def test_sequence_numbers_out_of_range_or_of_another_type_are_refused(
    broker: Broker, queue: str, number: object
) -> None:
    """A number past 64 bits raised SQLite's OverflowError; floats and text a TypeError."""
    broker.sender(queue).send(Message(body=b"x"))
    receiver = broker.receiver(queue)
    for call in (
        lambda: broker.message(queue, number),  # type: ignore[arg-type]
        lambda: broker.peek(queue, from_sequence=number),  # type: ignore[arg-type]
        lambda: receiver.receive_deferred(number),  # type: ignore[arg-type]
        lambda: broker.resolve_poison(queue, number),  # type: ignore[arg-type]
        lambda: broker.task(number),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidOptionError):
            call()
    assert_balanced(broker)


def test_settling_what_is_not_a_received_message_or_a_settlement_is_refused(
    broker: Broker, queue: str
) -> None:
    """These raised TypeError or AttributeError from inside the engine."""
    broker.sender(queue).send([Message(body=b"a"), Message(body=b"b")])
    receiver = broker.receiver(queue)
    first, _ = receiver.receive(max_messages=2)
    assert first.lock_token is not None
    for call in (
        lambda: receiver.complete(5),  # type: ignore[arg-type]
        lambda: receiver.complete([first, None]),  # type: ignore[list-item]
        lambda: receiver.abandon(first, error="broken"),  # type: ignore[arg-type]
        lambda: broker.settle(queue, None),  # type: ignore[arg-type]
        lambda: broker.settle(queue, [Complete(first.sequence_number, first.lock_token), 5]),  # type: ignore[list-item]
        lambda: broker.settle(queue, [Complete(first.sequence_number, 5)]),  # type: ignore[arg-type]
        lambda: broker.settle(queue, [Abandon(first.sequence_number, first.lock_token, "x")]),  # type: ignore[arg-type]
        lambda: broker.sender(queue).send(None),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidOptionError):
            call()
    assert broker.counts(queue)["locked"] == 2
    assert_balanced(broker)


def test_a_message_settled_twice_in_one_batch_is_refused(broker: Broker, queue: str) -> None:
    broker.sender(queue).send(Message(body=b"a"))
    receiver = broker.receiver(queue)
    (got,) = receiver.receive()
    assert got.lock_token is not None
    twice = [
        Complete(got.sequence_number, got.lock_token),
        Abandon(got.sequence_number, got.lock_token),
    ]
    with pytest.raises(InvalidOptionError, match="settled twice"):
        broker.settle(queue, twice)
    assert broker.counts(queue)["locked"] == 1
    assert_balanced(broker)


@pytest.mark.parametrize("field", ["error_type", "fingerprint"])
def test_a_failure_whose_grouping_keys_hold_a_nul_is_refused(
    broker: Broker, queue: str, field: str
) -> None:
    """A failure's error type and fingerprint group its dead letter, and a NUL in a key is
    kept alike by neither store: both refuse it, and the message stays locked."""
    broker.sender(queue).send(Message(body=b"a"))
    receiver = broker.receiver(queue)
    (got,) = receiver.receive()
    keys = {"error_type": "E", "fingerprint": "f", field: "x\x00y"}
    failure = FailureRecord(0.0, keys["error_type"], "m", fingerprint=keys["fingerprint"])
    for call in (
        lambda: receiver.dead_letter(got, reason="Bad", error=failure),
        lambda: receiver.abandon(got, error=failure),
    ):
        with pytest.raises(InvalidOptionError, match="cannot contain NUL"):
            call()
    assert broker.counts(queue)["locked"] == 1
    assert_balanced(broker)


@pytest.mark.parametrize("operation", ["complete", "abandon", "defer", "renew_lock"])
def test_a_message_given_twice_to_one_call_is_settled_once(
    broker: Broker, queue: str, operation: str
) -> None:
    """A list that names a message twice settles (or renews) it once: its lock is not
    reported lost."""
    broker.sender(queue).send([Message(body=b"a"), Message(body=b"b")])
    receiver = broker.receiver(queue)
    first, second = receiver.receive(max_messages=2)
    getattr(receiver, operation)([first, first, second])
    counts = broker.counts(queue)
    held = {"complete": "completed", "abandon": "active", "defer": "deferred"}
    assert counts[held.get(operation, "locked")] == 2
    if operation == "abandon":
        assert [m.delivery_count for m in receiver.peek(max_messages=2)] == [1, 1]
    assert_balanced(broker)


@pytest.mark.parametrize("text", [5, b"x", ["x"], "a\x00b"])
def test_a_dead_letter_reason_or_description_that_is_not_text_is_refused(
    broker: Broker, queue: str, text: object
) -> None:
    """A reason of another type was kept as its text by one store and failed the other with
    a StoreError (a 503 on the HTTP API); a NUL was kept by SQLite only."""
    broker.sender(queue).send(Message(body=b"a"))
    receiver = broker.receiver(queue)
    (got,) = receiver.receive()
    assert got.lock_token is not None
    for call in (
        lambda: receiver.dead_letter(got, reason=text),  # type: ignore[arg-type]
        lambda: receiver.dead_letter(got, reason="r", description=text),  # type: ignore[arg-type]
        lambda: broker.settle(queue, [DeadLetter(got.sequence_number, got.lock_token, text)]),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidOptionError):
            call()
    assert broker.counts(queue)["locked"] == 1
    assert_balanced(broker)
