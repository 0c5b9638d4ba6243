"""Deleting an entity takes its messages with it, also while other transactions add to it,
and leaves its ledger to the audit (schema 19).

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
from poisonq.errors import EntityNotFoundError
from poisonq.model import MessageState, SubQueue
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


def test_a_queue_deleted_with_messages_moved_in_leaves_the_audit_balanced(
    broker: Broker,
) -> None:
    """A deleted entity's ledger stays in the audit, the messages it held counted as dropped:
    moves from another entity into it (here a resubmit from a dead-letter queue) no longer
    leave the other's side of them unmatched."""
    broker.create_queue("orders")
    broker.create_queue("repair")
    broker.sender("orders").send([Message(body=b"x")] * 3)
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(max_messages=3), reason="Bad")
    assert broker.resubmit("orders/$deadletterqueue", to="repair", rate=None).done == 3
    broker.sender("repair").send(Message(body=b"own"))
    broker.receiver("repair").complete(broker.receiver("repair").receive(max_messages=1))
    broker.delete_queue("repair")
    report = broker.audit()
    assert report.ok, report
    gone = report.deleted
    assert (gone.sent, gone.moved_in, gone.completed, gone.dropped) == (1, 3, 1, 3)
    assert (report.sent, report.completed, report.dropped, report.held) == (4, 1, 3, 0)
    broker.delete_queue("orders")  # the other side of the move goes too
    assert broker.audit().ok
    assert broker.audit().rows == [broker.audit().deleted]
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
        # The ledger kept is the one the send committed, its messages counted discarded.
        deleted = broker.audit().deleted
        assert (deleted.sent, deleted.dropped) == (5, 5)
        assert_balanced(broker)


def test_a_queue_deleted_between_two_reads_of_a_transaction_is_not_found(pg_url: str) -> None:
    """On PostgreSQL each statement reads its own snapshot: a queue deleted after a
    transaction read it, and before it read one of its subqueues, is a queue not found,
    not a broken invariant."""
    with poisonq.connect(pg_url) as broker, poisonq.connect(pg_url) as operator:
        broker.create_queue("orders")
        resolver = broker.engine.resolver

        async def read_across_a_deletion() -> None:
            async with broker.engine.store.transaction() as tx:
                target = await resolver.resolve(tx, "orders")
                operator.delete_queue("orders")
                await tx.entity("another")  # a statement between: the answers read ahead go
                await resolver.child(tx, target, SubQueue.DEADLETTER)

        with pytest.raises(EntityNotFoundError, match="orders"):
            drive(read_across_a_deletion())


def test_a_send_to_a_queue_deleted_meanwhile_adds_nothing(pg_url: str) -> None:
    """A send into a queue deleted after the transaction looked it up adds nothing and says
    the queue is not found, by its name."""
    with poisonq.connect(pg_url) as broker, poisonq.connect(pg_url) as operator:
        broker.create_queue("orders")

        async def send_to_a_deleted_queue() -> None:
            async with broker.engine.store.transaction() as tx:
                entity = await tx.entity("orders")
                assert entity is not None
                operator.delete_queue("orders")
                await tx.insert_messages(entity.id, _rows(3), 0.0, last=True)

        with pytest.raises(EntityNotFoundError, match="no queue 'orders'"):
            drive(send_to_a_deleted_queue())
        assert _message_rows(pg_url) == 0


def test_a_move_to_a_queue_deleted_meanwhile_moves_nothing(pg_url: str) -> None:
    """A move into a queue deleted after the transaction looked it up moves nothing and says
    the queue is not found, by its name."""
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

        with pytest.raises(EntityNotFoundError, match="no queue 'archive'"):
            drive(move_to_a_deleted_queue())
        assert broker.counts("orders")["active"] == 2
        assert_balanced(broker)
