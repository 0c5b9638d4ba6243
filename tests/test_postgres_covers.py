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

import pytest

import poisonq
from poisonq import Broker, ManualClock, Message, MessageState
from poisonq.store import open_store
from poisonq.store.base import NewMessage, Store
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
    with ThreadPoolExecutor(1) as pool:
        with store.transaction() as tx:
            entity = tx.entity(QUEUE)
            assert entity is not None
            now = clock.now()
            lease = tx.lock_lease(
                entity.id, QUEUE, "pipeline", 1, MessageState.ACTIVE, 10, "t", now + 60, now
            )
            assert lease is not None and lease.count == 10
            receiving = pool.submit(broker.receiver(QUEUE).receive, 10)
            _queued_behind_a_lock(pg_url, receiving)
        assert receiving.result(timeout=WAIT) == []
    held = broker.lease(QUEUE, "pipeline", 1)
    assert held is not None and broker.complete_lease(held) == 10
    assert_balanced(broker)


def test_a_message_sent_while_a_lease_is_taken_is_never_inside_its_range_unread(
    both: tuple[Broker, Store], pg_url: str, clock: ManualClock
) -> None:
    """A lease taken while a send is under way waits for it: the message that send commits
    is in the lease, not left inside its range where nothing would deliver it."""
    broker, store = both
    with ThreadPoolExecutor(1) as pool:
        with store.transaction() as tx:
            entity = tx.entity(QUEUE)
            assert entity is not None
            message = NewMessage("first", b"1", 1, *[None] * 6, MessageState.ACTIVE, None, None)
            (first,) = tx.insert_messages(entity.id, [message], clock.now())
            (second,) = broker.sender(QUEUE).send(Message(b"2"))  # committed, above it
            leasing = pool.submit(broker.acquire_lease, QUEUE, "pipeline", 1, 10)
            _queued_behind_a_lock(pg_url, leasing)
        lease = leasing.result(timeout=WAIT)
    assert lease is not None
    assert [row[0] for row in broker.lease_rows(lease)] == [first, second]
    assert broker.complete_lease(lease) == 2
    assert broker.receiver(QUEUE).receive(10) == []
    assert_balanced(broker)
