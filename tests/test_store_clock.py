"""Time is the store's clock: what is due (a lock that ran out and the poison decision it
triggers, a time to live that passed, a scheduled message or a retry cycle whose time came,
the auto-disable after rollbacks) happens when it is due, as every reader sees it (``counts``,
``peek``, ``get_queue``, ``list_queues``, ``audit``, the dead-letter reads), whether or not
anyone receives. The readers here are a second client on the same store, which never
receives; each test runs on both stores."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

import poisonq
from poisonq import (
    Broker,
    EntityDisabledError,
    EntityNotFoundError,
    ManualClock,
    Message,
    MessageState,
    RetryPolicy,
    StoreUnavailableError,
)
from tests.helpers import assert_balanced

Q = "orders"
DLQ = f"{Q}/$deadletterqueue"


@pytest.fixture
def reader(url: str, clock: ManualClock) -> Iterator[Broker]:
    """A second client on the same store and clock: it only reads."""
    with poisonq.connect(url, clock=clock) as opened:
        yield opened


def test_locks_that_ran_out_are_poisoned_as_a_second_client_reads_without_any_receive(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    broker.create_queue(Q, max_delivery_count=1, lock_duration=1)
    messages = [Message(body=b"short", time_to_live=1) for _ in range(3)]
    broker.sender(Q).send([*messages, Message(body=b"long")])
    assert len(broker.receiver(Q).receive(max_messages=4)) == 4
    clock.advance(2.5)
    counts = reader.counts(Q)
    assert (counts["active"], counts["locked"], counts["dead_lettered"]) == (0, 0, 4)
    dead = reader.peek(DLQ, max_messages=10)
    assert {m.dead_letter_reason for m in dead} == {"MaxDeliveryCountExceeded"}
    assert reader.get_queue(Q).ledger.lock_expiries == 4
    assert_balanced(reader)


def test_a_lock_that_ran_out_counts_as_an_abandon_when_read(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    """Not a show of a ready message that nothing counted: the delivery is spent, once."""
    broker.create_queue(Q, max_delivery_count=5, lock_duration=10)
    (seq,) = broker.sender(Q).send(Message(body=b"x"))
    broker.receiver(Q).receive()
    clock.advance(10)
    [seen] = reader.peek(Q)
    assert (seen.state, seen.delivery_count, seen.abort_count) == (MessageState.ACTIVE, 1, 1)
    assert seen.locked_until is None
    assert reader.message(Q, seq).abort_count == 1
    assert reader.counts(Q)["active"] == 1
    assert_balanced(reader)


@pytest.mark.parametrize("dead_letters", [True, False])
def test_a_message_past_its_time_to_live_leaves_as_every_reader_sees_it(
    broker: Broker, reader: Broker, clock: ManualClock, dead_letters: bool
) -> None:
    broker.create_queue(Q, dead_lettering_on_message_expiration=dead_letters)
    broker.sender(Q).send([Message(body=b"x", time_to_live=10), Message(body=b"y")])
    clock.advance(9.9)
    assert reader.counts(Q)["active"] == 2
    clock.advance(0.1)
    assert [m.body for m in reader.peek(Q)] == [b"y"]
    counts = reader.counts(Q)
    assert (counts["active"], counts["dead_lettered"], counts["dropped"]) == (
        1,
        int(dead_letters),
        int(not dead_letters),
    )
    if dead_letters:
        [group] = reader.dead_letter_groups(Q)
        assert (group.key, group.count) == ("TTLExpiredException", 1)
        assert reader.count_dead_letters(Q) == 1
    assert_balanced(reader)


def test_a_read_of_the_dead_letter_queue_alone_sees_what_expired_in_its_queue(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    broker.create_queue(Q)
    broker.sender(Q).send(Message(body=b"x", time_to_live=10))
    clock.advance(10)
    assert [m.dead_letter_reason for m in reader.dead_letters(Q)] == ["TTLExpiredException"]
    assert_balanced(reader)


def test_a_scheduled_message_is_active_when_its_time_comes(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    broker.create_queue(Q)
    at = datetime.fromtimestamp(clock.now() + 30, UTC)
    broker.sender(Q).send(Message(body=b"x", scheduled_enqueue_time=at))
    assert reader.counts(Q)["scheduled"] == 1
    clock.advance(30)
    counts = reader.counts(Q)
    assert (counts["scheduled"], counts["active"]) == (0, 1)
    assert [m.state for m in reader.peek(Q)] == [MessageState.ACTIVE]


@pytest.mark.parametrize("read", ["queue", "retry subqueue"])
def test_a_retry_cycle_ends_when_its_delay_has_passed(
    broker: Broker, reader: Broker, clock: ManualClock, read: str
) -> None:
    """Reading the retry subqueue alone applies it too: its queue takes its messages back."""
    retry = RetryPolicy(receive_retry_count=0, max_retry_cycles=1, retry_cycle_delay=10)
    broker.create_queue(Q, retry=retry)
    broker.sender(Q).send(Message(body=b"x"))
    receiver = broker.receiver(Q)
    receiver.abandon(receiver.receive())
    assert reader.counts(f"{Q};retry")["scheduled"] == 1
    clock.advance(10)
    if read == "retry subqueue":
        assert reader.counts(f"{Q};retry")["scheduled"] == 0
    assert reader.counts(Q)["active"] == 1
    assert_balanced(reader)


def test_auto_disable_after_locks_that_ran_out_is_seen_with_every_consumer_down(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    """The alert on a disabled queue reads its status: it must turn while nobody receives."""
    broker.create_queue(Q, auto_disable_after_rollbacks=3, max_delivery_count=10, lock_duration=5)
    broker.sender(Q).send([Message(body=str(n)) for n in range(3)])
    broker.receiver(Q).receive(max_messages=3)
    assert reader.get_queue(Q).status == "active"
    clock.advance(5)
    info = reader.get_queue(Q)
    assert info.status == "receive_disabled"
    assert info.event is not None and info.event.rollbacks == 3
    [listed] = reader.list_queues()
    assert listed.status == "receive_disabled"
    with pytest.raises(EntityDisabledError):
        broker.receiver(Q).receive()
    assert_balanced(reader)


def test_time_passes_for_a_disabled_queue_too(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    """Reading it works as before (a receive is refused) and shows its messages expired."""
    broker.create_queue(Q)
    broker.sender(Q).send(Message(body=b"x", time_to_live=10))
    broker.disable(Q)
    clock.advance(10)
    assert reader.counts(Q)["dead_lettered"] == 1
    with pytest.raises(EntityDisabledError):
        reader.receiver(Q).receive()
    with pytest.raises(EntityNotFoundError):
        reader.counts("ordres")
    assert_balanced(reader)


def test_readers_and_a_receiver_in_many_clients_at_once_apply_a_lock_expiry_once(
    url: str, broker: Broker, clock: ManualClock
) -> None:
    """Every transition is guarded: whoever finds it due first applies it, the others find
    it done (SQLite: one writer at a time; PostgreSQL: the rows locked, the taken skipped)."""
    broker.create_queue(Q, max_delivery_count=5, lock_duration=5, auto_disable_after_rollbacks=5)
    broker.sender(Q).send([Message(body=str(n)) for n in range(5)])
    broker.receiver(Q).receive(max_messages=5)
    clock.advance(5)
    readers = [poisonq.connect(url, clock=clock) for _ in range(7)]
    start = threading.Barrier(len(readers))
    errors: list[BaseException] = []

    def read(client: Broker, number: int) -> None:
        start.wait()
        try:
            if number == 6:  # a receiver among them: a receive that checked the status
                # before another client's disable committed may still take the messages,
                # after their expiry was counted (PostgreSQL reads committed state)
                got = client.receiver(Q).receive(max_messages=5)
                assert all(m.abort_count == 1 for m in got)
            else:
                [client.counts, client.get_queue, client.peek][number % 3](Q)
        except EntityDisabledError:
            assert number == 6
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(r, n)) for n, r in enumerate(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for client in readers:
        client.close()
    assert errors == []
    assert [m.abort_count for m in broker.peek(Q, max_messages=10)] == [1] * 5
    info = broker.get_queue(Q)
    assert info.ledger.lock_expiries == 5
    assert info.status == "receive_disabled" and info.event is not None
    assert info.event.rollbacks == 5
    assert_balanced(broker)


def test_housekeep_applies_what_is_due_everywhere_in_one_pass(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    """For time to pass where nobody reads (``poisonq housekeep``, the server's loop): it
    names the entities where something was due, one transaction each."""
    broker.create_queue(Q, max_delivery_count=1, lock_duration=5)
    broker.create_queue("idle")
    broker.create_queue("payments", lock_duration=5, max_delivery_count=1)
    broker.sender(Q).send(Message(body=b"x", time_to_live=10))
    broker.sender("payments").send(Message(body=b"y"))
    broker.receiver("payments").receive()
    assert reader.housekeep() == []
    clock.advance(10)
    assert reader.housekeep() == [Q, "payments"]
    assert reader.housekeep() == []
    assert reader.count_dead_letters(Q) == reader.count_dead_letters("payments") == 1
    assert_balanced(reader)


def test_an_idle_read_neither_takes_nor_waits_for_the_write_lock(
    tmp_path: object, clock: ManualClock
) -> None:
    """On SQLite a read that finds nothing due is a read (a snapshot of the WAL) while
    another process holds the write lock; one that finds something due waits for it."""
    path = f"{tmp_path}/q.db"
    with poisonq.connect(f"sqlite:///{path}?busy_timeout=0.1", clock=clock, retry_total=0) as b:
        b.create_queue(Q)
        b.sender(Q).send(Message(body=b"x", time_to_live=10))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert b.counts(Q)["active"] == 1
            assert len(b.peek(Q)) == 1 and b.audit().ok
            clock.advance(10)
            with pytest.raises(StoreUnavailableError):
                b.counts(Q)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert b.counts(Q)["dead_lettered"] == 1


HOLDER = textwrap.dedent(
    """
    import sys, time
    import poisonq

    with poisonq.connect(sys.argv[1]) as broker:
        got = broker.receiver("orders").receive(max_messages=3)
        print(len(got), flush=True)
        time.sleep(120)
    """
)


@pytest.mark.slow
def test_locks_of_a_killed_process_are_poisoned_as_another_process_reads(url: str) -> None:
    """Real time, real processes: a receiver killed (SIGKILL) while it holds three locks;
    after the lock duration another process's ``counts`` shows them dead-lettered, and
    nobody received."""
    with poisonq.connect(url) as broker:
        broker.create_queue(Q, max_delivery_count=1, lock_duration=1)
        broker.sender(Q).send([Message(body=str(n)) for n in range(3)])
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, url], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "3"
            assert broker.counts(Q)["locked"] == 3
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            holder.stdout.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while (counts := broker.counts(Q))["dead_lettered"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (counts["locked"], counts["active"], counts["dead_lettered"]) == (0, 0, 3)
        assert broker.get_queue(Q).ledger.lock_expiries == 3
        assert_balanced(broker)
