"""The broker is composed of parts, one per concern, and every part's public method is the
broker's own: users hold one object, and each part depends only on what it uses."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest

import poisonq
from poisonq import Broker, ManualClock, Message
from poisonq.administration import Administration
from poisonq.dead_lettering import DeadLettering
from poisonq.leasing import Leasing
from poisonq.messaging import Messaging

PARTS = {
    "administration": Administration,
    "messaging": Messaging,
    "dead_lettering": DeadLettering,
    "leasing": Leasing,
}


def public_methods(cls: type) -> list[str]:
    return [name for name, value in vars(cls).items() if callable(value) and name[0] != "_"]


@pytest.mark.parametrize("part", sorted(PARTS))
def test_every_method_of_a_part_is_the_brokers_with_the_parts_docstring(
    broker: Broker, part: str
) -> None:
    cls = PARTS[part]
    assert isinstance(getattr(broker, part), cls)
    for name in public_methods(cls):
        method = getattr(broker, name)
        assert method.__wrapped__.__self__ is getattr(broker, part), name
        assert getattr(Broker, name).__doc__ == getattr(cls, name).__doc__


def test_no_two_parts_offer_the_same_method() -> None:
    names = [name for cls in PARTS.values() for name in public_methods(cls)]
    assert len(names) == len(set(names))


def test_senders_and_receivers_keep_the_broker_and_use_its_link(broker: Broker, queue: str) -> None:
    sender = broker.sender(queue)
    sender.send(Message(body="x"))
    receiver = broker.receiver(queue)
    assert sender.broker is broker and receiver.broker is broker
    assert sender.link is broker.link and receiver.link is broker.link
    [message] = receiver.receive()
    receiver.complete(message)
    assert broker.counts(queue)["completed"] == 1


def test_a_broker_nobody_holds_goes_at_once(tmp_path: Path, clock: ManualClock) -> None:
    """Its parts refer back to it weakly, so dropping the last reference frees it (and its
    store's connections) without waiting for the garbage collector's cycle pass."""
    with poisonq.connect(f"sqlite:///{tmp_path / 'q.db'}", clock=clock) as opened:
        gone = weakref.ref(opened)
    del opened
    assert gone() is None


def test_a_sender_of_a_broker_nothing_else_holds_keeps_it(url: str, clock: ManualClock) -> None:
    """``connect(url).sender(queue)`` is a sender that works: the broker's method holds the
    broker while it makes the sender, which then keeps it."""
    with poisonq.connect(url, clock=clock) as setup:
        setup.create_queue("orders")
    sender = poisonq.connect(url, clock=clock).sender("orders")
    sender.send(Message(body="x"))
    with sender.broker as broker:
        assert broker.counts("orders")["active"] == 1
