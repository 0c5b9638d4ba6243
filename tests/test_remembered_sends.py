"""A send on PostgreSQL goes on the queue as an earlier send read it, in one round trip, and
the insert checks it: whatever another client changed meanwhile (options, status, room,
the queue deleted or made again) is decided as a send that read the queue would decide, and
nothing is written twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import poisonq
from poisonq import (
    Broker,
    EntityDisabledError,
    EntityNotFoundError,
    Message,
    MessageTooLargeError,
    QuotaExceededError,
)
from tests.helpers import assert_balanced


@pytest.fixture
def clients(pg_url: str) -> Iterator[tuple[Broker, Broker]]:
    """A sender that has sent to ``orders`` once (so it remembers the queue) and an operator
    in another client."""
    with poisonq.connect(pg_url) as sender, poisonq.connect(pg_url) as operator:
        operator.create_queue("orders")
        sender.sender("orders").send(Message(body=b"first"))
        yield sender, operator


def test_a_remembered_queue_whose_options_changed_is_read_again(
    clients: tuple[Broker, Broker],
) -> None:
    """Options changed by another client hold for the next send, both ways: a message the
    new limit refuses is refused, one only the old limit refused is sent."""
    sender, operator = clients
    operator.update_queue("orders", max_message_size=2048)
    with pytest.raises(MessageTooLargeError):
        sender.sender("orders").send(Message(body=b"x" * 4096))
    sender.sender("orders").send(Message(body=b"x" * 1024))
    operator.update_queue("orders", max_message_size=8192)
    sender.sender("orders").send(Message(body=b"x" * 4096))  # it remembered 2048
    assert operator.counts("orders")["active"] == 3
    assert_balanced(operator)


def test_a_remembered_queue_disabled_or_enabled_by_another_client_is_read_again(
    clients: tuple[Broker, Broker],
) -> None:
    sender, operator = clients
    operator.disable("orders")
    with pytest.raises(EntityDisabledError):
        sender.sender("orders").send(Message(body=b"refused"))
    operator.enable("orders")
    sender.sender("orders").send(Message(body=b"sent"))
    assert operator.counts("orders")["active"] == 2
    assert_balanced(operator)


def test_a_remembered_queue_deleted_or_made_again_is_read_again(
    clients: tuple[Broker, Broker],
) -> None:
    """A send to a queue deleted since is refused as not found; to one made again under the
    same name it lands in the new queue, once."""
    sender, operator = clients
    operator.delete_queue("orders")
    with pytest.raises(EntityNotFoundError, match="orders"):
        sender.sender("orders").send(Message(body=b"nowhere"))
    operator.create_queue("orders")
    sender.sender("orders").send(Message(body=b"first"))  # remembered again
    operator.delete_queue("orders")
    operator.create_queue("orders")
    sender.sender("orders").send(Message(body=b"new"))
    assert [m.body for m in operator.peek("orders", max_messages=5)] == [b"new"]
    assert_balanced(operator)


def test_a_remembered_queue_filled_by_another_client_refuses_what_no_longer_fits(
    clients: tuple[Broker, Broker],
) -> None:
    """The room a remembered queue had is checked by the insert: a batch that no longer
    fits under ``max_size`` is refused whole, as a send that read the queue refuses it."""
    sender, operator = clients
    operator.update_queue("orders", max_size=10_000)
    sender.sender("orders").send(Message(body=b"x" * 1000))  # remembers about 1 KB held
    operator.sender("orders").send([Message(body=b"x" * 1000)] * 7)
    with pytest.raises(QuotaExceededError):
        sender.sender("orders").send([Message(body=b"x" * 1000)] * 2)
    sender.sender("orders").send(Message(body=b"x" * 1000))  # the one that still fits
    assert operator.counts("orders")["active"] == 10
    assert_balanced(operator)
