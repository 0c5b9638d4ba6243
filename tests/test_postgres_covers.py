"""PostgreSQL's lease covers while other transactions run. A cover locks no row, so what keeps
two holders apart is the entity's cover lock (``poisonq/store/postgres/covers.py``): a lease
being taken waits for the sends and claims under way, and those that come after it wait for
its commit. Each test holds one transaction open, through the store, at the moment that
matters, and drives the other side through the public API in a thread; it waits for that
side to queue behind the lock (or to end, which fails the test), then commits."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

import poisonq
from poisonq import Broker, ManualClock, Message, MessageState, ReceivedMessage
from poisonq.engine.driving import drive
from poisonq.model import Lease
from poisonq.store import open_store
from poisonq.store.base import EntityRecord, NewMessage, Store
from poisonq.store.postgres.covers import COVER_LOCKS
from tests.helpers import assert_balanced, execute_behind_the_back, fill

QUEUE = "orders"
WAIT = 30.0


@pytest.fixture
def both(pg_url: str, clock: ManualClock) -> Iterator[tuple[Broker, Store]]:
    with poisonq.connect(pg_url, clock=clock) as broker, open_store(pg_url) as store:
        broker.create_queue(QUEUE, lock_duration=60)
        yield broker, store


def _queued_behind_a_lock(pg_url: str, other: Future[Any]) -> None:
    """Return once a transaction waits for an advisory lock; fail if ``other`` ends first
    (it went ahead without waiting)."""
    deadline = time.monotonic() + WAIT
    while not execute_behind_the_back(
        pg_url, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    ):
        assert not other.done(), "went ahead without waiting"
        assert time.monotonic() < deadline
        time.sleep(0.01)  # polling another connection's state, not timing anything


def test_a_receive_while_a_lease_is_taken_waits_and_takes_none_of_it(
    both: tuple[Broker, Store], pg_url: str, clock: ManualClock
) -> None:
    """A receiver that comes while a lease takes the queue's messages waits for its commit
    and then sees them held: never the same message as the lease."""
    broker, store = both
    fill(broker, QUEUE, 10)

    async def lease_while_receiving() -> list[ReceivedMessage]:
        async with store.transaction() as tx:
            entity = await tx.entity(QUEUE)
            assert entity is not None
            now = clock.now()
            lease = await tx.lock_lease(
                entity.id, QUEUE, "pipeline", 1, MessageState.ACTIVE, 10, "t", now + 60, now
            )
            assert lease is not None and lease.count == 10
            receiving = pool.submit(broker.receiver(QUEUE).receive, 10)
            _queued_behind_a_lock(pg_url, receiving)
        return receiving.result(timeout=WAIT)

    with ThreadPoolExecutor(1) as pool:
        assert drive(lease_while_receiving()) == []
    held = broker.lease(QUEUE, "pipeline", 1)
    assert held is not None and broker.complete_lease(held) == 10
    assert_balanced(broker)


def test_a_message_sent_while_a_lease_is_taken_is_never_inside_its_range_unread(
    both: tuple[Broker, Store], pg_url: str, clock: ManualClock
) -> None:
    """A lease taken while a send is under way waits for it: the message that send commits
    is in the lease, not left inside its range where nothing would deliver it."""
    broker, store = both

    async def send_while_leasing() -> tuple[int, int, Lease | None]:
        async with store.transaction() as tx:
            entity = await tx.entity(QUEUE)
            assert entity is not None
            message = NewMessage("first", b"1", 1, *[None] * 6, MessageState.ACTIVE, None, None)
            (first,) = await tx.insert_messages(entity.id, [message], clock.now())
            (second,) = broker.sender(QUEUE).send(Message(b"2"))  # committed, above it
            leasing = pool.submit(broker.acquire_lease, QUEUE, "pipeline", 1, 10)
            _queued_behind_a_lock(pg_url, leasing)
        return first, second, leasing.result(timeout=WAIT)

    with ThreadPoolExecutor(1) as pool:
        first, second, lease = drive(send_while_leasing())
    assert lease is not None
    assert [row[0] for row in broker.lease_rows(lease)] == [first, second]
    assert broker.complete_lease(lease) == 2
    assert broker.receiver(QUEUE).receive(10) == []
    assert_balanced(broker)


def _cover_lock_key(store: Store) -> tuple[int, int]:
    """The advisory lock of the queue's covers (keys as covers.py takes them)."""
    entity = drive(_entity(store))
    return COVER_LOCKS, entity.id & 0x7FFFFFFF


async def _entity(store: Store) -> EntityRecord:
    async with store.transaction() as tx:
        entity = await tx.entity(QUEUE)
        assert entity is not None
        return entity


def _waiters(pg_url: str) -> int:
    rows = execute_behind_the_back(
        pg_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def test_two_leases_after_ttl_sweeps_take_the_queue_in_turn_without_a_deadlock(
    both: tuple[Broker, Store], pg_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Two leases taken at once on a queue with messages past their TTL: each one's sweep
    claims the queue before its lease takes a cover, and the second waits for the first
    instead of both holding the cover lock shared and then both waiting for it exclusive
    (which PostgreSQL ends as a deadlock, rolling one back)."""
    broker, store = both
    fill(broker, QUEUE, 4, time_to_live=10)
    clock.advance(11)  # expired: each lease's housekeeping sweeps them
    fill(broker, QUEUE, 10)
    key = _cover_lock_key(store)
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", key)  # both leases queue behind it
        with ThreadPoolExecutor(2) as pool:
            leases = [
                pool.submit(broker.acquire_lease, QUEUE, consumer, 1, 5)
                for consumer in ("one", "two")
            ]
            deadline = time.monotonic() + WAIT
            while _waiters(pg_url) < 2:
                assert not any(lease.done() for lease in leases), "went ahead without waiting"
                assert time.monotonic() < deadline
                time.sleep(0.01)  # polling another connection's state, not timing anything
            holder.execute("SELECT pg_advisory_unlock(%s, %s)", key)
            taken = [lease.result(timeout=WAIT) for lease in leases]
    assert not [r for r in caplog.records if "deadlock" in r.getMessage()]
    held = [set(broker.lease_sequence_numbers(lease)) for lease in taken if lease is not None]
    assert [len(seqs) for seqs in held] == [5, 5] and not held[0] & held[1]
    assert_balanced(broker)


def test_a_receive_that_cannot_have_the_cover_lock_locks_its_batch_row_by_row(
    both: tuple[Broker, Store], pg_url: str
) -> None:
    """A receive tries the cover lock and, while another transaction holds it shared,
    locks its batch message by message instead of waiting; a lease taken afterwards
    leaves those messages alone, and the rest go to it as a range."""
    broker, store = both
    fill(broker, QUEUE, 10)
    key = _cover_lock_key(store)
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock_shared(%s, %s)", key)
        batch = broker.receiver(QUEUE).receive(max_messages=4)
        holder.execute("SELECT pg_advisory_unlock_shared(%s, %s)", key)
    assert [m.delivery_count for m in batch] == [1] * 4
    locked = execute_behind_the_back(pg_url, "SELECT count(*) FROM messages WHERE state = 'locked'")
    assert locked == [(4,)]
    lease = broker.acquire_lease(QUEUE, "pipeline", 1, 10)
    assert lease is not None and lease.count == 6
    assert not set(broker.lease_sequence_numbers(lease)) & {m.sequence_number for m in batch}
    broker.receiver(QUEUE).complete(batch)
    assert broker.complete_lease(lease) == 6
    assert_balanced(broker)
