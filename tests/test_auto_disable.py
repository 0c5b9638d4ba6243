"""Service Broker's safety net: N rollbacks in a row disable receiving, with an event."""

from __future__ import annotations

import pytest

from poisonq import Broker, EntityDisabledError, ManualClock, Message, PoisonMessageError
from tests.helpers import assert_balanced


def _abandon(broker: Broker, n: int = 1) -> None:
    receiver = broker.receiver("orders")
    for _ in range(n):
        receiver.abandon(receiver.receive(), error=RuntimeError("db down"))


def test_auto_disable_after_n_consecutive_rollbacks(broker: Broker) -> None:
    broker.create_queue("orders", auto_disable_after_rollbacks=3)
    broker.sender("orders").send([Message(body=b"x")])
    _abandon(broker, 2)
    assert broker.get_queue("orders").status == "active"
    _abandon(broker)
    info = broker.get_queue("orders")
    assert info.status == "receive_disabled"
    assert info.event is not None and info.event.kind == "auto_disabled"
    assert info.event.rollbacks == 3 and "3 rollbacks in a row" in (info.status_cause or "")
    with pytest.raises(EntityDisabledError) as caught:
        broker.receiver("orders").receive()
    assert not isinstance(caught.value, PoisonMessageError)
    assert_balanced(broker)


def test_a_completion_between_rollbacks_resets_the_count(broker: Broker) -> None:
    broker.create_queue("orders", auto_disable_after_rollbacks=2)
    broker.sender("orders").send([Message(body=b"a"), Message(body=b"b")])
    receiver = broker.receiver("orders")
    first, second = receiver.receive(max_messages=2)
    receiver.abandon(first)
    receiver.complete(second)
    _abandon(broker)
    assert broker.get_queue("orders").status == "active"
    _abandon(broker)
    assert broker.get_queue("orders").status == "receive_disabled"


def test_lock_expiries_count_as_rollbacks(broker: Broker, clock: ManualClock) -> None:
    broker.create_queue("orders", auto_disable_after_rollbacks=2, lock_duration=10)
    broker.sender("orders").send([Message(body=b"x")])
    receiver = broker.receiver("orders")
    receiver.receive()
    clock.advance(10)
    receiver.receive()
    clock.advance(10)
    assert receiver.receive() == []  # housekeeping counts the second expiry and disables
    with pytest.raises(EntityDisabledError):
        receiver.receive()
    assert broker.get_queue("orders").ledger.lock_expiries == 2


def test_enabling_after_an_auto_disable_starts_the_count_again(broker: Broker) -> None:
    broker.create_queue("orders", auto_disable_after_rollbacks=2)
    broker.sender("orders").send([Message(body=b"x")])
    _abandon(broker, 2)
    broker.enable("orders")
    _abandon(broker)
    assert broker.get_queue("orders").status == "active"
    assert broker.counts("orders")["active"] == 1
    assert_balanced(broker)
