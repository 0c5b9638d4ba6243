"""Sessions: one receiver holds a whole session, in order, with state and lock renewal."""

from __future__ import annotations

import threading

import pytest

from poisonq import (
    Broker,
    InvalidOperationError,
    InvalidOptionError,
    ManualClock,
    Message,
    MessageAlreadySettledError,
    ProcessorStoppedError,
    ReceivedMessage,
    RetryPolicy,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from tests.aio_driver import processor
from tests.helpers import assert_balanced

BOTH_APIS = True  # each test with `broker` runs through the sync API and poisonq.aio (conftest)
SYNC_ONLY = {
    "test_a_plain_receiver_or_a_lease_is_refused_on_a_session_queue": "leases are the Spark"
    " runtime's, not in poisonq.aio",
}


@pytest.fixture
def sessions(broker: Broker) -> str:
    broker.create_queue("orders", requires_session=True, max_delivery_count=2, lock_duration=30)
    return "orders"


def _send(broker: Broker, *pairs: tuple[str, str]) -> list[int]:
    return broker.sender("orders").send([Message(body=b, session_id=s) for s, b in pairs])


def test_a_message_without_session_id_is_dead_lettered_session_id_is_null(
    broker: Broker, sessions: str
) -> None:
    broker.sender(sessions).send([Message(body=b"x"), Message(body=b"y", session_id="a")])
    [dead] = broker.peek("orders/$deadletterqueue")
    assert dead.dead_letter_reason == "SessionIdIsNull"
    assert broker.counts(sessions)["active"] == 1
    assert_balanced(broker)


def test_a_session_receiver_gets_its_sessions_messages_in_order(
    broker: Broker, sessions: str
) -> None:
    _send(broker, ("a", "a1"), ("b", "b1"), ("a", "a2"), ("a", "a3"))
    with broker.accept_session(sessions, "a") as receiver:
        got = receiver.receive(max_messages=10)
        assert [m.text for m in got] == ["a1", "a2", "a3"]
        receiver.abandon(got[0])
        receiver.complete(got[1:])
        [again] = receiver.receive(max_messages=10)
        assert again.text == "a1"
        receiver.complete(again)
    nxt = broker.accept_next_session(sessions)
    assert nxt is not None and nxt.session_id == "b"
    assert broker.accept_next_session(sessions, max_wait=0) is None
    assert_balanced(broker)


def test_a_plain_receiver_or_a_lease_is_refused_on_a_session_queue(
    broker: Broker, sessions: str
) -> None:
    with pytest.raises(InvalidOperationError, match="sessions"):
        broker.receiver(sessions).receive()
    with pytest.raises(InvalidOperationError, match="sessions"):
        broker.acquire_lease(sessions, "spark", 1, max_messages=10)


def test_a_locked_session_cannot_be_accepted_by_another_receiver(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    _send(broker, ("a", "a1"))
    first = broker.accept_session(sessions, "a")
    with pytest.raises(SessionCannotBeLockedError):
        broker.accept_session(sessions, "a")
    assert broker.accept_next_session(sessions, max_wait=0) is None
    clock.advance(30)
    second = broker.accept_session(sessions, "a")
    with pytest.raises(SessionLockLostError):
        first.receive()
    assert len(second.receive()) == 1


def test_session_state_is_kept_across_session_locks(broker: Broker, sessions: str) -> None:
    _send(broker, ("a", "a1"))
    with broker.accept_session(sessions, "a") as receiver:
        assert receiver.get_session_state() is None
        receiver.set_session_state(b"step 2")
    with broker.accept_session(sessions, "a") as receiver:
        assert receiver.get_session_state() == b"step 2"


def test_the_sessions_listed_are_those_with_messages_or_state(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    """Service Bus' list of sessions: those with a message held (not dead-lettered) or a
    state kept; after a time, those whose state was set after it."""
    _send(broker, ("a", "a1"), ("b", "b1"))
    with broker.accept_session(sessions, "a") as receiver:
        receiver.set_session_state(b"done")
        receiver.complete(receiver.receive())
    assert broker.session_ids(sessions) == ["a", "b"]  # a: its state; b: its message
    before = clock.now()
    clock.advance(10)
    with broker.accept_session(sessions, "b") as receiver:
        receiver.set_session_state(b"started")
    assert broker.session_ids(sessions, state_updated_after=before) == ["b"]
    with broker.accept_session(sessions, "a") as receiver:
        receiver.set_session_state(None)
    with broker.accept_session(sessions, "b") as receiver:
        receiver.set_session_state(None)
        receiver.complete(receiver.receive())
    assert broker.session_ids(sessions) == []
    broker.create_queue("plain")
    with pytest.raises(InvalidOperationError):
        broker.session_ids("plain")


def test_renewing_the_session_lock_renews_its_message_locks(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    _send(broker, ("a", "a1"))
    receiver = broker.accept_session(sessions, "a")
    [message] = receiver.receive()
    clock.advance(20)
    receiver.renew_session_lock()
    clock.advance(20)
    receiver.complete(message)
    clock.advance(31)
    with pytest.raises(SessionLockLostError):
        receiver.renew_session_lock()
    with pytest.raises(MessageAlreadySettledError):
        receiver.complete(message)  # completed above: refused before the store


def test_a_session_receiver_refuses_a_message_it_settled_before_the_store(
    broker: Broker, sessions: str
) -> None:
    """Settling again a message the session receiver settled raises
    MessageAlreadySettledError and changes nothing: the session's other message stays
    locked under it, and the session goes on."""
    _send(broker, ("a", "a1"), ("a", "a2"))
    with broker.accept_session(sessions, "a") as receiver:
        first, second = receiver.receive(max_messages=2)
        receiver.complete(first)
        for settle in (receiver.complete, receiver.abandon, receiver.defer, receiver.renew_lock):
            with pytest.raises(MessageAlreadySettledError):
                settle([second, first])  # type: ignore[operator]
        assert broker.counts(sessions)["locked"] == 1
        receiver.complete(second)
    assert broker.counts(sessions)["completed"] == 2
    assert_balanced(broker)


def test_a_poisoned_message_takes_its_whole_session_with_it(broker: Broker, sessions: str) -> None:
    _send(broker, ("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"))
    receiver = broker.accept_session(sessions, "a")
    for _ in range(2):
        [first] = receiver.receive()
        receiver.abandon(first, error=ValueError("bad"))
    dead = broker.peek("orders/$deadletterqueue")
    assert [d.text for d in dead] == ["a1", "a2", "a3"]
    assert broker.counts(sessions)["active"] == 1
    assert_balanced(broker)


def test_per_message_poisoning_moves_only_the_poisoned_message(broker: Broker) -> None:
    broker.create_queue(
        "orders", requires_session=True, per_message_poisoning=True,
        retry=RetryPolicy(receive_retry_count=0),
    )  # fmt: skip
    _send(broker, ("a", "a1"), ("a", "a2"))
    receiver = broker.accept_session("orders", "a")
    receiver.abandon(receiver.receive(), error=ValueError("bad"))
    assert [d.text for d in broker.peek("orders/$deadletterqueue")] == ["a1"]
    assert [m.text for m in receiver.receive()] == ["a2"]


def test_the_processor_processes_a_session_queue_in_order(broker: Broker, sessions: str) -> None:
    _send(broker, ("a", "a1"), ("b", "b1"), ("a", "a2"), ("b", "b2"))
    seen: list[str] = []

    def handle(message: ReceivedMessage) -> None:
        seen.append(message.text)

    stats = processor(broker, sessions, handle, batch_size=10, max_wait=0).run(until_idle=True)
    assert stats.completed == 4
    assert [s for s in seen if s[0] == "a"] == ["a1", "a2"]
    assert [s for s in seen if s[0] == "b"] == ["b1", "b2"]
    assert_balanced(broker)


def test_a_batch_with_a_poison_message_is_rolled_back_and_re_read_in_halves(
    broker: Broker, sessions: str
) -> None:
    _send(broker, *[("a", f"a{n}") for n in range(6)])
    runs: list[int] = []

    def handle(batch: list[ReceivedMessage]) -> None:
        runs.append(len(batch))
        if any(m.text == "a4" for m in batch):
            raise ValueError("a4 is poison")

    broker.update_queue(sessions, per_message_poisoning=True)
    stats = processor(broker, sessions, handle, batch=True, batch_size=6, max_wait=0).run(
        until_idle=True
    )
    assert runs[0] == 6 and 3 in runs
    assert [d.text for d in broker.peek("orders/$deadletterqueue")] == ["a4"]
    assert stats.completed == 5
    assert_balanced(broker)


def test_renewing_a_message_lock_in_a_session_renews_the_session_lock(
    broker: Broker, sessions: str, clock: ManualClock
) -> None:
    _send(broker, ("a", "a1"), ("a", "a2"))
    receiver = broker.accept_session(sessions, "a")
    [first] = receiver.receive()
    clock.advance(20)
    receiver.renew_lock(first)
    clock.advance(20)
    receiver.complete(first)
    assert [m.text for m in receiver.receive()] == ["a2"]  # the session is still held


def test_requires_session_is_fixed_when_the_queue_is_created(broker: Broker, sessions: str) -> None:
    with pytest.raises(InvalidOptionError, match="requires_session"):
        broker.update_queue(sessions, requires_session=False)
    broker.create_queue("plain")
    with pytest.raises(InvalidOptionError, match="requires_session"):
        broker.update_queue("plain", requires_session=True)


@pytest.mark.parametrize(("batch", "concurrency"), [(False, 1), (False, 3), (True, 2)])
def test_a_failure_stops_its_sessions_batch_so_order_holds(
    broker: Broker, sessions: str, batch: bool, concurrency: int
) -> None:
    """A failure stops the rest of its session's batch: the ops after it wait for its
    retry, so a session's order holds."""
    broker.update_queue(sessions, max_delivery_count=3)
    accounts = [f"acct-{n:02d}" for n in range(4)]
    _send(broker, *[(account, f"{account}:{op}") for op in range(20) for account in accounts])
    failed_once: set[str] = set()
    done: dict[str, list[int]] = {account: [] for account in accounts}
    lock = threading.Lock()

    def handle_one(message: ReceivedMessage) -> None:
        account, op = message.text.split(":")
        if op in ("5", "11") and message.text not in failed_once:
            failed_once.add(message.text)
            raise ConnectionError("gateway 503")
        with lock:
            done[account].append(int(op))

    def handle_batch(messages: list[ReceivedMessage]) -> None:
        for message in messages:  # all or nothing: a batch that raises did nothing
            op = message.text.split(":")[1]
            if op in ("5", "11") and message.text not in failed_once:
                failed_once.add(message.text)
                raise ConnectionError("gateway 503")
        for message in messages:
            handle_one(message)

    handler = handle_batch if batch else handle_one
    stats = processor(
        broker, sessions, handler, batch=batch, batch_size=10, concurrency=concurrency,
        max_wait=0,
    ).run(until_idle=True)  # fmt: skip
    if batch:  # a batch's first part is handled again while the failure is searched for
        done = {account: list(dict.fromkeys(ops)) for account, ops in done.items()}
    else:
        assert stats.released > 0  # the ops after a failure, given back to come after it
    assert done == {account: list(range(20)) for account in accounts}
    assert stats.completed == 80 and broker.counts(sessions)["completed"] == 80
    assert_balanced(broker)


def test_a_poisoned_message_in_a_batch_takes_the_rest_of_its_session(
    broker: Broker, sessions: str
) -> None:
    """A poisoned message takes the rest of its session with it, even the ops received in
    the same batch (WCF's rule)."""
    _send(broker, *[("acct", f"op{n}") for n in range(8)], ("other", "x"))

    def handle(message: ReceivedMessage) -> None:
        if message.text == "op3":
            raise KeyError("no such card")

    stats = processor(broker, sessions, handle, batch_size=10, max_wait=0).run(until_idle=True)
    dead = [m.text for m in broker.peek("orders/$deadletterqueue", max_messages=20)]
    assert dead == ["op3", "op4", "op5", "op6", "op7"]
    assert stats.completed == 4  # op0-op2 and the other session's message
    assert_balanced(broker)


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("accounts", [30, 3])
def test_a_bug_on_a_session_queue_poisons_no_session(
    broker: Broker, sessions: str, concurrency: int, accounts: int
) -> None:
    """A handler bug that fails the first message of every session stops the run with
    nothing spent, however few the sessions (from three): the sessions holding a failure
    wait, open, for the others, and when every session on offer failed the same way that
    is a defect, not poison."""
    _send(broker, *[(f"acct-{a:02d}", f"op{n}") for a in range(accounts) for n in range(5)])

    def handle(message: ReceivedMessage) -> None:
        raise KeyError("operation")

    with pytest.raises(ProcessorStoppedError):
        processor(broker, sessions, handle, batch_size=10, concurrency=concurrency, max_wait=0).run(
            until_idle=True
        )
    counts = broker.counts(sessions)
    held = accounts * 5
    assert (counts["dead_lettered"], counts["completed"], counts["active"]) == (0, 0, held)
    assert {m.delivery_count for m in broker.peek(sessions, max_messages=held)} == {0}
    assert_balanced(broker)


def test_the_failing_first_messages_of_two_sessions_are_poison(
    broker: Broker, sessions: str
) -> None:
    """Two sessions failing the same way are too few to call a defect: their first
    messages are retried and poisoned, each with its session (WCF)."""
    _send(broker, *[(f"acct-{a}", f"op{n}") for a in range(2) for n in range(3)])

    def handle(message: ReceivedMessage) -> None:
        raise KeyError("operation")

    stats = processor(broker, sessions, handle, batch_size=10, max_wait=0).run(until_idle=True)
    assert stats.poisoned == 2
    assert broker.counts(sessions)["dead_lettered"] == 6
    assert_balanced(broker)


def test_a_parked_session_keeps_its_order_when_the_failure_was_poison(
    broker: Broker, sessions: str
) -> None:
    """A session parked on a failure is settled once other sessions succeed: the failing
    message is retried (then poisoned with its session), and the others go on in order."""
    broker.update_queue(sessions, per_message_poisoning=True)
    _send(broker, *[(f"acct-{a}", f"{a}:{n}") for a in range(4) for n in range(5)])
    seen: list[str] = []

    def handle(message: ReceivedMessage) -> None:
        if message.text == "0:1":
            raise KeyError("no such card")
        seen.append(message.text)

    stats = processor(broker, sessions, handle, batch_size=10, max_wait=0).run(until_idle=True)
    assert [m.text for m in broker.peek("orders/$deadletterqueue")] == ["0:1"]
    for account in range(4):
        ops = [s for s in seen if s.startswith(f"{account}:")]
        assert ops == sorted(ops) and len(ops) == (4 if account == 0 else 5)
    assert stats.completed == 19
    assert_balanced(broker)


def test_a_session_is_accepted_by_its_name_only(broker: Broker) -> None:
    """``accept_session(queue, None)`` took the next session, as ``accept_next_session``
    does, and its lock with it; state text that is not Unicode raised UnicodeEncodeError."""
    broker.create_queue("s", requires_session=True)
    broker.sender("s").send(Message(body=b"x", session_id="a"))
    for bad in (None, "", 5, "a\x00"):
        with pytest.raises(InvalidOptionError):
            broker.accept_session("s", bad)  # type: ignore[arg-type]
    with broker.accept_session("s", "a") as session:
        with pytest.raises(InvalidOptionError):
            session.set_session_state("\ud800")
        assert session.get_session_state() is None
