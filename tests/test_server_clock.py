"""Time is the store's clock, also across hosts: a broker on PostgreSQL follows the database
server's clock (the local clock plus an offset measured against the server), so a client
whose own clock runs ahead neither expires the locks of other clients' in-flight messages
nor their time-to-lives when it reads. SQLite is one machine: its clock is the local one. A
clock the user gives wins."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

import poisonq
from poisonq import Broker, ManualClock, Message, StoreUnavailableError
from poisonq.clock import ServerClock, SystemClock
from poisonq.store.base import Store
from poisonq.store.postgres import PostgresStore
from tests.helpers import assert_balanced

Q = "orders"
AHEAD = 120.0  # a host whose clock runs two minutes ahead
CLOSE = 2.0  # seconds: generous, the test server is on this machine


def _server_now(store: Store) -> float:
    return time.time() + store.server_offset(time.time)


def _ahead() -> float:
    return time.time() + AHEAD


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    with PostgresStore.from_url(pg_url) as opened:
        yield opened


def test_a_postgresql_broker_follows_the_servers_clock_by_default(pg_url: str) -> None:
    with poisonq.connect(pg_url) as broker:
        assert isinstance(broker.clock, ServerClock)
        assert abs(broker.clock.now() - _server_now(broker.store)) < CLOSE


def test_a_sqlite_broker_keeps_the_local_clock_and_a_given_clock_wins(
    sqlite_url: str, pg_url: str
) -> None:
    with poisonq.connect(sqlite_url) as broker:
        assert isinstance(broker.clock, SystemClock)
    given = ManualClock()
    with poisonq.connect(pg_url, clock=given) as broker:
        assert broker.clock is given


def test_the_server_clock_tells_the_servers_time_whatever_the_local_clock_says(
    store: PostgresStore,
) -> None:
    local_error = [AHEAD]
    clock = ServerClock(store.server_offset, local=lambda: time.time() + local_error[0], every=0)
    assert abs(clock.now() - _server_now(store)) < CLOSE
    local_error[0] = -3600.0  # the local clock is stepped back an hour: the next now() measures
    assert abs(clock.now() - _server_now(store)) < CLOSE


def test_a_failed_measurement_keeps_the_last_offset(store: PostgresStore) -> None:
    answers = iter([store.server_offset(_ahead)])

    def measure(local: Callable[[], float]) -> float:
        if (answer := next(answers, None)) is None:
            raise StoreUnavailableError("the server is restarting")
        return answer

    clock = ServerClock(measure, local=_ahead, every=0)
    assert abs(clock.now() - _server_now(store)) < CLOSE  # measured again, failed, kept


def test_a_reader_whose_clock_runs_ahead_dead_letters_nothing_in_flight(
    pg_url: str, store: PostgresStore
) -> None:
    """A consumer holds two messages (60 s locks, one delivery allowed, an hour to live); a
    client on a host two minutes ahead reads the counts, and then one an hour ahead: both
    messages are still locked, and the consumer completes them."""
    with poisonq.connect(pg_url) as consumer:
        consumer.create_queue(Q, lock_duration=60, max_delivery_count=1)
        consumer.sender(Q).send([Message(body=b"work", time_to_live=3600) for _ in range(2)])
        receiver = consumer.receiver(Q)
        held = receiver.receive(max_messages=2)
        assert len(held) == 2
        for ahead in (AHEAD, 3600.0):
            skewed = ServerClock(store.server_offset, local=lambda a=ahead: time.time() + a)
            counts = Broker(store, skewed).counts(Q)
            assert (counts["locked"], counts["dead_lettered"], counts["dropped"]) == (2, 0, 0)
        receiver.complete(held)
        assert consumer.counts(Q)["completed"] == 2
        assert_balanced(consumer)
