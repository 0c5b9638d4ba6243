"""A transaction that makes a message receivable wakes the receivers waiting on the store.

A waiting receive takes the store's change marker, looks, and waits for the marker to move
(``Store.wait_for_change``); it also looks again every ``LOOK_INTERVAL``, so a missed wake
costs latency, not a message, and only a test of the change feed itself can see one. Each
transition here runs through the public API while a second client of the store (another
process, as far as the store can tell) waits: SQLite wakes it on every commit, PostgreSQL
only on the commits that made a message receivable (``NOTIFY``), which is what each case
checks. The watcher starts listening after the setup has committed, so only the transition
under test can wake it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from poisonq import (
    Broker,
    ManualClock,
    Message,
    ReceivedMessage,
    Receiver,
    Release,
    RetryPolicy,
)
from poisonq.store import open_store
from poisonq.store.base import Store
from tests.helpers import assert_balanced

Q = "orders"
DLQ = f"{Q}/$deadletterqueue"
WAIT = 10.0  # seconds a watcher waits at most: far more than a wake takes

Transition = Callable[[], object]


def _send(broker: Broker, clock: ManualClock) -> Transition:
    return lambda: broker.sender(Q).send(Message(body=b"new"))


def _scheduled_message_comes_due(broker: Broker, clock: ManualClock) -> Transition:
    due = datetime.fromtimestamp(clock.now() + 10, UTC)
    broker.sender(Q).send(Message(body=b"later", scheduled_enqueue_time=due))
    clock.advance(10)
    return broker.housekeep


def _abandon(broker: Broker, clock: ManualClock) -> Transition:
    receiver, message = _received(broker)
    return lambda: receiver.abandon(message)


def _lock_runs_out(broker: Broker, clock: ManualClock) -> Transition:
    _received(broker)
    clock.advance(31)
    return broker.housekeep


def _release(broker: Broker, clock: ManualClock) -> Transition:
    _, message = _received(broker)
    return lambda: broker.settle(Q, [Release(message.sequence_number, message.lock_token)])


def _release_lease(broker: Broker, clock: ManualClock) -> Transition:
    broker.sender(Q).send([Message(body=b"leased") for _ in range(3)])
    lease = broker.acquire_lease(Q, "pipeline", 1, max_messages=3)
    assert lease is not None
    return lambda: broker.release_lease(lease)


def _dead_letter(broker: Broker, clock: ManualClock) -> Transition:
    receiver, message = _received(broker)
    return lambda: receiver.dead_letter(message, reason="Invalid")  # into the DLQ


def _resubmit(broker: Broker, clock: ManualClock) -> Transition:
    receiver, message = _received(broker)
    receiver.dead_letter(message, reason="Invalid")
    return lambda: broker.resubmit(Q, rate=None)


def _retry_cycle_returns(broker: Broker, clock: ManualClock) -> Transition:
    cycle = RetryPolicy(receive_retry_count=0, max_retry_cycles=1, retry_cycle_delay=30)
    broker.update_queue(Q, retry=cycle)
    receiver, message = _received(broker)
    receiver.abandon(message)  # to the retry subqueue, for 30 s
    clock.advance(30)
    return broker.housekeep  # back into the queue


def _session_given_up(broker: Broker, clock: ManualClock) -> Transition:
    broker.create_queue("chats", requires_session=True)
    broker.sender("chats").send(Message(body=b"hello", session_id="a"))
    session = broker.accept_session("chats", "a")
    return session.close  # another receiver may accept it now


def _enable(broker: Broker, clock: ManualClock) -> Transition:
    broker.sender(Q).send(Message(body=b"waiting"))
    broker.disable(Q)
    return lambda: broker.enable(Q)


def _received(broker: Broker) -> tuple[Receiver, ReceivedMessage]:
    broker.sender(Q).send(Message(body=b"x"))
    receiver = broker.receiver(Q)
    (message,) = receiver.receive()
    return receiver, message


@pytest.fixture
def watcher(url: str) -> Iterator[Store]:
    """A second client of the store that only waits for changes."""
    with open_store(url) as store:
        yield store


def _wakes(watcher: Store, transition: Transition, within: float) -> bool:
    """Whether a wait that began before ``transition`` ends within ``within`` seconds."""
    marker = watcher.change_marker()  # PostgreSQL listens from here on
    transition()
    started = time.monotonic()
    watcher.wait_for_change(marker, within)
    return watcher.change_marker() != marker and time.monotonic() - started < within


@pytest.mark.parametrize(
    "setup",
    [
        _send,
        _scheduled_message_comes_due,
        _abandon,
        _lock_runs_out,
        _release,
        _release_lease,
        _dead_letter,
        _resubmit,
        _retry_cycle_returns,
        _session_given_up,
        _enable,
    ],
    ids=lambda setup: setup.__name__.strip("_"),
)
def test_a_transition_that_makes_a_message_receivable_wakes_a_waiting_receiver(
    broker: Broker,
    queue: str,
    clock: ManualClock,
    watcher: Store,
    setup: Callable[[Broker, ManualClock], Transition],
) -> None:
    transition = setup(broker, clock)
    assert _wakes(watcher, transition, WAIT)
    assert_balanced(broker)


def test_a_completion_wakes_no_receiver_on_postgresql(pg_url: str, clock: ManualClock) -> None:
    """The other side of the rule: PostgreSQL notifies only when something became
    receivable (SQLite wakes its waiters on every commit)."""
    import poisonq

    with poisonq.connect(pg_url, clock=clock) as broker, open_store(pg_url) as store:
        broker.create_queue(Q)
        receiver, message = _received(broker)
        assert not _wakes(store, lambda: receiver.complete(message), 0.5)
