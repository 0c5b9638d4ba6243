"""A settlement whose connection was lost while it committed: the retry cannot know whether
the first attempt landed. A completion it finds stored nowhere was that attempt's, and is not
reported as a lost lock (which would tell the caller the message comes again)."""

from __future__ import annotations

from typing import Any

import pytest

from poisonq import Abandon, Broker, Complete, ManualClock, MessageLockLostError
from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.errors import StoreUnavailableError
from poisonq.retrying import OperationRetry, Reachability, retrying
from tests.helpers import assert_balanced, fill


class CutAfterCommit(Engine):
    """An engine whose first ``settle`` commits and then loses its answer, as a connection
    dropped while the commit was in flight does."""

    cuts = 1

    async def settle(self, *args: Any, **kwargs: Any) -> list[int]:
        poisoned = await super().settle(*args, **kwargs)
        if self.cuts:
            self.cuts -= 1
            raise StoreUnavailableError("server closed the connection unexpectedly")
        return poisoned


def test_a_retried_completion_takes_a_message_stored_nowhere_as_completed(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """The first attempt committed, its answer was lost: the client's retry of the same
    completions returns normally, and the messages are completed once."""
    fill(broker, queue, 4)
    got = broker.receiver(queue).receive(max_messages=4)
    retried = retrying(
        CutAfterCommit(broker.store, clock),
        OperationRetry(retry_backoff_factor=0),
        Reachability(broker.url),
    )
    settlements = [Complete(m.sequence_number, m.lock_token) for m in got[:3]]
    assert drive(retried.settle(queue, settlements)) == []
    assert broker.counts(queue)["completed"] == 3
    assert broker.counts(queue)["locked"] == 1
    assert_balanced(broker)


def test_without_doubt_completing_a_completed_message_is_a_lost_lock(
    broker: Broker, queue: str
) -> None:
    """Outside a retry, a completion of a message already completed raises, as Service Bus
    does for a lock that is no longer held."""
    fill(broker, queue, 1)
    (message,) = broker.receiver(queue).receive()
    complete = Complete(message.sequence_number, message.lock_token)
    broker.settle(queue, [complete])
    with pytest.raises(MessageLockLostError):
        broker.settle(queue, [complete])


def test_an_in_doubt_completion_of_a_message_still_stored_is_a_lost_lock(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """A message whose lock ran out and that is waiting again was not completed by anyone:
    even in doubt, completing it under the old lock raises and changes nothing."""
    fill(broker, queue, 2)
    first, second = broker.receiver(queue).receive(max_messages=2)
    clock.advance(31)
    settlements = [Complete(m.sequence_number, m.lock_token) for m in (first, second)]
    with pytest.raises(MessageLockLostError) as raised:
        drive(broker.engine.settle(queue, settlements, in_doubt=True))
    assert raised.value.sequence_numbers == [first.sequence_number, second.sequence_number]
    assert broker.counts(queue)["completed"] == 0
    assert broker.counts(queue)["active"] == 2


def test_an_in_doubt_abandon_of_a_settled_message_is_still_a_lost_lock(
    broker: Broker, queue: str
) -> None:
    """Only completions are recognised: a message dead-lettered or redelivered is still
    stored, so an abandon retried after its first attempt landed cannot be told apart from
    one whose lock was lost, and raises."""
    fill(broker, queue, 1)
    (message,) = broker.receiver(queue).receive()
    abandon = Abandon(message.sequence_number, message.lock_token, None)
    broker.settle(queue, [abandon])
    with pytest.raises(MessageLockLostError):
        drive(broker.engine.settle(queue, [abandon], in_doubt=True))
