"""Session receivers as azure-servicebus has them: what keeps a session lock, waiting for a
session, what closing a session gives back, a session poisoned or ended with an error as a
whole, and the lock renewer that keeps sessions and messages alive.

The renewer runs with an interval no test reaches; each test moves the clock and calls
``renew_due`` (one pass of its thread) itself.
"""

from __future__ import annotations

import threading

import pytest

from poisonq import (
    AutoLockRenewer,
    Broker,
    InvalidOperationError,
    InvalidOptionError,
    ManualClock,
    Message,
    MessageLockLostError,
    SessionLockLostError,
)
from poisonq.receivers import SessionReceiver
from tests.helpers import assert_balanced, recording_renewer


@pytest.fixture
def sessions(broker: Broker) -> str:
    broker.create_queue("orders", requires_session=True, max_delivery_count=2, lock_duration=2)
    return "orders"


def _send(broker: Broker, session_id: str, *bodies: str) -> list[int]:
    return broker.sender("orders").send([Message(body=b, session_id=session_id) for b in bodies])


# What keeps a session lock --------------------------------------------------------------------
def test_receiving_does_not_extend_the_session_lock_as_in_service_bus(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    """Draining a session for longer than its lock loses the lock: only a renewal extends
    it (receiving and settling do not), and the error says the session's lock is gone."""
    _send(broker, "a", *[f"a{n}" for n in range(4)])
    with broker.accept_session(sessions, "a") as session:
        for _ in range(2):
            [message] = session.receive()
            clock.advance(0.9)
            session.complete(message)
        clock.advance(0.3)
        with pytest.raises(SessionLockLostError, match="ran out"):
            session.receive()
    assert_balanced(broker)


def test_an_auto_lock_renewer_keeps_a_session_for_as_long_as_it_is_worked_on(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    """A session receiver accepted with ``auto_lock_renewer`` keeps its session (and the
    locks of the messages received under it) through 20 lock durations."""
    _send(broker, "a", *[f"a{n}" for n in range(20)])
    lost, renewer = recording_renewer()
    with renewer, broker.accept_session(sessions, "a", auto_lock_renewer=renewer) as session:
        for n in range(20):
            [message] = session.receive()
            assert message.text == f"a{n}"
            for _ in range(4):  # a handler that takes two lock durations
                clock.advance(0.5)
                renewer.renew_due()
            session.complete(message)
        assert session.receive() == []
    renewer.renew_due()
    assert lost == []  # closed: the session lock ended, it was not lost
    assert broker.counts(sessions)["completed"] == 20
    assert_balanced(broker)


def test_a_session_registered_by_hand_is_renewed_and_its_loss_reported_once(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    """``register(session_receiver)`` renews the session lock (azure's
    ``register(receiver, receiver.session)``); a session whose lock ran out before the
    renewal is reported once to ``on_lock_renew_failure``, with the session receiver."""
    _send(broker, "a", "a1")
    lost, renewer = recording_renewer()
    with renewer:
        session = broker.accept_session(sessions, "a")
        renewer.register(session)
        clock.advance(1.5)
        renewer.renew_due()
        assert session.session_locked_until.timestamp() == clock.now() + 2
        clock.advance(2.5)  # the renewer missed its turn: the lock ran out
        renewer.renew_due()
        renewer.renew_due()
        assert [(what, type(error)) for what, error in lost] == [(session, SessionLockLostError)]
        session.close()


def test_a_renewer_refuses_a_plain_receiver_without_messages_and_anything_once_closed(
    broker: Broker, sessions: str
) -> None:
    """A closed renewer would renew nothing: registering with it is refused, as azure's
    renewer refuses after its shutdown, instead of letting the locks run out silently (and
    the session accepted for it is given up again)."""
    broker.create_queue("plain")
    renewer = AutoLockRenewer(check_interval=3600)
    with pytest.raises(InvalidOperationError, match="session"):
        renewer.register(broker.receiver("plain"))
    renewer.close()
    _send(broker, "a", "a1")
    with pytest.raises(InvalidOperationError, match="closed"):
        broker.accept_session(sessions, "a", auto_lock_renewer=renewer)
    with broker.accept_session(sessions, "a") as session:
        assert [m.text for m in session.receive()] == ["a1"]


def test_a_receiver_with_an_auto_lock_renewer_registers_what_it_receives(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """``receiver(auto_lock_renewer=...)``: each peek-locked message received is renewed
    until it is settled, as azure's ``get_queue_receiver(auto_lock_renewer=...)``."""
    broker.sender(queue).send([Message(body="x"), Message(body="y")])
    lost, renewer = recording_renewer()
    with renewer:
        receiver = broker.receiver(queue, auto_lock_renewer=renewer)
        messages = receiver.receive(max_messages=2)
        for _ in range(6):  # three lock durations of 30 s
            clock.advance(15)
            renewer.renew_due()
        receiver.complete(messages)
        renewer.renew_due()
    assert lost == []
    assert broker.counts(queue)["completed"] == 2
    assert_balanced(broker)


# Waiting for a session --------------------------------------------------------------------------
def test_accept_next_session_with_no_wait_returns_none_at_once(
    broker: Broker, sessions: str
) -> None:
    assert broker.accept_next_session(sessions, max_wait=0) is None
    with pytest.raises(InvalidOptionError, match="max_wait"):
        broker.accept_next_session(sessions, max_wait=-1)


@pytest.mark.parametrize("how", ["sent", "given up", "lock ran out"])
def test_accept_next_session_waits_for_a_session_to_become_available(
    broker: Broker, sessions: str, clock: ManualClock, how: str
) -> None:
    """It waits for a message of a new session to be sent, for a held session to be
    given up, or for its lock to run out on the store's clock."""
    holder = None
    if how != "sent":
        _send(broker, "a", "a1")
        holder = broker.accept_session(sessions, "a")
    got: list[SessionReceiver | None] = []
    waiter = threading.Thread(
        target=lambda: got.append(broker.accept_next_session(sessions, max_wait=60))
    )
    waiter.start()
    if how == "sent":
        _send(broker, "a", "a1")
    elif how == "given up":
        assert holder is not None
        holder.close()
    else:
        clock.advance(2)
    waiter.join(60)
    assert not waiter.is_alive()
    [session] = got
    assert session is not None and session.session_id == "a"
    assert [m.text for m in session.receive()] == ["a1"]


# What closing gives back -------------------------------------------------------------------------
def test_closing_a_session_gives_back_its_locked_messages_uncounted(
    broker: Broker, sessions: str
) -> None:
    """Closing gives the whole session back: re-accepting gets every message in order, and
    no delivery is counted (a close is not a failed delivery)."""
    _send(broker, "a", "a1", "a2", "a3")
    with broker.accept_session(sessions, "a") as session:
        assert len(session.receive(max_messages=3)) == 3
    with broker.accept_session(sessions, "a") as again:
        got = again.receive(max_messages=10)
        assert [m.text for m in got] == ["a1", "a2", "a3"]
        assert [m.delivery_count for m in got] == [1, 1, 1]
        again.complete(got)
    assert_balanced(broker)


def test_leaving_the_with_block_by_an_exception_fails_the_message_in_hand(
    broker: Broker, sessions: str
) -> None:
    """An exception that ends the ``with`` block counts a delivery against the oldest
    message still held (the one the handler was on), with the exception as its failure;
    the others come back uncounted. A handler that always fails so poisons its message
    (and with it the session) instead of getting it back forever."""
    _send(broker, "a", "a1", "a2", "a3")
    for attempt in (1, 2):
        with pytest.raises(ValueError), broker.accept_session(sessions, "a") as session:
            got = session.receive(max_messages=3)
            assert [m.delivery_count for m in got] == [attempt, 1, 1]
            raise ValueError("bad card")
    dead = broker.peek("orders/$deadletterqueue", max_messages=10)
    assert [m.text for m in dead] == ["a1", "a2", "a3"]
    assert dead[0].failures[-1].error_type == "ValueError"
    assert_balanced(broker)


def test_a_closed_session_receiver_refuses_further_use(broker: Broker, sessions: str) -> None:
    _send(broker, "a", "a1")
    session = broker.accept_session(sessions, "a")
    [message] = session.receive()
    session.close()
    session.close()  # closing again does nothing
    for use in (session.receive, session.get_session_state, session.renew_session_lock):
        with pytest.raises(InvalidOperationError, match="closed"):
            use()
    with pytest.raises(MessageLockLostError):
        session.complete(message)
    assert_balanced(broker)


# Poisoned or ended as a whole -------------------------------------------------------------------
def test_whole_session_poisoning_takes_the_sessions_locked_messages_too(
    broker: Broker, sessions: str
) -> None:
    """The session's messages held under a lock go with the poison message too, and
    settling one of them afterwards raises MessageLockLostError."""
    _send(broker, "a", "a1", "a2", "a3")
    session = broker.accept_session(sessions, "a")
    first, *rest = session.receive(max_messages=3)
    session.abandon(first)
    [first] = session.receive()
    assert session.abandon(first, error=ValueError("bad")) == [first.sequence_number]
    dead = broker.peek("orders/$deadletterqueue", max_messages=10)
    assert [m.text for m in dead] == ["a1", "a2", "a3"]
    with pytest.raises(MessageLockLostError):
        session.complete(rest)
    assert broker.counts(sessions)["locked"] == 0
    assert_balanced(broker)


def test_abandon_with_a_delay_is_refused_on_a_session_queue(broker: Broker, sessions: str) -> None:
    """A session is delivered in order, so one message cannot wait while the rest of the
    session goes on: the call is refused and the message keeps its lock."""
    _send(broker, "a", "a1", "a2")
    session = broker.accept_session(sessions, "a")
    [message] = session.receive()
    with pytest.raises(InvalidOperationError, match="in order"):
        session.abandon(message, delay=3)
    assert not message.settled
    session.abandon(message, delay=0)
    assert [m.text for m in session.receive()] == ["a1"]
    assert_balanced(broker)


def test_dead_letter_session_ends_the_session_with_an_error(broker: Broker, sessions: str) -> None:
    """Service Broker's END CONVERSATION WITH ERROR: the session's held, deferred and
    undelivered messages go to the dead-letter queue with the reason, other sessions and
    what was completed stay, and the receiver is done."""
    _send(broker, "a", "a1", "a2", "a3", "a4")
    _send(broker, "b", "b1")
    session = broker.accept_session(sessions, "a")
    first, second = session.receive(max_messages=2)
    session.complete(first)
    session.defer(second)
    [third] = session.receive()
    moved = session.dead_letter_session("OrderCancelled", "the card was declined")
    assert moved == [second.sequence_number, third.sequence_number, third.sequence_number + 1]
    dead = broker.peek("orders/$deadletterqueue", max_messages=10)
    assert [(m.text, m.dead_letter_reason) for m in dead] == [
        ("a2", "OrderCancelled"),
        ("a3", "OrderCancelled"),
        ("a4", "OrderCancelled"),
    ]
    assert dead[0].dead_letter_error_description == "the card was declined"
    with pytest.raises(InvalidOperationError, match="closed"):
        session.receive()
    with pytest.raises(MessageLockLostError):
        session.complete(third)
    with broker.accept_session(sessions, "a") as again:
        assert again.receive() == []
    assert broker.counts(sessions)["active"] == 1  # b1
    assert_balanced(broker)


def test_dead_letter_session_with_a_lost_session_lock_changes_nothing(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    _send(broker, "a", "a1", "a2")
    session = broker.accept_session(sessions, "a")
    session.receive()
    clock.advance(3)
    with pytest.raises(SessionLockLostError):
        session.dead_letter_session("OrderCancelled")
    assert broker.peek("orders/$deadletterqueue") == []
    with pytest.raises(InvalidOptionError, match="reason"):
        broker.accept_session(sessions, "a").dead_letter_session("")
    assert_balanced(broker)
