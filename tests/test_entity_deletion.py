"""Deleting an entity takes its messages with it, also while other transactions add to it.

On PostgreSQL messages have no foreign key to their entity (schema 5): a statement that adds
messages holds the target entity row, and a deletion deletes the entity rows before their
messages. These tests race the two through the store's transactions.
"""

from __future__ import annotations

import threading

import pytest

import poisonq
from poisonq import Broker, Message
from poisonq.engine.driving import drive
from poisonq.errors import StoreError
from poisonq.model import MessageState
from poisonq.store.base import NewMessage
from tests.helpers import assert_balanced, execute_behind_the_back


def _message_rows(url: str) -> int:
    """How many message rows the store holds, read directly from its tables."""
    ((count,),) = execute_behind_the_back(url, "SELECT count(*) FROM messages")
    return int(count)  # type: ignore[call-overload]


def _rows(count: int) -> list[NewMessage]:
    return [
        NewMessage(
            f"m{i}", b"x", 1, None, None, None, None, None, None, MessageState.ACTIVE, None, None
        )
        for i in range(count)
    ]


def test_deleting_a_queue_leaves_no_message_rows(broker: Broker, url: str) -> None:
    broker.create_queue("orders")
    broker.sender("orders").send([Message(body=b"x")] * 3)
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(), reason="Bad")  # one in the dead-letter queue
    broker.create_queue("other")
    broker.sender("other").send(Message(body=b"kept"))
    broker.delete_queue("orders")
    assert _message_rows(url) == 1
    assert_balanced(broker)


def test_a_deletion_waits_for_a_send_in_flight_and_takes_its_messages(pg_url: str) -> None:
    with poisonq.connect(pg_url) as broker, poisonq.connect(pg_url) as operator:
        broker.create_queue("orders")
        store = broker.engine.store
        deleted = threading.Event()

        def delete() -> None:
            operator.delete_queue("orders")
            deleted.set()

        deleter = threading.Thread(target=delete)

        async def send_while_deleting() -> None:
            async with store.transaction() as tx:
                entity = await tx.entity("orders")
                assert entity is not None
                await tx.insert_messages(entity.id, _rows(5), 0.0)
                deleter.start()
                # The deletion cannot end while this transaction holds the queue's row.
                assert not deleted.wait(0.5)

        drive(send_while_deleting())
        deleter.join(timeout=30)
        assert deleted.is_set()
        assert _message_rows(pg_url) == 0
        assert [e.name for e in broker.entities()] == []


def test_a_send_to_a_queue_deleted_meanwhile_adds_nothing(pg_url: str) -> None:
    with poisonq.connect(pg_url) as broker, poisonq.connect(pg_url) as operator:
        broker.create_queue("orders")

        async def send_to_a_deleted_queue() -> None:
            async with broker.engine.store.transaction() as tx:
                entity = await tx.entity("orders")
                assert entity is not None
                operator.delete_queue("orders")
                await tx.insert_messages(entity.id, _rows(3), 0.0, last=True)

        with pytest.raises(StoreError, match="deleted while this transaction ran"):
            drive(send_to_a_deleted_queue())
        assert _message_rows(pg_url) == 0


def test_a_move_to_a_queue_deleted_meanwhile_moves_nothing(pg_url: str) -> None:
    with poisonq.connect(pg_url) as broker, poisonq.connect(pg_url) as operator:
        broker.create_queue("orders")
        broker.create_queue("archive")
        seqs = broker.sender("orders").send([Message(body=b"x")] * 2)

        async def move_to_a_deleted_queue() -> None:
            async with broker.engine.store.transaction() as tx:
                source, target = await tx.entity("orders"), await tx.entity("archive")
                assert source is not None and target is not None
                operator.delete_queue("archive")
                await tx.move(source.id, seqs, target.id, None, None)

        with pytest.raises(StoreError, match="deleted while this transaction ran"):
            drive(move_to_a_deleted_queue())
        assert broker.counts("orders")["active"] == 2
        assert_balanced(broker)
