"""A settlement racing the AutoLockRenewer is never reported as a lost lock.

The renewer looks at a message (not settled yet), then renews its lock in the store; a
complete from the handler's thread may reach the store in between, or the renewer's pass may
run between the complete's commit and its return. Either way the renewal fails because the
message is completed, and that is the lock's normal end, not a loss. Each interleaving is
forced here by a receiver or an engine that runs the other side at that exact point, on the
real stores, with no thread and no timing.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from poisonq import AutoLockRenewer, Broker, Complete, ManualClock, Message, ReceiveMode
from poisonq.engine.driving import drive
from poisonq.receivers import MessageOrList, Receiver, SessionReceiver
from tests.helpers import assert_balanced, recording_renewer


class CompletesDuringRenewal(Receiver):
    """A receiver whose renewal, after the renewer looked at the message and chose to renew
    it, lets the handler's complete reach the store first."""

    async def _renew_lock(self, messages: MessageOrList) -> None:
        await self._complete(messages)
        await super()._renew_lock(messages)


class ClosesDuringRenewal(SessionReceiver):
    """A session receiver closed after the renewer chose to renew its session lock."""

    async def _renew_session_lock(self) -> None:
        await self._close(None)
        await super()._renew_session_lock()


class PassAfterCommit:
    """The engine, except that a complete (alone, or with a receive) runs one renewer pass
    after it committed and before it returns to the receiver."""

    def __init__(self, engine: Any, renewer: AutoLockRenewer) -> None:
        self._engine = engine
        self._renewer = renewer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def complete(self, *args: Any) -> None:
        await self._engine.complete(*args)
        self._renewer.renew_due()

    async def receive(self, *args: Any) -> Any:
        got = await self._engine.receive(*args)
        self._renewer.renew_due()
        return got


def test_a_complete_that_reaches_the_store_during_a_renewal_is_no_loss(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A renewal that fails because the handler's complete reached the store first is the
    lock's normal end: the renewer reports nothing lost."""
    broker.sender(queue).send(Message(body="x"))
    receiver = CompletesDuringRenewal(broker, queue, None, ReceiveMode.PEEK_LOCK, None)
    lost, renewer = recording_renewer()
    with renewer:
        [message] = receiver.receive()
        renewer.register(receiver, message)
        clock.advance(20)  # past half the 30 s lock: due for renewal
        renewer.renew_due()
    assert lost == []
    assert message.settled
    assert broker.counts(queue)["completed"] == 1
    assert_balanced(broker)


@pytest.mark.parametrize("settle", ["complete", "complete_and_receive", "settle_and_receive"])
def test_a_renewal_between_a_completes_commit_and_its_return_is_no_loss(
    broker: Broker, queue: str, clock: ManualClock, settle: str
) -> None:
    """Every way of completing marks the message settled before the store completes it
    (``complete_and_receive`` before its wait for the next messages too), so a renewer pass
    between the commit and the call's return finds it settled and reports nothing lost."""
    broker.sender(queue).send([Message(body="x"), Message(body="y")])
    lost, renewer = recording_renewer()
    receiver = broker.receiver(queue, auto_lock_renewer=renewer)
    with renewer:
        [message] = receiver.receive()
        receiver._engine = cast(Any, PassAfterCommit(receiver._engine, renewer))
        clock.advance(20)
        if settle == "complete":
            receiver.complete(message)
        else:
            if settle == "complete_and_receive":
                [following] = receiver.complete_and_receive(message)
            else:
                done = Complete(message.sequence_number, message.lock_token or "")
                [following] = receiver.settle_and_receive([done])
            receiver.complete(following)
    assert lost == []
    assert broker.counts(queue)["completed"] == (1 if settle == "complete" else 2)
    assert_balanced(broker)


def test_a_session_closed_during_its_renewal_is_no_loss(broker: Broker, clock: ManualClock) -> None:
    broker.create_queue("orders", requires_session=True, lock_duration=30)
    broker.sender("orders").send(Message(body="a1", session_id="a"))
    accepted = drive(broker.engine.accept_session("orders", "a"))
    assert accepted is not None
    session = ClosesDuringRenewal(broker, "orders", None, *accepted)
    lost, renewer = recording_renewer()
    with renewer:
        renewer.register(session)
        clock.advance(20)
        renewer.renew_due()
    assert lost == []
    assert session.closed
    assert_balanced(broker)


def test_a_lock_really_lost_is_still_reported_once(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """The guard against false losses hides no real one: a lock that ran out before its
    renewal is reported, once, with the message."""
    broker.sender(queue).send(Message(body="x"))
    receiver = broker.receiver(queue)
    lost, renewer = recording_renewer()
    with renewer:
        [message] = receiver.receive()
        renewer.register(receiver, message)
        clock.advance(31)
        renewer.renew_due()
        renewer.renew_due()
    assert [what for what, _ in lost] == [message]
    assert_balanced(broker)
