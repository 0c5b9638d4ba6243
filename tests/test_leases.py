"""Leases (numbered batches locked under one token) and settling many messages at once."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

import poisonq
from poisonq import Abandon, Broker, Complete, DeadLetter, ManualClock, Message, Release
from poisonq.engine.driving import drive
from poisonq.failures import failure_from_exception
from poisonq.store.base import LEASE_COLUMNS, MessageFilter
from tests.helpers import assert_balanced, execute_behind_the_back, fill


def test_a_lease_locks_a_batch_under_one_token(broker: Broker, queue: str) -> None:
    seqs = fill(broker, queue, 10)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=4)
    assert lease is not None
    assert (lease.number, lease.count) == (1, 4)
    assert (lease.min_sequence, lease.max_sequence) == (seqs[0], seqs[3])
    assert broker.counts(queue)["locked"] == 4
    rows = broker.lease_rows(lease)
    assert [dict(zip(LEASE_COLUMNS, row, strict=True))["message_id"] for row in rows] == [
        "m0",
        "m1",
        "m2",
        "m3",
    ]
    first = dict(zip(LEASE_COLUMNS, rows[0], strict=True))
    assert (first["body"], first["delivery_count"], first["properties"]) == (b"b0", 1, '{"n":0}')


def test_asking_for_an_existing_lease_replays_it(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 5)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=3)
    clock.advance(20)
    again = broker.acquire_lease(queue, "pipeline", 1, max_messages=3)
    assert again == lease
    clock.advance(20)  # 40 s after the lease: alive because asking again renewed it
    assert broker.lease_sequence_numbers(lease) == [lease.min_sequence + n for n in range(3)]
    assert broker.lease(queue, "pipeline") == broker.lease(queue, "pipeline", 1) == lease


def test_the_next_lease_takes_the_next_messages_and_forgets_the_old(
    broker: Broker, queue: str
) -> None:
    """A lease forgets the consumer's leases before the one before it: the pipeline takes
    a lease while it finishes the one before, and a restart replays both."""
    fill(broker, queue, 7)
    first = broker.acquire_lease(queue, "pipeline", 1, max_messages=3)
    assert first is not None
    second = broker.acquire_lease(queue, "pipeline", 2, max_messages=3)
    assert second is not None and second.count == 3
    assert second.min_sequence > first.max_sequence
    assert broker.lease(queue, "pipeline") == second
    assert broker.lease(queue, "pipeline", 1) == first  # still being finished
    assert broker.complete_lease(first) == 3
    third = broker.acquire_lease(queue, "pipeline", 3, max_messages=3)
    assert third is not None and third.count == 1
    assert broker.lease(queue, "pipeline", 1) is None
    assert broker.lease(queue, "pipeline", 2) == second
    assert broker.acquire_lease(queue, "other", 1, max_messages=3) is None  # nothing left
    assert broker.complete_lease(second) + broker.complete_lease(third) == 4
    assert broker.acquire_lease(queue, "pipeline", 4, max_messages=3) is None
    assert broker.counts(queue)["completed"] == 7
    assert_balanced(broker)


def test_completing_a_lease_leaves_what_was_settled_apart(broker: Broker, queue: str) -> None:
    fill(broker, queue, 4)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=4)
    assert lease is not None
    seqs = broker.lease_sequence_numbers(lease)
    error = failure_from_exception(ValueError("bad customer"), 0.0)
    poisoned = broker.settle(
        queue,
        [
            DeadLetter(seqs[0], lease.lock_token, "InvalidCustomer", "no such customer", error),
            Abandon(seqs[1], lease.lock_token, error),
        ],
    )
    assert poisoned == []
    assert broker.lease_sequence_numbers(lease) == seqs[2:]
    assert [row[0] for row in broker.lease_rows(lease)] == seqs[2:]
    assert broker.complete_lease(lease) == 2
    counts = broker.counts(queue)
    assert (counts["completed"], counts["active"], counts["dead_lettered"]) == (2, 1, 1)
    [dead] = broker.peek(f"{queue}/$deadletterqueue")
    assert (dead.dead_letter_reason, dead.failures[-1].message) == (
        "InvalidCustomer",
        "bad customer",
    )
    assert_balanced(broker)


def test_an_expired_lease_is_delivered_again(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 3)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=3)
    assert lease is not None
    clock.advance(31)
    assert broker.lease_sequence_numbers(lease) == []
    assert broker.complete_lease(lease) == 0
    redelivered = broker.receiver(queue).receive(max_messages=3)
    assert [m.delivery_count for m in redelivered] == [2, 2, 2]
    assert_balanced(broker)


def test_a_lease_resumed_after_its_lock_ran_out_holds_its_messages_again(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A query restarted after its lease's lock ran out replays the lease: if nothing received
    from the queue since, its messages (covered, and locked row by row) are still its own."""
    seqs = fill(broker, queue, 4)
    receiver = broker.receiver(queue)
    (first,) = receiver.receive(max_messages=1)
    receiver.abandon(first)  # comes back: locked row by row in the lease
    lease = broker.acquire_lease(queue, "spark", 1, max_messages=4, lock_duration=10)
    assert lease is not None
    clock.advance(11)
    assert broker.lease_sequence_numbers(lease) == []
    assert broker.renew_lease(lease) == 0  # a renewal does not bring a lock back
    assert broker.resume_lease(lease, 10) == 4
    assert broker.lease_sequence_numbers(lease) == seqs
    assert broker.acquire_lease(queue, "spark", 1, max_messages=4) == lease  # replayed
    assert broker.complete_lease(lease) == 4
    assert [m.delivery_count for m in broker.peek(queue)] == []
    assert_balanced(broker)


def test_a_lease_whose_lock_ran_out_and_was_taken_back_resumes_with_nothing(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 3)
    lease = broker.acquire_lease(queue, "spark", 1, max_messages=3)
    assert lease is not None
    clock.advance(31)
    taken = broker.receiver(queue).receive(max_messages=3)  # counts the expiry first
    assert [m.delivery_count for m in taken] == [2, 2, 2]
    assert broker.resume_lease(lease) == 0
    assert broker.lease_sequence_numbers(lease) == []
    assert broker.lease_rows(lease) == []
    assert broker.complete_lease(lease) == 0
    assert_balanced(broker)


def test_settle_is_all_or_nothing_and_names_every_lost_lock(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    fill(broker, queue, 3)
    receiver = broker.receiver(queue)
    held = receiver.receive(max_messages=2)
    clock.advance(31)
    late = receiver.receive(max_messages=1)  # expires the first two (they return active)
    settlements = [Complete(m.sequence_number, m.lock_token or "") for m in held + late]
    with pytest.raises(poisonq.MessageLockLostError) as lost:
        broker.settle(queue, settlements)
    assert lost.value.sequence_numbers == [m.sequence_number for m in held]
    assert broker.counts(queue)["completed"] == 0
    assert_balanced(broker)


def test_settle_reports_what_the_retry_policy_poisoned(broker: Broker, queue: str) -> None:
    fill(broker, queue, 1)
    receiver = broker.receiver(queue)
    poisoned: list[int] = []
    for _ in range(3):
        [message] = receiver.receive()
        poisoned = broker.settle(
            queue, [Abandon(message.sequence_number, message.lock_token or "")]
        )
    assert poisoned == [message.sequence_number]
    assert broker.counts(queue)["dead_lettered"] == 1


@pytest.mark.parametrize(
    ("consumer", "number", "error"),
    [
        ("bad name!", 1, poisonq.InvalidNameError),
        ("pipeline", 0, poisonq.InvalidOptionError),
        ("pipeline", "1", poisonq.InvalidOptionError),
        (["pipeline"], 1, poisonq.InvalidNameError),
    ],
)
def test_bad_lease_requests_get_typed_errors(
    broker: Broker, queue: str, consumer: str, number: int, error: type[Exception]
) -> None:
    with pytest.raises(error):
        broker.acquire_lease(queue, consumer, number, max_messages=1)
    if number != 0:  # lease 0 may be looked up (there is none), not taken
        with pytest.raises(error):  # a list as the consumer was a StoreError from SQLite
            broker.lease(queue, consumer, number)


def test_release_gives_messages_back_without_counting_a_delivery(
    broker: Broker, clock: ManualClock
) -> None:
    """A consumer that finds the fault in itself gives its messages back untouched: on a
    queue of one delivery, a release never dead-letters, never counts a rollback, never
    records a failure."""
    broker.create_queue("once", max_delivery_count=1, auto_disable_after_rollbacks=1)
    fill(broker, "once", 3)
    receiver = broker.receiver("once")
    batch = receiver.receive(max_messages=3)
    broker.settle(
        "once",
        [Complete(batch[0].sequence_number, batch[0].lock_token or "")]
        + [Release(m.sequence_number, m.lock_token or "") for m in batch[1:]],
    )
    assert broker.counts("once")["active"] == 2
    assert broker.get_queue("once").status == "active"  # no rollback counted
    again = receiver.receive(max_messages=3)
    assert [(m.message_id, m.delivery_count, m.abort_count) for m in again] == [
        ("m1", 1, 0),
        ("m2", 1, 0),
    ]
    assert all(not m.failures for m in again)
    clock.advance(61)  # a lost lock: the release changes nothing and says so
    with pytest.raises(poisonq.MessageLockLostError):
        broker.settle("once", [Release(m.sequence_number, m.lock_token or "") for m in again])
    assert_balanced(broker)


def test_release_lease_gives_back_a_span_of_what_the_lease_holds(
    broker: Broker, queue: str
) -> None:
    seqs = fill(broker, queue, 6)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=6)
    assert lease is not None
    receiver = broker.receiver(queue)
    broker.settle(queue, [Complete(seqs[0], lease.lock_token)])
    assert broker.release_lease(lease, hi=seqs[2]) == 2  # seqs[1], seqs[2]
    assert broker.lease_sequence_numbers(lease) == seqs[3:]
    assert broker.release_lease(lease) == 3
    assert broker.lease_sequence_numbers(lease) == []
    again = receiver.receive(max_messages=10)
    assert [m.sequence_number for m in again] == seqs[1:]
    assert {m.delivery_count for m in again} == {1}
    assert broker.counts(queue)["completed"] == 1
    assert_balanced(broker)


def test_receivers_bulk_tasks_and_readers_see_a_leased_message_as_locked(
    broker: Broker, queue: str
) -> None:
    """However a store locks a lease (SQLite: the fresh messages as one range, nothing
    written per message), nobody else can take them, and every reader sees them locked."""
    seqs = fill(broker, queue, 6)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=4)
    assert lease is not None
    receiver = broker.receiver(queue)
    got = receiver.receive(max_messages=10)
    assert [m.sequence_number for m in got] == seqs[4:]  # never a leased one
    receiver.abandon(got[0])  # back in the queue, under no lease
    counts = broker.counts(queue)
    assert (counts["locked"], counts["active"]) == (5, 1)
    peeked = {m.sequence_number: m for m in broker.peek(queue, max_messages=10)}
    assert [peeked[s].state for s in seqs[:4]] == [poisonq.MessageState.LOCKED] * 4
    assert [peeked[s].delivery_count for s in seqs[:4]] == [1] * 4
    assert drive(broker.engine.count_matching(queue, MessageFilter())) == 1  # a task's take
    second = broker.acquire_lease(queue, "pipeline", 2, max_messages=10)
    assert second is not None and second.count == 1  # the abandoned one, nothing leased
    assert broker.lease_rows(second)[0][-1] == 2  # its second delivery
    assert broker.complete_lease(lease) == 4
    assert broker.complete_lease(second) == 1
    assert_balanced(broker)


def test_a_lease_whose_lock_ran_out_counts_the_delivery_and_poisons(
    broker: Broker, clock: ManualClock
) -> None:
    """A lease's lock that runs out is an abandon of each message it held, as a receiver's
    is: the delivery counted, the retry policy applied (here: dead-lettered at once)."""
    broker.create_queue("once", max_delivery_count=1, lock_duration=30)
    fill(broker, "once", 3)
    lease = broker.acquire_lease("once", "pipeline", 1, max_messages=3)
    assert lease is not None
    clock.advance(31)
    assert broker.acquire_lease("once", "pipeline", 2, max_messages=3) is None
    dead = broker.peek("once/$deadletterqueue", max_messages=10)
    assert [(m.dead_letter_reason, m.delivery_count) for m in dead] == [
        ("MaxDeliveryCountExceeded", 1)
    ] * 3
    assert broker.complete_lease(lease) == 0
    assert broker.get_queue("once").ledger.lock_expiries == 3
    assert_balanced(broker)


def test_each_way_of_settling_a_leased_message_apart(broker: Broker, queue: str) -> None:
    """Settled one by one, a leased message leaves its lease (and counts the delivery it
    had under it); the lease completes the rest."""
    seqs = fill(broker, queue, 5)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=5)
    assert lease is not None
    token = lease.lock_token
    receiver = broker.receiver(queue)
    (deferred,) = [m for m in broker.peek(queue, max_messages=5) if m.sequence_number == seqs[3]]
    deferred.lock_token = token
    receiver.defer(deferred)
    renewed = broker.peek(queue, max_messages=5)[4]
    renewed.lock_token = token
    receiver.renew_lock(renewed)
    broker.settle_held(
        queue,
        [
            Complete(seqs[0], token),
            Abandon(seqs[1], token, None),
            DeadLetter(seqs[2], token, "Invalid", "checked"),
        ],
    )
    assert broker.lease_sequence_numbers(lease) == [seqs[4]]
    assert broker.message(queue, seqs[1]).delivery_count == 1  # counted in its row now
    assert broker.message(queue, seqs[3]).state is poisonq.MessageState.DEFERRED
    assert broker.complete_lease(lease) == 1
    assert broker.counts(queue)["completed"] == 2
    assert_balanced(broker)


def test_a_lease_range_bound_is_a_sequence_number(broker: Broker, queue: str) -> None:
    """A bound of another type raised TypeError while the range was cut."""
    fill(broker, queue, 2)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=2)
    assert lease is not None
    for bad in ("1", 1.5, -1, 2**64):
        with pytest.raises(poisonq.InvalidOptionError):
            broker.lease_rows(lease, bad, None)  # type: ignore[arg-type]
        with pytest.raises(poisonq.InvalidOptionError):
            broker.release_lease(lease, None, bad)  # type: ignore[arg-type]
    assert len(broker.lease_rows(lease)) == 2


def test_a_postgresql_lease_writes_no_message_row(pg_url: str, clock: ManualClock) -> None:
    """Taking, renewing and reading a lease of fresh messages on PostgreSQL writes none of
    their rows (each keeps its version, xmin, its place, ctid, and is not even locked, xmax):
    the lease holds them as one range, as on SQLite. Completing it deletes them."""
    with poisonq.connect(pg_url, clock=clock) as broker:
        broker.create_queue("fresh")
        fill(broker, "fresh", 200)
        versions = "SELECT seq, xmin::text, xmax::text, ctid::text FROM messages ORDER BY seq"
        before = execute_behind_the_back(pg_url, versions)
        lease = broker.acquire_lease("fresh", "pipeline", 1, max_messages=200)
        assert lease is not None and lease.count == 200
        assert broker.renew_lease(lease) == 200
        assert len(broker.lease_rows(lease)) == 200
        assert len(broker.lease_sequence_numbers(lease)) == 200
        assert execute_behind_the_back(pg_url, versions) == before
        assert broker.counts("fresh")["locked"] == 200
        assert broker.complete_lease(lease) == 200
        assert execute_behind_the_back(pg_url, versions) == []
        assert_balanced(broker)


def test_leases_receivers_and_senders_at_once_never_share_a_message(
    broker: Broker, queue: str
) -> None:
    """Leases and receivers taking from one queue while a sender adds to it, each in threads
    of its own: every message sent is taken by exactly one of them and completed once (a
    message sent while a lease is taken is never inside its range unread)."""
    sent: list[int] = []
    taken: Counter[int] = Counter()
    sending = threading.Event()
    sending.set()
    guard = threading.Lock()

    def send() -> None:
        try:
            for _ in range(100):  # small batches: many sends while leases are taken
                sent.extend(fill(broker, queue, 5))
        finally:
            sending.clear()

    def lease(consumer: str) -> None:
        number = 0
        while True:
            number += 1
            held = broker.acquire_lease(queue, consumer, number, max_messages=7)
            if held is None:
                number -= 1
                if not sending.is_set():
                    return
                continue
            seqs = [row[0] for row in broker.lease_rows(held)]
            with guard:
                taken.update(seqs)
            assert broker.complete_lease(held) == len(seqs)

    def receive() -> None:
        receiver = broker.receiver(queue)
        while True:
            got = receiver.receive(max_messages=10)
            if not got:
                if not sending.is_set():
                    return
                continue
            with guard:
                taken.update(m.sequence_number for m in got)
            receiver.complete(got)

    with ThreadPoolExecutor(7) as pool:
        work = [pool.submit(send)]
        work += [pool.submit(lease, f"c{n}") for n in range(3)]
        work += [pool.submit(receive) for _ in range(3)]
        for done in work:
            done.result(timeout=100)  # a worker's failure fails the test
    assert len(sent) == 500
    assert taken == Counter(sent)  # each once, none left out
    assert broker.counts(queue)["completed"] == 500
    assert_balanced(broker)


def test_a_leased_message_does_not_expire_until_its_lease_gives_it_back(
    broker: Broker, clock: ManualClock
) -> None:
    """A message a lease holds is locked, and time to live applies to what waits in the
    queue: past its TTL it stays with its lease. When the lease's lock runs out it comes
    back with the delivery counted, and then expires (dead-lettered)."""
    broker.create_queue("ttl", lock_duration=30, dead_lettering_on_message_expiration=True)
    broker.sender("ttl").send([Message(body=b"x", time_to_live=10) for _ in range(3)])
    lease = broker.acquire_lease("ttl", "pipeline", 1, max_messages=3)
    assert lease is not None
    clock.advance(20)  # past the TTL, within the lease's lock
    assert broker.counts("ttl")["locked"] == 3
    assert broker.peek("ttl/$deadletterqueue", max_messages=10) == []
    assert len(broker.lease_rows(lease)) == 3
    clock.advance(20)  # the lease's lock ran out
    dead = broker.peek("ttl/$deadletterqueue", max_messages=10)
    assert [(m.dead_letter_reason, m.delivery_count) for m in dead] == [
        ("TTLExpiredException", 1)
    ] * 3
    assert broker.complete_lease(lease) == 0
    assert_balanced(broker)


def _crash(message: str = "died") -> poisonq.FailureRecord:
    return poisonq.FailureRecord(time=0.0, error_type="WorkerCrashed", message=message)


def test_retry_in_lease_abandons_and_takes_back_what_the_retry_policy_returns_at_once(
    broker: Broker, queue: str
) -> None:
    """A message abandoned with ``retry_in_lease`` is counted as any abandon (its failure
    appended, a delivery) and, being ready again at once, locked again under the lease:
    the lease reads it with its new delivery count and completes it with the rest. At the
    last delivery the policy poisons it, and it is not taken back."""
    fill(broker, queue, 4)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=4)
    assert lease is not None
    first, second = lease.min_sequence, lease.min_sequence + 1
    token = lease.lock_token
    rows, lost = broker.retry_in_lease(lease, [Abandon(first, token, _crash())])
    assert lost == []
    assert [(row[0], row[-1]) for row in rows] == [(first, 2)]
    assert [row[0] for row in broker.lease_rows(lease)] == [first, second, first + 2, first + 3]
    assert broker.message(queue, first).failures[0].error_type == "WorkerCrashed"

    for delivery in (2, 3):  # the queue allows 3 deliveries: the third abandon poisons
        rows, _ = broker.retry_in_lease(lease, [Abandon(first, token, _crash(str(delivery)))])
        assert [row[-1] for row in rows] == ([3] if delivery == 2 else [])
    [letter] = broker.peek(f"{queue}/$deadletterqueue")
    assert (letter.sequence_number, letter.dead_letter_reason) == (
        first,
        "MaxDeliveryCountExceeded",
    )
    assert [f.message for f in letter.failures] == ["died", "2", "3"]
    assert broker.complete_lease(lease) == 3
    assert broker.counts(queue)["completed"] == 3
    assert_balanced(broker)


def test_retry_in_lease_leaves_a_delayed_message_and_a_disabled_queue_alone(
    broker: Broker,
) -> None:
    """What the retry policy does not return at once is not taken back: a message waiting
    out its redelivery delay stays scheduled, and nothing is taken back from a queue the
    abandon disabled (``auto_disable_after_rollbacks``)."""
    broker.create_queue(
        "delayed", retry=poisonq.RetryPolicy(receive_retry_count=4, redelivery_delay=60)
    )
    fill(broker, "delayed", 2)
    lease = broker.acquire_lease("delayed", "pipeline", 1, max_messages=2)
    assert lease is not None
    rows, _ = broker.retry_in_lease(lease, [Abandon(lease.min_sequence, lease.lock_token)])
    assert rows == []
    assert broker.counts("delayed")["scheduled"] == 1

    broker.create_queue("fragile", max_delivery_count=5, auto_disable_after_rollbacks=1)
    fill(broker, "fragile", 2)
    lease = broker.acquire_lease("fragile", "pipeline", 1, max_messages=2)
    assert lease is not None
    rows, _ = broker.retry_in_lease(lease, [Abandon(lease.min_sequence, lease.lock_token)])
    assert rows == []
    assert broker.get_queue("fragile").status == "receive_disabled"
    assert broker.counts("fragile")["active"] == 1
    assert_balanced(broker)


def test_retry_in_lease_leaves_out_what_the_lease_no_longer_holds(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """An abandon whose lock ran out is left out, as ``settle_held`` leaves it: nothing is
    taken back and the lost message is named."""
    fill(broker, queue, 2)
    lease = broker.acquire_lease(queue, "pipeline", 1, max_messages=2)
    assert lease is not None
    clock.advance(31)
    rows, lost = broker.retry_in_lease(lease, [Abandon(lease.min_sequence, lease.lock_token)])
    assert (rows, lost) == ([], [lease.min_sequence])
    assert_balanced(broker)
