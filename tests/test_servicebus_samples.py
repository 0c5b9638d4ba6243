"""The azure-servicebus samples' flows, in the SDK's idiom, sync and asyncio, run unchanged
but for the import line and the connection string (the store URL) on both stores; after each,
the store holds what the sample did, and the ledger balances.

The programs are in tests/servicebus_samples/, each naming the published sample whose flow
it follows (``aio_*``: the asyncio samples, through ``poisonq.servicebus.aio``). They read
their entity names from the environment, as the published samples do. A flow both flavours
publish is one test run through each (``flavour``).
"""

from __future__ import annotations

import runpy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import poisonq
from tests.helpers import assert_balanced

# Whole programs that wait as the published samples do (a second for a session that does
# not come, and the like): `make test` runs them, the fast tier does not.
pytestmark = pytest.mark.slow

SAMPLES = Path(__file__).parent / "servicebus_samples"

Run = Callable[..., None]
both_flavours = pytest.mark.parametrize("flavour", ["sync", "aio"])


@pytest.fixture
def run(url: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    """Run a sample with the store URL as its connection string and ``names`` in its
    environment."""

    def run_sample(sample: str, flavour: str = "sync", **names: str) -> None:
        monkeypatch.setenv("SERVICEBUS_CONNECTION_STR", url)
        for name, value in names.items():
            monkeypatch.setenv(f"SERVICEBUS_{name.upper()}", value)
        program = sample if flavour == "sync" else f"{flavour}_{sample}"
        runpy.run_path(str(SAMPLES / f"{program}.py"), run_name="__main__")

    return run_sample


@pytest.fixture
def store(url: str) -> Iterator[poisonq.Broker]:
    """The samples' entities, and a broker to look at what they did."""
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=3)
        broker.create_queue("sessions", requires_session=True)
        broker.create_topic("events")
        broker.create_subscription("events", "all")
        yield broker


@both_flavours
def test_sending_puts_one_message_a_list_and_a_batch_in_the_queue(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("send_queue", flavour, queue_name="orders")
    assert store.counts("orders")["active"] == 21
    assert_balanced(store)


@both_flavours
def test_receiving_a_batch_then_iterating_completes_everything_sent(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("send_queue", flavour, queue_name="orders")
    run("receive_queue", flavour, queue_name="orders")
    counts = store.counts("orders")
    assert (counts["active"], counts["locked"], counts["completed"]) == (0, 0, 21)
    assert_balanced(store)


@both_flavours
def test_peeking_locks_nothing_and_counts_no_delivery(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("send_queue", flavour, queue_name="orders")
    run("receive_peek", flavour, queue_name="orders")
    assert store.counts("orders")["active"] == 21
    assert all(m.delivery_count == 0 for m in store.peek("orders"))
    assert_balanced(store)


@both_flavours
def test_dead_lettered_messages_are_received_from_the_dead_letter_subqueue(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("receive_deadlettered_messages", flavour, queue_name="orders")
    left = store.dead_letters("orders")
    assert len(left) == 5  # the sample completes five of the ten from the dead-letter queue
    assert {(m.dead_letter_reason, m.dead_letter_error_description) for m in left} == {
        ("ProcessingError", "Failed to process the message")
    }
    assert_balanced(store)


def test_a_dead_lettered_message_is_corrected_and_sent_again(
    run: Run, store: poisonq.Broker
) -> None:
    run("deadletter_messages_and_correct", queue_name="orders")
    counts = store.counts("orders")
    # The good one and the corrected copy; the dead letter was completed in its subqueue.
    assert (counts["active"], counts["dead_lettered"], counts["completed"]) == (0, 0, 2)
    assert_balanced(store)


def test_the_asyncio_flavour_dead_letters_past_max_delivery_and_corrects_the_bad_ones(
    run: Run, store: poisonq.Broker
) -> None:
    """Abandoned until the queue's ``max_delivery_count`` dead-letters it; of ten more, the
    five Good completed and the five Bad corrected from the dead-letter queue and sent
    again. The sample closes its client by hand, the handlers it handed out with it."""
    run("deadletter_messages_and_correct", "aio", queue_name="orders")
    counts = store.counts("orders")
    assert (counts["active"], counts["dead_lettered"], counts["completed"]) == (0, 0, 10)
    assert store.count_dead_letters("orders") == 0
    assert_balanced(store)


@both_flavours
def test_deferred_messages_are_received_again_by_sequence_number(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("receive_deferred_message_queue", flavour, queue_name="orders")
    counts = store.counts("orders")
    assert (counts["deferred"], counts["completed"]) == (0, 10)
    assert_balanced(store)


@both_flavours
def test_a_session_is_received_whole_with_its_state(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("session_send_receive", flavour, session_queue_name="sessions", session_id="s-1")
    assert store.counts("sessions")["completed"] == 21
    with store.accept_session("sessions", "s-1") as session:
        assert session.get_session_state() == b"END"
    assert_balanced(store)


def test_every_session_is_taken_in_turn_until_none_is_left(run: Run, store: poisonq.Broker) -> None:
    run("session_pool_receive", session_queue_name="sessions")
    assert store.counts("sessions")["completed"] == 9
    for session_id in "abc":
        with store.accept_session("sessions", session_id) as session:
            assert session.get_session_state() == b"CLOSED"
    assert_balanced(store)


def test_five_asyncio_receivers_take_every_session_in_turn_until_none_is_left(
    run: Run, store: poisonq.Broker
) -> None:
    """Five receivers on one event loop, each session's lock under an AutoLockRenewer: every
    session of 21 messages received whole, its state CLOSED."""
    run("session_pool_receive", "aio", session_queue_name="sessions")
    assert store.counts("sessions")["completed"] == 5 * 21
    session_ids = store.session_ids("sessions")
    assert len(session_ids) == 5
    for session_id in session_ids:
        with store.accept_session("sessions", session_id) as session:
            assert session.get_session_state() == b"CLOSED"
    assert_balanced(store)


@both_flavours
def test_sessions_are_listed_with_their_messages_or_their_state(
    run: Run, store: poisonq.Broker, flavour: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A queue's sessions with a message or a stored state, a subscription's, and those
    whose state was set in the past week (a session with a message but no state is not)."""
    store.create_subscription("events", "sessions", requires_session=True)
    store.sender("sessions").send(poisonq.Message(body=b"x", session_id="held"))
    with store.accept_session("sessions", "kept") as session:
        session.set_session_state(b"state")
    store.sender("events").send(poisonq.Message(body=b"x", session_id="topic"))
    run(
        "list_sessions",
        flavour,
        session_queue_name="sessions",
        topic_name="events",
        subscription_name="sessions",
    )
    assert capsys.readouterr().out.splitlines() == [
        "Queue session: held",
        "Queue session: kept",
        "Subscription session: topic",
        "Recently updated queue session: kept",
    ]
    assert_balanced(store)


@both_flavours
def test_scheduled_messages_are_cancelled_before_they_are_due(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("schedule_messages_and_cancellation", flavour, queue_name="orders")
    counts = store.counts("orders")
    assert (counts["scheduled"], counts["dropped"]) == (0, 11)
    assert_balanced(store)


@both_flavours
def test_a_topics_scheduled_messages_are_cancelled_in_its_subscriptions(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("schedule_messages_and_cancellation", flavour, topic_name="events")
    counts = store.counts("events/subscriptions/all")
    assert (counts["scheduled"], counts["dropped"]) == (0, 11)
    assert_balanced(store)


@both_flavours
def test_what_is_sent_to_a_topic_is_received_from_its_subscription(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("topic_send_subscription_receive", flavour, topic_name="events", subscription_name="all")
    assert store.counts("events/subscriptions/all")["completed"] == 21
    assert_balanced(store)


@both_flavours
def test_lock_renewal_of_messages_and_sessions_ends_with_their_settlement(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("auto_lock_renew", flavour, queue_name="orders", session_queue_name="sessions")
    assert store.counts("orders")["completed"] == 11
    assert store.counts("sessions")["completed"] == 10
    assert_balanced(store)


@both_flavours
def test_a_queue_is_created_updated_measured_and_deleted(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("mgmt_queue", flavour)
    names = {q.name for q in store.list_queues()}
    assert names == {"events", "events/subscriptions/all", "orders", "sessions"}
    assert_balanced(store)


@both_flavours
def test_a_topic_and_its_subscription_are_created_updated_and_deleted(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("mgmt_topic_subscription", flavour)
    names = {q.name for q in store.list_queues()}
    assert names == {"events", "events/subscriptions/all", "orders", "sessions"}
    assert_balanced(store)


@both_flavours
def test_rules_are_added_to_an_existing_subscription_updated_and_removed(
    run: Run, store: poisonq.Broker, flavour: str
) -> None:
    run("mgmt_rule", flavour, topic_name="events", subscription_name="all")
    assert list(store.rules("events", "all")) == ["$Default"]
    assert_balanced(store)
